#!/usr/bin/env python3
"""The GPU campaign (issue 21): build medfast on a lent GPU machine and run every GPU check
and benchmark in order, each step timed and logged, a failure recorded and the next step
still run. scripts/gpu_check.sh calls this.

    bash scripts/gpu_check.sh --phase build        # call 1: configure + build (all cores)
    bash scripts/gpu_check.sh --phase run          # call 2: tests and benchmarks
    bash scripts/gpu_check.sh --phase sanitize     # call 3: compute-sanitizer
    bash scripts/gpu_check.sh --phase throughput   # issue 44 in one call: a build of what it runs, then the
                                                   # throughput step (docs/benchmarks.md, "GPU throughput")
    bash scripts/gpu_check.sh --only io,train      # re-run chosen steps after a fix
    bash scripts/gpu_check.sh --only sanitizer     # fits one 10-minute device call
    bash scripts/gpu_check.sh --phase build --targets medfast,medfast_python   # a short re-build
    bash scripts/gpu_check.sh --dry-run --build build   # here, without a GPU (CI runs this)

On the device machine (see docs/benchmarks.md, "GPU runs"): each call carries [".gpu",
".gpu-peers"], made here by scripts/gpu_bundle.sh (the build's dependencies from Debian 12)
and scripts/gpu_peers.sh (MONAI 1.3.2, pure Python, patched for numpy 2 and Python 3.12, and
nibabel's orientations module); the build configures against the image's pip torch (Torch_DIR
from torch.utils.cmake_prefix_path), CUDA arch 90.

Steps with more to them than a command:
  throughput the spleen recipe from the device cache, medfast fp16 and bf16 beside MONAI's tutorial
             twin and its channels-last twin (bench/monai_twin.py --variants), the loader alone on
             the GPU, the DynUNet step channels-last against contiguous, the GPU step and norm tests,
             the step as one CUDA graph, a deterministic run, the brain-tumour recipe beside its
             MONAI twin (bench/brats_run.py --device cuda: per-region Dice and the wall-time
             ratio, issue 54); the issue's targets judged at the end (the Throughput class).
             Without a GPU (--dry-run) the same code rehearses on the CPU.
  python_tests  first `import torch, medfast` in a process of its own; where it dies by a
             signal, its native stack (cuda-gdb: the image has no gdb) is in the log and the
             first frames are the step's reason; then ctest -L python.
  monai      .gpu-peers first on PYTHONPATH; first (PEER_IMPORT) `import monai` there, from
             there, patched (MANIFEST), MONAI's Spacing geometry on the image's numpy, and the
             first training item through the recipe's deterministic chain with LoadImaged
             reading it by bench/monai_nifti_reader.py (gzip + numpy: of nibabel only its
             orientations module is carried, for Orientation). If that works,
             bench/monai_twin.py --device cuda --amp fp16 --reader numpy on the config.json of
             step_train's `fp16 device` run (medfast's side is run here when step_train did not run in
             this call): CacheDataset + ToDeviced, ThreadDataLoader(num_workers=0), autocast +
             GradScaler; the twin verifies its run (finite losses, expected steps and samples)
             before it prints. Reported: both sides' samples/s and data-wait share,
             medfast/MONAI and the issue's target (>= 1.5x, medfast's data wait < 5%). If MONAI
             does not import or run there, the reason is the result and a plain PyTorch
             DataLoader is timed over the same files instead (PEER_LOADER).
  sanitizer  compute-sanitizer over tests/medfast_gpu_tests, the stream and I/O GPU tests
             (SANITIZER_RUNS): memcheck, then synccheck where the step's budget leaves room;
             the device refused ("Device not supported", error 999, no permission, a sanitizer
             error before any test ran): skipped with the tool's message. cuFile is kept out
             (libcufile stops its process under the sanitizer); a test program that dies under
             it is a failure naming the test.

Results accumulate in BUILD/gpu_check.json (so that the run phase adds to the build
phase's) and are copied with a Markdown table and the log into $OUT (or --out); the table
is printed last. A dry run reuses an existing build folder (no configure: Debian's torch
has no pip-style CMake path), runs every step that can run without a GPU, and marks the
others "skipped: no CUDA device".
"""
import argparse
import json
import math
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STEPS = ["build", "first_contact", "gpu_tests", "python_tests", "self_check", "io", "train", "monai", "nccl", "trace",
         "throughput", "sanitizer"]
# Each phase fits one device call of 10 minutes: the sanitizer (up to 9 minutes of its own)
# is a third call. `throughput` is issue 44's measurement in one call of under 8 minutes: a
# build of what it runs (THROUGHPUT_TARGETS), then the throughput step.
PHASES = {"build": ["build"], "run": STEPS[2:-2], "sanitize": ["sanitizer"],
          "throughput": ["build", "first_contact", "throughput"], "all": STEPS}
# What the throughput phase builds: the command (its two programs), the training tests (the GPU
# step tests) and the network tests (the channels-last norms on CUDA); the whole tree takes a
# minute more on 16 cores.
THROUGHPUT_TARGETS = "medfast_front,medfast_cli,medfast_train_tests,medfast_nn_tests"


