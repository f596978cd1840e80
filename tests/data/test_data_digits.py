"""The embedded digits reader: scikit-learn's data, read without importing sklearn.datasets."""

from __future__ import annotations

import importlib.util
import subprocess
from collections.abc import Callable

import numpy as np
import pytest
from sklearn.datasets import load_digits as sk_load_digits

from alm_opacus.data import load_dataset
from alm_opacus.data.digits import _digits_arrays


def test_the_file_reader_matches_scikit_learns_loader_bit_for_bit() -> None:
    pixels, labels = _digits_arrays()
    bunch = sk_load_digits()
    assert pixels.shape == (1797, 8, 8)
    np.testing.assert_array_equal(pixels, bunch.images)
    np.testing.assert_array_equal(labels, bunch.target)
    dataset = load_dataset("digits")
    np.testing.assert_array_equal(dataset.images[:, 0] * 16.0, bunch.images.astype(np.float32))
    assert dataset.images.dtype == np.float32 and dataset.labels.dtype == np.int64


def test_without_the_file_it_falls_back_to_scikit_learn(monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "sklearn" else real(name)
    )
    pixels, labels = _digits_arrays()
    np.testing.assert_array_equal(pixels, sk_load_digits().images)
    np.testing.assert_array_equal(labels, sk_load_digits().target)


@pytest.mark.slow  # a fresh interpreter imports torch
def test_reading_digits_imports_neither_sklearn_datasets_pandas_nor_kornia(
    fresh_python: Callable[[str], subprocess.CompletedProcess[str]],
) -> None:
    # every run's start reads its dataset and spec; kornia loads only to pre-train
    code = (
        "import sys; from alm_opacus.data import dataset_spec, load_dataset; "
        "load_dataset('digits'); dataset_spec('digits'); "
        "bad = [m for m in ('sklearn.datasets', 'pandas', 'kornia') if m in sys.modules]; "
        "assert not bad, bad"
    )
    proc = fresh_python(code)
    assert proc.returncode == 0, proc.stderr
