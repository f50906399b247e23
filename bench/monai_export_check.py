#!/usr/bin/env python3
"""`medfast export` against the real MONAI 1.3.2: a trained medfast network, exported,
instantiated by MONAI's ConfigParser from the bundle's configs/inference.json, its
model.pt loaded with load_state_dict(strict=True), and its prediction with the bundle's
own inferer compared with medfast's (`medfast infer` of the same volume with
model.pretrained: the exported model.pt, so the round trip is in it too).

    /usr/bin/python3 bench/monai_export_check.py [--medfast build/medfast]
        [--monai ../shared/peers/monai-1.3.2] [--work DIR] [--networks UNet,SegResNet,SwinUNETR,DynUNet]

For each network: a short medfast run (the built-in default's synthetic data, 2 epochs,
the network swapped in), export, then in this process MONAI builds and loads it. Checks:
  - ConfigParser instantiates network_def and load_state_dict(strict=True) accepts model.pt
    (read with torch.load(weights_only=True));
  - forward equal, end to end: MONAI's SlidingWindowInferer from the bundle, run on one
    volume, gives the labels (the logits' argmax) that `medfast infer` gives for it in
    every voxel but ties (the two largest logits within 1e-4).
  - the bundle runner (monai.bundle.run on configs/inference.json: the deterministic chain on
    the image, the inferer, argmax or sigmoid and threshold, Invertd, SaveImaged) on a folder
    of raw images writes what `medfast infer` writes, voxel for voxel and affine for affine;
  - regions (examples/brats.yaml on `data synth --kind brats`; --no-regions leaves it out):
    the bundle runner again, and MONAI's DiceMetric(mean_batch) on infer's masks equals
    medfast eval's per-region Dice, named TC, WT, ET.
Skips with one line where MONAI is absent. Exit status 1 when a check fails.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, HERE)
import monai_peer  # noqa: E402

NETWORKS = {
    "UNet": {"name": "UNet", "in_channels": 1, "out_channels": 2, "channels": [8, 16, 32], "strides": [2, 2],
             "num_res_units": 1, "norm": "batch"},
    "SegResNet": {"name": "SegResNet", "in_channels": 1, "out_channels": 2, "init_filters": 8,
                  "blocks_down": [1, 2, 2], "blocks_up": [1, 1]},
    # 64: MONAI's instance norm refuses the 1x1x1 bottleneck a 32^3 window has.
    "SwinUNETR": {"name": "SwinUNETR", "img_size": [64, 64, 64], "in_channels": 1, "out_channels": 2,
                  "feature_size": 12, "depths": [1, 1, 1, 1]},
    "DynUNet": {"name": "DynUNet", "in_channels": 1, "out_channels": 2, "kernel_size": [3, 3, [3, 3, 1], 3],
                "strides": [1, 2, [2, 2, 1], 2], "upsample_kernel_size": [2, [2, 2, 1], 2], "filters": [8, 16, 32, 32],
                "res_block": True, "deep_supervision": True, "deep_supr_num": 1},
}
ROI = {"UNet": [32, 32, 32], "SegResNet": [32, 32, 32], "SwinUNETR": [64, 64, 64], "DynUNet": [32, 32, 32]}
SYNTH = {"UNet": "96,96,64", "SegResNet": "96,96,64", "SwinUNETR": "128,128,112", "DynUNet": "96,96,64"}


def run(cmd, **kw):
    r = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if r.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({r.returncode}):\n{r.stdout}\n{r.stderr}")
    return r.stdout


def check_network(name, a, work, monai):
    import nibabel as nib
    import torch
    from monai.bundle import ConfigParser

    folder = os.path.join(work, name)
    os.makedirs(folder, exist_ok=True)
    roi = ROI[name]
    sets = [f"model={json.dumps(NETWORKS[name])}", "train.epochs=2", f"train.run_dir={folder}/run",
            f"data.dataset={folder}/data/dataset.json", f"data.synth.size={SYNTH[name]}", "data.synth.spacing=[2.0,2.0,2.0]",
            "data.deterministic.3.pixdim=[2.0,2.0,2.0]",
            f"validation.sliding_window.roi_size={json.dumps(roi)}", "validation.sliding_window.overlap=0.5",
            "validation.sliding_window.mode=gaussian", f"data.random.0.spatial_size={json.dumps(roi)}"]
    cmd = [a.medfast, "train", "--overwrite"]
    for s in sets:
        cmd += ["--set", s]
    run(cmd, cwd=work)
    bundle = os.path.join(folder, "bundle")
    run([a.medfast, "export", "--checkpoint", f"{folder}/run/last.ckpt", "--out", bundle, "--overwrite"])

    # MONAI: the bundle's network and inferer, the weights read with weights_only=True.
    parser = ConfigParser()
    parser.read_config(os.path.join(bundle, "configs", "inference.json"))
    net = parser.get_parsed_content("network_def")
    state = torch.load(os.path.join(bundle, "model.pt"), map_location="cpu", weights_only=True)
    net.load_state_dict(state, strict=True)
    net.eval()
    inferer = parser.get_parsed_content("inferer")

    # One volume, already in the network's frame (RAS, the training spacing's scale).
    rng = np.random.default_rng(5)
    shape = (80, 72, 72)
    z, y, x = np.meshgrid(*[np.linspace(-1, 1, n) for n in shape], indexing="ij")
    vol = (np.exp(-(z ** 2 + y ** 2 + x ** 2) * 3) + 0.05 * rng.standard_normal(shape)).astype(np.float32)
    path = os.path.join(folder, "volume.nii.gz")
    nib.save(nib.Nifti1Image(vol, np.diag([1.5, 1.5, 2.0, 1.0])), path)
    with torch.no_grad():
        logits = inferer(torch.from_numpy(vol)[None, None], net)[0]
    monai_labels = logits.argmax(0).numpy().astype(np.uint8)
    top2 = torch.topk(logits, 2, dim=0).values
    ties = (top2[0] - top2[1]).abs().numpy() < 1e-4

    # medfast: infer with the exported weights as model.pretrained, no preprocessing.
    config = {
        "model": dict(json.load(open(os.path.join(bundle, "configs", "inference.json")))["medfast"]["config"]["model"],
                      pretrained=os.path.join(bundle, "model.pt")),
        "data": {"deterministic": [{"name": "LoadImage", "keys": ["image"]},
                                   {"name": "EnsureChannelFirst", "keys": ["image"]}]},
        "validation": {"sliding_window": dict(parser.get("inferer"))},
    }
    config["validation"]["sliding_window"].pop("_target_", None)
    cfg_path = os.path.join(folder, "infer.json")
    json.dump(config, open(cfg_path, "w"))
    out = os.path.join(folder, "pred")
    shutil.rmtree(out, ignore_errors=True)
    run([a.medfast, "infer", "--config", cfg_path, "--output", out, "--input", path])
    pred = [f for f in os.listdir(out) if f.endswith((".nii", ".nii.gz"))]
    medfast_labels = np.asarray(nib.load(os.path.join(out, pred[0])).dataobj).astype(np.uint8).reshape(shape)
    differ = (medfast_labels != monai_labels) & ~ties
    ok = not differ.any()
    # The bundle as MONAI's runner uses it: the raw synthetic images, preprocessed by the
    # bundle's own chain, inferred, inverted and saved, against medfast infer.
    images = os.path.join(folder, "images")
    shutil.rmtree(images, ignore_errors=True)
    os.makedirs(images)
    shutil.copy(os.path.join(folder, "data", "imagesTr", "spleen_0.nii.gz"), images)
    ok = bundle_runner_agrees(bundle, images, f"{folder}/run/last.ckpt", a, folder, f"{name} bundle") and ok
    print(f"{name}: ConfigParser built {type(net).__name__}, load_state_dict(strict=True) took {len(state)} tensors; "
          f"labels: {int((medfast_labels == monai_labels).sum())}/{vol.size} voxels equal "
          f"({int((monai_labels > 0).sum())} foreground), "
          f"{int(ties.sum())} ties, {int(differ.sum())} differ off ties -> {'ok' if ok else 'FAILED'}", flush=True)
    return ok


def bundle_runner_agrees(bundle, images, checkpoint, a, work, tag):
    """MONAI's bundle runner (monai.bundle.run: initialize, then run, as `python -m monai.bundle
    run` does) on a folder of images with the exported configs/inference.json, against
    `medfast infer` of the same checkpoint: the same files, grids and labels in every voxel."""
    import nibabel as nib
    from monai.bundle import run as bundle_run

    out_monai, out_medfast = os.path.join(work, f"{tag}-monai"), os.path.join(work, f"{tag}-medfast")
    for d in (out_monai, out_medfast):
        shutil.rmtree(d, ignore_errors=True)
    cwd = os.getcwd()
    os.chdir(bundle)  # the runner's bundle_root is "."
    try:
        bundle_run(config_file="configs/inference.json", dataset_dir=images, output_dir=out_monai)
    finally:
        os.chdir(cwd)
    run([a.medfast, "infer", "--checkpoint", checkpoint, "--input", images, "--output", out_medfast])
    names = sorted(f for f in os.listdir(out_medfast) if f.endswith(".nii.gz"))
    ok, equal, total = names == sorted(os.listdir(out_monai)), 0, 0
    for n in names if ok else []:
        m, o = nib.load(os.path.join(out_medfast, n)), nib.load(os.path.join(out_monai, n))
        x, y = np.asarray(m.dataobj), np.asarray(o.dataobj).reshape(np.asarray(m.dataobj).shape)
        ok = ok and np.allclose(m.affine, o.affine, atol=1e-5)
        equal += int((x == y).sum())
        total += x.size
    share = equal / total if total else 0.0
    ok = ok and share >= 0.9999
    print(f"{tag}: MONAI's bundle runner and medfast infer wrote {len(names)} files ({', '.join(names)}); "
          f"{equal}/{total} voxels equal ({share:.6f}), affines equal -> {'ok' if ok else 'FAILED'}", flush=True)
    return ok


def check_regions(a, work, monai):
    """examples/brats.yaml's sigmoid regions: a short run on `data synth --kind brats`, then
    (1) MONAI's bundle runner on the export agrees with `medfast infer`, and (2) MONAI's
    DiceMetric (include_background, mean_batch) on infer's region masks, against regions made
    from the labels as the recipe's LabelToRegions does, gives medfast eval's per-region Dice."""
    import nibabel as nib
    import torch

    folder = os.path.join(work, "regions")
    os.makedirs(folder, exist_ok=True)
    data = os.path.join(folder, "data")
    run([a.medfast, "data", "synth", "--kind", "brats", "--out", data, "--cases", "6", "--size", "48,48,32",
         "--overwrite"])
    sets = [f"data.dataset={data}/dataset.json", "data.validation.num=2", "data.cache.kind=memory",
            "data.random.0.roi_size=[32,32,32]", "validation.sliding_window.roi_size=[48,48,32]",
            "validation.interval=1", "model.init_filters=8", "optimizer.lr=0.001", "data.loader.batch_size=1",
            "train.device=cpu", "train.amp=false", "train.epochs=3", f"train.run_dir={folder}/run"]
    cmd = [a.medfast, "train", "--overwrite", "--config", os.path.join(REPO, "examples", "brats.yaml")]
    for x in sets:
        cmd += ["--set", x]
    run(cmd)
    ckpt = os.path.join(folder, "run", "best.ckpt")
    bundle = os.path.join(folder, "bundle")
    run([a.medfast, "export", "--checkpoint", ckpt, "--out", bundle, "--overwrite"])
    listing = json.load(open(os.path.join(data, "dataset.json")))["training"][-2:]  # the validation items
    images = os.path.join(folder, "images")
    shutil.rmtree(images, ignore_errors=True)
    os.makedirs(images)
    for item in listing:
        shutil.copy(os.path.join(data, item["image"]), images)
    ok = bundle_runner_agrees(bundle, images, ckpt, a, folder, "regions")
    # MONAI's DiceMetric on medfast infer's masks vs medfast eval's own per-region Dice.
    ev = json.loads(run([a.medfast, "eval", "--checkpoint", ckpt, "--json"]))
    regions = [[2, 3], [1, 2, 3], [3]]
    metric = monai.metrics.DiceMetric(include_background=True, reduction="mean_batch")
    for item in listing:
        name = os.path.basename(item["image"]).replace(".nii.gz", "_seg.nii.gz")
        pred = np.asarray(nib.load(os.path.join(folder, "regions-medfast", name)).dataobj)  # X, Y, Z, region
        label = np.asarray(nib.load(os.path.join(data, item["label"])).dataobj)
        truth = np.stack([np.isin(label, r) for r in regions], axis=-1)
        metric(torch.from_numpy(np.moveaxis(pred, -1, 0)[None].astype(np.float32)),
               torch.from_numpy(np.moveaxis(truth, -1, 0)[None].astype(np.float32)))
    theirs = [float(v) for v in metric.aggregate()]
    ours = ev["mean_dice_per_class"]
    same = all(abs(x - y) <= 1e-6 for x, y in zip(theirs, ours)) and ev["class_names"] == ["TC", "WT", "ET"]
    print(f"regions: MONAI DiceMetric(mean_batch) on medfast infer's masks {[round(x, 6) for x in theirs]}, medfast "
          f"eval {[round(x, 6) for x in ours]} ({', '.join(ev['class_names'])}) -> {'ok' if same else 'FAILED'}",
          flush=True)
    return ok and same


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--medfast", default=os.path.join(REPO, "build", "medfast"))
    ap.add_argument("--work", default=None)
    ap.add_argument("--networks", default=",".join(NETWORKS))
    ap.add_argument("--no-regions", dest="regions", action="store_false",
                    help="leave out the sigmoid-regions check (examples/brats.yaml: bundle runner, DiceMetric)")
    monai_peer.add_argument(ap)
    a = ap.parse_args()
    # Debian 12 has no einops, which MONAI's SwinUNETR imports (for plain permutations):
    # the stand-in the network goldens use, installed before MONAI looks for it.
    sys.path.insert(0, os.path.join(REPO, "tests", "golden"))
    from make_monai_networks import install_einops_permute
    install_einops_permute()
    if monai_peer.load(a.monai) is None:
        print("monai_export_check: skipped (no MONAI peer)")
        return
    import monai
    work = a.work or tempfile.mkdtemp(prefix="medfast-export-check-")
    try:
        results = [check_network(n, a, work, monai) for n in a.networks.split(",") if n]
        if a.regions:
            results.append(check_regions(a, work, monai))
    finally:
        if a.work is None:
            shutil.rmtree(work, ignore_errors=True)
    print(f"monai_export_check: MONAI {monai.__version__}: {sum(results)}/{len(results)} networks ok")
    sys.exit(0 if all(results) else 1)


if __name__ == "__main__":
    main()
