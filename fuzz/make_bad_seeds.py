#!/usr/bin/env python3
"""Writes the bad inputs of the trust issue into fuzz/seeds/ (checked in; run again
only to change them): NaN/Inf in geometry fields, a NIfTI-2 vox_offset of 2^62, and
.nii.gz files whose stored-deflate data has flipped bytes (with and without bytes
after the voxels). Written with numpy, independently of medfast."""
import gzip
import os
import struct
import sys
import zlib

import numpy as np

OUT = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "seeds")
os.makedirs(OUT, exist_ok=True)


def nifti1(shape=(8, 8, 4), patch=None):
    h = bytearray(348)
    struct.pack_into("<i", h, 0, 348)
    dim = [len(shape)] + list(shape) + [1] * (7 - len(shape))
    struct.pack_into("<8h", h, 40, *dim)
    struct.pack_into("<h", h, 70, 4)     # int16
    struct.pack_into("<h", h, 72, 16)
    struct.pack_into("<8f", h, 76, 1, 1, 1, 1, 1, 1, 1, 1)
    struct.pack_into("<f", h, 108, 352)  # vox_offset
    struct.pack_into("<hh", h, 252, 1, 1)  # qform_code, sform_code
    struct.pack_into("<4f", h, 280, 1, 0, 0, 0)
    struct.pack_into("<4f", h, 296, 0, 1, 0, 0)
    struct.pack_into("<4f", h, 312, 0, 0, 1, 0)
    h[344:348] = b"n+1\0"
    for offset, fmt, value in patch or []:
        struct.pack_into(fmt, h, offset, value)
    data = (np.arange(np.prod(shape)) % 300 - 150).astype("<i2").tobytes()
    return bytes(h) + b"\0" * 4 + data


def nifti2_huge_vox_offset():
    h = bytearray(540)
    struct.pack_into("<i", h, 0, 540)
    h[4:12] = b"n+2\0\r\n\x1a\n"
    struct.pack_into("<hh", h, 12, 4, 16)
    struct.pack_into("<8q", h, 16, 3, 4, 4, 2, 1, 1, 1, 1)
    struct.pack_into("<8d", h, 104, 1, 1, 1, 1, 1, 1, 1, 1)
    struct.pack_into("<q", h, 168, 1 << 62)
    return bytes(h) + b"\0" * 4 + b"\0" * 64


def stored_gzip(raw):
    """gzip with stored (level 0) deflate blocks, so flipped bytes still inflate."""
    c = zlib.compressobj(0, zlib.DEFLATED, -15)
    body = c.compress(raw) + c.flush()
    head = b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\xff"
    tail = struct.pack("<II", zlib.crc32(raw) & 0xFFFFFFFF, len(raw) & 0xFFFFFFFF)
    return head + body + tail


def flipped(gz):
    b = bytearray(gz)
    mid = len(b) // 2
    for i in range(mid, mid + 8):
        b[i] ^= 0x5A
    return bytes(b)


nan, inf = float("nan"), float("inf")
seeds = {
    "nan_pixdim.nii": nifti1(patch=[(76 + 4 * 2, "<f", nan)]),
    "inf_srow.nii": nifti1(patch=[(296 + 4, "<f", inf)]),
    "nan_quatern.nii": nifti1(patch=[(260, "<f", nan)]),
    "nan_qoffset.nii.gz": gzip.compress(nifti1(patch=[(272, "<f", nan)])),
    "nifti2_vox_offset_2_62.nii": nifti2_huge_vox_offset(),
    "nifti2_vox_offset_2_62.nii.gz": gzip.compress(nifti2_huge_vox_offset()),
    "flipped_stored.nii.gz": flipped(stored_gzip(nifti1((32, 32, 8)))),
    "flipped_stored_trailing.nii.gz": flipped(stored_gzip(nifti1((32, 32, 8)) + b"\0" * 4096)),
    "huge_spacing.nii": nifti1(patch=[(280, "<f", 1e9), (296 + 4, "<f", 1e9), (312 + 8, "<f", 1e9)]),
}
for name, data in seeds.items():
    with open(os.path.join(OUT, name), "wb") as f:
        f.write(data)
print(f"{len(seeds)} seeds in {OUT}")
