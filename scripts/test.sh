#!/usr/bin/env bash
# Sets up, builds and runs medfast's tests: the README's test command, and what CI runs.
#   1. installs the Debian packages (scripts/setup.sh --test, idempotent)
#   2. builds medfast, its tests and its Python module (build/), installs the module for
#      /usr/bin/python3 (scripts/setup.sh --python: pip installs what was built in build/),
#      and builds the fuzz target with clang (build-fuzz/)
#   3. runs a short libFuzzer smoke run, then the test suite with ctest, then the GPU
#      campaign's dry run (scripts/gpu_check.sh --dry-run: what needs a GPU is skipped)
#   4. the sanitizer job: ASan+UBSan builds (build-asan/) of the torch-free library
#      and of the NIfTI, tensor I/O and cache-entry tests, and runs them
#   5. the thread sanitizer job: a TSan build (build-tsan/) of the torch-free library and
#      its tests, and runs them
# MEDFAST_FUZZ_SECONDS (default 60) sets the length of the fuzz run.
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/setup.sh --test

jobs=$(nproc)
# Every optional dependency ON: a missing one fails here rather than turning its tests into skips.
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DMEDFAST_BUILD_TESTS=ON \
  -DMEDFAST_WITH_DICOM_CODECS=ON -DMEDFAST_WITH_GDCM=ON -DMEDFAST_WITH_IO_URING=ON
cmake --build build -j "$jobs"
# `import medfast` for /usr/bin/python3 (README): pip installs the module just built (no compile).
# (The Python tests import the build tree's copy: ctest sets PYTHONPATH.)
bash scripts/setup.sh --python

# The fuzz build also proves that the optional dependencies it does not fuzz can be
# switched off (MEDFAST_WITH_GDCM, MEDFAST_WITH_IO_URING: their off paths compile).
cmake -S . -B build-fuzz -G Ninja -DMEDFAST_FUZZ_ONLY=ON \
  -DMEDFAST_WITH_GDCM=OFF -DMEDFAST_WITH_IO_URING=OFF -DMEDFAST_WITH_DICOM_CODECS=ON \
  -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_C_COMPILER=clang \
  -DFUZZ_SECONDS="${MEDFAST_FUZZ_SECONDS:-60}"
cmake --build build-fuzz -j "$jobs"

echo "== fuzz smoke run (${MEDFAST_FUZZ_SECONDS:-60} s)"
ctest --test-dir build-fuzz --output-on-failure

echo "== test suite"
ctest --test-dir build --output-on-failure -j "$jobs"

# The GPU campaign's script (issue 21) without a GPU: the build folder reused, the steps
# that need a GPU marked skipped; its table is printed.
echo "== GPU campaign, dry run"
bash scripts/gpu_check.sh --dry-run --build build --out build/gpu_check_dry

# The sanitizer job: ASan+UBSan builds of the torch-free library and its tests
# (leak checking on), and of the NIfTI, tensor file engine and cache-entry tests.
echo "== sanitizer job (ASan + UBSan, build-asan)"
cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DMEDFAST_SANITIZE=ON -DMEDFAST_BUILD_TESTS=ON
cmake --build build-asan -j "$jobs" --target medfast_base_tests medfast_sanitize_tests
ctest --test-dir build-asan --output-on-failure -j "$jobs"

# The ThreadSanitizer job: a TSan build of the torch-free library and its tests (thread
# pool, the file engine's backends and async calls, atomic cache writes, the buffer pool,
# the DICOM reader's parallel slice reads); a reported race fails the run.
echo "== thread sanitizer job (TSan, build-tsan)"
cmake -S . -B build-tsan -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DMEDFAST_TSAN=ON -DMEDFAST_BUILD_TESTS=ON
cmake --build build-tsan -j "$jobs" --target medfast_base_tests
ctest --test-dir build-tsan --output-on-failure -j "$jobs"
