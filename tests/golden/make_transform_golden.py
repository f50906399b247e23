#!/usr/bin/env python3
"""Reference values for medfast's deterministic transforms, from nibabel/numpy/scipy.

Usage: make_transform_golden.py OUTDIR
       PYTHONPATH=<the MONAI 1.3.2 peer folder> /usr/bin/python3 make_transform_golden.py monai

The second form records MONAI 1.3.2's own outputs of the label transforms
(ConvertToMultiChannelBasedOnBratsClassesd, MapLabelValued, FgBgToIndicesd of a
multi-channel label, the MSD Task01 tutorial's region mapping that LabelToRegions
covers) and of RandSpatialCropd where it draws nothing (random_center false, or an ROI
the image's size), on small inputs made by formula, into
tests/reference/monai_label_transforms.json (inputs and outputs as flat C-order lists);
tests/transforms/test_transforms.cpp (MonaiLabelTransforms) reads it.

Writes image.nii.gz (float32 HU-like, LPS, spacing 0.77 x 0.83 x 4.7) and
label.nii.gz (uint8), then applies, step by step with independent code, the
chain LoadImage -> EnsureChannelFirst -> Orientation(RAS) ->
Spacing(1.5, 1.5, 2.0; bilinear/nearest) -> ScaleIntensityRange(-57, 164, 0, 1,
clip) -> CropForeground(source image) -> FgBgToIndices(label, image_key image),
plus NormalizeIntensity(nonzero) and ResizeWithPadOrCrop((24, 12, 25)) of the cropped image
and writes every stage's arrays (.bin, C order, little endian) and geometry
to manifest.json. Orientation uses nibabel.orientations; resampling uses
scipy.ndimage.map_coordinates (order 1 / 0, mode 'nearest' = border) on the
index mapping inv(A_in) @ A_out; the Spacing grid follows MONAI 1.3's
zoom_affine/compute_shape_offset. Spacings are chosen so that no sample falls
exactly half-way between voxels, where nearest-rounding conventions differ.
"""
import json
import os
import sys

import nibabel as nib
import numpy as np
from nibabel import orientations as ori
from scipy import ndimage


def spacing_grid(shape, aff, pixdim):
    rzs = aff[:3, :3]
    zs = np.linalg.cholesky(rzs.T @ rzs).T
    rs = rzs @ np.linalg.inv(zs)
    new = np.eye(4)
    new[:3, :3] = rs @ np.diag(np.sign(np.diag(zs)) * np.abs(pixdim))
    corners = np.array(np.meshgrid(*[(0.0, d - 1.0) for d in shape], indexing="ij")).reshape(3, -1)
    corners = np.vstack([corners, np.ones((1, corners.shape[1]))])
    out = np.linalg.solve(new, aff) @ corners
    out_shape = np.round(out[:3].max(1) - out[:3].min(1) + 1.0).astype(int)
    new[:3, 3] = aff[:3, 3]  # same orientation: the origin is kept
    return tuple(out_shape), new


def resample(data, aff_in, aff_out, out_shape, order):
    m = np.linalg.inv(aff_in) @ aff_out
    idx = np.array(np.meshgrid(*[np.arange(n) for n in out_shape], indexing="ij"), dtype=np.float64).reshape(3, -1)
    coords = m[:3, :3] @ idx + m[:3, 3:4]
    out = [ndimage.map_coordinates(c.astype(np.float64), coords, order=order, mode="nearest").reshape(out_shape)
           for c in data]
    return np.stack(out)


MONAI_OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "reference",
                         "monai_label_transforms.json")


