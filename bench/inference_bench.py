#!/usr/bin/env python3
"""Sliding-window inference, medfast beside MONAI 1.3.2, on the same network, weights and input (issue 26).

Usage: /usr/bin/python3 bench/inference_bench.py [--cells a,b] [--rounds 3] [--threads 2]
           [--medfast build/medfast] [--monai ../shared/peers/monai-1.3.2] [--work DIR] [--full]
           [--device cpu|cuda] [--amp fp32|fp16|bf16] [--channels-last]

Cells (each a synthetic CT-like float32 volume, written once as an uncompressed NIfTI):
  quick  128x128x64, roi 64^3, overlap 0.5, gaussian, sw_batch_size 2, 2 classes (a check, seconds)
  a      250x250x120 (a spleen CT after the recipe's spacing), roi 96^3, overlap 0.5, gaussian,
         sw_batch_size 4, 2 classes
  b      512x512x300 (a large CT at 1 mm), roi 96^3, overlap 0.25, gaussian, sw_batch_size 4,
         14 classes
  --full adds a160 (cell a with roi 160^3), a_const (constant blending) and a_sw1
  (sw_batch_size 1).

The network is the spleen recipe's UNet (channels 16-256, strides 2, 2 residual units, batch
norm; out_channels = the cell's classes), built by MONAI with torch.manual_seed(0), its batch
norms given random running statistics and affine weights (so that anything medfast does to
them shows), saved with torch.save and given to medfast as model.pretrained.

Each side runs in its own process, one after the other, alternating, for --rounds rounds:
  medfast  `medfast infer --config CFG --input IMAGE --output DIR --json` (the config: LoadImage +
           EnsureChannelFirst, the model, validation.sliding_window, settings.threads);
  MONAI    this file's --worker: the image read with nibabel, the same UNet with the same
           state_dict, eval(), torch.inference_mode(), monai.inferers.sliding_window_inference
           with the same arguments, argmax to uint8, written with nibabel; threads by
           torch.set_num_threads.
Both write a uint8 label volume on the input's grid. Before any figure is reported the labels
are compared (first round): they must be equal except at ties, voxels where MONAI's
probabilities of the two labels differ by less than 1e-4 (medfast folds batch norm into the
convolutions: the same function, rounded differently); the count and the largest gap are
printed and kept in the JSON, and anything more fails the run. The check runs in the MONAI
worker after its timers, on the logits it still holds (no new peak). Figures per side: the process's wall time (start to exit: reading,
inference, writing), the inference seconds each side reports for itself (MONAI: around
sliding_window_inference and argmax; medfast: the case's `infer_seconds` from --json), and the
process's peak RSS (wait4's ru_maxrss). Medians over rounds, then medfast / MONAI ratios.
Prints a table and one JSON line. Without the MONAI copy, says so and times medfast alone.

On a GPU (--device cuda; issue 44's validation figure): both sides infer on the GPU in the
--amp dtype (medfast: `infer --device cuda --amp`, channels-last by its auto; MONAI: autocast in
that dtype, and with --channels-last the model and every window channels_last_3d, the two
lines a PyTorch user would add), cudnn.benchmark on on both sides (medfast:
train.deterministic false). Each process infers the image twice and times the second pass (the
first autotunes cuDNN and starts CUDA, which a training run's validation pays once); MONAI's
timer stops after the labels are back on the host, as medfast's does. In reduced precision the
two sides round differently, so a tie is wider: MONAI's probabilities of the two labels closer
than eight units in the last place of the dtype the network computes in (fp16 and TF32: 2^-7,
bf16: 2^-4), the threshold kept in the JSON; in float32 on the CPU it stays 1e-4.
"""
import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, HERE)

