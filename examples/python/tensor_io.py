#!/usr/bin/env python3
"""Tensor I/O with medfast, after DeepNVMe's load/store examples.

    python3 examples/python/tensor_io.py [--mb 256] [--dir /tmp/medfast-io] [--device cpu|cuda]

Saves a tensor three ways (medfast.io.save_tensor, medfast.io.save of the raw
bytes, torch.save), loads each back, checks the values, and prints the GB/s of
each way (the page cache is dropped before every load: posix_fadvise DONTNEED).
"""
import argparse
import os
import time

import torch

import medfast


def drop_cache(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def timed(f):
    t0 = time.perf_counter()
    out = f()
    return out, time.perf_counter() - t0


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--mb", type=int, default=256)
    p.add_argument("--dir", default="/tmp/medfast-io")
    p.add_argument("--device", default="cpu")
    a = p.parse_args()
    os.makedirs(a.dir, exist_ok=True)
    n = a.mb << 20
    t = torch.rand(n // 4, dtype=torch.float32, device=a.device)
    gb = n / 1e9
    paths = {k: os.path.join(a.dir, k) for k in ["medfast.mft", "medfast.raw", "torch.pt"]}

    _, s = timed(lambda: medfast.io.save_tensor(t, paths["medfast.mft"]))
    print(f"medfast.io.save_tensor   {gb / s:6.2f} GB/s (written to a temporary name, fsynced, renamed)")
    _, s = timed(lambda: medfast.io.save(t, paths["medfast.raw"]))
    print(f"medfast.io.save (raw)    {gb / s:6.2f} GB/s")
    _, s = timed(lambda: torch.save(t, paths["torch.pt"]))
    print(f"torch.save               {gb / s:6.2f} GB/s (no fsync)")

    drop_cache(paths["medfast.mft"])
    back, s = timed(lambda: medfast.io.load_tensor(paths["medfast.mft"], device=a.device))
    assert torch.equal(back, t)
    print(f"medfast.io.load_tensor   {gb / s:6.2f} GB/s (checksum verified)")
    drop_cache(paths["medfast.raw"])
    out = torch.empty_like(t)
    _, s = timed(lambda: medfast.io.load(paths["medfast.raw"], out=out))
    assert torch.equal(out, t)
    print(f"medfast.io.load (raw)    {gb / s:6.2f} GB/s (into a preallocated tensor)")
    drop_cache(paths["torch.pt"])
    back, s = timed(lambda: torch.load(paths["torch.pt"], map_location=a.device))
    assert torch.equal(back, t)
    print(f"torch.load               {gb / s:6.2f} GB/s")

    h = medfast.io.FileHandle(paths["medfast.raw"])  # the io_backend setting: io_uring where the kernel allows it
    half = torch.empty(t.numel() // 2, dtype=t.dtype, device=a.device)
    future = h.async_pread(half, offset=0)  # the GIL is free while it runs
    assert future.wait() == half.numel() * 4 and torch.equal(half, t[: half.numel()])
    print(f"FileHandle.async_pread   read the first half through {h.backend}")
    for p in paths.values():
        os.remove(p)


if __name__ == "__main__":
    main()
