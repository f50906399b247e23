#!/usr/bin/env python3
"""Writes, with python3-torch alone (no MONAI), the state_dict that MONAI's network of a case in
tests/reference/monai_networks.json has when its parameters are set by monai_formula: the
names, shapes, dtypes and order recorded from MONAI, values by the formula, torch.save'd as
`torch.save(model.state_dict(), FILE)` writes it. Used by the model.pretrained tests.

    /usr/bin/python3 tests/golden/write_state_dict.py --case unet_res2_batch --out w.pt
        [--prefix module.] [--drop NAME] [--legacy]
"""
import argparse
import collections
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from monai_formula import values  # noqa: E402

REFERENCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "reference", "monai_networks.json")


def relative_position_index(window):
    """Swin's (w^3, w^3) table of relative offsets (Liu et al., as MONAI computes it)."""
    w0, w1, w2 = window
    coords = torch.stack(torch.meshgrid(torch.arange(w0), torch.arange(w1), torch.arange(w2), indexing="ij"))
    flat = coords.flatten(1)
    rel = (flat[:, :, None] - flat[:, None, :]).permute(1, 2, 0).contiguous()
    rel[:, :, 0] += w0 - 1
    rel[:, :, 1] += w1 - 1
    rel[:, :, 2] += w2 - 1
    rel[:, :, 0] *= (2 * w1 - 1) * (2 * w2 - 1)
    rel[:, :, 1] *= 2 * w2 - 1
    return rel.sum(-1)


def buffer_value(name, shape, dtype):
    if name.endswith("num_batches_tracked"):
        return torch.zeros(shape, dtype=dtype)
    if name.endswith("relative_position_index"):
        w = round(shape[0] ** (1 / 3))
        return relative_position_index((w, w, w)).to(dtype)
    raise SystemExit("no formula for integer tensor %s" % name)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--case", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--reference", default=REFERENCE)
    ap.add_argument("--prefix", default="", help="prepended to every key (DataParallel: module.)")
    ap.add_argument("--drop", action="append", default=[], help="leave this key out (error tests)")
    args = ap.parse_args()
    case = json.load(open(args.reference))["networks"][args.case]
    sd = collections.OrderedDict()
    for name, shape, dtype in case["state_dict"]:
        if name in args.drop:
            continue
        dt = getattr(torch, dtype)
        if dt.is_floating_point:
            t = torch.from_numpy(values(name, shape)).to(dt)
        else:
            t = buffer_value(name, shape, dt)
        sd[args.prefix + name] = t
    torch.save(sd, args.out)


if __name__ == "__main__":
    main()
