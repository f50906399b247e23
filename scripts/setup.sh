#!/usr/bin/env bash
# Installs the Debian packages medfast needs, in three groups, and (--python) its Python module.
#   bash scripts/setup.sh            the `medfast` command's build and run-time packages: what
#                                    scripts/run.sh (the main job) needs, nothing more
#   bash scripts/setup.sh --test     and the test suite's, fuzzing's and benchmarks' packages
#                                    (scripts/test.sh)
#   bash scripts/setup.sh --no-torch the command's packages but Debian's libtorch and its BLAS: for a
#                                    build against another PyTorch (scripts/run.sh --torch python)
#   bash scripts/setup.sh --python   and the Python module's packages; then installs the module
#                                    for Debian's /usr/bin/python3 (`import medfast`): pip installs
#                                    what CMake built in build/, building only what is missing there
# Options combine (--test --python). Idempotent: packages already present are skipped and an
# up-to-date module is not compiled again, so README, CI and the other scripts can all call it.
# --packages-only installs the packages of the groups named and skips the module's install.
set -euo pipefail
cd "$(dirname "$0")/.."

test_group=0
python_group=0
packages_only=0
no_torch=0
for arg in "$@"; do
  case "$arg" in
    --test) test_group=1 ;;
    --python) python_group=1 ;;
    --packages-only) packages_only=1 ;;
    --no-torch) no_torch=1 ;;
    -h|--help) sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "setup: unknown option '$arg' (expected --test, --python, --packages-only, --no-torch; --help)" >&2; exit 2 ;;
  esac
done

# The `medfast` command: compiler, build tools and the libraries it links.
PACKAGES=(
  # toolchain (ccache makes a second build folder, or a rebuild, cost seconds)
  build-essential cmake ninja-build ccache pkg-config
  # libraries
  libtorch-dev libgloo-dev liburing-dev libdeflate-dev zlib1g-dev
  # an optimised BLAS for libtorch (Debian's libtorch runs on whichever libblas.so.3 is
  # selected; without this one it is the reference BLAS, 2-4x slower training on the CPU);
  # the OpenMP build shares libtorch's OpenMP threads
  libopenblas0-openmp
  nlohmann-json3-dev libcli11-dev libyaml-cpp-dev libxxhash-dev
  # DICOM: decoders for JPEG-LS (CharLS), JPEG 2000 (OpenJPEG) and 8-bit lossy JPEG
  # (libjpeg-turbo); medfast parses and decodes RLE and lossless JPEG itself; GDCM writes.
  # (libtorch-dev already pulls in CharLS's, OpenJPEG's and GDCM's libraries: the -dev
  # packages add headers only.)
  libcharls-dev libopenjp2-7-dev libjpeg-dev libgdcm-dev
)
# The Python module: pybind11, pip with Debian's setuptools (no package index), the torch it binds.
PYTHON_PACKAGES=(pybind11-dev python3-dev python3-pip python3-setuptools python3-torch python3-numpy)
# The tests, the fuzz and sanitizer builds, golden references and benchmarks.
TEST_PACKAGES=(
  git clang llvm libclang-rt-14-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  # the Python module's tests (python3-venv: `pip install .` into a fresh environment)
  "${PYTHON_PACKAGES[@]}" python3-pytest python3-venv
  # medfast report's page is checked in a real (headless) browser
  chromium
  # reference implementations for golden tests and benchmarks
  python3 python3-nibabel python3-scipy  # (numpy and torch: the Python group above)
  # independent DICOM writers for the DICOM goldens (pydicom; dcmtk's dcmcjpeg/dcmcjpls;
  # OpenJPEG's opj_compress)
  python3-pydicom dcmtk libopenjp2-tools
  # benchmarks
  fio time
)
wanted=()
for p in "${PACKAGES[@]}"; do
  # --no-torch: another PyTorch's libtorch is used, with its own BLAS
  if [ "$no_torch" = 1 ] && { [ "$p" = libtorch-dev ] || [ "$p" = libopenblas0-openmp ]; }; then continue; fi
  wanted+=("$p")
done
if [ "$test_group" = 1 ]; then wanted+=("${TEST_PACKAGES[@]}"); fi
if [ "$python_group" = 1 ]; then wanted+=("${PYTHON_PACKAGES[@]}"); fi

missing=()
for p in "${wanted[@]}"; do
  case " ${missing[*]:-} " in *" $p "*) continue ;; esac
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
if [ ${#missing[@]} -eq 0 ]; then
  echo "setup: the packages needed are installed"
else
  echo "setup: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# The Python module, for Debian's python3 (the one with python3-torch): setup.py builds the
# target medfast_python in build/ (the folder run.sh and test.sh build in: whatever is already
# built there is reused, nothing is compiled twice) and pip installs it from this checkout.
if [ "$python_group" = 1 ] && [ "$packages_only" = 0 ]; then
  echo "setup: installing the Python module (pip install --no-build-isolation ., built in build/)"
  where=()  # root: the system's site-packages; a user: ~/.local (the build stays the user's)
  if [ "$(id -u)" -ne 0 ]; then where=(--user); fi
  /usr/bin/python3 -m pip install --quiet --no-build-isolation --no-deps --no-index --break-system-packages \
    --root-user-action=ignore "${where[@]}" .
fi
echo "setup: done"
