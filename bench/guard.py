#!/usr/bin/env python3
"""The hot-path guard (issue 52): medfast's CPU hot paths as fractions of a limit measured in the
same run on the same machine, each against a floor kept in the repository.

Usage: /usr/bin/python3 bench/guard.py [--build build] [--threads 2] [--out build/guard.json]
           [--floors bench/guard_floors.json] [--only NAME[,NAME...]] [--set-floors] [--read-mb 1024]

A second of a hot path means nothing across machines; the same second beside what the machine
can do at all (copy memory, read the file plainly, inflate the gzip stream, multiply matrices)
does. Each figure here is such a fraction, the best of --repeats measurements, each taken in
turn with its limit:

  chain      the spleen random chain from a memory cache (`bench loader`: 8 items x 4 crops of
             96^3, every batch of one epoch checked off the clock, then figures of >= 1 s of
             epochs), as bytes of batches per second, over the memory copy bandwidth
             (torch's copy_ of 512 MiB with the same threads)
  read_cold  a 1 GiB file read through the engine (`io load --drop-cache`, defaults: the auto
             backend), over a plain sequential read of the same file (8 MiB read()s), both
             dropped from the page cache first; five alternations, the median of the ratios
  read_warm  the same in the page cache
  fill       the spleen deterministic chain into a memory cache (`bench loader`'s fill seconds)
             for 8 spleen-like volumes, over a plain zlib inflate of the same .nii.gz files' gzip
             members (the same threads): how close the fill is to the inflate the design calls
             its bound
  info       `medfast info --stats` of a 512x512x120 int16 CT (the whole process), over a plain
             zlib inflate of the file's gzip members (the same threads)
  epoch      the built-in default run's epoch (training and validation; the median epoch of 8),
             as the convolutions' FLOPs of its training steps per second, over the machine's
             fp32 matrix multiply (torch.mm 2048^2 with the same threads)

Verified before anything is timed: `bench loader` checks its own batches; `io load --validate`
compares the bytes read with a plain read; the fill's items and the default run's epochs and
finite losses are counted; `info --stats`'s mean equals numpy's on the inflated voxels.

Each fraction's floor (--floors) is about half of the fraction measured when it was set (0.6x,
so that a hot path slowed 2x falls under it), with the date, machine and commit it was set on.
A fraction under its floor is measured once more (a noisy neighbour is not a regression); under
it again, the guard fails naming the figure, its value, the limit and the floor. Every fraction
goes to --out (JSON) either way, so a slide shows before it falls through a floor.
--set-floors writes the floors file from this run (0.6x each fraction).
"""
import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import zlib
from concurrent.futures import ThreadPoolExecutor

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from cache_fill import CHAIN, machine, synth  # noqa: E402
from loader_bench import RANDOM  # noqa: E402

FLOOR_OF_TODAY = 0.6
NAMES = ["chain", "read_cold", "read_warm", "fill", "info", "epoch"]
DEFAULT_RUN_EPOCHS = 8
# The built-in default run's network and training batch (src/train/run_config.cpp): 2 items x 4 crops
# of 32x32x16.
DEFAULT_MODEL = {"name": "UNet", "in_channels": 1, "out_channels": 2, "channels": [8, 16, 32, 64],
                 "strides": [2, 2, 2], "num_res_units": 1, "norm": "instance"}
DEFAULT_INPUT = "8,1,32,32,16"


def run(cmd, **kw):
    p = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if p.returncode != 0:
        sys.exit(f"guard: failed ({p.returncode}): {' '.join(map(str, cmd))}\n{p.stderr[-3000:]}")
    return p.stdout


def medfast_json(a, *args, cwd=None):
    return json.loads(run([a.medfast, "--threads", str(a.threads), *args], cwd=cwd))


