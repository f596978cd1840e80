"""Shared fixtures. The SimCLR pipeline on digits is built once per session and cached."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest
import torch

from alm_opacus.data import Dataset, load_dataset
from alm_opacus.registry import Registry
from alm_opacus.report.results import ResultRow

#: The required fields of a results row, as the unprotected head's (method ``none``) at seed 0.
ROW_DEFAULTS: dict[str, object] = {
    "dataset": "digits",
    "method": "none",
    "epsilon": math.inf,
    "delta": 0.0,
    "guarantee": "none",
    "sensitivity": math.nan,
    "noise_scale": math.nan,
    "seed": 0,
    "test_accuracy": 0.9,
    "utility_loss": 0.0,
}


def make_row(**fields: object) -> ResultRow:
    """A results row: :data:`ROW_DEFAULTS` with ``fields`` set (any ``ResultRow`` field)."""
    return ResultRow(**(ROW_DEFAULTS | fields))  # type: ignore[arg-type]


@pytest.fixture
def result_row() -> Callable[..., ResultRow]:
    """:func:`make_row`, as a fixture (tests cannot import conftest in importlib mode): the
    one builder of hand-made results rows."""
    return make_row


@pytest.fixture(scope="session", autouse=True)
def _encoder_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Runs without ``--cache-dir`` cache their public encoder in the user's cache: point it
    at a folder of this session, so tests never write into the home folder."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("ALM_OPACUS_ENCODER_CACHE", str(tmp_path_factory.mktemp("encoders")))
        yield


@pytest.fixture(scope="session")
def digits() -> Dataset:
    return load_dataset("digits")


@pytest.fixture(scope="session")
def pixel_features(digits: Dataset) -> tuple[torch.Tensor, torch.Tensor]:
    """Raw digits pixels as unit-norm 64-d features: a fast stand-in for SimCLR features."""
    x = torch.from_numpy(digits.images.reshape(len(digits.images), -1).astype(np.float64))
    return torch.nn.functional.normalize(x, dim=1), torch.from_numpy(digits.labels)


@pytest.fixture(scope="session")
def shared_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One encoder/feature cache for every test that runs the default digits pipeline."""
    return tmp_path_factory.mktemp("alm_cache")


@pytest.fixture(scope="session")
def default_pipeline(shared_cache: Path, tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    """The default digits pipeline (split, SimCLR encoder, features), built once."""
    from alm_opacus.run.harness import RunConfig, prepare

    out = tmp_path_factory.mktemp("pipeline_run")
    config = RunConfig(out=str(out), cache_dir=str(shared_cache), progress=False)
    return prepare(config)


@pytest.fixture
def make_context(pixel_features):  # type: ignore[no-untyped-def]
    """A MethodContext on digits pixels with public rows 200:500, for method tests.

    Keyword arguments set other ``MethodContext`` fields (``schedule``, ``noise``,
    ``cache_dir``, ...); method options go to ``create_method`` instead.
    """
    from alm_opacus.heads import HeadConfig
    from alm_opacus.methods import MethodContext

    x, y = pixel_features

    def make(**fields: object) -> MethodContext:
        defaults = {"num_classes": 10, "head": HeadConfig(), "public_features": x[200:500],
                    "public_labels": y[200:500]}  # fmt: skip
        return MethodContext(**{**defaults, **fields})  # type: ignore[arg-type]

    return make


def ray_processes() -> dict[int, str]:
    """Ray's processes on this machine (GCS, raylet, agents, workers): pid -> command line."""
    import os

    found = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as handle:
                cmd = handle.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if cmd.startswith("ray::") or "/site-packages/ray/" in cmd:
            found[int(entry)] = cmd[:160]
    return found


@pytest.fixture(scope="session")
def list_ray_processes():  # type: ignore[no-untyped-def]
    """:func:`ray_processes`, for tests (``tests`` is not a package to import from)."""
    return ray_processes


@pytest.fixture
def isolated_registries() -> Iterator[None]:
    """Every registration a test makes (methods, datasets, attacks, ...) vanishes after it."""
    with Registry.isolated():
        yield
