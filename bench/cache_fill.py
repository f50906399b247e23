#!/usr/bin/env python3
"""Filling the preprocessing cache: medfast against MONAI's CacheDataset, measured in the same run (issues 4, 11).

Usage: /usr/bin/python3 bench/cache_fill.py [--build build] [--cases 8] [--size 512,512,40-100]
           [--threads 2] [--rounds 3] [--python-cases 2] [--monai ../shared/peers/monai-1.3.2]

Writes a spleen-like set with `medfast data synth` (int16, 0.8x0.8x5 mm, LPS), then runs
the spleen fast-training deterministic chain CHAIN (LoadImage, EnsureChannelFirst,
Orientation RAS, Spacing 1.5x1.5x2.0 bilinear/nearest, ScaleIntensityRange -57..164 ->
0..1 clip, CropForeground on the image, FgBgToIndices) on every volume, --rounds times;
each round runs, in turn:
  - medfast: `medfast --threads T cache build` into a fresh disk cache (entries written,
    fsynced and renamed; the seconds are the fill's, as medfast reports them), then the
    same chain into medfast's memory cache (`bench loader`'s fill seconds): the like-for-like
    figure against CacheDataset, which is a memory cache;
  - MONAI 1.3: CacheDataset(cache_rate=1, num_workers=T) of the same chain as MONAI's
    dictionary transforms (monai_peer.transforms(CHAIN)), torch.set_num_threads(T), in
    memory; the seconds are the constructor's (the fill).
Seconds per volume are the median over rounds. Once, outside the rounds: MONAI's
PersistentDataset writes the same chain's outputs to disk (bytes per volume), and the
independent plain-Python chain (nibabel, numpy, scipy; one thread) runs on --python-cases
volumes as a second reference.

Verified before anything is reported: every medfast entry's checksums (`cache verify`);
case 0's cached image, read straight from the entry file, against MONAI's CacheDataset
output for case 0 (shape; values within IMAGE_TOL; affine within AFFINE_TOL; label voxels
and foreground/background index counts) and against the plain-Python chain.
Without the MONAI peer the MONAI rows are skipped (with a message) and medfast still runs.
"""
import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import nibabel as nib
import numpy as np
from nibabel import orientations as ori
import warnings

from scipy import ndimage

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import monai_peer  # noqa: E402

warnings.filterwarnings("ignore", message="The behavior of affine_transform")

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

# Both sides interpolate int16 HU values (|x| < ~2000) trilinearly in float32, then scale by
# 1/221: rounding differences in the weights give a few 1e-7 after scaling. A geometric
# difference (a grid shifted by a fraction of a voxel) gives 1e-2 or more on this data.
IMAGE_TOL = 1e-5
# The affines are double on both sides; 1e-6 mm is far below any voxel size.
AFFINE_TOL = 1e-6
# Nearest-neighbour labels: a tie (a sample exactly halfway between voxels) may round either
# way when one side computes the coordinate in float32 (MONAI's normalised grid) and the
# other in double; allow that for a tiny fraction of voxels, nothing more.
LABEL_MISMATCH_TOL = 1e-3


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


def synth(medfast, out, cases, size):
    subprocess.run([medfast, "data", "synth", "--out", out, "--cases", str(cases), "--size", size],
                   check=True, stdout=subprocess.DEVNULL)
    items = json.load(open(f"{out}/dataset.json"))["training"]
    return [{"image": f"{out}/{i['image'][2:]}", "label": f"{out}/{i['label'][2:]}"} for i in items]


def medfast_fill(medfast, tmp, dataset, threads, cases, round_index):
    """One `medfast cache build` into a fresh disk cache: its report (seconds, bytes) and the cache folder."""
    cache_dir = f"{tmp}/cache-{round_index}"
    cfg = f"{tmp}/config-{round_index}.json"
    json.dump({"data": {"dataset": dataset, "deterministic": CHAIN, "cache": {"kind": "disk", "dir": cache_dir}}},
              open(cfg, "w"))
    subprocess.run(["sync"])
    out = subprocess.run([medfast, "--threads", str(threads), "cache", "build", "--json", "--config", cfg],
                         check=True, capture_output=True, text=True).stdout
    r = json.loads(out)
    assert r["computed"] == cases, r
    r["dir"] = cache_dir
    return r


def medfast_memory_fill(medfast, tmp, dataset, threads):
    """medfast's memory cache of the same chain (MONAI's CacheDataset's kind): the fill's
    seconds, as `medfast bench loader` reports them (the process, reading and epochs excluded)."""
    cfg = f"{tmp}/config-memory.json"
    json.dump({"data": {"dataset": dataset, "deterministic": CHAIN, "random": [], "cache": {"kind": "memory"},
                        "loader": {"batch_size": 1}}}, open(cfg, "w"))
    out = subprocess.run([medfast, "--threads", str(threads), "bench", "loader", "--json", "--epochs", "1",
                          "--repeats", "1", "--min-seconds", "0", "--no-check", "--config", cfg], check=True, capture_output=True, text=True).stdout
    r = json.loads(out)
    assert r["epochs"][0]["samples"] == r["items"], r  # every item came out of the filled cache
    return r["fill_seconds"]


