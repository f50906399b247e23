#!/usr/bin/env python3
"""MONAI 1.3.2's dictionary-transform arguments, for every transform medfast names.

    PYTHONPATH=<the MONAI 1.3.2 peer folder> /usr/bin/python3 tests/golden/make_monai_transform_args.py

Writes tests/reference/monai_transform_args.json: for each medfast transform name N that
MONAI has as a dictionary transform `Nd`, the parameters of `Nd.__init__` in order, each with
its default (JSON where it is a plain value; "<required>" where it has none; "<object>" for
a default that is no JSON value, e.g. a numpy dtype or a callable). Read by
tests/transforms/test_monai_arguments.cpp: every one is either taken by medfast or refused as
"MONAI's argument '...' is not supported by medfast".

With --rows it prints, from the recorded file, the rows of kMonaiArguments
(src/transforms/monai_arguments.cpp) instead.
"""
import inspect
import json
import os
import sys


HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "..", "reference", "monai_transform_args.json")

# medfast's registered names (src/transforms/registry.cpp, random_registry.cpp) that are
# MONAI's; LabelToRegions is medfast's own.
NAMES = [
    "LoadImage", "EnsureChannelFirst", "Orientation", "Spacing", "ScaleIntensityRange", "NormalizeIntensity",
    "CropForeground", "FgBgToIndices", "ResizeWithPadOrCrop", "SpatialPad", "CastToType", "EnsureType", "ToDevice",
    "ConvertToMultiChannelBasedOnBratsClasses", "MapLabelValue",
    "RandCropByPosNegLabel", "RandSpatialCrop", "RandFlip", "RandRotate90", "RandRotate", "RandZoom", "RandAffine",
    "RandScaleIntensity", "RandShiftIntensity", "RandGaussianNoise", "RandGaussianSmooth", "RandAdjustContrast",
]


def default_of(p):
    if p.default is inspect.Parameter.empty:
        return "<required>"
    v = p.default
    if isinstance(v, (bool, int, float, str)) or v is None:
        return v
    if isinstance(v, (tuple, list)) and all(isinstance(x, (bool, int, float, str)) or x is None for x in v):
        return list(v)
    if hasattr(v, "value") and isinstance(v.value, (str, int)):  # MONAI's StrEnum members
        return v.value
    return "<object>"


def print_rows():
    with open(OUT) as f:
        recorded = json.load(f)
    for name, params in recorded.items():
        if name == "_about":
            continue
        for arg, default in params:
            if arg == "keys":
                continue
            text = "nullptr" if default in ("<required>", "<object>") else 'R"(%s)"' % json.dumps(default)
            print('    {"%s", "%s", %s},' % (name, arg, text))


def main():
    if "--rows" in sys.argv:
        print_rows()
        return
    import monai
    import monai.transforms as mt

    out = {"_about": f"MONAI {monai.__version__}: parameters of each dictionary transform's __init__ "
                     "(name -> [[parameter, default], ...]); see tests/reference/README.md"}
    for name in NAMES:
        cls = getattr(mt, name + "d")
        params = [p for p in inspect.signature(cls.__init__).parameters.values()
                  if p.name != "self" and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
        out[name] = [[p.name, default_of(p)] for p in params]
    with open(OUT, "w") as f:
        json.dump(out, f, indent=1)
        f.write("\n")
    print(f"wrote {len(NAMES)} transforms' arguments to {os.path.normpath(OUT)}")


if __name__ == "__main__":
    main()
