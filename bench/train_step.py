#!/usr/bin/env python3
"""A CPU training step: medfast against the same network in python3-torch (issue 11, item 3).

Usage: /usr/bin/python3 bench/train_step.py [--build build] [--threads 2] [--steps 8] [--rounds 3]
           [--monai ../shared/peers/monai-1.3.2]

For the spleen recipe's UNet at 96^3 (batch 2) and the built-in default's UNet (batch 8 of
32x32x16), in one run, alternating sides each round:
  - medfast: `medfast --threads T bench step` (DiceCE with softmax and one-hot target, Adam),
    with contiguous tensors and with --channels-last (NDHWC);
  - python3-torch: MONAI's UNet and DiceCELoss (same arguments), torch.optim.Adam,
    torch.set_num_threads(T), contiguous and torch.channels_last_3d.
Each figure is the median over the rounds of each round's median step (forward + backward +
optimizer), and the eval forward under no_grad and inference_mode. Verified first: both
sides build a network with the same number of parameters and a finite loss.
Both run on the same libtorch and BLAS (the script prints which).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import monai_peer  # noqa: E402
from cache_fill import machine  # noqa: E402

CASES = [
    ("spleen UNet 96^3", {"name": "UNet", "in_channels": 1, "out_channels": 2, "channels": [16, 32, 64, 128, 256],
                          "strides": [2, 2, 2, 2], "num_res_units": 2, "norm": "batch"}, [2, 1, 96, 96, 96]),
    ("default UNet 32x32x16", {"name": "UNet", "in_channels": 1, "out_channels": 2, "channels": [8, 16, 32, 64],
                               "strides": [2, 2, 2], "num_res_units": 1, "norm": "instance"}, [8, 1, 32, 32, 16]),
]


def medfast_step(medfast, threads, model, shape, steps, channels_last):
    cmd = [medfast, "--threads", str(threads), "bench", "step", "--json", "--model", json.dumps(model),
           "--input", ",".join(map(str, shape)), "--steps", str(steps)]
    if channels_last:
        cmd.append("--channels-last")
    return json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)


def torch_step(monai, threads, model, shape, steps, channels_last, warmup=3):
    import torch
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    args = {k: v for k, v in model.items() if k != "name"}
    args["norm"] = args["norm"].upper()
    net = monai.networks.nets.UNet(spatial_dims=3, **args)
    fmt = torch.channels_last_3d if channels_last else torch.contiguous_format
    net = net.to(memory_format=fmt)
    x = torch.rand(shape).contiguous(memory_format=fmt)
    y = torch.randint(0, model["out_channels"], (shape[0], 1, *shape[2:])).float()
    loss_fn = monai.losses.DiceCELoss(to_onehot_y=True, softmax=True)
    opt = torch.optim.Adam(net.parameters(), 1e-4)
    fwd, bwd, stp = [], [], []
    net.train()
    for i in range(warmup + steps):
        t0 = time.perf_counter()
        opt.zero_grad()
        loss = loss_fn(net(x), y)
        t1 = time.perf_counter()
        loss.backward()
        t2 = time.perf_counter()
        opt.step()
        t3 = time.perf_counter()
        if i >= warmup:
            fwd.append(t1 - t0), bwd.append(t2 - t1), stp.append(t3 - t2)
    assert torch.isfinite(loss), "python3-torch: the loss is not finite"
    net.eval()
    ng, im = [], []
    for i in range(warmup + steps):
        t0 = time.perf_counter()
        with torch.no_grad():
            net(x)
        t1 = time.perf_counter()
        with torch.inference_mode():
            net(x)
        t2 = time.perf_counter()
        if i >= warmup:
            ng.append(t1 - t0), im.append(t2 - t1)
    med = statistics.median
    return {"train_step": med(fwd) + med(bwd) + med(stp), "forward": med(fwd), "backward": med(bwd),
            "eval_forward_no_grad": med(ng), "eval_forward_inference_mode": med(im),
            "parameters": sum(p.numel() for p in net.parameters())}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=3)
    monai_peer.add_argument(ap)
    a = ap.parse_args()
    monai = monai_peer.load(a.monai)
    medfast = os.path.join(a.build, "medfast")
    print(f"machine: {machine()}; {a.threads} threads each side; {a.rounds} rounds of {a.steps} steps")
    for name, model, shape in CASES:
        steps = max(3, a.steps // 2) if shape[2] >= 96 else a.steps
        rows = {}
        for r in range(a.rounds):
            for cl in (False, True):
                m = medfast_step(medfast, a.threads, model, shape, steps, cl)
                rows.setdefault(("medfast", cl), []).append(m)
                if monai:
                    t = torch_step(monai, a.threads, model, shape, steps, cl)
                    rows.setdefault(("python3-torch", cl), []).append(t)
                    if r == 0 and not cl:
                        print(f"{name}: BLAS {m['blas']}; verified: {t['parameters']} parameters on the MONAI side, "
                              f"finite losses on both")
        print(f"\n{name}, batch {shape}:  median of round medians, seconds")
        print(f"{'':34} {'train step':>10} {'forward':>8} {'backward':>8} {'eval no_grad':>12} {'eval inference':>14}")
        best = {}
        for (side, cl), rs in rows.items():
            f = {k: statistics.median(r[k] for r in rs) for k in
                 ("train_step", "forward", "backward", "eval_forward_no_grad", "eval_forward_inference_mode")}
            label = f"{side} {'channels-last' if cl else 'contiguous'}"
            print(f"{label:34} {f['train_step']:10.3f} {f['forward']:8.3f} {f['backward']:8.3f} "
                  f"{f['eval_forward_no_grad']:12.3f} {f['eval_forward_inference_mode']:14.3f}")
            best[side] = min(best.get(side, 1e9), f["train_step"])
        if monai:
            print(f"train step, the faster layout of each side: medfast {best['medfast']:.3f} s, python3-torch "
                  f"{best['python3-torch']:.3f} s: {best['medfast'] / best['python3-torch']:.2f}x")


if __name__ == "__main__":
    main()
