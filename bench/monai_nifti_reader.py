#!/usr/bin/env python3
"""A MONAI 1.3 ImageReader for NIfTI-1 (.nii, .nii.gz) written with gzip and numpy only, for the
GPU campaign's MONAI twin where nibabel cannot run (the lent image: numpy 2, no package registry;
Debian 12's nibabel 5.0 fails on `import nibabel` there).

It mirrors what MONAI 1.3.2's NibabelReader gives on nibabel 5.0, field for field, so that
LoadImaged -> EnsureChannelFirstd -> Orientationd -> Spacingd produce the same tensors and meta:
  header   the 348-byte NIfTI-1 header as nibabel's structured dtype, byte order guessed as
           nibabel does (dim[0] in 1..7, else sizeof_hdr), with nibabel's load-time fixes
           (sizeof_hdr, bitpix, zero/negative pixdim, qfac, unknown xform codes -> 0) and
           refusals (unknown datatype, bad magic, vox_offset below 352); then, as nibabel's image
           does, vox_offset set to 0 and scl_slope/scl_inter to nan in the header it reports;
  affine   sform when sform_code > 0, else the qform (quaternion, computed in long double as
           nibabel does), else nibabel's base affine (pixdim diagonal, x flipped, centred);
           then MONAI's correct_nifti_header_if_necessary (sform replaced by the qform, or pixdim
           replaced by the affine's column norms, where pixdim disagrees with the affine);
  data     vox_offset onwards, Fortran order, the file's dtype and byte order; scaled in float64
           (x * slope + inter) where scl_slope is finite, non-zero and not (1, 0), as nibabel;
           returned C-contiguous (np.asanyarray(img.dataobj, order="C"));
  meta     dict(header) (0-d arrays, little endian), affine, original_affine,
           as_closest_canonical, spatial_shape, space (RAS), original_channel_dim; images in a
           list are stacked as NibabelReader stacks them.
Not supported (a clear error, never a silent difference): NIfTI-2, .hdr/.img pairs, complex and
RGB data, as_closest_canonical=True, the FreeSurfer dim hacks, and a header whose qform would need
rewriting from the sform (nibabel's set_qform).

    /usr/bin/python3 bench/monai_nifti_reader.py --self-test [--monai DIR] [--medfast build/medfast]

--self-test compares it with MONAI's NibabelReader (nibabel on this machine) on `medfast data
synth` files and on nibabel-written variants (qform only, no xform, qfac -1, oblique, scaled
int16 and float32, uint8, float64, big endian, .nii, 4D, headers MONAI rectifies): data, dtype,
affine and every meta entry equal; then the spleen recipe's deterministic chain (LoadImaged with
either reader, EnsureChannelFirstd, Orientationd, Spacingd, ...) gives equal tensors and meta.
"""
import gzip
import os
import sys

import numpy as np

HEADER_DTYPE = [  # nibabel's nifti1 header_dtype: names, types and order (dict(header) keeps it)
    ("sizeof_hdr", "i4"), ("data_type", "S10"), ("db_name", "S18"), ("extents", "i4"),
    ("session_error", "i2"), ("regular", "S1"), ("dim_info", "u1"), ("dim", "i2", (8,)),
    ("intent_p1", "f4"), ("intent_p2", "f4"), ("intent_p3", "f4"), ("intent_code", "i2"),
    ("datatype", "i2"), ("bitpix", "i2"), ("slice_start", "i2"), ("pixdim", "f4", (8,)),
    ("vox_offset", "f4"), ("scl_slope", "f4"), ("scl_inter", "f4"), ("slice_end", "i2"),
    ("slice_code", "u1"), ("xyzt_units", "u1"), ("cal_max", "f4"), ("cal_min", "f4"),
    ("slice_duration", "f4"), ("toffset", "f4"), ("glmax", "i4"), ("glmin", "i4"),
    ("descrip", "S80"), ("aux_file", "S24"), ("qform_code", "i2"), ("sform_code", "i2"),
    ("quatern_b", "f4"), ("quatern_c", "f4"), ("quatern_d", "f4"), ("qoffset_x", "f4"),
    ("qoffset_y", "f4"), ("qoffset_z", "f4"), ("srow_x", "f4", (4,)), ("srow_y", "f4", (4,)),
    ("srow_z", "f4", (4,)), ("intent_name", "S16"), ("magic", "S4"),
]
# NIfTI-1 datatype codes this reader decodes (nibabel's names); complex, RGB and float128 are refused.
DATATYPES = {2: "u1", 4: "i2", 8: "i4", 16: "f4", 64: "f8", 256: "i1", 512: "u2", 768: "u4", 1024: "i8", 1280: "u8"}
KNOWN_DATATYPES = set(DATATYPES) | {32, 128, 1536, 1792, 2048, 2304}  # nibabel knows these: refused here, not "unknown"
SINGLE_VOX_OFFSET = 352
XFORM_CODES = (0, 1, 2, 3, 4, 5)
QUATERNION_THRESHOLD = -np.finfo(np.float32).eps * 3  # nibabel's Nifti1Header.quaternion_threshold
FLOAT_EPS = np.finfo(np.float64).eps


