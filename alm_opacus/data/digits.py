"""scikit-learn's 8x8 handwritten digits: real data shipped in the wheel, the offline default."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from alm_opacus.data.registry import Dataset, register_dataset


@register_dataset("digits")
def load_digits(*, root: Path | None = None) -> Dataset:
    """Load the 1,797 UCI digits (pixel values 0..16) as float32 images in [0, 1]."""
    from sklearn.datasets import load_digits as sk_load_digits

    del root  # embedded: nothing to read from disk
    bunch = sk_load_digits()
    images = (bunch.images.astype(np.float32) / 16.0)[:, None, :, :]
    return Dataset(
        name="digits",
        images=images,
        labels=bunch.target.astype(np.int64),
        num_classes=10,
        meta={"source": "sklearn.datasets.load_digits (UCI optical digits, test part)"},
    )
