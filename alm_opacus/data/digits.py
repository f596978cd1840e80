"""scikit-learn's 8x8 handwritten digits: real data shipped in the wheel, the offline default."""

from __future__ import annotations

import gzip
import importlib.util
from pathlib import Path

import numpy as np

from alm_opacus.data.registry import Dataset
from alm_opacus.data.spec import (
    DatasetSpec,
    DPSGDSchedule,
    register_dataset_spec,
)
from alm_opacus.data.split import DIGITS_SPLIT
from alm_opacus.heads import HeadConfig
from alm_opacus.ssl.config import SSLConfig


def _digits_arrays() -> tuple[np.ndarray, np.ndarray]:
    """scikit-learn's digits as (pixels 0..16 of shape (1797, 8, 8), labels).

    Read from the file scikit-learn ships (``sklearn/datasets/data/digits.csv.gz``: 64 pixel
    columns, then the label) without importing ``sklearn.datasets``, whose import (pandas,
    scipy) costs about half a second of every run's start; `sklearn.datasets.load_digits`
    reads the same file the same way, and is the fallback should the file move.
    """
    spec = importlib.util.find_spec("sklearn")  # locates the package without importing it
    origin = None if spec is None else spec.origin
    path = None if origin is None else Path(origin).parent / "datasets" / "data" / "digits.csv.gz"
    if path is None or not path.is_file():
        from sklearn.datasets import load_digits as sk_load_digits

        bunch = sk_load_digits()
        return bunch.images, bunch.target
    with gzip.open(path, "rt") as f:
        table = np.loadtxt(f, delimiter=",")
    return table[:, :-1].reshape(-1, 8, 8), table[:, -1].astype(int)


def load_digits(*, root: Path | None = None) -> Dataset:
    """Load the 1,797 UCI digits (pixel values 0..16) as float32 images in [0, 1]."""
    del root  # embedded: nothing to read from disk
    pixels, labels = _digits_arrays()
    images = (pixels.astype(np.float32) / 16.0)[:, None, :, :]
    return Dataset(
        name="digits",
        images=images,
        labels=labels.astype(np.int64),
        num_classes=10,
        meta={"source": "sklearn.datasets.load_digits (UCI optical digits, test part)"},
    )


register_dataset_spec(
    DatasetSpec(
        name="digits",
        loader=load_digits,
        split=DIGITS_SPLIT,
        ssl=SSLConfig(encoder="small-cnn", augmentation="digits"),
        # Few steps keep DP-SGD's noise multiplier low at small n: 60 steps at q = 1/2.
        dpsgd=DPSGDSchedule(epochs=30, batch_size=75),
        # From strong privacy to where post-training noise stops costing utility (ALM's utility
        # loss falls below 0.1 near epsilon 180 on the default recipe: docs/recipes.md).
        epsilons=(0.1, 1.0, 10.0, 100.0, 1000.0, 10000.0),
        needs_root=False,
        # Chosen by measurement (the recipes:digits block of docs/recipes.md, which holds the
        # numbers): converged, a sampled L1 sensitivity about 5x smaller than l2 = 0's, and
        # still vulnerable to the attacks (best AUC about 0.7).
        head=HeadConfig(l2=1e-4, solver="newton"),
        description="scikit-learn's 1,797 8x8 handwritten digits (embedded)",
    )
)
