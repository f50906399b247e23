#!/usr/bin/env python3
"""Writes synthetic DICOM CT series and SEG objects with pydicom, and what an independent
pydicom + numpy reader gets back from them.

Usage: /usr/bin/python3 make_dicom_golden.py OUTDIR

Everything goes under OUTDIR/dicom/ (removed and recreated on every run):
  ct/<case>/...            CT series (file names random hex, InstanceNumber shuffled)
  seg/<case>.dcm           DICOM SEG objects on the ct/axial series
  errors/<case>/...        inputs medfast must refuse
  <case>.voxels.bin        expected voxels: little-endian bytes, x fastest (Fortran order
                           of the [x][y][z] array, i.e. each sorted slice's rows in turn)
  manifest.json            {"phi", "series", "segs", "errors"}: see main()

The expectations are NOT the writer's arrays: every file is read back from disk with
pydicom, sorted along the slice normal, rescaled and given an affine by the reader in
this script (read_ct / read_seg), following medfast's conventions (MONAI's
PydicomReader): voxel [x][y][z] is column x, row y of the z-th slice sorted by
IPP . (row_dir x col_dir); the affine is RAS (LPS with rows 0 and 1 negated).
Compressed copies are made with dcmtk (dcmcjpeg, dcmcjpls) and pydicom (RLE); where
pydicom cannot decode a syntax, dcmtk decompresses a copy that pydicom then reads.

Run with Debian's /usr/bin/python3 (python3-pydicom, python3-numpy) and dcmtk installed.
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np
import pydicom
from pydicom.dataset import Dataset, FileMetaDataset
from pydicom.encaps import encapsulate
from pydicom.errors import InvalidDicomError
from pydicom.uid import ExplicitVRLittleEndian, RLELossless, generate_uid

RNG = np.random.default_rng(20261122)

# Fake patient identifiers carried by every DICOM file; tests check they never leak.
PHI = {"PatientName": "Doe^Jane", "PatientID": "PHI-12345", "PatientBirthDate": "19700101",
       "AccessionNumber": "ACC-99999", "InstitutionName": "General Hospital"}

CT_IMAGE = "1.2.840.10008.5.1.4.1.1.2"
ENHANCED_CT = "1.2.840.10008.5.1.4.1.1.2.1"
RT_DOSE = "1.2.840.10008.5.1.4.1.1.481.2"
RT_STRUCT = "1.2.840.10008.5.1.4.1.1.481.3"
EXPLICIT_BIG_ENDIAN = "1.2.840.10008.1.2.2"
SEG_STORAGE = "1.2.840.10008.5.1.4.1.1.66.4"
JPEG_LOSSLESS_SV1 = "1.2.840.10008.1.2.4.70"
JPEG_LS_LOSSLESS = "1.2.840.10008.1.2.4.80"
JPEG_LS_NEAR = "1.2.840.10008.1.2.4.81"
JPEG_BASELINE = "1.2.840.10008.1.2.4.50"
JPEG_LOSSLESS = "1.2.840.10008.1.2.4.57"
J2K_LOSSLESS = "1.2.840.10008.1.2.4.90"
LOSSY = (JPEG_LS_NEAR, JPEG_BASELINE)  # and lossless JPEG with a point transform
MPEG2 = "1.2.840.10008.1.2.4.100"
DCMTK = ["dcmcjpeg", "dcmcjpls", "dcmdump", "dcmdjpeg", "dcmdjpls"]
OPENJPEG = ["opj_compress", "opj_decompress"]  # libopenjp2-tools: JPEG 2000 codestreams

# 41 x 30: an odd column count catches row/column mix-ups, and 1230 bits per frame is not
# a whole number of bytes, so the SEG's bit packing really runs across frames.
COLS, ROWS, NZ = 41, 30, 12


def uid(*parts):
    """Deterministic UID from a few strings (same run, same UIDs)."""
    return generate_uid(entropy_srcs=["medfast-dicom-golden", *map(str, parts)])


STUDY_UID, FRAME_OF_REF_UID, IMPLEMENTATION_UID = uid("study"), uid("frame of reference"), uid("impl")


def ds_str(v):
    """A DS value string (at most 16 characters): fixed-point, trailing zeros dropped."""
    s = f"{float(v):.6f}".rstrip("0").rstrip(".")
    return "0" if s in ("", "-0") else s


def hex_name(ext=""):
    return RNG.bytes(5).hex() + ext


# ----------------------------------------------------------------------------- writer

def new_dataset(sop_class, sop_uid, series_uid, modality, series_number, ts=ExplicitVRLittleEndian):
    """File meta + patient/study/series modules (with the fake PHI)."""
    meta = FileMetaDataset()
    meta.FileMetaInformationVersion = b"\x00\x01"
    meta.MediaStorageSOPClassUID = sop_class
    meta.MediaStorageSOPInstanceUID = sop_uid
    meta.TransferSyntaxUID = ts
    meta.ImplementationClassUID = IMPLEMENTATION_UID
    ds = Dataset()
    ds.file_meta = meta
    ds.is_little_endian, ds.is_implicit_VR = True, False
    ds.SOPClassUID, ds.SOPInstanceUID = sop_class, sop_uid
    ds.StudyDate, ds.StudyTime, ds.Modality = "20240102", "101500", modality
    for k, v in PHI.items():
        setattr(ds, k, v)
    ds.PatientSex = "F"
    ds.StudyInstanceUID, ds.SeriesInstanceUID = STUDY_UID, series_uid
    ds.FrameOfReferenceUID, ds.SeriesNumber, ds.StudyID = FRAME_OF_REF_UID, series_number, "1"
    return ds


def set_pixels(ds, frames, bits=16, signed=True):
    """Image pixel module; frames: (rows, cols) or (n, rows, cols) integers."""
    ds.SamplesPerPixel, ds.PhotometricInterpretation = 1, "MONOCHROME2"
    ds.Rows, ds.Columns = frames.shape[-2], frames.shape[-1]
    ds.BitsAllocated, ds.BitsStored, ds.HighBit = bits, bits, bits - 1
    ds.PixelRepresentation = 1 if signed else 0
    dtype = {32: "<i4" if signed else "<u4", 16: "<i2" if signed else "<u2", 8: "u1"}[bits]
    ds.add_new(0x7FE00010, "OB" if bits == 8 else "OW", frames.astype(dtype).tobytes())


def save(ds, path):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    pydicom.dcmwrite(path, ds, write_like_original=False)  # preamble + file meta


def shuffled(n):
    """A permutation of range(n) that is neither ascending nor descending."""
    while True:
        p = RNG.permutation(n)
        if n < 3 or (list(p) != sorted(p) and list(p) != sorted(p, reverse=True)):
            return p


def hu_volume(nz, rows, cols, lo=-1000, hi=2000):
    """Smooth pattern plus noise over lo..hi HU, (nz, rows, cols), with both extremes."""
    z, y, x = np.meshgrid(np.arange(nz), np.arange(rows), np.arange(cols), indexing="ij")
    smooth = np.sin(x / 5.0 + z / 4.0) * np.cos(y / 4.0 - z / 6.0)
    v = np.clip(np.rint((lo + hi) / 2 + (hi - lo) / 2 * smooth + RNG.normal(0, 60, smooth.shape)), lo, hi)
    v.flat[0], v.flat[-1] = lo, hi
    return v


def geometry(iop, spacing, origin, gap, nz, displace=None):
    """IOP (row dir, col dir), PixelSpacing [between rows, between cols] and IPPs along the normal."""
    row, col = np.array(iop[:3], float), np.array(iop[3:], float)
    n = np.cross(row, col)
    ipps = [np.array(origin, float) + k * gap * n for k in range(nz)]
    if displace:  # {slice: mm along the normal}
        for k, mm in displace.items():
            ipps[k] = ipps[k] + mm * n
    return dict(iop=list(iop), spacing=list(spacing), ipps=ipps, thickness=gap)


def write_ct(folder, stored, geo, slopes, intercepts, series_uid, series_number=1, ext="", bits=16):
    """One file per slice; stored (nz, rows, cols) int16 in spatial order. Files are written
    in a shuffled order with random names and shuffled InstanceNumbers. Returns one record
    per slice in spatial order: path, sop_uid, ipp (the DS strings written)."""
    nz = stored.shape[0]
    instance = shuffled(nz) + 1
    records = [None] * nz
    for k in shuffled(nz):
        sop = uid(series_uid, k)
        ds = new_dataset(CT_IMAGE, sop, series_uid, "CT", series_number)
        ds.ImageType = ["ORIGINAL", "PRIMARY", "AXIAL"]
        ds.SeriesDescription = "golden " + os.path.basename(folder)
        ds.InstanceNumber = int(instance[k])
        ipp = [ds_str(v) for v in geo["ipps"][k]]
        ds.ImagePositionPatient = ipp
        ds.ImageOrientationPatient = [ds_str(v) for v in geo["iop"]]
        ds.PixelSpacing = [ds_str(v) for v in geo["spacing"]]
        ds.SliceThickness = ds_str(geo["thickness"])
        ds.RescaleSlope, ds.RescaleIntercept, ds.RescaleType = ds_str(slopes[k]), ds_str(intercepts[k]), "HU"
        set_pixels(ds, stored[k], bits=bits, signed=bits == 16)
        path = os.path.join(folder, hex_name(ext))
        save(ds, path)
        records[k] = dict(path=path, sop_uid=sop, ipp=ipp)
    return records


def write_enhanced(path, stored, geo, intercepts, series_uid):
    """One Enhanced CT file; frames stored in a shuffled spatial order."""
    order = shuffled(stored.shape[0])
    ds = new_dataset(ENHANCED_CT, uid(series_uid, "enhanced"), series_uid, "CT", 7)
    ds.ImageType = ["ORIGINAL", "PRIMARY", "VOLUME", "NONE"]
    ds.InstanceNumber, ds.NumberOfFrames = 1, len(order)
    ds.ContentQualification, ds.BurnedInAnnotation = "PRODUCT", "NO"
    measures = Dataset()
    measures.PixelSpacing = [ds_str(v) for v in geo["spacing"]]
    measures.SliceThickness = ds_str(geo["thickness"])
    orient = Dataset()
    orient.ImageOrientationPatient = [ds_str(v) for v in geo["iop"]]
    shared = Dataset()
    shared.PixelMeasuresSequence, shared.PlaneOrientationSequence = [measures], [orient]
    ds.SharedFunctionalGroupsSequence = [shared]
    per_frame = []
    for k in order:
        pos, pvt, content = Dataset(), Dataset(), Dataset()
        pos.ImagePositionPatient = [ds_str(v) for v in geo["ipps"][k]]
        pvt.RescaleSlope, pvt.RescaleIntercept, pvt.RescaleType = "1", ds_str(intercepts[k]), "HU"
        content.FrameAcquisitionNumber = int(k) + 1
        item = Dataset()
        item.PlanePositionSequence, item.PixelValueTransformationSequence = [pos], [pvt]
        item.FrameContentSequence = [content]
        per_frame.append(item)
    ds.PerFrameFunctionalGroupsSequence = per_frame
    set_pixels(ds, stored[order])
    save(ds, path)


def write_rtdose(path, stored, iop, spacing, ipp, offsets, scaling, series_uid):
    """One multi-frame RT Dose file as treatment planning systems write it: one
    ImagePositionPatient, frames placed by GridFrameOffsetVector, uint32 stored values that
    DoseGridScaling turns into Gy; no functional groups, no RescaleSlope. `scaling` None:
    DoseGridScaling left out."""
    ds = new_dataset(RT_DOSE, uid(series_uid, "dose"), series_uid, "RTDOSE", 11)
    ds.InstanceNumber, ds.NumberOfFrames = 1, stored.shape[0]
    ds.ImagePositionPatient = [ds_str(v) for v in ipp]
    ds.ImageOrientationPatient = [ds_str(v) for v in iop]
    ds.PixelSpacing = [ds_str(v) for v in spacing]
    ds.FrameIncrementPointer = 0x3004000C
    ds.GridFrameOffsetVector = [ds_str(v) for v in offsets]
    ds.DoseUnits, ds.DoseType, ds.DoseSummationType = "GY", "PHYSICAL", "PLAN"
    if scaling is not None:
        ds.DoseGridScaling = ds_str(scaling)
    set_pixels(ds, stored, bits=32, signed=False)
    save(ds, path)


# ROIs of the RT Structure Sets: number -> name, and per ROI its contours in voxel
# coordinates of the reference grid: (slice, [(x, y), ...]). Vertices sit off the voxel
# centres (x.3, y.6...) so that no centre lies on an edge. GTV-1: a convex octagon; Lung: a
# concave C shape with a square hole on some slices and an island in that hole on one;
# Marker: a POINT contour (not filled).
RT_ROIS = {1: "GTV-1", 2: "Lung", 7: "Marker"}


def rt_contours():
    octagon = [(17 + 6.2 * np.cos(a), 14.1 + 5.3 * np.sin(a)) for a in np.arange(8) * np.pi / 4 + 0.2]
    c_shape = [(12.3, 3.6), (36.7, 3.6), (36.7, 9.4), (20.2, 9.4), (20.2, 19.6), (36.7, 19.6), (36.7, 26.4),
               (12.3, 26.4)]
    hole = [(14.4, 11.2), (18.6, 11.2), (18.6, 17.7), (14.4, 17.7)]
    island = [(15.7, 13.3), (17.4, 13.3), (17.4, 15.8), (15.7, 15.8)]
    out = {1: [(k, octagon) for k in (3, 4, 5, 6)],
           2: [(k, c_shape) for k in range(2, 10)] + [(k, hole) for k in (4, 5, 6)] + [(5, island)],
           7: [(5, [(20.5, 15.5)])]}
    return out


def write_rtstruct(path, ct, ref_series=None, off_slice=None, frame_uid=FRAME_OF_REF_UID):
    """An RT Structure Set with RT_ROIS's contours (ContourData in patient mm) on the reference
    series `ct` (its records and geometry); off_slice: move the first contour this many mm
    along the normal."""
    name = os.path.basename(path)
    ds = new_dataset(RT_STRUCT, uid("rtstruct sop", name), uid("rtstruct", name), "RTSTRUCT", 200)
    ds.StructureSetLabel, ds.StructureSetDate, ds.StructureSetTime = "golden", "20240104", "090000"
    geo = ct["geo"]
    row, col = np.array(geo["iop"][:3], float), np.array(geo["iop"][3:], float)
    normal = np.cross(row, col)
    rs_ps, cs_ps = geo["spacing"]  # between rows, between columns
    series_item = Dataset()
    series_item.SeriesInstanceUID = ref_series or ct["series_uid"]
    series_item.ContourImageSequence = []
    for r in ct["records"]:
        ci = Dataset()
        ci.ReferencedSOPClassUID, ci.ReferencedSOPInstanceUID = CT_IMAGE, r["sop_uid"]
        series_item.ContourImageSequence.append(ci)
    study_item = Dataset()
    study_item.ReferencedSOPClassUID, study_item.ReferencedSOPInstanceUID = "1.2.840.10008.3.1.2.3.1", STUDY_UID
    study_item.RTReferencedSeriesSequence = [series_item]
    frame_item = Dataset()
    frame_item.FrameOfReferenceUID, frame_item.RTReferencedStudySequence = frame_uid, [study_item]
    ds.ReferencedFrameOfReferenceSequence = [frame_item]
    ds.StructureSetROISequence, ds.ROIContourSequence, ds.RTROIObservationsSequence = [], [], []
    first = True
    for number, roi_name in RT_ROIS.items():
        roi = Dataset()
        roi.ROINumber, roi.ReferencedFrameOfReferenceUID, roi.ROIName = number, frame_uid, roi_name
        roi.ROIGenerationAlgorithm = "MANUAL"
        ds.StructureSetROISequence.append(roi)
        rc = Dataset()
        rc.ReferencedROINumber, rc.ROIDisplayColor, rc.ContourSequence = number, [255, 0, 0], []
        for k, points in rt_contours()[number]:
            origin = np.array([float(v) for v in ct["records"][k]["ipp"]])
            mm = [origin + x * cs_ps * row + y * rs_ps * col for x, y in points]
            if off_slice is not None and first:
                mm = [p + off_slice * normal for p in mm]
                first = False
            contour = Dataset()
            contour.ContourGeometricType = "POINT" if len(points) == 1 else "CLOSED_PLANAR"
            contour.NumberOfContourPoints = len(points)
            contour.ContourData = [ds_str(v) for p in mm for v in p]
            rc.ContourSequence.append(contour)
        ds.ROIContourSequence.append(rc)
        obs = Dataset()
        obs.ObservationNumber, obs.ReferencedROINumber, obs.RTROIInterpretedType = number, number, "ORGAN"
        ds.RTROIObservationsSequence.append(obs)
    save(ds, path)
    return path


def code(value, scheme, meaning):
    c = Dataset()
    c.CodeValue, c.CodingSchemeDesignator, c.CodeMeaning = value, scheme, meaning
    return c


# Segments of the SEG objects: (number, SegmentLabel, SegmentDescription or None).
SEGMENTS = [(1, "GTV-1", None), (2, "lung", "Lung")]


def seg_masks():
    """Truth masks per segment number, (nz, rows, cols) bool on the axial grid; they overlap."""
    z, y, x = np.meshgrid(np.arange(NZ), np.arange(ROWS), np.arange(COLS), indexing="ij")
    gtv = ((x - 17) / 6.0) ** 2 + ((y - 14) / 5.0) ** 2 + ((z - 5) / 2.2) ** 2 <= 1
    lung = (((x - 25) / 10.0) ** 2 + ((y - 12) / 8.0) ** 2 <= 1) & (z >= 2) & (z <= 9)
    assert (gtv & lung).any() and (gtv & ~lung).any() and (lung & ~gtv).any()
    return {1: gtv, 2: lung}


def write_seg(path, ct, masks, fractional=False, derivation=True, ref_series=None, off_slice=None):
    """A SEG with one frame per (segment, slice) where the segment is present, shuffled.
    ct: the reference series' records (spatial order) and geometry; off_slice: move the
    first frame's IPP this many mm along the normal."""
    frames = [(s, k) for s, _, _ in SEGMENTS for k in range(NZ) if masks[s][k].any()]
    frames = [frames[i] for i in shuffled(len(frames))]
    name = os.path.basename(path)  # UIDs must not depend on OUTDIR
    series_uid = uid("seg", name)
    ds = new_dataset(SEG_STORAGE, uid("seg sop", name), series_uid, "SEG", 100)
    ds.ImageType, ds.InstanceNumber = ["DERIVED", "PRIMARY"], 1
    ds.ContentLabel, ds.ContentDescription, ds.ContentCreatorName = "SEGMENTATION", "golden", "Golden^Writer"
    ds.ContentDate, ds.ContentTime = "20240103", "120000"
    ds.SeriesDescription, ds.LossyImageCompression = "golden seg", "00"
    ds.NumberOfFrames = len(frames)
    refs = []
    for r in ct["records"]:
        ri = Dataset()
        ri.ReferencedSOPClassUID, ri.ReferencedSOPInstanceUID = CT_IMAGE, r["sop_uid"]
        refs.append(ri)
    rs = Dataset()
    rs.SeriesInstanceUID, rs.ReferencedInstanceSequence = ref_series or ct["series_uid"], refs
    ds.ReferencedSeriesSequence = [rs]
    segs = []
    for number, label, desc in SEGMENTS:
        item = Dataset()
        item.SegmentNumber, item.SegmentLabel, item.SegmentAlgorithmType = number, label, "MANUAL"
        if desc is not None:
            item.SegmentDescription = desc
        item.SegmentedPropertyCategoryCodeSequence = [code("91723000", "SCT", "Anatomical Structure")]
        item.SegmentedPropertyTypeCodeSequence = [code("39607008", "SCT", "Lung")]
        segs.append(item)
    ds.SegmentSequence = segs
    measures, orient, shared = Dataset(), Dataset(), Dataset()
    measures.PixelSpacing = [ds_str(v) for v in ct["geo"]["spacing"]]
    measures.SliceThickness = measures.SpacingBetweenSlices = ds_str(ct["geo"]["thickness"])
    orient.ImageOrientationPatient = [ds_str(v) for v in ct["geo"]["iop"]]
    shared.PixelMeasuresSequence, shared.PlaneOrientationSequence = [measures], [orient]
    ds.SharedFunctionalGroupsSequence = [shared]
    normal = np.cross(ct["geo"]["iop"][:3], ct["geo"]["iop"][3:])
    per_frame, pixels = [], []
    for i, (s, k) in enumerate(frames):
        item, pos, ident = Dataset(), Dataset(), Dataset()
        if derivation:
            src, der = Dataset(), Dataset()
            src.ReferencedSOPClassUID, src.ReferencedSOPInstanceUID = CT_IMAGE, ct["records"][k]["sop_uid"]
            src.PurposeOfReferenceCodeSequence = [code("121322", "DCM", "Source image for image processing operation")]
            der.SourceImageSequence = [src]
            der.DerivationCodeSequence = [code("113076", "DCM", "Segmentation")]
            item.DerivationImageSequence = [der]
        pos.ImagePositionPatient = ct["records"][k]["ipp"]
        if off_slice is not None and i == 0:
            pos.ImagePositionPatient = [ds_str(float(v) + off_slice * n) for v, n in zip(pos.ImagePositionPatient, normal)]
        ident.ReferencedSegmentNumber = s
        item.PlanePositionSequence, item.SegmentIdentificationSequence = [pos], [ident]
        per_frame.append(item)
        truth = masks[s][k]
        if fractional:
            # In: 100..200, out: 0..99 (mostly 0); each frame has exactly 100 and 99 somewhere.
            v = np.where(truth, RNG.integers(100, 201, truth.shape),
                         RNG.integers(1, 100, truth.shape) * (RNG.random(truth.shape) < 0.3))
            v.flat[np.flatnonzero(truth)[0]] = 100
            v.flat[np.flatnonzero(~truth)[0]] = 99
            pixels.append(v.astype(np.uint8))
        else:
            pixels.append(truth.astype(np.uint8))
    ds.PerFrameFunctionalGroupsSequence = per_frame
    pixels = np.stack(pixels)
    ds.SamplesPerPixel, ds.PhotometricInterpretation = 1, "MONOCHROME2"
    ds.Rows, ds.Columns, ds.PixelRepresentation = ROWS, COLS, 0
    if fractional:
        ds.SegmentationType, ds.SegmentationFractionalType, ds.MaximumFractionalValue = "FRACTIONAL", "PROBABILITY", 200
        ds.BitsAllocated, ds.BitsStored, ds.HighBit = 8, 8, 7
        data = pixels.tobytes()
    else:
        ds.SegmentationType = "BINARY"
        ds.BitsAllocated, ds.BitsStored, ds.HighBit = 1, 1, 0
        data = np.packbits(pixels.reshape(-1), bitorder="little").tobytes()  # across all frames
    ds.add_new(0x7FE00010, "OB", data + b"\x00" * (len(data) % 2))
    save(ds, path)
    return path


