#!/usr/bin/env python3
"""DICOM series load speed: medfast vs MONAI's PydicomReader and a plain pydicom loop, in one run.

Usage: /usr/bin/python3 bench/dicom_load.py [--build build] [--size 512,512,300] [--rounds 5]
                                           [--monai PATH]

Writes a CT series (one file per slice, explicit VR little endian, int16 stored with
RescaleIntercept -1024, file names in an order unrelated to position, InstanceNumber in
position order as scanners write it: MONAI's PydicomReader stacks by InstanceNumber, medfast
by ImagePositionPatient) with pydicom, checks
that medfast, MONAI (LoadImage(reader=PydicomReader())) and the pydicom loop give the same
Hounsfield units in the same order (CRC-32 of the int16 volume, x fastest), then times a
whole-series load, warm (files in the page cache) and cold (every file's pages dropped with
posix_fadvise before each load), median of --rounds. medfast runs in bench/bench_nifti_load
(read_image: the same reader LoadImage uses) with 1 and 2 threads; MONAI and pydicom are
single-threaded Python, as users run them.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import zlib

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import monai_peer  # noqa: E402
from nifti_load import machine  # noqa: E402

try:
    import pydicom
    from pydicom.dataset import FileDataset, FileMetaDataset
    from pydicom.uid import ExplicitVRLittleEndian, generate_uid
except ImportError:
    sys.exit("python3-pydicom is missing: apt-get install python3-pydicom (scripts/setup.sh --test installs it)")

CT_STORAGE = "1.2.840.10008.5.1.4.1.1.2"


def write_series(folder, nx, ny, nz):
    """A CT-like series: body ellipse, noise; returns the HU volume indexed [z][y][x]."""
    rng = np.random.default_rng(7)
    yy, xx = np.mgrid[0:ny, 0:nx]
    body = ((xx - nx / 2) / (0.42 * nx)) ** 2 + ((yy - ny / 2) / (0.35 * ny)) ** 2 < 1
    series_uid, study_uid = generate_uid(entropy_srcs=["bench-series"]), generate_uid(entropy_srcs=["bench-study"])
    hu = np.empty((nz, ny, nx), np.int16)
    order = rng.permutation(nz)
    for n, z in enumerate(order):
        sl = np.where(body, 40, -1000).astype(np.int16) + rng.integers(-20, 20, (ny, nx), dtype=np.int16)
        hu[z] = sl
        meta = FileMetaDataset()
        meta.MediaStorageSOPClassUID = CT_STORAGE
        meta.MediaStorageSOPInstanceUID = generate_uid(entropy_srcs=["bench", str(z)])
        meta.TransferSyntaxUID = ExplicitVRLittleEndian
        path = os.path.join(folder, f"{meta.MediaStorageSOPInstanceUID[-10:]}.dcm")
        ds = FileDataset(path, {}, file_meta=meta, preamble=b"\0" * 128)
        ds.SOPClassUID, ds.SOPInstanceUID = CT_STORAGE, meta.MediaStorageSOPInstanceUID
        ds.Modality, ds.SeriesInstanceUID, ds.StudyInstanceUID = "CT", series_uid, study_uid
        ds.PatientName, ds.PatientID = "BENCH^SYNTHETIC", "BENCH"
        ds.InstanceNumber = int(z) + 1  # in position order: MONAI's PydicomReader stacks by InstanceNumber
        ds.ImagePositionPatient = [-200.0, -180.0, -300.0 + 1.25 * z]
        ds.ImageOrientationPatient = [1, 0, 0, 0, 1, 0]
        ds.PixelSpacing, ds.SliceThickness = [0.78125, 0.78125], 1.25
        ds.Rows, ds.Columns, ds.SamplesPerPixel, ds.PhotometricInterpretation = ny, nx, 1, "MONOCHROME2"
        ds.BitsAllocated, ds.BitsStored, ds.HighBit, ds.PixelRepresentation = 16, 16, 15, 1
        ds.RescaleIntercept, ds.RescaleSlope = -1024, 1
        ds.PixelData = (sl.astype(np.int32) + 1024).astype(np.int16).tobytes()
        ds.is_little_endian, ds.is_implicit_VR = True, False
        ds.save_as(path, write_like_original=False)
    return hu


def pydicom_loop(folder):
    """The plain loop users write: read every file, sort by position along the normal, rescale."""
    slices = [pydicom.dcmread(os.path.join(folder, f)) for f in os.listdir(folder)]
    o = np.array(slices[0].ImageOrientationPatient, float)
    normal = np.cross(o[:3], o[3:])
    slices.sort(key=lambda s: float(np.dot(np.array(s.ImagePositionPatient, float), normal)))
    vol = np.stack([s.pixel_array for s in slices]).astype(np.float64)
    slope = float(slices[0].RescaleSlope)
    inter = float(slices[0].RescaleIntercept)
    return (vol * slope + inter).astype(np.int16)  # [z][y][x]


def drop_cache(folder):
    for f in os.listdir(folder):
        fd = os.open(os.path.join(folder, f), os.O_RDONLY)
        try:
            os.fdatasync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def timed(fn, rounds, cold, folder):
    times = []
    for _ in range(rounds):
        if cold:
            drop_cache(folder)
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def medfast_times(loader, folder, threads, rounds, cold):
    if cold:  # one process per load, each after dropping the pages; the load timed inside
        out = []
        for _ in range(rounds):
            drop_cache(folder)
            r = subprocess.run([loader, folder, "--repeat", "1", "--threads", str(threads)], check=True,
                               capture_output=True, text=True)
            out.append(json.loads(r.stdout)["seconds"][0])
        return statistics.median(out)
    r = subprocess.run([loader, folder, "--repeat", str(rounds + 1), "--threads", str(threads)], check=True,
                       capture_output=True, text=True)
    return statistics.median(json.loads(r.stdout)["seconds"][1:])  # the first load warms the pools


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("--size", default="512,512,300")
    ap.add_argument("--rounds", type=int, default=5)
    monai_peer.add_argument(ap)
    args = ap.parse_args()
    loader = os.path.join(args.build, "bench", "bench_nifti_load")
    if not os.path.exists(loader):
        sys.exit(f"{loader} is missing: configure with -DMEDFAST_BUILD_BENCH=ON and build")
    nx, ny, nz = (int(v) for v in args.size.split(","))
    monai = monai_peer.load(args.monai)

    with tempfile.TemporaryDirectory(prefix="medfast-dicom-bench-") as tmp:
        folder = os.path.join(tmp, "CT")
        os.makedirs(folder)
        truth = write_series(folder, nx, ny, nz)
        mb = sum(os.path.getsize(os.path.join(folder, f)) for f in os.listdir(folder)) / 1e6
        want = zlib.crc32(truth.tobytes())  # [z][y][x] C order = x fastest

        # Verify every side before timing it.
        r = subprocess.run([loader, folder, "--repeat", "1", "--threads", "1"], check=True, capture_output=True,
                           text=True)
        if json.loads(r.stdout)["crc32"] != want:
            sys.exit("MISMATCH: medfast read different Hounsfield units")
        if zlib.crc32(pydicom_loop(folder).tobytes()) != want:
            sys.exit("MISMATCH: the pydicom loop read different Hounsfield units")
        load_monai = None
        if monai is not None:
            from monai.data import PydicomReader
            from monai.transforms import LoadImage
            reader = LoadImage(reader=PydicomReader(), image_only=True)

            def load_monai():
                return reader(folder)

            arr = np.asarray(load_monai())  # [x][y][z] (swap_ij), float32 HU
            if zlib.crc32(np.ascontiguousarray(arr.transpose(2, 1, 0)).astype(np.int16).tobytes()) != want:
                sys.exit("MISMATCH: MONAI's PydicomReader read different Hounsfield units")

        print(f"machine: {machine()}")
        print(f"series: {nx} x {ny} x {nz} int16 CT, {nz} files, {mb:.0f} MB, explicit VR little endian; "
              f"median of {args.rounds}; outputs verified equal (CRC-32 of the HU volume)")
        print(f"{'cache':6} {'medfast 1t':>11} {'medfast 2t':>11} {'pydicom':>9} {'MONAI':>9} "
              f"{'vs MONAI 1t':>12} {'vs MONAI 2t':>12} {'vs pydicom 1t':>14}")
        for cold in (False, True):
            m1 = medfast_times(loader, folder, 1, args.rounds, cold)
            m2 = medfast_times(loader, folder, 2, args.rounds, cold)
            tp = timed(lambda: pydicom_loop(folder), args.rounds, cold, folder)
            tm = timed(load_monai, args.rounds, cold, folder) if load_monai else float("nan")
            print(f"{'cold' if cold else 'warm':6} {m1:>10.3f}s {m2:>10.3f}s {tp:>8.3f}s {tm:>8.3f}s "
                  f"{tm / m1:>11.1f}x {tm / m2:>11.1f}x {tp / m1:>13.1f}x", flush=True)


if __name__ == "__main__":
    main()
