#!/usr/bin/env python3
"""The GPU campaign (issue 21): build medfast on a lent GPU machine and run every GPU check
and benchmark in order, each step timed and logged, a failure recorded and the next step
still run. scripts/gpu_check.sh calls this.

    bash scripts/gpu_check.sh --phase build        # call 1: configure + build (all cores)
    bash scripts/gpu_check.sh --phase run          # call 2: tests and benchmarks
    bash scripts/gpu_check.sh --only io,train      # re-run chosen steps after a fix
    bash scripts/gpu_check.sh --dry-run --build build   # here, without a GPU (CI runs this)

On the device machine (see docs/benchmarks.md, "GPU runs"): the working tree travels with
.gpu (scripts/gpu_bundle.sh: the build's dependencies from Debian 12) and, for the MONAI
peer, .gpu-peers (MONAI 1.3.2 and nibabel, pure Python) carried; the build configures
against the image's pip torch (Torch_DIR from torch.utils.cmake_prefix_path), CUDA arch 90.

Results accumulate in BUILD/gpu_check.json (so that the run phase adds to the build
phase's) and are copied with a Markdown table and the log into $OUT (or --out); the table
is printed last. A dry run reuses an existing build folder (no configure: Debian's torch
has no pip-style CMake path), runs every step that can run without a GPU, and marks the
others "skipped: no CUDA device".
"""
import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STEPS = ["build", "gpu_tests", "python_tests", "self_check", "io", "train", "monai", "nccl", "trace", "sanitizer"]
PHASES = {"build": ["build"], "run": STEPS[1:], "all": STEPS}


class Skip(Exception):
    """The step cannot run here; its message says why."""


