"""Image arrays as the encoder takes them (below :mod:`alm_opacus.data`, which stores them)."""

from __future__ import annotations

import numpy as np

__all__ = ["to_float"]


def to_float(images: np.ndarray) -> np.ndarray:
    """Convert a batch of images to ``float32`` in [0, 1]."""
    if images.dtype == np.uint8:
        return images.astype(np.float32) / 255.0
    return np.asarray(images, dtype=np.float32)
