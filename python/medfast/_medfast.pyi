"""Type hints for medfast's extension module (docstrings: the Python modules that re-export it)."""
from typing import Any, Callable, Dict, List, Optional, Tuple, Union
import os

import torch

__version__: str
libtorch_version: str

Config = Union[Dict[str, Any], str, os.PathLike]

class settings:
    @staticmethod
    def get(name: str) -> str:
        """The resolved value of a setting, as text."""
    @staticmethod
    def set(name: str, value: Any) -> None:
        """Sets a setting for this process (ValueError naming the setting for a bad value)."""
    @staticmethod
    def show() -> Dict[str, Tuple[str, str]]:
        """Every setting: (value, where it came from: default, env or flag)."""

class io:
    class Future:
        def wait(self) -> int:
            """Waits for the transfer (the GIL released, Ctrl-C honoured); the bytes moved."""
        def done(self) -> bool: ...

    class FileHandle:
        def __init__(self, path: str, mode: str = "r", **io_options: Any) -> None:
            """A file opened through the engine; mode r, w (truncates) or r+."""
        def pread(self, tensor: torch.Tensor, offset: int = 0) -> int:
            """Reads tensor.nbytes bytes at offset into a contiguous CPU or CUDA tensor; the bytes read."""
        def pwrite(self, tensor: torch.Tensor, offset: int = 0) -> None:
            """Writes a contiguous CPU or CUDA tensor's bytes at offset."""
        def async_pread(self, tensor: torch.Tensor, offset: int = 0) -> "io.Future": ...
        def async_pwrite(self, tensor: torch.Tensor, offset: int = 0) -> "io.Future": ...
        def sync(self) -> None: ...
        @property
        def size(self) -> int: ...
        @property
        def backend(self) -> str: ...

    @staticmethod
    def options() -> Dict[str, Any]:
        """The I/O keyword arguments (backend, block_size, ...) with their values from the io_* settings."""
    @staticmethod
    def load(path: str, out: Optional[torch.Tensor] = None, device: str = "cpu", **io_options: Any) -> torch.Tensor:
        """The file's bytes: into `out` (a preallocated contiguous tensor), or a new uint8 tensor on `device`."""
    @staticmethod
    def save(tensor: torch.Tensor, path: str, durable: bool = True, **io_options: Any) -> None:
        """The tensor's raw bytes, written to a temporary name and renamed (fsynced when durable)."""
    @staticmethod
    def save_tensor(tensor: torch.Tensor, path: str, durable: bool = True, **io_options: Any) -> None:
        """The tensor with its dtype and shape (an MFTENSOR file: 4 KiB-aligned payload, XXH3 checksum)."""
    @staticmethod
    def load_tensor(path: str, device: str = "cpu", verify: bool = True, **io_options: Any) -> torch.Tensor:
        """A tensor saved by save_tensor (or `medfast bench loader --save-batches`), checksum checked."""

class nifti:
    @staticmethod
    def load(path: str) -> Tuple[torch.Tensor, torch.Tensor, Dict[str, Any]]:
        """(voxels as nibabel's np.asanyarray(img.dataobj), the 4x4 float64 affine, header fields)."""
    @staticmethod
    def save(path: str, tensor: torch.Tensor, affine: torch.Tensor) -> None:
        """Writes .nii or .nii.gz (by the name), atomically."""

class data:
    class Pipeline:
        def __init__(self, config: Config) -> None:
            """A run config's data section (a dict, or a YAML/JSON file's path)."""
        @property
        def items(self) -> int: ...
        @property
        def validation_items(self) -> int: ...
    class CachedDataset:
        def __init__(self, pipeline: "data.Pipeline", validation: bool = False, fill: bool = True) -> None: ...
        def fill(self) -> Dict[str, Any]: ...
        def __len__(self) -> int: ...
        def __getitem__(self, index: int) -> Dict[str, torch.Tensor]: ...
    class Loader:
        def __init__(self, dataset: "data.CachedDataset", **options: Any) -> None: ...
        def set_epoch(self, epoch: int) -> None: ...
        @property
        def epoch(self) -> int: ...
        def start(self) -> None: ...
        def next(self) -> Optional[Dict[str, Any]]: ...
        def stop(self) -> None: ...
        def __len__(self) -> int: ...

class train:
    @staticmethod
    def default_config() -> Dict[str, Any]:
        """The built-in default run config (what `medfast train` runs without --config)."""
    @staticmethod
    def run(config: Config, resume: bool = False, overwrite: bool = False,
            on_epoch: Optional[Callable[[Dict[str, Any]], None]] = None) -> Dict[str, Any]:
        """Trains (the GIL released, Ctrl-C honoured between steps); the run's result: history,
        best Dice and epoch, time to the target Dice, run_dir."""
    @staticmethod
    def check_backends(device: str = "cpu", dtype: str = "float32") -> Dict[str, Any]:
        """The backend self-check run() does before its first forward, once per process, device
        and dtype: conv3d, matmul and attention against float64. A faulty oneDNN (CPU) or cuDNN
        is switched off for the process; RuntimeError when the math stays wrong."""