# The spleen-like cases of the training steps: 320x320 in-plane keeps the smallest case,
# after Spacing 1.5 mm and CropForeground, above the recipe's 96^3 crop (256x256 gave
# 110x88 and stopped the first GPU run); 41 cases as the Decathlon spleen task, so that
# the recipe's split (the last 9 validate) leaves 32 to train on: with 12 the first GPU
# run trained on 3 (2 steps an epoch, too few to time, and to profile with 1,1,2,1).
SPLEEN_SIZE = "320,320,48-64"
SPLEEN_CASES = 41


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
        self.log(r.stdout[-4000000:] + r.stderr[-1000000:])  # whole (a ctest run's failures are mid-output)
        if check and r.returncode != 0:
            tail = (r.stderr.strip() or r.stdout.strip()).splitlines()[-3:]
            raise RuntimeError(f"{os.path.basename(cmd[0])} exited {r.returncode}: {' | '.join(tail)}")
        return r.stdout

    def sh_limited(self, cmd, timeout, env=None, cwd=None):
        """Runs cmd in its own process group, stdout and stderr together, killing the whole group
        (a sanitizer and the program under it) at `timeout`; returns (exit code, output, timed out)."""
        self.log(f"$ {' '.join(cmd)}   (limit {timeout} s)")
        e = dict(os.environ)
        e.update(env or {})
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=e,
                             cwd=cwd or ROOT, start_new_session=True)
        try:
            out, _ = p.communicate(timeout=timeout)
            timed_out = False
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            out, _ = p.communicate()
            timed_out = True
        self.log(out[-40000:])
        return p.returncode, out, timed_out

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
        if self.a.dry_run:  # the folder as it is where it is built; else built as run.sh's auto choice builds
            missing = [f for f in ("medfast", "medfast-torch", "tests/medfast_gpu_tests")
                       if not os.path.exists(os.path.join(self.build, f))]
            if not missing:
                return {"build folder": "reused"}
            # A clean clone: the libtorch run.sh would choose here (without a GPU, Debian's where
            # python3's torch has no CUDA or no CMake files, as Debian's python3-torch has none),
            # and run.sh says which and why.
            t0 = time.time()
            out = self.sh(["bash", os.path.join(ROOT, "scripts", "run.sh"), "--torch", "auto", "--python", sys.executable,
                           "--build-dir", self.build, "--no-run", "--target", "medfast_front", "--target",
                           "medfast_gpu_tests", "--cmake-arg", "-DMEDFAST_BUILD_TESTS=ON"], timeout=3600)
            decided = next((l for l in out.splitlines() if l.startswith("run.sh: building against")), "")
            self.log(f"dry run: {self.build} lacked {', '.join(missing)}: built it. {decided}")
            return {"build folder": f"built ({decided.replace('run.sh: ', '') or 'run.sh --torch auto'})",
                    "build_s": round(time.time() - t0, 1)}
        # Configured as a GPU user's first command configures (scripts/run.sh's GPU path: the
        # image's torch, its CUDA, the GPU's own architecture, the bundle .gpu/), with the tests.
        if not os.path.isdir(os.path.join(ROOT, ".gpu", "usr")):
            raise RuntimeError(f"{ROOT}/.gpu/usr is missing: run scripts/gpu_bundle.sh on the host and carry .gpu")
        t0 = time.time()
        self.sh(["bash", os.path.join(ROOT, "scripts", "run.sh"), "--torch", "python", "--python", sys.executable,
                 "--build-dir", self.build, "--configure-only", "--cmake-arg", "-DMEDFAST_BUILD_TESTS=ON"], timeout=900)
        configure = time.time() - t0
        # -k 0: every compile error of this build in one device call, not only the first one;
        # the whole output goes to build.log beside the campaign's log.
        targets = [t for t in (self.a.targets or "").split(",") if t]
        if not targets and self.a.phase == "throughput" and not self.a.only:
            targets = THROUGHPUT_TARGETS.split(",")
        cmd = ["cmake", "--build", self.build, "-j", jobs, *(["--target", *targets] if targets else []), "--", "-k", "0"]
        log_path = os.path.join(self.out, "build.log")
        self.log("$ " + " ".join(cmd) + f"   (output in {log_path})")
        # Streamed to the file: a device call cut short by its time limit still brings it back.
        with open(log_path, "w") as f:
            r = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, text=True, timeout=3000, cwd=ROOT)
        if r.returncode != 0:
            with open(log_path, errors="replace") as f:
                errors = [l.rstrip() for l in f if re.search(r"\berror:|^FAILED:|internal compiler error", l)]
            self.log("\n".join(errors[:200]))
            raise RuntimeError(f"the build failed ({len(errors)} error lines; build.log): " + " | ".join(errors[:4]))
        return {"configure_s": round(configure, 1), "build_s": round(time.time() - t0 - configure, 1)}

    def step_first_contact(self):
        """A GPU user's first command (README, "On a GPU machine"): `bash scripts/run.sh` from the working tree, which
        builds against the image's torch (into the campaign's build folder, which the build step
        configured through the same script: nothing is compiled again) and trains the built-in
        default on the GPU to its Dice target. Reported: the wall time, the device the run named,
        the Dice. The dry run (no GPU) checks run.sh's decisions here (`--check`)."""
        run_sh = os.path.join(ROOT, "scripts", "run.sh")
        if not self.cuda():
            if not self.a.dry_run:
                raise Skip("no CUDA device")
            out = self.sh(["bash", run_sh, "--check", "--python", sys.executable], timeout=120)
            decided = next((l for l in out.splitlines() if "decided:" in l), out.strip().splitlines()[-1])
            return {"run.sh --check (no GPU here)": decided.replace("run.sh: ", "")}
        t0 = time.time()
        out = self.sh(["bash", run_sh, "--torch", "python", "--python", sys.executable, "--build-dir", self.build,
                       "--overwrite"], timeout=900, cwd=ROOT)
        wall = time.time() - t0
        device = next((l for l in out.splitlines() if l.startswith("device ")), "no device line")
        with open(os.path.join(ROOT, "runs", "default", "metrics.jsonl")) as f:
            epochs = [json.loads(l) for l in f if l.strip()]
        best = max((e["dice"] for e in epochs if isinstance(e.get("dice"), (int, float))), default=0)
        if not device.startswith("device cuda"):
            raise RuntimeError(f"the default run did not take the GPU: {device}")
        if best < 0.85:
            raise RuntimeError(f"the default run ended at Dice {best:.3f} (target 0.85) after {len(epochs)} epochs")
        return {"bash scripts/run.sh (built by the build step)": f"{wall:.1f} s", "device": device[len("device "):],
                "Dice": round(best, 3), "epochs": len(epochs),
                "build step": f"{self.results.get('build', {}).get('seconds', '?')} s"}

    def ctest(self, *args, jobs=4, env=None):
        out = self.sh(["ctest", "--test-dir", self.build, "--output-on-failure", "-j", str(jobs), *args], timeout=1500,
                      check=False, env=env)
        summary = next((l.strip() for l in out.splitlines() if "tests passed" in l), "no summary")
        skipped = sum(1 for l in out.splitlines() if re.match(r"^\s+\d+ - .* \(Skipped\)\s*$", l))
        failed = failed_tests(out)
        if failed:
            raise RuntimeError(f"{summary}; failed: {', '.join(failed[:8])}")
        if "no summary" in summary and "No tests were found" not in out:
            raise RuntimeError("ctest printed no summary (see the log)")
        return {"ctest": summary, "skipped": skipped}

    def step_gpu_tests(self):
        # One at a time: they share the one GPU, and some read its free memory, time a
        # stream against another or watch the allocator's reserve.
        # -FS golden: the golden-file fixtures need nibabel and pydicom, which the GPU image
        # lacks, and no GPU test reads those files. TMPDIR in the campaign's work folder (the
        # build folder's disk where it existed at the start), not the machine's /tmp.
        tmp = os.path.join(self.work, "tmp")
        os.makedirs(tmp, exist_ok=True)
        return self.ctest("-L", "gpu", "-FS", "golden", jobs=1, env={"TMPDIR": tmp})

    def step_python_tests(self):
        probe = self.python_import_probe()
        figures = self.ctest("-L", "python")
        return {**figures, "import": probe}

    def python_import_probe(self):
        """`import torch, medfast` in a process of its own, before the tests: where it dies by a
        signal, the native stack (cuda-gdb, which the image has in place of gdb) is logged and
        its first medfast/torch frames raised, so that one device call says where it crashed."""
        if not os.path.exists(os.path.join(self.build, "python", "medfast", "__init__.py")):
            raise Skip("the Python module was not built (the configure output says why)")
        env = dict(os.environ, PYTHONPATH=os.path.join(self.build, "python"))
        code = "import torch, medfast; print('medfast', medfast.__version__, 'torch', torch.__version__)"
        r = subprocess.run([sys.executable, "-X", "faulthandler", "-c", code], capture_output=True, text=True,
                           timeout=120, env=env, cwd=self.work)
        self.log(f"$ {sys.executable} -c {code!r}\n{r.stdout}{r.stderr[-6000:]}")
        if r.returncode == 0:
            return r.stdout.strip()
        if r.returncode > 0:
            raise RuntimeError(f"import medfast failed: {(r.stderr.strip().splitlines() or ['?'])[-1]}")
        gdb = find_program(["gdb", "cuda-gdb"], ["/usr/local/cuda/bin/cuda-gdb"])
        frames = []
        if gdb:
            try:
                g = subprocess.run([gdb, "-batch", "-ex", "run", "-ex", "bt 40", "-ex", "info sharedlibrary",
                                    "--args", sys.executable, "-c", code], capture_output=True, text=True,
                                   timeout=120, env=env, cwd=self.work)
                self.log(f"$ {gdb} -batch -ex run -ex 'bt 40' --args ...\n{g.stdout[-60000:]}{g.stderr[-6000:]}")
                frames = [re.sub(r"\s+", " ", l.strip())[:160] for l in g.stdout.splitlines() if re.match(r"#\d+ ", l)]
            except subprocess.TimeoutExpired:
                self.log(f"{gdb} did not finish in 120 s")
        raise RuntimeError(f"import medfast died by signal {-r.returncode}; native stack: "
                           + (" | ".join(frames[:6]) if frames else "no debugger here (see the log)"))

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

    def spleen(self):
        """The training steps' spleen-like cases (written once per call)."""
        return self.synth("spleen", SPLEEN_CASES, SPLEEN_SIZE)

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
            # the transfer path (cuFile or the bounce) and whether the host side read past the page cache
            figures[f"load {backend} path"] = f"{j.get('device_path', '?')}, direct {j.get('direct', '?')}"
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
            out["gpu util %"] = last[-1]["gpu"].get("util_mean")
        if "cuda_peak_allocated_bytes" in last[-1]:
            out["peak GiB"] = round(last[-1]["cuda_peak_allocated_bytes"] / 2 ** 30, 2)
        if any(not isinstance(e.get("loss"), (int, float)) for e in epochs_):
            raise RuntimeError(f"{name}: a non-finite epoch loss: {[e.get('loss') for e in epochs_]}")
        return out

    def step_train(self):
        self.need_cuda()
        data = self.spleen()
        figures = {}
        for amp in ("fp16", "bf16"):
            for cache in ("device", "memory", "disk_device"):
                r = self.train_run(f"train-{amp}-{cache}", data,
                                   ["train.device=cuda", f"train.amp={amp}", f"data.cache.kind={cache}"])
                line = figures[f"{amp} {cache}"] = ", ".join(f"{k} {v}" for k, v in r.items())
                # each run as it ends: a call cut short still shows the runs it finished
                self.log(f"train {amp} {cache}: {line}")
                print(f"gpu_check: train {amp} {cache}: {line}", flush=True)
                self.results.setdefault("_train", {})[f"{amp} {cache}"] = r
        return figures

    def step_monai(self):
        """MONAI 1.3.2 on the GPU beside medfast's `fp16 device` run of step_train: bench/monai_twin.py
        on that run's config.json (the same files, chains, UNet, loss, optimizer and batch; AMP fp16
        with a GradScaler; the cache moved to the GPU with ToDeviced; ThreadDataLoader(num_workers=0)),
        with .gpu-peers (scripts/gpu_peers.sh: MONAI patched for numpy 2 and Python 3.12) on
        PYTHONPATH and NIfTI read by bench/monai_nifti_reader.py (of nibabel, only
        nibabel.orientations is carried). First the probe (PEER_IMPORT): MONAI imports from there,
        the copy is patched, Spacing's geometry runs on this numpy, and the first training item
        goes through the deterministic chain. Where that fails, or the twin fails, the reason is
        the result and a plain PyTorch DataLoader is timed over the same files instead (the
        issue's fallback, no model)."""
        self.need_cuda()
        peers = os.path.join(ROOT, ".gpu-peers")
        if not os.path.isdir(os.path.join(peers, "monai")):
            raise Skip("MONAI 1.3.2 was not carried: run scripts/gpu_peers.sh here and carry .gpu-peers")
        config = os.path.join(self.work, "train-fp16-device", "config.json")
        ours = self.results.get("_train", {}).get("fp16 device")
        if not (os.path.exists(config) and ours):  # step_train did not run in this call: medfast's side now
            data = self.spleen()
            ours = self.train_run("monai-medfast-fp16-device", data,
                                  ["train.device=cuda", "train.amp=fp16", "data.cache.kind=device"])
            config = os.path.join(self.work, "monai-medfast-fp16-device", "config.json")
        figures = {"medfast fp16 device": f"samples/s {ours['samples/s']}, data wait % {ours['data wait %']}"}
        path = os.environ.get("PYTHONPATH")
        env = {"PYTHONPATH": peers + (os.pathsep + path if path else "")}
        try:
            out = self.sh([sys.executable, "-c", PEER_IMPORT, peers, os.path.join(ROOT, "bench"), config, self.work],
                          env=env, timeout=180)
            probe = json.loads(out.strip().splitlines()[-1])
        except (RuntimeError, ValueError, IndexError, subprocess.TimeoutExpired) as e:  # the probe itself died
            probe = {"errors": {"probe": str(e)}}
        where = f"numpy {probe.get('numpy')}, torch {probe.get('torch')}, Python {probe.get('python')}"
        detail = {"probe": probe, "medfast": ours}
        if probe["errors"]:
            why = "; ".join(f"{k}: {v}" for k, v in probe["errors"].items())
            figures["MONAI 1.3.2"] = f"does not run on {where}: {why}"
            figures.update(self.plain_loader(config, ours, detail))
            self.results["_monai"] = detail
            return figures
        try:
            out = self.sh([sys.executable, os.path.join(ROOT, "bench", "monai_twin.py"), "--config", config,
                           "--base", self.work, "--device", "cuda", "--amp", "fp16", "--reader", "numpy",
                           "--threads", str(os.cpu_count() or 2), "--monai", peers,
                           "--run-dir", os.path.join(self.work, "monai-twin")], env=env, timeout=480)
            twin = json.loads(out.strip().splitlines()[-1])
        except (RuntimeError, ValueError, IndexError, subprocess.TimeoutExpired) as e:
            fallback = self.plain_loader(config, ours, detail)
            self.results["_monai"] = detail
            raise RuntimeError(f"the MONAI twin failed on {where}: {e}; instead: "
                               + "; ".join(f"{k} {v}" for k, v in fallback.items())) from e
        last = twin["history"][1:] or twin["history"]  # the first epoch autotunes
        sps = statistics.median(e["samples_per_second"] for e in last)
        wait = statistics.median(e["data_wait"] / max(e["train_seconds"], 1e-9) for e in last)
        ratio = ours["samples/s"] / sps if sps > 0 else float("inf")
        met = ratio >= 1.5 and ours["data wait %"] < 5
        figures["MONAI 1.3.2"] = (f"{where}; {probe.get('patches', '?')} patches; reader {twin.get('reader')}; "
                                  f"verified {twin['verified']['steps_per_epoch']} steps, "
                                  f"{twin['verified']['samples_per_epoch']} samples per epoch, finite losses")
        side = f"MONAI {twin['amp']}{' ToDeviced' if twin['cache_on_device'] else ''}"
        figures[side] = f"samples/s {round(sps, 2)}, data wait % {round(100 * wait, 1)}"
        figures["medfast/MONAI samples/s"] = round(ratio, 2)
        figures["target (>= 1.5x, medfast data wait < 5%)"] = "met" if met else "not met"
        detail["twin"] = twin
        self.results["_monai"] = detail
        return figures

    def plain_loader(self, config_path, ours, detail):
        """The issue's fallback: a plain PyTorch DataLoader (no MONAI, no nibabel) over the run's
        training files, each item read, scaled and cut into the recipe's crops, batches copied to
        the GPU; loader samples/s (no model runs)."""
        with open(config_path) as f:
            c = json.load(f)
        d = c["data"]
        listing_path = os.path.join(self.work, d["dataset"])
        with open(listing_path) as f:
            listing = json.load(f)
        folder = os.path.dirname(listing_path)
        items = [{k: os.path.normpath(os.path.join(folder, i[k])) for k in ("image", "label")}
                 for i in listing[d.get("section", "training")]]
        num = (d.get("validation") or {}).get("num")
        if num:
            items = items[:-num]
        crop = next(t for t in d["random"] if t["name"] == "RandCropByPosNegLabel")
        scale = next((t for t in d["deterministic"] if t["name"] == "ScaleIntensityRange"), {})
        args = {"bench": os.path.join(ROOT, "bench"), "items": items, "roi": crop["spatial_size"],
                "num_samples": crop.get("num_samples", 1),
                "batch": d.get("loader", {}).get("batch_size", 1), "workers": min(8, os.cpu_count() or 2),
                "epochs": 5, "scale": [scale.get(k, v) for k, v in (("a_min", 0), ("a_max", 1), ("b_min", 0),
                                                                       ("b_max", 1))]}
        r = self.sh([sys.executable, "-c", PEER_LOADER, json.dumps(args)], timeout=300)
        r = json.loads(r.strip().splitlines()[-1])
        detail["plain_loader"] = r
        return {"plain DataLoader (loader alone, no model)":
                f"samples/s {round(r['samples_per_second'], 2)} ({r['workers']} workers, {len(items)} items x "
                f"{args['num_samples']} crops {'x'.join(map(str, args['roi']))}, read + scale + crops + flips, "
                f"to the GPU; "
                f"verified {r['samples_per_epoch']} samples per epoch, finite)",
                "medfast train / plain loader samples/s": round(ours["samples/s"] / r["samples_per_second"], 2)}

    def step_nccl(self):
        self.need_cuda()
        data = self.spleen()
        run = os.path.join(self.work, "nccl")
        self.medfast("--dist-backend", "nccl", "launch", "--nproc", "1", "--", "train",
                     "--config", os.path.join(ROOT, "examples", "spleen.yaml"),
                     "--set", f"data.dataset={data}/dataset.json", "--set", f"train.run_dir={run}",
                     "--set", "train.epochs=1", "--set", "train.target_dice=0", "--set", "train.device=cuda",
                     timeout=900)
        return {"one-rank NCCL run": "ok"}

    def step_trace(self):
        self.need_cuda()
        data = self.spleen()
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
        return {"traces": len(traces), **check_trace_summary(s if isinstance(s, list) else [s])}

    def step_throughput(self):
        """Issue 44's figures in one call: the spleen recipe from the device cache (32 training
        cases) trained by medfast in fp16 and bf16 (channels-last, cudnn.benchmark on:
        train.deterministic false) beside MONAI's tutorial loop and the same loop channels-last
        (bench/monai_twin.py --variants fp16,fp16-cl,bf16-cl: one cache fill, the same
        determinism), then a deterministic medfast run, the loader alone on the GPU, the DynUNet
        (instance norm) step channels-last against contiguous, the GPU step test (no layout
        round trip, fused update), and sliding-window inference with the same weights beside
        MONAI's channels-last (bench/inference_bench.py: labels compared, then timed). Each figure is logged as it comes (a call cut short keeps
        them); the targets are judged at the end. Without a GPU (the dry run), the same code
        runs a small rehearsal on the CPU, which checks its plumbing and judges nothing."""
        rehearsal = not self.cuda()
        if rehearsal and not self.a.dry_run:
            raise Skip("no CUDA device")
        t = Throughput(self, rehearsal)
        return t.run()

    def step_sanitizer(self):
        """compute-sanitizer over the stream and I/O GPU tests of tests/gpu (the binary
        medfast_gpu_tests): memcheck over all four suites, then synccheck over the stream tests
        when the budget leaves room (racecheck is not run: medfast launches no kernels of its own,
        and racecheck audits shared-memory hazards inside kernels, here libtorch's). Fits one
        10-minute device call: `bash scripts/gpu_check.sh --only sanitizer`."""
        self.need_cuda()
        tool = find_program(["compute-sanitizer"], ["/usr/local/cuda/bin/compute-sanitizer",
                                                     "/usr/local/cuda/compute-sanitizer/compute-sanitizer"])
        if not tool:
            raise Skip("compute-sanitizer is not on PATH (nor in /usr/local/cuda)")
        binary = os.path.join(self.build, "tests", "medfast_gpu_tests")
        t0 = time.time()
        figures = {}
        budget = self.a.sanitizer_budget
        for name, gtest_filter, limit in SANITIZER_RUNS:
            left = budget - (time.time() - t0)
            if name != "memcheck" and left < limit:
                figures[name] = (f"not run: {left:.0f} s of the step's {budget} s left, "
                                 f"it may take {limit} s")
                continue
            figures[name] = self.sanitize(tool, name, binary, gtest_filter, min(limit, left))
        return figures

    def sanitize(self, tool, name, binary, gtest_filter, limit):
        """One compute-sanitizer run; its figure, or Skip (the device refused) / RuntimeError."""
        t = time.time()
        # libcufile stops its process under compute-sanitizer ("Assertion failure, file index
        # :cufio-plat line :149", seen on an H100 with the 2026 image), before any sanitizer
        # report: cuFile is kept out (a library path that does not exist, so medfast takes its
        # pinned bounce, as on a machine without cuFile), and the sanitizer checks medfast's own
        # transfers. The cuFile path itself runs in gpu_tests.
        rc, out, timed_out = self.sh_limited(
            [tool, "--tool", name, "--error-exitcode", "3", "--print-limit", "50", binary,
             f"--gtest_filter={gtest_filter}"], timeout=int(limit), cwd=os.path.join(self.build, "tests"),
            env={"MEDFAST_CUFILE_LIBRARY": "/nonexistent/libcufile-kept-out-under-compute-sanitizer.so"})
        seconds = round(time.time() - t)
        lines = out.splitlines()
        own = [l for l in lines if l.startswith("=========")]  # the sanitizer's lines, not the tests'
        tool_errors = [l.strip("= ").strip() for l in own
                       if re.search(r"\berror\b|not supported|permission", l, re.I) and "ERROR SUMMARY" not in l]
        refused = any(re.search(r"Device not supported|error 999|no permission|insufficient permission|"
                                r"permission denied|ERR_NVGPUCTRPERM", l, re.I) for l in own)
        ran = any(l.startswith("[==========] Running") for l in lines)
        if refused or (not ran and tool_errors and not timed_out):
            why = " | ".join(tool_errors[:2]) or "refused the device"
            raise Skip(f"compute-sanitizer {name} could not run here: {why}")
        if timed_out:
            raise RuntimeError(f"{name} stopped at its {int(limit)} s limit (see the log)")
        summary = next((l.strip("= ").strip() for l in lines if "ERROR SUMMARY" in l), None)
        passed = next((re.search(r"(\d+) tests?", l).group(1) for l in lines if l.startswith("[  PASSED  ]")), "0")
        skipped = next((re.search(r"(\d+) tests?", l).group(1) for l in lines if l.startswith("[  SKIPPED ]")
                        and re.search(r"\d+ tests?,", l)), "0")
        failed = sorted({l[len("[  FAILED  ] "):].split(" ")[0].rstrip(",") for l in lines
                         if l.startswith("[  FAILED  ] ") and "listed below" not in l})
        running = [l[len("[ RUN      ] "):].strip() for l in lines if l.startswith("[ RUN      ] ")]
        if ran and not any(l.startswith("[  PASSED  ]") for l in lines):
            # the test program died under the sanitizer (a crash, an abort in a library)
            said = [l.strip() for l in lines if l.strip() and not l.startswith(("=========", "["))][-2:]
            raise RuntimeError(f"{name}: the test program stopped (exit {rc}) in "
                               f"{running[-1] if running else 'its set-up'}: {' | '.join(said) or 'see the log'}")
        if summary is None:
            raise RuntimeError(f"{name}: no ERROR SUMMARY (exit {rc}): {' | '.join(tool_errors[:2]) or 'see the log'}")
        errors = int(re.search(r"(\d+) error", summary).group(1))
        if errors:
            kinds = sorted({l.strip("= ").strip().split(" at ")[0][:120] for l in own
                            if not l.startswith("=========     ") and l.strip("= ").strip()
                            and not re.search(r"ERROR SUMMARY|COMPUTE-SANITIZER", l)})[:4]
            raise RuntimeError(f"{name}: {summary}: {' | '.join(kinds)}")
        if failed:
            raise RuntimeError(f"{name}: {summary}, but tests failed under it: {', '.join(failed[:6])}")
        if passed == "0":
            raise Skip(f"{name}: no test ran under compute-sanitizer ({skipped} skipped: see the log)")
        return f"{summary}; {passed} tests passed, {skipped} skipped; {seconds} s"


