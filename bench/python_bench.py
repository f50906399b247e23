#!/usr/bin/env python3
"""medfast from Python against what PyTorch and MONAI users run today (issue 13).

Usage: PYTHONPATH=build/python /usr/bin/python3 bench/python_bench.py [--mb 1024] [--rounds 3]
           [--dir /var/tmp/medfast-bench] [--threads 2] [--monai ../shared/peers/monai-1.3.2]

1. Tensor I/O, 1 GiB of float32, the page cache dropped (posix_fadvise DONTNEED, after
   fsync) before every load of every contender, each load checked equal to the tensor:
   - load: medfast.io.load into a preallocated CPU tensor, medfast.io.load_tensor (header,
     checksum), torch.load, and a plain Python read (open().readinto a tensor's memory);
   - save: medfast.io.save_tensor with durable=False (like torch.save, no fsync) and
     durable=True (fsync + rename), and medfast.io.save (raw bytes), against torch.save;
     every saved file is then loaded and compared.
2. The loader: medfast.data.Loader driving a Python loop against MONAI's ThreadDataLoader
   (num_workers=0, as the fast-training tutorial) over MONAI's CacheDataset, on the built-in
   default run's data (12 synthetic spleen-like cases; the spleen recipe's deterministic
   and random chains, RandCropByPosNegLabel with 4 samples, batch 2); the same threads.
   Checked first: both give batches of the same shapes with labels in {0, 1}. MONAI
   comes from --monai (skipped with a message when absent).
Every figure is the median of --rounds rounds; ratios are medfast over the other.
"""
import argparse
import os
import platform
import statistics
import sys
import tempfile
import time

import torch

import medfast

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cache_fill import machine as host_machine  # noqa: E402
from io_bench import drop_cache  # noqa: E402


def machine():
    return f"{host_machine()}, Python {platform.python_version()}, torch {torch.__version__}"


def timed(f):
    t0 = time.perf_counter()
    out = f()
    return out, time.perf_counter() - t0


def python_read(path, out):
    with open(path, "rb", buffering=0) as f:
        view = memoryview(out.numpy()).cast("B")
        got = 0
        while got < len(view):
            n = f.readinto(view[got:])
            if not n:
                break
            got += n
    return out