class NiftiImage:
    """What read() returns: the file's header (as nibabel holds it after loading), its affine, and
    the bytes the data are decoded from in get_data()."""

    def __init__(self, path, header, affine, raw, data_dtype, offset, slope, inter):
        self.path, self.header, self.affine, self.raw = path, header, affine, raw
        self.data_dtype, self.offset, self.slope, self.inter = data_dtype, offset, slope, inter

    @property
    def shape(self):
        dim = self.header["dim"]
        return tuple(int(d) for d in dim[1:int(dim[0]) + 1])


def _dtype(order):
    return np.dtype(HEADER_DTYPE).newbyteorder(order)


def _guessed_order(raw):
    """nibabel's AnalyzeHeader.guessed_endian: dim[0] in 1..7 on the native reading, else sizeof_hdr."""
    native = "<" if sys.byteorder == "little" else ">"
    swapped = ">" if native == "<" else "<"
    hdr = np.frombuffer(raw, _dtype(native), 1)[0]
    dim0 = int(hdr["dim"][0])
    if dim0 == 0:
        return swapped if hdr["sizeof_hdr"] == 1543569408 else native  # 348 byte-swapped
    return native if 1 <= dim0 <= 7 else swapped


def _check_fix(hdr, path):
    """nibabel's Nifti1Header checks on load: fix what it fixes, refuse what it refuses (level >= 40)."""
    if hdr["sizeof_hdr"] != 348:
        hdr["sizeof_hdr"] = 348
    code = int(hdr["datatype"])
    if code not in KNOWN_DATATYPES:
        raise ValueError(f"{path}: NIfTI datatype code {code} not recognized")
    if code not in DATATYPES:
        raise NotImplementedError(f"{path}: NIfTI datatype {code} (complex, RGB or float128) is not read by this reader")
    bitpix = np.dtype(DATATYPES[code]).itemsize * 8
    if hdr["bitpix"] != bitpix:
        hdr["bitpix"] = bitpix
    spatial = hdr["pixdim"][1:4]
    if np.any(spatial <= 0):
        spatial[spatial == 0] = 1
        hdr["pixdim"][1:4] = np.abs(spatial)
    if hdr["pixdim"][0] not in (-1, 1):
        hdr["pixdim"][0] = 1
    magic = hdr["magic"].item()
    if magic == b"ni1":
        raise NotImplementedError(f"{path}: a NIfTI-1 .hdr/.img pair; this reader reads single files only")
    if magic != b"n+1":
        raise ValueError(f"{path}: magic string {magic!r} is not valid")
    offset = hdr["vox_offset"].item()
    if offset < SINGLE_VOX_OFFSET:  # nibabel refuses 0 < offset < 352; at 0 it would read the header as data
        raise ValueError(f"{path}: vox offset {offset:g} too low for single file nifti1")
    for name in ("qform_code", "sform_code"):
        if int(hdr[name]) not in XFORM_CODES:
            hdr[name] = 0


