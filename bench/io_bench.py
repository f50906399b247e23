#!/usr/bin/env python3
"""Tensor file engine: medfast vs fio vs a plain Python read, in one run (issue 3).

Usage: /usr/bin/python3 bench/io_bench.py [--build build] [--dir DIR] [--size-mb 1024]
                                          [--block-size 1M] [--queue-depth 128] [--repeat 3]

Cold reads of a SIZE file of random bytes: O_DIRECT (fio --direct=1, medfast
odirect/io_uring) with the file dropped from the page cache before each run
(medfast's O_DIRECT reads take what the cache holds first: io_cache_first), as
for Python and medfast posix. Warm reads: the file in the page cache, medfast
io_uring and odirect with io_cache_first on and off against a Python read.
Writes include fsync (fio --end_fsync=1). medfast's loads run with --validate
(bytes compared with a plain read after the timed loops) and stores with
--validate (read back and compared).
"""
import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time


def drop_cache(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fdatasync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def fio(path, rw, size_mb, bs, qd, extra=()):
    cmd = ["fio", "--name=medfast-bench", f"--filename={path}", f"--rw={rw}", f"--bs={bs}", f"--iodepth={qd}",
           "--ioengine=io_uring", "--direct=1", f"--size={size_mb}M", "--numjobs=1", "--output-format=json"]
    if rw == "write":
        cmd.append("--end_fsync=1")
    cmd += list(extra)
    out = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)
    job = out["jobs"][0]["read" if rw == "read" else "write"]
    return job["bw_bytes"] / 1e9


def medfast_json(args):
    return json.loads(subprocess.run(args, check=True, capture_output=True, text=True).stdout)


def python_read(path, cold=True):
    import torch
    if cold:
        drop_cache(path)
    t0 = time.perf_counter()
    t = torch.frombuffer(bytearray(open(path, "rb").read()), dtype=torch.uint8)
    dt = time.perf_counter() - t0
    return t.numel() / dt / 1e9


def table(title, columns, results, relative):
    """One table of the rounds' medians (min-max beside), medfast's rows also as ratios."""
    print(f"\n{title:32} GB/s  (min-max)      {columns}")
    for k, runs in results.items():
        v = statistics.median(runs)
        rel = relative(v) if k.startswith("medfast") else ""
        print(f"  {k:30} {v:5.2f}  ({min(runs):.2f}-{max(runs):.2f})  {rel}")


