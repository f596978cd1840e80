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

Each chunk of pairs is one pure unit of work (:func:`population_chunk`: data, recipe, seed and
pair indices in, distances out); every pair's rows come from its own seeded stream, so a chunk
needs nothing of the others. A convex recipe (Newton) starts each ``D`` from the head on the
whole population sample (``D`` is ``n`` draws from it) and each ``D'`` from ``D``'s head (one
record away): warm starts change the cost of reaching each unique minimiser, not the minimiser.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from alm_opacus._validation import check_integer
from alm_opacus.heads import HeadConfig, Params, flat_params
from alm_opacus.sensitivity.convex import DEFAULT_TOL, FeatureBasis
from alm_opacus.sensitivity.sampler import (
    SamplerRecipe,
    SensitivitySample,
    _check_inputs,
    _distances,
    _finish,
    default_chunk_size,
)
from alm_opacus.unit_map import UnitMap, serial_map

__all__ = [
    "draw_population_pairs",
    "population_chunk",
    "population_pair_rows",
    "sample_population_sensitivity",
]


def _check_sizes(population: int, n: int) -> None:
    check_integer(n, name="n")
    if population < 2:
        raise ValueError(f"population={population!r} is invalid: expected at least 2 rows")


def population_pair_rows(*, population: int, n: int, seed: int, pairs: range) -> np.ndarray:
    """The rows of the pairs ``pairs`` (indices), each from its own stream of ``seed``.

    Returns:
        (len(pairs), n + 1) indices into ``range(population)``, drawn i.i.d. with
        replacement: per pair, the ``n - 1`` shared draws ``B``, then ``x`` and ``x'``.

    Raises:
        ValueError: if ``population < 2`` or ``n < 1``.
    """
    _check_sizes(population, n)
    out = np.empty((len(pairs), n + 1), dtype=np.int64)
    for k, pair in enumerate(pairs):
        rng = np.random.default_rng(np.random.SeedSequence([int(seed), 3, int(pair)]))
        out[k] = rng.integers(0, population, size=n + 1)
    return out


def draw_population_pairs(*, population: int, n: int, m: int, seed: int) -> np.ndarray:
    """``m`` i.i.d. replace-one pairs of data sets of ``n`` i.i.d. draws from
    ``range(population)`` (with replacement).

    Returns:
        (m, n + 1) row indices: the first ``n - 1`` are the shared draws ``B``, then ``x``
        and ``x'``. Pair ``k`` depends only on ``seed`` and ``k`` (not on ``m``).

    Raises:
        ValueError: if ``population < 2``, ``n < 1`` or ``m < 1``.
    """
    check_integer(m, name="m", numpy=True)
    return population_pair_rows(population=population, n=n, seed=seed, pairs=range(int(m)))


def population_chunk(
    features: Tensor,
    labels: Tensor,
    *,
    recipe: SamplerRecipe,
    n: int,
    seed: int,
    pairs: range,
    start: Params | None = None,
    basis: FeatureBasis | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One unit of the sampler's work: the distances of the pairs ``pairs``.

    A pure function of its arguments. ``start`` (the head on the whole population sample,
    convex recipes only) warm-starts each ``D``; each ``D'`` then starts from ``D``'s head.
    ``basis`` is :meth:`SamplerRecipe.basis` of ``features`` (computed here when not given).

    Returns:
        ``(l1, l2, rows)``: the distances and the ``(x, x')`` rows of each pair.
    """
    total = int(features.shape[0])
    rows = population_pair_rows(population=total, n=n, seed=seed, pairs=pairs)
    shared = torch.stack(
        [torch.bincount(torch.as_tensor(r[: n - 1]), minlength=total) for r in rows]
    )
    ends = torch.as_tensor(rows[:, n - 1 :])
    pick = torch.arange(len(rows))
    first, second = shared.clone(), shared
    first[pick, ends[:, 0]] += 1
    second[pick, ends[:, 1]] += 1
    device = features.device
    if recipe.convex:
        basis = basis or recipe.basis(features)
        one = recipe.train(features, labels, first.to(device), init=start, basis=basis)
        other = recipe.train(features, labels, second.to(device), init=one, basis=basis)
        diff = flat_params(one) - flat_params(other)
    else:  # both sides in one batch, from the recipe's seeded start
        flat = flat_params(recipe.train(features, labels, torch.cat([first, second]).to(device)))
        diff = flat[: len(rows)] - flat[len(rows) :]
    l1, l2 = _distances(diff)
    return l1, l2, rows[:, n - 1 :]


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
    warm_start: bool = True,
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
        chunk_size: heads trained at once, two per pair (default: :func:`default_chunk_size`).
        progress: show a tqdm bar over chunks.
        solver: ``"adam"`` or ``"newton"``.
        tol: gradient-norm tolerance of the ``"newton"`` solver.
        warm_start: warm-start convex heads (module docstring); each distance is then the cold
            start's within ``4 tol / l2`` in L2 (each of its two heads lies within
            ``tol / l2`` of its minimiser either way). No effect on Adam recipes.
        map_units: runs the chunks of pairs (:func:`population_chunk`, independent units
            whose seeds come from their pair indices); default in this process, in order.
            The result does not depend on it.

    Returns:
        A :class:`SensitivitySample` with ``population`` set; ``pairs`` holds ``(x, x')``.

    Raises:
        ValueError: on a population of fewer than 2 rows, bad ``m``, ``order``, ``gamma``,
            shapes, ``chunk_size`` or ``solver``, or a non-finite distance.
    """
    order = _check_inputs(features, labels, m, order, gamma)
    total = int(features.shape[0])
    _check_sizes(total, n)
    if chunk_size is None:
        chunk_size = default_chunk_size(
            n=total, num_classes=num_classes, config=config, heads=2 * m
        )
    check_integer(chunk_size, name="chunk_size", minimum=2)
    chunk_pairs = max(1, chunk_size // 2)
    recipe = SamplerRecipe(
        num_classes=num_classes, config=config, seed=seed, solver=solver, tol=tol
    )
    basis = recipe.basis(features)
    start = recipe.whole(features, labels, basis=basis) if warm_start else None
    shared = _PopulationWork(
        features=features, labels=labels, recipe=recipe, n=n, seed=seed, start=start, basis=basis
    )
    units = [range(first, min(m, first + chunk_pairs)) for first in range(0, m, chunk_pairs)]
    parts = map_units(
        _population_unit,
        units,
        shared=shared,
        desc="sensitivity sampler (public)" if progress else None,
    )
    l1 = np.concatenate([p[0] for p in parts]).astype(np.float64)
    l2 = np.concatenate([p[1] for p in parts]).astype(np.float64)
    ends = np.concatenate([p[2] for p in parts]).astype(np.int64)
    return _finish(
        l1, l2, ends, n=n, order=order, gamma=gamma, solver=solver, population=population
    )


@dataclass(frozen=True)
class _PopulationWork:
    """What every chunk of :func:`sample_population_sensitivity` reads (sent once)."""

    features: Tensor
    labels: Tensor
    recipe: SamplerRecipe
    n: int
    seed: int
    start: Params | None
    basis: FeatureBasis | None


def _population_unit(
    shared: _PopulationWork, pairs: range
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One unit for a :class:`~alm_opacus.unit_map.UnitMap`: :func:`population_chunk`."""
    w = shared
    return population_chunk(
        w.features,
        w.labels,
        recipe=w.recipe,
        n=w.n,
        seed=w.seed,
        pairs=pairs,
        start=w.start,
        basis=w.basis,
    )
