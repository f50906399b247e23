#!/usr/bin/env python3
"""medfast's built-in default run against its MONAI twin: epoch time and wall time to the target Dice (issue 11).

Usage: /usr/bin/python3 bench/default_run.py [--build build] [--seeds 0,1,2,3,4] [--threads 2]
           [--epochs N] [--target DICE] [--monai ../shared/peers/monai-1.3.2] [--keep DIR]

The default run is `medfast train` with no config (src/train/run_config.cpp): a synthetic
spleen-like set it writes to data/synth-small, the spleen recipe's chains at a smaller
scale, a small UNet, DiceCE, Adam, sliding-window validation every epoch, stopping at its
target Dice. Here, in a scratch folder:
  1. prepare: one epoch of the default run (`medfast train --set train.epochs=1`) writes the
     dataset, so no timed run includes the synthesis, and a checkpoint with its Dice;
  2. verify (with MONAI): that checkpoint's weights loaded into MONAI's UNet (strictly: same
     module names and shapes) and scored by the twin's validation (MONAI's chain,
     sliding_window_inference, DiceMetric) must give medfast's Dice for that epoch;
  3. per seed S, in turn: `medfast --threads T train --set train.seed=S --set data.seed=S`
     (its own run_dir), then bench/monai_twin.py on the config.json that run wrote (the same
     data, chains, UNet, loss, optimizer, lr, batch size, validation and target; seed S;
     torch.set_num_threads(T)). Every run must take the same steps and samples per epoch.
Per run: the mean epoch time (training + validation, each side's own clock) and the wall
time of the whole process (start to exit; both stop at the epoch whose validation Dice
reaches the target, which is read from medfast's run: config.json's train.target_dice,
metrics.jsonl). Then medians over seeds and the ratios medfast/MONAI (targets: epoch
<= 0.7x, wall to Dice <= 0.75x). --epochs and --target override the default's epoch cap
and target on both sides (for short checks).
Without the MONAI peer, steps 2 and the twin runs are skipped (with a message).
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

HERE = os.path.dirname(os.path.abspath(__file__))
# |Dice(MONAI's validation of medfast's weights) - medfast's Dice|: the two sides' preprocessing
# agrees to ~1e-7 and the windows and blending are the same, so only argmax ties at
# near-equal logits can flip a voxel; a few such voxels move a Dice by ~1e-4.
DICE_TOL = 1e-3


def timed_run(cmd, cwd):
    t0 = time.perf_counter()
    p = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if p.returncode != 0:
        sys.exit(f"failed ({p.returncode}): {' '.join(cmd)}\n{p.stderr[-4000:]}")
    return json.loads(p.stdout), wall


def medfast_train(a, work, run_dir, sets):
    cmd = [a.medfast, "--threads", str(a.threads), "train", "--json", "--set", f"train.run_dir={run_dir}"]
    for s in a.overrides + sets:  # the run's own settings last
        cmd += ["--set", s]
    result, wall = timed_run(cmd, work)
    run_dir = os.path.join(work, run_dir)
    metrics = [json.loads(line) for line in open(os.path.join(run_dir, "metrics.jsonl"))]
    return result, wall, metrics, os.path.join(run_dir, "config.json")


def verify(monai, a, work, prepared):
    """MONAI's validation of medfast's epoch-1 weights must give medfast's epoch-1 Dice."""
    import monai_twin
    config = json.load(open(prepared["config"]))
    ckpt = os.path.join(os.path.dirname(prepared["config"]), "best.ckpt")
    meta, dice, parameters = monai_twin.score_checkpoint(monai, config, work, ckpt, a.threads)
    want = prepared["metrics"][-1]["dice"]
    if abs(dice - want) > DICE_TOL:
        sys.exit(f"verification failed: MONAI scores medfast's epoch-{meta['epoch']} weights at Dice {dice:.6f}, "
                 f"medfast reported {want:.6f}")
    return {"dice": dice, "want": want, "parameters": parameters}


