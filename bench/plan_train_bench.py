#!/usr/bin/env python3
"""`medfast train --dataset` (the plan) against the spleen recipe on three synthetic datasets (issue 23).

Usage: /usr/bin/python3 bench/plan_train_bench.py [--datasets ct_spleen_like,mr_anisotropic,ct_fine]
           [--seeds 0,1,2] [--epochs 40] [--plan-epochs N] [--give-up 1.5] [--threads 2] [--device cpu]
           [--medfast build/medfast] [--work DIR]

The datasets (`medfast data synth`, 16 cases each, sized so that the recipe's 96^3 crops fit
after its 1.5 x 1.5 x 2 mm resampling and its crop to the body):
  ct_spleen_like  CT, 192x192x64-80 voxels at 1.5 x 1.5 x 3 mm
  mr_anisotropic  MR-like (T1, 0 around the body, a scale per case), 272x272x40-48 at
                  0.85-1.0 x 0.85-1.0 x 4.5-5.5 mm (thick slices)
  ct_fine         CT, 224x224x160 at 1.2 mm isotropic
The baseline: examples/spleen.yaml with only its data paths (data.dataset, data.cache.dir,
train.run_dir), channel and label counts (model.in_channels, out_channels) changed, and the
machine's device (train.device, train.amp) where it has no GPU; its 9 validation cases are
the list's last 9. The plan: `medfast train --dataset DS` with data.validation.num=9 (the same validation and
training cases; the plan is made for them) and every other value the plan's, its validation
interval included (the fewest epochs that keep validation within a third of the run's time; the
recipe validates every epoch).

Per dataset and seed: the baseline trains --epochs epochs (seed S: train.seed, data.seed); its
best validation Dice D and the process time at the epoch that first reached it (metrics.jsonl's
process_seconds: from the command's start, so reading and caching count) are the bar. The
plan then trains with train.target_dice D and stops when it reaches it; its time is the process
time of that epoch. Both runs validate at their own spacing (the recipe at 1.5 x 1.5 x 2 mm, the
plan at its target or 3d_lowres spacing), so the plan counts as reaching the bar only where its
checkpoint at the bar also scores at least the baseline's best checkpoint on the images' own
grid (`medfast infer` maps predictions back; Dice over the same 9 cases). A baseline whose every validation scored 0 (it never segmented: the
recipe's CT window on MR) sets no Dice to reach: there the plan's time to its first Dice above 0
is compared with the baseline's whole run. It is planned for as many epochs as the baseline trains (--plan-epochs,
default --epochs: its polynomial decay runs over them, as `train --dataset --set
train.epochs=N` plans it), so both get the same number of passes over the data. Verified first, per run: every epoch's
loss is finite and the run wrote its checkpoint. Reported: per dataset the median over seeds of
plan time / baseline time and both Dice; met where the plan reaches D in every seed and the
median ratio is at most 1.
"""
import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)

DATASETS = {
    "ct_spleen_like": ["--size", "192,192,64-80", "--spacing", "1.5,1.5,3"],
    "mr_anisotropic": ["--size", "272,272,40-48", "--spacing", "0.85-1.0,0.85-1.0,4.5-5.5", "--modality", "MR"],
    "ct_fine": ["--size", "224,224,160", "--spacing", "1.2,1.2,1.2"],
}
CASES = 16


def run(cmd, cwd=None, timeout=None, nonfinite_ok=False):
    """The command's output; None when it ran past `timeout` seconds (then it was stopped).
    nonfinite_ok: a run that medfast stopped on a non-finite loss (the recipe's SGD at lr 0.1
    diverges on some synthetic sets) is not a failure: its epochs before the stop count."""
    try:
        p = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return None
    if p.returncode != 0:
        if nonfinite_ok and "training stopped at epoch" in p.stderr and "the loss is" in p.stderr:
            print("  " + next(l for l in p.stderr.splitlines() if "training stopped at epoch" in l)[:240], flush=True)
            return p.stdout
        sys.exit(f"failed ({p.returncode}): {' '.join(cmd)}\n{p.stderr[-4000:]}\n{p.stdout[-2000:]}")
    return p.stdout