def _sform(hdr):
    out = np.eye(4)
    out[0, :], out[1, :], out[2, :] = hdr["srow_x"][:], hdr["srow_y"][:], hdr["srow_z"][:]
    return out


def _qform(hdr):
    """nibabel's Nifti1Header.get_qform: fillpositive + quat2mat in long double (nibabel's MAX_FLOAT)."""
    xyz = np.asarray([hdr["quatern_b"], hdr["quatern_c"], hdr["quatern_d"]], dtype=np.longdouble)
    w2 = 1.0 - np.dot(xyz, xyz)
    if w2 < 0:
        if w2 < QUATERNION_THRESHOLD:
            raise ValueError(f"w2 should be positive, but is {w2:e}")
        w = 0
    else:
        w = np.sqrt(w2)
    w, x, y, z = np.r_[w, xyz]
    nq = w * w + x * x + y * y + z * z
    if nq < FLOAT_EPS:
        rot = np.eye(3)
    else:
        s = 2.0 / nq
        X, Y, Z = x * s, y * s, z * s
        wX, wY, wZ = w * X, w * Y, w * Z
        xX, xY, xZ = x * X, x * Y, x * Z
        yY, yZ, zZ = y * Y, y * Z, z * Z
        rot = np.array([[1.0 - (yY + zZ), xY - wZ, xZ + wY],
                        [xY + wZ, 1.0 - (xX + zZ), yZ - wX],
                        [xZ - wY, yZ + wX, 1.0 - (xX + yY)]])
    vox = hdr["pixdim"][1:4].copy()
    if np.any(vox < 0):
        raise ValueError("pixdims[1,2,3] should be positive")
    qfac = hdr["pixdim"][0]
    if qfac not in (-1, 1):
        raise ValueError("qfac (pixdim[0]) should be 1 or -1")
    vox[-1] *= qfac
    out = np.eye(4)
    out[0:3, 0:3] = np.dot(rot, np.diag(vox))
    out[0:3, 3] = [hdr["qoffset_x"], hdr["qoffset_y"], hdr["qoffset_z"]]
    return out


def _base_affine(hdr):
    """nibabel's AnalyzeHeader.get_base_affine (shape_zoom_affine, x flipped, origin at the centre)."""
    ndim = int(hdr["dim"][0])
    shape, zooms = np.asarray(hdr["dim"][1:ndim + 1]), np.array(hdr["pixdim"][1:ndim + 1])
    if ndim >= 3:
        shape, zooms = shape[:3], zooms[:3]
    else:
        full_shape, full_zooms = np.ones((3,)), np.ones((3,))
        full_shape[:ndim], full_zooms[:ndim] = shape[:], zooms[:]
        shape, zooms = full_shape, full_zooms
    zooms[0] *= -1
    origin = (shape - 1) / 2.0
    aff = np.eye(4)
    aff[:3, :3] = np.diag(zooms)
    aff[:3, -1] = -origin * zooms
    return aff


def _best_affine(hdr):
    if hdr["sform_code"] != 0:
        return _sform(hdr)
    if hdr["qform_code"] != 0:
        return _qform(hdr)
    return _base_affine(hdr)


def _zooms(hdr):
    ndim = int(hdr["dim"][0])
    return (1.0,) if ndim == 0 else tuple(hdr["pixdim"][1:ndim + 1])