class Campaign:
    def __init__(self, a):
        self.a = a
        self.build = os.path.abspath(a.build)
        self.out = os.path.abspath(a.out or os.environ.get("OUT") or os.path.join(self.build, "gpu_check_out"))
        os.makedirs(self.out, exist_ok=True)
        self.log_path = os.path.join(self.out, "gpu_check.log")
        self.state_path = os.path.join(self.build, "gpu_check.json")
        self.results = {}
        if os.path.exists(self.state_path):
            with open(self.state_path) as f:
                self.results = json.load(f).get("steps", {})
        self.work = tempfile.mkdtemp(prefix="medfast-gpu-check-", dir=self.build if os.path.isdir(self.build) else None)
        self._cuda = None

    # -- plumbing ---------------------------------------------------------------------------

    def log(self, text):
        with open(self.log_path, "a") as f:
            f.write(text if text.endswith("\n") else text + "\n")

    def sh(self, cmd, timeout=None, env=None, cwd=None, check=True):
        """Runs cmd (a list), logs it and its output; returns stdout. A failure raises."""
        self.log(f"$ {' '.join(cmd)}")
        e = dict(os.environ)
        e.update(env or {})
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=e, cwd=cwd or ROOT)
        self.log(r.stdout[-20000:] + r.stderr[-20000:])
        if check and r.returncode != 0:
            tail = (r.stderr.strip() or r.stdout.strip()).splitlines()[-3:]
            raise RuntimeError(f"{os.path.basename(cmd[0])} exited {r.returncode}: {' | '.join(tail)}")
        return r.stdout

    def medfast(self, *args, **kw):
        return self.sh([os.path.join(self.build, "medfast"), *args], **kw)

    def cuda(self):
        """Whether this machine has a GPU medfast's libtorch can use (asked of medfast itself)."""
        if self._cuda is None:
            try:
                j = json.loads(self.medfast("info", "--backends", "--json", check=False) or "{}")
                self._cuda = j.get("cuda_devices", 0) > 0
            except (OSError, ValueError):
                self._cuda = False
        return self._cuda

    def need_cuda(self):
        if not self.cuda():
            raise Skip("no CUDA device")

    def run(self, steps):
        machine = {"host": os.uname().nodename, "cores": os.cpu_count(), "dry_run": self.a.dry_run}
        try:
            machine["gpu"] = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total",
                                             "--format=csv,noheader"], capture_output=True, text=True,
                                            timeout=30).stdout.strip() or "none"
        except (OSError, subprocess.TimeoutExpired):
            machine["gpu"] = "none (no nvidia-smi)"
        self.log(f"== gpu_check {time.strftime('%Y-%m-%d %H:%M:%S')} steps {','.join(steps)} machine {machine}")
        for name in steps:
            t0 = time.time()
            entry = {"status": "ok", "figures": {}}
            try:
                entry["figures"] = getattr(self, "step_" + name)() or {}
            except Skip as s:
                entry = {"status": "skipped", "reason": str(s), "figures": {}}
            except Exception as e:  # a failure is recorded and the campaign goes on
                entry = {"status": "failed", "reason": str(e)[:500], "figures": {}}
            entry["seconds"] = round(time.time() - t0, 1)
            self.results[name] = entry
            self.log(f"== step {name}: {entry['status']} ({entry['seconds']} s) {entry.get('reason', '')}")
            print(f"gpu_check: {name}: {entry['status']} ({entry['seconds']} s) {entry.get('reason', '')}", flush=True)
            self.save(machine)
        shutil.rmtree(self.work, ignore_errors=True)
        table = self.table(machine)
        with open(os.path.join(self.out, "gpu_check.md"), "w") as f:
            f.write(table)
        print(table)
        return 0 if all(self.results[s]["status"] != "failed" for s in steps) else 1

    def save(self, machine):
        doc = {"machine": machine, "steps": self.results}
        if os.path.isdir(self.build):
            with open(self.state_path, "w") as f:
                json.dump(doc, f, indent=2)
        with open(os.path.join(self.out, "gpu_check.json"), "w") as f:
            json.dump(doc, f, indent=2)

    def table(self, machine):
        lines = [f"GPU campaign on {machine['gpu']} ({machine['cores']} cores){' (dry run)' if machine['dry_run'] else ''}",
                 "", "| step | status | seconds | figures / reason |", "|---|---|---|---|"]
        for s in STEPS:
            if s not in self.results:
                continue
            r = self.results[s]
            what = r.get("reason") or "; ".join(f"{k} {v}" for k, v in r["figures"].items())
            lines.append(f"| {s} | {r['status']} | {r['seconds']} | {what.replace('|', '/')} |")
        return "\n".join(lines) + "\n"

    # -- steps ------------------------------------------------------------------------------

    def step_build(self):
        jobs = str(os.cpu_count() or 2)
        if self.a.dry_run:  # the folder as it is: no configure, no build
            missing = [f for f in ("medfast", "medfast-torch", "tests/medfast_gpu_tests")
                       if not os.path.exists(os.path.join(self.build, f))]
            if missing:
                raise RuntimeError(f"--dry-run reuses a built folder; {self.build} lacks {', '.join(missing)}")
            return {"build folder": "reused"}
        torch_dir = subprocess.run([sys.executable, "-c", "import torch; print(torch.utils.cmake_prefix_path)"],
                                   capture_output=True, text=True, check=True).stdout.strip() + "/Torch"
        deps = os.path.join(ROOT, ".gpu", "usr")
        if not os.path.isdir(deps):
            raise RuntimeError(f"{deps} is missing: run scripts/gpu_bundle.sh on the host and carry .gpu")
        t0 = time.time()
        self.sh(["cmake", "-S", ROOT, "-B", self.build, "-G", "Ninja", "-DCMAKE_BUILD_TYPE=Release",
                 f"-DTorch_DIR={torch_dir}", "-DCMAKE_CUDA_ARCHITECTURES=90", "-DTORCH_CUDA_ARCH_LIST=9.0",
                 f"-DMEDFAST_DEPS_PREFIX={deps}", f"-DPython3_EXECUTABLE={sys.executable}"], timeout=900)
        configure = time.time() - t0
        self.sh(["cmake", "--build", self.build, "-j", jobs], timeout=3000)
        return {"configure_s": round(configure, 1), "build_s": round(time.time() - t0 - configure, 1)}

    def ctest(self, *args):
        out = self.sh(["ctest", "--test-dir", self.build, "--output-on-failure", "-j", "4", *args], timeout=1500,
                      check=False)
        summary = next((l.strip() for l in out.splitlines() if "tests passed" in l), "no summary")
        skipped = sum(1 for l in out.splitlines() if re.match(r"^\s+\d+ - .* \(Skipped\)\s*$", l))
        failed = [l.split(" - ", 1)[1].strip() for l in out.splitlines() if " - " in l and "(Failed)" in l]
        if failed:
            raise RuntimeError(f"{summary}; failed: {', '.join(failed[:8])}")
        if "no summary" in summary and "No tests were found" not in out:
            raise RuntimeError("ctest printed no summary (see the log)")
        return {"ctest": summary, "skipped": skipped}

    def step_gpu_tests(self):
        return self.ctest("-L", "gpu")

    def step_python_tests(self):
        return self.ctest("-L", "python")

    def step_self_check(self):
        j = json.loads(self.medfast("info", "--backends", "--json", check=False) or "{}")
        if not j.get("checks"):
            raise RuntimeError("medfast info --backends printed no report")
        figures = {}
        for c in j["checks"]:
            key = f"{c['device']} {c['dtype']}"
            worst = max((op["worst_ratio"] or float("inf")) for op in c["ops"]) if c["ops"] else 0
            figures[key] = f"{'pass' if c['passed'] else 'FAIL'} {c['seconds'] * 1e3:.0f} ms worst {worst:.2g}"
            if c["switched_off"]:
                figures[key] += f" switched off {c['switched_off']}"
        if j.get("error"):
            raise RuntimeError(j["error"])
        return figures

    def synth(self, name, cases, size):
        d = os.path.join(self.work, name)
        if not os.path.exists(os.path.join(d, "dataset.json")):
            self.medfast("data", "synth", "--out", d, "--cases", str(cases), "--size", size, "--seed", "0")
        return d

    def step_io(self):
        self.need_cuda()
        d = self.synth("io", 1, "512,512,300")
        f = os.path.join(d, "imagesTr", "spleen_0.nii.gz")
        raw = os.path.join(self.work, "volume.bin")
        with open(raw, "wb") as o:
            o.write(os.urandom(1 << 30))
        figures = {}
        for backend in ("auto", "cufile"):
            j = json.loads(self.medfast("io", "load", "--file", raw, "--device", "cuda", "--loop", "5", "--validate",
                                        "--backend", backend, "--json"))
            figures[f"load {backend} GB/s"] = round(j.get("median_gbps", j.get("gbps", 0)), 2)
            figures[f"load {backend} path"] = j.get("target", "?")
        j = json.loads(self.medfast("io", "store", "--dir", self.work, "--mb-size", "1024", "--device", "cuda",
                                    "--loop", "3", "--validate", "--json"))
        figures["store GB/s"] = round(j.get("median_gbps", j.get("gbps", 0)), 2)
        peer = self.sh([sys.executable, "-c", PEER_IO, raw])
        p = json.loads(peer)
        figures["torch.load(map_location=cuda) GB/s"] = round(p["torch_load"], 2)
        figures["python read + .cuda() GB/s"] = round(p["read_cuda"], 2)
        figures["medfast/python read ratio"] = round(figures["load auto GB/s"] / p["read_cuda"], 2)
        del f
        return figures

    def train_run(self, name, data, sets, epochs=3):
        run = os.path.join(self.work, name)
        self.medfast("train", "--config", os.path.join(ROOT, "examples", "spleen.yaml"),
                     "--set", f"data.dataset={data}/dataset.json", "--set", f"train.run_dir={run}",
                     "--set", f"train.epochs={epochs}", "--set", "train.target_dice=0",
                     "--set", "data.cache.dir=" + os.path.join(self.work, name + "-cache"), *sum((["--set", s] for s in sets), []),
                     timeout=1200)
        with open(os.path.join(run, "metrics.jsonl")) as f:
            epochs_ = [json.loads(l) for l in f if l.strip()]
        last = epochs_[1:] or epochs_  # the first epoch fills caches and autotunes
        sps = statistics.median(e["samples_per_second"] for e in last)
        wait = statistics.median(e["times"]["data_wait"] / max(e["seconds"] - e["times"]["validation"], 1e-9)
                                 for e in last)
        out = {"samples/s": round(sps, 2), "data wait %": round(100 * wait, 1)}
        if "gpu" in last[-1]:
            out["gpu util %"] = last[-1]["gpu"].get("utilization_mean")
        if "cuda_peak_allocated_bytes" in last[-1]:
            out["peak GiB"] = round(last[-1]["cuda_peak_allocated_bytes"] / 2 ** 30, 2)
        if any(not isinstance(e.get("loss"), (int, float)) for e in epochs_):
            raise RuntimeError(f"{name}: a non-finite epoch loss: {[e.get('loss') for e in epochs_]}")
        return out

    def step_train(self):
        self.need_cuda()
        data = self.synth("spleen", 12, "256,256,48-64")
        figures = {}
        for amp in ("fp16", "bf16"):
            for cache in ("memory", "device", "disk_device"):
                r = self.train_run(f"train-{amp}-{cache}", data,
                                   ["train.device=cuda", f"train.amp={amp}", f"data.cache.kind={cache}"])
                figures[f"{amp} {cache}"] = ", ".join(f"{k} {v}" for k, v in r.items())
                self.results.setdefault("_train", {})[f"{amp} {cache}"] = r
        return figures

    def step_monai(self):
        self.need_cuda()
        peers = os.path.join(ROOT, ".gpu-peers")
        if not os.path.isdir(os.path.join(peers, "monai")):
            raise Skip("MONAI 1.3.2 was not carried (.gpu-peers/monai)")
        raise Skip("the MONAI twin on CUDA (bench/monai_twin.py --device cuda) is not written yet")

    def step_nccl(self):
        self.need_cuda()
        data = self.synth("spleen", 12, "256,256,48-64")
        run = os.path.join(self.work, "nccl")
        self.medfast("--dist-backend", "nccl", "launch", "--nproc", "1", "--", "train",
                     "--config", os.path.join(ROOT, "examples", "spleen.yaml"),
                     "--set", f"data.dataset={data}/dataset.json", "--set", f"train.run_dir={run}",
                     "--set", "train.epochs=1", "--set", "train.target_dice=0", "--set", "train.device=cuda",
                     timeout=900)
        return {"one-rank NCCL run": "ok"}

    def step_trace(self):
        self.need_cuda()
        data = self.synth("spleen", 12, "256,256,48-64")
        run = os.path.join(self.work, "trace")
        self.medfast("train", "--config", os.path.join(ROOT, "examples", "spleen.yaml"), "--profile", "1,1,2,1",
                     "--set", f"data.dataset={data}/dataset.json", "--set", f"train.run_dir={run}",
                     "--set", "train.epochs=1", "--set", "train.target_dice=0", "--set", "train.device=cuda",
                     timeout=900)
        traces = [os.path.join(run, "profiler", f) for f in os.listdir(os.path.join(run, "profiler"))
                  if f.endswith(".json.gz")]
        if not traces:
            raise RuntimeError("no trace written under profiler/")
        s = json.loads(self.medfast("trace", "summarize", "--json", *traces))
        names = json.dumps(s)
        missing = [r for r in ("step", "data_wait", "forward", "backward") if f'"{r}"' not in names]
        if missing:
            raise RuntimeError(f"the trace lacks the ranges {missing}")
        return {"traces": len(traces)}

    def step_sanitizer(self):
        self.need_cuda()
        tool = shutil.which("compute-sanitizer")
        if not tool:
            raise Skip("compute-sanitizer is not on PATH")
        out = self.sh([tool, "--tool", "memcheck", "--error-exitcode", "3",
                       os.path.join(self.build, "tests", "medfast_gpu_tests")], timeout=1200, check=False)
        if "Device not supported" in out or "error 999" in out:
            raise Skip("compute-sanitizer refused the device")
        errors = next((l for l in out.splitlines() if "ERROR SUMMARY" in l), "no summary")
        if "ERROR SUMMARY: 0 errors" not in errors:
            raise RuntimeError(errors)
        return {"memcheck": errors.strip()}


