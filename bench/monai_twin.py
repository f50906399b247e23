#!/usr/bin/env python3
"""MONAI's twin of a medfast training run: the same config, trained with MONAI 1.3 (issue 11).

Usage: /usr/bin/python3 bench/monai_twin.py --config RUN_DIR/config.json --base DIR [--seed S]
           [--threads 2] [--run-dir DIR] [--monai ../shared/peers/monai-1.3.2]
           [--device cpu|cuda] [--amp fp32|fp16|bf16] [--reader auto|nibabel|numpy]
           [--channels-last] [--variants fp16,fp16-cl,bf16-cl]

bench/default_run.py runs it beside medfast's built-in default run, and the GPU campaign's
`monai` step (scripts/gpu_check.py) beside medfast's spleen recipe on CUDA. It reads the config
medfast wrote into its run folder (config.json: the built-in default plus any --set; paths
relative to --base, the folder medfast ran in) and runs that config with MONAI, as MONAI's
spleen fast-training tutorial would:
  data        the same dataset list, training items and validation items ({num: N}: the last N);
  reader      --reader: LoadImaged's NIfTI reader. nibabel: MONAI's NibabelReader; numpy:
              bench/monai_nifti_reader.py (gzip and numpy, the same arrays and meta as NibabelReader
              gives, checked by its --self-test), for machines where nibabel does not import (the
              GPU image's numpy 2, where .gpu-peers carries only nibabel's orientations, which
              MONAI's Orientation needs); auto (default): nibabel where it imports whole, else numpy.
              The reader only changes how the cache fills, not the training after it;
  chains      the same deterministic and random chains as MONAI dictionary transforms
              (monai_peer.transforms); the deterministic outputs cached by CacheDataset
              (cache_rate 1, num_workers = threads), ending with EnsureTyped(track_meta=False),
              and meta tracking off afterwards (the tutorial's fast path);
  device      train.device (or --device): on CUDA, as the tutorial's GPU path, the cached volumes
              move to the GPU with ToDeviced after EnsureTyped when data.cache.kind is device or
              disk_device (medfast's device caches), so that the random chain runs on the GPU;
              with any other cache kind they stay on the host and each batch is copied over;
              cudnn.benchmark on unless train.deterministic (as medfast);
  AMP         train.amp (or --amp; true: fp16 on CUDA, bf16 on the CPU, as medfast): forward and
              loss under torch.autocast, fp16 with a GradScaler (scale, step, update), as the
              tutorial does;
  layout      --channels-last: the peer at its best, the two lines a PyTorch user adds: the model
              and every batch (and validation window) .to(memory_format=torch.channels_last_3d),
              and torch.backends.cudnn.benchmark on (whatever train.deterministic says);
  variants    --variants: several runs over one cache fill (the fill is the same for each), each
              a fresh model from the seed: a dtype (fp16, bf16, fp32), with "-cl" channels-last;
              the result is {"variants": [one document per run], ...};
  loader      ThreadDataLoader(num_workers=0) with the config's batch size and shuffle, batching
              the image and label only (SelectItemsd), as medfast's loader does; the time spent
              waiting for its next batch is the epoch's data wait;
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
"seconds"), training seconds, data wait, samples/s (samples over training seconds, as
medfast's), loss, Dice, steps and samples, and the time to the target from the start of
the run (before the caches fill, as medfast's "elapsed"). Before printing, the run is
checked: every epoch's loss finite, and every epoch the steps and samples that the dataset,
batch size, drop_last and the random chain's num_samples give; a failed check exits non-zero
with the reason and prints no figures.
"""
import argparse
import contextlib
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
    """MONAI's UNet or SegResNet with the config's arguments (medfast's take MONAI's names)."""
    args = {k: (tuple(x) if isinstance(x, list) else x) for k, x in model.items() if k != "name"}
    kinds = {"UNet": monai.networks.nets.UNet, "SegResNet": monai.networks.nets.SegResNet}
    if model.get("name") not in kinds:
        refuse(f"model {model.get('name')}")
    args.setdefault("spatial_dims", 3)
    return kinds[model["name"]](**args)


def is_sigmoid(config):
    """A sigmoid run (one channel per region or class, thresholded at 0.5) rather than softmax."""
    return bool(config.get("loss", {}).get("sigmoid"))


