#!/usr/bin/env python3
"""What medfast's trace ranges cost while tracing is off (issue 12: within 2% of step time).

Usage: /usr/bin/python3 bench/trace_overhead.py [--build build] [--baseline-build build-notrace]
                                               [--rounds 5] [--epochs 6] [--threads 2]

The same training run (the built-in default: 12 synthetic cases, UNet, 5 steps per
epoch) with two binaries of the same source: `--build`'s medfast, whose ranges
(step, data_wait, forward, backward, each loader batch, cache read and random
transform, ...) are compiled in and off, and a baseline built with
-DMEDFAST_TRACE_RANGES=OFF, where every range compiles to nothing (configured and
built into --baseline-build by this script when it has no medfast yet). A third
row, for scale: the traced binary with profiling on for every step (--profile
0,0,STEPS,1: ranges and libtorch's operators recorded).

Verification first: every run gives bit-identical per-epoch losses (the ranges must
not change the result). Then per round, in alternating order, the mean step time
(data wait + copy + forward + backward + optimizer, over the epochs after the
first) of each; reported are the median step times and the median over the rounds
of each round's ratio to its baseline run (paired: the machine drifts between
rounds), which for the traced binary must be at most 1.02.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cache_fill import machine  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def ensure_baseline(build):
    binary = os.path.join(build, "medfast")
    if not os.path.exists(binary):
        print(f"building the baseline (MEDFAST_TRACE_RANGES=OFF) in {build} ...", flush=True)
        subprocess.run(["cmake", "-S", ROOT, "-B", build, "-G", "Ninja", "-DCMAKE_BUILD_TYPE=Release",
                        "-DMEDFAST_TRACE_RANGES=OFF", "-DMEDFAST_BUILD_TESTS=OFF", "-DMEDFAST_BUILD_PYTHON=OFF"],
                       check=True, stdout=subprocess.DEVNULL)
        subprocess.run(["cmake", "--build", build, "--target", "medfast_front"], check=True, stdout=subprocess.DEVNULL)
    return binary


def run(binary, work, name, a, profile=None):
    run_dir = os.path.join(work, name)
    cmd = [binary, "--progress", "off", "--threads", str(a.threads), "train", "--overwrite", "--json",
           "--set", f"train.epochs={a.epochs}", "--set", "train.target_dice=0", "--set", f"train.run_dir={run_dir}"]
    # The built-in default's data (data/synth-small, written on first use) lands in `work`.
    if profile:
        cmd += ["--profile", profile]
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=work)
    if r.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed:\n{r.stderr}")
    history = json.loads(r.stdout)["history"]
    losses = [e["loss"] for e in history]
    steps = sum(e["steps"] for e in history[1:])
    seconds = sum(sum(e["times"][k] for k in ["data_wait", "copy", "forward", "backward", "optimizer"])
                  for e in history[1:])
    return losses, seconds / steps * 1e3


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--build", default=os.path.join(ROOT, "build"))
    p.add_argument("--baseline-build", default=os.path.join(ROOT, "build-notrace"))
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--epochs", type=int, default=6)
    p.add_argument("--threads", type=int, default=2)
    a = p.parse_args()
    traced = os.path.join(a.build, "medfast")
    if not os.path.exists(traced):
        sys.exit(f"{traced} not found: build medfast first (README)")
    baseline = ensure_baseline(a.baseline_build)
    steps = 5 * a.epochs
    print(f"Machine: {machine()}; {a.threads} threads; {a.epochs} epochs of 5 steps, the first not timed\n")
    times = {"traced (off)": [], "baseline (no ranges)": [], "traced, profiling every step": []}
    with tempfile.TemporaryDirectory(prefix="medfast-trace-bench-") as work:
        reference = None
        for r in range(a.rounds):
            order = [("traced (off)", traced, None), ("baseline (no ranges)", baseline, None)]
            if r % 2:
                order.reverse()
            order.append(("traced, profiling every step", traced, f"0,0,{steps},1"))
            for name, binary, profile in order:
                losses, ms = run(binary, work, name.split()[0] + str(r), a, profile)
                if reference is None:
                    reference = losses
                if losses != reference:
                    sys.exit(f"{name}: losses {losses} differ from {reference}: the ranges changed the result")
                times[name].append(ms)
            print(f"round {r + 1}: " + ", ".join(f"{k} {v[-1]:.1f} ms" for k, v in times.items()), flush=True)
    # Paired: each round's ratio to that round's baseline (this VM drifts between rounds).
    base = times["baseline (no ranges)"]
    print("\n| binary | step ms (median) | over the baseline (median of the rounds' ratios) |\n|---|---|---|")
    for name, v in times.items():
        ratios = [x / b for x, b in zip(v, base)]
        print(f"| {name} | {statistics.median(v):.1f} | {statistics.median(ratios):.3f}x |")
    ratio = statistics.median([x / b for x, b in zip(times["traced (off)"], base)])
    print(f"\ntracing off costs {100 * (ratio - 1):+.2f}% of step time (target: at most +2%): "
          f"{'met' if ratio <= 1.02 else 'NOT met'}")
    return 0 if ratio <= 1.02 else 1


if __name__ == "__main__":
    sys.exit(main())
