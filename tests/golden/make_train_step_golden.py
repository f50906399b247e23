#!/usr/bin/env python3
"""Reference for one training step (tests/train/test_trainer.cpp, OneStepMatchesPythonTorch).

Reads the C++ test's weights and batch (DIR/manifest.json + raw float32 .bin files),
builds the same network with plain torch.nn.functional ops: MONAI's UNet with
channels (4, 8), strides (2,), num_res_units 0, instance norm, i.e.
    down:   conv3d(1->4, stride 2) -> instance norm -> PReLU
    bottom: conv3d(4->8)           -> instance norm -> PReLU
    up:     conv_transpose3d(cat(down, bottom): 12->2, stride 2, output_padding 1)
and runs two steps of DiceCE (MONAI: softmax, one-hot target, include_background,
smooth 1e-5, mean over batch and classes; plus cross entropy on class indices) with
torch.optim.SGD(lr 0.1, momentum 0.9, weight_decay 1e-4). Writes DIR/out.json (losses)
and DIR/out.<param>.bin (weights after the steps).
"""
import json
import sys

import numpy as np
import torch
import torch.nn.functional as F


def main(d):
    manifest = json.load(open(f"{d}/manifest.json"))
    load = lambda n: torch.from_numpy(np.fromfile(f"{d}/{n}.bin", dtype=np.float32).reshape(manifest[n]).copy())
    names = [k[len("param."):] for k in manifest if k.startswith("param.")]
    P = {n: load("param." + n).requires_grad_(True) for n in names}
    x, y = load("x"), load("y")

    def block(h, prefix, stride):
        h = F.conv3d(h, P[prefix + ".conv.weight"], P[prefix + ".conv.bias"], stride=stride, padding=1)
        h = F.instance_norm(h, eps=1e-5)
        return F.prelu(h, P[prefix + ".adn.A.weight"])

    def forward(x):
        down = block(x, "model.0", 2)  # MONAI's names: model.0.conv, model.0.adn.A, ...
        bottom = block(down, "model.1.submodule", 1)
        cat = torch.cat([down, bottom], 1)
        return F.conv_transpose3d(cat, P["model.2.conv.weight"], P["model.2.conv.bias"], stride=2, padding=1,
                                  output_padding=1)

    def dice_ce(logits, target):
        p = torch.softmax(logits, 1)
        onehot = F.one_hot(target[:, 0].long(), logits.shape[1]).permute(0, 4, 1, 2, 3).float()
        dims = (2, 3, 4)
        inter = (p * onehot).sum(dims)
        denom = p.sum(dims) + onehot.sum(dims)
        dice = (1.0 - (2.0 * inter + 1e-5) / (denom + 1e-5)).mean()
        ce = F.cross_entropy(logits, target[:, 0].long())
        return dice + ce

    opt = torch.optim.SGD([P[n] for n in names], lr=0.1, momentum=0.9, weight_decay=1e-4)
    losses = []
    for _ in range(2):
        opt.zero_grad()
        loss = dice_ce(forward(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    json.dump({"losses": losses}, open(f"{d}/out.json", "w"))
    for n in names:
        P[n].detach().numpy().astype(np.float32).tofile(f"{d}/out.{n}.bin")


if __name__ == "__main__":
    main(sys.argv[1])