def loss_function(monai, loss):
    names = {"DiceCE": monai.losses.DiceCELoss, "Dice": monai.losses.DiceLoss, "DiceFocal": monai.losses.DiceFocalLoss}
    return names[loss.get("name", "DiceCE")](**{k: v for k, v in loss.items() if k != "name"})


def optimizer(monai, params, opt, schedule):
    args = {k: (tuple(v) if isinstance(v, list) else v) for k, v in opt.items() if k != "name"}
    kinds = {"Adam": torch.optim.Adam, "SGD": torch.optim.SGD, "AdamW": torch.optim.AdamW}
    if opt["name"] == "Novograd":
        return monai.optimizers.Novograd(params, **args)
    return kinds[opt["name"]](params, **args)


def scheduler(opt, schedule, epochs):
    """The learning-rate schedule, stepped once per epoch as medfast's: constant (None), or
    warmup_cosine without warmup, which is the tutorial's CosineAnnealingLR(T_max=epochs)."""
    schedule = {"name": schedule} if isinstance(schedule, str) else (schedule or {})
    name = schedule.get("name", "constant")
    if name == "constant":
        return None
    if name == "warmup_cosine" and not schedule.get("warmup_epochs", 0):
        return torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=epochs, eta_min=schedule.get("eta_min", 0.0))
    refuse(f"schedule {schedule}")


def precision(value, cuda):
    """medfast's train.amp: true (fp16 on CUDA, bf16 on the CPU), false, fp16, bf16 or fp32."""
    if value is None or isinstance(value, bool):
        return ("fp16" if cuda else "bf16") if value else "fp32"
    p = str(value).lower()
    if p not in ("fp16", "bf16", "fp32"):
        refuse(f"train.amp {value!r}")
    if p == "fp16" and not cuda:
        refuse("fp16 on the CPU (medfast refuses it too)")
    return p


def autocast(device, amp):
    """The forward pass's autocast context (none for fp32)."""
    if amp == "fp32":
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype={"fp16": torch.float16, "bf16": torch.bfloat16}[amp])


def grad_scaler():
    """fp16's loss scaler: torch.amp.GradScaler where this torch has it, else torch.cuda.amp's."""
    if hasattr(torch, "amp") and hasattr(torch.amp, "GradScaler"):
        return torch.amp.GradScaler("cuda")
    return torch.cuda.amp.GradScaler()


def expected_counts(config, items):
    """(steps, samples) per epoch that `items` training items give: batch size, drop_last, num_samples."""
    loader = config["data"].get("loader", {})
    batch, drop_last = loader.get("batch_size", 1), loader.get("drop_last", False)
    steps = items // batch if drop_last else -(-items // batch)
    per_item = 1
    for t in config["data"].get("random", []):
        per_item *= int(t.get("num_samples", 1))
    return steps, (steps * batch if drop_last else items) * per_item


def verify(result, config):
    """The run's own checks before it reports figures; exits with the reason when one fails."""
    steps, samples = expected_counts(config, result["train_items"])
    for e in result["history"]:
        where = f"monai_twin: verification failed: epoch {e['epoch']}"
        if not math.isfinite(e["loss"]):
            sys.exit(f"{where}: loss {e['loss']}")
        if (e["steps"], e["samples"]) != (steps, samples):
            sys.exit(f"{where}: {e['steps']} steps and {e['samples']} samples, expected {steps} and {samples}")
    if not result["history"]:
        sys.exit("monai_twin: verification failed: no epoch ran")
    return {"steps_per_epoch": steps, "samples_per_epoch": samples, "finite_losses": True}


def caches(monai, config, train_files, val_files, threads, device=None, on_device=False, reader=None):
    """The training and validation CacheDatasets (filled now) and the training loader.
    on_device: the cached volumes move to `device` (ToDeviced, after EnsureTyped: the tutorial's GPU path).
    reader: LoadImaged's ImageReader (None: MONAI's choice, NibabelReader)."""
    d, t = config["data"], config["train"]
    keys = [t.get("image_key", "image"), t.get("label_key", "label")]
    deterministic = monai_peer.transforms(monai, d["deterministic"], reader)
    deterministic.append(monai.transforms.EnsureTyped(keys=keys, track_meta=False))
    if on_device:
        deterministic.append(monai.transforms.ToDeviced(keys=keys, device=device))
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