class Throughput:
    """The throughput step's measurements (Campaign.step_throughput). On a GPU: the spleen
    recipe at full size; in rehearsal (no GPU): the built-in default's small data on the CPU,
    fp32, two epochs, the same code paths, no targets judged."""

    # Issue 44's targets, judged on a GPU only.
    VS_TUTORIAL, VS_CHANNELS_LAST, LOADER_FACTOR, VALIDATION_SHARE, DYNUNET_FACTOR, DATA_WAIT = 3.0, 1.2, 2.0, 0.5, 1.5, 0.02

    def __init__(self, campaign, rehearsal):
        self.c = campaign
        self.rehearsal = rehearsal
        self.figures = {}
        self.detail = {}
        self.judged = {}

    def note(self, key, value):
        self.figures[key] = value
        self.c.log(f"throughput: {key}: {value}")
        print(f"gpu_check: throughput: {key}: {value}", flush=True)

    # -- the runs --------------------------------------------------------------------------

    def data(self):
        if self.rehearsal:
            return self.c.synth("rehearsal", 16, "160,160,16-20")
        return self.c.spleen()

    def train_sets(self, amp, deterministic):
        if self.rehearsal:
            return ["train.device=cpu", "train.amp=fp32", "data.cache.kind=memory",
                    "train.memory_format=channels_last",  # the CPU rehearses the GPU's layout
                    "data.random.0.spatial_size=[32,32,16]", "validation.sliding_window.roi_size=[32,32,16]",
                    "data.validation.num=2", f"train.deterministic={str(deterministic).lower()}"]
        return ["train.device=cuda", f"train.amp={amp}", "data.cache.kind=device",
                f"train.deterministic={str(deterministic).lower()}"]

    def medfast_run(self, name, amp, deterministic, epochs, extra=()):
        data = self.data()
        run = os.path.join(self.c.work, name)
        self.c.medfast("train", "--config", os.path.join(ROOT, "examples", "spleen.yaml"),
                       "--set", f"data.dataset={data}/dataset.json", "--set", f"train.run_dir={run}",
                       "--set", f"train.epochs={epochs}", "--set", "train.target_dice=0",
                       "--set", "data.cache.dir=" + os.path.join(self.c.work, name + "-cache"),
                       *sum((["--set", s] for s in [*self.train_sets(amp, deterministic), *extra]), []), timeout=900)
        with open(os.path.join(run, "metrics.jsonl")) as f:
            history = [json.loads(l) for l in f if l.strip()]
        r = summarize_medfast(history)
        r["config"] = os.path.join(run, "config.json")
        r["run"] = run
        self.detail[name] = r
        return r

    def twin(self, config, epochs):
        peers = os.path.join(ROOT, ".gpu-peers") if not self.rehearsal else os.path.join(ROOT, "..", "shared", "peers",
                                                                                            "monai-1.3.2")
        if not os.path.isdir(os.path.join(peers, "monai")):
            return None, f"MONAI 1.3.2 absent ({peers}): " + ("run scripts/gpu_peers.sh here and carry .gpu-peers"
                                                              if not self.rehearsal else "the peers are not beside this clone")
        variants = "fp32,fp32-cl" if self.rehearsal else "fp16,fp16-cl,bf16-cl"
        path = os.environ.get("PYTHONPATH")
        env = {"PYTHONPATH": peers + (os.pathsep + path if path else "")}
        out = self.c.sh([sys.executable, os.path.join(ROOT, "bench", "monai_twin.py"), "--config", config,
                         "--base", self.c.work, "--variants", variants, "--threads", str(os.cpu_count() or 2),
                         "--monai", peers, "--reader", "auto" if self.rehearsal else "numpy",
                         "--run-dir", os.path.join(self.c.work, "twin")]
                        + ["--device", "cpu" if self.rehearsal else "cuda"], env=env, timeout=600)
        doc = json.loads(out.strip().splitlines()[-1])
        return {v["variant"]: summarize_twin(v) for v in doc["variants"]}, None

    def loader(self, config):
        # Every batch of a first epoch checked off the clock, then 3 figures of >= 1 s of epochs each.
        args = ["bench", "loader", "--config", config, "--repeats", "3", "--min-seconds", "1", "--json",
                "--device", "cpu" if self.rehearsal else "cuda"]
        j = json.loads(self.c.medfast(*args, timeout=600))
        return {"samples/s": round(j["samples_per_second"], 1),
                "spread": [round(j["samples_per_second_min"], 1), round(j["samples_per_second_max"], 1)],
                "verified": j.get("verified")}

    def dynunet(self):
        model = json.dumps(dict(DYNUNET, filters=[8, 16, 32, 64, 64, 64]) if self.rehearsal else DYNUNET)
        shape = "2,1,64,64,32" if self.rehearsal else "2,1,128,128,128"
        base = ["bench", "step", "--json", "--model", model, "--input", shape, "--steps", "3" if self.rehearsal else "10",
                "--warmup", "1" if self.rehearsal else "3", "--optimizer", "SGD"]
        if not self.rehearsal:
            base += ["--device", "cuda", "--amp", "bf16"]
        out = {}
        for layout in ("contiguous", "channels_last"):
            j = json.loads(self.c.medfast(*base, *(["--channels-last"] if layout == "channels_last" else []), timeout=600))
            out[layout] = j.get("pipelined_step", j["train_step"])
        return out

    def inference(self):
        """Sliding-window inference on the same network, weights and image on both sides
        (bench/inference_bench.py): medfast `infer` in bf16 (channels-last by auto) beside MONAI's
        sliding_window_inference with the channels-last model in bf16, cudnn.benchmark on on both
        sides, each timed on its second pass; the labels compared first (equal but at bf16's
        rounding ties), so that the validation time judged beside the twin is of the same labels.
        In rehearsal: the CPU, float32, the small cell."""
        peers = os.path.join(ROOT, ".gpu-peers") if not self.rehearsal else os.path.join(ROOT, "..", "shared", "peers",
                                                                                            "monai-1.3.2")
        if not os.path.isdir(os.path.join(peers, "monai")):
            return None, f"MONAI 1.3.2 absent ({peers})"
        args = ["--cells", "quick" if self.rehearsal else "a", "--rounds", "1", "--threads", str(os.cpu_count() or 2),
                "--medfast", os.path.join(self.c.build, "medfast"), "--monai", peers,
                "--work", os.path.join(self.c.work, "inference")]
        if not self.rehearsal:
            args += ["--device", "cuda", "--amp", "bf16", "--channels-last"]
        path = os.environ.get("PYTHONPATH")
        out = self.c.sh([sys.executable, os.path.join(ROOT, "bench", "inference_bench.py"), *args],
                        env={"PYTHONPATH": peers + (os.pathsep + path if path else "")}, timeout=300)
        doc = json.loads(out.strip().splitlines()[-1])
        cell = doc["cells"][0]
        return {"medfast s": round(cell["medfast"]["infer"], 3), "MONAI s": round(cell["monai"]["infer"], 3),
                "labels": cell["labels_check"], "amp": doc["amp"], "cell": cell["cell"]}, None

    def gpu_step_test(self):
        """The GPU tests of the step and the layout: no layout round trip under a channels-last
        forward and backward, a fused update, a captured step training as the eager one, the
        channels-last norms against libtorch's on CUDA."""
        runs = [("medfast_train_tests", "TrainingStepGpu.*"), ("medfast_nn_tests", "ChannelsLastGpu.*")]
        if self.rehearsal:
            return "not run (no GPU)"
        said = []
        for name, gtest_filter in runs:
            binary = os.path.join(self.c.build, "tests", name)
            if not os.path.exists(binary):
                said.append(f"{name} not built")
                continue
            out = self.c.sh([binary, f"--gtest_filter={gtest_filter}"], check=False, timeout=300)
            passed = re.search(r"\[  PASSED  \] (\d+) tests?", out)
            failed = sorted({l.split("]", 1)[1].strip().split(" ")[0] for l in out.splitlines()
                             if l.startswith("[  FAILED  ]") and "listed below" not in l})
            said.append(f"{gtest_filter} {passed.group(1) if passed else 0} passed"
                        + (f", FAILED {', '.join(failed)}: " + " | ".join(
                            l.strip() for l in out.splitlines() if "Failure" in l or "Expected" in l
                            or "Value of" in l or "Which is" in l)[:400] if failed else ""))
        return "; ".join(said)

    def run(self):
        epochs = 2 if self.rehearsal else 3
        fp16 = self.medfast_run("tp-fp16", "fp16", False, epochs)
        self.note("medfast fp16" if not self.rehearsal else "medfast fp32 (rehearsal)", describe(fp16))
        bf16 = None
        if not self.rehearsal:
            bf16 = self.medfast_run("tp-bf16", "bf16", False, epochs)
            self.note("medfast bf16", describe(bf16))
        twins, why = self.twin(fp16["config"], epochs)
        if twins is None:
            self.note("MONAI twin", why)
        else:
            for name, r in twins.items():
                self.note(f"MONAI {name}", describe(r))
        loader = self.loader(fp16["config"])
        self.note("loader alone", f"samples/s {loader['samples/s']}, verified {loader['verified']}")
        dyn = self.dynunet()
        self.note("DynUNet step (instance norm)", f"contiguous {dyn['contiguous'] * 1e3:.1f} ms, channels-last "
                                                  f"{dyn['channels_last'] * 1e3:.1f} ms")
        self.note("GPU tests (no layout round trip, fused update, captured step, channels-last norms)",
                  self.gpu_step_test())
        try:
            infer, why = self.inference()
        except (RuntimeError, subprocess.TimeoutExpired, ValueError, KeyError) as e:
            infer, why = None, f"failed: {str(e)[:300]}"
        self.note("sliding-window inference, the same weights (medfast infer beside MONAI channels-last)",
                  why or (f"{infer['amp']}, cell {infer['cell']}: medfast {infer['medfast s']} s, MONAI "
                          f"{infer['MONAI s']} s ({ratio(infer['medfast s'], infer['MONAI s'])}x); labels differ at "
                          f"{infer['labels']['differ']} of {infer['labels']['voxels']} voxels, ties under "
                          f"{infer['labels']['tie']:.1e}"))
        if not self.rehearsal:
            try:  # train.cuda_graph: on, measured (off by default until it is)
                graph = self.medfast_run("tp-bf16-graph", "bf16", False, epochs, ["train.cuda_graph=on"])
                self.note("medfast bf16, the step as one CUDA graph", describe(graph)
                          + f"; {ratio(graph['samples/s'], bf16['samples/s'])}x the eager step")
            except (RuntimeError, subprocess.TimeoutExpired) as e:
                self.note("medfast bf16, the step as one CUDA graph", f"failed: {str(e)[:300]}")
            det = self.medfast_run("tp-fp16-deterministic", "fp16", True, 2)
            self.note("medfast fp16 deterministic (cudnn.benchmark off)", describe(det))
        try:
            self.note("brain-tumour recipe beside its MONAI twin (issue 54)", self.brats())
        except (RuntimeError, subprocess.TimeoutExpired, ValueError, KeyError) as e:
            self.note("brain-tumour recipe beside its MONAI twin (issue 54)", f"failed: {str(e)[:300]}")
        try:
            self.note("I/O engine (issue 45: host and device memory through one read)", self.engine())
        except (RuntimeError, subprocess.TimeoutExpired, ValueError, KeyError) as e:
            self.note("I/O engine (issue 45: host and device memory through one read)", f"failed: {str(e)[:300]}")
        self.judge(fp16, bf16, twins, loader, dyn, infer)
        self.c.results["_throughput"] = {"detail": self.detail, "twins": twins, "loader": loader, "dynunet": dyn,
                                         "inference": infer, "judged": self.judged}
        return self.figures

    def brats(self):
        """examples/brats.yaml (MONAI's brats_training_ddp.py: regions TC, WT, ET, SegResNet,
        sigmoid Dice) on a synthetic Task01-shaped set beside its MONAI twin, the same data, seed
        and epochs (bench/brats_run.py, which checks steps and samples per epoch on both sides
        and the regions' names first): on the GPU with AMP and the cache in GPU memory, 12 cases
        of 160x160x112 voxels, 8 epochs (within 4 minutes of the call); in rehearsal the CPU, 6
        cases of 32x32x24, 2 epochs.
        The figure: each region's Dice on both sides and the wall-time ratio."""
        peers = os.path.join(ROOT, ".gpu-peers") if not self.rehearsal else os.path.join(ROOT, "..", "shared", "peers",
                                                                                            "monai-1.3.2")
        args = ["--build", self.c.build, "--seeds", "0", "--threads", str(os.cpu_count() or 2),
                "--keep", os.path.join(self.c.work, "brats"), "--monai", peers]
        if self.rehearsal:
            args += ["--cases", "6", "--size", "32,32,24", "--epochs", "2"]
        else:
            args += ["--cases", "12", "--size", "160,160,112", "--epochs", "8", "--device", "cuda", "--reader", "numpy"]
        path = os.environ.get("PYTHONPATH")
        out = self.c.sh([sys.executable, os.path.join(ROOT, "bench", "brats_run.py"), *args],
                        env={"PYTHONPATH": peers + (os.pathsep + path if path else "")}, timeout=240)
        lines = [l.strip() for l in out.splitlines() if l.startswith(("median ", "Dice ", "wall time "))]
        if not lines:
            raise RuntimeError(f"bench/brats_run.py printed no figures: {out[-300:]}")
        return "; ".join(lines)

    def engine(self):
        """io load and io store of device memory (cuda; the CPU in rehearsal), 256 MiB, each
        validated against a plain read: under auto (cuFile where GPUDirect is there, else the
        pinned bounce) and with cufile by name; the path each took is in the figure."""
        device = "cpu" if self.rehearsal else "cuda"
        raw = os.path.join(self.c.work, "engine.bin")
        with open(raw, "wb") as o:
            o.write(os.urandom(256 << 20))
        said = []
        for backend in ("auto", "cufile"):
            j = json.loads(self.c.medfast("io", "load", "--file", raw, "--device", device, "--loop", "3", "--validate",
                                          "--backend", backend, "--json"))
            if not j.get("validated"):
                raise RuntimeError(f"io load --backend {backend}: the bytes were not validated")
            said.append(f"load {backend} {j.get('median_gbps', 0):.2f} GB/s via {j.get('device_path', 'host memory')}")
        j = json.loads(self.c.medfast("io", "store", "--dir", self.c.work, "--mb-size", "256", "--device", device,
                                      "--loop", "2", "--validate", "--json"))
        if not j.get("validated"):
            raise RuntimeError("io store: the bytes were not validated")
        said.append(f"store {j.get('median_gbps', 0):.2f} GB/s, validated")
        return "; ".join(said)

    def judge(self, fp16, bf16, twins, loader, dyn, infer=None):
        """The issue's done-when, figure by figure ("met", "not met", or why it cannot be said)."""
        def mark(what, ok, detail):
            self.judged[what] = {"met": ok, "detail": detail}
            self.note(f"target: {what}", ("met" if ok else "NOT met") + f" ({detail})" if not self.rehearsal
                      else f"rehearsal, not judged ({detail})")
        ours = fp16["samples/s"]
        if twins:
            tut = twins.get("fp16") or twins.get("fp32")
            cl16 = twins.get("fp16-cl") or twins.get("fp32-cl")
            mark(f">= {self.VS_TUTORIAL}x the fp16 tutorial twin", ours >= self.VS_TUTORIAL * tut["samples/s"],
                 f"{ratio(ours, tut['samples/s'])}x")
            mark(f"fp16 >= {self.VS_CHANNELS_LAST}x the channels-last twin", ours >= self.VS_CHANNELS_LAST * cl16["samples/s"],
                 f"{ratio(ours, cl16['samples/s'])}x")
            if bf16 and twins.get("bf16-cl"):
                cl = twins["bf16-cl"]
                mark(f"bf16 >= {self.VS_CHANNELS_LAST}x the channels-last twin",
                     bf16["samples/s"] >= self.VS_CHANNELS_LAST * cl["samples/s"],
                     f"{ratio(bf16['samples/s'], cl['samples/s'])}x")
            if "peak GiB" in fp16 and "peak GiB" in cl16:
                mark("peak GPU memory <= the channels-last twin's", fp16["peak GiB"] <= cl16["peak GiB"],
                     f"{fp16['peak GiB']} vs {cl16['peak GiB']} GiB")
            mark(f"validation <= {self.VALIDATION_SHARE}x the channels-last twin's",
                 fp16["validation s"] <= self.VALIDATION_SHARE * cl16["validation s"],
                 f"{fp16['validation s']} vs {cl16['validation s']} s, {ratio(fp16['validation s'], cl16['validation s'])}x")
            falling = all(r["loss falls"] for r in [fp16, *([bf16] if bf16 else []), *twins.values()])
            mark("every loss finite, each side's last epoch below its first", falling,
                 "; ".join(f"{k} {v['losses']}" for k, v in [("medfast", fp16), *twins.items()]))
        mark(f"data wait < {100 * self.DATA_WAIT:.0f}%", fp16["data wait %"] < 100 * self.DATA_WAIT and
             (bf16 is None or bf16["data wait %"] < 100 * self.DATA_WAIT), f"{fp16['data wait %']}%")
        mark(f"loader alone >= {self.LOADER_FACTOR}x training", loader["samples/s"] >= self.LOADER_FACTOR * ours,
             f"{ratio(loader['samples/s'], ours)}x")
        if infer:  # the labels were compared before any time counted (inference_bench.py exits otherwise)
            mark(f"inference <= {self.VALIDATION_SHARE}x MONAI's channels-last, labels equal but at ties",
                 infer["medfast s"] <= self.VALIDATION_SHARE * infer["MONAI s"],
                 f"{ratio(infer['medfast s'], infer['MONAI s'])}x; {infer['labels']['differ']} voxels differ")
        mark(f"DynUNet channels-last step >= {self.DYNUNET_FACTOR}x contiguous",
             dyn["contiguous"] >= self.DYNUNET_FACTOR * dyn["channels_last"], f"{ratio(dyn['contiguous'], dyn['channels_last'])}x")


