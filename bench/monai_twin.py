#!/usr/bin/env python3
"""MONAI's twin of a medfast training run: the same config, trained with MONAI 1.3 (issue 11).

Usage: /usr/bin/python3 bench/monai_twin.py --config RUN_DIR/config.json --base DIR [--seed S]
           [--threads 2] [--run-dir DIR] [--monai ../shared/peers/monai-1.3.2]

bench/default_run.py runs it beside medfast's built-in default run. It reads the config
medfast wrote into its run folder (config.json: the built-in default plus any --set; paths
relative to --base, the folder medfast ran in) and runs that config with MONAI, as MONAI's
spleen fast-training tutorial would:
  data        the same dataset list, training items and validation items ({num: N}: the last N);
  chains      the same deterministic and random chains as MONAI dictionary transforms
              (monai_peer.transforms); the deterministic outputs cached by CacheDataset
              (cache_rate 1, num_workers = threads), ending with EnsureTyped(track_meta=False),
              and meta tracking off afterwards (the tutorial's fast path);
  loader      ThreadDataLoader(num_workers=0) with the config's batch size and shuffle, batching
              the image and label only (SelectItemsd), as medfast's loader does;
  model       monai.networks.nets.UNet(spatial_dims=3, the config's arguments);
  loss        DiceCELoss / DiceLoss / DiceFocalLoss with the config's flags;
  optimizer   torch.optim.Adam / SGD / AdamW (MONAI's Novograd) with the config's arguments;
              a constant learning rate (other schedules are refused);
  validation  every `interval` epochs and the last: sliding_window_inference with the config's
              roi_size, sw_batch_size, overlap and mode on each validation item, argmax, and
              DiceMetric(include_background=False, reduction="mean");
  stop        when the validation Dice reaches train.target_dice, else after train.epochs;
  files       best.pt when the Dice improves, last.pt (model and optimizer) and a metrics.jsonl
              line every epoch, as medfast writes best.ckpt, last.ckpt and metrics.jsonl.
torch.set_num_threads(threads) and monai.utils.set_determinism(seed). Prints one JSON
document on stdout: per-epoch seconds (training + validation, as medfast's epoch
"seconds"), loss, Dice, steps and samples, and the time to the target from the start of
the run (before the caches fill, as medfast's "elapsed").
"""
import argparse
import io
import json
import math
import os
import struct
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import monai_peer  # noqa: E402


def refuse(what):
    sys.exit(f"monai_twin: {what} is not supported by the MONAI twin")


def dataset_items(config, base):
    """(training files, validation files) as medfast selects them."""
    d = config["data"]
    path = os.path.join(base, d["dataset"])
    folder = os.path.dirname(path)
    listing = json.load(open(path))

    def files(section):
        return [{"image": os.path.normpath(os.path.join(folder, i["image"])),
                 "label": os.path.normpath(os.path.join(folder, i["label"]))} for i in listing[section]]
    train, val = files(d.get("section", "training")), []
    if d.get("fold") is not None:
        refuse("data.fold")
    v = d.get("validation")
    if v and "num" in v:
        train, val = train[:-v["num"]], train[-v["num"]:]
    elif v and "section" in v:
        val = files(v["section"])
    return train, val


def network(monai, model):
    args = {k: (tuple(x) if isinstance(x, list) else x) for k, x in model.items() if k != "name"}
    if model.get("name") != "UNet":
        refuse(f"model {model.get('name')}")
    args.setdefault("spatial_dims", 3)
    return monai.networks.nets.UNet(**args)


def loss_function(monai, loss):
    names = {"DiceCE": monai.losses.DiceCELoss, "Dice": monai.losses.DiceLoss, "DiceFocal": monai.losses.DiceFocalLoss}
    if loss.get("sigmoid"):
        refuse("a sigmoid loss (the twin scores softmax models)")
    return names[loss.get("name", "DiceCE")](**{k: v for k, v in loss.items() if k != "name"})


def optimizer(monai, params, opt, schedule):
    if schedule and schedule.get("name", "constant") != "constant":
        refuse(f"schedule {schedule.get('name')}")
    args = {k: (tuple(v) if isinstance(v, list) else v) for k, v in opt.items() if k != "name"}
    kinds = {"Adam": torch.optim.Adam, "SGD": torch.optim.SGD, "AdamW": torch.optim.AdamW}
    if opt["name"] == "Novograd":
        return monai.optimizers.Novograd(params, **args)
    return kinds[opt["name"]](params, **args)