def _rectify(hdr, affine, path):
    """MONAI's correct_nifti_header_if_necessary + rectify_header_sform_qform on nibabel's image;
    returns the (possibly new) affine, and changes hdr as nibabel's setters would."""
    from monai.data.utils import affine_to_spacing

    dim = int(hdr["dim"][0])
    if dim >= 5:
        return affine
    pixdim = np.asarray(_zooms(hdr))[:dim]
    if np.allclose(pixdim, affine_to_spacing(affine, r=dim)):
        return affine
    sform, qform = _sform(hdr), _qform(hdr)
    sform_mismatch = not np.allclose(affine_to_spacing(sform, r=dim), pixdim)
    qform_mismatch = not np.allclose(affine_to_spacing(qform, r=dim), pixdim)
    if hdr["sform_code"] != 0:
        if not sform_mismatch:
            return affine
        if not qform_mismatch:  # img.set_sform(img.get_qform()): srow_* from the qform, the code kept
            hdr["srow_x"][:], hdr["srow_y"][:], hdr["srow_z"][:] = qform[0, :], qform[1, :], qform[2, :]
            return _best_affine(hdr)
    if hdr["qform_code"] != 0:
        if not qform_mismatch:
            return affine
        if not sform_mismatch:
            raise NotImplementedError(f"{path}: its qform disagrees with pixdim and MONAI would rewrite it from "
                                      "the sform (nibabel's set_qform), which this reader does not mirror")
    norm = affine_to_spacing(affine, r=dim)  # img.header.set_zooms(norm)
    if len(norm) != dim or np.any(norm < 0):
        raise ValueError(f"{path}: cannot set zooms {norm} for ndim {dim}")
    hdr["pixdim"][1:dim + 1] = norm
    return affine


def load(path, rectify=True):
    """A NiftiImage for `path` (.nii or .nii.gz), as nibabel.load holds it, then (rectify) as MONAI's
    NibabelReader.read leaves it after correct_nifti_header_if_necessary."""
    path = os.fspath(path)
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        raw = f.read()
    if len(raw) < 348:
        raise ValueError(f"{path}: {len(raw)} bytes, shorter than a NIfTI-1 header")
    if raw[4:7] in (b"n+2", b"ni2"):
        raise NotImplementedError(f"{path}: NIfTI-2 is not read by this reader")
    order = _guessed_order(raw)
    hdr = np.frombuffer(raw, _dtype(order), 1).reshape(()).copy()
    _check_fix(hdr, path)
    dim = hdr["dim"]
    ndim = int(dim[0])
    if not 1 <= ndim <= 7:
        raise ValueError(f"{path}: dim[0] {ndim} outside 1..7")
    shape = tuple(int(d) for d in dim[1:ndim + 1])
    if any(d < 0 for d in shape):
        raise NotImplementedError(f"{path}: negative dimensions {shape} (FreeSurfer's dim hacks) are not read")
    data_dtype = np.dtype(DATATYPES[int(hdr["datatype"])]).newbyteorder(order)
    offset = int(hdr["vox_offset"].item())
    slope, inter = float(hdr["scl_slope"]), float(hdr["scl_inter"])
    if slope == 0 or not np.isfinite(slope):
        slope = inter = None
    elif not np.isfinite(inter):
        raise ValueError(f"{path}: valid slope but invalid intercept {inter}")
    # nibabel's image resets the consumable fields of the header it reports
    hdr["vox_offset"] = 0
    hdr["scl_slope"], hdr["scl_inter"] = np.nan, np.nan
    affine = _best_affine(hdr)
    if rectify:
        affine = _rectify(hdr, affine, path)
    need = offset + int(np.prod(shape, dtype=np.int64)) * data_dtype.itemsize
    if len(raw) < need:
        raise ValueError(f"{path}: {len(raw)} bytes, the header announces {need}")
    return NiftiImage(path, hdr, np.array(affine, dtype=np.float64, copy=True), raw, data_dtype, offset, slope, inter)


def image_data(img):
    """The voxels as np.asanyarray(nibabel_image.dataobj, order="C") gives them."""
    shape = img.shape
    count = int(np.prod(shape, dtype=np.int64))
    arr = np.frombuffer(img.raw, img.data_dtype, count, img.offset).reshape(shape, order="F")
    if img.slope is not None and (img.slope, img.inter) != (1, 0):  # nibabel's apply_read_scaling, float64
        slope, inter = np.atleast_1d(np.float64(img.slope)), np.atleast_1d(np.float64(img.inter))
        arr = np.atleast_1d(arr)
        if slope != 1.0:
            arr = arr * slope
        if inter != 0.0:
            arr = arr + inter
        arr = arr.reshape(shape)
    arr = np.asarray(arr, order="C")
    return arr if arr.flags.writeable else arr.copy()