# ------------------------------------------------------------------- independent reader

def dicom_files(path):
    """(path, dataset) of every DICOM file under a folder (or the file itself)."""
    paths = [path] if os.path.isfile(path) else sorted(
        os.path.join(d, f) for d, _, fs in os.walk(path) for f in fs)
    out = []
    for p in paths:
        try:
            out.append((p, pydicom.dcmread(p)))
        except InvalidDicomError:
            pass
    return out


def first(ds, *seqs):
    """ds.<seq>[0] for the first sequence present, else None."""
    for s in seqs:
        if s in ds and len(ds[s].value):
            return ds[s].value[0]
    return None


def slices_of(p, ds):
    """One dict per slice: a single-frame file, or each frame of a multi-frame file
    (per-frame functional groups first, then shared, then the top level)."""
    try:
        pixels = ds.pixel_array.reshape(-1, ds.Rows, ds.Columns)
    except Exception:  # no pydicom handler for this transfer syntax
        pixels = None
    if "GridFrameOffsetVector" in ds and "PerFrameFunctionalGroupsSequence" not in ds:
        # RT Dose (PS3.3 C.8.8.3.2): offsets relative to the first frame when the first is
        # 0, else absolute z coordinates (transverse grids only); DoseGridScaling scales.
        offsets = [float(v) for v in ds.GridFrameOffsetVector]
        ipp0 = np.array([float(v) for v in ds.ImagePositionPatient])
        iop = [float(v) for v in ds.ImageOrientationPatient]
        normal = np.cross(iop[:3], iop[3:])
        if offsets[0] == 0:
            ipps = [ipp0 + o * normal for o in offsets]
        else:
            assert np.allclose(iop, [1, 0, 0, 0, 1, 0]) and abs(offsets[0] - ipp0[2]) < 1e-3
            ipps = [np.array([ipp0[0], ipp0[1], o]) for o in offsets]
        return [dict(file=p, ds=ds, pixels=None if pixels is None else pixels[k], ipp=list(ipps[k]), iop=iop,
                     spacing=ds.PixelSpacing, slope=float(ds.DoseGridScaling), intercept=0)
                for k in range(len(offsets))]
    if "PerFrameFunctionalGroupsSequence" not in ds:
        return [dict(file=p, ds=ds, pixels=None if pixels is None else pixels[0], ipp=ds.ImagePositionPatient,
                     iop=ds.ImageOrientationPatient, spacing=ds.PixelSpacing,
                     slope=ds.get("RescaleSlope", 1), intercept=ds.get("RescaleIntercept", 0))]
    shared = ds.SharedFunctionalGroupsSequence[0]
    out = []
    for i, fg in enumerate(ds.PerFrameFunctionalGroupsSequence):
        def get(seq, key, default=None):
            for item in (first(fg, seq), first(shared, seq), ds):
                if item is not None and key in item:
                    return item[key].value
            return default
        out.append(dict(file=p, ds=ds, pixels=None if pixels is None else pixels[i],
                        ipp=get("PlanePositionSequence", "ImagePositionPatient"),
                        iop=get("PlaneOrientationSequence", "ImageOrientationPatient"),
                        spacing=get("PixelMeasuresSequence", "PixelSpacing"),
                        slope=get("PixelValueTransformationSequence", "RescaleSlope", 1),
                        intercept=get("PixelValueTransformationSequence", "RescaleIntercept", 0)))
    return out


