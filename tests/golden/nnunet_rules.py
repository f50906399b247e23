#!/usr/bin/env python3
"""nnU-Net v2's planning rules stated in numpy, independently of medfast's C++ (src/plan/rules.cpp),
for tests/train/test_plan_rules.cpp. Source: MIC-DKFZ/nnUNet v2.8.1 (default ExperimentPlanner:
determine_fullres_target_spacing, get_plans_for_configuration; network_topology.
get_pool_and_conv_props; dynamic_network_architectures' PlainConvUNet feature-map count;
normalization/map_channel_name_to_normalization; nnUNetTrainer._build_loss).

    /usr/bin/python3 tests/golden/nnunet_rules.py < fingerprint.json

Input: {"spacings": [[x, y, z], ...], "shapes": [[x, y, z], ...] (after cropping), "classes": C,
        "channels": ["CT", ...], "relative_sizes": [...], "samples": [[...], ...] (per channel),
        "outputs": K}
Output (JSON): target_spacing, median_shape, patch, strides, kernels, divisor, features,
batch_size, estimate, normalization, use_mask, stats, deep_supervision_weights.
"""
import json
import math
import sys

import numpy as np

ANISO_THRESHOLD = 3


def target_spacing(spacings, shapes):
    spacings, shapes = np.vstack(spacings).astype(float), np.vstack(shapes).astype(float)
    target = np.percentile(spacings, 50, 0)
    target_size = np.percentile(shapes, 50, 0)
    worst = int(np.argmax(target))
    others = [i for i in range(3) if i != worst]
    other_spacings = [target[i] for i in others]
    other_sizes = [target_size[i] for i in others]
    if target[worst] > ANISO_THRESHOLD * max(other_spacings) and target_size[worst] * ANISO_THRESHOLD < min(other_sizes):
        t = np.percentile(spacings[:, worst], 10)
        if t < max(other_spacings):
            t = max(max(other_spacings), t) + 1e-5
        target[worst] = t
    return target


def pad_shape(shape, div):
    new = [shape[i] + div[i] - shape[i] % div[i] for i in range(len(shape))]
    for i in range(len(shape)):
        if shape[i] % div[i] == 0:
            new[i] -= div[i]
    return np.array(new).astype(int)


def pool_conv(spacing, size, min_fm=4, max_pool=999999):
    dim = len(spacing)
    cur_sp, cur_sz = list(spacing), list(size)
    pools, convs = [[1] * dim], []
    npool, kernel = [0] * dim, [1] * dim
    while True:
        valid = [i for i in range(dim) if cur_sz[i] >= 2 * min_fm]
        if not valid:
            break
        ms = min(cur_sp[i] for i in valid)
        valid = [i for i in valid if cur_sp[i] / ms < 2]
        valid = [i for i in valid if npool[i] < max_pool]
        if len(valid) == 1 and cur_sz[valid[0]] < 3 * min_fm:
            break
        if not valid:
            break
        for d in range(dim):
            if kernel[d] != 3 and cur_sp[d] / min(cur_sp) < 2:
                kernel[d] = 3
        p = [2 if i in valid else 1 for i in range(dim)]
        for v in valid:
            npool[v] += 1
            cur_sp[v] *= 2
            cur_sz[v] = np.ceil(cur_sz[v] / 2)
        pools.append(p)
        convs.append(list(kernel))
    convs.append([3] * dim)
    div = [2 ** n for n in npool]
    return pools, convs, div, pad_shape(size, div)


def elements(patch, pools, features, classes):
    s = np.array(patch)
    sizes = []
    for p in pools:
        s = s // np.array(p)
        sizes.append(float(np.prod(s, dtype=np.float64)))
    enc = sum(2 * features[k] * sizes[k] for k in range(len(pools)))
    dec = sum(3 * features[k] * sizes[k] for k in range(len(pools) - 1)) + classes * sizes[0]
    return enc + dec


def plan(spacing, median_shape, classes, n_voxels, reference=560e6):
    order = [int(np.argmax(spacing))] + [i for i in range(3) if i != int(np.argmax(spacing))]
    sp, med = np.array(spacing)[order], np.array(median_shape)[order]
    tmp = 1 / sp
    init = [round(i) for i in tmp * (256 ** 3 / np.prod(tmp)) ** (1 / 3)]
    init = np.array([min(i, j) for i, j in zip(init, med)])
    pools, convs, div, patch = pool_conv(sp, init)
    features = [min(320, 32 * 2 ** i) for i in range(len(pools))]
    est = elements(patch, pools, features, classes)
    while est / 2 * 2 > reference:
        axis = np.argsort([i / j for i, j in zip(patch, med)])[-1]
        t = patch.copy()
        t[axis] -= div[axis]
        div2 = pool_conv(sp, t)[2]
        patch[axis] -= div2[axis]
        pools, convs, div, patch = pool_conv(sp, patch)
        features = [min(320, 32 * 2 ** i) for i in range(len(pools))]
        est = elements(patch, pools, features, classes)
    bs = round(reference / est * 2)
    bs5 = round(n_voxels * 0.05 / np.prod(patch, dtype=np.float64))
    bs = max(min(bs, bs5), 2)
    back = np.argsort(order)
    un = lambda v: [int(np.array(v)[back][i]) for i in range(3)]
    return {"patch": un(patch), "strides": [un(p) for p in pools], "kernels": [un(k) for k in convs],
            "divisor": un(div), "features": features, "batch_size": int(bs), "estimate": float(est)}


def main():
    f = json.load(sys.stdin)
    # nnU-Net reads NIfTI with SimpleITK: arrays, spacings and shapes in (z, y, x) order. The
    # rules run in that order; the results are given back in (x, y, z).
    spacings = [list(s)[::-1] for s in f["spacings"]]
    shapes = [list(s)[::-1] for s in f["shapes"]]
    target = target_spacing(spacings, shapes)
    new_shapes = [np.round(np.array(s) / target * np.array(sh)) for s, sh in zip(spacings, shapes)]
    median = np.median(np.vstack(new_shapes), 0)
    out = {"target_spacing": [float(v) for v in target[::-1]], "median_shape": [float(v) for v in median[::-1]]}
    planned = plan(target, median, f["classes"], float(np.prod(median)) * len(shapes))
    for k in ("patch", "divisor"):
        planned[k] = planned[k][::-1]
    for k in ("strides", "kernels"):
        planned[k] = [v[::-1] for v in planned[k]]
    out.update(planned)
    table = {"ct": "ct", "nonorm": "none", "zscore": "zscore", "rescale_to_0_1": "rescale_to_0_1"}
    out["normalization"] = [table.get(c.casefold(), "zscore") for c in f.get("channels", [])]
    rel = float(np.median(f["relative_sizes"])) if f.get("relative_sizes") else 1.0
    out["use_mask"] = [rel < 3 / 4. and n == "zscore" for n in out["normalization"]]
    stats = []
    for s in f.get("samples", []):
        a = np.array(s, dtype=np.float64)
        p00_5, median_, p99_5 = np.percentile(a, (0.5, 50.0, 99.5))
        stats.append({"mean": float(a.mean()), "median": float(median_), "std": float(a.std()), "min": float(a.min()),
                      "max": float(a.max()), "p00_5": float(p00_5), "p99_5": float(p99_5)})
    out["stats"] = stats
    k = f.get("outputs", 1)
    w = np.array([1 / (2 ** i) for i in range(k)])
    if k > 1:
        w[-1] = 0
    out["deep_supervision_weights"] = [float(v) for v in w / w.sum()]
    print(json.dumps(out))


if __name__ == "__main__":
    main()
