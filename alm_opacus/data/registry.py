"""Dataset registry: ``register_dataset`` / ``load_dataset`` / ``available_datasets``."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np


class DataError(ValueError):
    """A dataset is missing, corrupt or unknown. The message says what was expected."""


@dataclass(frozen=True)
class Dataset:
    """A labelled image pool, plus an optional unlabeled set reserved for pre-training.

    Attributes:
        name: registry name.
        images: ``(N, C, H, W)`` array, ``uint8`` in [0, 255] or ``float32`` in [0, 1].
            May be a read-only ``np.memmap``.
        labels: ``(N,)`` ``int64`` class indices in ``[0, num_classes)``.
        num_classes: number of classes.
        unlabeled: optional ``(M, C, H, W)`` array for public pre-training only
            (STL-10's unlabeled split). When set, pre-training uses it instead of a
            labelled public part.
        meta: free-form provenance (files read, original split sizes).
    """

    name: str
    images: np.ndarray
    labels: np.ndarray
    num_classes: int
    unlabeled: np.ndarray | None = None
    meta: dict[str, object] = field(default_factory=dict)

    @property
    def image_shape(self) -> tuple[int, int, int]:
        c, h, w = self.images.shape[1:]
        return int(c), int(h), int(w)

    def __post_init__(self) -> None:
        if self.images.ndim != 4:
            raise DataError(f"{self.name}: images must be (N, C, H, W), got {self.images.shape}")
        if len(self.images) != len(self.labels):
            raise DataError(f"{self.name}: {len(self.images)} images but {len(self.labels)} labels")
        if len(self.labels) and (self.labels.min() < 0 or self.labels.max() >= self.num_classes):
            raise DataError(
                f"{self.name}: labels outside [0, {self.num_classes}): "
                f"min={self.labels.min()}, max={self.labels.max()}"
            )


DatasetLoader = Callable[..., Dataset]
_DATASETS: dict[str, DatasetLoader] = {}


def register_dataset(name: str, *, force: bool = False) -> Callable[[DatasetLoader], DatasetLoader]:
    """Decorator registering ``loader(*, root: Path | None) -> Dataset`` under ``name``.

    Raises:
        ValueError: if ``name`` is taken and ``force`` is false.
    """

    def decorator(loader: DatasetLoader) -> DatasetLoader:
        if name in _DATASETS and not force:
            raise ValueError(f"dataset {name!r} is already registered; pass force=True")
        _DATASETS[name] = loader
        return loader

    return decorator


def available_datasets() -> list[str]:
    """Sorted names of the registered datasets."""
    return sorted(_DATASETS)


def load_dataset(name: str, *, root: str | Path | None = None) -> Dataset:
    """Load the dataset ``name``, reading files under ``root`` where it needs any.

    Raises:
        DataError: for an unknown name, or missing or corrupt files.
    """
    if name not in _DATASETS:
        raise DataError(
            f"unknown dataset {name!r}: expected one of {', '.join(available_datasets())}"
        )
    return _DATASETS[name](root=None if root is None else Path(root))


def to_float(images: np.ndarray) -> np.ndarray:
    """Convert a batch of images to ``float32`` in [0, 1]."""
    if images.dtype == np.uint8:
        return images.astype(np.float32) / 255.0
    return np.asarray(images, dtype=np.float32)
