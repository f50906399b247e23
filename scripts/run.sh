#!/usr/bin/env bash
# Sets up, builds and runs medfast's main job on its built-in default: the README's first
# command. `medfast train` with no config writes a small synthetic spleen-like dataset
# (data/synth-small), caches its preprocessing and trains a small UNet until the validation
# Dice reaches 0.85 (at most 40 epochs), on the device it chooses (a GPU where the build has
# CUDA and one is visible, else the CPU; its first line says which and why), printing loss,
# Dice and per-stage times each epoch. Checkpoints and metrics go to runs/default/; run
# again, it continues that run (arguments, e.g. --overwrite, go to `medfast train`).
#
# Which libtorch it builds against (--torch, before any `medfast train` argument):
#   auto    (default) the PyTorch of `python3` where it has CUDA (pip or conda: how GPU users
#           have PyTorch), else Debian's libtorch
#   python  the PyTorch of `python3` (torch.utils.cmake_prefix_path), CUDA or not: its
#           libtorch, the GPU's own architecture (nvidia-smi), the other libraries from
#           Debian's packages, or from the dependency bundle .gpu/ where it is there
#           (scripts/gpu_bundle.sh makes it on a machine with Debian's registry)
#   debian  Debian 12's libtorch (1.13, CPU): scripts/setup.sh installs it
# Before building, every missing prerequisite is named with how to get it.
#
# Options for other scripts (the GPU campaign configures through here): --build-dir DIR
# (default build/, or build-python/ for --torch python), --no-run (configure and build only),
# --configure-only, --check (decide and check the prerequisites, print the decisions, stop:
# nothing is installed or built), --target T (repeatable; default the command: medfast_front),
# --cmake-arg A (repeatable), --python PATH (default: python3 on PATH).
# Each phase's time is printed ("run.sh: ... (N s)"): scripts/first_contact.sh reads them.
set -euo pipefail
cd "$(dirname "$0")/.."

torch=auto
py=python3  # the python3 whose PyTorch a CUDA build uses (the first on PATH: a venv's or conda's)
build_dir=""
run=1
configure_only=0
check=0
targets=()
cmake_args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --torch) torch=${2:-}; shift 2 ;;
    --torch=*) torch=${1#--torch=}; shift ;;
    --python) py=${2:-}; shift 2 ;;
    --build-dir) build_dir=${2:-}; shift 2 ;;
    --no-run) run=0; shift ;;
    --configure-only) configure_only=1; run=0; shift ;;
    --check) check=1; run=0; shift ;;
    --target) targets+=("${2:-}"); shift 2 ;;
    --cmake-arg) cmake_args+=("${2:-}"); shift 2 ;;
    *) break ;;  # the rest goes to `medfast train`
  esac