# The DynUNet of the throughput step: nnU-Net's 3d_fullres spleen shape, instance norm.
DYNUNET = {"name": "DynUNet", "in_channels": 1, "out_channels": 2, "kernel_size": [3, 3, 3, 3, 3, 3],
           "strides": [1, 2, 2, 2, 2, [2, 2, 1]], "upsample_kernel_size": [2, 2, 2, 2, [2, 2, 1]],
           "filters": [32, 64, 128, 256, 320, 320], "norm_name": "instance", "deep_supervision": True,
           "deep_supr_num": 2, "res_block": False}


def ratio(a, b):
    return round(a / b, 2) if b else float("inf")


def summarize_medfast(history):
    """A medfast run's figures from its metrics.jsonl: the epochs after the first (which fills the
    caches and autotunes), medians; the losses finite and falling."""
    if any(not isinstance(e.get("loss"), (int, float)) or not math.isfinite(e["loss"]) for e in history):
        raise RuntimeError(f"a non-finite epoch loss: {[e.get('loss') for e in history]}")
    last = history[1:] or history
    r = {"samples/s": round(statistics.median(e["samples_per_second"] for e in last), 1),
         "data wait %": round(100 * statistics.median(e["times"]["data_wait"] / max(e["seconds"] - e["times"]["validation"], 1e-9)
                                                      for e in last), 2),
         "validation s": round(statistics.median(e["times"]["validation"] for e in last), 3),
         "losses": [round(e["loss"], 4) for e in history],
         "loss falls": history[-1]["loss"] < history[0]["loss"]}
    if "cuda_peak_allocated_bytes" in last[-1]:
        r["peak GiB"] = round(last[-1]["cuda_peak_allocated_bytes"] / 2 ** 30, 2)
    return r


