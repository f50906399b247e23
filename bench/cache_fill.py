#!/usr/bin/env python3
"""Filling the preprocessing cache: seconds and bytes per volume (issue 4).

Usage: /usr/bin/python3 bench/cache_fill.py [--build build] [--cases 8] [--size 512,512,40-100]
                                           [--threads 2] [--python-cases 2]

Writes a spleen-like set with `medfast data synth` (int16, 0.8x0.8x5 mm, LPS),
then runs the spleen fast-training deterministic chain (LoadImage,
EnsureChannelFirst, Orientation RAS, Spacing 1.5x1.5x2.0, ScaleIntensityRange
-57..164 -> 0..1 clip, CropForeground, FgBgToIndices) into a disk cache with
`medfast cache build`, and checks every entry (`medfast cache verify`) and one
entry's image against an independent plain-Python run of the same chain
(nibabel + numpy + scipy) before reporting. That Python run, timed on
--python-cases volumes, is the baseline measured in the same run; MONAI 1.3
cannot be installed here (no PyPI), so its figures from the issue (2.65 s per
volume to fill a CacheDataset, 150 MB per volume written by PersistentDataset,
same machine) are quoted, not re-measured.
"""
import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time

import nibabel as nib
import numpy as np
from nibabel import orientations as ori
import warnings

from scipy import ndimage

warnings.filterwarnings("ignore", message="The behavior of affine_transform")

MONAI_SECONDS_PER_VOLUME = 2.65
MONAI_BYTES_PER_VOLUME = 150e6

CHAIN = [
    {"name": "LoadImage", "keys": ["image", "label"]},
    {"name": "EnsureChannelFirst", "keys": ["image", "label"]},
    {"name": "Orientation", "keys": ["image", "label"], "axcodes": "RAS"},
    {"name": "Spacing", "keys": ["image", "label"], "pixdim": [1.5, 1.5, 2.0], "mode": ["bilinear", "nearest"]},
    {"name": "ScaleIntensityRange", "keys": "image", "a_min": -57, "a_max": 164, "b_min": 0.0, "b_max": 1.0,
     "clip": True},
    {"name": "CropForeground", "keys": ["image", "label"], "source_key": "image"},
    {"name": "FgBgToIndices", "keys": "label", "image_key": "image"},
]


def python_chain(image_path, label_path):
    """The same chain in plain Python (what a MONAI-free pipeline would run)."""
    img_nii, lab_nii = nib.load(image_path), nib.load(label_path)
    aff = img_nii.affine
    im = np.asanyarray(img_nii.dataobj).astype(np.float32)[None]
    lb = np.asanyarray(lab_nii.dataobj).astype(np.float32)[None]
    t = ori.ornt_transform(ori.io_orientation(aff), ori.axcodes2ornt("RAS"))
    shape = im.shape[1:]
    im = np.stack([ori.apply_orientation(c, t) for c in im])
    lb = np.stack([ori.apply_orientation(c, t) for c in lb])
    aff = aff @ ori.inv_ornt_aff(t, shape)
    zooms = np.sqrt((aff[:3, :3] ** 2).sum(0))
    new = aff.copy()
    new[:3, :3] = aff[:3, :3] / zooms * np.array([1.5, 1.5, 2.0])
    out_shape = tuple(np.round((np.array(im.shape[1:]) - 1) * zooms / [1.5, 1.5, 2.0] + 1).astype(int))
    m = np.linalg.inv(aff) @ new
    scale, shift = np.diag(m)[:3], m[:3, 3]
    im = np.stack([ndimage.affine_transform(c, scale, shift, output_shape=out_shape, order=1, mode="nearest")
                   for c in im])
    lb = np.stack([ndimage.affine_transform(c, scale, shift, output_shape=out_shape, order=0, mode="nearest")
                   for c in lb])
    im = np.clip((im - -57.0) / (164.0 - -57.0), 0, 1).astype(np.float32)
    mask = (im > 0).any(0)
    sl = (slice(None),) + tuple(
        slice(int(np.flatnonzero(mask.any(axis=tuple(a for a in range(3) if a != d))).min()),
              int(np.flatnonzero(mask.any(axis=tuple(a for a in range(3) if a != d))).max()) + 1) for d in range(3))
    im, lb = im[sl], lb[sl]
    fg = np.flatnonzero((lb > 0).any(0))
    bg = np.flatnonzero(~(lb > 0).any(0) & (im > 0).any(0))
    return im, lb, fg, bg


def read_meta(path):
    """The JSON of a medfast cache entry (64-byte little-endian header, then JSON)."""
    import struct
    with open(path, "rb") as f:
        head = f.read(64)
        magic, version, json_len = struct.unpack("<8sII", head[:16])
        assert magic == b"MFCACHE\0" and version == 1, path
        return json.loads(f.read(json_len))