done
case "$torch" in auto|python|debian) ;; *) echo "run.sh: --torch $torch: expected auto, python or debian" >&2; exit 2 ;; esac
[ ${#targets[@]} -gt 0 ] || targets=(medfast_front)

phase_start=$SECONDS
phase() {  # phase WHAT: says how long the phase that just ended took
  echo "run.sh: $1 ($(( SECONDS - phase_start )) s)"
  phase_start=$SECONDS
}
say() { echo "run.sh: $*"; }

torch_probe() {  # prints "version<TAB>cuda<TAB>cmake dir" of python3's torch; fails without one
  "$py" - <<'EOF' 2>/dev/null
import os, torch
d = os.path.join(torch.utils.cmake_prefix_path, "Torch")
print(f"{torch.__version__}\t{torch.version.cuda or ''}\t{d if os.path.isfile(os.path.join(d, 'TorchConfig.cmake')) else ''}")
EOF
}

probe=""
if [ "$torch" != debian ]; then probe=$(torch_probe || true); fi
if [ "$torch" = auto ]; then
  if [ -n "$probe" ] && [ -n "$(cut -f2 <<<"$probe")" ] && [ -n "$(cut -f3 <<<"$probe")" ]; then
    torch=python
    say "building against the PyTorch of $(command -v "$py") ($(cut -f1 <<<"$probe"), CUDA $(cut -f2 <<<"$probe")): it has CUDA (--torch debian builds against Debian's libtorch instead)"
  else
    torch=debian
    if [ -n "$probe" ] && [ -n "$(cut -f2 <<<"$probe")" ]; then
      say "building against Debian's libtorch: the PyTorch of $(command -v "$py") ($(cut -f1 <<<"$probe"), CUDA $(cut -f2 <<<"$probe")) ships no CMake files to build against (a pip or conda PyTorch has them)"
    elif [ -n "$probe" ]; then
      if [ -n "$(cut -f3 <<<"$probe")" ]; then
        say "building against Debian's libtorch: the PyTorch of $(command -v "$py") ($(cut -f1 <<<"$probe")) has no CUDA (--torch python builds against it anyway)"
      else
        say "building against Debian's libtorch: the PyTorch of $(command -v "$py") ($(cut -f1 <<<"$probe")) has no CUDA and ships no CMake files to build against"
      fi
    else
      say "building against Debian's libtorch (no python3 here imports torch; --torch python would need one)"
    fi
  fi
fi

if [ "$torch" = debian ]; then
  build_dir=${build_dir:-build}
  if [ "$check" = 1 ]; then say "decided: torch debian, build in $build_dir"; exit 0; fi
  bash scripts/setup.sh
  phase "packages ready"
  cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=Release "${cmake_args[@]}"
  phase "configured"
else
  # --torch python: every prerequisite checked first, each missing one named with its remedy.
  problems=()
  if [ -z "$probe" ]; then
    problems+=("$(command -v "$py" || echo python3) cannot import torch: install PyTorch into it (pip install torch, or conda), or use --torch debian for Debian's CPU libtorch")
  else
    version=$(cut -f1 <<<"$probe"); cuda=$(cut -f2 <<<"$probe"); torch_cmake=$(cut -f3 <<<"$probe")
    if [ -z "$torch_cmake" ]; then
      problems+=("torch $version ships no CMake files (torch.utils.cmake_prefix_path/Torch/TorchConfig.cmake): use a pip or conda build of PyTorch, or --torch debian")
    fi
    if ! "$py" -c 'import sys, torch; v = tuple(int(x) for x in torch.__version__.split("+")[0].split(".")[:2]); sys.exit(v < (1, 13))'; then
      problems+=("torch $version is older than medfast supports (1.13 and later): upgrade it")
    fi
    if [ -n "$cuda" ]; then
      nvcc=$(command -v nvcc || true)  # on PATH, else in CUDA_HOME (/usr/local/cuda), where CMake looks too
      cuda_home=${CUDA_HOME:-/usr/local/cuda}
      [ -n "$nvcc" ] || [ ! -x "$cuda_home/bin/nvcc" ] || nvcc=$cuda_home/bin/nvcc
      if [ -z "$nvcc" ]; then
        problems+=("torch $version was built with CUDA $cuda, and its CMake files need the CUDA toolkit (nvcc and the headers), which pip's torch does not bring: install the CUDA toolkit $cuda (NVIDIA's packages; /usr/local/cuda, or CUDA_HOME), or use --torch debian for a CPU build")
      fi
    fi
  fi
  for tool in cmake ninja g++; do
    command -v "$tool" >/dev/null || problems+=("$tool is missing: install it (Debian: apt-get install cmake ninja-build g++)")
  done
  deps_args=()
  deps=packages
  if [ -d .gpu/usr ]; then
    say "the libraries medfast links come from the bundle .gpu/ (scripts/gpu_bundle.sh), not from packages"
    deps_args=(-DMEDFAST_DEPS_PREFIX="$PWD/.gpu/usr")
    deps=bundle
  elif [ "$check" = 1 ]; then
    command -v apt-get >/dev/null || problems+=("no .gpu/ bundle and no apt-get: make the bundle on a machine that has Debian's registry (bash scripts/gpu_bundle.sh) and carry .gpu/ here")
  elif command -v apt-get >/dev/null && bash scripts/setup.sh --no-torch; then
    phase "packages ready"
  else
    problems+=("the libraries medfast links (yaml-cpp, CLI11, libdeflate, ...) are not installed and no package registry answered: make the bundle on a machine that has Debian's registry (bash scripts/gpu_bundle.sh) and carry .gpu/ here")
  fi
  if [ ${#problems[@]} -gt 0 ]; then
    echo "run.sh: cannot build against the PyTorch of $(command -v "$py" || echo python3):" >&2
    for p in "${problems[@]}"; do echo "  - $p" >&2; done
    exit 2
  fi
  arch_args=()
  cap=""
  if [ -n "$cuda" ]; then
    # The GPU's own architecture (not a fixed one): nvidia-smi's compute capability, else
    # torch's view of GPU 0, else the newest torch was built for.
    cap=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1 | tr -d ' ' || true)
    [ -n "$cap" ] || cap=$("$py" -c 'import torch; print("%d.%d" % torch.cuda.get_device_capability(0))' 2>/dev/null || true)
    if [ -z "$cap" ]; then
      cap=$("$py" -c 'import torch; a = [x for x in torch.cuda.get_arch_list() if x.startswith("sm_")]; print(a[-1][3:-1] + "." + a[-1][-1] if a else "")' 2>/dev/null || true)
      say "no GPU visible: building for compute capability ${cap:-9.0}, the newest torch $version was built for"
    fi
    cap=${cap:-9.0}
    say "CUDA architecture: compute capability $cap"
    arch_args=(-DCMAKE_CUDA_ARCHITECTURES="${cap/./}" -DTORCH_CUDA_ARCH_LIST="$cap")
  fi
  build_dir=${build_dir:-build-python}
  if [ "$check" = 1 ]; then
    say "decided: torch python ($version${cuda:+, CUDA $cuda}, $torch_cmake), libraries from $deps${cap:+, compute capability $cap}, build in $build_dir"
    exit 0
  fi
  cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=Release -DTorch_DIR="$torch_cmake" \
    -DPython3_EXECUTABLE="$(command -v "$py")" -DMEDFAST_PYTHON="$(command -v "$py")" \
    "${arch_args[@]}" "${deps_args[@]}" "${cmake_args[@]}"
  phase "configured"
fi
[ "$configure_only" = 0 ] || exit 0
cmake --build "$build_dir" -j "$(nproc)" --target "${targets[@]}"
phase "built"
[ "$run" = 1 ] || exit 0

# Run again, the default run continues where it stopped (or reports that it finished).
case "$build_dir" in /*) medfast="$build_dir/medfast" ;; *) medfast="./$build_dir/medfast" ;; esac
if [ $# -eq 0 ] && [ -f runs/default/last.ckpt ]; then
  echo "runs/default holds a run: continuing it (--resume); pass --overwrite to start again"
  # A run that already reached its target has nothing left to train: medfast says so and
  # refuses --resume (exit 1, nothing changed). For this command the job is done: exit 0.
  err=$(mktemp)
  trap 'rm -f "$err"' EXIT
  set +e
  { "$medfast" train --resume 2>&1 1>&3 3>&- | tee "$err" >&2; } 3>&1  # stderr also to $err
  rc=${PIPESTATUS[0]}
  set -e
  if [ "$rc" -ne 0 ] && grep -q "nothing is left to train" "$err"; then
    echo "runs/default: the default run had already reached its target; nothing to do"
    exit 0
  fi
  exit "$rc"
fi
exec "$medfast" train "$@"