def summarize_twin(v):
    """A MONAI twin variant's figures, as summarize_medfast's (the twin verified its run itself)."""
    h = v["history"]
    last = h[1:] or h
    r = {"samples/s": round(statistics.median(e["samples_per_second"] for e in last), 1),
         "data wait %": round(100 * statistics.median(e["data_wait"] / max(e["train_seconds"], 1e-9) for e in last), 2),
         "validation s": round(statistics.median(e["validation_seconds"] for e in last), 3),
         "losses": [round(e["loss"], 4) for e in h], "loss falls": h[-1]["loss"] < h[0]["loss"],
         "cudnn.benchmark": v.get("cudnn_benchmark"), "channels_last": v.get("channels_last")}
    if v.get("cuda_peak_allocated_bytes"):
        r["peak GiB"] = round(v["cuda_peak_allocated_bytes"] / 2 ** 30, 2)
    return r


def describe(r):
    keys = ("samples/s", "data wait %", "validation s", "peak GiB", "losses", "cudnn.benchmark")
    return ", ".join(f"{k} {r[k]}" for k in keys if k in r)


def find_program(names, paths):
    """The first of `names` on PATH, else the first executable of `paths` (CUDA's tools are not
    always on PATH); None."""
    return next((p for p in map(shutil.which, names) if p), None) or next(
        (p for p in paths if os.access(p, os.X_OK)), None)


