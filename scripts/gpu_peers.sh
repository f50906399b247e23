#!/usr/bin/env bash
# Copies the MONAI peer into .gpu-peers/ (ignored by git): the folder that travels, carried,
# to a lent GPU machine for the campaign's `monai` step (scripts/gpu_check.py), whose image
# has Python 3.12, numpy 2, a pip torch and no package registry.
#
#   bash scripts/gpu_peers.sh [OUT]     (default OUT: .gpu-peers in the repository root)
#
# What goes in, all pure Python, nothing compiled:
#   monai/    MONAI 1.3.2 from ../shared/peers/monai-1.3.2 (MEDFAST_MONAI_SRC), and its LICENSE,
#             with the compatibility patches below applied to this copy only (the source in
#             shared/ is never written)
#   nibabel/  nibabel's orientations module only: Debian 12's nibabel 5.0 orientations.py
#             (MEDFAST_NIBABEL_SRC), unchanged, with a generated __init__.py and deprecated.py.
#             MONAI's Orientation (and its inverse, and data.utils' reorientation) calls
#             nib.io_orientation and nib.orientations.*; that module is plain numpy. The rest of
#             nibabel 5.0 does not import on numpy 2 (np.sctypes, np.maximum_sctype,
#             numpy.compat) and is not carried: the twin reads NIfTI with
#             bench/monai_nifti_reader.py (gzip + numpy, checked against nibabel by its
#             --self-test), and any other nibabel name raises an AttributeError saying so.
#
# The patches (each one fails this script when its text is not found exactly as expected, so a
# different MONAI stops here rather than travelling half patched):
#   data/utils.py                          compute_shape_offset (Spacing's output shape):
#                                          ndarray.ptp -> np.ptp (the method is gone in numpy 2.0)
#   transforms/spatial/functional.py       rotate's output shape: ndarray.ptp -> np.ptp (same)
#   transforms/io/array.py                 switch_endianness (LoadImage, on the meta dict):
#                                          ndarray.newbyteorder -> view(dtype.newbyteorder) (gone in 2.0)
#   transforms/utils_pytorch_numpy_unification.py
#                                          in1d: np.in1d -> np.isin(...).ravel() (deprecated in 2.0)
#   metrics/fid.py                         np.float_ -> np.float64 (gone in 2.0)
#   transforms/transform.py                Randomizable.set_random_state: int(seed) % MAX_SEED (numpy 2's
#                                          NEP 50 keeps a np.uint32 seed uint32; % 2**32 overflows it)
#   utils/misc.py                          `from distutils.util import strtobool`: Python 3.12 has no
#                                          distutils unless setuptools' shim is active; a fallback
#                                          strtobool (distutils' own definition) where it is missing
# Their other needs (numpy, torch) are in the image. Whether MONAI imports and runs
# there on its numpy and torch is the step's first check. Idempotent: OUT is made again on each
# run. OUT/MANIFEST says what came from where and what was patched, and why.
set -euo pipefail
cd "$(dirname "$0")/.."
out=$(realpath -m "${1:-.gpu-peers}")
monai_src=$(realpath -m "${MEDFAST_MONAI_SRC:-../shared/peers/monai-1.3.2}")
nibabel_src=$(realpath -m "${MEDFAST_NIBABEL_SRC:-/usr/lib/python3/dist-packages/nibabel}")
python=$(command -v /usr/bin/python3 || command -v python3 || true)
limit_mib=16

say() { echo "gpu_peers: $*"; }
[ -f "$monai_src/monai/__init__.py" ] || { echo "gpu_peers: no MONAI at $monai_src (set MEDFAST_MONAI_SRC)" >&2; exit 1; }
[ -f "$nibabel_src/orientations.py" ] || { echo "gpu_peers: no nibabel at $nibabel_src (apt-get install python3-nibabel, or set MEDFAST_NIBABEL_SRC)" >&2; exit 1; }
[ -n "$python" ] || { echo "gpu_peers: no python3 here to apply the patches" >&2; exit 1; }
case "$out/" in "$monai_src"/*) echo "gpu_peers: OUT ($out) is inside the MONAI source" >&2; exit 1 ;; esac

rm -rf "$out"
mkdir -p "$out"
cp -a "$monai_src/monai" "$out/monai"
chmod -R u+w "$out/monai"
[ -f "$monai_src/LICENSE" ] && cp "$monai_src/LICENSE" "$out/LICENSE-monai"
find "$out" -depth -type d -name __pycache__ -exec rm -rf {} +

# nibabel: orientations.py as it is; __init__.py and deprecated.py written here (the real ones
# import all of nibabel, and packaging)
nibabel_version=$(sed -n "s/^__version__ = .*['\"]\([0-9][^'\"]*\)['\"].*/\1/p" "$nibabel_src/_version.py" | head -n 1)
grep -q '^from \.deprecated import deprecate_with_version$' "$nibabel_src/orientations.py" || {
  echo "gpu_peers: $nibabel_src/orientations.py does not import what the generated deprecated.py provides" >&2; exit 1; }
