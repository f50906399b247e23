"""The deterministic parameter formula shared by make_monai_networks.py (MONAI's side) and
the tests (medfast's side, and a state_dict written by python3-torch for model.pretrained).

Every floating-point parameter and buffer of a network gets values from its MONAI name and
element index alone, so no weight file is checked in. tests/nn/test_monai_parity.cpp has
the same formula in C++; keep them in step.
"""
import math

import numpy as np

GOLDEN_STEP = 0.7548776662466927  # the plastic number's inverse: well-spread phases


def name_hash(name):
    h = 0
    for c in name.encode():
        h = (h * 131 + c) % 1000003
    return h


def values(name, shape):
    """float32 values for the tensor `name` of `shape` (C order)."""
    n = int(np.prod(shape)) if len(shape) else 1
    i = np.arange(n, dtype=np.float64)
    base = np.sin(i * GOLDEN_STEP + name_hash(name) * 1e-3)
    if name.endswith("running_var"):
        v = 1.0 + 0.5 * np.abs(base)
    elif name.endswith("running_mean"):
        v = 0.1 * base
    elif len(shape) >= 2:
        fan = n / shape[0]
        v = base / math.sqrt(fan)
    elif name.endswith("bias"):
        v = 0.1 * base
    else:  # 1-D weights: norm scales, PReLU slopes
        v = 0.75 + 0.25 * base
    return v.astype(np.float32).reshape(shape)


def input_values(shape):
    n = int(np.prod(shape))
    i = np.arange(n, dtype=np.float64)
    return np.sin(i * 0.3183098861837907 + 0.5).astype(np.float32).reshape(shape)


def is_formula_set(name, tensor):
    """Integer buffers (num_batches_tracked, relative_position_index) keep their values."""
    return tensor.dtype.is_floating_point