def caches(monai, config, train_files, val_files, threads):
    """The training and validation CacheDatasets (filled now) and the training loader."""
    d, t = config["data"], config["train"]
    keys = [t.get("image_key", "image"), t.get("label_key", "label")]
    deterministic = monai_peer.transforms(monai, d["deterministic"])
    deterministic.append(monai.transforms.EnsureTyped(keys=keys, track_meta=False))
    random = monai_peer.transforms(monai, d.get("random", []))
    # medfast's loader batches the volumes only; MONAI's collates every key, and index arrays
    # that no transform consumed (different lengths per item) would stop it.
    random.append(monai.transforms.SelectItemsd(keys=keys))
    train_ds = monai.data.CacheDataset(train_files, transform=monai.transforms.Compose(deterministic + random),
                                       cache_rate=1.0, num_workers=threads, progress=False)
    val_ds = monai.data.CacheDataset(val_files, transform=monai.transforms.Compose(deterministic),
                                     cache_rate=1.0, num_workers=threads, progress=False) if val_files else None
    monai.data.set_track_meta(False)  # the random chain and the network run on plain tensors
    loader = d.get("loader", {})
    train_loader = monai.data.ThreadDataLoader(train_ds, batch_size=loader.get("batch_size", 1), num_workers=0,
                                               shuffle=loader.get("shuffle", True),
                                               drop_last=loader.get("drop_last", False))
    return train_loader, val_ds, keys


def validate(monai, model, val_ds, keys, config):
    """Mean validation Dice of the foreground classes, as medfast scores a softmax model."""
    sw = dict(config.get("validation", {}).get("sliding_window", {}))
    roi, sw_batch = tuple(sw.pop("roi_size")), sw.pop("sw_batch_size", 1)
    classes = config["model"].get("out_channels", 2)
    metric = monai.metrics.DiceMetric(include_background=False, reduction="mean")
    model.eval()
    with torch.no_grad():
        for i in range(len(val_ds)):
            item = val_ds[i]
            x = torch.as_tensor(item[keys[0]])[None].float()
            logits = monai.inferers.sliding_window_inference(x, roi, sw_batch, model, **sw)
            pred = torch.nn.functional.one_hot(logits.argmax(1), classes).permute(0, 4, 1, 2, 3)
            label = torch.as_tensor(item[keys[1]])[None, 0].long()
            truth = torch.nn.functional.one_hot(label, classes).permute(0, 4, 1, 2, 3)
            metric(pred, truth)
    model.train()
    return metric.aggregate().item()


def train_epoch(model, loader, keys, loss_fn, opt):
    """One pass over the loader: (mean step loss, steps, samples)."""
    model.train()
    loss_sum, steps, samples = 0.0, 0, 0
    for batch in loader:
        x, y = batch[keys[0]].float(), batch[keys[1]]
        opt.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        loss_sum += loss.item()
        steps += 1
        samples += x.shape[0]
    if steps == 0:  # ThreadDataLoader's producer thread died (its traceback is above)
        sys.exit("monai_twin: the training loader delivered no batch")
    return loss_sum / steps, steps, samples


def save(run_dir, model, opt, record, improved):
    if improved:
        torch.save(model.state_dict(), os.path.join(run_dir, "best.pt"))
    torch.save({"model": model.state_dict(), "optimizer": opt.state_dict()}, os.path.join(run_dir, "last.pt"))
    with open(os.path.join(run_dir, "metrics.jsonl"), "a") as f:
        f.write(json.dumps(record) + "\n")


