"""Rubinstein & Aldà's sensitivity sampler on non-private data (random-DP that can be published).

Rubinstein & Aldà (ICML 2017, "Pain-free random differential privacy with sensitivity
sampling", Algorithm 1) draw ``m`` i.i.d. pairs of neighbouring data sets *from the
population distribution* and take an order statistic of the distances between the outputs.
Their random-DP theorem is a statement over that distribution, so the pairs must not come
from the private data set itself: the ALM paper's Algorithm 2 removes rows of the private
``d`` and publishes the result without noise, and the estimate then tells neighbouring
private data sets apart (:mod:`alm_opacus.sensitivity.sampler`, kept as the paper's variant).

Here the population is the empirical distribution of a non-private sample (the public
split, or any sample a user supplies): each pair is ``D = B + {x}``, ``D' = B + {x'}``, with
``B`` of ``n - 1`` rows and ``x, x'`` two more, all drawn i.i.d. (with replacement) from that
sample, independently for every pair, so the ``m`` distances are i.i.d. and
:mod:`.random_dp`'s confidence applies. ``D`` and ``D'`` have the members' size ``n`` and
differ in one record: replace-one neighbours. Drawing with replacement needs no more public
rows than members (mnist's public split has exactly the members' size) and makes the
population precise: data sets of ``n`` i.i.d. draws from the public sample.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from alm_opacus.heads import HeadConfig
from alm_opacus.sensitivity.convex import DEFAULT_TOL
from alm_opacus.sensitivity.sampler import (
    HeadTrainer,
    SensitivitySample,
    _check_inputs,
    _finish,
    _trainer,
    default_chunk_size,
)
from alm_opacus.units import UnitMap, serial_map

__all__ = ["draw_population_pairs", "population_chunk", "sample_population_sensitivity"]


def draw_population_pairs(*, population: int, n: int, m: int, seed: int) -> np.ndarray:
    """``m`` i.i.d. replace-one pairs of data sets of ``n`` i.i.d. draws from
    ``range(population)`` (with replacement).

    Returns:
        (m, n + 1) row indices: the first ``n - 1`` are the shared draws ``B``, then ``x``
        and ``x'``. The first ``m'`` pairs do not depend on ``m``.

    Raises:
        ValueError: if ``population < 2``, ``n < 1`` or ``m < 1``.
    """
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"n={n!r} is invalid: expected an integer >= 1")
    if isinstance(m, bool) or not isinstance(m, (int, np.integer)) or m < 1:
        raise ValueError(f"m={m!r} is invalid: expected an integer >= 1")
    if population < 2:
        raise ValueError(f"population={population!r} is invalid: expected at least 2 rows")
    rng = np.random.default_rng(np.random.SeedSequence([int(seed), 3]))
    return np.stack([rng.integers(0, population, size=n + 1) for _ in range(m)])


def population_chunk(train: HeadTrainer, block: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """One unit of :func:`sample_population_sensitivity`: the pairs ``block`` (k, n + 1) of
    :func:`draw_population_pairs`, each trained as two heads (row counts of the population
    sample), and their distances ``(l1 (k,), l2 (k,))``."""
    n = block.shape[1] - 1
    total = int(train.features.shape[0])
    counts = torch.zeros(2 * len(block), total, dtype=torch.int64)
    for k, pair in enumerate(block):
        shared = torch.bincount(torch.from_numpy(pair[: n - 1].copy()), minlength=total)
        counts[2 * k] = shared
        counts[2 * k + 1] = shared
        counts[2 * k, int(pair[n - 1])] += 1
        counts[2 * k + 1, int(pair[n])] += 1
    flat = train(counts.to(train.features.device))
    diff = flat[0::2] - flat[1::2]
    return diff.abs().sum(1).cpu().numpy(), torch.linalg.vector_norm(diff, dim=1).cpu().numpy()


def sample_population_sensitivity(
    features: Tensor,
    labels: Tensor,
    *,
    n: int,
    num_classes: int,
    config: HeadConfig,
    seed: int,
    m: int,
    population: str,
    order: int | None = None,
    gamma: float = 0.05,
    chunk_size: int | None = None,
    progress: bool = False,
    solver: str = "adam",
    tol: float = DEFAULT_TOL,
    map_units: UnitMap = serial_map,
) -> SensitivitySample:
    """Sample the sensitivity of the head trained on ``n`` rows, from a population sample.

    Args:
        features: (N, d) features of the non-private population sample (never the members).
        labels: (N,) its labels.
        n: the size of the data sets (the members' size).
        num_classes: number of classes.
        config: the head's recipe (the one the released head is trained with).
        seed: seeds the pairs and (``"adam"``) the heads' shared initialisation; >= 0.
        m: number of neighbouring pairs.
        population: what the sample is, for the statement (e.g. "the public split (600 rows
            of digits)").
        order: which order statistic to return, 1-based (default ``m``, the maximum).
        gamma: allowed probability that a fresh pair from the population exceeds the value.
        chunk_size: heads trained at once (default: :func:`default_chunk_size`).
        progress: show a tqdm bar over chunks.
        solver: ``"adam"`` or ``"newton"``.
        tol: gradient-norm tolerance of the ``"newton"`` solver.
        map_units: runs the chunks of pairs (:func:`population_chunk`, independent units);
            default in this process, in order. The result does not depend on it.

    Returns:
        A :class:`SensitivitySample` with ``population`` set; ``pairs`` holds ``(x, x')``.

    Raises:
        ValueError: on a population of fewer than 2 rows, bad ``m``, ``order``, ``gamma``,
            shapes, ``chunk_size`` or ``solver``, or a non-finite distance.
    """
    order = _check_inputs(features, labels, m, order, gamma)
    rows = draw_population_pairs(population=int(features.shape[0]), n=n, m=m, seed=seed)
    total = int(features.shape[0])
    if chunk_size is None:
        chunk_size = default_chunk_size(n=total, num_classes=num_classes, config=config,
                                        heads=2 * m)  # fmt: skip
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 2:
        raise ValueError(f"chunk_size={chunk_size!r} is invalid: expected an integer >= 2")
    chunk_pairs = max(1, chunk_size // 2)
    train = _trainer(features, labels, num_classes=num_classes, config=config, seed=seed,
                     solver=solver, tol=tol)  # fmt: skip
    blocks = [rows[start : start + chunk_pairs] for start in range(0, m, chunk_pairs)]
    parts = map_units(population_chunk, blocks, shared=train,
                      desc="sensitivity sampler (public)" if progress else None)  # fmt: skip
    l1 = np.concatenate([p[0] for p in parts]).astype(np.float64)
    l2 = np.concatenate([p[1] for p in parts]).astype(np.float64)
    return _finish(l1, l2, rows[:, n - 1 :].astype(np.int64), n=n, order=order, gamma=gamma,
                   solver=solver, population=population)  # fmt: skip
