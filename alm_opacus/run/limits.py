"""Limits of a run that depend on its data, checked before it writes anything.

``run.plan.plan_run`` calls these once the dataset is loaded: an epsilon too small for an
exact release to draw (:func:`~alm_opacus.mechanisms.grid.smallest_epsilon`), and features
too wide for the Newton solver's dense basis on this machine
(:func:`~alm_opacus.sensitivity.convex.basis_peak_bytes`).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from alm_opacus.data import Dataset
from alm_opacus.heads import HeadConfig
from alm_opacus.method_base import Method

__all__ = ["check_epsilons", "check_newton_memory"]


def _machine_memory(device: str) -> int | None:
    """Bytes of memory on ``device`` (``None`` where the platform does not say)."""
    if device.startswith("cuda"):
        index = int(device.partition(":")[2] or 0)
        return int(torch.cuda.get_device_properties(index).total_memory)
    try:
        return int(os.sysconf("SC_PAGE_SIZE")) * int(os.sysconf("SC_PHYS_PAGES"))
    except (AttributeError, ValueError, OSError):  # e.g. Windows
        return None


def _gib(size: int) -> str:
    return f"{size / 2**30:.1f} GiB" if size >= 2**30 else f"{size / 2**20:.0f} MiB"


def check_newton_memory(
    *, dataset: Dataset, methods: Mapping[str, Method[Any, Any]], recipe: HeadConfig, device: str
) -> None:
    """Features too wide for the Newton solver's dense (d+1)^2 basis fail here, not after
    minutes of work (a 30,000-d file needs about 34 GiB).

    Args:
        dataset: the loaded data.
        methods: the run's methods (those whose ``needs_newton_basis`` fit it anyway).
        recipe: the head's recipe (its solver).
        device: where the run computes.

    Raises:
        ValueError: naming the dimension, the memory needed and the machine's.
    """
    if dataset.features is None:  # image datasets: the encoder's output, a few hundred wide
        return
    analytic = [name for name, method in methods.items() if method.needs_newton_basis]
    if recipe.solver != "newton" and not analytic:
        return
    from alm_opacus.sensitivity.convex import basis_peak_bytes

    dim = int(dataset.features.shape[1])
    need, limit = basis_peak_bytes(dim), _machine_memory(device)
    if limit is not None and need > limit:
        who = "the head's Newton solver"
        if recipe.solver != "newton":
            who = f"the Newton fit of {', '.join(analytic)}'s analytic sensitivity"
        raise ValueError(
            f"{dataset.name}: features of {dim:,} dimensions need a dense ({dim + 1:,})^2 "
            f"eigendecomposition for {who}: about {_gib(need)} at its peak, more than the "
            f"{_gib(limit)} of memory on {device}; reduce the "
            "dimension (e.g. PCA), or train the head with Adam (--l2 0 or --head mlp) with "
            "--sensitivity sampled"
        )


def check_epsilons(
    *,
    dataset: Dataset,
    grid: Sequence[float],
    recipe: HeadConfig,
    encoder: str | None,
    delta: float,
) -> None:
    """An epsilon too small for an exact release to draw its noise fails here, not in a cell.

    The floor grows with the released coordinates (:func:`smallest_epsilon`): the head's
    parameters, which the post-training methods release with noise of scale ~1/epsilon
    (DP-SGD's noise stays bounded as epsilon -> 0, with delta > 0). At 1e-3 it would take a
    head of over 10^12 parameters, so grids from 1e-3 up skip the count.

    Args:
        dataset: the loaded data.
        grid: the run's epsilons.
        recipe: the head's recipe (its size).
        encoder: the SimCLR encoder's name for image data (its output is the head's input).
        delta: the run's delta.

    Raises:
        ValueError: naming the epsilon, the floor and the release's size.
    """
    low = min(grid)
    if low >= 1e-3:
        return
    from alm_opacus.mechanisms.analysis import LARGEST_EPSILON
    from alm_opacus.mechanisms.grid import smallest_epsilon
    from alm_opacus.ssl.encoders import create_encoder

    if dataset.features is not None:
        dim = int(dataset.features.shape[1])
    else:  # the features are the encoder's output
        assert dataset.images is not None
        in_channels = int(dataset.images.shape[1])
        assert encoder is not None
        net = create_encoder(encoder, in_channels=in_channels)
        dim = int(net.out_dim)  # type: ignore[arg-type]
    classes, head = dataset.num_classes, recipe
    if head.kind == "linear":
        size = classes * (dim + 1)
    else:
        size = head.hidden * (dim + 1) + classes * (head.hidden + 1)
    floor = smallest_epsilon(dim=size, delta=delta)
    if low < floor:
        raise ValueError(
            f"--epsilons: epsilon={low!r} is below {floor:.3g}, the smallest for which an exact "
            f"release of this run's head ({size:,} parameters, delta={delta:.3g}) can draw its "
            f"noise (at most 2^52 grid steps per scale unit); expected epsilons in "
            f"[{floor:.3g}, {LARGEST_EPSILON:g}]"
        )
