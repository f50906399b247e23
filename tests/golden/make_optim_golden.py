#!/usr/bin/env python3
"""Reference values for medfast's optimizers, schedules and gradient scaler.

usage: make_optim_golden.py OUT_DIR

Writes OUT_DIR/manifest.json and raw little-endian float32 files:

* Optimizer trajectories. A few parameter tensors and per-step gradients are
  drawn from a fixed seed (params_init.bin, grads.bin: steps x all parameters
  concatenated, in manifest order). One gradient is None at one step (written
  as zeros and listed in `none_grads`), and the learning rate is multiplied by
  `lr_factor` from step `lr_change_step` on. Every case runs torch.optim's SGD,
  Adam or AdamW, or the Novograd below, and writes the parameters after each
  step (case_<name>.bin, steps x all parameters).
* Novograd is written here from MONAI 1.3's monai/optimizers/novograd.py (MONAI
  itself is not a dependency): per parameter tensor the second moment is a
  scalar running average of ||g||^2.
* Schedules: torch's PolynomialLR stepped per epoch and an independent closed
  form; LinearWarmupCosineAnnealingLR (Lightning Bolts, as MONAI's SwinUNETR
  tutorials use it) reimplemented and stepped per epoch.
* GradScaler: the scale sequence of torch.cuda.amp.GradScaler's update rule
  (the _amp_update_scale_ kernel) simulated in float32 for given overflow steps.
"""
import json
import math
import os
import sys
import warnings

import numpy as np
import torch

warnings.filterwarnings("ignore")


class MonaiNovograd(torch.optim.Optimizer):
    """Novograd with MONAI 1.3's arithmetic (betas default (0.9, 0.98))."""

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.98), eps=1e-8, weight_decay=0.0, grad_averaging=False,
                 amsgrad=False):
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay,
                                      grad_averaging=grad_averaging, amsgrad=amsgrad))

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            b1, b2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if not state:
                    state["step"] = 0
                    state["m"] = torch.zeros_like(p)
                    state["v"] = torch.zeros([], device=p.device)  # default dtype, as MONAI
                    if group["amsgrad"]:
                        state["v_max"] = torch.zeros([], device=p.device)
                state["step"] += 1
                g = p.grad.clone()  # MONAI divides p.grad in place; a copy changes nothing here
                sq_norm = torch.sum(torch.pow(g, 2))
                v = state["v"]
                if v == 0:  # the first nonzero squared norm is taken as is
                    v.copy_(sq_norm)
                else:
                    v.mul_(b2).add_(sq_norm, alpha=1 - b2)
                if group["amsgrad"]:
                    torch.max(state["v_max"], v, out=state["v_max"])
                    denom = state["v_max"].sqrt().add_(group["eps"])
                else:
                    denom = v.sqrt().add_(group["eps"])
                g.div_(denom)
                if group["weight_decay"] != 0:
                    g.add_(p, alpha=group["weight_decay"])
                if group["grad_averaging"]:
                    g.mul_(1 - b1)
                state["m"].mul_(b1).add_(g)
                p.add_(state["m"], alpha=-group["lr"])


def make_optimizer(params, cfg):
    kw = {k: v for k, v in cfg.items() if k != "name"}
    if "betas" in kw:
        kw["betas"] = tuple(kw["betas"])
    name = cfg["name"]
    if name == "SGD":
        return torch.optim.SGD(params, **kw)
    if name == "Adam":
        return torch.optim.Adam(params, **kw)
    if name == "AdamW":
        return torch.optim.AdamW(params, **kw)  # weight_decay defaults to 1e-2
    if name == "Novograd":
        return MonaiNovograd(params, **kw)
    raise ValueError(name)


OPTIMIZER_CASES = [
    ("sgd", {"name": "SGD", "lr": 0.1}),
    ("sgd_momentum", {"name": "SGD", "lr": 0.05, "momentum": 0.9, "dampening": 0.1, "weight_decay": 0.01}),
    ("sgd_nesterov", {"name": "SGD", "lr": 0.05, "momentum": 0.9, "nesterov": True, "weight_decay": 1e-3}),
    ("adam", {"name": "Adam", "lr": 0.01, "betas": [0.9, 0.99]}),
    ("adam_wd_amsgrad", {"name": "Adam", "lr": 0.01, "weight_decay": 0.1, "amsgrad": True, "eps": 1e-6}),
    ("adamw", {"name": "AdamW", "lr": 0.01}),
    ("adamw_amsgrad", {"name": "AdamW", "lr": 0.01, "betas": [0.8, 0.95], "weight_decay": 0.05, "amsgrad": True}),
    ("novograd", {"name": "Novograd", "lr": 0.01}),
    ("novograd_full", {"name": "Novograd", "lr": 0.01, "betas": [0.95, 0.9], "weight_decay": 1e-3,
                       "grad_averaging": True, "amsgrad": True}),
]