def io_bench(a):
    os.makedirs(a.dir, exist_ok=True)
    n = a.mb << 20
    t = torch.rand(n // 4, dtype=torch.float32)
    gb = n / 1e9
    paths = {k: os.path.join(a.dir, k) for k in ["raw.bin", "tensor.mft", "tensor.pt"]}
    saves = {"medfast.io.save_tensor (no fsync)": [], "medfast.io.save_tensor (fsync + rename)": [],
             "medfast.io.save (raw bytes, no fsync)": [], "torch.save": []}
    loads = {"medfast.io.load (preallocated)": [], "medfast.io.load_tensor": [], "torch.load": [],
             "Python read (readinto)": []}
    out = torch.empty_like(t)
    for r in range(a.rounds):
        for name, f in [("medfast.io.save_tensor (no fsync)", lambda: medfast.io.save_tensor(t, paths["tensor.mft"], durable=False)),
                        ("torch.save", lambda: torch.save(t, paths["tensor.pt"])),
                        ("medfast.io.save_tensor (fsync + rename)", lambda: medfast.io.save_tensor(t, paths["tensor.mft"])),
                        ("medfast.io.save (raw bytes, no fsync)", lambda: medfast.io.save(t, paths["raw.bin"], durable=False))]:
            _, s = timed(f)
            saves[name].append(gb / s)
        for name, path, f in [
                ("medfast.io.load (preallocated)", paths["raw.bin"], lambda: medfast.io.load(paths["raw.bin"], out=out)),
                ("medfast.io.load_tensor", paths["tensor.mft"], lambda: medfast.io.load_tensor(paths["tensor.mft"])),
                ("torch.load", paths["tensor.pt"], lambda: torch.load(paths["tensor.pt"])),
                ("Python read (readinto)", paths["raw.bin"], lambda: python_read(paths["raw.bin"], out))]:
            out.zero_()
            drop_cache(path)
            got, s = timed(f)
            assert torch.equal(got, t), f"{name} read other values"
            loads[name].append(gb / s)
    for p in paths.values():
        os.remove(p)
    print(f"\n## Tensor I/O: {a.mb} MiB float32, page cache dropped before every load, {a.rounds} rounds (median GB/s)")
    print("\n| load | GB/s | medfast.io.load over it |\n|---|---|---|")
    base = statistics.median(loads["medfast.io.load (preallocated)"])
    for name, v in loads.items():
        m = statistics.median(v)
        print(f"| {name} | {m:.2f} | {base / m:.2f}x |")
    print("\n| save | GB/s | medfast.io.save_tensor (no fsync) over it |\n|---|---|---|")
    base = statistics.median(saves["medfast.io.save_tensor (no fsync)"])
    for name, v in saves.items():
        m = statistics.median(v)
        print(f"| {name} | {m:.2f} | {base / m:.2f}x |")


def monai_transforms(monai, config):
    t = monai.transforms
    keys = ["image", "label"]
    deterministic = t.Compose([
        t.LoadImaged(keys=keys, image_only=False), t.EnsureChannelFirstd(keys=keys),
        t.Orientationd(keys=keys, axcodes="RAS"),
        t.Spacingd(keys=keys, pixdim=(2.0, 2.0, 3.0), mode=("bilinear", "nearest")),
        t.ScaleIntensityRanged(keys="image", a_min=-57, a_max=164, b_min=0.0, b_max=1.0, clip=True),
        t.CropForegroundd(keys=keys, source_key="image"),
        t.FgBgToIndicesd(keys="label", image_key="image"),
        t.EnsureTyped(keys=keys, track_meta=False),
    ])
    random = t.Compose([
        t.RandCropByPosNegLabeld(keys=keys, label_key="label", spatial_size=(32, 32, 16), pos=1, neg=1,
                                 num_samples=4, fg_indices_key="label_fg_indices", bg_indices_key="label_bg_indices"),
        t.RandFlipd(keys=keys, spatial_axis=[0], prob=0.5),
        t.RandFlipd(keys=keys, spatial_axis=[1], prob=0.5),
        t.RandShiftIntensityd(keys="image", offsets=0.1, prob=0.5),
    ])
    return t.Compose([deterministic, random]), deterministic


def loader_bench(a):
    if not a.monai or not os.path.isdir(a.monai):
        print(f"\n## Loader: skipped: MONAI not found at {a.monai!r} (pass --monai PATH)")
        return
    sys.path.insert(0, os.path.abspath(a.monai))
    import monai
    import monai.data
    import monai.transforms
    torch.set_num_threads(a.threads)
    work = tempfile.mkdtemp(prefix="medfast-pybench-")
    config = medfast.train.default_config()
    config["data"]["dataset"] = os.path.join(work, "synth", "dataset.json")
    config["data"]["validation"] = None
    config["data"]["loader"]["threads"] = a.threads
    ds = medfast.data.CachedDataset(config)
    loader = medfast.data.Loader(ds)
    import json
    items = json.load(open(config["data"]["dataset"]))["training"]
    files = [{"image": os.path.join(work, "synth", i["image"]), "label": os.path.join(work, "synth", i["label"])}
             for i in items]
    full, deterministic = monai_transforms(monai, config)
    monai.utils.set_determinism(seed=0)
    cache = monai.data.CacheDataset(files, transform=full, cache_rate=1.0, num_workers=a.threads, progress=False)
    monai_loader = monai.data.ThreadDataLoader(cache, batch_size=2, num_workers=0, shuffle=True)

    def shapes(batch):
        return tuple(batch["image"].shape), tuple(batch["label"].shape)

    m_first = next(iter(loader))
    o_first = next(iter(monai_loader))
    assert shapes(m_first) == shapes(o_first), (shapes(m_first), shapes(o_first))
    for b in (m_first, o_first):
        assert set(torch.unique(torch.as_tensor(b["label"])).tolist()) <= {0.0, 1.0}
    rates = {"medfast.data.Loader (Python loop)": [], "MONAI CacheDataset + ThreadDataLoader": []}
    for r in range(a.rounds):
        loader.set_epoch(r)
        n, s = timed(lambda: sum(b["image"].shape[0] for b in loader))
        rates["medfast.data.Loader (Python loop)"].append(n / s)
        n, s = timed(lambda: sum(b["image"].shape[0] for b in monai_loader))
        rates["MONAI CacheDataset + ThreadDataLoader"].append(n / s)
    print(f"\n## Loader: the default run's data ({len(ds)} cases), spleen chains, batch 2 x 4 crops, "
          f"{a.threads} threads, {a.rounds} epochs (median samples/s)")
    print("\n| loader | samples/s | medfast over it |\n|---|---|---|")
    base = statistics.median(rates["medfast.data.Loader (Python loop)"])
    for name, v in rates.items():
        m = statistics.median(v)
        print(f"| {name} | {m:.1f} | {base / m:.2f}x |")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--mb", type=int, default=1024)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--dir", default="/var/tmp/medfast-bench")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--monai", default=os.path.join(os.path.dirname(__file__), "..", "..", "shared", "peers",
                                                   "monai-1.3.2"))
    p.add_argument("--skip-io", action="store_true")
    p.add_argument("--skip-loader", action="store_true")
    a = p.parse_args()
    print(f"Machine: {machine()}; medfast {medfast.__version__} (libtorch {medfast.libtorch_version})")
    if not a.skip_io:
        io_bench(a)
    if not a.skip_loader:
        loader_bench(a)


if __name__ == "__main__":
    main()
