#!/usr/bin/env bash
# Builds and tests medfast against libtorch 2.x in a Debian trixie root: the
# second build the project supports beside Debian 12's libtorch 1.13.
#
#   bash scripts/compat.sh cpu    libtorch-dev 2.6 (CPU) + python3-torch 2.6:
#                                 builds medfast and its tests, runs all of ctest
#   bash scripts/compat.sh cuda   libtorch-cuda-dev 2.6 + python3-torch-cuda, CUDA
#                                 12.4, libcufile, NCCL: builds every target with
#                                 CUDA enabled (NCCL found) and runs all of ctest
#                                 against the CUDA libtorch (gpu tests skip: no GPU)
#   bash scripts/compat.sh bundle libtorch-dev 2.6, a compiler, CMake and ninja, and none
#                                 of medfast's -dev packages: builds against the bundle
#                                 of scripts/gpu_bundle.sh (.gpu/usr, from Debian 12's
#                                 packages, as the lent GPU machines get it) and runs all
#                                 of ctest: the proof that the bundle is complete
#   bash scripts/compat.sh cpu|cuda|bundle shell   a shell inside the root
#
# Extra arguments after the variant go to ctest (e.g. -R Nifti).
# MEDFAST_COMPAT_TARGETS="t1 t2 ..." builds only those targets (object files too, e.g.
# CMakeFiles/medfast_train.dir/src/train/detail.cpp.o) and runs no tests: a quick check
# that changed CUDA-only code compiles against the CUDA libtorch.
#
# The roots live outside the clone, in ${MEDFAST_COMPAT_ROOT:-/var/cache/medfast}
# (trixie-cpu/, trixie-cuda/), made once per machine with debootstrap from
# the mirror this machine's apt sources name (or MEDFAST_COMPAT_MIRROR) and reused by later runs; each
# step leaves a marker so that an interrupted run resumes where it stopped.
# The clone is bind-mounted read-only at /src/medfast, so the tests run without
# anything beside the clone, as in a user's clone; the build folder is inside
# the root (/build/<variant>-<hash of the source folder>) and ccache is shared with the host's.
#
# Needs root (debootstrap, chroot, mounts in a private mount namespace: nothing
# stays mounted when the script ends).
#
# cuda: trixie's nvidia-cudnn package is an installer that downloads cuDNN from
# NVIDIA; its post-install step fails without network, which leaves
# libtorch-cuda unconfigured. Inside the root only, its postinst is replaced by
# `exit 0` and dpkg configures the rest. libcudnn.so.9 is then missing: the
# script builds a stub with that soname exporting the symbols libtorch_cuda
# imports (each aborts with a message if ever called), so that medfast links
# without --allow-shlib-undefined and its binaries load, and the CPU tests run
# with the CUDA libtorch. Nothing GPU can run in the root (no driver): the
# binaries' CUDA paths report no device and the `gpu` tests skip.
set -euo pipefail

variant=${1:-}
shift || true
case "$variant" in
  cpu|cuda|bundle) ;;
  *) echo "usage: bash scripts/compat.sh cpu|cuda|bundle [shell | ctest arguments...]" >&2; exit 2 ;;
esac

src=$(cd "$(dirname "$0")/.." && pwd)
base=${MEDFAST_COMPAT_ROOT:-/var/cache/medfast}
# The Debian mirror: MEDFAST_COMPAT_MIRROR, else the first main archive this machine's own
# apt sources name (scripts/debian_mirror.sh).
mirror=$(bash "$src/scripts/debian_mirror.sh" || true)
if [ -z "$mirror" ]; then
  echo "compat: no Debian mirror in this machine's apt sources; set MEDFAST_COMPAT_MIRROR" >&2
  exit 2
fi
root=$base/trixie-$variant
jobs=$(nproc)

if [ "$(id -u)" -ne 0 ]; then
  echo "compat: needs root (debootstrap, chroot and mounts); run it with sudo" >&2
  exit 2
fi

say() { echo "compat[$variant]: $*"; }
t0=$(date +%s)

COMMON=(
  build-essential cmake ninja-build ccache pkg-config git ca-certificates
  liburing-dev libdeflate-dev zlib1g-dev nlohmann-json3-dev libcli11-dev
  libyaml-cpp-dev libxxhash-dev libgtest-dev libgmock-dev libbenchmark-dev
  python3 python3-numpy python3-nibabel python3-scipy fio time
  pybind11-dev python3-dev python3-pytest libopenblas0-openmp
  libcharls-dev libopenjp2-7-dev libjpeg-dev libgdcm-dev python3-pydicom dcmtk libopenjp2-tools
)
if [ "$variant" = cpu ]; then
  PACKAGES=("${COMMON[@]}" libtorch-dev python3-torch libgloo-dev)