def optimizer_golden(out, manifest):
    gen = torch.Generator().manual_seed(20240611)
    shapes = [[3, 4], [5], [2, 3, 2], [1]]
    steps, lr_change_step, lr_factor = 12, 7, 0.5
    none_grads = [[3, 1]]  # [step, parameter]: no gradient there
    zero_grads = [[0, 2], [1, 2]]  # all-zero gradients: Novograd's second moment stays 0, then takes the norm as is
    init = [torch.randn(s, generator=gen) for s in shapes]
    grads = []
    for step in range(steps):
        scale = 3.0 if step % 4 == 0 else 0.3  # varying magnitudes, so amsgrad's maximum matters
        row = [torch.randn(s, generator=gen) * scale for s in shapes]
        for st, i in zero_grads:
            if st == step:
                row[i] = torch.zeros(shapes[i])
        grads.append(row)

    def flat(tensors):
        return np.concatenate([t.detach().numpy().astype("<f4").ravel() for t in tensors])

    flat(init).tofile(os.path.join(out, "params_init.bin"))
    np.concatenate([flat(row) for row in grads]).tofile(os.path.join(out, "grads.bin"))
    cases = []
    for name, cfg in OPTIMIZER_CASES:
        params = [t.clone().requires_grad_(True) for t in init]
        opt = make_optimizer(params, cfg)
        trajectory = []
        for step in range(steps):
            if step == lr_change_step:
                for group in opt.param_groups:
                    group["lr"] *= lr_factor
            for i, p in enumerate(params):
                p.grad = None if [step, i] in none_grads else grads[step][i].clone()
            opt.step()
            trajectory.append(flat(params))
        np.concatenate(trajectory).tofile(os.path.join(out, f"case_{name}.bin"))
        cases.append({"name": name, "options": cfg, "file": f"case_{name}.bin"})
    manifest["optimizers"] = {
        "shapes": shapes, "steps": steps, "lr_change_step": lr_change_step, "lr_factor": lr_factor,
        "none_grads": none_grads, "params_init": "params_init.bin", "grads": "grads.bin", "cases": cases,
    }


class LinearWarmupCosineAnnealingLR(torch.optim.lr_scheduler._LRScheduler):
    """Lightning Bolts' scheduler (the one MONAI's SwinUNETR tutorials copy), chained form."""

    def __init__(self, optimizer, warmup_epochs, max_epochs, warmup_start_lr=0.0, eta_min=0.0, last_epoch=-1):
        self.warmup_epochs = warmup_epochs
        self.max_epochs = max_epochs
        self.warmup_start_lr = warmup_start_lr
        self.eta_min = eta_min
        super().__init__(optimizer, last_epoch)

    def get_lr(self):
        e, w, m = self.last_epoch, self.warmup_epochs, self.max_epochs
        groups = self.optimizer.param_groups
        if e == 0:
            return [self.warmup_start_lr] * len(self.base_lrs)
        if e < w:
            return [g["lr"] + (b - self.warmup_start_lr) / (w - 1) for b, g in zip(self.base_lrs, groups)]
        if e == w:
            return list(self.base_lrs)
        if (e - 1 - m) % (2 * (m - w)) == 0:
            return [g["lr"] + (b - self.eta_min) * (1 - math.cos(math.pi / (m - w))) / 2
                    for b, g in zip(self.base_lrs, groups)]
        return [(1 + math.cos(math.pi * (e - w) / (m - w))) / (1 + math.cos(math.pi * (e - w - 1) / (m - w)))
                * (g["lr"] - self.eta_min) + self.eta_min for g in groups]

    def closed_form(self, e):
        w, m = self.warmup_epochs, self.max_epochs
        base = self.base_lrs[0]
        if e < w:
            return self.warmup_start_lr + e * (base - self.warmup_start_lr) / (w - 1)
        return self.eta_min + 0.5 * (base - self.eta_min) * (1 + math.cos(math.pi * (e - w) / (m - w)))