CELLS = {
    "quick": dict(shape=(128, 128, 64), roi=64, overlap=0.5, mode="gaussian", sw=2, classes=2),
    "a": dict(shape=(250, 250, 120), roi=96, overlap=0.5, mode="gaussian", sw=4, classes=2),
    "b": dict(shape=(512, 512, 300), roi=96, overlap=0.25, mode="gaussian", sw=4, classes=14),
    "a160": dict(shape=(250, 250, 120), roi=160, overlap=0.5, mode="gaussian", sw=4, classes=2),
    "a_const": dict(shape=(250, 250, 120), roi=96, overlap=0.5, mode="constant", sw=4, classes=2),
    "a_sw1": dict(shape=(250, 250, 120), roi=96, overlap=0.5, mode="gaussian", sw=1, classes=2),
}

# Labels may differ only at ties: voxels where MONAI's probabilities of the two labels are
# closer than this (medfast folds batch norm into the convolutions: the same function, rounded
# differently; with the fold_batch_norm setting off the labels are equal voxel for voxel).
TIE = 1e-4
# Eight units in the last place (2^-mantissa bits) of the dtype a GPU network computes in:
# fp16 and TF32 (cuDNN's float32 convolutions) keep 10 bits, bf16 7.
GPU_TIE = {"fp32": 2.0 ** -7, "fp16": 2.0 ** -7, "bf16": 2.0 ** -4}


def tie_for(a):
    return TIE if a.device == "cpu" else GPU_TIE[a.amp]

UNET = dict(spatial_dims=3, in_channels=1, channels=[16, 32, 64, 128, 256], strides=[2, 2, 2, 2],
            num_res_units=2, norm="batch")


def machine():
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return {"cpu": cpu, "cores": os.cpu_count(), "python": platform.python_version()}


def make_image(path, shape):
    """A CT-like volume: smooth blobs of different intensity over a background, plus noise."""
    import nibabel as nib
    import numpy as np
    rng = np.random.default_rng(0)
    x, y, z = np.meshgrid(*[np.linspace(-1, 1, n, dtype=np.float32) for n in shape], indexing="ij")
    vol = np.full(shape, -0.8, np.float32)
    for _ in range(12):
        c = rng.uniform(-0.7, 0.7, 3).astype(np.float32)
        r = np.float32(rng.uniform(0.1, 0.35))
        inside = (x - c[0]) ** 2 + (y - c[1]) ** 2 + (z - c[2]) ** 2 < r * r
        vol[inside] = np.float32(rng.uniform(-0.2, 1.0))
    vol += rng.normal(0, 0.05, shape).astype(np.float32)
    affine = np.diag([0.8, 0.8, 2.5, 1.0])
    nib.save(nib.Nifti1Image(vol, affine), path)


def make_weights(path, classes):
    import torch
    from monai.networks.nets import UNet
    torch.manual_seed(0)
    net = UNet(out_channels=classes, **{**UNET, "norm": "BATCH"})
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for m in net.modules():
            if isinstance(m, torch.nn.BatchNorm3d):
                n = m.num_features
                m.running_mean.copy_(torch.randn(n, generator=g) * 0.1)
                m.running_var.copy_(torch.rand(n, generator=g) + 0.5)
                m.weight.copy_(torch.rand(n, generator=g) + 0.5)
                m.bias.copy_(torch.randn(n, generator=g) * 0.1)
    torch.save(net.state_dict(), path)


def medfast_config(path, cell, weights, threads, device="cpu"):
    config = {
        "data": {"deterministic": [{"name": "LoadImage", "keys": ["image"]},
                                   {"name": "EnsureChannelFirst", "keys": ["image"]}]},
        "model": {"name": "UNet", **UNET, "out_channels": cell["classes"], "pretrained": weights},
        "validation": {"sliding_window": {"roi_size": cell["roi"], "overlap": cell["overlap"], "mode": cell["mode"],
                                          "sw_batch_size": cell["sw"]}},
        "settings": {"threads": threads},
    }
    if device != "cpu":  # cudnn.benchmark, as the peer has it (infer reads train.deterministic)
        config["train"] = {"deterministic": False}
    with open(path, "w") as f:
        json.dump(config, f, indent=1)


