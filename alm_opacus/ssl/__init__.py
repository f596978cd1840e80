"""SimCLR pre-training on public data: loss, encoders, augmentations, cached features."""

from __future__ import annotations

from alm_opacus.ssl.augment import create_augmentation
from alm_opacus.ssl.encoders import available_encoders, create_encoder, register_encoder
from alm_opacus.ssl.losses import nt_xent
from alm_opacus.ssl.pretrain import DEFAULT_SSL, SSLConfig, extract_features, pretrain

__all__ = [
    "DEFAULT_SSL",
    "SSLConfig",
    "available_encoders",
    "create_augmentation",
    "create_encoder",
    "extract_features",
    "nt_xent",
    "pretrain",
    "register_encoder",
]
