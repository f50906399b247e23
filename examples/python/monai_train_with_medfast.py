#!/usr/bin/env python3
"""A MONAI network and loss, trained from medfast's cached pipeline and threaded loader.

    PYTHONPATH=/path/to/monai python3 examples/python/monai_train_with_medfast.py [--epochs 40] [--target 0.8]

MONAI is imported from PYTHONPATH, or from MONAI_PATH (e.g. the project's peer copy:
MONAI_PATH=../shared/peers/monai-1.3.2). The data side is medfast's: the built-in
default run's data section (`medfast.train.default_config()`: a small synthetic
spleen-like set that it writes to data/synth-small, the spleen recipe's chains,
a memory cache) as a `medfast.data.CachedDataset`, batched and augmented by
`medfast.data.Loader`. The model side is MONAI's: UNet, DiceCELoss, Adam,
sliding_window_inference and DiceMetric on the validation items. The run stops
when the validation Dice reaches --target.
"""
import argparse
import os
import sys
import time

import torch

import medfast


def import_monai():
    path = os.environ.get("MONAI_PATH")
    if path:
        sys.path.insert(0, os.path.abspath(path))
    try:
        import monai  # noqa: F401
    except ImportError:
        sys.exit("MONAI is not importable: put it on PYTHONPATH or set MONAI_PATH (e.g. ../shared/peers/monai-1.3.2)")
    import monai.inferers
    import monai.losses
    import monai.metrics
    import monai.networks.nets
    return monai


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--epochs", type=int, default=40)
    p.add_argument("--target", type=float, default=0.8)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()
    monai = import_monai()
    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)

    config = medfast.train.default_config()
    config["data"]["loader"]["threads"] = 1  # the other core runs the network
    train_ds = medfast.data.CachedDataset(config)
    val_ds = medfast.data.CachedDataset(config, validation=True)
    loader = medfast.data.Loader(train_ds)
    print(f"medfast: {len(train_ds)} training and {len(val_ds)} validation items cached; "
          f"{len(loader)} batches per epoch")

    net = monai.networks.nets.UNet(spatial_dims=3, in_channels=1, out_channels=2, channels=(8, 16, 32, 64),
                                   strides=(2, 2, 2), num_res_units=1, norm="instance")
    loss_fn = monai.losses.DiceCELoss(to_onehot_y=True, softmax=True)
    opt = torch.optim.Adam(net.parameters(), lr=5e-3)
    dice = monai.metrics.DiceMetric(include_background=False, reduction="mean")
    start = time.time()
    for epoch in range(a.epochs):
        net.train()
        loader.set_epoch(epoch)
        losses = []
        for batch in loader:
            opt.zero_grad()
            loss = loss_fn(net(batch["image"]), batch["label"])
            loss.backward()
            opt.step()
            losses.append(loss.item())
        net.eval()
        dice.reset()
        with torch.no_grad():
            for i in range(len(val_ds)):
                item = val_ds[i]
                logits = monai.inferers.sliding_window_inference(item["image"][None], (32, 32, 16), 4, net,
                                                                 overlap=0.25)
                pred = torch.nn.functional.one_hot(logits.argmax(1), 2).permute(0, 4, 1, 2, 3)
                truth = torch.nn.functional.one_hot(item["label"][None, 0].long(), 2).permute(0, 4, 1, 2, 3)
                dice(pred, truth)
        d = dice.aggregate().item()
        print(f"epoch {epoch + 1}: loss {sum(losses) / len(losses):.4f}  validation dice {d:.4f}  "
              f"{time.time() - start:.1f} s", flush=True)
        if d >= a.target:
            print(f"reached dice {a.target} after {epoch + 1} epochs, {time.time() - start:.1f} s")
            return 0
    print(f"dice {a.target} not reached in {a.epochs} epochs")
    return 1


if __name__ == "__main__":
    sys.exit(main())
