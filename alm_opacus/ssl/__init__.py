"""SimCLR pre-training on public data: loss, encoders, augmentations, cached features.

Each dataset's recipe (``SSLConfig``) lives in its ``DatasetSpec``
(``alm_opacus.data.dataset_spec(name).ssl``).
"""

from __future__ import annotations

from alm_opacus.ssl.augment import (
    available_augmentations,
    create_augmentation,
    register_augmentation,
)
from alm_opacus.ssl.config import SSLConfig
from alm_opacus.ssl.encoders import available_encoders, create_encoder, register_encoder
from alm_opacus.ssl.losses import nt_xent
from alm_opacus.ssl.pretrain import extract_features, pretrain

__all__ = [
    "SSLConfig",
    "available_augmentations",
    "available_encoders",
    "create_augmentation",
    "create_encoder",
    "extract_features",
    "nt_xent",
    "pretrain",
    "register_augmentation",
    "register_encoder",
]
