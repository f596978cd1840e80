"""STL-10 read from its official binary folder, without torchvision.

The archive http://ai.stanford.edu/~acoates/stl10/stl10_binary.tar.gz extracts to
``<root>/stl10_binary/`` with ``train_X.bin`` / ``train_y.bin`` (5,000 images),
``test_X.bin`` / ``test_y.bin`` (8,000) and ``unlabeled_X.bin`` (100,000, 2.7 GB).

Each ``*_X.bin`` is raw ``uint8``: per image, 3 planes of 96x96 stored column-major (the
MATLAB layout), so a C-order ``(N, 3, 96, 96)`` read has rows and columns swapped. Each
``*_y.bin`` holds one ``uint8`` label per image, 1..10.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from alm_opacus.data.cifar import require_files
from alm_opacus.data.registry import DataError, Dataset
from alm_opacus.data.spec import (
    DEFAULT_EPSILON_GRID,
    DatasetSpec,
    DPSGDSchedule,
    register_dataset_spec,
)
from alm_opacus.data.split import STL10_SPLIT
from alm_opacus.heads import HeadConfig
from alm_opacus.ssl.config import SSLConfig

STL10_URL = "http://ai.stanford.edu/~acoates/stl10/stl10_binary.tar.gz"
STL10_FOLDER = "stl10_binary"
_SIZE = 96
_IMAGE_BYTES = 3 * _SIZE * _SIZE  # 27,648
_NUM_CLASSES = 10
_LABELLED = (("train_X.bin", "train_y.bin"), ("test_X.bin", "test_y.bin"))
_UNLABELED = "unlabeled_X.bin"


def _count_images(path: Path) -> int:
    """Number of images in a ``*_X.bin`` file, from its size."""
    size = path.stat().st_size
    if size == 0 or size % _IMAGE_BYTES:
        raise DataError(
            f"{path}: expected a non-empty multiple of {_IMAGE_BYTES} bytes "
            f"(3x{_SIZE}x{_SIZE} uint8 per image), got {size} bytes: truncated or not STL-10"
        )
    return size // _IMAGE_BYTES


def _open_images(path: Path, *, count: int) -> np.ndarray:
    """Read-only, lazily loaded ``(count, 3, 96, 96)`` upright view of a ``*_X.bin`` file."""
    raw = np.memmap(path, dtype=np.uint8, mode="r", shape=(count, 3, _SIZE, _SIZE))
    # Stored column-major: swap the last two axes so that axis 2 is the image row.
    return raw.transpose(0, 1, 3, 2)


def _read_labels(path: Path, *, count: int, images: Path) -> np.ndarray:
    labels = np.fromfile(path, dtype=np.uint8)
    if len(labels) != count:
        raise DataError(
            f"{path}: expected {count} labels (one byte per image in {images.name}), "
            f"got {len(labels)}"
        )
    if labels.min() < 1 or labels.max() > _NUM_CLASSES:
        raise DataError(
            f"{path}: expected labels in 1..{_NUM_CLASSES}, "
            f"got min={labels.min()}, max={labels.max()}"
        )
    return labels.astype(np.int64) - 1


def load_stl10(*, root: Path | None = None) -> Dataset:
    """Load STL-10 from ``root/stl10_binary``: train + test labelled, unlabeled kept on disk.

    Args:
        root: the folder the official archive was extracted under.

    Returns:
        ``uint8`` ``(13000, 3, 96, 96)`` images (train then test) in RAM, ``int64`` labels in
        [0, 10), and ``unlabeled``, a read-only memory-mapped ``(100000, 3, 96, 96)`` view
        of ``unlabeled_X.bin`` that is paged in only as it is indexed. Original split sizes
        are in ``meta["split_sizes"]``.

    Raises:
        DataError: if ``root`` is ``None``, a file is missing, an image file is not a whole
            number of images, or a label file has the wrong length or a label outside 1..10.
    """
    files = (*(f for pair in _LABELLED for f in pair), _UNLABELED)
    base = require_files(name="stl10", root=root, folder=STL10_FOLDER, files=files, url=STL10_URL)
    counts = {x: _count_images(base / x) for x, _ in _LABELLED}
    labels = np.concatenate(
        [_read_labels(base / y, count=counts[x], images=base / x) for x, y in _LABELLED]
    )
    n_unlabeled = _count_images(base / _UNLABELED)  # validate every file before the copy
    # Fill one buffer from the memory maps: a single in-RAM copy of the labelled pool.
    images = np.empty((len(labels), 3, _SIZE, _SIZE), dtype=np.uint8)
    start = 0
    for x, _ in _LABELLED:
        images[start : start + counts[x]] = _open_images(base / x, count=counts[x])
        start += counts[x]
    return Dataset(
        name="stl10",
        images=images,
        labels=labels,
        num_classes=_NUM_CLASSES,
        unlabeled=_open_images(base / _UNLABELED, count=n_unlabeled),
        meta={
            "source": STL10_URL,
            "files": [str(base / f) for f in files],
            "split_sizes": {
                "train": counts["train_X.bin"],
                "test": counts["test_X.bin"],
                "unlabeled": n_unlabeled,
            },
        },
    )


register_dataset_spec(
    DatasetSpec(
        name="stl10",
        loader=load_stl10,
        split=STL10_SPLIT,
        # Pre-trains on the 100,000 unlabeled images (ALM paper, Section 6), on a GPU.
        ssl=SSLConfig(
            encoder="resnet18",
            augmentation="stl10",
            epochs=100,
            batch_size=256,
            lr=1e-3,
            temperature=0.5,
            projection_dim=128,
        ),
        dpsgd=DPSGDSchedule(epochs=20, batch_size=256),
        epsilons=DEFAULT_EPSILON_GRID,
        needs_root=True,
        # Not measured here (needs a GPU run); the previous default recipe.
        head=HeadConfig(),
        description="STL-10, 13,000 labelled 96x96 images + 100,000 unlabeled, from --data-root",
    )
)