def _reader_class():
    from monai.data.image_reader import ImageReader, _copy_compatible_dict, _stack_images
    from monai.data.utils import is_no_channel, is_supported_format
    from monai.utils import MetaKeys, SpaceKeys, ensure_tuple

    class NumpyNiftiReader(ImageReader):
        """MONAI's NibabelReader without nibabel: NIfTI-1 single files through gzip and numpy
        (bench/monai_nifti_reader.py). Same arguments; as_closest_canonical=True is refused."""

        def __init__(self, channel_dim=None, as_closest_canonical=False, squeeze_non_spatial_dims=False, **kwargs):
            super().__init__()
            if as_closest_canonical:
                raise NotImplementedError("NumpyNiftiReader does not reorient (as_closest_canonical=True)")
            self.channel_dim = float("nan") if channel_dim == "no_channel" else channel_dim
            self.as_closest_canonical = False
            self.squeeze_non_spatial_dims = squeeze_non_spatial_dims
            self.kwargs = kwargs

        def verify_suffix(self, filename):
            return is_supported_format(filename, ["nii", "nii.gz"])

        def read(self, data, **kwargs):
            filenames = ensure_tuple(data)
            images = [load(name) for name in filenames]
            return images if len(filenames) > 1 else images[0]

        def get_data(self, img):
            img_array, compatible_meta = [], {}
            for i in ensure_tuple(img):
                header = {name: i.header[name] for name in i.header.dtype.names}
                header = {k: v.astype(v.dtype.newbyteorder("<")) for k, v in header.items()}
                header[MetaKeys.AFFINE] = np.array(i.affine, copy=True)
                header[MetaKeys.ORIGINAL_AFFINE] = np.array(i.affine, copy=True)
                header["as_closest_canonical"] = self.as_closest_canonical
                header[MetaKeys.SPATIAL_SHAPE] = self._get_spatial_shape(i)
                header[MetaKeys.SPACE] = SpaceKeys.RAS
                data = image_data(i)
                if self.squeeze_non_spatial_dims:
                    for d in range(len(data.shape), len(header[MetaKeys.SPATIAL_SHAPE]), -1):
                        if data.shape[d - 1] == 1:
                            data = data.squeeze(axis=d - 1)
                img_array.append(data)
                if self.channel_dim is None:  # default to "no_channel" or -1
                    header[MetaKeys.ORIGINAL_CHANNEL_DIM] = (
                        float("nan") if len(data.shape) == len(header[MetaKeys.SPATIAL_SHAPE]) else -1
                    )
                else:
                    header[MetaKeys.ORIGINAL_CHANNEL_DIM] = self.channel_dim
                _copy_compatible_dict(header, compatible_meta)
            return _stack_images(img_array, compatible_meta), compatible_meta

        def _get_spatial_shape(self, img):
            dim = img.header["dim"].astype(img.header["dim"].dtype.newbyteorder("<"))
            ndim = dim[0]
            size = list(dim[1:])
            if not is_no_channel(self.channel_dim):
                size.pop(int(self.channel_dim))
            spatial_rank = max(min(ndim, 3), 1)
            return np.asarray(size[:spatial_rank])

    return NumpyNiftiReader


_CLASS = None


def NumpyNiftiReader(*args, **kwargs):  # noqa: N802 (a class to its callers; built on first use, after MONAI is importable)
    global _CLASS
    if _CLASS is None:
        _CLASS = _reader_class()
    return _CLASS(*args, **kwargs)


# ---------------------------------------------------------------------------------------------
# --self-test: this reader against MONAI's NibabelReader (nibabel), here.

