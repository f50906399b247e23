#!/usr/bin/env python3
"""Reference values for medfast's segmentation metrics (MONAI 1.3 semantics), from numpy/scipy.

Usage: make_metric_golden.py OUTDIR

MONAI is not a dependency; these are independent implementations of what
MONAI 1.3's DiceMetric(ignore_empty=True) and HausdorffDistanceMetric(percentile=95)
compute per case and class:

  Dice   2 |P & G| / (|P| + |G|), NaN where G is empty.
  HD95   surfaces are the mask's edge voxels, mask & ~erosion(mask) with the face-connected
         structuring element and the outside of the image counted as background
         (scipy.ndimage.binary_erosion's defaults); the distance from each edge voxel of one
         mask to the nearest edge voxel of the other is the exact Euclidean distance transform
         in mm (distance_transform_edt with sampling=spacing); HD95 is the larger of the two
         directed 95th percentiles (numpy's default linear interpolation).
         Empty masks follow MONAI: when either mask is empty its distance list holds only
         inf (or nothing), whose 95th percentile is NaN (inf - inf in the interpolation), so
         HD95 is NaN whenever the prediction or the ground truth is empty.
  Without background, channel 0 is dropped, unless it is the only channel.

Writes raw little-endian arrays (C order) and manifest.json:
  tensors: {name: {file, dtype, shape}}
  cases:   [{pred, target, include_background, spacing, dice, hd95}]
"""
import json
import os
import sys
import warnings

import numpy as np
from scipy import ndimage

OUT = None
TENSORS = {}


def save(name, a):
    dtype = {np.float64: "float64", np.uint8: "uint8", np.float32: "float32"}[a.dtype.type]
    fname = name + ".bin"
    np.ascontiguousarray(a).astype(a.dtype.newbyteorder("<")).tofile(os.path.join(OUT, fname))
    TENSORS[name] = {"file": fname, "dtype": dtype, "shape": list(a.shape)}
    return name


def one_hot(labels, n):
    return np.stack([labels == c for c in range(n)], axis=1).astype(np.uint8)


def edges(mask):
    return mask & ~ndimage.binary_erosion(mask)


def surface_distances(src, dst, spacing):
    """Distances from each edge voxel of `src` to the nearest edge voxel of `dst`."""
    if not dst.any():
        return np.full(int(src.sum()), np.inf)
    if not src.any():
        return np.full(int(dst.sum()), np.inf)  # MONAI's convention; the value ends up NaN either way
    return ndimage.distance_transform_edt(~dst, sampling=spacing)[src]


def percentile95(d):
    if d.size == 0:
        return np.nan
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return np.percentile(d, 95)


def metrics(pred, gt, include_background, spacing):
    B, C = pred.shape[:2]
    first = 0 if (include_background or C == 1) else 1
    dice = np.zeros((B, C - first))
    hd = np.zeros((B, C - first))
    sp = spacing if spacing else [1.0] * (pred.ndim - 2)
    for b in range(B):
        for c in range(first, C):
            p, g = pred[b, c] != 0, gt[b, c] != 0
            dice[b, c - first] = 2.0 * (p & g).sum() / (p.sum() + g.sum()) if g.any() else np.nan
            ep, eg = edges(p), edges(g)
            directed = [percentile95(surface_distances(ep, eg, sp)), percentile95(surface_distances(eg, ep, sp))]
            hd[b, c - first] = np.nan if np.isnan(directed).any() else max(directed)  # torch.max propagates NaN
    return dice, hd


def blobs(rng, shape, n_classes, sigma):
    noise = ndimage.gaussian_filter(rng.standard_normal((n_classes,) + shape), sigma=(0,) + sigma)
    noise[0] += 0.15  # more background
    return noise