def find_entry(cache_dir, image_path):
    for name in os.listdir(cache_dir):
        if name.endswith(".mfc"):
            meta = read_meta(os.path.join(cache_dir, name))
            if meta["sample_meta"]["image"] == image_path:
                return os.path.join(cache_dir, name)
    sys.exit(f"no cache entry for {image_path}")


def read_payload(path, name):
    meta = read_meta(path)
    p = next(p for p in meta["payloads"] if p["name"] == name)
    with open(path, "rb") as f:
        f.seek(p["offset"])
        raw = np.frombuffer(f.read(p["length"]), dtype=np.dtype(p["stored_dtype"]).newbyteorder("<"))
    return raw.reshape(p["shape"]).astype(p["dtype"])


def machine():
    cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "cpu?")
    return f"{cpu}, {os.cpu_count()} cores, Linux {platform.release()}"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("--cases", type=int, default=8)
    ap.add_argument("--size", default="512,512,40-100")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--python-cases", type=int, default=2)
    a = ap.parse_args()
    medfast = os.path.join(a.build, "medfast")
    with tempfile.TemporaryDirectory(prefix="medfast-cache-bench-", dir=os.path.abspath(a.build)) as tmp:
        subprocess.run([medfast, "data", "synth", "--out", f"{tmp}/ds", "--cases", str(a.cases), "--size", a.size],
                       check=True, stdout=subprocess.DEVNULL)
        cfg = f"{tmp}/config.json"
        json.dump({"data": {"dataset": f"{tmp}/ds/dataset.json", "deterministic": CHAIN,
                            "cache": {"kind": "disk", "dir": f"{tmp}/cache"}}}, open(cfg, "w"))
        input_bytes = sum(os.path.getsize(f"{tmp}/ds/imagesTr/{f}") for f in os.listdir(f"{tmp}/ds/imagesTr"))
        subprocess.run(["sync"])
        out = subprocess.run([medfast, "--threads", str(a.threads), "cache", "build", "--json", "--config", cfg],
                             check=True, capture_output=True, text=True).stdout
        r = json.loads(out)
        assert r["computed"] == a.cases, r
        subprocess.run([medfast, "cache", "verify", "--dir", f"{tmp}/cache"], check=True, stdout=subprocess.DEVNULL)
        # One entry against the independent Python chain (case 0): shapes equal, values within interpolation tolerance.
        ds = json.load(open(f"{tmp}/ds/dataset.json"))["training"]
        t0 = time.perf_counter()
        ref = [python_chain(f"{tmp}/ds/{ds[i]['image']}", f"{tmp}/ds/{ds[i]['label']}")
               for i in range(min(a.python_cases, a.cases))]
        py_seconds = (time.perf_counter() - t0) / len(ref)
        key0 = find_entry(f"{tmp}/cache", f"{tmp}/ds/{ds[0]['image'][2:]}")
        cached = read_payload(key0, "image")
        want = ref[0][0]
        if cached.shape != want.shape:
            sys.exit(f"MISMATCH: medfast image {cached.shape} vs Python {want.shape}")
        err = float(np.abs(cached - want).max())
        if err > 1e-3:
            sys.exit(f"MISMATCH: medfast image differs from the Python chain by {err}")
        per_volume = r["seconds"] / a.cases
        bytes_per_volume = r["bytes_on_disk"] / a.cases
        print(f"machine: {machine()}")
        print(f"dataset: {a.cases} synthetic spleen-like CT volumes, {a.size} int16 at 0.8x0.8x5 mm, "
              f"{input_bytes / a.cases / 1e6:.1f} MB .nii.gz each; medfast threads {a.threads}")
        print(f"verified: every entry's checksums (cache verify); case 0's cached image equals the Python "
              f"chain's {tuple(want.shape)} within {err:.1e}")
        print(f"\n{'':34} {'s/volume':>9} {'MB/volume on disk':>18}")
        print(f"{'medfast cache build (disk)':34} {per_volume:9.2f} {bytes_per_volume / 1e6:18.1f}")
        print(f"{'plain Python chain (this run, 1 thr)':34} {py_seconds:9.2f} {'-':>18}")
        print(f"{'MONAI 1.3 (issue, same machine)':34} {MONAI_SECONDS_PER_VOLUME:9.2f} {MONAI_BYTES_PER_VOLUME / 1e6:18.1f}")
        print(f"\nspeed: {py_seconds / per_volume:.1f}x the Python chain, {MONAI_SECONDS_PER_VOLUME / per_volume:.1f}x "
              f"MONAI's CacheDataset figure; bytes: {bytes_per_volume / MONAI_BYTES_PER_VOLUME:.2f}x "
              f"MONAI's PersistentDataset figure")


if __name__ == "__main__":
    main()