def record_monai():
    import monai
    import monai.transforms as mt
    import torch

    def arr(a):
        a = np.asarray(a)
        values = (a.astype(np.uint8) if a.dtype == np.bool_ else a).reshape(-1).tolist()  # bool as 0 and 1
        return {"shape": list(a.shape), "dtype": str(a.dtype), "values": values}

    def out_of(t):
        if isinstance(t, torch.Tensor):
            t = t.detach().cpu().numpy()
        return arr(t)

    i, j, k = np.meshgrid(np.arange(5), np.arange(6), np.arange(7), indexing="ij")
    # Class values 0..5 by formula (BraTS has 0, 1, 2, 4; 3 and 5 are in no BraTS region).
    label = ((i * 7 + j * 3 + k * 5 + i * j) % 6).astype(np.uint8)[None]
    cases = {}

    def case(name, transform, inputs, args, key="label", extra_out=()):
        d = {kk: torch.as_tensor(v) for kk, v in inputs.items()}
        r = transform(d)
        cases[name] = {"args": args, "inputs": {kk: arr(v) for kk, v in inputs.items()},
                       "outputs": {kk: out_of(r[kk]) for kk in (key,) + tuple(extra_out)}}

    case("brats", mt.ConvertToMultiChannelBasedOnBratsClassesd(keys="label"), {"label": label},
         {"name": "ConvertToMultiChannelBasedOnBratsClasses", "keys": ["label"]})
    case("map_label_value", mt.MapLabelValued(keys="label", orig_labels=[3, 2, 1, 7], target_labels=[0, 1, 2, 9]),
         {"label": label}, {"name": "MapLabelValue", "keys": ["label"], "orig_labels": [3, 2, 1, 7],
                            "target_labels": [0, 1, 2, 9]})
    case("map_label_value_uint8_swap",
         mt.MapLabelValued(keys="label", orig_labels=[1, 2, 4], target_labels=[2, 1, 4], dtype=np.uint8),
         {"label": label}, {"name": "MapLabelValue", "keys": ["label"], "orig_labels": [1, 2, 4],
                            "target_labels": [2, 1, 4], "dtype": "uint8"})
    # MSD Task01 (BraTS in MSD's numbering: 1 edema, 2 non-enhancing, 3 enhancing): the MONAI
    # tutorial's own ConvertToMultiChannelBasedOnBratsClassesd maps TC = 2|3, WT = 1|2|3, ET = 2.
    task01 = (label % 4).astype(np.uint8)
    tutorial = np.concatenate([np.logical_or(task01 == 2, task01 == 3),
                               np.logical_or(np.logical_or(task01 == 2, task01 == 3), task01 == 1),
                               task01 == 2]).astype(np.uint8)
    cases["task01_regions"] = {"args": {"name": "LabelToRegions", "keys": ["label"], "regions": [[2, 3], [1, 2, 3], [2]]},
                               "inputs": {"label": arr(task01)}, "outputs": {"label": arr(tutorial)}}
    # FgBgToIndices of a three-channel label: MONAI leaves channel 0 out (one-hot background).
    three = np.concatenate([(label == 1), (label == 2), (label == 4)]).astype(np.uint8)
    image = ((i + j + k) % 4 - 1).astype(np.float32)[None]
    case("fgbg_multichannel", mt.FgBgToIndicesd(keys="label", image_key="image"), {"label": three, "image": image},
         {"name": "FgBgToIndices", "keys": ["label"], "image_key": "image"}, key="label_fg_indices",
         extra_out=("label_bg_indices",))
    img = np.arange(2 * 7 * 8 * 9, dtype=np.float32).reshape(2, 7, 8, 9)
    for name, roi, center in [("spatial_crop_center", [4, -1, 12], False), ("spatial_crop_center_odd", [3, 5, 2], False),
                              ("spatial_crop_whole", [7, 0, 20], True)]:
        t = mt.RandSpatialCropd(keys="image", roi_size=roi, random_center=center, random_size=False)
        t.set_random_state(0)
        case(name, t, {"image": img}, {"name": "RandSpatialCrop", "keys": ["image"], "roi_size": roi,
                                       "random_center": center, "random_size": False}, key="image")
    out = {"_about": "MONAI %s label transforms and RandSpatialCropd (where it draws nothing) on formula inputs: "
                     "tests/golden/make_transform_golden.py monai" % monai.__version__}
    out.update(cases)
    with open(MONAI_OUT, "w") as f:
        json.dump(out, f)
        f.write("\n")
    print("wrote", os.path.normpath(MONAI_OUT), ", ".join(cases))