def monai_fill(monai, files, threads):
    """MONAI's CacheDataset of the same chain, filled with `threads` workers: (dataset, seconds)."""
    import torch
    torch.set_num_threads(threads)
    chain = monai.transforms.Compose(monai_peer.transforms(monai, CHAIN))
    t0 = time.perf_counter()
    ds = monai.data.CacheDataset(files, transform=chain, cache_rate=1.0, num_workers=threads, progress=False)
    return ds, time.perf_counter() - t0


def monai_persistent_bytes(monai, files, folder):
    """Bytes per volume MONAI's PersistentDataset writes for the same chain."""
    chain = monai.transforms.Compose(monai_peer.transforms(monai, CHAIN))
    ds = monai.data.PersistentDataset(files, transform=chain, cache_dir=folder)
    for i in range(len(ds)):
        ds[i]
    total = sum(os.path.getsize(os.path.join(folder, f)) for f in os.listdir(folder))
    shutil.rmtree(folder)
    return total / len(files)


def runs_to_indices(runs):
    """medfast's [start, end) runs of flat indices as the indices themselves."""
    if len(runs) == 0:
        return np.zeros(0, np.int64)
    return np.concatenate([np.arange(s, e, dtype=np.int64) for s, e in runs])


def compare_with_monai(entry, item):
    """Case 0: medfast's entry against MONAI's cached dictionary. Returns what was checked, or exits."""
    image, label = read_payload(entry, "image"), read_payload(entry, "label")
    m_image, m_label = item["image"].numpy(), item["label"].numpy()
    if image.shape != m_image.shape or label.shape != m_label.shape:
        sys.exit(f"MISMATCH: medfast image {image.shape}, label {label.shape}; MONAI {m_image.shape}, {m_label.shape}")
    err = float(np.abs(image - m_image).max())
    if err > IMAGE_TOL:
        sys.exit(f"MISMATCH: medfast's case-0 image differs from MONAI's by up to {err:.3g} (> {IMAGE_TOL})")
    affine = np.array(read_meta(entry)["volumes"]["image"]["affine"], dtype=np.float64).reshape(4, 4)
    affine_err = float(np.abs(affine - np.asarray(item["image"].affine, dtype=np.float64)).max())
    if affine_err > AFFINE_TOL:
        sys.exit(f"MISMATCH: affines differ by {affine_err:.3g} mm:\nmedfast\n{affine}\nMONAI\n{item['image'].affine}")
    labels_off = int((label != m_label).sum())
    if labels_off > LABEL_MISMATCH_TOL * label.size:
        sys.exit(f"MISMATCH: {labels_off} of {label.size} label voxels differ from MONAI's")
    index = {}
    for kind in ("fg", "bg"):
        mine = runs_to_indices(read_payload(entry, f"label_{kind}_indices"))
        theirs = np.asarray(item[f"label_{kind}_indices"]).astype(np.int64)
        index[kind] = (len(mine), len(theirs), int(np.setxor1d(mine, theirs).size))
        if index[kind][2] > LABEL_MISMATCH_TOL * label.size:
            sys.exit(f"MISMATCH: {kind} indices: medfast {len(mine)}, MONAI {len(theirs)}, {index[kind][2]} differ")
    return {"shape": image.shape, "err": err, "affine_err": affine_err, "labels_off": labels_off,
            "label_size": label.size, "index": index}


def compare_with_python(entry, files, n):
    """The independent plain-Python chain on n volumes: (case 0's max difference, seconds per volume)."""
    t0 = time.perf_counter()
    ref = [python_chain(f["image"], f["label"]) for f in files[:n]]
    seconds = (time.perf_counter() - t0) / len(ref)
    cached, want = read_payload(entry, "image"), ref[0][0]
    if cached.shape != want.shape:
        sys.exit(f"MISMATCH: medfast image {cached.shape} vs Python {want.shape}")
    err = float(np.abs(cached - want).max())
    if err > 1e-3:
        sys.exit(f"MISMATCH: medfast image differs from the Python chain by {err}")
    return err, seconds


def median_range(values):
    return f"{statistics.median(values):9.2f}  ({min(values):.2f}-{max(values):.2f})"


