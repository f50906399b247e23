#!/usr/bin/env python3
"""Reference values for medfast's sliding-window inference (MONAI 1.3 semantics).

Usage: make_inference_golden.py OUTDIR

An independent re-statement of monai.inferers.sliding_window_inference (MONAI
1.3, tensor predictor output of the window's spatial size) written from its
documented behaviour, not from medfast's code:

- roi entries <= 0 take the input's size; each spatial axis shorter than the roi
  is padded to it, floor(diff / 2) before and the rest after (torch.nn.functional.pad);
- per axis the scan interval is the roi where the roi equals the padded size,
  else max(int(roi * (1 - overlap)), 1); window starts are 0, i, 2i, ... up to
  the first one whose window reaches the end, that one pulled back to end
  exactly at the border; windows enumerate the axes' starts with the first
  axis slowest (itertools.product);
- windows of all images are numbered image-major and handed to the predictor in
  consecutive groups of sw_batch_size (a group may span two images);
- each window's prediction is weighted by the importance map (ones, or the
  product over axes of exp(-x^2 / (2 sigma^2)), x centred on the window,
  sigma = sigma_scale * roi, not normalised; values below max(min, 1e-3) are
  raised to it) and summed; the sum is divided by the summed weights, then
  the padding is cropped.

The accumulation here runs in float64 numpy (medfast accumulates float32 like
MONAI); the importance map is computed in float64 numpy and rounded to float32.
Writes inputs, the conv predictor's weights and the expected outputs (.bin,
C order, little endian, float32) and manifest.json.
"""
import itertools
import json
import os
import sys

import numpy as np
import torch
import torch.nn.functional as F


def importance(roi, mode, sigma_scale):
    if mode == "constant":
        return np.ones(roi, dtype=np.float64)
    m = np.ones((), dtype=np.float64)
    for n in roi:
        x = np.arange(n, dtype=np.float64) - (n - 1) / 2.0
        g = np.exp(-(x ** 2) / (2.0 * (sigma_scale * n) ** 2))
        m = np.multiply.outer(m, g)
    return np.maximum(m, max(m.min(), 1e-3))


def axis_starts(size, roi, interval):
    starts, k = [], 0
    while True:
        s = k * interval
        starts.append(min(s, size - roi))
        if s + roi >= size:
            return starts
        k += 1


