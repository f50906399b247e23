"""Tensors to and from files through medfast's engine (see ``medfast._medfast.io``).

I/O options (``backend``, ``block_size``, ``queue_depth``, ``threads``, ``direct``,
``alignment``) are keyword arguments; the ``io_*`` settings otherwise.
"""
from ._medfast.io import FileHandle, Future, load, load_tensor, save, save_tensor

__all__ = ["FileHandle", "Future", "load", "save", "save_tensor", "load_tensor"]