def machine(path):
    cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "cpu?")
    dev = subprocess.run(["df", "--output=source", path], capture_output=True, text=True).stdout.split()[-1]
    return f"{cpu}, {os.cpu_count()} cores, {platform.release()}, file on {dev}"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("--dir", default="build/io-bench")
    ap.add_argument("--size-mb", type=int, default=1024)
    ap.add_argument("--block-size", default="1M")
    ap.add_argument("--queue-depth", type=int, default=128)
    ap.add_argument("--repeat", type=int, default=5)
    a = ap.parse_args()
    medfast = os.path.join(a.build, "medfast")
    version = subprocess.run([medfast, "--version"], capture_output=True, text=True).stdout
    if "io_uring off" in version:
        print(f"io_bench: skipped: this medfast was built without io_uring ({version.strip()}); "
              "the benchmark compares its io_uring backend with fio's")
        return
    os.makedirs(a.dir, exist_ok=True)
    path = os.path.join(a.dir, "bench.bin")
    if not os.path.exists(path) or os.path.getsize(path) != a.size_mb << 20:
        with open(path, "wb") as f:
            for _ in range(a.size_mb):
                f.write(os.urandom(1 << 20))
    print(f"machine: {machine(path)}")
    print(f"file: {a.size_mb} MiB random bytes; block {a.block_size}, queue depth {a.queue_depth}, "
          f"medfast threads {os.cpu_count()}; median of {a.repeat}")

    # Runs alternate between the tools so that drift of a shared or virtual
    # disk hits every tool alike; each figure is the median over the rounds.
    fio_opts = {"fio io_uring direct": [], "fio +fixedbufs+registerfiles": ["--fixedbufs=1", "--registerfiles=1"]}
    loads = {"io_uring": ["--drop-cache"], "odirect": ["--drop-cache"], "posix": ["--drop-cache"]}
    results = {name: [] for name in list(fio_opts) + [f"medfast {b}" for b in loads] + ["python read()"]}
    for _ in range(a.repeat):
        for name, extra in fio_opts.items():
            results[name].append(fio(path, "read", a.size_mb, a.block_size, a.queue_depth, extra))
        for backend, extra in loads.items():
            j = medfast_json([medfast, "io", "load", "--file", path, "--backend", backend, "--block-size",
                              a.block_size, "--queue-depth", str(a.queue_depth), "--loop", "1", "--json"] + extra)
            results[f"medfast {backend}"].append(j["median_gbps"])
        results["python read()"].append(python_read(path))
    for backend, extra in loads.items():  # correctness, outside the timed rounds
        j = medfast_json([medfast, "io", "load", "--file", path, "--backend", backend, "--loop", "1", "--validate",
                          "--json"] + extra)
        assert j["validated"], j
    med = {k: statistics.median(v) for k, v in results.items()}
    fio_best = max(med["fio io_uring direct"], med["fio +fixedbufs+registerfiles"])
    py = med["python read()"]
    table("read (cold)", "vs best fio  vs python", results, lambda v: f"{v / fio_best:9.2f}x  {v / py:8.2f}x")
    best = max(((k, v) for k, v in med.items() if k.startswith("medfast")), key=lambda kv: kv[1])

    # Warm: the file in the page cache (a disk cache or a checkpoint read again).
    warm = {"io_uring cache first": ["--backend", "io_uring"],
            "io_uring O_DIRECT only": ["--backend", "io_uring", "--cache-first", "off"],
            "odirect cache first": ["--backend", "odirect"]}
    for extra in warm.values():  # correctness first: the bytes and where they came from
        j = medfast_json([medfast, "io", "load", "--file", path, "--loop", "1", "--validate", "--json"] + extra)
        assert j["validated"], j
    python_read(path, cold=False)  # cached now
    wresults = {f"medfast {k}": [] for k in warm}
    wresults["python read() warm"] = []
    for _ in range(a.repeat):
        for name, extra in warm.items():
            j = medfast_json([medfast, "io", "load", "--file", path, "--block-size", a.block_size, "--queue-depth",
                              str(a.queue_depth), "--loop", "1", "--json"] + extra)
            # all from the cache (a page the kernel dropped meanwhile comes direct), or none
            cached = j["page_cache_bytes"]
            assert (cached >= 0.9 * j["bytes"]) if j["cache_first"] else cached == 0, (name, cached, j["bytes"])
            wresults[f"medfast {name}"].append(j["median_gbps"])
        wresults["python read() warm"].append(python_read(path, cold=False))
    pyw = statistics.median(wresults["python read() warm"])
    table("read (warm: in the page cache)", "vs python", wresults, lambda v: f"{v / pyw:9.2f}x")

    wpath = os.path.join(a.dir, "fio-write.bin")
    wres = {"fio io_uring direct": [], "medfast io_uring": [], "medfast odirect": [], "medfast posix": []}
    for _ in range(a.repeat):
        wres["fio io_uring direct"].append(fio(wpath, "write", a.size_mb, a.block_size, a.queue_depth))
        for backend in ("io_uring", "odirect", "posix"):
            j = medfast_json([medfast, "io", "store", "--dir", a.dir, "--mb-size", str(a.size_mb), "--backend",
                              backend, "--block-size", a.block_size, "--queue-depth", str(a.queue_depth), "--loop",
                              "1", "--validate", "--json"])
            assert j["validated"], j
            wres[f"medfast {backend}"].append(j["median_gbps"])
    os.remove(wpath)
    wmed = {k: statistics.median(v) for k, v in wres.items()}
    fio_write = wmed["fio io_uring direct"]
    table("write (+fsync)", "vs fio", wres, lambda v: f"{v / fio_write:9.2f}x")
    wrows = [(k, v) for k, v in wmed.items() if k.startswith("medfast")]
    print(f"\nbest read: {best[0]} {best[1] / fio_best:.2f}x best fio, {best[1] / py:.2f}x python; "
          f"best write: {max(w[1] for w in wrows) / fio_write:.2f}x fio")


if __name__ == "__main__":
    main()
