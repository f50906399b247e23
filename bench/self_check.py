#!/usr/bin/env python3
"""What the start-up backend self-check costs a training run (issue 27; target: under 50 ms
on the CPU).

Usage: /usr/bin/python3 bench/self_check.py [--build build] [--rounds 5] [--threads 2]

Per round, a fresh `medfast train` process runs the built-in default config for 2 epochs
(no target Dice) in a scratch folder: its machine.json holds the self-check's report for the
run's device and dtype (timed inside the process, libtorch's first-op warm-up included), and
its metrics.jsonl the epochs' seconds. Verified first: every op of every check passed and
nothing was switched off (on a machine whose oneDNN is faulty the report says so, and the
figure is the cost of the check that found it). Then, per round, `medfast info --backends
--json` for the cost of the CPU's float32 and bfloat16 checks on their own. Printed: the
median over rounds of the check's milliseconds, and of its ratio to the run's median epoch,
measured in the same process.
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


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    medfast = os.path.abspath(os.path.join(a.build, "medfast"))
    in_run, ratio, alone = [], [], {"float32": [], "bfloat16": []}
    with tempfile.TemporaryDirectory(prefix="medfast-self-check-bench-") as tmp:
        for r in range(a.rounds):
            run_dir = os.path.join(tmp, f"run{r}")
            subprocess.run([medfast, "--threads", str(a.threads), "train", "--set", "train.epochs=2",
                            "--set", "train.target_dice=0", "--set", f"train.run_dir={run_dir}"],
                           cwd=tmp, check=True, capture_output=True, text=True)
            with open(os.path.join(run_dir, "machine.json")) as f:
                check = json.load(f)["self_check"]
            assert check["ran"] and check["passed"], check
            assert all(op["passed"] for op in check["ops"]), check
            with open(os.path.join(run_dir, "metrics.jsonl")) as f:
                epochs = [json.loads(line)["seconds"] for line in f if line.strip()]
            in_run.append(check["seconds"])
            ratio.append(check["seconds"] / statistics.median(epochs))
            out = subprocess.run([medfast, "--threads", str(a.threads), "info", "--backends", "--json"],
                                 check=True, capture_output=True, text=True).stdout
            for c in json.loads(out)["checks"]:
                assert c["passed"], c
                if c["device"] == "cpu":
                    alone[c["dtype"]].append(c["seconds"])
    print(f"machine: {machine()}")
    print(f"{a.rounds} rounds, {a.threads} threads; verified: every op of every check passed, "
          f"switched off: {check['switched_off'] or 'nothing'}\n")
    print(f"{'':44} {'median ms':>10} {'min':>7} {'max':>7}")
    rows = [("self-check in `medfast train` (cpu float32)", in_run),
            ("info --backends: cpu float32 (first check)", alone["float32"]),
            ("info --backends: cpu bfloat16 (second)", alone["bfloat16"])]
    for name, v in rows:
        print(f"{name:44} {statistics.median(v) * 1e3:10.1f} {min(v) * 1e3:7.1f} {max(v) * 1e3:7.1f}")
    print(f"\nthe check against the same run's median epoch: {statistics.median(ratio) * 100:.1f}% "
          f"(min {min(ratio) * 100:.1f}%, max {max(ratio) * 100:.1f}%)")


if __name__ == "__main__":
    main()