def validate(monai, model, val_ds, keys, config, device=None, amp="fp32", channels_last=False, per_class=None):
    """Mean validation Dice, as medfast scores the model: softmax, argmax and the foreground
    classes (DiceMetric include_background=False); sigmoid, each channel (a region) thresholded
    at 0.5 (the tutorial's Activations(sigmoid) + AsDiscrete(threshold=0.5)), every channel
    scored. The mean is over classes of each class's mean over cases (medfast's, and
    DiceMetric's mean_batch then mean). `per_class`, a list, receives each class's Dice."""
    device = device or torch.device("cpu")
    network_of = (lambda w: model(w.to(memory_format=torch.channels_last_3d))) if channels_last else model
    sw = dict(config.get("validation", {}).get("sliding_window", {}))
    roi, sw_batch = tuple(sw.pop("roi_size")), sw.pop("sw_batch_size", 1)
    classes = config["model"].get("out_channels", 2)
    sigmoid = is_sigmoid(config)
    metric = monai.metrics.DiceMetric(include_background=sigmoid, reduction="mean_batch")
    model.eval()
    with torch.no_grad():
        for i in range(len(val_ds)):
            item = val_ds[i]
            x = torch.as_tensor(item[keys[0]])[None].to(device).float()
            with autocast(device, amp):
                logits = monai.inferers.sliding_window_inference(x, roi, sw_batch, network_of, **sw)
            if sigmoid:
                pred = (torch.sigmoid(logits.float()) > 0.5).float()
                truth = torch.as_tensor(item[keys[1]])[None].to(device).float()
            else:
                pred = torch.nn.functional.one_hot(logits.argmax(1), classes).permute(0, 4, 1, 2, 3)
                label = torch.as_tensor(item[keys[1]])[None, 0].to(device).long()
                truth = torch.nn.functional.one_hot(label, classes).permute(0, 4, 1, 2, 3)
            metric(pred, truth)
    model.train()
    each = metric.aggregate()
    if per_class is not None:
        per_class[:] = [float(v) for v in each]
    return torch.nanmean(each).item()


def layout(channels_last):
    """The memory format batches and model take: channels_last_3d with --channels-last."""
    return torch.channels_last_3d if channels_last else torch.contiguous_format


def train_epoch(model, loader, keys, loss_fn, opt, device=None, amp="fp32", scaler=None, channels_last=False):
    """One pass over the loader: (mean step loss, steps, samples, seconds waiting for batches)."""
    device = device or torch.device("cpu")
    model.train()
    loss_sum, steps, samples, wait = 0.0, 0, 0, 0.0
    batches = iter(loader)
    while True:
        t0 = time.perf_counter()
        batch = next(batches, None)
        wait += time.perf_counter() - t0
        if batch is None:
            break
        # On the device already where the cache is (ToDeviced); else copied over here.
        x = batch[keys[0]].to(device, non_blocking=True).float()
        y = batch[keys[1]].to(device, non_blocking=True)
        if channels_last:
            x = x.to(memory_format=torch.channels_last_3d)
        opt.zero_grad()
        with autocast(device, amp):
            loss = loss_fn(model(x), y)
        if scaler is not None:
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
        else:
            loss.backward()
            opt.step()
        loss_sum += loss.item()
        steps += 1
        samples += x.shape[0]
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    if steps == 0:  # ThreadDataLoader's producer thread died (its traceback is above)
        sys.exit("monai_twin: the training loader delivered no batch")
    return loss_sum / steps, steps, samples, wait


def save(run_dir, model, opt, record, improved):
    if improved:
        torch.save(model.state_dict(), os.path.join(run_dir, "best.pt"))
    torch.save({"model": model.state_dict(), "optimizer": opt.state_dict()}, os.path.join(run_dir, "last.pt"))
    with open(os.path.join(run_dir, "metrics.jsonl"), "a") as f:
        f.write(json.dumps(record) + "\n")


