"""Dataset registry: ``register_dataset`` / ``load_dataset`` / ``available_datasets``.

Besides single datasets, a *family* answers a whole prefix: ``features:PATH`` is the
``features`` family (:mod:`alm_opacus.data.features`), which registers ``features:PATH`` when it
is first asked for. Packages add datasets through the ``alm_opacus.datasets`` entry point group
(:data:`PLUGIN_GROUP`), loaded on first use.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from alm_opacus.registry import Registry, load_entry_points


class DataError(ValueError):
    """A dataset is missing, corrupt or unknown. The message says what was expected."""


@dataclass(frozen=True)
class Dataset:
    """A labelled pool of images (or of features a user's own encoder made), plus an optional
    unlabeled set reserved for pre-training.

    Attributes:
        name: registry name.
        images: ``(N, C, H, W)`` array, ``uint8`` in [0, 255] or ``float32`` in [0, 1].
            May be a read-only ``np.memmap``. ``None`` for a dataset of features.
        labels: ``(N,)`` ``int64`` class indices in ``[0, num_classes)``.
        num_classes: number of classes.
        unlabeled: optional ``(M, C, H, W)`` array for public pre-training only
            (STL-10's unlabeled split). When set, pre-training uses it instead of a
            labelled public part.
        meta: free-form provenance (files read, original split sizes).
        features: ``(N, d)`` float features with unit-norm rows, given instead of images
            (``features:PATH``): the run skips pre-training. May be a ``np.memmap``.
        roles: ``(N,)`` ``int8`` index into :data:`alm_opacus.data.split.ROLES` per row, when
            the data fixes its own split; ``None``: the split is drawn.
    """

    name: str
    images: np.ndarray | None
    labels: np.ndarray
    num_classes: int
    unlabeled: np.ndarray | None = None
    meta: dict[str, object] = field(default_factory=dict)
    features: np.ndarray | None = None
    roles: np.ndarray | None = None

    @property
    def image_shape(self) -> tuple[int, int, int]:
        if self.images is None:
            raise DataError(f"{self.name}: holds features, not images")
        c, h, w = self.images.shape[1:]
        return int(c), int(h), int(w)

    def __post_init__(self) -> None:
        if (self.images is None) == (self.features is None):
            raise DataError(f"{self.name}: expected images or features, exactly one of them")
        rows = self.images if self.images is not None else self.features
        assert rows is not None
        if self.images is not None and self.images.ndim != 4:
            raise DataError(f"{self.name}: images must be (N, C, H, W), got {self.images.shape}")
        if self.features is not None and self.features.ndim != 2:
            raise DataError(f"{self.name}: features must be (N, d), got {self.features.shape}")
        if len(rows) != len(self.labels):
            raise DataError(f"{self.name}: {len(rows)} rows but {len(self.labels)} labels")
        if self.roles is not None and self.roles.shape != self.labels.shape:
            raise DataError(f"{self.name}: {len(self.roles)} roles but {len(self.labels)} labels")
        if len(self.labels) and (self.labels.min() < 0 or self.labels.max() >= self.num_classes):
            raise DataError(
                f"{self.name}: labels outside [0, {self.num_classes}): "
                f"min={self.labels.min()}, max={self.labels.max()}"
            )


DatasetLoader = Callable[..., Dataset]
#: ``resolve(name)`` registers the dataset ``name`` (``prefix:argument``) of a family, or
#: raises a DataError naming what is wrong with the argument.
FamilyResolver = Callable[[str], None]
DATASETS: Registry[DatasetLoader] = Registry("dataset")
FAMILIES: Registry[FamilyResolver] = Registry("dataset family")
#: Entry point group of dataset plugins: each names a module that registers its datasets
#: (``register_dataset_spec``) when imported.
PLUGIN_GROUP = "alm_opacus.datasets"


def register_dataset(name: str, *, force: bool = False) -> Callable[[DatasetLoader], DatasetLoader]:
    """Decorator registering ``loader(*, root: Path | None) -> Dataset`` under ``name``.

    Raises:
        ValueError: if ``name`` is taken and ``force`` is false.
    """

    return DATASETS.register(name, force=force)


def register_dataset_family(
    prefix: str, *, force: bool = False
) -> Callable[[FamilyResolver], FamilyResolver]:
    """Decorator registering ``resolve(name)`` for every dataset name ``prefix:ARGUMENT``.

    Raises:
        ValueError: if ``prefix`` is taken (and ``force`` is false) or contains ``:``.
    """
    if not prefix or ":" in prefix:
        raise ValueError(f"prefix={prefix!r} is invalid: expected a non-empty name without ':'")

    return FAMILIES.register(prefix, force=force)


def dataset_families() -> list[str]:
    """Sorted prefixes of the registered families (``features`` for ``features:PATH``)."""
    return FAMILIES.names()


def resolve_dataset(name: str) -> None:
    """Make ``name`` known if it can be: load the dataset plugins, and let a family register a
    ``prefix:argument`` name (again on every call: the file behind it may have changed).

    Raises:
        DataError: from the family, naming what is wrong with the argument.
    """
    prefix, sep, _ = str(name).partition(":")
    if sep and prefix in FAMILIES:
        FAMILIES[prefix](name)
    elif name not in DATASETS:
        load_dataset_plugins()


def load_dataset_plugins() -> list[str]:
    """Import the modules of the :data:`PLUGIN_GROUP` entry points (once per process); each
    registers its datasets on import.

    Returns:
        The entry points loaded by this call (empty after the first call).

    Raises:
        DataError: naming an entry point that fails to import or is not a module.
    """
    return load_entry_points(
        PLUGIN_GROUP,
        what="dataset",
        error=DataError,
        expected="a module that registers its datasets on import",
    )


def available_datasets() -> list[str]:
    """Sorted names of the registered datasets (plugins included); a family's members
    (``features:PATH`` once resolved) are not listed: the family is (:func:`dataset_families`)."""
    load_dataset_plugins()
    return [n for n in DATASETS.names() if not is_family_member(n)]


def is_family_member(name: str) -> bool:
    """Whether ``name`` is ``prefix:argument`` of a registered family."""
    prefix, sep, _ = str(name).partition(":")
    return bool(sep) and prefix in FAMILIES


def load_dataset(name: str, *, root: str | Path | None = None) -> Dataset:
    """Load the dataset ``name``, reading files under ``root`` where it needs any.

    Raises:
        DataError: for an unknown name, or missing or corrupt files.
    """
    resolve_dataset(name)
    if name not in DATASETS:
        families = "".join(f", or {p}:..." for p in dataset_families())
        known = ", ".join(available_datasets())
        raise DataError(f"unknown dataset {name!r}: expected one of {known}{families}")
    return DATASETS[name](root=None if root is None else Path(root))