def lr_sequence(scheduler_factory, lr, epochs):
    opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=lr)
    sched = scheduler_factory(opt)
    out = []
    for _ in range(epochs):
        out.append(opt.param_groups[0]["lr"])  # the rate this epoch trains with
        opt.step()
        sched.step()
    return out, sched


def schedule_golden(manifest):
    cases = []
    for lr, max_epochs, power in [(1e-2, 10, 0.9), (3e-4, 7, 2.0), (0.1, 5, 1.0), (1e-3, 1, 0.9)]:
        epochs = max_epochs + 3  # past the end too: PolynomialLR stays at 0
        torch_lrs, _ = lr_sequence(lambda o: torch.optim.lr_scheduler.PolynomialLR(o, total_iters=max_epochs,
                                                                                   power=power), lr, epochs)
        formula = [lr * (1.0 - min(e, max_epochs) / max_epochs) ** power for e in range(epochs)]
        assert np.allclose(torch_lrs, formula, rtol=1e-12, atol=1e-15), (torch_lrs, formula)
        cases.append({"options": {"name": "poly", "power": power}, "lr": lr, "max_epochs": max_epochs,
                      "lrs": torch_lrs, "formula": formula})
    for lr, max_epochs, warmup, start, eta_min in [(1e-3, 20, 5, 1e-5, 1e-6), (4e-4, 12, 2, 0.0, 0.0),
                                                   (1e-2, 6, 1, 1e-4, 0.0), (1e-3, 8, 7, 0.0, 1e-5),
                                                   (1e-3, 8, 0, 0.0, 1e-5)]:
        sched_args = dict(warmup_epochs=warmup, max_epochs=max_epochs, warmup_start_lr=start, eta_min=eta_min)
        chained, sched = lr_sequence(lambda o: LinearWarmupCosineAnnealingLR(o, **sched_args), lr, max_epochs)
        closed = [sched.closed_form(e) if (e >= warmup or warmup > 1) else start for e in range(max_epochs)]
        if warmup >= 1:
            assert np.allclose(chained, closed, rtol=1e-12, atol=1e-15), (chained, closed)
        # warmup_epochs 0: the chained form never leaves warmup_start_lr (its epoch-0 branch sets the rate the
        # ratio then scales); the closed form, a plain cosine from lr, is the meaningful reference.
        cases.append({"options": {"name": "warmup_cosine", "warmup_epochs": warmup, "warmup_start_lr": start,
                                  "eta_min": eta_min},
                      "lr": lr, "max_epochs": max_epochs, "lrs": chained if warmup >= 1 else closed,
                      "formula": closed})
    manifest["schedules"] = cases


def grad_scaler_golden(manifest):
    cases = []
    for opts, iterations, overflow in [
        ({"init_scale": 1024.0, "growth_factor": 2.0, "backoff_factor": 0.5, "growth_interval": 3}, 40,
         [4, 5, 13, 30]),
        ({"init_scale": 1000.0, "growth_factor": 1.7, "backoff_factor": 0.3, "growth_interval": 2}, 25, [1, 7, 8, 20]),
        ({"init_scale": 65536.0, "growth_factor": 2.0, "backoff_factor": 0.5, "growth_interval": 2000}, 6, [0, 2]),
    ]:
        scale = np.float32(opts["init_scale"])
        tracker = 0
        stepped, scales, trackers = [], [], []
        for it in range(iterations):
            found_inf = it in overflow
            stepped.append(not found_inf)
            # torch's _amp_update_scale_ kernel: float32 scale, int32 tracker, factors as doubles
            if found_inf:
                scale = np.float32(np.float64(scale) * opts["backoff_factor"])
                tracker = 0
            else:
                successful = tracker + 1
                if successful == opts["growth_interval"]:
                    grown = np.float32(np.float64(scale) * opts["growth_factor"])
                    if np.isfinite(grown):
                        scale = grown
                    tracker = 0
                else:
                    tracker = successful
            scales.append(float(scale))
            trackers.append(tracker)
        cases.append({"options": opts, "iterations": iterations, "overflow": overflow, "stepped": stepped,
                      "scales": scales, "growth_trackers": trackers})
    manifest["grad_scaler"] = cases


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    torch.set_num_threads(1)
    manifest = {"torch": torch.__version__}
    optimizer_golden(out, manifest)
    schedule_golden(manifest)
    grad_scaler_golden(manifest)
    with open(os.path.join(out, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=1)


if __name__ == "__main__":
    main()
