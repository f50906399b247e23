#!/usr/bin/env python3
"""Random chain + loader throughput (issue 5).

Usage: /usr/bin/python3 bench/loader_bench.py [--build build] [--cases 8] [--size 512,512,40-100]
                                             [--threads 2] [--epochs 5]

Writes 8 spleen-like volumes, then `medfast --threads T bench loader` fills a
memory cache with the spleen deterministic chain and times epochs of the spleen
fast-training random chain (RandCropByPosNegLabel 96^3 x4 pos=1 neg=1,
RandFlip on each axis p=0.5, RandRotate90 p=0.5, RandScaleIntensity 0.1 p=0.5,
RandShiftIntensity 0.1 p=0.5), batch size 2. It checks that every epoch
delivered cases x 4 samples. The baseline measured in the same run is the same
random chain in plain numpy on one producer thread (like MONAI's
ThreadDataLoader) over the same deterministic outputs, computed by the
independent Python chain of bench/cache_fill.py. MONAI 1.3 cannot be installed
here; its figure from the issue (about 25 samples/s with CacheDataset +
ThreadDataLoader on this machine) is quoted.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cache_fill import CHAIN, machine, python_chain  # noqa: E402

MONAI_SAMPLES_PER_SECOND = 25.0
MONAI_HEAVY_SAMPLES_PER_SECOND = 0.21

HEAVY_DETERMINISTIC = CHAIN[:4]  # LoadImage, EnsureChannelFirst, Orientation, Spacing
HEAVY_RANDOM = [
    {"name": "RandRotate", "keys": ["image", "label"], "range_x": 0.1, "range_y": 0.1, "range_z": 0.3, "prob": 1.0,
     "mode": ["bilinear", "nearest"]},
    {"name": "RandZoom", "keys": ["image", "label"], "min_zoom": 0.8, "max_zoom": 1.2, "prob": 1.0,
     "mode": ["bilinear", "nearest"]},
    {"name": "ResizeWithPadOrCrop", "keys": ["image", "label"], "spatial_size": [200, 210, 220]},
]

RANDOM = [
    {"name": "RandCropByPosNegLabel", "keys": ["image", "label"], "label_key": "label",
     "spatial_size": [96, 96, 96], "pos": 1, "neg": 1, "num_samples": 4,
     "fg_indices_key": "label_fg_indices", "bg_indices_key": "label_bg_indices"},
    {"name": "RandFlip", "keys": ["image", "label"], "spatial_axis": [0], "prob": 0.5},
    {"name": "RandFlip", "keys": ["image", "label"], "spatial_axis": [1], "prob": 0.5},
    {"name": "RandFlip", "keys": ["image", "label"], "spatial_axis": [2], "prob": 0.5},
    {"name": "RandRotate90", "keys": ["image", "label"], "prob": 0.5, "max_k": 3},
    {"name": "RandScaleIntensity", "keys": "image", "factors": 0.1, "prob": 0.5},
    {"name": "RandShiftIntensity", "keys": "image", "offsets": 0.1, "prob": 0.5},
]


def numpy_random_chain(im, lb, fg, bg, rng):
    """The same random chain in numpy: 4 crops of 96^3, flips, rot90, scale, shift."""
    out = []
    shape = im.shape[1:]
    for _ in range(4):
        idx = fg[rng.integers(len(fg))] if (rng.random() < 0.5 and len(fg)) else bg[rng.integers(len(bg))]
        c = np.unravel_index(idx, shape)
        sl = []
        for a in range(3):
            lo, hi = 48, shape[a] + 1 - 48
            ca = min(max(int(c[a]), lo), hi - 1)
            sl.append(slice(ca - 48, ca + 48))
        i, l = im[(slice(None), *sl)], lb[(slice(None), *sl)]
        for ax in range(3):
            if rng.random() < 0.5:
                i, l = np.flip(i, ax + 1), np.flip(l, ax + 1)
        k = rng.integers(1, 4)
        if rng.random() < 0.5:
            i, l = np.rot90(i, k, (1, 2)), np.rot90(l, k, (1, 2))
        if rng.random() < 0.5:
            i = i * (1 + rng.uniform(-0.1, 0.1))
        if rng.random() < 0.5:
            i = i + rng.uniform(-0.1, 0.1)
        out.append((np.ascontiguousarray(i, dtype=np.float32), np.ascontiguousarray(l)))
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("--cases", type=int, default=8)
    ap.add_argument("--size", default="512,512,40-100")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--epochs", type=int, default=5)
    ap.add_argument("--chain", choices=["spleen", "heavy"], default="spleen")
    a = ap.parse_args()
    if a.chain == "heavy":
        return heavy(a)
    medfast = os.path.join(a.build, "medfast")
    with tempfile.TemporaryDirectory(prefix="medfast-loader-bench-", dir=os.path.abspath(a.build)) as tmp:
        subprocess.run([medfast, "data", "synth", "--out", f"{tmp}/ds", "--cases", str(a.cases), "--size", a.size],
                       check=True, stdout=subprocess.DEVNULL)
        cfg = f"{tmp}/config.json"
        json.dump({"data": {"dataset": f"{tmp}/ds/dataset.json", "deterministic": CHAIN, "random": RANDOM,
                            "cache": {"kind": "memory"}, "seed": 0,
                            "loader": {"batch_size": 2, "prefetch": 4}}}, open(cfg, "w"))
        out = subprocess.run([medfast, "--threads", str(a.threads), "bench", "loader", "--config", cfg,
                              "--epochs", str(a.epochs), "--json"], check=True, capture_output=True, text=True).stdout
        r = json.loads(out)
        for e in r["epochs"]:
            assert e["samples"] == a.cases * 4, e
        rates = [e["samples_per_second"] for e in r["epochs"]]
        # Baseline: numpy random chain, one producer thread, over 2 volumes' deterministic outputs.
        ds = json.load(open(f"{tmp}/ds/dataset.json"))["training"]
        cached = [python_chain(f"{tmp}/ds/{ds[i]['image']}", f"{tmp}/ds/{ds[i]['label']}") for i in range(2)]
        rng = np.random.default_rng(0)
        n, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < 10:
            for im, lb, fg, bg in cached:
                n += len(numpy_random_chain(im, lb, fg, bg, rng))
        py_rate = n / (time.perf_counter() - t0)
        med = statistics.median(rates)
        print(f"machine: {machine()}")
        print(f"dataset: {a.cases} spleen-like volumes {a.size}; memory cache filled in {r['fill_seconds']:.1f} s; "
              f"loader threads {r['threads']}, batch size {r['batch_size']} items x {r['samples_per_item']} crops; "
              f"peak RSS {r['peak_rss_bytes'] / 2**30:.2f} GiB")
        print(f"verified: every epoch delivered {a.cases * 4} samples of 96^3")
        print(f"medfast samples/s per epoch: {', '.join(f'{x:.1f}' for x in rates)}")
        print(f"\n{'':40} {'samples/s':>10}")
        print(f"{'medfast loader (median epoch)':40} {med:10.1f}")
        print(f"{'numpy random chain, 1 thread (this run)':40} {py_rate:10.1f}")
        print(f"{'MONAI CacheDataset+ThreadDataLoader (issue)':40} {MONAI_SAMPLES_PER_SECOND:10.1f}")
        print(f"\nspeed: {med / py_rate:.1f}x the numpy chain, {med / MONAI_SAMPLES_PER_SECOND:.1f}x MONAI's figure")


def scipy_heavy(im, rng):
    """RandRotate + RandZoom as two full-volume resamplings, then the crop (what MONAI does)."""
    from scipy import ndimage
    from scipy.spatial.transform import Rotation
    shape = np.array(im.shape[1:], dtype=float)
    c = (shape - 1) / 2
    r = Rotation.from_euler("zyx", [rng.uniform(-0.3, 0.3), rng.uniform(-0.1, 0.1), rng.uniform(-0.1, 0.1)]).as_matrix()
    rot = ndimage.affine_transform(im[0], r.T, c - r.T @ c, order=1, mode="nearest")
    z = rng.uniform(0.8, 1.2)
    zoomed = ndimage.affine_transform(rot, np.eye(3) / z, c - c / z, order=1, mode="nearest")
    out = np.zeros((200, 210, 220), np.float32)
    sl_in, sl_out = [], []
    for n, t in zip(zoomed.shape, (200, 210, 220)):
        if n >= t:
            st = n // 2 - t // 2
            sl_in.append(slice(st, st + t))
            sl_out.append(slice(0, t))
        else:
            b = (t - n) // 2
            sl_in.append(slice(0, n))
            sl_out.append(slice(b, b + n))
    out[tuple(sl_out)] = zoomed[tuple(sl_in)]
    return out


def heavy(a):
    medfast = os.path.join(a.build, "medfast")
    with tempfile.TemporaryDirectory(prefix="medfast-loader-bench-", dir=os.path.abspath(a.build)) as tmp:
        subprocess.run([medfast, "data", "synth", "--out", f"{tmp}/ds", "--cases", str(a.cases), "--size", a.size],
                       check=True, stdout=subprocess.DEVNULL)
        cfg = f"{tmp}/config.json"
        json.dump({"data": {"dataset": f"{tmp}/ds/dataset.json", "deterministic": HEAVY_DETERMINISTIC,
                            "random": HEAVY_RANDOM, "cache": {"kind": "memory"}, "seed": 0,
                            "loader": {"batch_size": 1, "prefetch": 2}}}, open(cfg, "w"))
        out = subprocess.run([medfast, "--threads", str(a.threads), "bench", "loader", "--config", cfg,
                              "--epochs", str(a.epochs), "--json"], check=True, capture_output=True, text=True).stdout
        r = json.loads(out)
        for e in r["epochs"]:
            assert e["samples"] == a.cases, e
        rates = [e["samples_per_second"] for e in r["epochs"]]
        med = statistics.median(rates)
        ds = json.load(open(f"{tmp}/ds/dataset.json"))["training"]
        im = python_chain(f"{tmp}/ds/{ds[0]['image']}", f"{tmp}/ds/{ds[0]['label']}")[0]  # close enough input size
        rng = np.random.default_rng(0)
        t0 = time.perf_counter()
        scipy_heavy(im, rng)
        py_rate = 1 / (time.perf_counter() - t0)
        print(f"machine: {machine()}")
        print(f"dataset: {a.cases} spleen-like volumes {a.size}; memory cache of the Spacing(1.5, 1.5, 2) output "
              f"filled in {r['fill_seconds']:.1f} s; loader threads {r['threads']}, batch size 1; "
              f"peak RSS {r['peak_rss_bytes'] / 2**30:.2f} GiB")
        print("chain: RandRotate(0.1, 0.1, 0.3, p=1) + RandZoom(0.8-1.2, p=1) on image (bilinear) and label (nearest), "
              "ResizeWithPadOrCrop(200, 210, 220), composed into one resampling per key")
        print(f"verified: every epoch delivered {a.cases} samples of 200x210x220")
        print(f"medfast samples/s per epoch: {', '.join(f'{x:.2f}' for x in rates)}")
        print(f"\n{'':46} {'samples/s':>10}")
        print(f"{'medfast loader (median epoch)':46} {med:10.2f}")
        print(f"{'scipy, image only, two resamplings (this run)':46} {py_rate:10.2f}")
        print(f"{'MONAI 1.3 (issue)':46} {MONAI_HEAVY_SAMPLES_PER_SECOND:10.2f}")
        print(f"\nspeed: {med / py_rate:.1f}x scipy, {med / MONAI_HEAVY_SAMPLES_PER_SECOND:.1f}x MONAI's figure")


if __name__ == "__main__":
    main()
