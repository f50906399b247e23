#!/usr/bin/env python3
"""An independent reader of TensorBoard event files, for medfast's tests.

Usage: /usr/bin/python3 read_tfevents.py DIR_OR_FILE

Reads every events.out.tfevents.* file of DIR (in name order, as TensorBoard does) or the
one FILE, checks each TFRecord's framing and both masked CRC-32C sums, decodes each Event
with a generic protocol-buffer wire-format walker (no protobuf or TensorFlow module), and
prints JSON:

  {"files": [{"name", "records", "version", "scalars": [[tag, step, value, wall_time], ...]}],
   "tensorboard": {"tag": [[step, value], ...]} or "skipped: <why>"}

"tensorboard" is what tensorboard's own EventAccumulator reads from DIR, where the
tensorboard package is importable. A damaged record is an error (exit status 1) naming the
file, the record and what is wrong.

Field numbers: tensorflow/core/util/event.proto (Event: wall_time 1 double, step 2 int64,
file_version 3 string, summary 5) and tensorflow/core/framework/summary.proto (Summary:
value 1; Summary.Value: tag 1, simple_value 2 float).
"""
import json
import math
import os
import struct
import sys


def crc32c(data):
    """CRC-32C (Castagnoli), bit by bit from the polynomial: no table shared with medfast."""
    crc = 0xFFFFFFFF
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF


def masked(crc):
    return ((((crc >> 15) | (crc << 17)) & 0xFFFFFFFF) + 0xA282EAD8) & 0xFFFFFFFF


assert crc32c(b"123456789") == 0xE3069283  # the CRC-32C check value


def fields(buf):
    """(field number, wire type, value) of a protobuf message; value: int, or bytes."""
    out, i = [], 0
    while i < len(buf):
        key, i = varint(buf, i)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, i = varint(buf, i)
        elif wire == 1:
            value, i = buf[i:i + 8], i + 8
        elif wire == 2:
            n, i = varint(buf, i)
            value, i = buf[i:i + n], i + n
        elif wire == 5:
            value, i = buf[i:i + 4], i + 4
        else:
            raise ValueError(f"wire type {wire} of field {number}")
        if i > len(buf):
            raise ValueError(f"field {number} runs past its message")
        out.append((number, wire, value))
    return out


def varint(buf, i):
    shift = value = 0
    while True:
        if i >= len(buf):
            raise ValueError("a varint runs past its message")
        b = buf[i]
        value |= (b & 0x7F) << shift
        i += 1
        if not b & 0x80:
            return value, i
        shift += 7


def decode_event(payload):
    event = {"wall_time": None, "step": 0, "version": None, "values": []}
    for number, wire, value in fields(payload):
        if number == 1 and wire == 1:
            event["wall_time"] = struct.unpack("<d", value)[0]
        elif number == 2 and wire == 0:
            event["step"] = value - (1 << 64) if value >= 1 << 63 else value
        elif number == 3 and wire == 2:
            event["version"] = value.decode()
        elif number == 5 and wire == 2:
            for n, w, v in fields(value):
                if n != 1 or w != 2:
                    continue
                tag, simple = None, None
                for vn, vw, vv in fields(v):
                    if vn == 1 and vw == 2:
                        tag = vv.decode()
                    elif vn == 2 and vw == 5:
                        simple = struct.unpack("<f", vv)[0]
                event["values"].append((tag, simple))
    return event


def read_file(path):
    data = open(path, "rb").read()
    i, records, version, scalars = 0, 0, None, []
    name = os.path.basename(path)
    while i < len(data):
        if i + 12 > len(data):
            raise ValueError(f"{name}: record {records + 1}: a truncated header at byte {i}")
        header = data[i:i + 8]
        (length,) = struct.unpack("<Q", header)
        (length_crc,) = struct.unpack("<I", data[i + 8:i + 12])
        if masked(crc32c(header)) != length_crc:
            raise ValueError(f"{name}: record {records + 1}: the length's CRC does not match")
        payload = data[i + 12:i + 12 + length]
        if len(payload) != length or i + 16 + length > len(data):
            raise ValueError(f"{name}: record {records + 1}: truncated payload")
        (payload_crc,) = struct.unpack("<I", data[i + 12 + length:i + 16 + length])
        if masked(crc32c(payload)) != payload_crc:
            raise ValueError(f"{name}: record {records + 1}: the payload's CRC does not match")
        event = decode_event(payload)
        if records == 0 and event["version"] is None:
            raise ValueError(f"{name}: the first record is not a file_version event")
        if event["version"] is not None:
            version = event["version"]
        for tag, value in event["values"]:
            v = None if value is None or math.isnan(value) else value  # JSON has no NaN
            scalars.append([tag, event["step"], v, event["wall_time"]])
        records += 1
        i += 16 + length
    return dict(name=name, records=records, version=version, scalars=scalars)


def tensorboard_view(folder):
    try:
        from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    except ImportError as e:
        return f"skipped: the tensorboard package is not importable here ({e})"
    acc = EventAccumulator(folder, size_guidance={"scalars": 0})
    acc.Reload()
    return {tag: [[s.step, None if math.isnan(s.value) else s.value] for s in acc.Scalars(tag)]
            for tag in acc.Tags()["scalars"]}


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    target = sys.argv[1]
    if os.path.isdir(target):
        names = sorted(n for n in os.listdir(target) if n.startswith("events.out.tfevents."))
        paths, folder = [os.path.join(target, n) for n in names], target
    else:
        paths, folder = [target], os.path.dirname(target)
    try:
        files = [read_file(p) for p in paths]
    except ValueError as e:
        print(f"read_tfevents.py: {e}", file=sys.stderr)
        sys.exit(1)
    print(json.dumps(dict(files=files, tensorboard=tensorboard_view(folder))))


if __name__ == "__main__":
    main()