def validation_seconds(side, e):
    """An epoch's validation seconds on its side's own clock: medfast's epoch record times it
    (times.validation), the twin around its sliding-window validation (validation_seconds)."""
    return e.get("times", {}).get("validation") if side == "medfast" else e.get("validation_seconds")


def row(side, seed, history, wall, target, in_process):
    """One run's line: epochs, mean epoch seconds, the epoch reaching the target, its Dice, the times,
    and the median over epochs of the validation seconds and of their share of the epoch."""
    reached = next((e["epoch"] for e in history if e.get("dice") is not None and e["dice"] >= target), None)
    validated = [e for e in history if validation_seconds(side, e)]
    return {"side": side, "seed": seed, "epochs": len(history),
            "mean_epoch": statistics.mean(e["seconds"] for e in history), "reached": reached,
            "validation": statistics.median(validation_seconds(side, e) for e in validated) if validated else None,
            "validation_share": statistics.median(validation_seconds(side, e) / e["seconds"] for e in validated)
            if validated else None,
            "dice": history[-1].get("dice"), "wall": wall if reached else None, "run_wall": wall,
            "in_process": in_process if reached else None,
            "steps": [e["steps"] for e in history], "samples": [e["samples"] for e in history]}


def run_seed(monai, a, work, seed):
    """medfast, then the MONAI twin, for one seed; their rows (checked: the same steps and samples)."""
    result, wall, metrics, config = medfast_train(a, work, f"runs/medfast-{seed}",
                                                  [f"train.seed={seed}", f"data.seed={seed}"])
    train = json.load(open(config))["train"]
    target = train.get("target_dice", 0)  # the target is medfast's, as its run recorded it
    a.cap = train.get("epochs")
    rows = [row("medfast", seed, metrics, wall, target, result.get("time_to_target"))]
    if monai:
        twin_dir = os.path.join(work, f"runs/monai-{seed}")
        twin, wall = timed_run([sys.executable, os.path.join(HERE, "monai_twin.py"), "--config", config,
                                "--base", work, "--seed", str(seed), "--threads", str(a.threads),
                                "--run-dir", twin_dir, "--monai", a.monai], work)
        rows.append(row("MONAI", seed, twin["history"], wall, target, twin["time_to_target"]))
        m, o = rows
        n = min(m["epochs"], o["epochs"])
        if m["steps"][:n] != o["steps"][:n] or m["samples"][:n] != o["samples"][:n]:
            sys.exit(f"verification failed: seed {seed}: medfast steps/samples per epoch {m['steps']} {m['samples']}, "
                     f"MONAI {o['steps']} {o['samples']}")
    for r in rows:
        print(f"  seed {seed} {r['side']:7}: {r['epochs']} epochs, {r['mean_epoch']:.2f} s/epoch, Dice {r['dice']}, "
              f"{'reached at epoch ' + str(r['reached']) if r['reached'] else 'target not reached'}, "
              f"process {r['run_wall']:.1f} s", flush=True)
    return target, rows


def median_of(rows, side, key):
    values = [r[key] for r in rows if r["side"] == side and r[key] is not None]
    return (statistics.median(values), len(values)) if values else (None, 0)


def fmt(x, spec=".2f"):
    return "-" if x is None else format(x, spec)