def report(a, input_mb, m_rounds, mem_rounds, o_rounds, check, py, persistent):
    """The results table; medfast's figures and, where MONAI ran, MONAI's and the ratios."""
    m_per_volume = [r["seconds"] / a.cases for r in m_rounds]
    mem_per_volume = [s / a.cases for s in mem_rounds]
    o_per_volume = [s / a.cases for s in o_rounds]
    per_volume = statistics.median(m_per_volume)
    mem_volume = statistics.median(mem_per_volume)
    bytes_per_volume = statistics.median(r["bytes_on_disk"] / a.cases for r in m_rounds)
    print(f"machine: {machine()}")
    print(f"dataset: {a.cases} synthetic spleen-like CT volumes, {a.size} int16 at 0.8x0.8x5 mm, "
          f"{input_mb:.1f} MB .nii.gz each; {a.threads} threads each side; {a.rounds} rounds (medfast, then MONAI)")
    print(f"verified: every entry's checksums (cache verify); case 0's cached image equals the Python chain's "
          f"within {py[0]:.1e}")
    if check:
        index = ", ".join(f"{k} {v[0]} vs {v[1]} ({v[2]} differ)" for k, v in check["index"].items())
        print(f"verified: case 0 against MONAI's CacheDataset: shape {tuple(check['shape'])} equal, image max abs "
              f"diff {check['err']:.1e} (tol {IMAGE_TOL:g}), affine max diff {check['affine_err']:.1e} mm, "
              f"{check['labels_off']} of {check['label_size']} label voxels differ; indices {index}")
    rounds = (f"medfast disk {', '.join(f'{x:.3f}' for x in m_per_volume)}; "
              f"medfast memory {', '.join(f'{x:.3f}' for x in mem_per_volume)}")
    if o_rounds:
        rounds += f"; MONAI {', '.join(f'{x:.3f}' for x in o_per_volume)}"
    print(f"\nper round, s/volume: {rounds}")
    print(f"\n{'':42} {'s/volume  (min-max)':>23} {'MB/volume on disk':>18}")
    print(f"{'medfast memory cache':42} {median_range(mem_per_volume):>23} {'-':>18}")
    print(f"{'medfast cache build (disk, fsync)':42} {median_range(m_per_volume):>23} {bytes_per_volume / 1e6:18.1f}")
    if o_rounds:
        print(f"{'MONAI CacheDataset (memory), this run':42} {median_range(o_per_volume):>23} {'-':>18}")
        print(f"{'MONAI PersistentDataset, this run':42} {'-':>23} {persistent / 1e6:18.1f}")
    print(f"{'plain Python chain (1 thread), this run':42} {py[1]:9.2f}{'':14} {'-':>18}")
    line = f"\nspeed: {py[1] / mem_volume:.1f}x the Python chain"
    if o_rounds:
        monai_volume = statistics.median(o_per_volume)
        ratio = monai_volume / mem_volume
        line += (f"; memory cache {ratio:.1f}x MONAI's CacheDataset per volume, like for like (target >= 6x: "
                 f"{'met' if ratio >= 6 else 'NOT met'}); disk cache with fsync {monai_volume / per_volume:.1f}x it"
                 f"; bytes: {bytes_per_volume / persistent:.2f}x MONAI's PersistentDataset")
    else:
        line += "; MONAI not measured (peer not found)"
    print(line)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("--cases", type=int, default=8)
    ap.add_argument("--size", default="512,512,40-100")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--python-cases", type=int, default=2)
    monai_peer.add_argument(ap)
    a = ap.parse_args()
    monai = monai_peer.load(a.monai)
    medfast = os.path.join(a.build, "medfast")
    with tempfile.TemporaryDirectory(prefix="medfast-cache-bench-", dir=os.path.abspath(a.build)) as tmp:
        files = synth(medfast, f"{tmp}/ds", a.cases, a.size)
        input_mb = sum(os.path.getsize(f["image"]) for f in files) / a.cases / 1e6
        m_rounds, mem_rounds, o_rounds, check = [], [], [], None
        for r in range(a.rounds):
            m_rounds.append(medfast_fill(medfast, tmp, f"{tmp}/ds/dataset.json", a.threads, a.cases, r))
            mem_rounds.append(medfast_memory_fill(medfast, tmp, f"{tmp}/ds/dataset.json", a.threads))
            if monai:
                ds, seconds = monai_fill(monai, files, a.threads)
                o_rounds.append(seconds)
            if r == 0:  # verification first: a mismatch stops the run before more rounds
                subprocess.run([medfast, "cache", "verify", "--dir", m_rounds[0]["dir"]], check=True,
                               stdout=subprocess.DEVNULL)
                entry0 = find_entry(m_rounds[0]["dir"], files[0]["image"])
                if monai:
                    check = compare_with_monai(entry0, ds[0])
                py = compare_with_python(entry0, files, min(a.python_cases, a.cases))
            else:
                shutil.rmtree(m_rounds[-1]["dir"])
            if monai:
                del ds
        persistent = monai_persistent_bytes(monai, files, f"{tmp}/monai-persistent") if monai else None
        if monai:
            print(monai_peer.version(monai))
        report(a, input_mb, m_rounds, mem_rounds, o_rounds, check, py, persistent)


if __name__ == "__main__":
    main()
