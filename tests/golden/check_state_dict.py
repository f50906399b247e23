#!/usr/bin/env python3
"""Checks a state_dict file that medfast wrote (nn::save_state_dict_file, `medfast export`)
with python3-torch alone: `torch.load(FILE, weights_only=True)` must read it (no code run),
and it must hold exactly the state_dict of a case in tests/reference/monai_networks.json:
MONAI's names in MONAI's order, its shapes and dtypes, and the values monai_formula gives
(integer buffers as write_state_dict.py makes them).

    /usr/bin/python3 tests/golden/check_state_dict.py --case unet_res2_batch FILE

Prints one line and exits 0 when it holds; otherwise names the first difference, exit 1.
"""
import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from monai_formula import values  # noqa: E402
from write_state_dict import REFERENCE, buffer_value  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--case", required=True)
    ap.add_argument("--order", choices=["exact", "any"], default="exact")
    ap.add_argument("file")
    args = ap.parse_args()
    case = json.load(open(REFERENCE))["networks"][args.case]
    sd = torch.load(args.file, map_location="cpu", weights_only=True)
    want = [name for name, _, _ in case["state_dict"]]
    got = list(sd.keys())
    if (got if args.order == "exact" else sorted(got)) != (want if args.order == "exact" else sorted(want)):
        extra, missing = sorted(set(got) - set(want)), sorted(set(want) - set(got))
        first = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))
        sys.exit(f"{args.file}: names differ from MONAI's: missing {missing[:5]}, extra {extra[:5]}; "
                 f"first difference in order at {first}: {got[first:first + 1]} vs {want[first:first + 1]}")
    # A tensor the network holds under several names (DynUNet's skip_layers) is one storage
    # in the file, as torch.save writes it, and holds what was set last, by the last name.
    last = {}
    for name, _, _ in case["state_dict"]:
        last[sd[name].data_ptr()] = name
    for name, shape, dtype in case["state_dict"]:
        t = sd[name]
        source = last[t.data_ptr()]
        dt = getattr(torch, dtype)
        if t.dtype != dt or list(t.shape) != shape:
            sys.exit(f"{args.file}: {name}: {t.dtype} {list(t.shape)}, MONAI's is {dt} {shape}")
        expect = torch.from_numpy(values(source, shape)).to(dt) if dt.is_floating_point else buffer_value(name, shape, dt)
        if not torch.equal(t, expect):
            sys.exit(f"{args.file}: {name}: values differ (largest |diff| "
                     f"{(t.double() - expect.double()).abs().max().item()})")
        if t.requires_grad:
            sys.exit(f"{args.file}: {name} requires grad")
    print(f"{args.file}: {len(got)} tensors as MONAI's state_dict, read with weights_only=True "
          f"(torch {torch.__version__})")


if __name__ == "__main__":
    main()
