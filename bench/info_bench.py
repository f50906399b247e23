#!/usr/bin/env python3
"""`medfast info` as a whole process against nibabel (issue 11, item 2).

Usage: /usr/bin/python3 bench/info_bench.py [--build build] [--size 512,512,120] [--rounds 5]

Writes one CT-like int16 volume (`medfast data synth`, .nii.gz), then per round, in turn:
`medfast info FILE` (header only), `medfast info FILE --stats`, and a python3 process that
loads it with nibabel and takes its mean (np.asanyarray(img.dataobj).mean()). Wall time and
peak RSS (/usr/bin/time's %M) of each whole process, median over rounds. Verified first:
medfast's mean equals numpy's on the same file (relative 1e-9).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cache_fill import machine, synth  # noqa: E402

NIBABEL = ("import sys, nibabel as n, numpy as np; "
           "print(repr(float(np.asanyarray(n.load(sys.argv[1]).dataobj).mean())))")


def timed(cmd):
    t0 = time.perf_counter()
    r = subprocess.run(["/usr/bin/time", "-f", "%M"] + cmd, capture_output=True, text=True, check=True)
    return time.perf_counter() - t0, int(r.stderr.strip().splitlines()[-1]) * 1024, r.stdout


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("--size", default="512,512,120")
    ap.add_argument("--rounds", type=int, default=5)
    a = ap.parse_args()
    medfast = os.path.join(a.build, "medfast")
    with tempfile.TemporaryDirectory(prefix="medfast-info-bench-", dir=os.path.abspath(a.build)) as tmp:
        f = synth(medfast, tmp, 1, a.size)[0]["image"]
        head = json.loads(subprocess.run([medfast, "info", f, "--json"], capture_output=True, text=True,
                                         check=True).stdout)
        decoded = head["bytes_in_memory"]
        stats = json.loads(timed([medfast, "info", f, "--stats", "--json"])[2])["stats"]
        np_mean = float(timed(["/usr/bin/python3", "-c", NIBABEL, f])[2])
        assert abs(stats["mean"] - np_mean) <= 1e-9 * abs(np_mean), (stats["mean"], np_mean)
        rows = {"medfast info (header)": [], "medfast info --stats": [], "nibabel load + mean": []}
        for _ in range(a.rounds):
            rows["medfast info (header)"].append(timed([medfast, "info", f]))
            rows["medfast info --stats"].append(timed([medfast, "info", f, "--stats"]))
            rows["nibabel load + mean"].append(timed(["/usr/bin/python3", "-c", NIBABEL, f]))
        print(f"machine: {machine()}")
        print(f"file: {head['shape']} {head['disk_dtype']}, {os.path.getsize(f) / 1e6:.1f} MB .nii.gz, "
              f"{decoded / 1e6:.1f} MB decoded; {a.rounds} rounds")
        print(f"verified: medfast's mean {stats['mean']:.9g} equals numpy's {np_mean:.9g}\n")
        print(f"{'':26} {'seconds':>8} {'peak RSS MB':>12}")
        med = {}
        for k, v in rows.items():
            med[k] = (statistics.median(x[0] for x in v), statistics.median(x[1] for x in v))
            print(f"{k:26} {med[k][0]:8.3f} {med[k][1] / 1e6:12.1f}")
        h, s, nb = med["medfast info (header)"], med["medfast info --stats"], med["nibabel load + mean"]
        limit = 1.2 * decoded + 60e6
        print(f"\nheader only {h[0]:.3f} s (target < 0.1 s: {'met' if h[0] < 0.1 else 'NOT met'}); --stats "
              f"{s[0] / nb[0]:.2f}x nibabel's time (target <= 1x: {'met' if s[0] <= nb[0] else 'NOT met'}), peak RSS "
              f"{s[1] / 1e6:.0f} MB against 1.2 x decoded + 60 MB = {limit / 1e6:.0f} MB "
              f"({'met' if s[1] <= limit else 'NOT met'})")


if __name__ == "__main__":
    main()