PEER_IO = r"""
import json, os, sys, time, torch
path = sys.argv[1]
def timed(f, n=3):
    ts = []
    for _ in range(n):
        torch.cuda.synchronize(); t0 = time.perf_counter(); f(); torch.cuda.synchronize(); ts.append(time.perf_counter() - t0)
    return sorted(ts)[len(ts) // 2]
size = os.path.getsize(path)
def read_cuda():
    with open(path, "rb") as f:
        return torch.frombuffer(bytearray(f.read()), dtype=torch.uint8).cuda()
pt = path + ".pt"
torch.save(torch.frombuffer(bytearray(open(path, "rb").read()), dtype=torch.uint8), pt)
load = lambda: torch.load(pt, map_location="cuda")
r = {"read_cuda": size / timed(read_cuda) / 1e9, "torch_load": size / timed(load) / 1e9}
os.remove(pt)
print(json.dumps(r))
"""


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--phase", choices=sorted(PHASES), default="all")
    ap.add_argument("--only", help="comma-separated steps: " + ",".join(STEPS))
    ap.add_argument("--build", default="build-gpu")
    ap.add_argument("--out", help="where the JSON, Markdown table and log go (default: $OUT)")
    ap.add_argument("--dry-run", action="store_true", help="no configure; steps that need a GPU are skipped")
    a = ap.parse_args()
    steps = PHASES[a.phase]
    if a.only:
        steps = [s.strip() for s in a.only.split(",") if s.strip()]
        bad = [s for s in steps if s not in STEPS]
        if bad:
            ap.error(f"--only: unknown steps {bad} (known: {', '.join(STEPS)})")
    return Campaign(a).run(steps)


if __name__ == "__main__":
    sys.exit(main())