def drop_cache(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fdatasync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


# ---- limits ----

def copy_bandwidth(threads):
    """Bytes copied per second by torch's copy_ of 512 MiB of float32 (the best of 5, after a warm-up)."""
    import torch
    torch.set_num_threads(threads)
    src = torch.rand(128 << 20)
    dst = torch.empty_like(src)
    dst.copy_(src)
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        dst.copy_(src)
        best = min(best, time.perf_counter() - t0)
    assert torch.equal(dst, src)
    return src.numel() * 4 / best


def matmul_flops(threads):
    """fp32 FLOP/s of torch.mm 2048 x 2048 (the best of 5, after a warm-up)."""
    import torch
    torch.set_num_threads(threads)
    x, y = torch.rand(2048, 2048), torch.rand(2048, 2048)
    torch.mm(x, y)
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        torch.mm(x, y)
        best = min(best, time.perf_counter() - t0)
    return 2 * 2048 ** 3 / best


def plain_read(path, cold):
    """A plain sequential read of the whole file into one buffer, 8 MiB per read(): bytes/s."""
    size = os.path.getsize(path)
    buf = bytearray(size)
    view = memoryview(buf)
    view[::4096] = b"\0" * len(view[::4096])  # the buffer's pages faulted in before the clock, as the engine's are
    if cold:
        drop_cache(path)
    t0 = time.perf_counter()
    with open(path, "rb", buffering=0) as f:
        got = 0
        while got < size:
            n = f.readinto(view[got:got + (8 << 20)])
            if not n:
                break
            got += n
    seconds = time.perf_counter() - t0
    assert got == size, (got, size)
    return size / seconds


def gzip_members(path):
    """The file's gzip members as separate byte strings (medfast writes a volume as several,
    compressed in parallel, and inflates them in parallel: so does the limit)."""
    data, members = open(path, "rb").read(), []
    while data:
        d = zlib.decompressobj(wbits=31)
        d.decompress(data)
        rest = d.unused_data
        members.append(data[:len(data) - len(rest)])
        data = rest
    return members


def inflate_seconds(paths, threads):
    """Seconds for zlib to inflate every gzip member of the files (read into memory first) on
    `threads` threads (zlib releases the GIL), and the bytes inflated."""
    members = [m for p in paths for m in gzip_members(p)]
    t0 = time.perf_counter()
    with ThreadPoolExecutor(max(1, threads)) as pool:
        total = sum(pool.map(lambda m: len(zlib.decompress(m, wbits=31)), members))
    return time.perf_counter() - t0, total


# ---- figures: each returns (fraction, detail) ----

class Guard:
    def __init__(self, a, tmp):
        self.a, self.tmp = a, tmp
        self._copy = self._flops = None
        self._spleen = self._ct = self._bigfile = None

    def spleen(self):
        if self._spleen is None:
            files = synth(self.a.medfast, f"{self.tmp}/spleen", 8, "512,512,40-60")
            ds = f"{self.tmp}/spleen/dataset.json"
            self._spleen = files, ds
        return self._spleen

    def loader_config(self, random, name):
        _, ds = self.spleen()
        cfg = f"{self.tmp}/{name}.json"
        json.dump({"data": {"dataset": ds, "deterministic": CHAIN, "random": random, "cache": {"kind": "memory"},
                            "seed": 0, "loader": {"batch_size": 2, "prefetch": 4}}}, open(cfg, "w"))
        return cfg

    def chain(self):
        files, _ = self.spleen()
        cfg = self.loader_config(RANDOM, "chain")
        r = medfast_json(self.a, "bench", "loader", "--config", cfg, "--json", "--repeats", "3", "--min-seconds", "1")
        want = len(files) * 4
        assert r["samples_per_epoch"] == want and all(e["samples"] == want for e in r["epochs"]), r["epochs"]
        limit = copy_bandwidth(self.a.threads)
        rate = r["samples_per_second"] * r["bytes_per_sample"]
        return rate / limit, {"samples_per_second": r["samples_per_second"], "bytes_per_second": rate,
                              "limit": "memory copy (torch copy_, 512 MiB)", "limit_bytes_per_second": limit,
                              "verified": r["verified"]}

    def bigfile(self):
        if self._bigfile is None:
            path = f"{self.tmp}/read.bin"
            chunk = np.random.default_rng(0).integers(0, 256, 64 << 20, dtype=np.uint8).tobytes()
            with open(path, "wb") as f:
                for _ in range(self.a.read_mb // 64):
                    f.write(chunk)
                os.fsync(f.fileno())
            first = medfast_json(self.a, "io", "load", "--file", path, "--loop", "1", "--validate", "--json")
            assert first["validated"] and first["bytes"] == os.path.getsize(path), first
            self._bigfile = path
        return self._bigfile

    def read(self, cold):
        """Five alternations of the engine's read (`io load`, one loop) and the plain read, the ratio
        taken pair by pair (a virtual disk's speed drifts between reads) and its median."""
        path = self.bigfile()
        args = ["io", "load", "--file", path, "--loop", "1", "--json"] + (["--drop-cache"] if cold else [])
        if not cold:
            plain_read(path, cold=False)  # the file in the page cache for both
        ratios, engines, plains = [], [], []
        for _ in range(5):
            r = medfast_json(self.a, *args)
            engines.append(r["median_gbps"] * 1e9)
            plains.append(plain_read(path, cold))
            ratios.append(engines[-1] / plains[-1])
        return statistics.median(ratios), {
            "engine_bytes_per_second": statistics.median(engines), "backend": r.get("backend"), "direct": r.get("direct"),
            "limit": "plain sequential read (8 MiB read()s)", "limit_bytes_per_second": statistics.median(plains),
            "pair_ratios": ratios, "file_bytes": r["bytes"]}

    def read_cold(self):
        return self.read(True)

    def read_warm(self):
        return self.read(False)

    def fill(self):
        files, _ = self.spleen()
        cfg = self.loader_config([], "fill")
        r = medfast_json(self.a, "bench", "loader", "--config", cfg, "--json", "--no-check", "--repeats", "1",
                         "--min-seconds", "0", "--set", "data.loader.batch_size=1")
        assert r["items"] == len(files) and all(e["samples"] == len(files) for e in r["epochs"]), r
        paths = [f[k] for f in files for k in ("image", "label")]
        for p in paths:  # both sides read from the page cache
            open(p, "rb").read()
        seconds, inflated = inflate_seconds(paths, self.a.threads)
        return seconds / r["fill_seconds"], {
            "fill_seconds": r["fill_seconds"], "volumes": len(files), "limit": f"zlib inflate of the gzip members, {self.a.threads} threads",
            "limit_seconds": seconds, "inflated_bytes": inflated}

    def ct(self):
        if self._ct is None:
            self._ct = synth(self.a.medfast, f"{self.tmp}/ct", 1, "512,512,120")[0]["image"]
            stats = medfast_json(self.a, "info", self._ct, "--stats", "--json")["stats"]
            import nibabel as nib
            mean = float(np.asanyarray(nib.load(self._ct).dataobj).mean())
            assert abs(stats["mean"] - mean) <= 1e-9 * abs(mean), (stats["mean"], mean)
        return self._ct

    def info(self):
        path = self.ct()
        t0 = time.perf_counter()
        run([self.a.medfast, "--threads", str(self.a.threads), "info", path, "--stats"])
        seconds = time.perf_counter() - t0
        inflate, _ = inflate_seconds([path], self.a.threads)
        return inflate / seconds, {"info_seconds": seconds, "limit": f"zlib inflate of its gzip members, {self.a.threads} threads",
                                   "limit_seconds": inflate}

    def epoch_macs(self):
        r = medfast_json(self.a, "bench", "step", "--model", json.dumps(DEFAULT_MODEL), "--input", DEFAULT_INPUT,
                         "--steps", "1", "--warmup", "0", "--json")
        return r["eval_forward_macs"]

    def epoch(self):
        work = f"{self.tmp}/default-run"
        os.makedirs(work, exist_ok=True)
        r = medfast_json(self.a, "train", "--json", "--overwrite", "--set", f"train.epochs={DEFAULT_RUN_EPOCHS}",
                         "--set", "train.target_dice=0", cwd=work)
        history = r["history"]
        assert len(history) == DEFAULT_RUN_EPOCHS, len(history)
        assert all(np.isfinite(e["loss"]) for e in history), [e["loss"] for e in history]
        seconds = statistics.median(e["seconds"] for e in history[1:])
        steps = statistics.median(e["steps"] for e in history)
        macs = self.epoch_macs()
        flops = 2 * 3 * macs * steps / seconds  # forward, and backward as two forwards
        limit = matmul_flops(self.a.threads)
        return flops / limit, {"epoch_seconds": seconds, "steps": steps, "step_forward_macs": macs,
                               "flops_per_second": flops, "limit": "fp32 matrix multiply (torch.mm 2048^2)",
                               "limit_flops_per_second": limit}

    def measure(self, name):
        """The best of --repeats runs, each with its own limit: a busy machine only ever slows a run
        down, so the best is what the code can do (the medians of these runs varied by +-15% here)."""
        runs = [getattr(self, name)() for _ in range(self.a.repeats)]
        fractions = [f for f, _ in runs]
        best = max(runs, key=lambda r: r[0])
        return {"fraction": best[0], "fractions": fractions, **best[1]}


def commit():
    try:
        return run(["git", "-C", os.path.dirname(HERE), "rev-parse", "--short", "HEAD"]).strip()
    except SystemExit:
        return "unknown"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default="build")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--read-mb", type=int, default=1024)
    ap.add_argument("--out", default=None, help="JSON of every fraction (default: BUILD/guard.json)")
    ap.add_argument("--floors", default=os.path.join(HERE, "guard_floors.json"))
    ap.add_argument("--only", default=",".join(NAMES))
    ap.add_argument("--set-floors", action="store_true", help="write --floors from this run (0.6x each fraction)")
    a = ap.parse_args()
    a.medfast = os.path.abspath(os.path.join(a.build, "medfast"))
    a.out = a.out or os.path.join(a.build, "guard.json")
    only = [n for n in a.only.split(",") if n]
    unknown = [n for n in only if n not in NAMES]
    if unknown:
        sys.exit(f"guard: --only {','.join(unknown)}: unknown (known: {', '.join(NAMES)})")
    if not os.access(a.medfast, os.X_OK):
        sys.exit(f"guard: {a.medfast}: no medfast command there (build it first: --build)")
    floors = json.load(open(a.floors)) if os.path.exists(a.floors) and not a.set_floors else None
    if floors is None and not a.set_floors:
        sys.exit(f"guard: {a.floors}: no floors file (write one with --set-floors)")

    t_start = time.perf_counter()
    results, failures = {}, []
    with tempfile.TemporaryDirectory(prefix="medfast-guard-", dir=os.path.abspath(a.build)) as tmp:
        g = Guard(a, tmp)
        for name in only:
            t0 = time.perf_counter()
            r = g.measure(name)
            floor = floors["figures"].get(name, {}).get("floor") if floors else None
            if floor is not None and r["fraction"] < floor:
                print(f"guard: {name} {r['fraction']:.3f} under its floor {floor:.3f}: measured once more", flush=True)
                again = g.measure(name)
                again["first_fractions"] = r["fractions"]
                r = again
            r["seconds"] = round(time.perf_counter() - t0, 1)
            r["floor"] = floor
            results[name] = r
            mark = "" if floor is None else ("  ok" if r["fraction"] >= floor else "  UNDER THE FLOOR")
            print(f"guard: {name:10} {r['fraction']:.3f} of {r['limit']}"
                  + (f" (floor {floor:.3f})" if floor is not None else "") + f"{mark}  [{r['seconds']} s]", flush=True)
            if floor is not None and r["fraction"] < floor:
                set_on = floors["set"]
                failures.append(
                    f"{name}: {r['fraction']:.3f} of {r['limit']} is under its floor {floor:.3f} (set {set_on['date']} "
                    f"on {set_on['machine']} at {set_on['commit']}, when it was {floors['figures'][name]['today']:.3f}); "
                    f"fractions this run {', '.join(f'{x:.3f}' for x in r['fractions'])}")

    doc = {"date": datetime.date.today().isoformat(), "machine": machine(), "commit": commit(),
           "threads": a.threads, "seconds": round(time.perf_counter() - t_start, 1), "figures": results,
           "failures": failures}
    with open(a.out, "w") as f:
        json.dump(doc, f, indent=2)
    print(f"guard: {len(results)} figures in {doc['seconds']} s on {doc['machine']}; fractions in {a.out}")
    if a.set_floors:
        new = {"set": {"date": doc["date"], "machine": doc["machine"], "commit": doc["commit"], "threads": a.threads},
               "rule": f"floor = {FLOOR_OF_TODAY} x the fraction measured when set (about half: a hot path slowed 2x "
                       f"falls under it)",
               "figures": {n: {"today": round(r["fraction"], 4), "floor": round(FLOOR_OF_TODAY * r["fraction"], 4),
                               "limit": r["limit"]} for n, r in results.items()}}
        with open(a.floors, "w") as f:
            json.dump(new, f, indent=2)
            f.write("\n")
        print(f"guard: floors written to {a.floors}")
    if failures:
        print("guard: FAILED\n  " + "\n  ".join(failures), file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
