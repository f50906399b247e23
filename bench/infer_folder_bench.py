#!/usr/bin/env python3
"""`medfast infer` over a folder against the same cases one by one (issue 26, item 4).

Usage: /usr/bin/python3 bench/infer_folder_bench.py [--cases 8] [--rounds 3] [--threads 2]
           [--medfast build/medfast] [--monai ../shared/peers/monai-1.3.2] [--work DIR]

The cases: --cases synthetic CT-like float32 volumes of spleen-CT sizes after the recipe's
spacing (200..260 x 200..250 x 90..130 voxels), written as .nii.gz, one folder. The network
and sliding window are inference_bench.py's cell a (the spleen recipe's UNet with batch norm,
roi 96^3, overlap 0.5, gaussian, sw_batch_size 4, 2 classes; weights made by MONAI's UNet,
hence the MONAI peer: without it the benchmark says so and stops).

Per round:
  single  each case in its own `medfast infer --input CASE` process; its sliding-window
          seconds (`infer_seconds` of --json: the windows, the network and the labels);
  folder  one `medfast infer --input FOLDER` process: its wall time, start to exit (start-up,
          the model, reading, inference, writing: everything).
Verified first: the folder run's label files equal the single runs' byte for byte in their
voxels. Reported: the folder's wall time over the sum of the single runs' sliding-window times
(the target: at most 1.1x), median over rounds, with each stage's sums.
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, HERE)

import inference_bench  # noqa: E402  (the cell, the image maker, the weights)

SHAPES = [(250, 250, 120), (230, 230, 100), (260, 240, 110), (210, 210, 90),
          (240, 250, 130), (220, 200, 100), (250, 230, 115), (200, 220, 95)]


def make_case(path, shape, seed):
    import nibabel as nib
    import numpy as np
    tmp = path + ".tmp.nii"
    inference_bench.make_image(tmp, shape)
    img = nib.load(tmp)
    vol = np.asarray(img.dataobj, dtype=np.float32)
    vol = np.roll(vol, seed * 7, axis=0)  # not eight copies of one picture
    nib.save(nib.Nifti1Image(vol, img.affine), path)
    os.remove(tmp)


def run_json(cmd):
    start = time.perf_counter()
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wall = time.perf_counter() - start
    if r.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} exited with {r.returncode}: {r.stderr}")
    return json.loads(r.stdout[r.stdout.index("{"):]), wall


def labels_of(path):
    import nibabel as nib
    import numpy as np
    return np.asarray(nib.load(path).dataobj)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cases", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--medfast", default=os.path.join(REPO, "build", "medfast"))
    ap.add_argument("--work", default=None, help="folder for the inputs and outputs (default: a temporary one)")
    import monai_peer
    monai_peer.add_argument(ap)
    a = ap.parse_args()
    if not 1 <= a.cases <= len(SHAPES):
        raise SystemExit(f"--cases: 1 to {len(SHAPES)}")
    if monai_peer.load(a.monai) is None:
        print("infer_folder_bench: skipped (no MONAI peer to make the weights)")
        return
    work = a.work or tempfile.mkdtemp(prefix="medfast-infer-folder-")
    try:
        cases = os.path.join(work, "cases")
        os.makedirs(cases, exist_ok=True)
        files = []
        for i, shape in enumerate(SHAPES[:a.cases]):
            f = os.path.join(cases, f"case_{i}.nii.gz")
            if not os.path.exists(f):
                make_case(f, shape, i)
            files.append(f)
        cell = inference_bench.CELLS["a"]
        weights = os.path.join(work, "weights.pt")
        if not os.path.exists(weights):
            inference_bench.make_weights(weights, cell["classes"])
        config = os.path.join(work, "config.json")
        inference_bench.medfast_config(config, cell, weights, a.threads)
        base = [a.medfast, "--progress", "off", "infer", "--config", config, "--json"]
        rounds = []
        for r in range(a.rounds):
            single = []
            for f in files:
                out = os.path.join(work, "single")
                j, _ = run_json(base + ["--input", f, "--output", out])
                single.append(j["cases"][0])
            out = os.path.join(work, "folder")
            shutil.rmtree(out, ignore_errors=True)
            j, wall = run_json(base + ["--input", cases, "--output", out])
            if r == 0:  # verify before any figure counts
                for c in j["cases"]:
                    name = os.path.basename(c["output"])
                    one = os.path.join(work, "single", name)
                    if not (labels_of(c["output"]) == labels_of(one)).all():
                        raise SystemExit(f"{name}: the folder run's labels differ from the single run's")
                print(f"verified: the folder run's {len(j['cases'])} label files equal the single runs'", flush=True)
            sw = sum(c["infer_seconds"] for c in single)
            rounds.append({"folder_wall": wall, "single_infer_sum": sw, "ratio": wall / sw,
                           "single_read_sum": sum(c["read_seconds"] for c in single),
                           "single_write_sum": sum(c["write_seconds"] for c in single),
                           "folder_infer_sum": sum(c["infer_seconds"] for c in j["cases"]),
                           "folder_wait_sum": sum(c["wait_seconds"] for c in j["cases"]),
                           "folder_peak_rss": max(c["peak_rss_bytes"] for c in j["cases"])})
            x = rounds[-1]
            print(f"round {r + 1}: folder wall {wall:.2f} s, sum of single sliding windows {sw:.2f} s: "
                  f"{x['ratio']:.3f}x (folder: inference {x['folder_infer_sum']:.2f} s, waited for reads "
                  f"{x['folder_wait_sum']:.2f} s; single runs read {x['single_read_sum']:.2f} s, wrote "
                  f"{x['single_write_sum']:.2f} s)", flush=True)
        med = {k: statistics.median(x[k] for x in rounds) for k in rounds[0]}
        print(f"median of {a.rounds}: folder {med['folder_wall']:.2f} s / single sliding windows "
              f"{med['single_infer_sum']:.2f} s = {med['ratio']:.3f}x (target <= 1.1x)")
        print(json.dumps({"bench": "infer_folder", "cases": a.cases, "threads": a.threads,
                          "machine": inference_bench.machine(), "median": med, "rounds": rounds}))
    finally:
        if a.work is None:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