def image_reader(choice):
    """(LoadImaged's reader, its name) for --reader: None is MONAI's own NibabelReader."""
    if choice == "auto":
        try:
            import nibabel
            nibabel.load  # noqa: B018 (.gpu-peers' nibabel carries only its orientations: no reader)
            return None, f"nibabel {nibabel.__version__}"
        except Exception:  # noqa: BLE001 (absent, failing on this numpy, or orientations only: numpy)
            choice = "numpy"
    if choice == "nibabel":
        import nibabel  # fails here, with its own reason, where it cannot run
        nibabel.load  # noqa: B018
        return None, f"nibabel {nibabel.__version__}"
    import monai_nifti_reader
    return monai_nifti_reader.NumpyNiftiReader(), "numpy (bench/monai_nifti_reader.py)"


def run(monai, config, base, seed, threads, run_dir, device=None, amp="fp32", reader="auto", channels_last=False,
        variants=None):
    """The whole run; returns the result document (with `variants`: {"variants": [...]} over one fill)."""
    device = device or torch.device("cpu")
    start = time.perf_counter()
    torch.set_num_threads(threads)
    monai.utils.set_determinism(seed=seed)
    on_device = device.type == "cuda" and config["data"].get("cache", {}).get("kind") in ("device", "disk_device")
    train_files, val_files = dataset_items(config, base)
    reader, reader_name = image_reader(reader)
    loader, val_ds, keys = caches(monai, config, train_files, val_files, threads, device, on_device, reader)
    prepare = time.perf_counter() - start
    common = {"prepare_seconds": prepare, "train_items": len(train_files), "val_items": len(val_files),
              "device": str(device), "cache_on_device": on_device, "reader": reader_name,
              "versions": {"monai": monai.__version__, "torch": torch.__version__,
                           "numpy": sys.modules["numpy"].__version__ if "numpy" in sys.modules else None}}
    if variants is None:
        return train_variant(monai, config, seed, run_dir, device, amp, channels_last, loader, val_ds, keys, common, start)
    results = []
    for name in variants:
        dtype, _, cl = name.partition("-")
        if dtype not in ("fp16", "bf16", "fp32") or cl not in ("", "cl"):
            refuse(f"--variants entry {name!r} (expected fp16, bf16 or fp32, with -cl for channels-last)")
        folder = os.path.join(run_dir, name)
        os.makedirs(folder, exist_ok=True)
        results.append(train_variant(monai, config, seed, folder, device, precision(dtype, device.type == "cuda"),
                                     cl == "cl", loader, val_ds, keys, dict(common, variant=name), time.perf_counter()))
    return {**common, "variants": results, "seconds": time.perf_counter() - start}


def train_variant(monai, config, seed, run_dir, device, amp, channels_last, loader, val_ds, keys, common, start):
    """One training run over the filled caches: a fresh model from the seed, its epochs, verified."""
    t = config["train"]
    monai.utils.set_determinism(seed=seed)  # the same weights and loader order for every variant
    deterministic = bool(t.get("deterministic", False))
    if device.type == "cuda":  # set_determinism turned cudnn's autotuner off; medfast's rule, or the user's two lines
        torch.backends.cudnn.benchmark = channels_last or not deterministic
        torch.backends.cudnn.deterministic = deterministic and not channels_last
        torch.cuda.reset_peak_memory_stats(device)
    model = network(monai, config["model"]).to(device)
    if channels_last:
        model = model.to(memory_format=torch.channels_last_3d)
    loss_fn = loss_function(monai, config.get("loss", {}))
    opt = optimizer(monai, model.parameters(), config["optimizer"], config.get("schedule"))
    scaler = grad_scaler() if amp == "fp16" else None
    epochs, target = t.get("epochs", 1), t.get("target_dice", 0)
    lr_schedule = scheduler(opt, config.get("schedule"), epochs)
    interval = config.get("validation", {}).get("interval", 1)
    result = {**common, "history": [], "reached_target": False, "time_to_target": None, "best_dice": -1.0,
              "parameters": sum(p.numel() for p in model.parameters() if p.requires_grad),
              "amp": amp, "channels_last": channels_last,
              "cudnn_benchmark": bool(torch.backends.cudnn.benchmark) if device.type == "cuda" else None,
              "cudnn_deterministic": bool(torch.backends.cudnn.deterministic) if device.type == "cuda" else None}
    for epoch in range(epochs):
        t0 = time.perf_counter()
        loss, steps, samples, wait = train_epoch(model, loader, keys, loss_fn, opt, device, amp, scaler, channels_last)
        if lr_schedule is not None:
            lr_schedule.step()
        train_seconds = time.perf_counter() - t0
        dice, val_seconds, per_class = None, 0.0, []
        if val_ds is not None and ((epoch + 1) % interval == 0 or epoch + 1 == epochs):
            v0 = time.perf_counter()
            dice = validate(monai, model, val_ds, keys, config, device, amp, channels_last, per_class)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            val_seconds = time.perf_counter() - v0
        rec = {"epoch": epoch + 1, "loss": loss, "dice": dice, "dice_per_class": per_class or None,
               "steps": steps, "samples": samples,
               "train_seconds": train_seconds, "validation_seconds": val_seconds, "data_wait": wait,
               "samples_per_second": samples / train_seconds if train_seconds > 0 else 0.0,
               "seconds": time.perf_counter() - t0, "elapsed": time.perf_counter() - start}
        improved = dice is not None and not math.isnan(dice) and dice > result["best_dice"]
        result["best_dice"] = dice if improved else result["best_dice"]
        result["history"].append(rec)
        save(run_dir, model, opt, rec, improved)
        print(f"epoch {epoch + 1}: loss {loss:.4f}, Dice {dice}, {rec['seconds']:.2f} s", file=sys.stderr, flush=True)
        if dice is not None and target > 0 and dice >= target:
            result["reached_target"], result["time_to_target"] = True, rec["elapsed"]
            break
    if device.type == "cuda":
        result["cuda_peak_allocated_bytes"] = torch.cuda.max_memory_allocated(device)
    result["seconds"] = time.perf_counter() - start
    result["verified"] = verify(result, config)
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