def _equal(a, b):
    """Equal values and types: arrays by dtype, shape and values (nan equal to nan)."""
    import torch
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
            return False
        if a.dtype != b.dtype or a.shape != b.shape:
            return False
        if a.is_floating_point():
            return bool(torch.equal(torch.isnan(a), torch.isnan(b)) and torch.equal(a.nan_to_num(), b.nan_to_num()))
        return bool(torch.equal(a, b))
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        a2, b2 = np.asarray(a), np.asarray(b)
        if a2.dtype != b2.dtype or a2.shape != b2.shape:
            return False
        return bool(np.array_equal(a2, b2, equal_nan=a2.dtype.kind in "fc"))
    if isinstance(a, float) and isinstance(b, float) and np.isnan(a) and np.isnan(b):
        return True
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_equal(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(_equal(x, y) for x, y in zip(a, b))
    return type(a) is type(b) and a == b


def _diff(a, b):
    """The keys of two meta dicts that differ (for the failure message)."""
    if not isinstance(a, dict) or not isinstance(b, dict):
        return f"{a!r} != {b!r}"
    keys = sorted(set(a) ^ set(b))
    keys += [k for k in a if k in b and not _equal(a[k], b[k])]
    return ", ".join(f"{k}: {a.get(k)!r} != {b.get(k)!r}" for k in keys)


def _variants(folder):
    """NIfTI files written with nibabel that exercise the header's paths: {name: path}."""
    import nibabel as nib

    rng = np.random.default_rng(0)
    base = rng.integers(-1000, 1000, size=(20, 18, 12)).astype(np.int16)
    theta = 0.3
    oblique = np.array([[np.cos(theta) * 0.8, -np.sin(theta) * 0.9, 0, -12.5],
                        [np.sin(theta) * 0.8, np.cos(theta) * 0.9, 0, 30.25],
                        [0, 0, 2.5, -7.0], [0, 0, 0, 1]])
    out = {}

    def save(name, img):
        path = os.path.join(folder, name)
        nib.save(img, path)
        out[name] = path
        return path

    save("sform-only-oblique.nii.gz", nib.Nifti1Image(base, oblique))  # nibabel's default: qform_code 0
    img = nib.Nifti1Image(base, oblique)
    img.set_qform(oblique, code=1)
    save("sform-and-qform.nii.gz", img)
    img = nib.Nifti1Image(base, oblique)
    img.set_qform(oblique, code=1)
    img.set_sform(None, code=0)
    save("qform-only.nii.gz", img)
    flip = oblique.copy()
    flip[:3, 2] *= -1  # a left-handed affine: qfac -1
    img = nib.Nifti1Image(base, flip)
    img.set_qform(flip, code=1)
    img.set_sform(None, code=0)
    save("qform-qfac-negative.nii.gz", img)
    img = nib.Nifti1Image(base, np.diag([1.5, 1.5, 3.0, 1.0]))
    img.set_sform(None, code=0)
    img.set_qform(None, code=0)
    save("no-xform-base-affine.nii.gz", img)
    hdr = nib.Nifti1Header()
    hdr.set_data_dtype(np.int16)
    img = nib.Nifti1Image(base, oblique, hdr)
    img.header.set_slope_inter(0.5, -1024.0)
    save("int16-scaled.nii.gz", img)
    floats = rng.normal(size=base.shape).astype(np.float32)
    img = nib.Nifti1Image(floats, oblique)
    img.header.set_slope_inter(2.0, 0.25)
    save("float32-scaled.nii.gz", img)
    save("uint8.nii.gz", nib.Nifti1Image((base % 3).astype(np.uint8), oblique))
    save("float64.nii", nib.Nifti1Image(rng.normal(size=base.shape), oblique))
    save("int16.nii", nib.Nifti1Image(base, oblique))
    img = nib.Nifti1Image(np.stack([floats, -floats], axis=-1), oblique)
    save("4d-channel-last.nii.gz", img)
    # big endian: nibabel writes the header's byte order
    hdr = nib.Nifti1Header(endianness=">")
    hdr.set_data_dtype(np.dtype(">i2"))
    save("big-endian.nii.gz", nib.Nifti1Image(base.astype(">i2"), oblique, hdr))
    # pixdim that disagrees with the affine: MONAI sets pixdim from the affine (set_zooms)
    path = save("pixdim-mismatch.nii.gz", nib.Nifti1Image(base, np.diag([0.8, 0.9, 2.5, 1.0])))
    _patch_header(path, {"pixdim[1]": (np.float32, 80, [3.0])})
    # sform disagrees with pixdim, qform agrees: MONAI copies the qform into the sform
    path = save("sform-mismatch.nii.gz", nib.Nifti1Image(base, oblique))
    _patch_header(path, {"srow_x[0]": (np.float32, 280, [2.0])})
    return out


def _patch_header(path, fields):
    """Overwrite little-endian header bytes in a .nii.gz: {label: (dtype, offset, values)}."""
    raw = bytearray(gzip.open(path).read())
    for dtype, offset, values in fields.values():
        v = np.asarray(values, dtype=np.dtype(dtype).newbyteorder("<")).tobytes()
        raw[offset:offset + len(v)] = v
    with gzip.open(path, "wb") as f:
        f.write(bytes(raw))


def spleen_deterministic_chain():
    """The spleen recipe's deterministic chain, as examples/spleen.yaml writes it."""
    import yaml

    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples", "spleen.yaml")
    with open(path) as f:
        return yaml.safe_load(f)["data"]["deterministic"]


def image_only(step):
    """A step of `spleen_deterministic_chain` on the image key alone (its first mode, where it has several)."""
    step = dict(step)
    step["keys"] = ["image"] if isinstance(step["keys"], list) else step["keys"]
    if isinstance(step.get("mode"), list):
        step["mode"] = step["mode"][:1]
    return step


def self_test(monai_path, medfast, synth_dir=None):
    import subprocess
    import tempfile
    import time

    here = os.path.dirname(os.path.abspath(__file__))
    sys.path.insert(0, here)
    import monai_peer

    t0 = time.perf_counter()
    monai = monai_peer.load(monai_path)
    if monai is None:
        return 2
    import nibabel
    import torch

    if getattr(nibabel, "ORIENTATIONS_ONLY", False):
        print(f"monai_nifti_reader: the self-test needs the whole nibabel; {nibabel.__file__} is .gpu-peers' "
              "orientations-only one (pass --monai with a MONAI folder that has no nibabel beside it)", file=sys.stderr)
        return 2
    failures, checks = [], 0
    recipe = spleen_deterministic_chain()  # image and label (medfast synth files)
    chain = [image_only(step) for step in recipe[:5]]  # LoadImage .. ScaleIntensityRange, for image-only files
    ours = NumpyNiftiReader()
    ref = monai.data.NibabelReader()

    def check(what, ok, detail=""):
        nonlocal checks
        checks += 1
        if not ok:
            failures.append(f"{what}: {detail}")

    def compare_chain(name, items, steps):
        a = monai.transforms.Compose(monai_peer.transforms(monai, steps, reader=ours))
        b = monai.transforms.Compose(monai_peer.transforms(monai, steps))  # MONAI's NibabelReader
        for item in items:
            x, y = a(dict(item)), b(dict(item))
            check(f"{name} {os.path.basename(item['image'])}: chain keys", x.keys() == y.keys(),
                  f"{sorted(x)} != {sorted(y)}")
            for k in y:
                tx, ty = x[k], y[k]
                if isinstance(ty, torch.Tensor):
                    check(f"{name} {os.path.basename(item['image'])}: {k} tensor",
                          _equal(tx.as_tensor() if hasattr(tx, "as_tensor") else tx,
                                 ty.as_tensor() if hasattr(ty, "as_tensor") else ty),
                          f"{tuple(tx.shape)} {tx.dtype} vs {tuple(ty.shape)} {ty.dtype}")
                    if hasattr(ty, "meta"):
                        check(f"{name} {os.path.basename(item['image'])}: {k} meta affine",
                              _equal(tx.affine, ty.affine), f"{tx.affine} != {ty.affine}")
                        check(f"{name} {os.path.basename(item['image'])}: {k} meta",
                              _equal(dict(tx.meta), dict(ty.meta)), _diff(dict(tx.meta), dict(ty.meta)))
                else:
                    check(f"{name}: {k}", _equal(tx, ty), f"{tx!r} != {ty!r}")

    with tempfile.TemporaryDirectory(prefix="monai-nifti-reader-") as tmp:
        files = _variants(tmp)
        synth, out = [], synth_dir
        if out is None and medfast and os.access(medfast, os.X_OK):
            out = os.path.join(tmp, "synth")
            subprocess.run([medfast, "data", "synth", "--out", out, "--cases", "2", "--size", "64,64,20-24",
                            "--seed", "0"], check=True, stdout=subprocess.DEVNULL)
        if out is not None:
            for case in sorted(os.listdir(os.path.join(out, "imagesTr"))):
                synth.append({"image": os.path.join(out, "imagesTr", case), "label": os.path.join(out, "labelsTr", case)})
                files["synth " + case], files["synth label " + case] = synth[-1]["image"], synth[-1]["label"]
        else:
            print(f"monai_nifti_reader: no medfast binary at {medfast}: nibabel-written files only", file=sys.stderr)
        # 1. the reader alone: data, dtype, affine and every meta entry as NibabelReader's
        for name, path in files.items():
            try:
                (xa, ma), (xb, mb) = ours.get_data(ours.read(path)), ref.get_data(ref.read(path))
            except Exception as e:  # noqa: BLE001 (a failure to report, with the others)
                check(f"{name}: read", False, f"{type(e).__name__}: {e}")
                continue
            check(f"{name}: data", _equal(np.asarray(xa), np.asarray(xb)),
                  f"{xa.dtype}{xa.shape} vs {xb.dtype}{xb.shape}")
            check(f"{name}: affine", _equal(ma["affine"], mb["affine"]), f"\n{ma['affine']}\n!=\n{mb['affine']}")
            check(f"{name}: meta", _equal(ma, mb), _diff(ma, mb))
            # and, before MONAI's header correction, the affine and voxels as nibabel.load gives them
            nib_img, own = nibabel.load(path), load(path, rectify=False)
            check(f"{name}: nibabel affine", _equal(own.affine, np.asarray(nib_img.affine)),
                  f"\n{own.affine}\n!=\n{nib_img.affine}")
            check(f"{name}: nibabel data", _equal(image_data(own), np.asarray(np.asanyarray(nib_img.dataobj))),
                  f"{image_data(own).dtype} vs {nib_img.dataobj.dtype}")
        # 2. LoadImaged with either reader, then the recipe's chain: same tensors and meta
        singles = [{"image": p} for n, p in files.items() if not n.startswith("synth") and not n.startswith("4d")]
        compare_chain("chain", singles, chain)
        if synth:
            compare_chain("recipe", synth, recipe)
    seconds = time.perf_counter() - t0
    where = f"numpy {np.__version__}, nibabel {nibabel.__version__}, torch {torch.__version__}, MONAI {monai.__version__}"
    if failures:
        print(f"monai_nifti_reader self-test: {len(failures)} of {checks} checks failed ({where}):", file=sys.stderr)
        for f in failures:
            print("  " + f, file=sys.stderr)
        return 1
    print(f"monai_nifti_reader self-test: {checks} checks passed on {len(files)} files, "
          f"{len(synth)} medfast synth cases through the recipe's chain ({where}; {seconds:.1f} s)")
    return 0


def main():
    import argparse

    here = os.path.dirname(os.path.abspath(__file__))
    sys.path.insert(0, here)
    import monai_peer

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--self-test", action="store_true", help="compare with MONAI's NibabelReader (needs nibabel)")
    ap.add_argument("--medfast", default=os.path.join(os.path.dirname(here), "build", "medfast"),
                    help="medfast binary for `data synth` files (default: %(default)s; absent: nibabel files only)")
    ap.add_argument("--synth", default=None, help="a `medfast data synth` folder to use instead of making one")
    monai_peer.add_argument(ap)
    a = ap.parse_args()
    if not a.self_test:
        ap.print_help()
        return 2
    return self_test(a.monai, a.medfast, a.synth)


if __name__ == "__main__":
    sys.exit(main())
