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
    print(f"{name}: ConfigParser built {type(net).__name__}, load_state_dict(strict=True) took {len(state)} tensors; "
          f"labels: {int((medfast_labels == monai_labels).sum())}/{vol.size} voxels equal "
          f"({int((monai_labels > 0).sum())} foreground), "
          f"{int(ties.sum())} ties, {int(differ.sum())} differ off ties -> {'ok' if ok else 'FAILED'}", flush=True)
    return ok


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--medfast", default=os.path.join(REPO, "build", "medfast"))
    ap.add_argument("--work", default=None)
    ap.add_argument("--networks", default=",".join(NETWORKS))
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
    finally:
        if a.work is None:
            shutil.rmtree(work, ignore_errors=True)
    print(f"monai_export_check: MONAI {monai.__version__}: {sum(results)}/{len(results)} networks ok")
    sys.exit(0 if all(results) else 1)


if __name__ == "__main__":
    main()
