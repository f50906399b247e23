#!/usr/bin/env python3
"""Random chain + loader throughput: medfast against MONAI, measured in the same run (issues 5, 11).

Usage: /usr/bin/python3 bench/loader_bench.py [--build build] [--cases 8] [--size 512,512,40-100]
           [--threads 2] [--figures 3] [--min-seconds 1] [--rounds 3] [--chain spleen|heavy]
           [--monai ../shared/peers/monai-1.3.2] [--no-check]

Writes spleen-like volumes (`medfast data synth`), then --rounds rounds; each round measures,
in turn, --figures figures of each contender over the same files with the same threads. A
figure is whole epochs, added until they take --min-seconds of epoch time (an epoch of 8
items is 0.03 s for medfast), timed as samples/s; only the samples are counted on the clock:
each side checks its batches in an untimed epoch first (below).
  - medfast: `medfast --threads T bench loader` (fills a memory cache with the
    deterministic chain, checks every batch of one epoch off the clock, then times figures
    of epochs of the random chain; prefetch 4);
  - MONAI 1.3, as its fast-training tutorial: CacheDataset(cache_rate=1, num_workers=T) of
    the same chains (monai_peer.transforms) + ThreadDataLoader(num_workers=0),
    torch.set_num_threads(T). The cache is filled once, before the rounds.
The median over all rounds' figures is reported with its min and max.

--chain spleen (default): the spleen deterministic chain (cache_fill.CHAIN), then
RandCropByPosNegLabel 96^3 x4 pos=1 neg=1 from the cached fg/bg indices, RandFlip per axis
p=0.5, RandRotate90 p=0.5 max_k=3, RandScaleIntensity 0.1 p=0.5, RandShiftIntensity 0.1
p=0.5; batch size 2 items (8 crops). MONAI's deterministic chain ends with
EnsureTyped(track_meta=False) and meta tracking is off for the random part, as in the
tutorial. Also measured: the same random chain in plain numpy on one producer thread.
--chain heavy: a cache of the chain up to Spacing, then RandRotate(0.1, 0.1, 0.3, p=1) +
RandZoom(0.8-1.2, p=1) (image bilinear, label nearest) + ResizeWithPadOrCrop(200, 210, 220),
batch size 1. MONAI runs it twice, with Compose and with Compose(lazy=True) (one fused
resampling; per-key modes passed as `overrides`, without which MONAI 1.3.2 resamples the
label bilinearly), and the faster counts. Also measured: scipy, image only. Each medfast
process's first epoch faults in its batch memory (2 x 37 MB per sample in flight): that
epoch is the untimed checked one now.

Verified, off the clock: medfast's checked epoch (every batch's shapes, dtypes, finite
values, crops that differ) and one extra untimed epoch written with --save-batches, whose
batches must have the expected shape with labels in {0, 1}; each MONAI loader's first epoch
checked the same way, untimed. On the clock, both sides count samples: every timed epoch
must deliver cases x samples-per-item. --no-check runs medfast's bench without its checked
pass (the figure with the checks on must equal it within the spread: they are off the clock).
Without the MONAI peer the MONAI rows are skipped (with a message) and medfast still runs.
"""
import argparse
import json
import os
import shutil
import statistics
import struct
import subprocess
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import monai_peer  # noqa: E402
from cache_fill import CHAIN, machine, python_chain, synth  # noqa: E402

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


def read_mft(path, payload=False):
    """An MFTENSOR file (medfast's save_tensor): (dtype, shape), and the array with payload=True."""
    with open(path, "rb") as f:
        head = f.read(16)
        magic, version, json_len = struct.unpack("<8sII", head)
        assert magic == b"MFTENSOR" and version == 1, path
        meta = json.loads(f.read(json_len))
        if not payload:
            return meta["dtype"], tuple(meta["shape"]), None
        f.seek((16 + json_len + 4095) // 4096 * 4096)
        data = np.frombuffer(f.read(meta["bytes"]), dtype=np.dtype(meta["dtype"]).newbyteorder("<"))
    return meta["dtype"], tuple(meta["shape"]), data.reshape(meta["shape"])


def medfast_loader(medfast, cfg, threads, args, save=None):
    cmd = [medfast, "--threads", str(threads), "bench", "loader", "--config", cfg, "--json"] + list(args)
    if save:
        cmd += ["--save-batches", save, "--repeats", "1", "--min-seconds", "0"]
    return json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)