def run(monai, config, base, seed, threads, run_dir):
    """The whole run; returns the result document."""
    start = time.perf_counter()
    torch.set_num_threads(threads)
    monai.utils.set_determinism(seed=seed)
    train_files, val_files = dataset_items(config, base)
    loader, val_ds, keys = caches(monai, config, train_files, val_files, threads)
    prepare = time.perf_counter() - start
    model = network(monai, config["model"])
    loss_fn = loss_function(monai, config.get("loss", {}))
    opt = optimizer(monai, model.parameters(), config["optimizer"], config.get("schedule"))
    t = config["train"]
    epochs, target = t.get("epochs", 1), t.get("target_dice", 0)
    interval = config.get("validation", {}).get("interval", 1)
    result = {"history": [], "reached_target": False, "time_to_target": None, "best_dice": -1.0,
              "prepare_seconds": prepare, "train_items": len(train_files), "val_items": len(val_files),
              "parameters": sum(p.numel() for p in model.parameters() if p.requires_grad)}
    for epoch in range(epochs):
        t0 = time.perf_counter()
        loss, steps, samples = train_epoch(model, loader, keys, loss_fn, opt)
        train_seconds = time.perf_counter() - t0
        dice = None
        if val_ds is not None and ((epoch + 1) % interval == 0 or epoch + 1 == epochs):
            dice = validate(monai, model, val_ds, keys, config)
        rec = {"epoch": epoch + 1, "loss": loss, "dice": dice, "steps": steps, "samples": samples,
               "train_seconds": train_seconds, "seconds": time.perf_counter() - t0,
               "elapsed": time.perf_counter() - start}
        improved = dice is not None and not math.isnan(dice) and dice > result["best_dice"]
        result["best_dice"] = dice if improved else result["best_dice"]
        result["history"].append(rec)
        save(run_dir, model, opt, rec, improved)
        print(f"epoch {epoch + 1}: loss {loss:.4f}, Dice {dice}, {rec['seconds']:.2f} s", file=sys.stderr, flush=True)
        if dice is not None and target > 0 and dice >= target:
            result["reached_target"], result["time_to_target"] = True, rec["elapsed"]
            break
    result["seconds"] = time.perf_counter() - start
    return result


def medfast_checkpoint(path):
    """A medfast checkpoint (MFCKPT01 header, JSON, libtorch archive): (meta, state_dict without 'model.')."""
    data = open(path, "rb").read()
    assert data[:8] == b"MFCKPT01", path
    json_len, archive_len = struct.unpack("<QQ", data[8:24])
    meta = json.loads(data[32:32 + json_len])
    archive = torch.jit.load(io.BytesIO(data[32 + json_len:32 + json_len + archive_len]))
    state = dict(archive.named_parameters())
    state.update(dict(archive.named_buffers()))
    return meta, {k[len("model."):]: v.detach() for k, v in state.items() if k.startswith("model.")}


def score_checkpoint(monai, config, base, checkpoint, threads):
    """MONAI's validation (this twin's chain, sliding window and metric) of medfast's trained weights."""
    torch.set_num_threads(threads)
    _, val_files = dataset_items(config, base)
    d, t = config["data"], config["train"]
    keys = [t.get("image_key", "image"), t.get("label_key", "label")]
    deterministic = monai_peer.transforms(monai, d["deterministic"])
    val_ds = monai.data.CacheDataset(val_files, transform=monai.transforms.Compose(deterministic),
                                     cache_rate=1.0, num_workers=threads, progress=False)
    model = network(monai, config["model"])
    meta, state = medfast_checkpoint(checkpoint)
    model.load_state_dict(state, strict=True)  # same module names and shapes: the same UNet
    parameters = sum(p.numel() for p in model.parameters())
    return meta, validate(monai, model, val_ds, keys, config), parameters


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", required=True, help="config.json from a medfast run folder")
    ap.add_argument("--base", required=True, help="the folder medfast ran in (its paths are relative to it)")
    ap.add_argument("--seed", type=int, default=None, help="default: the config's train.seed")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--run-dir", default=None, help="default: a temporary folder")
    monai_peer.add_argument(ap)
    a = ap.parse_args()
    monai = monai_peer.load(a.monai)
    if monai is None:
        return 2
    config = json.load(open(a.config))
    t = config["train"]
    if t.get("device", "cpu") != "cpu" or t.get("amp", False):
        refuse("a CUDA or AMP run")
    seed = t.get("seed", 0) if a.seed is None else a.seed
    threads = t.get("threads", 0) or a.threads
    with tempfile.TemporaryDirectory(prefix="monai-twin-") as tmp:
        run_dir = a.run_dir or tmp
        os.makedirs(run_dir, exist_ok=True)
        print(json.dumps(run(monai, config, os.path.abspath(a.base), seed, threads, run_dir)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
