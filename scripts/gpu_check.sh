#!/usr/bin/env bash
# The GPU campaign (issue 21), run on a lent GPU machine in three calls: `--phase build`, then
# `--phase run`, then `--phase sanitize` (or `--only STEP,...` to re-run what failed after a fix). `--dry-run --build
# build` runs here without a GPU, reusing a build folder (CI does: scripts/test.sh).
# Everything is in scripts/gpu_check.py; docs/benchmarks.md ("GPU runs") has the device calls.
set -euo pipefail
cd "$(dirname "$0")/.."
py=python3
# Here the tests' references live with Debian's python3 (another python3 may come first on
# PATH); on the GPU machine python3 is the one with the pip torch.
if [ -x /usr/bin/python3 ] && /usr/bin/python3 -c "import torch" 2>/dev/null; then py=/usr/bin/python3; fi
exec "$py" scripts/gpu_check.py "$@"