def check_labels(label, where):
    if bool(((label != 0) & (label != 1)).any()):
        sys.exit(f"verification failed: {where}: label values outside {{0, 1}}")


def verify_medfast(medfast, cfg, threads, folder, samples, shape):
    """One untimed epoch written with --save-batches: every batch's shape, labels in {0, 1}, the sample count."""
    r = medfast_loader(medfast, cfg, threads, [], save=folder)
    assert r["samples_per_epoch"] == samples, r
    n = 0
    for name in sorted(f for f in os.listdir(folder) if f.endswith("_image.mft")):
        _, s_image, _ = read_mft(os.path.join(folder, name))
        _, s_label, label = read_mft(os.path.join(folder, name.replace("_image", "_label")), payload=True)
        if s_image[1:] != shape or s_label[1:] != shape or s_image[0] != s_label[0]:
            sys.exit(f"verification failed: medfast batch {name}: image {s_image}, label {s_label}; "
                     f"want (B,) + {shape}")
        check_labels(label, f"medfast batch {name}")
        n += s_image[0]
    shutil.rmtree(folder)
    if n != samples:
        sys.exit(f"verification failed: medfast's saved epoch has {n} samples, not {samples}")


def medfast_rates(medfast, cfg, a, samples):
    """One medfast process: its figures' samples/s (each >= --min-seconds of epochs)."""
    args = ["--repeats", str(a.figures), "--min-seconds", str(a.min_seconds)] + (["--no-check"] if a.no_check else [])
    r = medfast_loader(medfast, cfg, a.threads, args)
    for e in r["epochs"]:
        if e["samples"] != samples:
            sys.exit(f"verification failed: a medfast epoch delivered {e['samples']} samples, not {samples}")
    return r, [f["samples_per_second"] for f in r["figures"]]


def monai_loader(monai, files, deterministic, random, threads, batch_size, lazy=False, overrides=None):
    """MONAI's CacheDataset (filled now) + ThreadDataLoader over the two chains, as the fast-training tutorial."""
    import torch
    torch.set_num_threads(threads)
    mt = monai.transforms
    chain = mt.Compose(monai_peer.transforms(monai, deterministic) + monai_peer.transforms(monai, random),
                       lazy=lazy, overrides=overrides)
    monai.utils.set_determinism(seed=0)
    ds = monai.data.CacheDataset(files, transform=chain, cache_rate=1.0, num_workers=threads, progress=False)
    return monai.data.ThreadDataLoader(ds, batch_size=batch_size, num_workers=0, shuffle=True)


def monai_check(loader, samples, shape):
    """One untimed MONAI epoch, every batch checked (shapes, labels in {0, 1}, the sample count)."""
    n = 0
    for batch in loader:
        image, label = batch["image"], batch["label"]
        if tuple(image.shape[1:]) != shape or tuple(label.shape) != tuple(image.shape):
            sys.exit(f"verification failed: MONAI batch image {tuple(image.shape)}, label {tuple(label.shape)}; "
                     f"want (B,) + {shape}")
        check_labels(label, "MONAI batch")
        n += image.shape[0]
    if n != samples:
        sys.exit(f"verification failed: a MONAI epoch delivered {n} samples, not {samples}")


def monai_figure(loader, samples, min_seconds):
    """samples/s of whole epochs until they take min_seconds; only samples are counted on the clock."""
    n, seconds = 0, 0.0
    while seconds < min_seconds or n == 0:
        got = 0
        t0 = time.perf_counter()
        for batch in loader:
            got += batch["image"].shape[0]
        seconds += time.perf_counter() - t0
        if got != samples:
            sys.exit(f"verification failed: a MONAI epoch delivered {got} samples, not {samples}")
        n += got
    return n / seconds


def loader_config(tmp, deterministic, random, batch_size, prefetch):
    cfg = f"{tmp}/config.json"
    json.dump({"data": {"dataset": f"{tmp}/ds/dataset.json", "deterministic": deterministic, "random": random,
                        "cache": {"kind": "memory"}, "seed": 0,
                        "loader": {"batch_size": batch_size, "prefetch": prefetch}}}, open(cfg, "w"))
    return cfg


