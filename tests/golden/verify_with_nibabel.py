#!/usr/bin/env python3
"""Checks files written by medfast with nibabel (the round-trip half that runs in Python).

Usage: verify_with_nibabel.py MANIFEST.json

MANIFEST is a list of {file, expected, expected_dtype, dtype, shape, affine,
affine_tolerance}: `file` must load in nibabel with np.asanyarray(dataobj)
of dtype `dtype`, equal to the little-endian Fortran-order values in
`expected` (of `expected_dtype`), and an affine within `affine_tolerance`
(0: exactly) of `affine`. Prints one line per failure; exits 1 if any.
"""
import json
import sys

import nibabel as nib
import numpy as np


def main():
    cases = json.load(open(sys.argv[1]))
    failures = 0
    for c in cases:
        img = nib.load(c["file"])
        arr = np.asanyarray(img.dataobj)
        exp = np.fromfile(c["expected"], dtype=np.dtype(c["expected_dtype"]).newbyteorder("<"))
        exp = exp.reshape(c["shape"], order="F")
        problems = []
        if arr.dtype.name != c["dtype"]:
            problems.append(f"dtype {arr.dtype.name} != {c['dtype']}")
        if list(arr.shape) != list(c["shape"]):
            problems.append(f"shape {arr.shape} != {c['shape']}")
        elif not np.array_equal(arr, exp):
            problems.append("voxels differ")
        diff = np.max(np.abs(img.affine - np.array(c["affine"])))
        if diff > c["affine_tolerance"]:
            problems.append(f"affine differs by {diff}")
        if problems:
            failures += 1
            print(f"{c['file']}: " + "; ".join(problems))
    print(f"nibabel verified {len(cases) - failures} of {len(cases)} files")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
