#!/usr/bin/env python3
"""Golden forward outputs of MONAI 1.3.2's UNet, SegResNet, SwinUNETR (v1, v2) and DynUNet with every
parameter set by monai_formula.values(name, shape), on monai_formula.input_values(shape).

    PYTHONPATH=<the MONAI 1.3.2 peer folder> /usr/bin/python3 tests/golden/make_monai_networks.py

Writes tests/reference/monai_networks.json: per network, its MONAI arguments, the state_dict's
names and shapes in order, and the output's shape, sum, sum of squares and a strided sample.
tests/nn/test_monai_parity.cpp rebuilds each network in medfast, sets the same values by
name and compares; test_pretrained.py writes the same state_dict with python3-torch and
loads it through model.pretrained.
"""
import json
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from monai_formula import input_values, is_formula_set, values  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "..", "reference", "monai_networks.json")
SAMPLES = 256

# (key, medfast model section (MONAI argument names), input shape)
CASES = [
    ("unet_res2_batch",
     {"name": "UNet", "spatial_dims": 3, "in_channels": 1, "out_channels": 2, "channels": [4, 8, 16, 32],
      "strides": [2, 2, 2], "num_res_units": 2, "norm": "batch"}, [1, 1, 32, 32, 32]),
    ("unet_res0_instance",
     {"name": "UNet", "spatial_dims": 3, "in_channels": 1, "out_channels": 3, "channels": [4, 8, 16],
      "strides": [2, 2], "num_res_units": 0, "norm": "instance", "dropout": 0.1}, [1, 1, 24, 32, 16]),
    ("segresnet",
     {"name": "SegResNet", "spatial_dims": 3, "init_filters": 8, "in_channels": 2, "out_channels": 3,
      "blocks_down": [1, 2, 2, 4], "blocks_up": [1, 1, 1]}, [1, 2, 32, 32, 32]),
    ("segresnet_deconv",
     {"name": "SegResNet", "spatial_dims": 3, "init_filters": 8, "in_channels": 1, "out_channels": 2,
      "blocks_down": [1, 2, 2, 4], "blocks_up": [1, 1, 1], "upsample_mode": "deconv"}, [1, 1, 16, 24, 32]),
    ("swinunetr_v1",
     {"name": "SwinUNETR", "img_size": [64, 64, 32], "in_channels": 1, "out_channels": 2, "feature_size": 12,
      "depths": [2, 2, 2, 2], "num_heads": [3, 6, 12, 24], "use_v2": False}, [1, 1, 64, 64, 32]),
    ("swinunetr_v2",
     {"name": "SwinUNETR", "img_size": [64, 64, 32], "in_channels": 1, "out_channels": 2, "feature_size": 12,
      "depths": [2, 2, 2, 2], "num_heads": [3, 6, 12, 24], "use_v2": True}, [1, 1, 64, 64, 32]),
    # nnU-Net's network: anisotropic kernels and strides; residual blocks with deep supervision
    # (instance norm: the training-mode forward, stacked heads included, is deterministic).
    ("dynunet_aniso",
     {"name": "DynUNet", "spatial_dims": 3, "in_channels": 1, "out_channels": 2,
      "kernel_size": [[3, 3, 1], [3, 3, 3], [3, 3, 3], 3], "strides": [1, [2, 2, 1], 2, 2],
      "upsample_kernel_size": [[2, 2, 1], 2, 2], "filters": [4, 8, 16, 32], "norm_name": "instance"},
     [1, 1, 32, 24, 16]),
    ("dynunet_res_ds",
     {"name": "DynUNet", "spatial_dims": 3, "in_channels": 2, "out_channels": 3,
      "kernel_size": [3, 3, 3, 3, 3], "strides": [1, 2, 2, 2, 2], "upsample_kernel_size": [2, 2, 2, 2],
      "filters": [4, 8, 16, 32, 48], "norm_name": "instance", "res_block": True, "deep_supervision": True,
      "deep_supr_num": 2, "trans_bias": True}, [1, 2, 32, 32, 32]),
    ("dynunet_batch",
     {"name": "DynUNet", "spatial_dims": 3, "in_channels": 1, "out_channels": 2,
      "kernel_size": [3, 3, 3], "strides": [2, 2, 2], "upsample_kernel_size": [2, 2],
      "filters": [4, 8, 16], "norm_name": "batch", "res_block": True}, [1, 1, 16, 16, 16]),
]


def install_einops_permute():
    """MONAI's SwinUNETR calls einops.rearrange for pure axis permutations ("n c d h w -> n d h w
    c"); Debian 12 has no python3-einops, so a stand-in that does exactly those is registered."""
    try:
        import einops  # noqa: F401
        return
    except ImportError:
        pass
    import types

    def rearrange(x, pattern):
        left, right = (side.split() for side in pattern.split("->"))
        if sorted(left) != sorted(right) or len(left) != x.dim():
            raise ValueError("stand-in einops: only plain permutations, got %r" % pattern)
        return x.permute(*[left.index(a) for a in right])

    module = types.ModuleType("einops")
    module.rearrange = rearrange
    sys.modules["einops"] = module


def monai_network(spec):
    from monai.networks.nets import DynUNet, SegResNet, SwinUNETR, UNet
    args = {k: v for k, v in spec.items() if k != "name"}
    if spec["name"] == "UNet":
        args["norm"] = args["norm"].upper()
        return UNet(**args)
    if spec["name"] == "DynUNet":
        args["norm_name"] = ("INSTANCE", {"affine": True}) if args["norm_name"] == "instance" else "BATCH"
        return DynUNet(**args)
    if spec["name"] == "SegResNet":
        return SegResNet(**args)
    return SwinUNETR(**args)


def output_summary(y):
    flat = y.reshape(-1).astype(np.float64)
    stride = max(1, flat.size // SAMPLES)
    return {"shape": list(y.shape), "sum": float(flat.sum()), "sum_sq": float((flat * flat).sum()),
            "sample_stride": stride, "sample": [float(v) for v in flat[::stride][:SAMPLES]]}


def main():
    install_einops_permute()
    import monai
    torch.set_num_threads(2)
    torch.manual_seed(0)
    out = {"_about": "MONAI %s (torch %s) forward outputs with formula-set parameters: "
                     "tests/golden/make_monai_networks.py" % (monai.__version__, torch.__version__),
           "networks": {}}
    for key, spec, shape in CASES:
        net = monai_network(spec).eval()
        sd = net.state_dict()
        with torch.no_grad():
            for name, t in sd.items():
                if is_formula_set(name, t):
                    t.copy_(torch.from_numpy(values(name, list(t.shape))))
            y = net(torch.from_numpy(input_values(shape))).numpy()
            if spec.get("deep_supervision"):  # training mode: the output and the heads, stacked
                y_train = net.train()(torch.from_numpy(input_values(shape))).numpy()
                net.eval()
        out["networks"][key] = {
            "model": spec, "input_shape": shape,
            "state_dict": [[name, list(t.shape), str(t.dtype).replace("torch.", "")] for name, t in sd.items()],
            "output": output_summary(y)}
        if spec.get("deep_supervision"):
            out["networks"][key]["train_output"] = output_summary(y_train)
        print("%-20s %3d tensors  output %s  sum %.6g" % (key, len(sd), list(y.shape), y.sum()))
    with open(OUT, "w") as f:
        json.dump(out, f, indent=1)
        f.write("\n")
    print("wrote", os.path.normpath(OUT))


if __name__ == "__main__":
    main()