def score_checkpoint(monai, config, base, checkpoint, threads, reader="auto"):
    """MONAI's validation (this twin's chain, sliding window and metric) of medfast's trained weights."""
    torch.set_num_threads(threads)
    _, val_files = dataset_items(config, base)
    d, t = config["data"], config["train"]
    keys = [t.get("image_key", "image"), t.get("label_key", "label")]
    deterministic = monai_peer.transforms(monai, d["deterministic"], image_reader(reader)[0])
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
    ap.add_argument("--device", choices=["cpu", "cuda"], default=None, help="default: the config's train.device")
    ap.add_argument("--amp", choices=["fp32", "fp16", "bf16"], default=None, help="default: the config's train.amp")
    ap.add_argument("--reader", choices=["auto", "nibabel", "numpy"], default="auto",
                    help="NIfTI reader: MONAI's NibabelReader, or bench/monai_nifti_reader.py (gzip + numpy); "
                         "auto: nibabel where it imports (default)")
    ap.add_argument("--channels-last", action="store_true",
                    help="model and batches in torch.channels_last_3d, cudnn.benchmark on (the peer at its best)")
    ap.add_argument("--variants", default=None,
                    help="comma-separated runs over one cache fill: fp16, bf16 or fp32, -cl for channels-last "
                         "(e.g. fp16,fp16-cl,bf16-cl); overrides --amp and --channels-last")
    monai_peer.add_argument(ap)
    a = ap.parse_args()
    monai = monai_peer.load(a.monai)
    if monai is None:
        return 2
    config = json.load(open(a.config))
    t = config["train"]
    device = torch.device(a.device or t.get("device", "cpu"))
    if device.type not in ("cpu", "cuda"):
        refuse(f"train.device {device}")
    if device.type == "cuda" and not torch.cuda.is_available():
        sys.exit("monai_twin: CUDA was asked for and this torch sees no CUDA device")
    amp = precision(a.amp if a.amp is not None else t.get("amp", False), device.type == "cuda")
    seed = t.get("seed", 0) if a.seed is None else a.seed
    threads = t.get("threads", 0) or a.threads
    with tempfile.TemporaryDirectory(prefix="monai-twin-") as tmp:
        run_dir = a.run_dir or tmp
        os.makedirs(run_dir, exist_ok=True)
        variants = [v.strip() for v in a.variants.split(",") if v.strip()] if a.variants else None
        print(json.dumps(run(monai, config, os.path.abspath(a.base), seed, threads, run_dir, device, amp, a.reader,
                             a.channels_last, variants)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