def read_ct(path, series_uid=None):
    """Reads a series as medfast should: the given series, else the one with most slices."""
    groups = {}
    for p, ds in dicom_files(path):
        if ds.get("Modality") != "SEG":
            groups.setdefault(str(ds.SeriesInstanceUID), []).append((p, ds))
    if series_uid is None:
        series_uid = max(groups, key=lambda u: sum(len(slices_of(p, d)) for p, d in groups[u]))
    files = groups[series_uid]
    slices = [s for p, ds in files for s in slices_of(p, ds)]
    iop = np.array([float(v) for v in slices[0]["iop"]])
    assert all(np.allclose([float(v) for v in s["iop"]], iop) for s in slices)
    row, col = iop[:3], iop[3:]
    normal = np.cross(row, col)
    for s in slices:
        s["ipp"] = np.array([float(v) for v in s["ipp"]])
        s["proj"] = float(s["ipp"] @ normal)
    slices.sort(key=lambda s: s["proj"])
    diffs = np.diff([s["proj"] for s in slices])
    gap = float(np.median(diffs)) if len(diffs) else float(slices[0]["ds"].get("SliceThickness", 1))
    rs, cs = (float(v) for v in slices[0]["spacing"])
    affine = np.eye(4)
    affine[:3, 0], affine[:3, 1], affine[:3, 2] = row * cs, col * rs, normal * gap
    affine[:3, 3] = slices[0]["ipp"]
    affine[:2] *= -1  # LPS -> RAS
    slope = [float(s["slope"]) for s in slices]
    inter = [float(s["intercept"]) for s in slices]
    stored = None if any(s["pixels"] is None for s in slices) else np.stack([s["pixels"] for s in slices])
    return dict(series_uid=series_uid, files=len(files), slices=slices, affine=affine, gap=gap,
                deviation=float(np.max(np.abs(diffs - gap))) if len(diffs) else 0.0,
                shape=[int(slices[0]["ds"].Columns), int(slices[0]["ds"].Rows), len(slices)],
                normal=normal, stored=stored, slope=slope, intercept=inter)