def failed_tests(ctest_output):
    """The tests a ctest run lists as failed, with their status: "(Failed)", "(SEGFAULT)",
    "(Timeout)", "(Subprocess aborted)", ...; skipped ones are not failures."""
    return [f"{m.group(1)} ({m.group(2)})" for m in re.finditer(r"^\s+\d+ - (\S+) \(([^)]+)\)", ctest_output, re.M)
            if m.group(2) not in ("Skipped", "Not Run", "Disabled")]


def check_trace_summary(summaries):
    """The ranges a medfast trace must hold, counted in `medfast trace summarize --json`'s output
    (one object per file): steps, and within them the batch waits ("data_wait", summarised as
    first_load for an epoch's first step and batch_load for the others), forward and backward.
    Returns the counts; raises naming the ranges that no file holds."""
    def count(key):
        return sum(int(x.get(key, {}).get("count", 0)) for x in summaries)
    counts = {"step": count("step"), "data_wait": count("first_load") + count("batch_load"),
              "forward": count("forward"), "backward": count("backward")}
    if any(x.get("producer") != "medfast" for x in summaries):
        raise RuntimeError(f"the trace is not medfast's: producer {[x.get('producer') for x in summaries]}")
    missing = [k for k, v in counts.items() if v == 0]
    if missing:
        raise RuntimeError(f"the trace lacks the ranges {missing}")
    return {f"{k} ranges": v for k, v in counts.items()}


