#!/usr/bin/env python3
"""NIfTI load speed: medfast vs nibabel (and vs `cat > /dev/null` for .nii), in one run.

Usage: /usr/bin/python3 bench/nifti_load.py [--build build] [--size 512,512,200] [--repeat 5]

Writes a spleen-like int16 CT volume with `medfast data synth` as .nii.gz and
.nii, checks that medfast and nibabel decode identical voxels (CRC-32 in file
order), then times warm loads (files in the page cache) and prints MB/s of
decompressed data and the ratios. nibabel is timed on
np.asanyarray(nib.load(f, mmap=False).dataobj), so both produce a full
in-memory array.
"""
import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import zlib

import nibabel as nib
import numpy as np


def median_time(fn, repeat):
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def machine():
    cpu = "unknown cpu"
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{cpu}, {os.cpu_count()} cores, {platform.system()} {platform.release()}"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("--size", default="512,512,200")
    ap.add_argument("--repeat", type=int, default=6)
    args = ap.parse_args()
    medfast = os.path.join(args.build, "medfast")
    loader = os.path.join(args.build, "bench", "bench_nifti_load")
    for exe in (medfast, loader):
        if not os.path.exists(exe):
            sys.exit(f"{exe} is missing: configure with -DMEDFAST_BUILD_BENCH=ON and build")

    with tempfile.TemporaryDirectory(prefix="medfast-bench-") as tmp:
        subprocess.run([medfast, "data", "synth", "--out", tmp, "--cases", "1", "--size", args.size, "--seed", "1"],
                       check=True, stdout=subprocess.DEVNULL)
        gz = os.path.join(tmp, "imagesTr", "spleen_0.nii.gz")
        plain = os.path.join(tmp, "spleen_0.nii")
        img = nib.load(gz)
        nib.save(nib.Nifti1Image(np.asanyarray(img.dataobj), img.affine, img.header), plain)

        print(f"machine: {machine()}")
        print(f"volume: {args.size} int16, .nii.gz {os.path.getsize(gz) / 1e6:.1f} MB, "
              f".nii {os.path.getsize(plain) / 1e6:.1f} MB; warm page cache; median of {args.repeat}")
        rows = []
        for path, kind in ((gz, ".nii.gz"), (plain, ".nii")):
            ref = np.asanyarray(nib.load(path, mmap=False).dataobj)
            ref_crc = zlib.crc32(ref.tobytes(order="F"))
            nbytes = ref.nbytes
            t_nib = median_time(lambda: np.asanyarray(nib.load(path, mmap=False).dataobj), args.repeat)
            for threads in (1, 2):
                out = subprocess.run([loader, path, "--repeat", str(args.repeat), "--threads", str(threads)],
                                     check=True, capture_output=True, text=True).stdout
                res = json.loads(out)
                if res["crc32"] != ref_crc or res["bytes"] != nbytes:
                    sys.exit(f"MISMATCH: medfast decoded different voxels from {path}")
                # Load 1 writes into fresh memory; later loads reuse pooled buffers
                # (the steady state of a loader decoding volume after volume).
                t_first = res["seconds"][0]
                t_mf = statistics.median(res["seconds"][1:])
                rows.append((kind, threads, nbytes / t_mf / 1e6, nbytes / t_first / 1e6, nbytes / t_nib / 1e6,
                             t_nib / t_mf))
            if kind == ".nii":
                t_cat = median_time(lambda: subprocess.run(["cat", path], stdout=subprocess.DEVNULL, check=True),
                                    args.repeat)
                cat_mbs = os.path.getsize(path) / t_cat / 1e6
        print("voxels verified identical to nibabel (CRC-32)")
        print(f"{'file':8} {'threads':>7} {'medfast MB/s':>13} {'(1st load)':>11} {'nibabel MB/s':>13} "
              f"{'vs nibabel':>11}")
        for kind, threads, mf, first, nb, ratio in rows:
            extra = f"   vs cat: {mf / cat_mbs:.2f}x (cat {cat_mbs:.0f} MB/s)" if kind == ".nii" else ""
            print(f"{kind:8} {threads:>7} {mf:>13.0f} {first:>11.0f} {nb:>13.0f} {ratio:>10.2f}x{extra}")


if __name__ == "__main__":
    main()
