#!/usr/bin/env python3
"""Writes NIfTI reference files with nibabel and what nibabel reads back from them.

Usage: make_nifti_golden.py OUTDIR

For every case it writes OUTDIR/<name>.nii[.gz] and OUTDIR/<name>.expected.bin
(np.asanyarray(img.dataobj) as little-endian bytes in Fortran order), and
OUTDIR/manifest.json with nibabel's dtype, shape, affine (img.affine, exact
float64) and axis codes. medfast's C++ tests compare against these exactly.

Run with Debian's /usr/bin/python3 (python3-nibabel, python3-numpy).
"""
import json
import os
import sys

import nibabel as nib
import numpy as np

RNG = np.random.default_rng(20261121)

DTYPES = ["uint8", "int8", "int16", "uint16", "int32", "uint32", "int64", "uint64", "float32", "float64"]


def data_for(dtype, shape):
    dt = np.dtype(dtype)
    n = int(np.prod(shape))
    if dt.kind == "f":
        v = RNG.standard_normal(n) * 1000
        v[:4] = [0.0, -0.0, np.finfo(dt).max / 2, np.finfo(dt).tiny]
        return v.astype(dt).reshape(shape, order="F")
    info = np.iinfo(dt)
    lo, hi = int(info.min), int(info.max)
    v = RNG.integers(lo, hi, size=n, dtype=dt, endpoint=True)
    v[:2] = [lo, hi]  # extremes, e.g. uint64 above 2^63 is excluded below
    if dtype == "uint64":
        v = (v >> np.uint64(1))  # medfast holds uint64 in int64: keep below 2^63
        v[0] = np.uint64(2**63 - 1)
    return v.reshape(shape, order="F")


def oblique_affine():
    a, b = 0.3, -0.2
    rx = np.array([[1, 0, 0], [0, np.cos(a), -np.sin(a)], [0, np.sin(a), np.cos(a)]])
    rz = np.array([[np.cos(b), -np.sin(b), 0], [np.sin(b), np.cos(b), 0], [0, 0, 1]])
    aff = np.eye(4)
    aff[:3, :3] = rz @ rx @ np.diag([0.7, 0.9, 2.5])
    aff[:3, 3] = [-10.5, 20.25, 5.0]
    return aff


def flipped_affine():
    return np.array([[-0.8, 0, 0, 100.0], [0, -0.8, 0, 90.0], [0, 0, 5.0, -40.0], [0, 0, 0, 1]])


def permuted_affine():
    return np.array([[0, 0, -2.0, 100.0], [0.8, 0, 0, -50.0], [0, -0.8, 0, 30.0], [0, 0, 0, 1]])


CASES = []


def case(name, data, affine=None, *, version=1, gz=False, endian="<", qform=1, sform=1, slope=None,
         inter=None, qform_affine=None, extension=False, pixdim=None):
    CASES.append(dict(name=name, data=data, affine=affine, version=version, gz=gz, endian=endian, qform=qform,
                      sform=sform, slope=slope, inter=inter, qform_affine=qform_affine, extension=extension,
                      pixdim=pixdim))


def build_cases():
    shape = (7, 5, 3)
    for dt in DTYPES:
        for endian in "<>":
            tag = "le" if endian == "<" else "be"
            case(f"dtype_{dt}_{tag}", data_for(dt, shape), flipped_affine(), endian=endian)
            case(f"dtype_{dt}_{tag}_gz", data_for(dt, shape), flipped_affine(), endian=endian, gz=True)
    for dt in ["int16", "uint16", "float64", "int64"]:
        case(f"nifti2_{dt}", data_for(dt, shape), oblique_affine(), version=2)
        case(f"nifti2_{dt}_be_gz", data_for(dt, shape), oblique_affine(), version=2, endian=">", gz=True)
    base = data_for("int16", (6, 4, 5))
    # Affine sources and precedence.
    case("qform_only_oblique", base, oblique_affine(), qform=1, sform=0)
    case("qform_only_flipped", base, flipped_affine(), qform=2, sform=0, gz=True)
    case("qform_only_permuted", base, permuted_affine(), qform=1, sform=0)
    case("sform_only_oblique", base, oblique_affine(), qform=0, sform=2)
    case("sform_only_permuted", base, permuted_affine(), qform=0, sform=4, gz=True)
    case("both_differ", base, oblique_affine(), qform=1, sform=2, qform_affine=flipped_affine())
    case("neither", base, flipped_affine(), qform=0, sform=0, pixdim=(1.5, 2.0, 3.0))
    case("nifti2_qform_only", base, oblique_affine(), version=2, qform=1, sform=0)
    case("nifti2_neither", base, oblique_affine(), version=2, qform=0, sform=0, pixdim=(0.5, 0.25, 4.0))
    # Dimensions.
    case("dims_2d", data_for("float32", (9, 8)), flipped_affine())
    case("dims_4d", data_for("int16", (5, 4, 3, 6)), oblique_affine(), gz=True)
    case("dims_5d", data_for("float32", (4, 3, 2, 1, 3)), flipped_affine())
    case("dims_4d_nifti2_be", data_for("uint16", (5, 4, 3, 2)), oblique_affine(), version=2, endian=">")
    # Scaling (nibabel applies scl_slope/scl_inter; the dtype follows its rules).
    case("scaled_int16", data_for("int16", shape), flipped_affine(), slope=2.5, inter=-10.0)
    case("scaled_int16_be_gz", data_for("int16", shape), flipped_affine(), slope=0.125, inter=3.0, endian=">", gz=True)
    case("scaled_uint8_inter_only", data_for("uint8", shape), flipped_affine(), slope=1.0, inter=-100.0)
    case("scaled_uint16", data_for("uint16", shape), flipped_affine(), slope=0.5, inter=0.0)
    case("scaled_int32", data_for("int32", shape), flipped_affine(), slope=1.5, inter=2.0)
    case("scaled_float32", data_for("float32", shape), flipped_affine(), slope=3.0, inter=1.0)
    case("scaled_float64", data_for("float64", shape), flipped_affine(), slope=0.1, inter=0.2)
    case("scaled_nifti2_int16", data_for("int16", shape), flipped_affine(), version=2, slope=0.3, inter=-1.5)
    case("scaled_nifti2_float32", data_for("float32", shape), flipped_affine(), version=2, slope=2.0, inter=0.5)
    # Extensions are skipped: the data starts at vox_offset.
    case("with_extension", base, oblique_affine(), extension=True)
    case("with_extension_gz", base, oblique_affine(), extension=True, gz=True, version=2)


