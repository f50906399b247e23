#!/usr/bin/env bash
# Used by scripts/compat.sh inside the trixie CUDA root only: builds a stand-in
# libcudnn.so.9 in DIR that exports every cuDNN function the installed libtorch
# imports. Debian's nvidia-cudnn package downloads cuDNN from NVIDIA, which that
# root cannot reach; without libcudnn.so.9 nothing that links libtorch_cuda links
# or loads. Each stand-in prints which function was called and returns
# CUDNN_STATUS_NOT_INITIALIZED (cudnnGetVersion returns 0): cuDNN is only ever
# called for convolutions on a GPU, and the root has no GPU driver.
set -euo pipefail
dir=${1:?usage: compat_cudnn_stub.sh DIR}
mkdir -p "$dir"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# Imported names, with their symbol version (cudnnCreate@libcudnn.so.9): the
# stand-in must define the same version nodes or the linker will not bind them.
imports=$(for lib in /usr/lib/x86_64-linux-gnu/libtorch*.so.* /usr/lib/x86_64-linux-gnu/libc10*.so.* \
                     /usr/lib/x86_64-linux-gnu/libcaffe2*.so.*; do
            [ -f "$lib" ] && nm -D --undefined-only "$lib" 2>/dev/null
          done | awk '{print $NF}' | grep -E '^cudnn' | sort -u)
syms=$(echo "$imports" | sed 's/@.*//' | grep . | sort -u || true)
versions=$(echo "$imports" | grep '@' | sed 's/.*@//' | sort -u || true)
if [ -z "$syms" ]; then
  echo "compat_cudnn_stub: libtorch imports no cudnn* symbols; nothing to stand in for" >&2
fi

{
  echo '#include <stdio.h>'
  echo '#include <stddef.h>'
  echo 'static int stub_called(const char* name) {'
  echo '  fprintf(stderr, "libcudnn.so.9 here is a stand-in made by medfast scripts/compat.sh (cuDNN cannot be installed in this root); %s was called\n", name);'
  echo '  return 1; /* CUDNN_STATUS_NOT_INITIALIZED */'
  echo '}'
  for s in $syms; do
    case "$s" in
      cudnnGetVersion|cudnnGetCudartVersion|cudnnGetMaxDeviceVersion)
        echo "size_t $s(void) { stub_called(\"$s\"); return 0; }" ;;
      cudnnGetErrorString)
        echo "const char* $s(int s) { (void)s; return \"cuDNN is a stand-in in this root (medfast scripts/compat.sh)\"; }" ;;
      *)
        echo "int $s(void) { return stub_called(\"$s\"); }" ;;
    esac
  done
} > "$work/cudnn_stub.c"

{
  if [ -z "$versions" ]; then
    echo '{ global: cudnn*; local: *; };'
  else
    for v in $versions; do echo "$v { global: cudnn*; local: *; };"; done
  fi
} > "$work/cudnn_stub.map"

gcc -shared -fPIC -O1 -Wl,-soname,libcudnn.so.9 -Wl,--version-script="$work/cudnn_stub.map" \
  -o "$dir/libcudnn.so.9" "$work/cudnn_stub.c"
ln -sf libcudnn.so.9 "$dir/libcudnn.so"
echo "compat_cudnn_stub: $dir/libcudnn.so.9 with $(echo "$syms" | grep -c . || true) functions"