def main():
    if sys.argv[1] == "monai":
        record_monai()
        return
    outdir = sys.argv[1]
    os.makedirs(outdir, exist_ok=True)
    rng = np.random.default_rng(11)
    shape = (46, 38, 9)
    aff = np.array([[-0.77, 0, 0, 20.0], [0, -0.83, 0, 15.0], [0, 0, 4.7, -30.0], [0, 0, 0, 1]])
    x, y, z = np.meshgrid(*[np.arange(n) for n in shape], indexing="ij")
    body = ((x - 23) / 20.0) ** 2 + ((y - 19) / 15.0) ** 2 <= 1
    organ = ((x - 30) / 6.0) ** 2 + ((y - 17) / 5.0) ** 2 + ((z - 4) / 2.5) ** 2 <= 1
    img = np.where(body, 40.0, -1000.0) + rng.normal(0, 20, shape)
    img = np.where(organ, 110.0 + rng.normal(0, 10, shape), img).astype(np.float32)
    lab = organ.astype(np.uint8)
    nib.save(nib.Nifti1Image(img, aff), os.path.join(outdir, "image.nii.gz"))
    nib.save(nib.Nifti1Image(lab, aff), os.path.join(outdir, "label.nii.gz"))
    # What nibabel reads back (float32 affine precision).
    aff = nib.load(os.path.join(outdir, "image.nii.gz")).affine

    stages = {}

    def save(name, arr, affine=None):
        arr = np.ascontiguousarray(arr)
        arr.astype(arr.dtype.newbyteorder("<")).tofile(os.path.join(outdir, name + ".bin"))
        stages[name] = {"file": name + ".bin", "dtype": arr.dtype.name, "shape": list(arr.shape)}
        if affine is not None:
            stages[name]["affine"] = [[float(v) for v in row] for row in affine]

    im = img[None].astype(np.float32)  # LoadImage(float32) + EnsureChannelFirst
    lb = lab[None]
    # Orientation(RAS)
    t = ori.ornt_transform(ori.io_orientation(aff), ori.axcodes2ornt("RAS"))
    im = np.stack([ori.apply_orientation(c, t) for c in im])
    lb = np.stack([ori.apply_orientation(c, t) for c in lb])
    aff = aff @ ori.inv_ornt_aff(t, shape)
    save("orient_image", im, aff)
    save("orient_label", lb, aff)
    # Spacing
    out_shape, new_aff = spacing_grid(im.shape[1:], aff, (1.5, 1.5, 2.0))
    im = resample(im, aff, new_aff, out_shape, 1).astype(np.float32)
    lb = resample(lb, aff, new_aff, out_shape, 0).astype(np.uint8)
    aff = new_aff
    save("spacing_image", im, aff)
    save("spacing_label", lb, aff)
    # ScaleIntensityRange(-57, 164, 0, 1, clip)
    im = ((im - np.float32(-57.0)) / np.float32(164.0 - -57.0)) * np.float32(1.0) + np.float32(0.0)
    im = np.clip(im, 0.0, 1.0).astype(np.float32)
    save("scale_image", im, aff)
    # CropForeground(source_key=image): voxels > 0 in any channel
    mask = (im > 0).any(0)
    lo = [int(np.flatnonzero(mask.any(axis=tuple(a for a in range(3) if a != d))).min()) for d in range(3)]
    hi = [int(np.flatnonzero(mask.any(axis=tuple(a for a in range(3) if a != d))).max()) + 1 for d in range(3)]
    sl = (slice(None),) + tuple(slice(l, h) for l, h in zip(lo, hi))
    im, lb = im[sl], lb[sl]
    shift = np.eye(4)
    shift[:3, 3] = lo
    aff = aff @ shift
    save("crop_image", im, aff)
    save("crop_label", lb, aff)
    # NormalizeIntensity(nonzero=True) of the cropped image: population std, zeros kept
    nz = im != 0
    vals = im[nz].astype(np.float64)
    norm = np.where(nz, (im - vals.mean()) / vals.std(), im).astype(np.float32)
    save("normalize_image", norm)
    # ResizeWithPadOrCrop(spatial_size=(24, 12, 25)): symmetric pad, then centre crop from n//2 - t//2
    target = (24, 12, 25)
    out = im
    for axis, t in enumerate(target, start=1):
        n = out.shape[axis]
        if n < t:
            pad = [(0, 0)] * 4
            pad[axis] = ((t - n) // 2, t - n - (t - n) // 2)
            out = np.pad(out, pad)
        else:
            start = n // 2 - t // 2
            out = np.take(out, np.arange(start, start + t), axis=axis)
    save("resize_image", out)
    # FgBgToIndices(label, image_key=image, threshold 0)
    fg = (lb > 0).any(0)
    bg = ~fg & (im > 0).any(0)
    save("fg_indices", np.flatnonzero(fg).astype(np.int64))
    save("bg_indices", np.flatnonzero(bg).astype(np.int64))
    with open(os.path.join(outdir, "manifest.json"), "w") as f:
        json.dump(stages, f, indent=1)
    print(f"wrote transform references for {len(stages)} stages to {outdir}")


if __name__ == "__main__":
    main()