def sliding_window(x, predictor, roi, sw_batch_size, overlap, mode, sigma_scale, padding_mode, cval):
    """x: float32 torch tensor [B, C, *spatial]. Returns (output float64 numpy, call sizes, window starts)."""
    batch, spatial = x.shape[0], list(x.shape[2:])
    roi = [r if r > 0 else s for r, s in zip(roi, spatial)]
    padded = [max(s, r) for s, r in zip(spatial, roi)]
    before = [(p - s) // 2 for p, s in zip(padded, spatial)]
    after = [p - s - b for p, s, b in zip(padded, spatial, before)]
    if any(before) or any(after):
        pad = []
        for d in reversed(range(len(spatial))):
            pad += [before[d], after[d]]
        if padding_mode == "constant":
            x = F.pad(x, pad, mode="constant", value=cval)
        else:
            x = F.pad(x, pad, mode=padding_mode)
    intervals = [r if r == p else max(int(r * (1 - overlap)), 1) for r, p in zip(roi, padded)]
    windows = list(itertools.product(*[axis_starts(p, r, i) for p, r, i in zip(padded, roi, intervals)]))
    weight = importance(roi, mode, sigma_scale).astype(np.float32).astype(np.float64)

    out, count, calls = None, np.zeros(padded), []
    numbered = [(b, w) for b in range(batch) for w in windows]
    for g in range(0, len(numbered), sw_batch_size):
        group = numbered[g:g + sw_batch_size]
        crops = [x[(slice(b, b + 1), slice(None)) + tuple(slice(s, s + r) for s, r in zip(w, roi))] for b, w in group]
        pred = predictor(torch.cat(crops)).double().numpy()
        calls.append(len(group))
        if out is None:
            out = np.zeros([batch, pred.shape[1]] + padded)
        for (b, w), p in zip(group, pred):
            region = tuple(slice(s, s + r) for s, r in zip(w, roi))
            out[(b, slice(None)) + region] += p * weight
    for w in windows:
        count[tuple(slice(s, s + r) for s, r in zip(w, roi))] += weight
    out /= count
    crop = tuple(slice(b, b + s) for b, s in zip(before, spatial))
    return out[(slice(None), slice(None)) + crop], calls, [list(map(int, w)) for w in windows]


def main():
    outdir = sys.argv[1]
    os.makedirs(outdir, exist_ok=True)
    torch.manual_seed(7)
    rng = np.random.default_rng(5)
    manifest = {"importance": [], "cases": []}

    def save(name, arr):
        arr = np.ascontiguousarray(arr, dtype="<f4")
        arr.tofile(os.path.join(outdir, name + ".bin"))
        return {"file": name + ".bin", "shape": list(arr.shape)}

    for roi, mode, sigma in [([8, 7, 5], "gaussian", 0.125), ([16, 16, 16], "gaussian", 0.125),
                             ([3, 4, 6], "gaussian", 0.05), ([9, 1, 4], "gaussian", 0.3),
                             ([6, 5, 4], "constant", 0.125)]:
        m = importance(roi, mode, sigma)
        manifest["importance"].append({"roi_size": roi, "mode": mode, "sigma_scale": sigma,
                                       **save(f"importance_{len(manifest['importance'])}", m)})

    weight = rng.normal(0, 0.3, (3, 2, 3, 3, 3)).astype(np.float32)
    bias = rng.normal(0, 0.5, (3,)).astype(np.float32)
    manifest["conv_weight"] = save("conv_weight", weight)
    manifest["conv_bias"] = save("conv_bias", bias)
    w_t, b_t = torch.from_numpy(weight), torch.from_numpy(bias)

    def conv(t):  # zero padding: each window sees zeros past its own border
        return F.conv3d(t, w_t, b_t, padding=1)

    def identity(t):
        return t.clone()

    # name, predictor, input shape, options (the from_json form)
    cases = [
        ("identity_constant", "identity", [1, 1, 20, 17, 13], dict(roi_size=[8, 8, 8], overlap=0.25)),
        ("identity_gaussian_batch2", "identity", [2, 1, 15, 12, 10],
         dict(roi_size=[7, 9, 6], overlap=0.5, mode="gaussian", sw_batch_size=3)),
        ("identity_padded", "identity", [1, 2, 5, 12, 3],
         dict(roi_size=[8, 8, 8], overlap=0.75, mode="gaussian", cval=0.5)),
        ("conv_overlap0_sw1", "conv", [2, 2, 19, 14, 11], dict(roi_size=[8, 6, 5], overlap=0.0, sw_batch_size=1)),
        ("conv_overlap25_gaussian", "conv", [1, 2, 19, 14, 11],
         dict(roi_size=[8, 6, 5], overlap=0.25, sw_batch_size=3, mode="gaussian")),
        ("conv_overlap50_sw_all", "conv", [2, 2, 17, 13, 12],
         dict(roi_size=[8, 6, 5], overlap=0.5, sw_batch_size=1000)),
        ("conv_overlap75_gaussian_batch2", "conv", [2, 2, 13, 11, 9],
         dict(roi_size=[6, 5, 4], overlap=0.75, sw_batch_size=4, mode="gaussian", sigma_scale=0.2)),
        ("conv_pad_constant_cval", "conv", [1, 2, 5, 12, 3],
         dict(roi_size=[8, 8, 8], overlap=0.25, sw_batch_size=2, mode="gaussian", cval=-0.75)),
        ("conv_pad_reflect_batch2", "conv", [2, 2, 6, 13, 5],
         dict(roi_size=[8, 8, 8], overlap=0.5, sw_batch_size=3, padding_mode="reflect")),
        ("conv_pad_replicate_roi_fallback", "conv", [1, 2, 4, 15, 9],
         dict(roi_size=[7, -1, 5], overlap=0.25, sw_batch_size=2, padding_mode="replicate", mode="gaussian")),
        ("conv_roi_equals_input", "conv", [2, 2, 8, 10, 7],
         dict(roi_size=[8, 6, 7], overlap=0.6, sw_batch_size=5, mode="gaussian", sigma_scale=0.08)),
    ]
    for name, pred_name, shape, opts in cases:
        x = torch.from_numpy(rng.normal(0, 1, shape).astype(np.float32))
        full = dict(roi_size=[96, 96, 96], sw_batch_size=4, overlap=0.25, mode="constant", sigma_scale=0.125,
                    padding_mode="constant", cval=0.0)
        full.update(opts)
        out, calls, windows = sliding_window(x, conv if pred_name == "conv" else identity, full["roi_size"],
                                             full["sw_batch_size"], full["overlap"], full["mode"],
                                             full["sigma_scale"], full["padding_mode"], full["cval"])
        manifest["cases"].append({"name": name, "predictor": pred_name, "options": opts,
                                  "input": save(name + "_input", x.numpy()), "output": save(name + "_output", out),
                                  "calls": calls, "windows": windows})

    with open(os.path.join(outdir, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=1)


if __name__ == "__main__":
    main()