def numpy_rate(files):
    """The numpy random chain, one producer thread, over 2 volumes' deterministic outputs, for 10 s."""
    cached = [python_chain(f["image"], f["label"]) for f in files[:2]]
    rng = np.random.default_rng(0)
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < 10:
        for im, lb, fg, bg in cached:
            n += len(numpy_random_chain(im, lb, fg, bg, rng))
    return n / (time.perf_counter() - t0)


def table(rows, digits):
    """rows: (name, [samples/s per epoch]); prints the median (min-max) of each."""
    print(f"\n{'':52} {'samples/s':>10}  (min-max)")
    for name, rates in rows:
        print(f"{name:52} {statistics.median(rates):10.{digits}f}  ({min(rates):.{digits}f}-{max(rates):.{digits}f})")


def verdict(name, ratio, target):
    return f"{ratio:.1f}x {name} (target >= {target}x: {'met' if ratio >= target else 'NOT met'})"


def run_rounds(a, medfast, cfg, samples, monai_loaders, shape):
    """--rounds rounds: medfast's figures, then each MONAI loader's, in turn. Returns the figures' rates."""
    for loader in monai_loaders.values():
        monai_check(loader, samples, shape)
    m_rates, o_rates, first = [], {name: [] for name in monai_loaders}, None
    for _ in range(a.rounds):
        r, rates = medfast_rates(medfast, cfg, a, samples)
        first = first or r
        m_rates += rates
        for name, loader in monai_loaders.items():
            o_rates[name] += [monai_figure(loader, samples, a.min_seconds) for _ in range(a.figures)]
    return first, m_rates, o_rates


def spleen(a, monai):
    medfast = os.path.join(a.build, "medfast")
    samples, shape = a.cases * 4, (1, 96, 96, 96)
    with tempfile.TemporaryDirectory(prefix="medfast-loader-bench-", dir=os.path.abspath(a.build)) as tmp:
        files = synth(medfast, f"{tmp}/ds", a.cases, a.size)
        cfg = loader_config(tmp, CHAIN, RANDOM, 2, 4)
        verify_medfast(medfast, cfg, a.threads, f"{tmp}/batches", samples, shape)
        loaders = {}
        if monai:
            keys = ["image", "label"]
            loaders["MONAI CacheDataset + ThreadDataLoader"] = monai_loader(
                monai, files, CHAIN + [{"name": "EnsureType", "keys": keys, "track_meta": False}], RANDOM,
                a.threads, 2)
            monai.data.set_track_meta(False)  # the tutorial's fast path: no meta in the random chain
        r, m_rates, o_rates = run_rounds(a, medfast, cfg, samples, loaders, shape)
        py_rate = numpy_rate(files)
        print(f"machine: {machine()}" + (f"; {monai_peer.version(monai)}" if monai else ""))
        print(f"dataset: {a.cases} spleen-like volumes {a.size}; medfast memory cache filled in "
              f"{r['fill_seconds']:.1f} s; batch size {r['batch_size']} items x {r['samples_per_item']} crops; "
              f"medfast {r['threads']} loader threads, MONAI {a.threads} torch threads + ThreadDataLoader's producer "
              f"thread; medfast peak RSS {r['peak_rss_bytes'] / 2**30:.2f} GiB; {a.rounds} rounds x {a.figures} "
              f"figures of >= {a.min_seconds} s each")
        print(f"verified off the clock: medfast {r['verified']}; a checked epoch of each loader delivered {samples} "
              f"samples of 96^3 (image and label), labels in {{0, 1}}; every timed epoch counted {samples} samples")
        print_rates(m_rates, o_rates, 1)
        table([("medfast loader", m_rates)] + list(o_rates.items()) +
              [("numpy random chain, 1 thread (10 s, 2 volumes)", [py_rate])], 1)
        med = statistics.median(m_rates)
        line = f"\nspeed: {verdict('the numpy chain', med / py_rate, 1.5)}"
        for name, rates in o_rates.items():
            line += f"; {verdict(name, med / statistics.median(rates), 8)}"
        print(line if o_rates else line + "; MONAI not measured (peer not found)")