mkdir -p "$out/nibabel"
cp "$nibabel_src/orientations.py" "$out/nibabel/orientations.py"
for f in /usr/share/doc/python3-nibabel/copyright "$nibabel_src/../nibabel-${nibabel_version}.dist-info/LICENSE"; do
  [ -f "$f" ] && { cp "$f" "$out/LICENSE-nibabel"; break; }
done
cat > "$out/nibabel/__init__.py" <<INIT
"""nibabel ${nibabel_version:-?}: its orientations module only, carried by medfast's scripts/gpu_peers.sh.

MONAI 1.3.2's Orientation transform calls nib.io_orientation and nib.orientations.* (plain numpy);
the rest of this nibabel does not import on numpy 2 and is not here. NIfTI files are read by
medfast's bench/monai_nifti_reader.py instead; any other nibabel name raises AttributeError.
"""
from . import orientations
from .orientations import OrientationError, aff2axcodes, apply_orientation, flip_axis, io_orientation

__version__ = "${nibabel_version:-0+unknown}"
ORIENTATIONS_ONLY = True


def __getattr__(name):
    raise AttributeError(f"nibabel.{name}: this nibabel (.gpu-peers, scripts/gpu_peers.sh) carries only "
                         "nibabel.orientations, for MONAI's Orientation; read NIfTI with bench/monai_nifti_reader.py")
INIT
cat > "$out/nibabel/deprecated.py" <<'DEPRECATED'
"""nibabel.deprecated.deprecate_with_version for orientations.py, written by medfast's scripts/gpu_peers.sh
(nibabel's own imports packaging). orientations.py deprecates flip_axis until 5.0, so in nibabel 5.0
calling it raises; so it does here."""
import functools


class ExpiredDeprecationError(RuntimeError):
    pass


def deprecate_with_version(message, since="", until="", warn_class=None, error_class=None):
    def deprecator(func):
        @functools.wraps(func)
        def expired(*args, **kwargs):
            raise ExpiredDeprecationError(f"{func.__name__}: {message} (deprecated since {since}, removed in {until})")
        return expired
    return deprecator
DEPRECATED

monai_version=$(sed -n 's/.*git_refnames = " (tag: \([^,)]*\).*/\1/p' "$out/monai/_version.py" | head -n 1)
{
  echo "monai   ${monai_version:-?}  from $monai_src"
  echo "nibabel ${nibabel_version:-?}  orientations.py only, from $nibabel_src$(dpkg-query -W -f=' (Debian ${Package} ${Version})' python3-nibabel 2>/dev/null || true); __init__.py and deprecated.py generated"
} > "$out/MANIFEST"

# The patches: (file, text, replacement, occurrences, why). Exact text, exact count, or exit 1.
"$python" - "$out" <<'PATCH'
import os, sys