def side(cmd, out_json):
    """One side's process: stdout into out_json (a file), wall and peak RSS from wait4."""
    fd = os.open(out_json, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    start = time.perf_counter()
    pid = os.fork()
    if pid == 0:
        os.dup2(fd, 1)
        try:
            os.execvp(cmd[0], cmd)
        finally:
            os._exit(127)
    os.close(fd)
    _, status, usage = os.wait4(pid, 0)
    wall = time.perf_counter() - start
    code = os.waitstatus_to_exitcode(status)
    if code != 0:
        raise SystemExit(f"{cmd[0]} exited with {code}: {' '.join(cmd)}")
    with open(out_json) as f:
        text = f.read()
    return json.loads(text[text.index("{"):]), wall, usage.ru_maxrss * 1024


def worker(args):
    """MONAI's side, in its own process."""
    import monai_peer
    monai = monai_peer.load(args.monai)
    import nibabel as nib
    import numpy as np
    import torch
    from monai.inferers import sliding_window_inference
    from monai.networks.nets import UNet
    import contextlib
    p = json.loads(args.worker)
    torch.set_num_threads(p["threads"])
    device = torch.device(p.get("device", "cpu"))
    cuda = device.type == "cuda"
    if cuda:
        torch.backends.cudnn.benchmark = True
    channels_last = bool(p.get("channels_last"))
    dtype = {"fp32": None, "fp16": torch.float16, "bf16": torch.bfloat16}[p.get("amp", "fp32")]
    start = time.perf_counter()
    img = nib.load(p["image"])
    x = torch.from_numpy(np.asarray(img.dataobj, dtype=np.float32))[None, None]
    net = UNet(out_channels=p["classes"], **{**UNET, "norm": "BATCH"})
    net.load_state_dict(torch.load(p["weights"]))
    net.eval().to(device)
    if channels_last:
        net = net.to(memory_format=torch.channels_last_3d)

    def predictor(w):
        if channels_last:
            w = w.contiguous(memory_format=torch.channels_last_3d)
        with torch.autocast(device.type, dtype=dtype) if dtype else contextlib.nullcontext():
            return net(w)

    def infer_once():
        logits = sliding_window_inference(x.to(device), p["roi"], p["sw"], predictor, overlap=p["overlap"],
                                          mode=p["mode"])
        return logits, torch.argmax(logits, dim=1)[0].to(torch.uint8).cpu()

    read = time.perf_counter()
    with torch.inference_mode():
        if cuda:  # the first pass autotunes cuDNN and starts CUDA: a run pays it once
            infer_once()
            torch.cuda.synchronize()
            read = time.perf_counter()
        logits, labels = infer_once()  # .cpu(): the labels on the host, the device's work done
    infer = time.perf_counter()
    if not p.get("check"):
        del logits
    nib.save(nib.Nifti1Image(labels.numpy(), img.affine), p["output"])
    done = time.perf_counter()
    out = {"read_seconds": read - start, "infer_seconds": infer - read, "write_seconds": done - infer,
           "monai": monai.__version__, "torch": torch.__version__,
           "cudnn_benchmark": bool(torch.backends.cudnn.benchmark),
           **({"gpu": torch.cuda.get_device_name(device), "peak_gpu_bytes": torch.cuda.max_memory_allocated(device)}
              if cuda else {})}
    if p.get("check"):  # after the timers; the logits are still held, so no new peak
        theirs = torch.from_numpy(np.asarray(nib.load(p["check"]).dataobj).astype(np.int64))
        where = (theirs != labels.to(torch.int64)).nonzero()
        gap = 0.0
        if len(where):
            at = tuple(where.t())
            prob = torch.softmax(logits[0][(slice(None),) + tuple(i.to(logits.device) for i in at)].double().cpu(),
                                 dim=0)  # [C, n]
            n = torch.arange(prob.shape[1])
            gap = float((prob[labels.to(torch.int64)[at], n] - prob[theirs[at], n]).abs().max())
        out["check"] = {"differ": int(len(where)), "max_probability_gap": gap}
    print(json.dumps(out))


def compare_labels(a, b):
    import nibabel as nib
    import numpy as np
    x = np.asarray(nib.load(a).dataobj)
    y = np.asarray(nib.load(b).dataobj)
    if x.shape != y.shape:
        raise SystemExit(f"label volumes differ in shape: medfast {x.shape}, MONAI {y.shape}")
    return int((x != y).sum()), int(x.size), sorted(int(v) for v in np.unique(x))


def bench_cell(name, cell, a, monai_ok, work):
    cdir = os.path.join(work, name)
    os.makedirs(cdir, exist_ok=True)
    image = os.path.join(cdir, "image.nii")
    weights = os.path.join(cdir, "weights.pt")
    config = os.path.join(cdir, "config.json")
    if not os.path.exists(image):
        make_image(image, cell["shape"])
    if not os.path.exists(weights):
        make_weights(weights, cell["classes"])
    medfast_config(config, cell, weights, a.threads, a.device)
    m_out, p_out = os.path.join(cdir, "medfast"), os.path.join(cdir, "monai_seg.nii")
    inputs = [image]
    gpu = ["--device", a.device, "--amp", "false" if a.amp == "fp32" else a.amp] if a.device != "cpu" else []
    if a.device != "cpu":  # a first case that autotunes, as MONAI's worker makes a first pass
        warm = os.path.join(cdir, "warm.nii")
        if not os.path.exists(warm):
            shutil.copyfile(image, warm)
        inputs = [warm, image]
    rows = {"medfast": [], "monai": []}
    out_check = None
    tie = tie_for(a)
    for r in range(a.rounds):
        shutil.rmtree(m_out, ignore_errors=True)
        j, wall, rss = side([a.medfast, "--progress", "off", "infer", "--config", config,
                             *sum((["--input", i] for i in inputs), []), "--output", m_out, "--json", *gpu],
                            os.path.join(cdir, "medfast.json"))
        case = next((c for c in j.get("cases", []) if os.path.basename(c.get("input", "")) == "image.nii"), {})
        rows["medfast"].append({"wall": wall, "rss": rss, "infer": case.get("infer_seconds")})
        m_labels = os.path.join(m_out, "image_seg.nii")
        if monai_ok:
            params = dict(image=image, weights=weights, output=p_out, threads=a.threads, classes=cell["classes"],
                          roi=[cell["roi"]] * 3, sw=cell["sw"], overlap=cell["overlap"], mode=cell["mode"],
                          check=m_labels if r == 0 else None, device=a.device, amp=a.amp,
                          channels_last=a.channels_last)
            j, wall, rss = side([sys.executable, os.path.abspath(__file__), "--monai", a.monai,
                                 "--worker", json.dumps(params)], os.path.join(cdir, "monai.json"))
            rows["monai"].append({"wall": wall, "rss": rss, "infer": j["infer_seconds"], "versions": [j["monai"], j["torch"]],
                                  "gpu": j.get("gpu"), "peak_gpu_bytes": j.get("peak_gpu_bytes")})
        if r == 0 and monai_ok:  # verify before any figure counts
            differ, total, labels = compare_labels(m_labels, p_out)
            gap = j["check"]["max_probability_gap"]
            print(f"cell {name}: labels {labels}, {differ} of {total} voxels differ"
                  + (f" (ties: MONAI's probabilities of the two labels there differ by at most {gap:.1e})" if differ else "")
                  + f"; tie threshold {tie:.1e}",
                  flush=True)
            if j["check"]["differ"] != differ:
                raise SystemExit(f"cell {name}: the MONAI worker counted {j['check']['differ']} differing voxels, not {differ}")
            if gap >= tie:
                raise SystemExit(f"cell {name}: medfast's and MONAI's labels differ at {differ} voxels, where MONAI's "
                                 f"probabilities differ by up to {gap:.2e} (more than a rounding tie, {tie:.1e})")
            out_check = {"differ": differ, "voxels": total, "max_probability_gap": gap, "tie": tie}
    med = lambda side_, k: statistics.median(x[k] for x in rows[side_]) if rows[side_] and rows[side_][0][k] is not None else None
    out = {"cell": name, **{k: (list(v) if isinstance(v, tuple) else v) for k, v in cell.items()}, "rounds": a.rounds,
           "device": a.device, "amp": a.amp, "monai_channels_last": a.channels_last,
           "cudnn_benchmark": a.device != "cpu", "timed_pass": "second" if a.device != "cpu" else "first",
           **({"labels_check": out_check} if monai_ok else {}),
           "medfast": {k: med("medfast", k) for k in ("wall", "infer", "rss")}}
    if monai_ok:
        out["monai"] = {k: med("monai", k) for k in ("wall", "infer", "rss")}
        if a.device != "cpu":
            out["monai"]["gpu"] = rows["monai"][0]["gpu"]
            out["monai"]["peak_gpu_bytes"] = rows["monai"][0]["peak_gpu_bytes"]
        out["ratio"] = {k: (out["medfast"][k] / out["monai"][k] if out["medfast"][k] else None) for k in ("wall", "infer", "rss")}
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cells", default="a,b")
    ap.add_argument("--full", action="store_true", help="also the cells a160, a_const, a_sw1")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--medfast", default=os.path.join(REPO, "build", "medfast"))
    ap.add_argument("--work", default=None, help="folder for the inputs and outputs (default: a temporary one)")
    ap.add_argument("--device", default="cpu", help="cpu | cuda (both sides)")
    ap.add_argument("--amp", default="fp32", choices=["fp32", "fp16", "bf16"],
                    help="the dtype both networks compute in (autocast; GPU only)")
    ap.add_argument("--channels-last", action="store_true",
                    help="MONAI's model and windows channels_last_3d (medfast: channels-last by its auto on CUDA)")
    ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    import monai_peer
    monai_peer.add_argument(ap)
    a = ap.parse_args()
    if a.worker:
        return worker(a)
    if a.device not in ("cpu", "cuda") and not a.device.startswith("cuda:"):
        raise SystemExit(f"--device: expected cpu or cuda[:N], got '{a.device}'")
    if a.device == "cpu" and a.amp != "fp32":
        raise SystemExit(f"--amp {a.amp}: reduced precision is measured on a GPU only (--device cuda)")
    names = [c for c in a.cells.split(",") if c]
    if a.full:
        names += [c for c in ("a160", "a_const", "a_sw1") if c not in names]
    for n in names:
        if n not in CELLS:
            raise SystemExit(f"--cells: unknown cell '{n}' (known: {', '.join(CELLS)})")
    monai = monai_peer.load(a.monai)  # prints why when absent
    if monai is None:  # the weights come from MONAI's UNet: without it nothing is compared
        print("inference_bench: skipped (no MONAI peer)")
        return
    work = a.work or tempfile.mkdtemp(prefix="medfast-infer-bench-")
    results = []
    try:
        for n in names:
            r = bench_cell(n, CELLS[n], a, True, work)
            results.append(r)
            m, p = r["medfast"], r["monai"]
            print(f"cell {n}: medfast wall {m['wall']:.2f} s (inference {m['infer'] or float('nan'):.2f} s, "
                  f"peak RSS {m['rss'] / 2**20:.0f} MiB); MONAI wall {p['wall']:.2f} s (inference {p['infer']:.2f} s, "
                  f"peak RSS {p['rss'] / 2**20:.0f} MiB); ratios wall {r['ratio']['wall']:.2f}x, "
                  f"inference {r['ratio']['infer'] or float('nan'):.2f}x, RSS {r['ratio']['rss']:.2f}x", flush=True)
    finally:
        if a.work is None:
            shutil.rmtree(work, ignore_errors=True)
    print(json.dumps({"bench": "inference", "threads": a.threads, "device": a.device, "amp": a.amp,
                      "machine": machine(), "cells": results}))


if __name__ == "__main__":
    main()
