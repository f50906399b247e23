"""Tensors to and from files through medfast's engine (see ``medfast._medfast.io``).

I/O options are keyword arguments of every call here, one per ``io_*`` setting
(``backend``, ``block_size``, ``queue_depth``, ``threads``, ``direct``, ``cache_first``,
``alignment``: ``options()`` lists them with their current values); the settings otherwise.
"""
from ._medfast.io import FileHandle, Future, load, load_tensor, options, save, save_tensor

__all__ = ["FileHandle", "Future", "load", "save", "save_tensor", "load_tensor", "options"]
