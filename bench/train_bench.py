#!/usr/bin/env python3
"""Training throughput and the per-stage split (issue 6).

Usage: /usr/bin/python3 bench/train_bench.py [--build build] [--cases 6] [--size 256,256,48-64]
                                            [--steps-epochs 2] [--threads 2] [--loader-threads 1]
                                            [--device cpu] [--amp false] [--crop 96]

Writes spleen-like volumes (medfast data synth), then trains MONAI's spleen UNet
(channels 16..256, strides 2, num_res_units 2, batch norm) on 96^3 crops (batch 2,
one crop per item, DiceCE, SGD) with `medfast train --json` twice on the same data
and seed:
  1. medfast's cached pipeline: the deterministic chain runs once per item into a
     memory cache, the random chain runs on loader threads ahead of the network;
  2. the baseline, "regular PyTorch" style: the same run with cache_rate 0, so every
     step loads the NIfTI files and runs the deterministic chain in the loop
     (what a plain Dataset without caching does).
Verification first: both runs must produce the same number of steps and bit-identical
per-epoch training losses (same seed, same data: caching must not change the result).
Then it reports steps/s of each, the ratio, and each stage's share of the step time
(data wait, host-to-device copy, forward, backward, optimizer). The target is a data
wait under 5% of the step time with the cache.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cache_fill import machine  # noqa: E402


def config(dataset, run_dir, a, cache_rate):
    crop = [a.crop] * 3
    return {
        "data": {
            "dataset": dataset,
            "deterministic": [
                {"name": "LoadImage", "keys": ["image", "label"], "dtype": ["float32", ""]},
                {"name": "EnsureChannelFirst", "keys": ["image", "label"]},
                {"name": "Orientation", "keys": ["image", "label"], "axcodes": "RAS"},
                {"name": "Spacing", "keys": ["image", "label"], "pixdim": [1.5, 1.5, 2.0],
                 "mode": ["bilinear", "nearest"]},
                {"name": "ScaleIntensityRange", "keys": "image", "a_min": -57, "a_max": 164, "b_min": 0.0,
                 "b_max": 1.0, "clip": True},
                {"name": "CropForeground", "keys": ["image", "label"], "source_key": "image"},
                {"name": "FgBgToIndices", "keys": "label", "image_key": "image"},
            ],
            "random": [
                {"name": "RandCropByPosNegLabel", "keys": ["image", "label"], "label_key": "label",
                 "spatial_size": crop, "pos": 1, "neg": 1, "num_samples": 1, "allow_smaller": True,
                 "fg_indices_key": "label_fg", "bg_indices_key": "label_bg"},
                {"name": "ResizeWithPadOrCrop", "keys": ["image", "label"], "spatial_size": crop},
                {"name": "RandFlip", "keys": ["image", "label"], "spatial_axis": [0], "prob": 0.5},
                {"name": "RandRotate90", "keys": ["image", "label"], "prob": 0.5, "max_k": 3},
                {"name": "RandShiftIntensity", "keys": "image", "offsets": 0.1, "prob": 0.5},
            ],
            "cache": {"kind": "memory", "cache_rate": cache_rate},
            "seed": 0,
            "loader": {"batch_size": 2, "threads": a.loader_threads, "shuffle": True, "prefetch": 4},
        },
        "model": {"name": "UNet", "in_channels": 1, "out_channels": 2, "channels": [16, 32, 64, 128, 256],
                  "strides": [2, 2, 2, 2], "num_res_units": 2, "norm": "batch"},
        "loss": {"name": "DiceCE", "to_onehot_y": True, "softmax": True},
        "optimizer": {"name": "SGD", "lr": 0.1, "momentum": 0.9},
        "train": {"run_dir": run_dir, "epochs": a.epochs, "seed": 0, "device": a.device, "amp": a.amp,
                  "threads": a.threads},
    }


def run(binary, cfg_path, threads):
    out = subprocess.run([binary, "--threads", str(threads), "train", "--config", cfg_path, "--json"],
                         check=True, capture_output=True, text=True).stdout
    return json.loads(out)


def shares(result):
    keys = ["data_wait", "copy", "forward", "backward", "optimizer"]
    tot = {k: sum(e["times"][k] for e in result["history"]) for k in keys}
    steps = sum(e["steps"] for e in result["history"])
    step_time = sum(tot.values())
    return steps, step_time, {k: tot[k] / step_time for k in keys}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("--cases", type=int, default=6)
    ap.add_argument("--size", default="256,256,48-64")
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2, help="libtorch threads of the network")
    ap.add_argument("--loader-threads", type=int, default=1)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--amp", default=False)
    ap.add_argument("--crop", type=int, default=96)
    a = ap.parse_args()
    binary = os.path.abspath(os.path.join(a.build, "medfast"))
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([binary, "data", "synth", "--out", f"{tmp}/data", "--cases", str(a.cases), "--size", a.size,
                        "--seed", "0"], check=True, capture_output=True)
        results = {}
        for name, rate in (("medfast_cached", 1.0), ("uncached_baseline", 0.0)):
            cfg_path = f"{tmp}/{name}.json"
            with open(cfg_path, "w") as f:
                json.dump(config(f"{tmp}/data/dataset.json", f"{tmp}/run_{name}", a, rate), f)
            results[name] = run(binary, cfg_path, max(a.threads, a.loader_threads))

        # Verify: the same steps and bit-identical losses with and without the cache.
        c, u = results["medfast_cached"], results["uncached_baseline"]
        lc = [e["loss"] for e in c["history"]]
        lu = [e["loss"] for e in u["history"]]
        if lc != lu or any(x != x for x in lc):
            sys.exit(f"verification failed: per-epoch losses differ with and without the cache: {lc} vs {lu}")
        sc, tc, share_c = shares(c)
        su, tu, share_u = shares(u)
        if sc != su or sc == 0:
            sys.exit(f"verification failed: {sc} vs {su} steps")
        report = {
            "machine": machine(),
            "settings": {"cases": a.cases, "size": a.size, "epochs": a.epochs, "crop": a.crop, "batch": 2,
                         "network_threads": a.threads, "loader_threads": a.loader_threads, "device": a.device,
                         "amp": a.amp, "model": "UNet(16..256, num_res_units 2, batch norm)"},
            "verified": f"{sc} steps, identical per-epoch losses {lc}",
            "cached": {"steps_per_second": sc / tc, "stage_share": share_c},
            "uncached_baseline": {"steps_per_second": su / tu, "stage_share": share_u},
            "ratio_steps_per_second": (sc / tc) / (su / tu),
            "data_wait_share_cached": share_c["data_wait"],
            "data_wait_target_met": share_c["data_wait"] < 0.05,
        }
        print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