elif [ "$variant" = bundle ]; then
  # A compiler, CMake, ninja and libtorch (with what it pulls in), and the tests' references
  # and tools (Python with numpy, nibabel, torch, pydicom; dcmtk, OpenJPEG's tools): no
  # pkg-config and none of medfast's -dev packages. .gpu/usr brings the rest.
  PACKAGES=(build-essential cmake ninja-build ccache git ca-certificates libtorch-dev libopenblas0-openmp
            python3 python3-numpy python3-nibabel python3-scipy python3-torch python3-pydicom python3-pytest
            dcmtk libopenjp2-tools fio time)
  if [ ! -d "$src/.gpu/usr/include" ]; then
    echo "compat: bundle needs the bundle: run bash scripts/gpu_bundle.sh first (it makes .gpu/usr)" >&2
    exit 2
  fi
else
  PACKAGES=("${COMMON[@]}" libtorch-cuda-dev python3-torch-cuda libgloo-cuda-dev nvidia-cuda-toolkit nvidia-cuda-toolkit-gcc
            libcufile-dev libnccl-dev)
fi

# 1. The root: debootstrap once (into a .partial folder renamed when complete).
if [ ! -f "$root/.medfast-debootstrap" ]; then
  command -v debootstrap >/dev/null || {
    say "installing debootstrap on the host"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends debootstrap >/dev/null
  }
  mkdir -p "$base"
  rm -rf "$root.partial"
  say "debootstrap trixie (main contrib non-free) into $root from $mirror"
  debootstrap --variant=minbase --components=main,contrib,non-free trixie "$root.partial" "$mirror" \
    > "$base/debootstrap-$variant.log" 2>&1 || {
      echo "compat: debootstrap failed; see $base/debootstrap-$variant.log" >&2; tail -5 "$base/debootstrap-$variant.log" >&2; exit 1; }
  rm -rf "$root"
  mv "$root.partial" "$root"
  printf 'deb %s trixie main contrib non-free\n' "$mirror" > "$root/etc/apt/sources.list"
  touch "$root/.medfast-debootstrap"
  say "root ready ($(( $(date +%s) - t0 )) s)"
fi

ccache_dir=${CCACHE_DIR:-$HOME/.cache/ccache}
mkdir -p "$ccache_dir"

# Everything below runs in a private mount namespace: the mounts vanish with it.
export MEDFAST_COMPAT_VARIANT=$variant MEDFAST_COMPAT_SRC=$src MEDFAST_COMPAT_ROOTDIR=$root
export MEDFAST_COMPAT_CCACHE=$ccache_dir MEDFAST_COMPAT_JOBS=$jobs
export MEDFAST_COMPAT_PACKAGES="${PACKAGES[*]}"
# The script below reaches bash on its standard input: the caller's is kept on fd 3
# for `shell` (else the shell would read the rest of this script as its commands).
exec 3<&0
exec unshare --mount --propagation private -- bash -s -- "$@" <<'INNER'
set -euo pipefail
variant=$MEDFAST_COMPAT_VARIANT root=$MEDFAST_COMPAT_ROOTDIR src=$MEDFAST_COMPAT_SRC
say() { echo "compat[$variant]: $*"; }
mount -t proc proc "$root/proc"
mount --rbind /dev "$root/dev"
mount -t sysfs sys "$root/sys" 2>/dev/null || true
mkdir -p "$root/src/medfast" "$root/ccache" "$root/build"
mount --bind "$src" "$root/src/medfast"
mount -o remount,bind,ro "$root/src/medfast"
mount --bind "$MEDFAST_COMPAT_CCACHE" "$root/ccache"
cp -L /etc/resolv.conf "$root/etc/resolv.conf" 2>/dev/null || true

in_root() {
  chroot "$root" /usr/bin/env -i HOME=/root PATH=/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8 \
    DEBIAN_FRONTEND=noninteractive CCACHE_DIR=/ccache "$@"
}