def history(run_dir):
    rows = [json.loads(line) for line in open(os.path.join(run_dir, "metrics.jsonl")) if line.strip()]
    assert rows, f"{run_dir}: no epoch finished"
    for r in rows:  # every recorded epoch (a run stopped on a non-finite loss records none after)
        assert math.isfinite(r["loss"]), f"{run_dir}: epoch {r['epoch']} loss {r['loss']}"
    assert os.path.exists(os.path.join(run_dir, "last.ckpt")), f"{run_dir}: no checkpoint"
    return rows


def first_reaching(rows, dice):
    for r in rows:
        if r.get("dice") is not None and r["dice"] >= dice - 1e-12:
            return r
    return None


def grid_dice(medfast, threads, checkpoint, ds, out):
    """Mean Dice of `checkpoint` over the list's last 9 cases on their own image grid: `medfast
    infer` maps its predictions back to each input, so runs that validate at different
    spacings (the recipe's 1.5 x 1.5 x 2 mm, the plan's) are compared alike."""
    import nibabel  # Debian's python3-nibabel (/usr/bin/python3)
    import numpy as np
    items = json.load(open(os.path.join(ds, "dataset.json")))["training"][-9:]
    cmd = [medfast, "--threads", str(threads), "infer", "--checkpoint", checkpoint, "--output", out]
    for t in items:
        cmd += ["--input", os.path.join(ds, t["image"])]
    run(cmd)
    dice = []
    for t in items:
        name = os.path.basename(t["image"]).replace(".nii.gz", "")
        p = np.asarray(nibabel.load(os.path.join(out, name + "_seg.nii.gz")).dataobj) > 0
        g = np.asarray(nibabel.load(os.path.join(ds, t["label"])).dataobj) > 0
        dice.append(2.0 * (p & g).sum() / max(1, p.sum() + g.sum()))
    return float(np.mean(dice))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--datasets", default=",".join(DATASETS))
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--epochs", type=int, default=40, help="the baseline's epochs")
    ap.add_argument("--plan-epochs", type=int, default=0,
                    help="the plan's epochs (its schedule is planned for them; it stops at the bar) [default: --epochs]")
    ap.add_argument("--give-up", type=float, default=1.5,
                    help="stop the plan's run at this multiple of the baseline's time (it has missed the bar)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--medfast", default=os.path.join(REPO, "build", "medfast"))
    ap.add_argument("--work", default="")
    a = ap.parse_args()
    a.plan_epochs = a.plan_epochs or a.epochs
    work = os.path.abspath(a.work or tempfile.mkdtemp(prefix="medfast-plan-train-"))
    seeds = [int(s) for s in a.seeds.split(",")]
    amp = "true" if a.device.startswith("cuda") else "false"
    report = {"threads": a.threads, "device": a.device, "epochs": a.epochs, "seeds": seeds, "datasets": {}}
    for name in a.datasets.split(","):
        ds = os.path.join(work, "data", name)
        if not os.path.exists(os.path.join(ds, "dataset.json")):
            run([a.medfast, "--threads", str(a.threads), "data", "synth", "--out", ds, "--cases", str(CASES),
                 "--seed", "7"] + DATASETS[name])
        rows = []
        for seed in seeds:
            base_dir = os.path.join(work, "runs", f"{name}-baseline-{seed}")
            plan_dir = os.path.join(work, "runs", f"{name}-plan-{seed}")
            common = ["--set", f"train.seed={seed}", "--set", f"data.seed={seed}", "--set", f"train.device={a.device}",
                      "--set", f"train.amp={amp}"]
            run([a.medfast, "--threads", str(a.threads), "train", "--config", os.path.join(REPO, "examples", "spleen.yaml"),
                 "--json", "--overwrite", "--set", f"data.dataset={ds}/dataset.json",
                 "--set", f"data.cache.dir={work}/cache/{name}-baseline", "--set", f"train.run_dir={base_dir}",
                 "--set", "model.in_channels=1", "--set", "model.out_channels=2", "--set", f"train.epochs={a.epochs}",
                 "--set", "train.target_dice=0"] + common, nonfinite_ok=True)
            base = history(base_dir)
            best = max(r["dice"] for r in base if r.get("dice") is not None)
            bar = first_reaching(base, best)
            # A baseline that never segmented anything (Dice 0 in every validation) sets no bar in
            # time: the plan meets it where it segments (Dice above 0) within the baseline's run.
            failed = best <= 0
            target = 1e-6 if failed else best  # the Dice the plan's run stops at
            # Stopped at --give-up times the baseline's time: past 1x it cannot meet the bar anyway.
            out = run([a.medfast, "--threads", str(a.threads), "train", "--dataset", ds, "--json", "--overwrite",
                       "--set", f"train.run_dir={plan_dir}", "--set", "data.validation.num=9",
                       "--set", f"train.epochs={a.plan_epochs}", "--set", f"train.target_dice={target}"] + common,
                      timeout=a.give_up * (base[-1] if failed else bar)["process_seconds"] + 60)
            if out is None:
                print(f"{name} seed {seed}: the plan's run stopped at {a.give_up}x the baseline's time", flush=True)
            stopped = out is None
            planned = history(plan_dir) if os.path.exists(os.path.join(plan_dir, "metrics.jsonl")) or not stopped else []
            reached = first_reaching(planned, target)
            plan_best = max([r["dice"] for r in planned if r.get("dice") is not None] or [0.0])
            row = {"seed": seed, "baseline_dice": best, "baseline_epoch": bar["epoch"],
                   "baseline_seconds": bar["process_seconds"], "baseline_failed": failed,
                   "baseline_run_seconds": base[-1]["process_seconds"], "plan_best_dice": plan_best,
                   "plan_reached": reached is not None,
                   "plan_epoch": reached["epoch"] if reached else None,
                   "plan_epochs_run": len(planned), "plan_stopped": stopped,
                   "plan_seconds": reached["process_seconds"] if reached else None}
            # Against a failed baseline: the plan's time to a Dice above 0 over the baseline's run.
            row["ratio"] = (row["plan_seconds"] / (row["baseline_run_seconds"] if failed else row["baseline_seconds"])
                            if reached else None)
            # The checkpoints compared on the images' own grid: the baseline's best, and the
            # plan's at the bar (its run stops there: best.ckpt).
            if reached and not failed:
                row["baseline_grid_dice"] = grid_dice(a.medfast, a.threads, os.path.join(base_dir, "best.ckpt"), ds,
                                                      os.path.join(work, "grid", f"{name}-baseline-{seed}"))
                row["plan_grid_dice"] = grid_dice(a.medfast, a.threads, os.path.join(plan_dir, "best.ckpt"), ds,
                                                  os.path.join(work, "grid", f"{name}-plan-{seed}"))
                row["plan_reached"] = row["plan_grid_dice"] >= row["baseline_grid_dice"]
                print(f"  on the images' grid: baseline {row['baseline_grid_dice']:.4f}, plan {row['plan_grid_dice']:.4f}",
                      flush=True)
            rows.append(row)
            print(f"{name} seed {seed}: baseline " + (f"never segmented (Dice 0 in all {len(base)} epochs, {base[-1]['process_seconds']:.0f} s)" if failed else
                  f"Dice {best:.4f} at epoch {bar['epoch']} ({bar['process_seconds']:.0f} s)") + "; "
                  f"plan {'reached it at epoch %d (%.0f s): %.3fx' % (reached['epoch'], reached['process_seconds'], row['ratio']) if reached else 'did not reach it (best %.4f)' % plan_best}",
                  flush=True)
        ratios = [r["ratio"] for r in rows if r["ratio"] is not None]
        summary = {"rows": rows, "all_reached": all(r["plan_reached"] for r in rows),
                   "median_ratio": statistics.median(ratios) if len(ratios) == len(rows) else None,
                   "median_baseline_dice": statistics.median(r["baseline_dice"] for r in rows),
                   "median_plan_best_dice": statistics.median(r["plan_best_dice"] for r in rows)}
        summary["met"] = summary["all_reached"] and summary["median_ratio"] is not None and summary["median_ratio"] <= 1
        report["datasets"][name] = summary
    print(json.dumps(report, indent=1))
    return 0 if all(d["met"] for d in report["datasets"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