def main():
    global OUT
    OUT = sys.argv[1]
    os.makedirs(OUT, exist_ok=True)
    rng = np.random.default_rng(7)
    cases = []

    def add(name, pred, gt, include_background, spacing):
        d, h = metrics(pred, gt, include_background, spacing)
        cases.append({"pred": save(name + "_pred", pred), "target": save(name + "_gt", gt),
                      "include_background": include_background, "spacing": spacing,
                      "dice": save(f"{name}_dice_{len(cases)}", d), "hd95": save(f"{name}_hd_{len(cases)}", h)})

    # Random 3D blobs, anisotropic spacing.
    shape = (26, 22, 14)
    gt_l, pred_l = [], []
    for _ in range(2):
        n = blobs(rng, shape, 4, (2.5, 2.0, 1.5))
        gt_l.append(n.argmax(0))
        pred_l.append((n + 0.5 * blobs(rng, shape, 4, (1.5, 1.5, 1.0)) * 3).argmax(0))
    gt3, pred3 = one_hot(np.stack(gt_l), 4), one_hot(np.stack(pred_l), 4)
    add("blob3", pred3, gt3, False, [1.5, 0.8, 2.5])
    add("blob3", pred3, gt3, True, [1.5, 0.8, 2.5])
    add("blob3", pred3, gt3, False, [])

    # Random 2D blobs.
    shape2 = (40, 33)
    n = blobs(rng, (3, 3) + shape2, 1, (0, 0, 3.0, 3.0))[0]  # [B=3, C=3, H, W] smooth fields
    gt2 = one_hot(n.argmax(1), 3)
    pred2 = one_hot((n + 0.7 * blobs(rng, (3, 3) + shape2, 1, (0, 0, 2.0, 2.0))[0] * 4).argmax(1), 3)
    add("blob2", pred2, gt2, False, [0.7, 1.9])

    # Edge cases, 3 classes on a 14 x 12 x 10 grid.
    shape = (14, 12, 10)
    gt = np.zeros((6, 3) + shape, np.uint8)
    pred = np.zeros_like(gt)
    # 0: class 2 absent from the ground truth but predicted.
    gt[0, 1, 2:7, 3:8, 2:6] = 1
    pred[0, 1, 3:8, 3:9, 2:7] = 1
    pred[0, 2, 9:12, 1:4, 5:9] = 1
    # 1: class 1 present but not predicted.
    gt[1, 1, 4:9, 4:9, 4:8] = 1
    gt[1, 2, 10:13, 2:5, 1:3] = 1
    pred[1, 2, 9:13, 2:6, 1:4] = 1
    # 2: class 2 empty in both.
    gt[2, 1, 1:6, 1:6, 1:6] = 1
    pred[2, 1, 2:6, 1:7, 1:5] = 1
    # 3: identical random masks.
    lab = rng.integers(0, 3, shape)
    gt[3] = pred[3] = one_hot(lab[None], 3)[0]
    # 4: slabs on the image border and single voxels.
    gt[4, 1, 0:2] = 1
    pred[4, 1, 0:3, 1:] = 1
    gt[4, 2, 13, 11, 9] = 1
    pred[4, 2, 9, 2, 4] = 1
    # 5: the whole volume against a thin shell.
    gt[5, 1] = 1
    pred[5, 1, 1:-1, 1:-1, 1:-1] = 1
    pred[5, 2, 5:9, 5:7, 4:6] = 1
    gt[5, 2, 5:9, 5:7, 4:6] = 1
    gt[5, 1, 5:9, 5:7, 4:6] = pred[5, 1, 5:9, 5:7, 4:6] = 0
    gt[:, 0] = 1 - np.clip(gt[:, 1:].sum(1), 0, 1)
    pred[:, 0] = 1 - np.clip(pred[:, 1:].sum(1), 0, 1)
    add("edge", pred, gt, False, [0.9, 1.3, 2.2])
    add("edge", pred, gt, True, [])

    # A single channel: kept even without background.
    add("single", pred3[:, 2:3], gt3[:, 2:3], False, [1.0, 1.0, 3.0])

    with open(os.path.join(OUT, "manifest.json"), "w") as f:
        json.dump({"tensors": TENSORS, "cases": cases}, f, indent=1)


if __name__ == "__main__":
    main()
