#!/usr/bin/env bash
# Installs every Debian package medfast's build, tests and benchmarks need.
# Idempotent: packages already present are skipped, so README and CI can both call it.
set -euo pipefail

PACKAGES=(
  # toolchain
  build-essential cmake ninja-build ccache pkg-config git clang llvm libclang-rt-14-dev
  # libraries
  libtorch-dev libgloo-dev liburing-dev libdeflate-dev zlib1g-dev
  nlohmann-json3-dev libcli11-dev libyaml-cpp-dev libxxhash-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  # reference implementations for golden tests and benchmarks
  python3 python3-numpy python3-nibabel python3-torch python3-scipy
  # benchmarks
  fio time
)

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "setup: all ${#PACKAGES[@]} packages already installed"
  exit 0
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
echo "setup: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
echo "setup: done"