def print_rates(m_rates, o_rates, digits):
    """Every epoch's samples/s, medfast's then each MONAI loader's."""
    for name, rates in [("medfast", m_rates)] + list(o_rates.items()):
        print(f"{name} samples/s per figure: {', '.join(f'{x:.{digits}f}' for x in rates)}")


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


def heavy(a, monai):
    medfast = os.path.join(a.build, "medfast")
    shape = (1, 200, 210, 220)
    with tempfile.TemporaryDirectory(prefix="medfast-loader-bench-", dir=os.path.abspath(a.build)) as tmp:
        files = synth(medfast, f"{tmp}/ds", a.cases, a.size)
        cfg = loader_config(tmp, HEAVY_DETERMINISTIC, HEAVY_RANDOM, 1, 2)
        verify_medfast(medfast, cfg, a.threads, f"{tmp}/batches", a.cases, shape)
        loaders = {}
        if monai:
            modes = {k: {"mode": m} for k, m in zip(HEAVY_RANDOM[0]["keys"], HEAVY_RANDOM[0]["mode"])}
            loaders["MONAI Compose"] = monai_loader(monai, files, HEAVY_DETERMINISTIC, HEAVY_RANDOM, a.threads, 1)
            loaders["MONAI Compose(lazy=True)"] = monai_loader(monai, files, HEAVY_DETERMINISTIC, HEAVY_RANDOM,
                                                              a.threads, 1, lazy=True, overrides=modes)
        r, m_rates, o_rates = run_rounds(a, medfast, cfg, a.cases, loaders, shape)
        im = python_chain(files[0]["image"], files[0]["label"])[0]  # close enough input size
        t0 = time.perf_counter()
        scipy_heavy(im, np.random.default_rng(0))
        py_rate = 1 / (time.perf_counter() - t0)
        print(f"machine: {machine()}" + (f"; {monai_peer.version(monai)}" if monai else ""))
        print(f"dataset: {a.cases} spleen-like volumes {a.size}; memory cache of the Spacing(1.5, 1.5, 2) output "
              f"(medfast filled it in {r['fill_seconds']:.1f} s); batch size 1; medfast {r['threads']} loader threads, "
              f"MONAI {a.threads} torch threads + ThreadDataLoader's producer thread; "
              f"medfast peak RSS {r['peak_rss_bytes'] / 2**30:.2f} GiB; {a.rounds} rounds x {a.figures} figures of "
              f">= {a.min_seconds} s each")
        print("chain: RandRotate(0.1, 0.1, 0.3, p=1) + RandZoom(0.8-1.2, p=1) on image (bilinear) and label (nearest), "
              "ResizeWithPadOrCrop(200, 210, 220); medfast composes them into one resampling per key")
        print(f"verified off the clock: medfast {r['verified']}; a checked epoch of each loader delivered {a.cases} "
              f"samples of 200x210x220 (image and label), labels in {{0, 1}}; every timed epoch counted {a.cases}")
        print_rates(m_rates, o_rates, 2)
        table([("medfast loader", m_rates)] + list(o_rates.items()) +
              [("scipy, image only, two resamplings (1 sample)", [py_rate])], 2)
        med = statistics.median(m_rates)
        line = f"\nspeed: {med / py_rate:.1f}x scipy"
        if o_rates:
            best = max(o_rates, key=lambda k: statistics.median(o_rates[k]))
            line += f"; {verdict(f'the faster MONAI ({best})', med / statistics.median(o_rates[best]), 30)}"
        print(line if o_rates else line + "; MONAI not measured (peer not found)")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("--cases", type=int, default=8)
    ap.add_argument("--size", default="512,512,40-100")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--figures", type=int, default=3, help="figures per contender per round")
    ap.add_argument("--min-seconds", type=float, default=1.0, help="epoch time per figure, at least")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--no-check", action="store_true", help="medfast's bench without its checked pass")
    ap.add_argument("--chain", choices=["spleen", "heavy"], default="spleen")
    monai_peer.add_argument(ap)
    a = ap.parse_args()
    monai = monai_peer.load(a.monai)
    return heavy(a, monai) if a.chain == "heavy" else spleen(a, monai)


if __name__ == "__main__":
    main()