def rescale(ct, stored):
    """stored (nz, rows, cols) -> int16 if all slopes/intercepts are whole and values fit,
    else float32 (computed in float64)."""
    v = stored.astype(np.float64) * np.array(ct["slope"])[:, None, None] + np.array(ct["intercept"])[:, None, None]
    whole = all(float(x).is_integer() for x in ct["slope"] + ct["intercept"])
    if whole and v.min() >= -32768 and v.max() <= 32767:
        return v.astype(np.int16)
    return v.astype(np.float32)


def seg_key(item):
    return str(item.SegmentDescription) if "SegmentDescription" in item else str(item.SegmentLabel)


def read_seg(path, ct, label_dict):
    """A SEG's frames on the CT grid, combined into a uint8 label volume by label_dict."""
    ds = pydicom.dcmread(path)
    refd = [str(r.SeriesInstanceUID) for r in ds.get("ReferencedSeriesSequence", [])]
    if ct["series_uid"] not in refd:
        raise ValueError(f"ReferencedSeriesSequence of {os.path.basename(path)} names {refd}")
    n, rows, cols = int(ds.NumberOfFrames), int(ds.Rows), int(ds.Columns)
    raw = np.frombuffer(ds.PixelData, np.uint8)
    if ds.BitsAllocated == 1:
        frames = np.unpackbits(raw, bitorder="little")[:n * rows * cols].reshape(n, rows, cols).astype(bool)
    else:  # FRACTIONAL: in the segment at half the maximum or more
        frames = raw[:n * rows * cols].reshape(n, rows, cols).astype(int) * 2 >= int(ds.MaximumFractionalValue)
    by_sop = {str(s["ds"].SOPInstanceUID): z for z, s in enumerate(ct["slices"])}
    projs = np.array([s["proj"] for s in ct["slices"]])
    masks = {int(s.SegmentNumber): np.zeros((len(projs), rows, cols), bool) for s in ds.SegmentSequence}
    for i, fg in enumerate(ds.PerFrameFunctionalGroupsSequence):
        der = first(fg, "DerivationImageSequence")
        src = first(der, "SourceImageSequence") if der is not None else None
        if src is not None and str(src.ReferencedSOPInstanceUID) in by_sop:
            z = by_sop[str(src.ReferencedSOPInstanceUID)]
        else:
            proj = np.array([float(v) for v in fg.PlanePositionSequence[0].ImagePositionPatient]) @ ct["normal"]
            z = int(np.argmin(np.abs(projs - proj)))
            if abs(projs[z] - proj) > ct["gap"] / 2:
                raise ValueError(f"ImagePositionPatient of {os.path.basename(path)} frame {i + 1} matches no slice")
        masks[int(fg.SegmentIdentificationSequence[0].ReferencedSegmentNumber)][z] |= frames[i]
    keys = {int(s.SegmentNumber): seg_key(s) for s in ds.SegmentSequence}
    out = np.zeros((len(projs), rows, cols), np.uint8)
    if label_dict is None:
        for number in sorted(masks):
            out[masks[number]] = number
    else:
        for name, value in label_dict:
            for number in sorted(masks):
                if keys[number] == name:
                    out[masks[number]] = value
    return out


# --------------------------------------------------------------------------- cases

def read_rtstruct(path, ct, label_dict):
    """An RT Structure Set's closed planar contours filled on the CT grid by the even-odd rule
    (W. R. Franklin's point-in-polygon test at every voxel centre, over all of an ROI's
    contours on a slice), combined into a uint8 volume by label_dict (ROIName), as medfast
    documents it; computed here with numpy from what pydicom reads."""
    ds = pydicom.dcmread(path)
    refd = [str(se.SeriesInstanceUID) for fr in ds.ReferencedFrameOfReferenceSequence
            for st in fr.RTReferencedStudySequence for se in st.RTReferencedSeriesSequence]
    if ct["series_uid"] not in refd:
        raise ValueError(f"RTReferencedSeriesSequence of {os.path.basename(path)} names {refd}")
    iop = np.array([float(v) for v in ct["slices"][0]["iop"]])
    row, col, normal = iop[:3], iop[3:], ct["normal"]
    rs_ps, cs_ps = (float(v) for v in ct["slices"][0]["spacing"])
    origin = ct["slices"][0]["ipp"]
    projs = np.array([s["proj"] for s in ct["slices"]])
    nz, rows, cols = len(projs), ct["shape"][1], ct["shape"][0]
    names = {int(r.ROINumber): str(r.ROIName) for r in ds.StructureSetROISequence}
    masks = {}
    Y, X = np.meshgrid(np.arange(rows, dtype=float), np.arange(cols, dtype=float), indexing="ij")
    wanted = None if label_dict is None else {name for name, _ in label_dict}
    for rc in ds.ROIContourSequence:
        number = int(rc.ReferencedROINumber)
        if wanted is not None and names[number] not in wanted:
            continue  # an ROI the label_dict does not ask for is not read
        inside = np.zeros((nz, rows, cols), bool)
        for contour in rc.ContourSequence:
            if contour.ContourGeometricType != "CLOSED_PLANAR":
                continue
            pts = np.array([float(v) for v in contour.ContourData]).reshape(-1, 3)
            along = pts @ normal
            z = int(np.argmin(np.abs(projs - along.mean())))
            if abs(projs[z] - along.mean()) > ct["gap"] / 2:
                raise ValueError(f"a contour of ROI {number} lies off every slice")
            xs = (pts - origin) @ row / cs_ps
            ys = (pts - origin) @ col / rs_ps
            odd = np.zeros((rows, cols), bool)
            for i in range(len(xs)):
                j = i - 1
                xi, yi, xj, yj = xs[i], ys[i], xs[j], ys[j]
                if yi == yj:
                    continue  # a horizontal edge crosses no ray
                crossing = ((yi > Y) != (yj > Y)) & (X < (xj - xi) * (Y - yi) / (yj - yi) + xi)
                odd ^= crossing
            inside[z] ^= odd  # even-odd across the slice's contours: holes and islands
        masks[number] = inside
    out = np.zeros((nz, rows, cols), np.uint8)
    order = [(n, n) for n in sorted(masks)] if label_dict is None else \
        [(n, value) for name, value in label_dict for n in sorted(masks) if names[n] == name]
    for number, value in order:
        out[masks[number]] = value
    return out


