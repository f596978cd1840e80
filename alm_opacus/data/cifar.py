"""CIFAR-10 and CIFAR-100 read from their official python-pickle folders, without torchvision.

The files come from https://www.cs.toronto.edu/~kriz/cifar.html and are extracted under
``--data-root``:

- ``<root>/cifar-10-batches-py/``: ``data_batch_1`` .. ``data_batch_5``, ``test_batch``,
  ``batches.meta``;
- ``<root>/cifar-100-python/``: ``train``, ``test``, ``meta``.

Each batch is a pickled dict with bytes keys: ``b"data"``, a ``uint8`` ``(N, 3072)`` array
holding, per image, the red, green and blue 32x32 planes in row-major order, and the labels
(``b"labels"`` for CIFAR-10; ``b"fine_labels"`` and ``b"coarse_labels"`` for CIFAR-100).

Security: the batches are read with a restricted unpickler (``safe_pickle.safe_load``) that
admits only numpy arrays and plain types, so a crafted file is refused instead of running code.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from alm_opacus.data.registry import DataError, Dataset
from alm_opacus.data.safe_pickle import UnsafePickleError, safe_load
from alm_opacus.data.spec import (
    DEFAULT_EPSILON_GRID,
    DatasetSpec,
    DPSGDSchedule,
    register_dataset_spec,
)
from alm_opacus.data.split import CIFAR_SPLIT
from alm_opacus.heads import HeadConfig
from alm_opacus.ssl.config import SSLConfig

CIFAR10_URL = "https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz"
CIFAR100_URL = "https://www.cs.toronto.edu/~kriz/cifar-100-python.tar.gz"
CIFAR10_FOLDER = "cifar-10-batches-py"
CIFAR100_FOLDER = "cifar-100-python"
_CIFAR10_TRAIN = tuple(f"data_batch_{i}" for i in range(1, 6))
_IMAGE_SHAPE = (3, 32, 32)
_IMAGE_BYTES = 3 * 32 * 32


def require_files(
    *, name: str, root: Path | None, folder: str, files: tuple[str, ...], url: str
) -> Path:
    """Check that ``root/folder`` holds every file in ``files``.

    Args:
        name: dataset name, for the message.
        root: the ``--data-root`` folder, or ``None`` when none was given.
        folder: sub-folder of ``root`` that the archive at ``url`` extracts to.
        files: file names expected inside ``root/folder``.
        url: where the archive comes from.

    Returns:
        The folder ``root/folder``.

    Raises:
        DataError: if ``root`` is ``None`` or any file is missing; the message lists the full
            expected paths, the missing ones, and where to get them.
    """
    fetch = f"download {url} and extract it under --data-root"
    if root is None:
        expected = ", ".join(f"<data-root>/{folder}/{f}" for f in files)
        raise DataError(
            f"{name} is read from local files: pass --data-root; expected {expected} ({fetch})"
        )
    base = root / folder
    missing = [base / f for f in files if not (base / f).is_file()]
    if not missing:
        return base
    expected = ", ".join(str(base / f) for f in files)
    if base.is_dir():
        msg = f"{name}: missing {len(missing)} of {len(files)} files: "
        msg += f"{', '.join(str(p) for p in missing)}. Expected {expected}"
    else:
        msg = f"{name}: no folder {base}; expected {expected}"
    msg += f" ({fetch}, so that {base} exists)"
    if (root / files[0]).is_file():
        # A common slip: pointing --data-root at the extracted folder itself.
        msg += f"; --data-root must be the folder containing {folder}/, not {folder}/ itself"
    raise DataError(msg)


def _unpickle(path: Path) -> dict[object, object]:
    """Load one pickled CIFAR dict (bytes keys, as written by Python 2), never running code."""
    try:
        with path.open("rb") as f:
            obj = safe_load(f, encoding="bytes")
    except UnsafePickleError as err:
        raise DataError(
            f"{path}: refused to unpickle ({err}); the file is not an official CIFAR batch and "
            "may be malicious: re-extract the official archive"
        ) from err
    except Exception as err:  # corrupt pickles raise almost any exception type
        raise DataError(
            f"{path}: not a readable CIFAR python pickle ({type(err).__name__}: {err}); "
            "re-extract the official archive"
        ) from err
    if not isinstance(obj, dict):
        raise DataError(f"{path}: expected a pickled dict, got {type(obj).__name__}")
    return obj


def _field(batch: dict[object, object], key: bytes, *, path: Path) -> object:
    if key not in batch:
        found = ", ".join(repr(k) for k in batch)
        raise DataError(f"{path}: expected key {key!r} in the pickled dict, found {found}")
    return batch[key]


def _read_batch(path: Path, *, label_key: bytes, num_classes: int) -> tuple[np.ndarray, np.ndarray]:
    """Read one batch file into ``(N, 3, 32, 32)`` uint8 images and ``(N,)`` int64 labels."""
    batch = _unpickle(path)
    data = _field(batch, b"data", path=path)
    if (
        not isinstance(data, np.ndarray)
        or data.dtype != np.uint8
        or data.ndim != 2
        or data.shape[1] != _IMAGE_BYTES
    ):
        got = f"{data.dtype} {data.shape}" if isinstance(data, np.ndarray) else type(data).__name__
        raise DataError(
            f"{path}: expected b'data' to be a uint8 (N, {_IMAGE_BYTES}) array, got {got}"
        )
    labels = np.asarray(_field(batch, label_key, path=path))
    if labels.ndim != 1 or not np.issubdtype(labels.dtype, np.integer):
        raise DataError(
            f"{path}: expected {label_key!r} to be a list of integers, "
            f"got {labels.dtype} {labels.shape}"
        )
    if len(labels) != len(data):
        raise DataError(f"{path}: {len(data)} images but {len(labels)} labels in {label_key!r}")
    if len(labels) and (labels.min() < 0 or labels.max() >= num_classes):
        raise DataError(
            f"{path}: expected {label_key!r} in [0, {num_classes}), "
            f"got min={labels.min()}, max={labels.max()}"
        )
    # Each row is the R, G, B planes in turn, each 32x32 row-major: a plain C-order reshape.
    return data.reshape(-1, *_IMAGE_SHAPE), labels.astype(np.int64)


def _class_names(path: Path, *, key: bytes, num_classes: int) -> list[str]:
    names = _field(_unpickle(path), key, path=path)
    if not isinstance(names, list) or len(names) != num_classes:
        raise DataError(f"{path}: expected {key!r} to list {num_classes} class names")
    return [n.decode("utf-8", "replace") if isinstance(n, bytes) else str(n) for n in names]


def _load(
    *,
    name: str,
    root: Path | None,
    folder: str,
    url: str,
    train: tuple[str, ...],
    test: str,
    meta_file: str,
    label_key: bytes,
    names_key: bytes,
    num_classes: int,
) -> Dataset:
    base = require_files(
        name=name, root=root, folder=folder, files=(*train, test, meta_file), url=url
    )
    class_names = _class_names(base / meta_file, key=names_key, num_classes=num_classes)
    parts = [
        _read_batch(base / f, label_key=label_key, num_classes=num_classes) for f in (*train, test)
    ]
    n_train = sum(len(labels) for _, labels in parts[:-1])
    return Dataset(
        name=name,
        images=np.concatenate([images for images, _ in parts]),
        labels=np.concatenate([labels for _, labels in parts]),
        num_classes=num_classes,
        meta={
            "source": url,
            "files": [str(base / f) for f in (*train, test, meta_file)],
            # The pool is train then test; Split draws its own four parts from it.
            "split_sizes": {"train": n_train, "test": len(parts[-1][1])},
            "label_key": label_key.decode(),
            "class_names": class_names,
        },
    )


def load_cifar10(*, root: Path | None = None) -> Dataset:
    """Load CIFAR-10 (train + test, 60,000 images) from ``root/cifar-10-batches-py``.

    Args:
        root: the folder the official archive was extracted under.

    Returns:
        ``uint8`` ``(N, 3, 32, 32)`` images, ``int64`` labels in [0, 10); the original
        train/test sizes are in ``meta["split_sizes"]``.

    Raises:
        DataError: if ``root`` is ``None``, or a file is missing or corrupt.
    """
    return _load(
        name="cifar10",
        root=root,
        folder=CIFAR10_FOLDER,
        url=CIFAR10_URL,
        train=_CIFAR10_TRAIN,
        test="test_batch",
        meta_file="batches.meta",
        label_key=b"labels",
        names_key=b"label_names",
        num_classes=10,
    )


def load_cifar100(*, root: Path | None = None) -> Dataset:
    """Load CIFAR-100 (train + test, 60,000 images, fine labels) from ``root/cifar-100-python``.

    Args:
        root: the folder the official archive was extracted under.

    Returns:
        ``uint8`` ``(N, 3, 32, 32)`` images, ``int64`` fine labels in [0, 100); the original
        train/test sizes are in ``meta["split_sizes"]``.

    Raises:
        DataError: if ``root`` is ``None``, or a file is missing or corrupt.
    """
    return _load(
        name="cifar100",
        root=root,
        folder=CIFAR100_FOLDER,
        url=CIFAR100_URL,
        train=("train",),
        test="test",
        meta_file="meta",
        label_key=b"fine_labels",
        names_key=b"fine_label_names",
        num_classes=100,
    )


# ALM paper setting (their Section 6): ResNet-18 SimCLR on the public split, on a GPU.
CIFAR_SSL = SSLConfig(
    encoder="resnet18",
    augmentation="cifar",
    epochs=200,
    batch_size=512,
    lr=1e-3,
    temperature=0.5,
    projection_dim=128,
)
for _name, _loader, _what in (
    ("cifar10", load_cifar10, "CIFAR-10"),
    ("cifar100", load_cifar100, "CIFAR-100 (fine labels)"),
):
    register_dataset_spec(
        DatasetSpec(
            name=_name,
            loader=_loader,
            split=CIFAR_SPLIT,
            ssl=CIFAR_SSL,
            dpsgd=DPSGDSchedule(epochs=20, batch_size=256),
            epsilons=DEFAULT_EPSILON_GRID,
            needs_root=True,
            # Not measured here (needs a GPU run); the previous default recipe.
            head=HeadConfig(),
            description=f"{_what}, 60,000 32x32 images read from --data-root",
        )
    )
