"""Datasets (a registry of loaders) and the four-part member/non-member split."""

from __future__ import annotations

from alm_opacus.data import cifar as _cifar  # noqa: F401  (registers "cifar10", "cifar100")
from alm_opacus.data import digits as _digits  # noqa: F401  (registers "digits")
from alm_opacus.data import stl10 as _stl10  # noqa: F401  (registers "stl10")
from alm_opacus.data.registry import (
    DataError,
    Dataset,
    available_datasets,
    load_dataset,
    register_dataset,
    to_float,
)

__all__ = [
    "DataError",
    "Dataset",
    "available_datasets",
    "load_dataset",
    "register_dataset",
    "to_float",
]
