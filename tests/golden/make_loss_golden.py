#!/usr/bin/env python3
"""Reference values for medfast's segmentation losses (MONAI 1.3 semantics), from PyTorch.

Usage: make_loss_golden.py OUTDIR

MONAI is not a dependency: the formulas below are written independently from
MONAI 1.3's documented behaviour (monai/losses/dice.py, focal_loss.py) and
evaluated in float64 with torch autograd on float32 inputs:

  Dice       1 - (2 sum(p t) + smooth_nr) / (sum(p^k) + sum(t^k) + smooth_dr), k = 2 if squared_pred else 1,
             (jaccard: denominator 2 (sum(p^k) + sum(t^k) - sum(p t))), reduced over the spatial
             axes (and the batch axis with batch=true), then averaged over the rest. p is
             sigmoid/softmax/identity of the logits; channel 0 is dropped after the activation
             when include_background=false. With one channel, to_onehot_y and
             include_background=false are ignored (as MONAI does).
  DiceCE     lambda_dice Dice + lambda_ce CE, where CE always sees the raw logits and the raw
             target: cross entropy with class indices for a [B,1,...] target, with class
             probabilities for a [B,C,...] target, binary cross entropy with logits when the
             input has one channel (this is MONAI's rule, whatever sigmoid/softmax say).
  DiceFocal  lambda_dice Dice + lambda_focal Focal, Focal = mean((1 - p_t)^gamma BCE(x, t)) over
             every element of the (one-hot, background-dropped) target; p_t = sigmoid(x) where
             t = 1, 1 - sigmoid(x) where t = 0 (MONAI's sigmoid focal loss, its default).

Writes each tensor as raw little-endian bytes (C order) and manifest.json:
  tensors: {name: {file, dtype, shape}}
  cases:   [{options (a `loss:` mapping), input, target, loss, grad}]
"""
import json
import os
import sys

import numpy as np
import torch
import torch.nn.functional as F

OUT = None
TENSORS = {}


def save(name, t):
    a = t.detach().cpu().contiguous().numpy()
    dtype = {np.float32: "float32", np.float64: "float64", np.uint8: "uint8"}[a.dtype.type]
    fname = name + ".bin"
    a.astype(a.dtype.newbyteorder("<")).tofile(os.path.join(OUT, fname))
    TENSORS[name] = {"file": fname, "dtype": dtype, "shape": list(a.shape)}
    return name


def one_hot(labels, n):
    classes = torch.arange(n, dtype=torch.int64).view([1, n] + [1] * (labels.dim() - 2))
    return (labels.long() == classes).to(torch.float64)


def reference_loss(x, y, o):
    """x: float64 logits (requires grad), y: float64 target."""
    C = x.shape[1]
    if o["sigmoid"]:
        p = torch.sigmoid(x)
    elif o["softmax"]:
        p = torch.softmax(x, dim=1)
    else:
        p = x
    t = one_hot(y, C) if (o["to_onehot_y"] and C > 1) else y
    drop = (not o["include_background"]) and C > 1
    ps, ts = (p[:, 1:], t[:, 1:]) if drop else (p, t)
    axes = ([0] if o["batch"] else []) + list(range(2, x.dim()))
    inter = (ps * ts).sum(axes)
    pk, tk = (ps * ps, ts * ts) if o["squared_pred"] else (ps, ts)
    den = pk.sum(axes) + tk.sum(axes)
    if o["jaccard"]:
        den = 2.0 * (den - inter)
    dice = (1.0 - (2.0 * inter + o["smooth_nr"]) / (den + o["smooth_dr"])).mean()
    if o["name"] == "Dice":
        return dice
    if o["name"] == "DiceCE":
        if C == 1:
            ce = F.binary_cross_entropy_with_logits(x, y)
        elif y.shape[1] == 1:
            ce = F.cross_entropy(x, y[:, 0].long())
        else:
            ce = -(y * F.log_softmax(x, dim=1)).sum(1).mean()
        return o["lambda_dice"] * dice + o["lambda_ce"] * ce
    xs = x[:, 1:] if drop else x
    s = torch.sigmoid(xs)
    p_t = s * ts + (1.0 - s) * (1.0 - ts)
    bce = F.binary_cross_entropy_with_logits(xs, ts, reduction="none")
    focal = ((1.0 - p_t) ** o["gamma"] * bce).mean()
    return o["lambda_dice"] * dice + o["lambda_focal"] * focal


