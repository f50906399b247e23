#!/usr/bin/env python3
"""Golden output of MONAI 1.3.2's spleen deterministic chain on a small synthetic CT.

    PYTHONPATH=<the MONAI 1.3.2 peer folder> /usr/bin/python3 tests/golden/make_monai_chain.py

`write_inputs(DIR)` (nibabel and numpy only, no MONAI, no random numbers: values by formula)
writes image.nii.gz (float32 HU-like, LPS, 0.77 x 0.83 x 4.7 mm) and label.nii.gz (uint8);
tests/transforms/test_monai_chain.cpp calls it (`write` mode) and runs medfast's chain. This
script runs MONAI's LoadImaged, EnsureChannelFirstd, Orientationd(RAS),
Spacingd(1.5, 1.5, 2; bilinear/nearest), ScaleIntensityRanged(-57, 164 -> 0, 1, clip),
CropForegroundd(source image), FgBgToIndicesd(label, image_key image) on them and writes
tests/reference/monai_spleen_chain.json: the output shapes, affines, image sum, sum of
squares and a strided sample, the label's voxel count and index checksum, and the
foreground/background index counts and checksums.
"""
import json
import os
import sys
import tempfile

import nibabel as nib
import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "..", "reference", "monai_spleen_chain.json")
SHAPE = (60, 52, 23)
SAMPLES = 400


def write_inputs(outdir):
    i, j, k = np.meshgrid(*[np.arange(n, dtype=np.float64) for n in SHAPE], indexing="ij")
    body = ((i - 30) / 26) ** 2 + ((j - 25) / 22) ** 2 < 1
    organ = ((i - 36) / 9) ** 2 + ((j - 20) / 7) ** 2 + ((k - 11) / 5) ** 2 < 1
    img = np.where(body, 40.0, -1000.0) + 70.0 * np.sin(i * 0.31 + j * 0.17 + k * 0.7) + np.where(organ, 60.0, 0.0)
    aff = np.array([[-0.77, 0, 0, 24.0], [0, -0.83, 0, 19.0], [0, 0, 4.7, -50.0], [0, 0, 0, 1]])
    os.makedirs(outdir, exist_ok=True)
    nib.save(nib.Nifti1Image(img.astype(np.float32), aff), os.path.join(outdir, "image.nii.gz"))
    nib.save(nib.Nifti1Image(organ.astype(np.uint8), aff), os.path.join(outdir, "label.nii.gz"))


def summary(d):
    img = np.asarray(d["image"], dtype=np.float64)
    lab = np.asarray(d["label"])
    flat = img.reshape(-1)
    stride = max(1, flat.size // SAMPLES)
    fg = np.asarray(d["label_fg_indices"]).astype(np.int64)
    bg = np.asarray(d["label_bg_indices"]).astype(np.int64)
    on = np.flatnonzero(lab.reshape(-1) > 0)
    return {"image_shape": list(img.shape), "image_affine": np.asarray(d["image"].affine).tolist(),
            "label_shape": list(lab.shape), "label_affine": np.asarray(d["label"].affine).tolist(),
            "image_sum": float(flat.sum()), "image_sum_sq": float((flat * flat).sum()),
            "sample_stride": stride, "sample": [float(v) for v in flat[::stride][:SAMPLES]],
            "label_voxels": int(on.size), "label_index_sum": int(on.sum()),
            "fg_count": int(fg.size), "fg_index_sum": int(fg.sum()),
            "bg_count": int(bg.size), "bg_index_sum": int(bg.sum())}


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "write":
        write_inputs(sys.argv[2])
        return
    import monai
    import monai.transforms as mt
    chain = mt.Compose([
        mt.LoadImaged(keys=["image", "label"]), mt.EnsureChannelFirstd(keys=["image", "label"]),
        mt.Orientationd(keys=["image", "label"], axcodes="RAS"),
        mt.Spacingd(keys=["image", "label"], pixdim=(1.5, 1.5, 2.0), mode=("bilinear", "nearest")),
        mt.ScaleIntensityRanged(keys="image", a_min=-57, a_max=164, b_min=0.0, b_max=1.0, clip=True),
        mt.CropForegroundd(keys=["image", "label"], source_key="image"),
        mt.FgBgToIndicesd(keys="label", image_key="image")])
    with tempfile.TemporaryDirectory() as tmp:
        write_inputs(tmp)
        d = chain({"image": os.path.join(tmp, "image.nii.gz"), "label": os.path.join(tmp, "label.nii.gz")})
    out = {"_about": "MONAI %s spleen deterministic chain on write_inputs()'s volume: "
                     "tests/golden/make_monai_chain.py" % monai.__version__}
    out.update(summary(d))
    with open(OUT, "w") as f:
        json.dump(out, f, indent=1)
        f.write("\n")
    print("wrote", os.path.normpath(OUT), out["image_shape"], out["fg_count"], out["bg_count"])


if __name__ == "__main__":
    main()
