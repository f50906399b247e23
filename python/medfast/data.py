"""A run config's data pipeline from Python.

``CachedDataset`` is a ``torch.utils.data.Dataset`` over the deterministic chain's
cached outputs: ``len`` and ``dataset[i]`` (a dict of tensors: each volume, its
``<key>_affine`` and the cached arrays such as foreground indices), usable with any
PyTorch ``DataLoader`` (``num_workers=0``, or forked workers). ``Loader`` is
medfast's threaded loader over it: the config's random chain, batched and
prefetched (``set_epoch`` reseeds the order and augmentation, as the CLI's).
"""
from typing import Any, Dict, Iterator, Optional, Union
import os

import torch.utils.data

from ._medfast import data as _data

Pipeline = _data.Pipeline

Config = Union[Dict[str, Any], str, os.PathLike]


def _pipeline(config: Union[Config, "Pipeline"]) -> "Pipeline":
    return config if isinstance(config, _data.Pipeline) else _data.Pipeline(config)


class CachedDataset(torch.utils.data.Dataset):
    """The deterministic chain of ``config``'s data section, computed once per item and cached
    (data.cache: memory, disk, ...). ``validation=True`` gives the validation items."""

    def __init__(self, config: Union[Config, "Pipeline"], validation: bool = False, fill: bool = True):
        self._native = _data.CachedDataset(_pipeline(config), validation, fill)

    def fill(self) -> Dict[str, Any]:
        """Computes what is not cached yet; returns items, computed, reused, bytes, seconds."""
        return self._native.fill()

    def __len__(self) -> int:
        return len(self._native)

    def __getitem__(self, index: int) -> Dict[str, torch.Tensor]:
        return self._native[index]

    def __reduce__(self):
        raise TypeError("medfast.data.CachedDataset holds native state: use DataLoader workers that fork "
                        "(the default on Linux), not spawn")


class Loader:
    """medfast's threaded loader over a ``CachedDataset``: iterating yields batches (dicts of
    stacked tensors, with ``items``: the dataset indices). Options (``batch_size``,
    ``threads``, ``prefetch``, ``shuffle``, ``drop_last``, ``repeats``, ``device``,
    ``pin_memory``) override the config's data.loader."""

    def __init__(self, dataset: CachedDataset, **options: Any):
        self._native = _data.Loader(dataset._native, **options)
        self._dataset = dataset

    def set_epoch(self, epoch: int) -> None:
        """The epoch the next iteration runs: its order and augmentation seeds."""
        self._native.set_epoch(epoch)

    def __len__(self) -> int:
        return len(self._native)

    def __iter__(self) -> Iterator[Dict[str, Any]]:
        self._native.start()
        try:
            while True:
                batch: Optional[Dict[str, Any]] = self._native.next()
                if batch is None:
                    return
                yield batch
        finally:
            self._native.stop()


__all__ = ["Pipeline", "CachedDataset", "Loader"]