def report(rows, a, target, prepared, check, monai):
    print(f"\nmachine: {machine()}" + (f"; {monai_peer.version(monai)}" if monai else ""))
    p = prepared["metrics"][-1]
    print(f"run: medfast's built-in default (config: {prepared['config_text']}); target Dice {target} "
          f"(train.target_dice), at most {a.cap} epochs; {p['steps']} steps and {p['samples']} samples "
          f"per epoch; {a.threads} threads each side (medfast --threads, torch.set_num_threads)")
    if check:
        print(f"verified: MONAI's validation of medfast's epoch-1 weights gives Dice {check['dice']:.6f}, medfast "
              f"reported {check['want']:.6f} (tol {DICE_TOL}); the same UNet ({check['parameters']} parameters, "
              f"state_dict loaded strictly); every run took the same steps and samples per epoch on both sides")
    print(f"\n{'seed':>4} {'side':8} {'epochs':>6} {'s/epoch':>8} {'Dice at end':>11} {'target at':>9} "
          f"{'wall to Dice s':>14} {'(in-process)':>12} {'validation s':>12} {'share':>6}")
    for r in rows:
        print(f"{r['seed']:>4} {r['side']:8} {r['epochs']:>6} {r['mean_epoch']:8.2f} {fmt(r['dice'], '.4f'):>11} "
              f"{fmt(r['reached'], 'd'):>9} {fmt(r['wall'], '.1f'):>14} {fmt(r['in_process'], '.1f'):>12} "
              f"{fmt(r['validation'], '.3f'):>12} {fmt(r['validation_share'], '.2f'):>6}")
    sides = ["medfast"] + (["MONAI"] if monai else [])
    med = {s: {k: median_of(rows, s, k) for k in ("mean_epoch", "wall", "validation", "validation_share")}
           for s in sides}
    n_runs = len(rows) // len(sides)
    for s in sides:
        print(f"\nmedian {s}: {fmt(med[s]['mean_epoch'][0])} s per epoch; "
              f"wall to Dice {fmt(med[s]['wall'][0], '.1f')} s "
              f"({med[s]['wall'][1]} of {n_runs} runs reached the target); validation "
              f"{fmt(med[s]['validation'][0], '.3f')} s per epoch, {fmt(med[s]['validation_share'][0])} of it",
              end="")
    print()
    if not monai:
        print("ratios: MONAI not measured (peer not found)")
        return
    for key, name, goal in (("mean_epoch", "epoch time", 0.7), ("wall", "wall time to Dice", 0.75),
                            ("validation", "validation time per epoch", None)):
        m, o = med["medfast"][key][0], med["MONAI"][key][0]
        if m is None or o is None:
            print(f"{name}: n/a (a side never reached the target)")
            continue
        verdict = "" if goal is None else f" (target <= {goal}x: {'met' if m / o <= goal else 'NOT met'})"
        print(f"{name}: medfast/MONAI {m / o:.2f}x{verdict}")


def prepare(a, work):
    """One epoch of the default run: the dataset is written, and a checkpoint to verify against."""
    result, wall, metrics, config = medfast_train(a, work, "runs/prepare", ["train.epochs=1"])
    return {"config": config, "metrics": metrics,
            "config_text": "built in" + "".join(f", --set {o}" for o in a.overrides)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("--seeds", default="0,1,2,3,4")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--epochs", type=int, default=None, help="override train.epochs (default: medfast's)")
    ap.add_argument("--target", type=float, default=None, help="override train.target_dice (default: medfast's)")
    ap.add_argument("--keep", default=None, help="work in this folder and keep it (default: a temporary one)")
    monai_peer.add_argument(ap)
    a = ap.parse_args()
    a.medfast = os.path.abspath(os.path.join(a.build, "medfast"))
    a.overrides = ([f"train.epochs={a.epochs}"] if a.epochs else []) + \
                  ([f"train.target_dice={a.target}"] if a.target is not None else [])
    monai = monai_peer.load(a.monai)
    work = a.keep or tempfile.mkdtemp(prefix="medfast-default-run-", dir=os.path.abspath(a.build))
    os.makedirs(work, exist_ok=True)
    try:
        prepared = prepare(a, work)
        check = verify(monai, a, work, prepared) if monai else None
        rows = []
        for seed in [int(s) for s in a.seeds.split(",")]:
            target, seed_rows = run_seed(monai, a, work, seed)
            rows += seed_rows
        report(rows, a, target, prepared, check, monai)
    finally:
        if not a.keep:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