out = sys.argv[1]
STRTOBOOL = '''try:  # medfast scripts/gpu_peers.sh: Python 3.12 has no distutils without setuptools' shim
    from distutils.util import strtobool
except ImportError:
    def strtobool(val):
        """distutils.util.strtobool: 1 for y, yes, t, true, on, 1; 0 for n, no, f, false, off, 0."""
        val = val.lower()
        if val in ("y", "yes", "t", "true", "on", "1"):
            return 1
        if val in ("n", "no", "f", "false", "off", "0"):
            return 0
        raise ValueError(f"invalid truth value {val!r}")
'''
PATCHES = [
    ("monai/data/utils.py",
     "out_shape = np.round(corners_out.ptp(axis=1)) if scale_extent else np.round(corners_out.ptp(axis=1) + 1.0)",
     "out_shape = np.round(np.ptp(corners_out, axis=1)) if scale_extent else np.round(np.ptp(corners_out, axis=1) + 1.0)",
     1, "compute_shape_offset (Spacing): ndarray.ptp -> np.ptp; the method was removed in numpy 2.0"),
    ("monai/transforms/spatial/functional.py",
     "output_shape = np.asarray(corners.ptp(axis=1) + 0.5, dtype=int)",
     "output_shape = np.asarray(np.ptp(corners, axis=1) + 0.5, dtype=int)",
     1, "rotate's output shape: ndarray.ptp -> np.ptp; the method was removed in numpy 2.0"),
    ("monai/transforms/io/array.py",
     "data = data.byteswap().newbyteorder(new)",
     "data = data.byteswap().view(data.dtype.newbyteorder(new))",
     1, "switch_endianness (LoadImage's meta): ndarray.newbyteorder -> view(dtype.newbyteorder); removed in numpy 2.0"),
    ("monai/transforms/utils_pytorch_numpy_unification.py",
     "        return np.in1d(x, y)\n",
     "        return np.isin(x, y).ravel()\n",
     1, "in1d: np.in1d -> np.isin(...).ravel(), the same values; np.in1d is deprecated since numpy 2.0"),
    ("monai/metrics/fid.py",
     ".astype(np.float_)",
     ".astype(np.float64)",
     1, "FID: np.float_ -> np.float64; the alias was removed in numpy 2.0"),
    ("monai/transforms/transform.py",
     "            _seed = _seed % MAX_SEED\n",
     "            _seed = int(_seed) % MAX_SEED\n",
     1, "Randomizable.set_random_state: int(seed) % MAX_SEED; under numpy 2's NEP 50 an np.uint32 seed stays "
        "uint32 and the Python modulus 2**32 raises OverflowError (Compose seeds its random transforms so)"),
    ("monai/utils/misc.py",
     "from distutils.util import strtobool\n",
     STRTOBOOL,
     1, "strtobool from distutils, else distutils' definition; Python 3.12 has no distutils unless setuptools' shim is on"),
]
lines = []
for path, old, new, count, why in PATCHES:
    full = os.path.join(out, path)
    with open(full) as f:
        text = f.read()
    found = text.count(old)
    if found != count:
        sys.exit(f"gpu_peers: patch anchor in {path} found {found} times, expected {count}: {old.strip()[:90]!r}")
    with open(full, "w") as f:
        f.write(text.replace(old, new))
    lines.append(f"patched {path}: {why}")
# numpy 2 removals that no patch covers must not be left behind in the copy (ndarray.newbyteorder
# cannot be told from dtype.newbyteorder here: the patch's count above covers it)
import re
removed = re.compile(r"(?<!np)\.ptp\(|np\.(float_|complex_|in1d|bool8|int0|uint0|product|cumproduct|"
                     r"alltrue|sometrue|row_stack|NaN|NAN|Inf|Infinity|PINF|NINF|infty|string_|unicode_|sctypes|"
                     r"maximum_sctype|find_common_type|round_|asfarray|msort|cast)\b")
left = []
for root, _, files in os.walk(os.path.join(out, "monai")):
    for name in files:
        if name.endswith(".py"):
            p = os.path.join(root, name)
            for i, line in enumerate(open(p, encoding="utf-8"), 1):
                code = line.split("#", 1)[0]
                if removed.search(code) and '"""' not in line:
                    left.append(f"{os.path.relpath(p, out)}:{i}: {line.strip()}")
if left:
    sys.exit("gpu_peers: numpy-2 removals left unpatched:\n  " + "\n  ".join(left))
with open(os.path.join(out, "MANIFEST"), "a") as f:
    f.write("".join(line + "\n" for line in lines))
PATCH

kib=$(( $(du -sb "$out" | cut -f1) / 1024 ))
say "$out: $(find "$out" -type f | wc -l) files, $(( kib / 1024 )).$(( kib % 1024 * 10 / 1024 )) MiB (limit ${limit_mib} MiB)"
sed 's/^/gpu_peers:   /' "$out/MANIFEST"
if [ "$kib" -ge $(( limit_mib * 1024 )) ]; then
  echo "gpu_peers: the folder is over its ${limit_mib} MiB limit" >&2
  exit 1
fi
