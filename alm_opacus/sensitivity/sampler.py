"""The sensitivity sampler: ALM paper (Yang, Gohari & Topcu, arXiv:2205.12430), Algorithm 2.

For ``k = 1..m``: draw ``i != j``, retrain the head on ``D1 = d \\ d_i`` and ``D2 = d \\ d_j``
with the same deterministic recipe (same seed, full batch: no order), record
``||w1 - w2||_1`` and ``||w1 - w2||_2``. ``D1`` and ``D2`` both have ``n - 1`` rows and differ
in one (``d_j`` in place of ``d_i``): the distances are replace-one sensitivities at size
``n - 1``, sampled over pairs of the private data set ``d``. The returned value is an order
statistic of the sample, with the random-DP confidence of :mod:`.random_dp`.

Speed: the head on ``d \\ d_i`` depends only on ``i``, so each distinct removed row is trained
once, and those heads are trained together by :func:`~alm_opacus.heads.train_heads` (one
pair of large matrix products per step for linear heads), in chunks that bound memory. Each
chunk is one pure unit of work (:func:`removal_chunk`: data, recipe, rows in, parameters out)
that an executor may run anywhere. A convex recipe starts every head from the head on all of
``d``, one row away (a warm start changes the cost of reaching the unique minimiser, not the
minimiser).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor

from alm_opacus._validation import check_integer
from alm_opacus.heads import HeadConfig, Params, flat_params, train_heads
from alm_opacus.sensitivity import random_dp
from alm_opacus.sensitivity.convex import (
    DEFAULT_TOL,
    FeatureBasis,
    feature_basis,
    train_convex_heads,
)
from alm_opacus.statement import SensitivityInfo, SensitivitySource
from alm_opacus.unit_map import UnitMap, serial_map

__all__ = [
    "SOLVERS",
    "SamplerRecipe",
    "SensitivitySample",
    "default_chunk_size",
    "draw_pairs",
    "removal_chunk",
    "sample_sensitivity",
    "sample_sensitivity_sequential",
]

#: ``"adam"``: ``train_heads`` with the config's recipe; ``"newton"``: the convex head trained
#: to its exact minimiser (``train_convex_heads``), the head the analytic bound covers.
SOLVERS = ("adam", "newton")

# Elements of the largest per-chunk activation ((B, C, n) logits, or (B, n, hidden) for the
# MLP): 2**22 float64 values = 32 MiB, several times that with the solver's temporaries.
# Measured on digits (n = 300, linear): time per head-step is flat from ~64 heads per chunk
# up; at n = 50,000 members (C = 10) a chunk still holds 8 heads, so each pass over the rows
# is a matrix product of 80 rows, not of 10 (issue 21).
_CHUNK_ELEMENTS = 2**22


@dataclass(frozen=True)
class SensitivitySample:
    """The output of the sampler.

    Attributes:
        l1: (m,) ``||w1 - w2||_1`` per sampled pair.
        l2: (m,) ``||w1 - w2||_2`` per sampled pair.
        pairs: (m, 2) the removed rows ``(i, j)`` of each pair.
        n: rows of the data set ``d``; the compared heads saw ``n - 1`` each.
        m: number of pairs.
        order: ``k``, the 1-based rank of the returned value (``m``: the maximum).
        gamma: allowed probability that a fresh pair's distance exceeds the value.
        confidence: probability over the sampler that ``gamma`` holds (per norm).
        failure_probability: ``1 - confidence``, computed without cancellation.
        value_l1: the ``order``-th smallest of ``l1``.
        value_l2: the ``order``-th smallest of ``l2``.
        solver: ``"adam"`` or ``"newton"`` (see :data:`SOLVERS`).
        adjacency: ``"replace-one"`` (``d \\ d_i`` against ``d \\ d_j``).
        population: where the neighbouring data sets were drawn from. ``None``: all pairs
            are subsets of one fixed data set ``d`` (Algorithm 2 as the ALM paper writes it);
            if ``d`` is private, the estimate depends on it and supports no guarantee.
            Otherwise a description of the non-private population the pairs were drawn from
            i.i.d. (Rubinstein & Aldà's sampler), which supports random-DP.
    """

    l1: np.ndarray
    l2: np.ndarray
    pairs: np.ndarray
    n: int
    m: int
    order: int
    gamma: float
    confidence: float
    failure_probability: float
    value_l1: float
    value_l2: float
    solver: str
    adjacency: str = "replace-one"
    population: str | None = None

    @property
    def marginal_gamma(self) -> float:
        """``(m - order + 1) / (m + 1)``: the chance, over sampler and fresh pair together,
        that a fresh pair's distance exceeds the value (:func:`.random_dp.marginal_gamma`)."""
        return random_dp.marginal_gamma(m=self.m, order=self.order)

    def with_order(
        self, *, order: int | None = None, gamma: float | None = None
    ) -> SensitivitySample:
        """The same sample summarised by another order statistic and/or gamma (no retraining).

        Raises:
            ValueError: on an invalid ``order`` or ``gamma``.
        """
        order = self.m if order is None else order
        gamma = self.gamma if gamma is None else gamma
        return dataclasses.replace(self, **_summary(self.l1, self.l2, order=order, gamma=gamma))

    def to_info(self, norm: str = "l2") -> SensitivityInfo:
        """The :class:`~alm_opacus.posttraining.engine.SensitivityInfo` for calibrating in ``norm``.

        Raises:
            ValueError: on an unknown norm, or a value that is not > 0 (e.g. the heads
                of every sampled pair coincide).
        """
        if norm not in ("l1", "l2"):
            raise ValueError(f"norm={norm!r} is invalid: expected 'l1' or 'l2'")
        value = self.value_l1 if norm == "l1" else self.value_l2
        # SensitivityInfo wants confidence < 1; rounding down keeps the claim conservative.
        confidence = min(self.confidence, float(np.nextafter(1.0, 0.0)))
        return SensitivityInfo(
            value=value,
            norm=norm,
            source=(
                SensitivitySource.SAMPLED_MEMBERS
                if self.population is None
                else SensitivitySource.SAMPLED
            ),
            m=self.m,
            gamma=self.gamma,
            confidence=confidence,
            adjacency=self.adjacency,
            population=self.population,
        )


def _summary(l1: np.ndarray, l2: np.ndarray, *, order: int, gamma: float) -> dict[str, Any]:
    m = len(l1)
    confidence = random_dp.sampler_confidence(m=m, order=order, gamma=gamma)
    return {
        "order": int(order),
        "gamma": float(gamma),
        "confidence": confidence,
        "failure_probability": random_dp.sampler_failure_probability(m=m, order=order, gamma=gamma),
        "value_l1": float(np.sort(l1)[order - 1]),
        "value_l2": float(np.sort(l2)[order - 1]),
    }


def draw_pairs(*, n: int, m: int, seed: int) -> np.ndarray:
    """``m`` ordered pairs ``(i, j)``, ``i != j``, uniform over ``range(n)``, i.i.d.

    The first ``m'`` pairs do not depend on ``m``. ``seed`` must be >= 0.

    Raises:
        ValueError: if ``n < 2`` or ``m < 1``.
    """
    if n < 2:
        raise ValueError(f"n={n!r} is invalid: the sampler needs at least 2 rows")
    check_integer(m, name="m", numpy=True)
    rng = np.random.default_rng(np.random.SeedSequence([int(seed), 2]))
    # Row by row, so the first m' pairs of a larger m are the same; j is uniform over the
    # n - 1 rows other than i.
    draws = rng.integers([0, 1], [n, n], size=(m, 2))
    i = draws[:, 0]
    return np.stack([i, (i + draws[:, 1]) % n], axis=1).astype(np.int64)


@dataclass(frozen=True)
class SamplerRecipe:
    """How the sampler trains heads: plain data, so that a unit of work can carry it.

    Attributes:
        num_classes: number of classes.
        config: the head's recipe (the one the released head is trained with).
        seed: seeds the heads' shared initialisation (``"adam"`` recipes).
        solver: ``"adam"``: ``train_heads`` with ``config`` (its own solver); ``"newton"``:
            ``train_convex_heads`` at ``tol`` (see :data:`SOLVERS`).
        tol: gradient-norm tolerance of the ``"newton"`` solver.
    """

    num_classes: int
    config: HeadConfig
    seed: int
    solver: str = "adam"
    tol: float = DEFAULT_TOL

    def __post_init__(self) -> None:
        if self.solver not in SOLVERS:
            raise ValueError(f"solver={self.solver!r} is invalid: expected one of {SOLVERS}")

    @property
    def convex(self) -> bool:
        """Whether heads are trained to the unique minimiser of a strongly convex objective,
        where a warm start changes the cost and not the result (within ``tol / l2``)."""
        return self.solver == "newton" or self.config.solver == "newton"

    def train(
        self,
        features: Tensor,
        labels: Tensor,
        masks: Tensor,
        *,
        init: Params | None = None,
        basis: FeatureBasis | None = None,
    ) -> Params:
        """Heads on the rows of ``masks`` (B, n); ``init`` warm-starts a convex recipe and
        ``basis`` (:meth:`basis`) spares it recomputing its preconditioner's fixed factor."""
        c, config = self.num_classes, self.config
        if self.convex:  # the "newton" solver, or a recipe whose own solver is Newton
            tol = self.tol if self.solver == "newton" else DEFAULT_TOL
            fit = train_convex_heads(
                features,
                labels,
                masks=masks,
                num_classes=c,
                config=config,
                tol=tol,
                init=init,
                basis=basis,
            )
            return fit.params
        return train_heads(
            features, labels, masks=masks, num_classes=c, config=config, seed=self.seed
        )

    def basis(self, features: Tensor) -> FeatureBasis | None:
        """The features' :class:`~alm_opacus.sensitivity.convex.FeatureBasis` (convex
        recipes), computed once per sampler and shared by its chunks."""
        return feature_basis(features, clip_radius=self.config.clip_radius) if self.convex else None

    def whole(
        self, features: Tensor, labels: Tensor, *, basis: FeatureBasis | None = None
    ) -> Params | None:
        """The head on every row, the warm start of its neighbours (``None`` unless convex)."""
        if not self.convex:
            return None
        ones = torch.ones(1, features.shape[0], dtype=torch.bool, device=features.device)
        return {k: v[0] for k, v in self.train(features, labels, ones, basis=basis).items()}


def removal_chunk(
    features: Tensor,
    labels: Tensor,
    *,
    recipe: SamplerRecipe,
    rows: np.ndarray,
    start: Params | None = None,
    basis: FeatureBasis | None = None,
) -> Tensor:
    """One unit of Algorithm 2's work: the heads on ``d \\ d_i`` for each ``i`` in ``rows``.

    A pure function of its arguments. ``start`` (the head on all of ``d``, convex recipes only)
    warm-starts every head: each is one row away from it; ``basis`` is
    :meth:`SamplerRecipe.basis` of ``features`` (computed here when not given).

    Returns:
        (len(rows), P) flat parameters.
    """
    n = features.shape[0]
    index = torch.as_tensor(rows, device=features.device)
    masks = torch.ones(len(index), n, dtype=torch.bool, device=features.device)
    masks[torch.arange(len(index), device=features.device), index] = False
    return flat_params(recipe.train(features, labels, masks, init=start, basis=basis))


def _check_inputs(features: Tensor, labels: Tensor, m: int, order: int | None, gamma: float) -> int:
    if features.ndim != 2 or labels.shape != (features.shape[0],):
        raise ValueError(
            f"features (n, d) and labels (n,) expected; got {tuple(features.shape)} "
            f"and {tuple(labels.shape)}"
        )
    check_integer(m, name="m", numpy=True)
    order = m if order is None else order
    random_dp.sampler_confidence(m=m, order=order, gamma=gamma)  # validates order and gamma
    return order


def _distances(diff: Tensor) -> tuple[np.ndarray, np.ndarray]:
    """The L1 and L2 norms of each row of ``diff`` (pairs' parameter differences)."""
    return diff.abs().sum(1).cpu().numpy(), torch.linalg.vector_norm(diff, dim=1).cpu().numpy()


def _finish(
    l1: np.ndarray,
    l2: np.ndarray,
    pairs: np.ndarray,
    *,
    n: int,
    order: int,
    gamma: float,
    solver: str,
    population: str | None = None,
) -> SensitivitySample:
    bad = ~(np.isfinite(l1) & np.isfinite(l2))
    if bad.any():
        k = int(np.flatnonzero(bad)[0])
        raise ValueError(
            f"sensitivity={float(l2[k])!r} (pair {tuple(pairs[k])}) is invalid: a retrained head "
            "has non-finite weights; lower the learning rate or clip the features"
        )
    return SensitivitySample(
        l1=l1,
        l2=l2,
        pairs=pairs,
        n=n,
        m=len(pairs),
        solver=solver,
        population=population,
        **_summary(l1, l2, order=order, gamma=gamma),
    )


def default_chunk_size(*, n: int, num_classes: int, config: HeadConfig, heads: int) -> int:
    """Heads per chunk: the largest activation stays under 2**20 elements, and the ``heads``
    to train are split into chunks of equal size."""
    width = num_classes if config.kind == "linear" else config.hidden + num_classes
    largest = max(1, _CHUNK_ELEMENTS // (n * width))
    chunks = -(-heads // largest)
    return max(1, -(-heads // chunks))


def sample_sensitivity(
    features: Tensor,
    labels: Tensor,
    *,
    num_classes: int,
    config: HeadConfig,
    seed: int,
    m: int,
    order: int | None = None,
    gamma: float = 0.05,
    chunk_size: int | None = None,
    progress: bool = False,
    solver: str = "adam",
    tol: float = DEFAULT_TOL,
    warm_start: bool = True,
    map_units: UnitMap = serial_map,
) -> SensitivitySample:
    """Sample the sensitivity of the trained head (ALM paper, Algorithm 2), batched.

    Args:
        features: (n, d) features of the data set ``d``.
        labels: (n,) labels.
        num_classes: number of classes.
        config: the head's recipe (the one the released head is trained with).
        seed: seeds the pairs and (``"adam"``) the heads' shared initialisation; >= 0.
        m: number of neighbouring pairs.
        order: which order statistic to return, 1-based (default ``m``, the maximum).
        gamma: allowed probability that a fresh pair exceeds the value; the confidence of
            that statement is computed from ``m``, ``order`` and ``gamma``.
        chunk_size: heads trained at once (default: :func:`default_chunk_size`).
        progress: show a tqdm bar over chunks.
        solver: ``"adam"`` or ``"newton"`` (see :data:`SOLVERS`).
        tol: gradient-norm tolerance of the ``"newton"`` solver.
        warm_start: start each convex head from the head on all of ``d`` (one row away);
            the result is the cold start's within the solver's tolerance, ``2 tol / l2`` per
            distance (:class:`SamplerRecipe`). No effect on Adam recipes.
        map_units: runs the chunks (:func:`removal_chunk`, independent units); default in
            this process, in order. The result does not depend on it.

    Returns:
        A :class:`SensitivitySample`.

    Raises:
        ValueError: on ``m < 1``, ``order`` outside [1, m], ``gamma`` outside (0, 1), bad
            shapes, a bad ``chunk_size`` or ``solver``, or a non-finite distance.
    """
    order = _check_inputs(features, labels, m, order, gamma)
    n = features.shape[0]
    pairs = draw_pairs(n=n, m=m, seed=seed)
    removed, index = np.unique(pairs, return_inverse=True)
    index = index.reshape(pairs.shape)
    if chunk_size is None:
        chunk_size = default_chunk_size(
            n=n, num_classes=num_classes, config=config, heads=len(removed)
        )
    check_integer(chunk_size, name="chunk_size")
    recipe = SamplerRecipe(
        num_classes=num_classes, config=config, seed=seed, solver=solver, tol=tol
    )
    basis = recipe.basis(features)
    start = recipe.whole(features, labels, basis=basis) if warm_start else None
    shared = _RemovalWork(features=features, labels=labels, recipe=recipe, start=start, basis=basis)
    chunks = [removed[i : i + chunk_size] for i in range(0, len(removed), chunk_size)]
    flats = map_units(
        _removal_unit, chunks, shared=shared, desc="sensitivity sampler" if progress else None
    )
    flat = torch.cat(flats)
    l1, l2 = np.empty(m), np.empty(m)
    for i in range(0, m, 1024):  # pair differences in blocks: m * P floats can be large
        block = torch.as_tensor(index[i : i + 1024], device=flat.device)
        diff = flat[block[:, 0]] - flat[block[:, 1]]
        l1[i : i + len(block)], l2[i : i + len(block)] = _distances(diff)
    return _finish(l1, l2, pairs, n=n, order=order, gamma=gamma, solver=solver)


def sample_sensitivity_sequential(
    features: Tensor,
    labels: Tensor,
    *,
    num_classes: int,
    config: HeadConfig,
    seed: int,
    m: int,
    order: int | None = None,
    gamma: float = 0.05,
    solver: str = "adam",
    tol: float = DEFAULT_TOL,
) -> SensitivitySample:
    """Algorithm 2 as written: one pair at a time, two single-head trainings per pair.

    The reference :func:`sample_sensitivity` is tested and timed against: same arguments
    (less the batching ones), same pairs, the same result up to floating-point rounding.
    """
    order = _check_inputs(features, labels, m, order, gamma)
    n = features.shape[0]
    pairs = draw_pairs(n=n, m=m, seed=seed)
    recipe = SamplerRecipe(
        num_classes=num_classes, config=config, seed=seed, solver=solver, tol=tol
    )
    l1, l2 = np.empty(m), np.empty(m)
    for k, (i, j) in enumerate(pairs):
        heads = [
            removal_chunk(features, labels, recipe=recipe, rows=np.array([row]))[0]
            for row in (i, j)
        ]
        diff = heads[0] - heads[1]
        l1[k] = float(diff.abs().sum())
        l2[k] = float(torch.linalg.vector_norm(diff))
    return _finish(l1, l2, pairs, n=n, order=order, gamma=gamma, solver=solver)


@dataclass(frozen=True)
class _RemovalWork:
    """What every chunk of :func:`sample_sensitivity` reads (sent once)."""

    features: Tensor
    labels: Tensor
    recipe: SamplerRecipe
    start: Params | None
    basis: FeatureBasis | None


def _removal_unit(shared: _RemovalWork, rows: np.ndarray) -> Tensor:
    """One unit for a :class:`~alm_opacus.unit_map.UnitMap`: :func:`removal_chunk`."""
    w = shared
    return removal_chunk(
        w.features, w.labels, recipe=w.recipe, rows=rows, start=w.start, basis=w.basis
    )