DEFAULTS = dict(name="DiceCE", include_background=True, to_onehot_y=False, sigmoid=False, softmax=False,
                squared_pred=False, jaccard=False, batch=False, smooth_nr=1e-5, smooth_dr=1e-5,
                lambda_dice=1.0, lambda_ce=1.0, lambda_focal=1.0, gamma=2.0)


def main():
    global OUT
    OUT = sys.argv[1]
    os.makedirs(OUT, exist_ok=True)
    g = torch.Generator().manual_seed(20240611)

    # Inputs: 3-class 3D and 2D logits with class-index and one-hot targets, and a
    # single-channel (binary) 3D case.
    x3 = torch.randn(2, 3, 12, 10, 8, generator=g, dtype=torch.float32) * 2.0
    l3 = torch.randint(0, 3, (2, 1, 12, 10, 8), generator=g).to(torch.float32)
    l3[1, 0, :, :, :4] = torch.where(l3[1, 0, :, :, :4] == 2, torch.zeros(()), l3[1, 0, :, :, :4])
    x2 = torch.randn(3, 3, 16, 14, generator=g, dtype=torch.float32) * 1.5
    l2 = torch.randint(0, 3, (3, 1, 16, 14), generator=g).to(torch.float32)
    l2[2] = torch.where(l2[2] == 1, torch.zeros(()), l2[2])  # class 1 absent in case 2
    xb = torch.randn(2, 1, 12, 10, 8, generator=g, dtype=torch.float32) * 2.0
    lb = (torch.rand(2, 1, 12, 10, 8, generator=g) > 0.6).to(torch.float32)
    inputs = {
        "x3": (save("x3", x3), save("l3", l3), save("o3", one_hot(l3, 3).to(torch.float32))),
        "x2": (save("x2", x2), save("l2", l2), save("o2", one_hot(l2, 3).to(torch.float32))),
        "xb": (save("xb", xb), save("lb", lb), save("lb", lb)),
    }
    data = {"x3": (x3, l3), "x2": (x2, l2), "xb": (xb, lb)}

    variants = []
    for name in ("Dice", "DiceCE", "DiceFocal"):
        for act in ("softmax", "sigmoid"):
            for include_background in (True, False):
                for to_onehot_y in (True, False):
                    for batch in (False, True):
                        variants.append(("x3", dict(name=name, include_background=include_background,
                                                    to_onehot_y=to_onehot_y, batch=batch, **{act: True})))
        for extra in (dict(squared_pred=True), dict(jaccard=True), dict(squared_pred=True, jaccard=True)):
            variants.append(("x3", dict(name=name, softmax=True, to_onehot_y=True, include_background=False, **extra)))
            variants.append(("x2", dict(name=name, sigmoid=True, to_onehot_y=True, batch=True, **extra)))
        variants.append(("x2", dict(name=name, softmax=True, to_onehot_y=True)))
        variants.append(("x2", dict(name=name, sigmoid=True, to_onehot_y=False, include_background=False)))
        variants.append(("x3", dict(name=name, softmax=True, to_onehot_y=True, smooth_nr=0.0, smooth_dr=1e-6,
                                    lambda_dice=0.7, lambda_ce=1.3, lambda_focal=0.4, gamma=1.5)))
        # Single channel: sigmoid; to_onehot_y and include_background=false are ignored.
        for extra in (dict(), dict(to_onehot_y=True, include_background=False), dict(batch=True, squared_pred=True)):
            variants.append(("xb", dict(name=name, sigmoid=True, **extra)))
    # No activation: the input already holds probabilities.
    variants.append(("x3", dict(name="Dice", to_onehot_y=True, include_background=False)))

    cases = []
    for i, (key, opts) in enumerate(variants):
        o = dict(DEFAULTS)
        o.update(opts)
        x, lab = data[key]
        xin, lin, ohin = inputs[key]
        onehot_target = not o["to_onehot_y"] and key != "xb"
        y = (one_hot(lab, 3) if onehot_target else lab).to(torch.float64)
        if o["name"] == "Dice" and not (o["sigmoid"] or o["softmax"]):
            probabilities = torch.softmax(x, 1)
            xin = save(f"p{i}", probabilities)
            xv = probabilities.double().requires_grad_(True)
        else:
            xv = x.double().requires_grad_(True)
        loss = reference_loss(xv, y, o)
        loss.backward()
        cases.append({"options": opts, "input": xin, "target": ohin if onehot_target else lin,
                      "loss": loss.item(), "grad": save(f"grad{i}", xv.grad)})

    with open(os.path.join(OUT, "manifest.json"), "w") as f:
        json.dump({"tensors": TENSORS, "cases": cases}, f, indent=1)


if __name__ == "__main__":
    main()