def write_case(c, outdir):
    klass = nib.Nifti2Image if c["version"] == 2 else nib.Nifti1Image
    hdr_class = nib.Nifti2Header if c["version"] == 2 else nib.Nifti1Header
    hdr = hdr_class(endianness=c["endian"])
    data = c["data"]
    hdr.set_data_dtype(data.dtype)
    img = klass(data, None, header=hdr)
    aff = c["affine"]
    img.header.set_qform(c["qform_affine"] if c["qform_affine"] is not None else aff, code=c["qform"])
    img.header.set_sform(aff, code=c["sform"])
    if c["pixdim"] is not None:
        zooms = list(img.header.get_zooms())
        zooms[:3] = c["pixdim"]
        img.header.set_zooms(zooms)
    if c["slope"] is not None:
        img.header.set_slope_inter(c["slope"], c["inter"])
    if c["extension"]:
        img.header.extensions.append(nib.nifti1.Nifti1Extension(6, b"medfast golden test comment\x00"))
    ext = ".nii.gz" if c["gz"] else ".nii"
    path = os.path.join(outdir, c["name"] + ext)
    if c["slope"] is not None:
        # nibabel would rescale the data on save; write the raw values with
        # the scaling fields exactly as given instead.
        _write_raw(img, path, c)
    else:
        nib.save(img, path)
    return path


def _write_raw(img, path, c):
    """Writes header + raw data with the header's scl fields untouched."""
    import gzip
    hdr = img.header.copy()
    hdr.set_slope_inter(c["slope"], c["inter"])
    data = np.asarray(c["data"])
    hdr.set_data_shape(data.shape)
    hdr.set_data_dtype(data.dtype)
    offset = hdr.single_vox_offset if hasattr(hdr, "single_vox_offset") else 352
    hdr["vox_offset"] = offset
    raw = hdr.binaryblock + b"\x00" * (offset - len(hdr.binaryblock))
    raw += data.astype(data.dtype.newbyteorder(c["endian"])).tobytes(order="F")
    if c["gz"]:
        with gzip.open(path, "wb") as f:
            f.write(raw)
    else:
        with open(path, "wb") as f:
            f.write(raw)


def main():
    outdir = sys.argv[1]
    os.makedirs(outdir, exist_ok=True)
    build_cases()
    manifest = []
    for c in CASES:
        path = write_case(c, outdir)
        img = nib.load(path)
        arr = np.asanyarray(img.dataobj)
        # Check the file really has the byte order we asked for.
        assert img.header.endianness == c["endian"], (path, img.header.endianness)
        expected = os.path.join(outdir, c["name"] + ".expected.bin")
        with open(expected, "wb") as f:
            f.write(arr.astype(arr.dtype.newbyteorder("<")).tobytes(order="F"))
        manifest.append(dict(
            file=os.path.basename(path),
            expected=os.path.basename(expected),
            dtype=str(arr.dtype.newbyteorder("=").name),
            disk_dtype=str(np.dtype(c["data"].dtype).name),
            shape=list(arr.shape),
            affine=[[float(v) for v in row] for row in img.affine],
            axcodes="".join(nib.aff2axcodes(img.affine)),
            version=c["version"],
            big_endian=c["endian"] == ">",
            gz=c["gz"],
        ))
    with open(os.path.join(outdir, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=1)
    print(f"wrote {len(manifest)} golden NIfTI cases to {outdir}")


if __name__ == "__main__":
    main()