def rel(path, root):
    return os.path.relpath(path, root)


def write_voxels(root, name, arr):
    """(nz, rows, cols) in C order = the [x][y][z] array in Fortran order."""
    path = os.path.join(root, name + ".voxels.bin")
    with open(path, "wb") as f:
        f.write(arr.astype(arr.dtype.newbyteorder("<")).tobytes())
    return rel(path, root)


def affine_json(a):
    return [[float(v) + 0.0 for v in r] for r in a]  # + 0.0: no -0.0 in the JSON


def expect(root, name, ct, vol):
    return dict(shape=ct["shape"], dtype=vol.dtype.name, affine=affine_json(ct["affine"]),
                voxels=write_voxels(root, name, vol), series_uid=ct["series_uid"], files=ct["files"],
                slice_spacing=ct["gap"])


def victim(records):
    """A file neither first by name nor first/last in space (so it is not the reference)."""
    names = sorted(os.path.basename(r["path"]) for r in records)
    cands = [r for r in records[1:-1] if os.path.basename(r["path"]) != names[0]]
    return cands[len(cands) // 2]["path"]


def modify(path, fn):
    ds = pydicom.dcmread(path)
    fn(ds)
    save(ds, path)
    return os.path.basename(path)


def transfer_syntax(path):
    """TransferSyntaxUID by pydicom, cross-checked with dcmdump."""
    ts = str(pydicom.dcmread(path, stop_before_pixels=True).file_meta.TransferSyntaxUID)
    out = subprocess.run(["dcmdump", "-Un", "+P", "0002,0010", path], capture_output=True, text=True, check=True)
    assert ts in out.stdout, (path, ts, out.stdout)
    return ts


def j2k_compress(src, dst):
    """A copy of src with its frames as lossless JPEG 2000 codestreams (opj_compress)."""
    ds = pydicom.dcmread(src)
    frames = ds.pixel_array.reshape(-1, ds.Rows, ds.Columns)
    signed = int(ds.PixelRepresentation) == 1
    streams = []
    with tempfile.TemporaryDirectory() as tmp:
        for k, frame in enumerate(frames):
            raw, j2k = os.path.join(tmp, f"{k}.rawl"), os.path.join(tmp, f"{k}.j2k")
            frame.astype("<i2" if signed else "<u2").tofile(raw)
            subprocess.run([OPENJPEG[0], "-n", "3", "-i", raw, "-o", j2k, "-F",
                            f"{ds.Columns},{ds.Rows},1,{ds.BitsStored},{'s' if signed else 'u'}"],
                           check=True, capture_output=True)
            with open(j2k, "rb") as f:
                streams.append(f.read())
            # Lossless: OpenJPEG's own decoder gives the frame back.
            back = os.path.join(tmp, f"{k}.back.rawl")
            subprocess.run(["opj_decompress", "-i", j2k, "-o", back], check=True, capture_output=True)
            assert np.array_equal(np.fromfile(back, "<i2" if signed else "<u2").reshape(frame.shape), frame), src
    ds.file_meta.TransferSyntaxUID = J2K_LOSSLESS
    ds.PixelData = encapsulate(streams)
    ds["PixelData"].VR, ds["PixelData"].is_undefined_length = "OB", True
    save(ds, dst)


def lossless_jpeg(frame, precision=16, restart_rows=2):
    """A lossless JPEG (process 14, predictor 1) stream of a 2-D frame with a restart marker
    every `restart_rows` rows: a minimal encoder (T.81 Annex H) that dcmtk's decoder checks."""
    rows, cols = frame.shape
    values = frame.astype(np.int64) & ((1 << precision) - 1)
    seg = lambda marker, body: bytes([0xFF, marker]) + (len(body) + 2).to_bytes(2, "big") + body
    sof = seg(0xC3, bytes([precision]) + rows.to_bytes(2, "big") + cols.to_bytes(2, "big") + bytes([1, 1, 0x11, 0]))
    dht = seg(0xC4, bytes([0x00]) + bytes([0, 0, 0, 0, 17] + [0] * 11) + bytes(range(17)))  # 17 five-bit codes
    dri = seg(0xDD, (restart_rows * cols).to_bytes(2, "big"))
    sos = seg(0xDA, bytes([1, 1, 0x00, 1, 0, 0]))
    out, acc, nbits = bytearray(b"\xFF\xD8" + sof + dht + dri + sos), 0, 0

    def put(v, n):
        nonlocal acc, nbits
        acc, nbits = (acc << n) | v, nbits + n
        while nbits >= 8:
            b = (acc >> (nbits - 8)) & 0xFF
            out.append(b)
            if b == 0xFF:
                out.append(0)
            nbits -= 8

    for y in range(rows):
        if y % restart_rows == 0 and y:
            if nbits:
                put((1 << (8 - nbits)) - 1, 8 - nbits)
            out.extend([0xFF, 0xD0 + ((y // restart_rows - 1) & 7)])
        for x in range(cols):
            if y % restart_rows == 0:
                pred = (1 << (precision - 1)) if x == 0 else values[y, x - 1]
            else:
                pred = values[y - 1, 0] if x == 0 else values[y, x - 1]
            diff = int(values[y, x] - pred) % 65536
            diff = diff - 65536 if diff >= 32768 else diff
            t = 16 if diff == -32768 else abs(diff).bit_length()
            put(t, 5)
            if 0 < t < 16:
                put(diff if diff > 0 else diff + (1 << t) - 1, t)
    if nbits:
        put((1 << (8 - nbits)) - 1, 8 - nbits)
    out.extend(b"\xFF\xD9")
    return bytes(out)


def restart_compress(src, dst):
    """A copy of src whose frames are lossless_jpeg() streams with restart intervals."""
    ds = pydicom.dcmread(src)
    frames = ds.pixel_array.reshape(-1, ds.Rows, ds.Columns)
    ds.file_meta.TransferSyntaxUID = JPEG_LOSSLESS_SV1
    ds.PixelData = encapsulate([lossless_jpeg(f, int(ds.BitsStored)) for f in frames])
    ds["PixelData"].VR, ds["PixelData"].is_undefined_length = "OB", True
    save(ds, dst)


def compress_folder(src, dst, syntax, options=()):
    """Each file of src (a folder or one file) into dst (same name), compressed to `syntax`."""
    files = [src] if os.path.isfile(src) else [os.path.join(src, f) for f in sorted(os.listdir(src))]
    os.makedirs(dst)
    tools = {JPEG_LOSSLESS_SV1: ["dcmcjpeg", "+e1"], JPEG_LOSSLESS: ["dcmcjpeg"], JPEG_BASELINE: ["dcmcjpeg", "+eb"],
             JPEG_LS_LOSSLESS: ["dcmcjpls", "+el"], JPEG_LS_NEAR: ["dcmcjpls", "+en"]}
    for a in files:
        b = os.path.join(dst, os.path.basename(a))
        if options == ["restart"]:
            restart_compress(a, b)
        elif syntax in tools:
            subprocess.run([*tools[syntax], *options, a, b], check=True)
        elif syntax == J2K_LOSSLESS:
            j2k_compress(a, b)
        else:
            ds = pydicom.dcmread(a)
            ds.compress(RLELossless)
            save(ds, b)
        assert transfer_syntax(b) == syntax, b


def dcmtk_decoded(folder, syntax):
    """What pydicom reads from dcmtk's decompressed copies of a folder's files."""
    tool = {JPEG_LOSSLESS_SV1: "dcmdjpeg", JPEG_LOSSLESS: "dcmdjpeg", JPEG_BASELINE: "dcmdjpeg", JPEG_LS_LOSSLESS: "dcmdjpls",
            JPEG_LS_NEAR: "dcmdjpls"}[syntax]
    with tempfile.TemporaryDirectory() as tmp:
        for f in sorted(os.listdir(folder)):
            subprocess.run([tool, os.path.join(folder, f), os.path.join(tmp, f)], check=True)
        return read_ct(tmp)


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    missing = [t for t in DCMTK + OPENJPEG if shutil.which(t) is None]
    if missing:
        sys.exit(f"make_dicom_golden.py: tool(s) {', '.join(missing)} not found on PATH "
                 "(install dcmtk and libopenjp2-tools, e.g. apt-get install dcmtk libopenjp2-tools)")
    root = os.path.join(sys.argv[1], "dicom")
    shutil.rmtree(root, ignore_errors=True)
    os.makedirs(root)
    ct_dir = lambda name: os.path.join(root, "ct", name)
    series, segs, errors = [], [], []

    def add_series(name, folder, ct, vol, series_uid=None, warning=False, **extra):
        assert (ct["deviation"] > 0.01) == warning, (name, ct["deviation"])
        case = dict(name=name, input=rel(folder, root))
        if series_uid is not None:  # absent: medfast picks the series with most slices
            case["series_uid"] = series_uid
        series.append(dict(case, expect=expect(root, name, ct, vol), warning=warning, **extra))

    # 1. axial, slope 1 / intercept -1024 -> int16.
    axial_geo = geometry([1, 0, 0, 0, 1, 0], [0.8, 0.7], [-100.5, -80.25, -30.0], 2.5, NZ)
    axial_hu = hu_volume(NZ, ROWS, COLS)
    axial_uid = uid("axial")
    axial_records = write_ct(ct_dir("axial"), (axial_hu + 1024).astype(np.int16), axial_geo,
                             [1] * NZ, [-1024] * NZ, axial_uid)
    axial = read_ct(ct_dir("axial"))
    axial_vol = rescale(axial, axial["stored"])
    # Self-check: the independent read equals the writer's array and the known affine.
    assert axial_vol.dtype == np.int16 and np.array_equal(axial_vol, axial_hu.astype(np.int16))
    known = np.array([[-0.7, 0, 0, 100.5], [0, -0.8, 0, 80.25], [0, 0, 2.5, -30.0], [0, 0, 0, 1]])
    assert np.allclose(axial["affine"], known, atol=1e-12), axial["affine"]
    add_series("axial", ct_dir("axial"), axial, axial_vol)
    axial_ct = dict(records=axial_records, geo=axial_geo, series_uid=axial_uid)

    # 2. oblique (exact decimal orthonormal directions), slope 0.5 / intercept -1000.25 -> float32.
    obl_geo = geometry([0.8, 0.6, 0, -0.36, 0.48, 0.8], [0.9, 0.75], [12.5, -40.0, 7.25], 3.0, NZ)
    obl_stored = RNG.integers(0, 6001, (NZ, ROWS, COLS)).astype(np.int16)
    obl_records = write_ct(ct_dir("oblique"), obl_stored, obl_geo, [0.5] * NZ, [-1000.25] * NZ, uid("oblique"),
                           ext=".dcm")
    obl = read_ct(ct_dir("oblique"))
    add_series("oblique", ct_dir("oblique"), obl, rescale(obl, obl["stored"]))
    assert series[-1]["expect"]["dtype"] == "float32"

    # 3. two series in one folder: A (5 slices), B (8 slices, the default).
    two = ct_dir("two_series")
    a_uid, b_uid = uid("two A"), uid("two B")
    write_ct(two, (hu_volume(5, ROWS, COLS) + 1024).astype(np.int16),
             geometry([1, 0, 0, 0, 1, 0], [0.5, 0.5], [-10, -10, 50.0], 5.0, 5), [1] * 5, [-1024] * 5, a_uid, 2)
    write_ct(two, (hu_volume(8, ROWS, COLS) + 1024).astype(np.int16),
             geometry([1, 0, 0, 0, 1, 0], [0.6, 0.6], [-12, -12, 40.0], 1.5, 8), [1] * 8, [-1024] * 8, b_uid, 3)
    ct_b, ct_a = read_ct(two), read_ct(two, a_uid)
    assert ct_b["series_uid"] == b_uid and ct_b["files"] == 8 and ct_a["files"] == 5
    add_series("two_series_default", two, ct_b, rescale(ct_b, ct_b["stored"]))
    add_series("two_series_pick", two, ct_a, rescale(ct_a, ct_a["stored"]), series_uid=a_uid)

    # 4. compressed copies of axial: same geometry; lossless ones the same values, lossy
    # ones what dcmtk decodes.
    def add_compressed(name, src, syntax, options=(), equal_to=None, reference=None):
        compress_folder(src, ct_dir(name), syntax, options)
        ct = read_ct(ct_dir(name))
        decoded_by = "pydicom"
        if syntax == J2K_LOSSLESS:  # checked frame by frame against the source when written
            ct["stored"], decoded_by = read_ct(src)["stored"], "opj_decompress (lossless round trip)"
        elif ct["stored"] is None or syntax in LOSSY or "+pt" in options or options == ["restart"]:  # lossy, or pydicom cannot decode: dcmtk
            ct["stored"], decoded_by = dcmtk_decoded(ct_dir(name), syntax)["stored"], "dcmtk"
        vol = rescale(ct, ct["stored"])
        if equal_to is not None:
            assert np.array_equal(vol, equal_to), name
        if reference is not None:
            assert np.allclose(ct["affine"], reference["affine"]), name
        path = ct_dir(name) if os.path.isdir(src) else os.path.join(ct_dir(name), os.path.basename(src))
        add_series(name, path, ct, vol, transfer_syntax=str(syntax), decoded_by=decoded_by)

    for name, syntax in [("jpeg_lossless", JPEG_LOSSLESS_SV1), ("jpeg_ls", JPEG_LS_LOSSLESS), ("rle", RLELossless)]:
        add_compressed(name, ct_dir("axial"), syntax, equal_to=axial_vol, reference=axial)
    add_compressed("jpeg2000", ct_dir("axial"), J2K_LOSSLESS, equal_to=axial_vol, reference=axial)
    # Lossless JPEG's other predictors (dcmtk), restart intervals (medfast's minimal
    # encoder, decoded by dcmtk), and a point transform (lossy: low bits dropped).
    for sv in range(2, 8):
        add_compressed(f"jpeg_lossless_sv{sv}", ct_dir("axial"), JPEG_LOSSLESS,
                       ["+el", "+sv", str(sv)], equal_to=axial_vol)
    add_compressed("jpeg_lossless_restart", ct_dir("axial"), JPEG_LOSSLESS_SV1, ["restart"], equal_to=axial_vol)
    add_compressed("jpeg_lossless_pt2", ct_dir("axial"), JPEG_LOSSLESS,
                   ["+el", "+pt", "2"])
    # 8-bit stored values (unsigned), and their lossy baseline JPEG copy.
    axial8 = RNG.integers(0, 256, (NZ, ROWS, COLS)).astype(np.uint8)
    axial8[:, 5:25, 10:30] = 200  # flat areas as well as noise
    write_ct(ct_dir("axial8"), axial8, axial_geo, [1] * NZ, [0] * NZ, uid("axial8"), bits=8)
    ct8 = read_ct(ct_dir("axial8"))
    assert np.array_equal(ct8["stored"], axial8)
    add_series("axial8", ct_dir("axial8"), ct8, rescale(ct8, ct8["stored"]))
    add_compressed("jpeg_baseline", ct_dir("axial8"), JPEG_BASELINE, reference=axial)
    add_compressed("jpeg_ls_near", ct_dir("axial8"), JPEG_LS_NEAR, reference=axial)

    # 5. enhanced multi-frame CT, coronal, per-frame intercepts -1024 / -1000 -> int16.
    enh_geo = geometry([1, 0, 0, 0, 0, -1], [0.6, 0.55], [-20.0, 15.5, 60.0], 1.25, 10)
    enh_inter = [-1024 if k % 2 == 0 else -1000 for k in range(10)]
    enh_hu = hu_volume(10, ROWS, COLS)
    enh_path = os.path.join(ct_dir("enhanced"), hex_name(".dcm"))
    write_enhanced(enh_path, (enh_hu - np.array(enh_inter)[:, None, None]).astype(np.int16), enh_geo,
                   enh_inter, uid("enhanced"))
    enh = read_ct(enh_path)
    enh_vol = rescale(enh, enh["stored"])
    assert enh_vol.dtype == np.int16 and np.array_equal(enh_vol, enh_hu.astype(np.int16))
    add_series("enhanced", enh_path, enh, enh_vol)
    # Multi-frame compressed: frames split over 1 KiB fragments, told apart by the Basic
    # Offset Table (JPEG lossless) or, without one, by where each stream starts (JPEG-LS);
    # RLE has one fragment per frame.
    add_compressed("enhanced_jpeg_fragments", enh_path, JPEG_LOSSLESS_SV1, ["+fs", "1", "+ot"], equal_to=enh_vol)
    add_compressed("enhanced_jpeg_ls_no_offsets", enh_path, JPEG_LS_LOSSLESS, ["+fs", "1", "-ot"], equal_to=enh_vol)
    add_compressed("enhanced_rle", enh_path, RLELossless, equal_to=enh_vol)
    for name in ("enhanced_jpeg_fragments", "enhanced_jpeg_ls_no_offsets"):
        ds = pydicom.dcmread(os.path.join(root, next(c["input"] for c in series if c["name"] == name)))
        fp = pydicom.filebase.DicomBytesIO(ds.PixelData)
        fp.is_little_endian = True
        frags = list(pydicom.encaps.generate_pixel_data_fragment(fp))
        assert len(frags) > 2 * 10, (name, len(frags))  # offset table + more than one fragment per frame

    # 6. uneven: one slice 0.2 mm off along the normal -> read, with a warning.
    unev_geo = geometry([1, 0, 0, 0, 1, 0], [0.8, 0.7], [-100.5, -80.25, -30.0], 2.5, NZ, displace={6: 0.2})
    write_ct(ct_dir("uneven"), (axial_hu + 1024).astype(np.int16), unev_geo, [1] * NZ, [-1024] * NZ, uid("uneven"))
    unev = read_ct(ct_dir("uneven"))
    add_series("uneven", ct_dir("uneven"), unev, rescale(unev, unev["stored"]), warning=True)

    # 7. RT Dose grids: relative offsets (oblique-free coronal grid), absolute offsets
    # running down (frames stored head to foot), both uint32 x DoseGridScaling -> float32 Gy.
    def add_dose(name, iop, ipp, offsets, scaling=2.5e-5):
        stored = RNG.integers(0, 3_200_000, (len(offsets), ROWS, COLS)).astype(np.uint32)
        stored.flat[0], stored.flat[-1] = 0, 3_199_999
        path = os.path.join(ct_dir(name), hex_name(".dcm"))
        write_rtdose(path, stored, iop, [2.5, 2.0], ipp, offsets, scaling, uid(name))
        dose = read_ct(path)
        vol = rescale(dose, dose["stored"])
        assert vol.dtype == np.float32 and abs(float(vol.max()) - 3_199_999 * scaling) < 1e-3, name
        add_series(name, path, dose, vol)
        return stored

    add_dose("rtdose_relative", [1, 0, 0, 0, 0, -1], [-30.0, 12.5, 80.0], [2.5 * k for k in range(8)])
    add_dose("rtdose_absolute", [1, 0, 0, 0, 1, 0], [-30.0, -40.0, 45.0], [45.0 - 3.0 * k for k in range(9)])

    # SEG objects on the axial series.
    masks = seg_masks()
    seg_dir = os.path.join(root, "seg")
    binary = write_seg(os.path.join(seg_dir, hex_name(".dcm")), axial_ct, masks)
    fractional = write_seg(os.path.join(seg_dir, hex_name(".dcm")), axial_ct, masks, fractional=True)
    positions = write_seg(os.path.join(seg_dir, hex_name(".dcm")), axial_ct, masks, derivation=False)
    both = [["GTV-1", 1], ["Lung", 2]]
    for name, path, labels in [("seg_binary", binary, both), ("seg_binary_reversed", binary, both[::-1]),
                               ("seg_no_dict", binary, None), ("seg_fractional", fractional, [["GTV-1", 1]]),
                               ("seg_positions_only", positions, both)]:
        vol = read_seg(path, axial, labels)
        # Cross-check with the truth masks (axial's sorted order is the writer's spatial order).
        truth = np.zeros_like(vol)
        for label, value in (labels or [["GTV-1", 1], ["Lung", 2]]):
            truth[masks[1 if label == "GTV-1" else 2]] = value
        assert np.array_equal(vol, truth), name
        assert int(pydicom.dcmread(path, stop_before_pixels=True).NumberOfFrames) < 2 * NZ
        segs.append(dict(name=name, seg=rel(path, root), reference=rel(ct_dir("axial"), root), label_dict=labels,
                         expect=dict(shape=axial["shape"], dtype="uint8", voxels=write_voxels(root, name, vol),
                                     affine=affine_json(axial["affine"]))))

    # RT Structure Sets on the axial and the oblique series (contours in the oblique slice
    # planes), by label_dict and by ROINumber.
    rt_dir = os.path.join(root, "rtstruct")
    obl_ct = dict(records=obl_records, geo=obl_geo, series_uid=uid("oblique"))
    rt_axial = write_rtstruct(os.path.join(rt_dir, hex_name(".dcm")), axial_ct)
    rt_oblique = write_rtstruct(os.path.join(rt_dir, hex_name(".dcm")), obl_ct)
    for name, path, ct, folder, labels in [
            ("rtstruct_label_dict", rt_axial, axial, ct_dir("axial"), [["Lung", 2], ["GTV-1", 1]]),
            ("rtstruct_gtv_last_wins", rt_axial, axial, ct_dir("axial"), [["GTV-1", 1], ["Lung", 2]]),
            ("rtstruct_roi_numbers", rt_axial, axial, ct_dir("axial"), None),
            ("rtstruct_oblique", rt_oblique, obl, ct_dir("oblique"), [["Lung", 2], ["GTV-1", 1]])]:
        vol = read_rtstruct(path, ct, labels)
        # Cross-check with the drawing: the hole is empty and its island filled on slice 5,
        # the C's gap is outside, GTV-1 is painted where listed last.
        assert vol[5, 14, 17] == (2 if labels is None or labels[-1][0] == "Lung" else 1), name
        assert vol[4, 14, 16] == 1 and vol[3, 6, 25] == 2, name  # a hole without its island; the C's bar
        assert vol[4, 14, 25] == 0 and vol[0].max() == 0, name
        segs.append(dict(name=name, seg=rel(path, root), reference=rel(folder, root), label_dict=labels,
                         expect=dict(shape=ct["shape"], dtype="uint8", voxels=write_voxels(root, name, vol),
                                     affine=affine_json(ct["affine"]))))

    # Bad inputs: copies of axial with one thing broken.
    err_dir = lambda name: os.path.join(root, "errors", name)
    hu_stored = (axial_hu + 1024).astype(np.int16)

    def broken(name):
        return write_ct(err_dir(name), hu_stored, axial_geo, [1] * NZ, [-1024] * NZ, uid("error", name))

    def add_error(name, path, substrings, **extra):
        errors.append(dict(name=name, input=rel(path, root), expect_error=substrings, **extra))

    os.remove(broken("gap")[4]["path"])  # the 5th sorted slice
    add_error("gap", err_dir("gap"), ["ImagePositionPatient", "missing"])

    def tilt(ds):
        ds.ImageOrientationPatient = ["1", "0", "0", "0", "0.96", "0.28"]
    add_error("mixed_orientation", err_dir("mixed_orientation"),
              ["ImageOrientationPatient", modify(victim(broken("mixed_orientation")), tilt)])

    def resize(ds):
        set_pixels(ds, RNG.integers(0, 2000, (ROWS - 2, COLS + 3)))
    add_error("mixed_size", err_dir("mixed_size"), [modify(victim(broken("mixed_size")), resize), "Rows"])

    def drop_position(ds):
        del ds.ImagePositionPatient
    add_error("missing_position", err_dir("missing_position"),
              ["ImagePositionPatient", modify(victim(broken("missing_position")), drop_position)])

    # MPEG2 in the file meta, pixel data encapsulated.
    mpeg_uid = uid("error", "mpeg2")
    ds = new_dataset(CT_IMAGE, uid(mpeg_uid, 0), mpeg_uid, "CT", 9, ts=MPEG2)
    ds.InstanceNumber, ds.ImageOrientationPatient = 1, ["1", "0", "0", "0", "1", "0"]
    ds.ImagePositionPatient, ds.PixelSpacing, ds.SliceThickness = ["0", "0", "0"], ["1", "1"], "1"
    set_pixels(ds, hu_stored[0])
    ds.add_new(0x7FE00010, "OB", encapsulate([hu_stored[0].tobytes()]))
    ds["PixelData"].is_undefined_length = True
    mpeg_path = os.path.join(err_dir("unsupported_syntax"), hex_name(".dcm"))
    save(ds, mpeg_path)
    assert transfer_syntax(mpeg_path) == MPEG2
    add_error("unsupported_syntax", err_dir("unsupported_syntax"), ["TransferSyntaxUID", os.path.basename(mpeg_path)])

    # Compressed streams that disagree with their header, or end early.
    def copy_series(name, src):
        shutil.copytree(src, err_dir(name))
        return [dict(path=os.path.join(err_dir(name), f)) for f in sorted(os.listdir(err_dir(name)))]

    def fewer_rows(ds):
        ds.Rows = ROWS - 2
    for r in copy_series("jpeg_ls_wrong_size", ct_dir("jpeg_ls")):
        modify(r["path"], fewer_rows)
    add_error("jpeg_ls_wrong_size", err_dir("jpeg_ls_wrong_size"), ["Columns x Rows", f"{COLS} x {ROWS - 2}"])

    def truncate(ds):
        fp = pydicom.filebase.DicomBytesIO(ds.PixelData)
        fp.is_little_endian = True
        frag = list(pydicom.encaps.generate_pixel_data_fragment(fp))[0]
        ds.PixelData = encapsulate([frag[:len(frag) // 2 & ~1]])
    records = copy_series("jpeg_truncated", ct_dir("jpeg_lossless"))
    add_error("jpeg_truncated", err_dir("jpeg_truncated"), [modify(records[len(records) // 2]["path"], truncate), "JPEG"])

    axial_rel = rel(ct_dir("axial"), root)
    other = write_seg(os.path.join(err_dir("seg_other_series"), hex_name(".dcm")), axial_ct, masks,
                      ref_series=uid("some other series"))
    add_error("seg_other_series", other, ["ReferencedSeriesSequence", os.path.basename(other)],
              reference=axial_rel, label_dict=both)
    off = write_seg(os.path.join(err_dir("seg_no_matching_slice"), hex_name(".dcm")), axial_ct, masks,
                    derivation=False, off_slice=100.0)
    add_error("seg_no_matching_slice", off, ["ImagePositionPatient", os.path.basename(off), "frame"],
              reference=axial_rel, label_dict=both)
    for path in (other, off):  # the independent reader refuses them too
        try:
            read_seg(path, axial, both)
            raise AssertionError(path + " was read")
        except ValueError:
            pass

    # RT Dose a reader must not guess about: no DoseGridScaling, offsets that do not match
    # the frames, an absolute first offset that is not the position's z.
    def bad_dose(name, offsets, scaling=2.5e-5, frames=4):
        path = os.path.join(err_dir(name), hex_name(".dcm"))
        write_rtdose(path, np.ones((frames, ROWS, COLS), np.uint32), [1, 0, 0, 0, 1, 0], [2.5, 2.0],
                     [0.0, 0.0, 10.0], offsets, scaling, uid("error", name))
        return os.path.basename(path)
    add_error("rtdose_no_scaling", err_dir("rtdose_no_scaling"),
              ["DoseGridScaling", bad_dose("rtdose_no_scaling", [0, 2, 4, 6], scaling=None)])
    add_error("rtdose_offsets_count", err_dir("rtdose_offsets_count"),
              ["GridFrameOffsetVector", "3 values for 4 frame(s)", bad_dose("rtdose_offsets_count", [0, 2, 4])])
    add_error("rtdose_absolute_elsewhere", err_dir("rtdose_absolute_elsewhere"),
              ["GridFrameOffsetVector", "starts at 7", bad_dose("rtdose_absolute_elsewhere", [7, 9, 11, 13])])

    # Explicit VR big endian (retired): refused by the name of its syntax, not as "not an image".
    be_uid = uid("error", "big endian")
    ds = new_dataset(CT_IMAGE, uid(be_uid, 0), be_uid, "CT", 12, ts=EXPLICIT_BIG_ENDIAN)
    ds.is_little_endian = False
    ds.InstanceNumber, ds.ImageOrientationPatient = 1, ["1", "0", "0", "0", "1", "0"]
    ds.ImagePositionPatient, ds.PixelSpacing, ds.SliceThickness = ["0", "0", "0"], ["1", "1"], "1"
    set_pixels(ds, hu_stored[0])
    ds.PixelData = hu_stored[0].astype(">i2").tobytes()
    be_path = os.path.join(err_dir("big_endian"), hex_name(".dcm"))
    save(ds, be_path)
    assert transfer_syntax(be_path) == EXPLICIT_BIG_ENDIAN
    assert np.array_equal(pydicom.dcmread(be_path).pixel_array, hu_stored[0])  # a sound file, only big endian
    add_error("big_endian", err_dir("big_endian"),
              [os.path.basename(be_path), "TransferSyntaxUID", "big endian", "dcmconv +te"])

    rt_other = write_rtstruct(os.path.join(err_dir("rtstruct_other_series"), hex_name(".dcm")), axial_ct,
                              ref_series=uid("yet another series"))
    add_error("rtstruct_other_series", rt_other, ["RTReferencedSeriesSequence", os.path.basename(rt_other)],
              reference=axial_rel, label_dict=both)
    rt_off = write_rtstruct(os.path.join(err_dir("rtstruct_off_slice"), hex_name(".dcm")), axial_ct, off_slice=100.0)
    add_error("rtstruct_off_slice", rt_off, [os.path.basename(rt_off), "ROI 1 ('GTV-1') contour 1", "off every slice"],
              reference=axial_rel, label_dict=both)
    # The off-slice contour is GTV-1's: a label_dict without GTV-1 reads the file.
    vol = read_rtstruct(rt_off, axial, [["Lung", 2]])
    assert vol.max() == 2 and (vol == 1).sum() == 0
    segs.append(dict(name="rtstruct_unasked_roi_broken", seg=rel(rt_off, root), reference=axial_rel,
                     label_dict=[["Lung", 2]],
                     expect=dict(shape=axial["shape"], dtype="uint8", voxels=write_voxels(root, "rtstruct_unasked", vol),
                                 affine=affine_json(axial["affine"]))))
    for path in (rt_other, rt_off):  # the independent reader refuses them too
        try:
            read_rtstruct(path, axial, both)
            raise AssertionError(path + " was read")
        except ValueError:
            pass

    # Headers that announce far more pixels than the file holds: refused from the header and
    # the pixel data's length before anything of the announced size is allocated (65535 x
    # 65535 x 3 slices of 16 bits once asked for a 24 GiB buffer; 100000 frames over one
    # frame's data were called "frames at the same position").
    huge_uid = uid("error", "huge rows")
    for z in range(3):
        ds = new_dataset(CT_IMAGE, uid(huge_uid, z), huge_uid, "CT", 13)
        ds.InstanceNumber, ds.ImageOrientationPatient = z + 1, ["1", "0", "0", "0", "1", "0"]
        ds.ImagePositionPatient, ds.PixelSpacing, ds.SliceThickness = ["0", "0", ds_str(2 * z)], ["1", "1"], "2"
        set_pixels(ds, np.zeros((64, 64), np.int16))  # 8 KB of pixel data
        ds.Rows = ds.Columns = 65535
        save(ds, os.path.join(err_dir("huge_rows"), f"slice{z}.dcm"))
    add_error("huge_rows", err_dir("huge_rows"), ["PixelData", "holds 8192 bytes", "65535 rows x 65535 columns"])
    frames_uid = uid("error", "frames past data")
    ds = new_dataset(CT_IMAGE, uid(frames_uid, 0), frames_uid, "CT", 14)
    ds.InstanceNumber, ds.ImageOrientationPatient = 1, ["1", "0", "0", "0", "1", "0"]
    ds.ImagePositionPatient, ds.PixelSpacing, ds.SliceThickness = ["0", "0", "0"], ["1", "1"], "1"
    set_pixels(ds, hu_stored[0])
    ds.NumberOfFrames = 100000
    save(ds, os.path.join(err_dir("frames_past_data"), "frames.dcm"))
    add_error("frames_past_data", err_dir("frames_past_data"),
              ["frames.dcm", "PixelData", f"holds {ROWS * COLS * 2} bytes", "x 100000 frame(s)"])

    os.makedirs(err_dir("not_dicom"))
    with open(os.path.join(err_dir("not_dicom"), "notes.txt"), "w") as f:
        f.write("Not DICOM. Patient Doe^Jane, PHI-12345, born 19700101, ACC-99999, General Hospital.\n")
    add_error("not_dicom", err_dir("not_dicom"), ["no DICOM"])

    manifest = dict(generator="tests/golden/make_dicom_golden.py", pydicom=pydicom.__version__,
                    phi=[PHI[k] for k in ("PatientName", "PatientID", "PatientBirthDate", "AccessionNumber")],
                    series=series, segs=segs, errors=errors)
    with open(os.path.join(root, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=1)
    decoded = ", ".join(f"{s['name']}: {s['decoded_by']}" for s in series if "decoded_by" in s)
    print(f"wrote {len(series)} DICOM series, {len(segs)} SEG and {len(errors)} error cases to {root} "
          f"(axial self-check ok; compressed decoded by {decoded})")


if __name__ == "__main__":
    main()
