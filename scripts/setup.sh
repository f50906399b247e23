#!/usr/bin/env bash
# Installs every Debian package medfast's build, tests and benchmarks need.
# Idempotent: packages already present are skipped, so README and CI can both call it.
set -euo pipefail

PACKAGES=(
  # toolchain
  build-essential cmake ninja-build ccache pkg-config git clang llvm libclang-rt-14-dev
  # libraries
  libtorch-dev libgloo-dev liburing-dev libdeflate-dev zlib1g-dev
  # an optimised BLAS for libtorch (Debian's libtorch runs on whichever libblas.so.3 is
  # selected; without this one it is the reference BLAS, 2-4x slower training on the CPU);
  # the OpenMP build shares libtorch's OpenMP threads
  libopenblas0-openmp
  nlohmann-json3-dev libcli11-dev libyaml-cpp-dev libxxhash-dev
  # DICOM: decoders for JPEG-LS (CharLS), JPEG 2000 (OpenJPEG) and 8-bit lossy JPEG
  # (libjpeg-turbo); medfast parses and decodes RLE and lossless JPEG itself; GDCM writes
  libcharls-dev libopenjp2-7-dev libjpeg-dev libgdcm-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  # the Python module (pybind11, pip with Debian's setuptools: no package index) and its tests
  pybind11-dev python3-dev python3-pip python3-setuptools python3-pytest
  # medfast report's page is checked in a real (headless) browser
  chromium
  # reference implementations for golden tests and benchmarks
  python3 python3-numpy python3-nibabel python3-torch python3-scipy
  # independent DICOM writers for the DICOM goldens (pydicom; dcmtk's dcmcjpeg/dcmcjpls;
  # OpenJPEG's opj_compress)
  python3-pydicom dcmtk libopenjp2-tools
  # benchmarks
  fio time
)

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
if [ ${#missing[@]} -eq 0 ]; then
  echo "setup: all ${#PACKAGES[@]} packages already installed"
else
  echo "setup: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# The Python module, for Debian's python3 (the one with python3-torch), built in
# build/ (which run.sh and test.sh then reuse) and installed with pip from this
# checkout: `python3 -c "import medfast"` works afterwards. MEDFAST_SKIP_PYTHON=1 skips it.
if [ "${MEDFAST_SKIP_PYTHON:-0}" != 1 ]; then
  cd "$(dirname "$0")/.."
  echo "setup: building and installing the Python module (pip install --no-build-isolation .)"
  where=()  # root: the system's site-packages; a user: ~/.local (the build stays the user's)
  if [ "$(id -u)" -ne 0 ]; then where=(--user); fi
  /usr/bin/python3 -m pip install --quiet --no-build-isolation --no-deps --no-index --break-system-packages \
    --root-user-action=ignore "${where[@]}" .
fi
echo "setup: done"