# compute-sanitizer runs of step_sanitizer: (tool, gtest filter over medfast_gpu_tests, limit in
# seconds). memcheck always runs; a later one only where the step's budget has room for its limit.
SANITIZER_RUNS = [
    ("memcheck", "*GpuTensorIo.*:GpuTensorIoPath.*:GpuLoader.*:GpuTransforms.*", 420),
    ("synccheck", "*GpuTensorIo.AsyncTransfersFollowTheCallersStream/*:GpuLoader.DeviceBatchesEqualHostBatches", 120),
]
SANITIZER_BUDGET_S = 540


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


# The monai step's first check, run with .gpu-peers first on PYTHONPATH: argv[1] .gpu-peers,
# argv[2] bench/, argv[3] the run's config.json, argv[4] the folder its paths are relative to.
# Errors (any one sends the step to the fallback): MONAI does not import there, from there; the
# copy carries no patches (MANIFEST: an old .gpu-peers); compute_shape_offset (Spacing's
# geometry, ndarray.ptp before the patch) fails on this numpy; the first training item does not
# go through the recipe's deterministic chain with LoadImaged reading it by
# bench/monai_nifti_reader.py (Orientationd there runs nibabel's orientations, which .gpu-peers
# carries alone). Recorded: which nibabel imports (the carried orientations-only one, expected).
PEER_IMPORT = r"""
import json, os, sys, traceback, warnings
warnings.simplefilter("ignore")
peers, bench = os.path.realpath(sys.argv[1]), os.path.realpath(sys.argv[2])
config_path, base = sys.argv[3], sys.argv[4]
r = {"python": sys.version.split()[0], "errors": {}}
def failure(e):
    tb = traceback.extract_tb(e.__traceback__)
    ours = lambda f: os.path.realpath(f.filename).startswith((peers, bench))
    at = next((f for f in reversed(tb) if ours(f)), tb[-1] if tb else None)
    if at is None:
        return f"{type(e).__name__}: {e}"
    name = os.path.relpath(at.filename, os.path.dirname(peers)) if ours(at) else at.filename
    return f"{type(e).__name__}: {e} ({name}:{at.lineno})"
try:
    import numpy, torch
    r["numpy"], r["torch"] = numpy.__version__, torch.__version__
except BaseException as e:
    r["errors"]["numpy/torch"] = failure(e)
try:
    import nibabel
    only = getattr(nibabel, "ORIENTATIONS_ONLY", False)
    r["nibabel"] = f"{nibabel.__version__} from {os.path.dirname(nibabel.__file__)}" + (" (orientations only)" if only else "")
except BaseException as e:
    r["nibabel"] = f"not importable: {failure(e)}"
try:
    with open(os.path.join(peers, "MANIFEST")) as f:
        r["patches"] = sum(1 for line in f if line.startswith("patched "))
    if not r["patches"]:
        r["errors"]["patches"] = "the carried MONAI is not patched: run scripts/gpu_peers.sh again and carry it"
except OSError as e:
    r["errors"]["patches"] = f"no MANIFEST in {peers}: {e}"
try:
    import monai
    import monai.data, monai.inferers, monai.losses, monai.metrics, monai.networks.nets, monai.transforms
    r["monai"] = monai.__version__
    if not os.path.realpath(monai.__file__).startswith(peers):
        r["errors"]["monai"] = f"imported from {monai.__file__}, not from {peers}"
except BaseException as e:
    r["errors"]["monai"] = failure(e)
if "monai" in r and "monai" not in r["errors"]:
    try:
        from monai.data.utils import compute_shape_offset
        compute_shape_offset([4, 4, 4], numpy.eye(4), numpy.diag([2.0, 2.0, 2.0, 1.0]))
    except BaseException as e:
        r["errors"]["monai Spacing"] = failure(e)
    try:
        sys.path.insert(0, bench)
        import monai_peer, monai_twin
        from monai_nifti_reader import NumpyNiftiReader
        config = json.load(open(config_path))
        item = monai_twin.dataset_items(config, os.path.abspath(base))[0][0]
        chain = monai_peer.transforms(monai, config["data"]["deterministic"], NumpyNiftiReader())
        out = monai.transforms.Compose(chain)(dict(item))
        shapes = {k: list(v.shape) for k, v in out.items() if hasattr(v, "shape") and len(v.shape) == 4}
        if not shapes or not all(bool(torch.isfinite(torch.as_tensor(out[k])).all()) for k in shapes):
            raise RuntimeError(f"the chain gave {shapes} (expected finite [C, X, Y, Z] volumes)")
        r["reader"] = {"item": os.path.basename(item["image"]), "shapes": shapes}
    except BaseException as e:
        r["errors"]["monai reader + deterministic chain"] = failure(e)
print(json.dumps(r))
"""