# 2. Packages, once per package list.
stamp="$root/.medfast-packages"
if [ "$(cat "$stamp" 2>/dev/null)" != "$MEDFAST_COMPAT_PACKAGES" ]; then
  say "installing into the root: $MEDFAST_COMPAT_PACKAGES"
  in_root apt-get update -qq
  if [ "$variant" = cuda ]; then
    # nvidia-cudnn downloads cuDNN from NVIDIA in its postinst, which fails here
    # and leaves everything that depends on it unconfigured: replace the
    # postinst by `exit 0` and let dpkg configure the rest.
    in_root apt-get install -y -qq --no-install-recommends $MEDFAST_COMPAT_PACKAGES \
      || say "apt-get failed (nvidia-cudnn's postinst cannot download cuDNN here): neutralising it and retrying"
    if [ -f "$root/var/lib/dpkg/info/nvidia-cudnn.postinst" ]; then
      printf '#!/bin/sh\n# neutralised by medfast scripts/compat.sh: cuDNN cannot be downloaded here\nexit 0\n' \
        > "$root/var/lib/dpkg/info/nvidia-cudnn.postinst"
    fi
    in_root dpkg --configure -a
    in_root apt-get install -y -qq --no-install-recommends $MEDFAST_COMPAT_PACKAGES
  else
    in_root apt-get install -y -qq --no-install-recommends $MEDFAST_COMPAT_PACKAGES
  fi
  echo "$MEDFAST_COMPAT_PACKAGES" > "$stamp"
fi

# 3. cuda: a libcudnn.so.9 stand-in so that binaries link and load.
cmake_extra=()
if [ "$variant" = cuda ]; then
  if ! in_root sh -c 'ldconfig -p | grep -q "libcudnn.so.9 "'; then
    say "libcudnn.so.9 is absent (nvidia-cudnn downloads it): building a stub with its soname"
    in_root bash /src/medfast/scripts/compat_cudnn_stub.sh /usr/local/lib
    in_root ldconfig
  fi
  cmake_extra=(-DCMAKE_CUDA_HOST_COMPILER=/usr/bin/g++-13)
fi

if [ "${1:-}" = shell ]; then
  say "shell in $root (the clone is at /src/medfast, read-only)"
  in_root bash -l <&3 || true
  exit 0
fi

if [ "$variant" = bundle ]; then
  # Which of medfast's build dependencies the root has anyway (libtorch-dev pulls them in).
  have=()
  for p in liburing-dev libdeflate-dev zlib1g-dev libxxhash-dev libyaml-cpp-dev nlohmann-json3-dev libcli11-dev \
           libgloo-dev libjpeg62-turbo-dev libopenjp2-7-dev libcharls-dev libgdcm-dev libgtest-dev libgmock-dev \
           pkgconf pybind11-dev; do
    if in_root dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then have+=("$p"); fi
  done
  say "of medfast's build dependencies the root has: ${have[*]:-none}; the rest come from .gpu/usr"
  cmake_extra=(-DMEDFAST_DEPS_PREFIX=/src/medfast/.gpu/usr)
fi

# 4. Build (deprecated torch API is an error on 2.x) and test.
# One build folder per source folder: ninja compares file times, and a checkout's files
# can be older than objects built from another clone of a newer commit.
bdir=/build/$variant-$(printf '%s' "$src" | md5sum | cut -c1-8)
say "configuring $bdir"
# File by file (no unity build): this build also proves that every source compiles on its own,
# and MEDFAST_COMPAT_TARGETS can name single object files.
in_root cmake -S /src/medfast -B "$bdir" -G Ninja -DCMAKE_BUILD_TYPE=Release -DMEDFAST_UNITY_BUILD=OFF -DMEDFAST_BUILD_TESTS=ON \
  -DCMAKE_CXX_FLAGS=-Werror=deprecated-declarations "${cmake_extra[@]}" > /dev/null
if [ -n "${MEDFAST_COMPAT_TARGETS:-}" ]; then
  # Only these targets (object files too, e.g. CMakeFiles/medfast_train.dir/src/train/detail.cpp.o):
  # a quick check that changed code compiles against this libtorch; no tests.
  say "building only: $MEDFAST_COMPAT_TARGETS"
  in_root cmake --build "$bdir" -j "$MEDFAST_COMPAT_JOBS" --target $MEDFAST_COMPAT_TARGETS
  exit 0
fi
say "building"
in_root cmake --build "$bdir" -j "$MEDFAST_COMPAT_JOBS"
say "testing"
in_root ctest --test-dir "$bdir" --output-on-failure -j "$MEDFAST_COMPAT_JOBS" "$@"
INNER
