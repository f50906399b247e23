#!/usr/bin/env python3
"""The brain-tumour recipe (examples/brats.yaml, MONAI's brats_training_ddp.py) beside its MONAI twin (issue 54).

Usage: /usr/bin/python3 bench/brats_run.py [--build build] [--cases 12] [--size 64,64,48]
           [--epochs 10] [--seeds 0] [--threads 2] [--monai ../shared/peers/monai-1.3.2] [--keep DIR]
           [--device cpu|cuda] [--reader auto|nibabel|numpy] [--set key=value ...]

In a scratch folder:
  1. data: `medfast data synth --kind brats` writes an MSD Task01-shaped set (4-channel MR,
     labels 1 edema, 2 non-enhancing, 3 enhancing tumour) of --cases cases of --size voxels;
  2. per seed S: `medfast train --config examples/brats.yaml` with the CPU overrides below
     (the file's own CPU command, longer: --epochs, validation every epoch) and seed S, then
     bench/monai_twin.py on the config.json that run wrote: the same data, the same chains
     (LabelToRegions as the tutorial's ConvertToMultiChannelBasedOnBratsClassesd; MONAI's
     RandSpatialCropd, RandFlipd, RandScaleIntensityd, RandShiftIntensityd), SegResNet with
     the same arguments, DiceLoss(sigmoid, squared_pred, smooth_nr 0, smooth_dr 1e-5), Adam
     with the cosine schedule, sliding-window validation with a sigmoid and a 0.5 threshold,
     DiceMetric(include_background=True, mean_batch) per region; seed S; the same threads.
Checks before any figure: every run's losses finite and its steps and samples per epoch the
same on both sides (the twin verifies its own; this script compares), and medfast's run names
its regions TC, WT and ET. Then per seed and side: each region's Dice at the last epoch and
their mean, the best mean, and the wall time of the whole process; over seeds the medians,
each region's Dice difference medfast - MONAI (goal: within 0.03) and medfast's wall time
as a fraction of MONAI's (goal <= 0.5x).
Without the MONAI peer, medfast runs alone (with a message) and no ratio is printed.
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import monai_peer  # noqa: E402
from cache_fill import machine  # noqa: E402
from default_run import timed_run as timed  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
REGIONS = ["TC", "WT", "ET"]
DICE_GOAL, WALL_GOAL = 0.03, 0.5


def cpu_overrides(a):
    """examples/brats.yaml's settings at this benchmark's size (validation every epoch): the
    file's CPU settings, or with --device cuda its GPU ones (AMP, the cache in GPU memory, the
    recipe's batch of 2 and 16 initial filters) as the GPU campaign runs it."""
    size = [int(x) for x in a.size.split(",")]
    crop = [max(16, (s * 3 // 4) // 16 * 16) for s in size]  # the recipe's crop is ~0.9 of the volume; 3/4 here
    common = ["data.validation.num=2", f"data.random.0.roi_size={json.dumps(crop)}",
              f"validation.sliding_window.roi_size={json.dumps(size)}", "validation.interval=1", "optimizer.lr=0.001",
              f"train.epochs={a.epochs}"]
    if a.device == "cuda":
        return common + ["data.cache.kind=device", "model.init_filters=16", "data.loader.batch_size=2",
                         "train.device=cuda", "train.amp=true"] + a.set
    return common + ["data.cache.kind=memory", "model.init_filters=8", "data.loader.batch_size=1", "train.device=cpu",
                     "train.amp=false"] + a.set


def last_regions(history):
    """Per-region Dice at the last validated epoch, and that epoch's mean."""
    validated = [e for e in history if e.get("dice") is not None]
    if not validated:
        sys.exit("verification failed: no validated epoch")
    e = validated[-1]
    return e["dice_per_class"], e["dice"]


def run_seed(a, monai, work, dataset, seed):
    run_dir = os.path.join(work, f"runs/medfast-{seed}")
    cmd = [a.medfast, "--threads", str(a.threads), "train", "--json", "--config", os.path.join(REPO, "examples/brats.yaml"),
           "--set", f"data.dataset={dataset}", "--set", f"train.run_dir={run_dir}",
           "--set", f"train.seed={seed}", "--set", f"data.seed={seed}"]
    for s in cpu_overrides(a):
        cmd += ["--set", s]
    result, wall = timed(cmd, work)
    if result.get("class_names") != REGIONS:
        sys.exit(f"verification failed: medfast names its regions {result.get('class_names')}, expected {REGIONS}")
    per, mean = last_regions(result["history"])
    rows = [{"side": "medfast", "seed": seed, "regions": per, "mean": mean, "best": result["best_dice"], "wall": wall,
             "epochs": len(result["history"]), "steps": [e["steps"] for e in result["history"]],
             "samples": [e["samples"] for e in result["history"]],
             "epoch_seconds": statistics.median(e["seconds"] for e in result["history"])}]
    if monai:
        twin, wall = timed([sys.executable, os.path.join(HERE, "monai_twin.py"), "--config",
                            os.path.join(run_dir, "config.json"), "--base", os.path.join(REPO, "examples"),
                            "--seed", str(seed), "--threads", str(a.threads), "--monai", a.monai,
                            "--reader", a.reader], work)
        per, mean = last_regions(twin["history"])
        rows.append({"side": "MONAI", "seed": seed, "regions": per, "mean": mean, "best": twin["best_dice"],
                     "wall": wall, "epochs": len(twin["history"]), "steps": [e["steps"] for e in twin["history"]],
                     "samples": [e["samples"] for e in twin["history"]],
                     "epoch_seconds": statistics.median(e["seconds"] for e in twin["history"])})
        m, o = rows
        if (m["steps"], m["samples"]) != (o["steps"], o["samples"]):
            sys.exit(f"verification failed: seed {seed}: steps/samples per epoch medfast {m['steps']} {m['samples']}, "
                     f"MONAI {o['steps']} {o['samples']}")
    for r in rows:
        regions = " ".join(f"{n} {d:.4f}" for n, d in zip(REGIONS, r["regions"]))
        print(f"  seed {seed} {r['side']:7}: {r['epochs']} epochs, {r['epoch_seconds']:.2f} s/epoch, {regions}, "
              f"mean {r['mean']:.4f} (best {r['best']:.4f}), process {r['wall']:.1f} s", flush=True)
    return rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("--cases", type=int, default=12)
    ap.add_argument("--size", default="64,64,48")
    ap.add_argument("--epochs", type=int, default=10)
    ap.add_argument("--seeds", default="0")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                    help="the recipe's CPU settings, or its GPU ones (the GPU campaign)")
    ap.add_argument("--reader", default="auto", help="the twin's NIfTI reader (monai_twin.py --reader)")
    ap.add_argument("--set", action="append", default=[], help="another train --set for both sides")
    ap.add_argument("--keep", default=None, help="work in this folder and keep it (default: a temporary one)")
    monai_peer.add_argument(ap)
    a = ap.parse_args()
    a.medfast = os.path.abspath(os.path.join(a.build, "medfast"))
    monai = monai_peer.load(a.monai)
    work = a.keep or tempfile.mkdtemp(prefix="medfast-brats-run-", dir=os.path.abspath(a.build))
    os.makedirs(work, exist_ok=True)
    try:
        data = os.path.join(work, "data/brats-synth")
        if not os.path.exists(os.path.join(data, "dataset.json")):
            subprocess.run([a.medfast, "--threads", str(a.threads), "data", "synth", "--kind", "brats", "--out", data,
                            "--cases", str(a.cases), "--size", a.size], check=True, capture_output=True)
        dataset = os.path.join(data, "dataset.json")
        rows = []
        for seed in [int(s) for s in a.seeds.split(",")]:
            rows += run_seed(a, monai, work, dataset, seed)
        print(f"\nmachine: {machine()}" + (f"; {monai_peer.version(monai)}" if monai else ""))
        print(f"run: examples/brats.yaml on {a.cases} synthetic Task01-shaped cases of {a.size} voxels (2 validation), "
              f"{a.epochs} epochs, --set {' '.join(cpu_overrides(a))}; {a.threads} threads each side")
        sides = ["medfast"] + (["MONAI"] if monai else [])
        med = {}
        for s in sides:
            mine = [r for r in rows if r["side"] == s]
            med[s] = {"regions": [statistics.median(r["regions"][k] for r in mine) for k in range(3)],
                      "mean": statistics.median(r["mean"] for r in mine),
                      "wall": statistics.median(r["wall"] for r in mine),
                      "epoch": statistics.median(r["epoch_seconds"] for r in mine)}
            print(f"median {s}: " + " ".join(f"{n} {d:.4f}" for n, d in zip(REGIONS, med[s]["regions"])) +
                  f", mean {med[s]['mean']:.4f}; {med[s]['epoch']:.2f} s per epoch; process {med[s]['wall']:.1f} s")
        if not monai:
            print("ratios: MONAI not measured (peer not found)")
            return 0
        diffs = [m - o for m, o in zip(med["medfast"]["regions"], med["MONAI"]["regions"])]
        within = all(abs(d) <= DICE_GOAL for d in diffs)
        print("Dice medfast - MONAI per region: " + " ".join(f"{n} {d:+.4f}" for n, d in zip(REGIONS, diffs)) +
              f" (goal: each within {DICE_GOAL}: {'met' if within else 'NOT met'})")
        ratio = med["medfast"]["wall"] / med["MONAI"]["wall"]
        print(f"wall time medfast/MONAI {ratio:.2f}x (goal <= {WALL_GOAL}x: {'met' if ratio <= WALL_GOAL else 'NOT met'}); "
              f"epoch time {med['medfast']['epoch'] / med['MONAI']['epoch']:.2f}x")
        return 0
    finally:
        if not a.keep:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
