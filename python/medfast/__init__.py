"""medfast: fast 3D medical-image segmentation training, from Python.

The same engine as the ``medfast`` command, for PyTorch and MONAI users:

- ``medfast.io``: tensors to and from files through medfast's I/O engine
  (posix, O_DIRECT, io_uring, cuFile), raw (``load``/``save``, ``FileHandle``)
  or with dtype and shape (``save_tensor``/``load_tensor``).
- ``medfast.nifti``: NIfTI-1/2 files, as nibabel reads and writes them.
- ``medfast.data``: a run config's cached deterministic pipeline as a
  ``torch.utils.data.Dataset`` (``CachedDataset``) and medfast's threaded
  loader (``Loader``).
- ``medfast.train.run``: a whole training run from a run config.
- ``medfast.settings``: medfast's settings (threads, I/O, ...).

Importing medfast changes no torch setting (thread counts included).
"""
import torch as _torch  # torch's Python types must be registered before the extension loads

from . import _medfast
from ._medfast import __version__, libtorch_version

_built = ".".join(libtorch_version.split(".")[:2])
_running = ".".join(_torch.__version__.split("+")[0].split(".")[:2])
if _built != _running:
    raise ImportError(
        f"medfast was built against libtorch {libtorch_version} but this Python runs torch {_torch.__version__}; "
        "rebuild medfast against this torch (see docs/python.md)")

from . import data, io, nifti, settings, train  # noqa: E402

__all__ = ["data", "io", "nifti", "settings", "train", "__version__", "libtorch_version"]
