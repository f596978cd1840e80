"""Datasets (a registry of loaders and their specs) and the four-part member/non-member split.

Each dataset module registers its ``DatasetSpec`` (loader, default split, SimCLR recipe,
DP-SGD schedule, epsilon grid) on import. ``features:PATH`` (:mod:`.features`) reads the
features of a user's own encoder from a file. A package adds a dataset through the
``alm_opacus.datasets`` entry point group (docs/datasets.md).
"""

from __future__ import annotations

from alm_opacus.data import cifar as _cifar  # noqa: F401  (registers "cifar10", "cifar100")
from alm_opacus.data import digits as _digits  # noqa: F401  (registers "digits")
from alm_opacus.data import features as _features  # noqa: F401  (the features:PATH family)
from alm_opacus.data import mnist as _mnist  # noqa: F401  (registers "mnist")
from alm_opacus.data import stl10 as _stl10  # noqa: F401  (registers "stl10")
from alm_opacus.data.registry import (
    DataError,
    Dataset,
    available_datasets,
    dataset_families,
    load_dataset,
    register_dataset,
    register_dataset_family,
)
from alm_opacus.data.spec import (
    DEFAULT_EPSILON_GRID,
    DatasetSpec,
    DPSGDSchedule,
    available_dataset_specs,
    dataset_spec,
    format_split_sizes,
    parse_split_sizes,
    register_dataset_spec,
)
from alm_opacus.data.split import SplitSizes
from alm_opacus.ssl.images import to_float  # the stored images as the encoder takes them

__all__ = [
    "DEFAULT_EPSILON_GRID",
    "DPSGDSchedule",
    "DataError",
    "Dataset",
    "DatasetSpec",
    "SplitSizes",
    "available_dataset_specs",
    "available_datasets",
    "dataset_families",
    "dataset_spec",
    "format_split_sizes",
    "load_dataset",
    "parse_split_sizes",
    "register_dataset",
    "register_dataset_family",
    "register_dataset_spec",
    "to_float",
]