# The fallback where MONAI does not run: a plain PyTorch DataLoader over the same training files
# (argv[1]: JSON with items, roi, num_samples, batch, workers, epochs, scale). NIfTI-1/2 read with
# gzip and numpy (nibabel may be what does not import); per item: ScaleIntensityRange's scaling,
# num_samples crops of roi centred alternately on foreground and background voxels (padded where
# the volume is smaller), random flips; batches pinned and copied to the GPU. Checked: every
# epoch num_samples x items samples of the roi's shape, all finite.
PEER_LOADER = r"""
import json, os, statistics, sys, time
import numpy as np, torch
a = json.loads(sys.argv[1])
sys.path.insert(0, a["bench"])
from monai_nifti_reader import image_data, load  # numpy alone: no MONAI, no nibabel
def read_nifti(path):
    return image_data(load(path, rectify=False))
a_min, a_max, b_min, b_max = a["scale"]
roi, k = a["roi"], a["num_samples"]
class Items(torch.utils.data.Dataset):
    def __len__(self):
        return len(a["items"])
    def __getitem__(self, i):
        img = read_nifti(a["items"][i]["image"]).astype(np.float32)
        lab = read_nifti(a["items"][i]["label"]).astype(np.float32)
        img = np.clip((img - a_min) / (a_max - a_min), 0, 1) * (b_max - b_min) + b_min
        pad = [(0, max(0, r - s)) for r, s in zip(roi, img.shape)]
        img, lab = np.pad(img, pad), np.pad(lab, pad)
        rng = np.random.default_rng(torch.initial_seed() % 2 ** 32 + i)
        fg, bg = np.flatnonzero(lab > 0), np.flatnonzero(lab == 0)
        xs, ys = [], []
        for j in range(k):
            pool = fg if (j % 2 == 0 and fg.size) or not bg.size else bg
            c = np.unravel_index(pool[rng.integers(pool.size)], lab.shape)
            sl = tuple(slice(min(max(ci - r // 2, 0), s - r), min(max(ci - r // 2, 0), s - r) + r)
                       for ci, r, s in zip(c, roi, lab.shape))
            x, y = img[sl], lab[sl]
            for ax in range(3):
                if rng.random() < 0.5:
                    x, y = np.flip(x, ax), np.flip(y, ax)
            xs.append(np.ascontiguousarray(x)[None])
            ys.append(np.ascontiguousarray(y)[None])
        return torch.from_numpy(np.stack(xs)), torch.from_numpy(np.stack(ys))
def collate(items):
    return torch.cat([x for x, _ in items]), torch.cat([y for _, y in items])
loader = torch.utils.data.DataLoader(Items(), batch_size=a["batch"], shuffle=True, num_workers=a["workers"],
                                     collate_fn=collate, pin_memory=True, persistent_workers=a["workers"] > 0)
want = len(a["items"]) * k
epochs = []
for epoch in range(a["epochs"]):
    torch.cuda.synchronize()
    t0, samples, finite = time.perf_counter(), 0, True
    for x, y in loader:
        x, y = x.cuda(non_blocking=True), y.cuda(non_blocking=True)
        if list(x.shape[1:]) != [1] + list(roi) or x.shape != y.shape:
            sys.exit(f"plain loader: a batch of shape {list(x.shape)}, expected [N, 1, {roi}]")
        finite = finite and bool(torch.isfinite(x).all())
        samples += x.shape[0]
    torch.cuda.synchronize()
    epochs.append(samples / (time.perf_counter() - t0))
    if samples != want or not finite:
        sys.exit(f"plain loader: epoch {epoch + 1}: {samples} samples (expected {want}), finite {finite}")
print(json.dumps({"samples_per_second": statistics.median(epochs[1:] or epochs), "epochs": epochs,
                  "samples_per_epoch": want, "workers": a["workers"], "numpy": np.__version__,
                  "torch": torch.__version__}))
"""


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--phase", choices=sorted(PHASES), default="all")
    ap.add_argument("--only", help="comma-separated steps: " + ",".join(STEPS))
    ap.add_argument("--build", default="build-gpu")
    ap.add_argument("--out", help="where the JSON, Markdown table and log go (default: $OUT)")
    ap.add_argument("--dry-run", action="store_true", help="no configure; steps that need a GPU are skipped")
    ap.add_argument("--targets", help="comma-separated CMake targets the build step builds (default: all), for "
                    "a short re-run after a fix, e.g. medfast,medfast_gpu_tests,medfast_python")
    ap.add_argument("--sanitizer-budget", type=int, default=SANITIZER_BUDGET_S,
                    help=f"seconds for the sanitizer step, all its runs together (default {SANITIZER_BUDGET_S})")
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
