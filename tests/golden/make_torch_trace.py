#!/usr/bin/env python3
"""A torch.profiler trace of a tiny training loop, for `medfast trace summarize`'s tests.

Usage: make_torch_trace.py OUT.json [--user-ranges] [--epochs 2] [--steps-per-epoch 3]

Trains a small 3D conv net on random data with a DataLoader, calling prof.step() once
per step as torch.profiler's recipe does; with --user-ranges the forward pass runs
inside record_function("forward"). Prints a JSON line with what the test checks: the
profiled steps and the loads inside them. Debian 12's torch 1.13 (no Kineto) writes a
bare list of events; Kineto builds write {"traceEvents": [...]}.
"""
import argparse
import json
import sys

import torch
import torch.utils.data


def main():
    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("--user-ranges", action="store_true")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--steps-per-epoch", type=int, default=3)
    a = p.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    data = torch.utils.data.TensorDataset(torch.randn(a.steps_per_epoch * 2, 1, 8, 8, 8),
                                          torch.randint(0, 2, (a.steps_per_epoch * 2, 8, 8, 8)))
    loader = torch.utils.data.DataLoader(data, batch_size=2, num_workers=0)
    net = torch.nn.Sequential(torch.nn.Conv3d(1, 4, 3, padding=1), torch.nn.ReLU(), torch.nn.Conv3d(4, 2, 1))
    opt = torch.optim.SGD(net.parameters(), lr=0.01)
    loss_fn = torch.nn.CrossEntropyLoss()
    total = a.epochs * a.steps_per_epoch
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU],
                                schedule=torch.profiler.schedule(wait=0, warmup=0, active=total, repeat=1)) as prof:
        for _ in range(a.epochs):
            for x, y in loader:
                if a.user_ranges:
                    with torch.profiler.record_function("forward"):
                        out = net(x)
                else:
                    out = net(x)
                loss = loss_fn(out, y)
                opt.zero_grad()
                loss.backward()
                opt.step()
                prof.step()
    prof.export_chrome_trace(a.out)
    print(json.dumps({"steps": total, "kineto": torch.autograd.kineto_available(), "torch": torch.__version__}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
