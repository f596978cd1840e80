"""Shadow and reference heads ("banks"), and the shadow data they are trained on.

A :class:`HeadBank` is ``B`` heads trained with the attacker's :data:`ShadowTrainer` on
random halves of one dataset, together with their probabilities on that whole dataset and
the in/out mask. It never sees a target release (except for synthetic data, which Shokri's
Algorithm 1 makes by querying the target).
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor

from alm_opacus.attacks.base import BoolArray, FloatArray, Predictor, ShadowTrainer
from alm_opacus.heads import HeadConfig, Params, batched_logits, train_heads, warm_start
from alm_opacus.unit_map import UnitMap, serial_map


def subseed(seed: int, tag: str) -> int:
    """A 63-bit seed derived from ``seed`` and a tag, so each use draws its own stream."""
    state = np.random.SeedSequence([int(seed) & 0xFFFFFFFF, zlib.crc32(tag.encode())])
    return int(state.generate_state(1, dtype=np.uint64)[0] >> np.uint64(1))


def sized_masks(num_heads: int, num_rows: int, *, size: int, rng: np.random.Generator) -> BoolArray:
    """(B, n) masks: every head takes exactly ``size`` rows, every row is in as many heads as
    the others up to one.

    Heads are filled in turn with the rows used least so far (random among ties), so the
    row counts never differ by more than one. With ``size = n / 2`` and ``B`` even, heads come
    in complementary pairs and every row is in exactly ``B / 2`` heads: Carlini et al.'s
    (2022, Sec. VI-A) balanced assignment, which gives every example ``B/2`` in- and ``B/2``
    out-heads for its per-example Gaussians. Equal head sizes also let a batched trainer
    (DP-SGD's) train all heads of a call at once.

    Raises:
        ValueError: unless ``num_heads >= 1`` and ``1 <= size < num_rows``.
    """
    if num_heads < 1 or not 1 <= size < num_rows:
        raise ValueError(
            f"num_heads={num_heads!r}, num_rows={num_rows!r}, size={size!r}: expected "
            "num_heads >= 1 and 1 <= size < num_rows"
        )
    used = np.zeros(num_rows)
    masks = np.zeros((num_heads, num_rows), dtype=bool)
    for head in range(num_heads):
        # a uniform jitter below 1 breaks ties at random and never reorders distinct counts
        pick = np.argpartition(used + 0.5 * rng.random(num_rows), size - 1)[:size]
        masks[head, pick] = True
        used[pick] += 1
    return masks


@dataclass(frozen=True)
class HeadBank:
    """``B`` heads trained on halves of one dataset.

    Attributes:
        features: (n, d) the bank's dataset.
        labels: (n,) its labels.
        in_mask: (B, n) which rows each head trained on.
        proba: (B, n, C) each head's probabilities on the whole dataset.
        predictors: one predictor per trainer call; concatenated they cover the ``B`` heads.
    """

    features: Tensor
    labels: Tensor
    in_mask: BoolArray
    proba: FloatArray
    predictors: tuple[Predictor, ...]

    @property
    def num_heads(self) -> int:
        return int(self.in_mask.shape[0])

    def predict(self, features: Tensor) -> FloatArray:
        """(B, q, C) probabilities of every head on ``features``."""
        return predict_heads(self.predictors, features)


def predict_heads(predictors: Sequence[Predictor], features: Tensor) -> FloatArray:
    """(B, q, C) probabilities of a bank's heads on ``features``: what an attack that scores
    with the heads keeps of a bank, without its (B, n, C) probabilities."""
    with torch.no_grad():
        parts = [to_numpy(p(features)) for p in predictors]
    return np.concatenate(parts, axis=0)


def to_numpy(proba: Tensor) -> FloatArray:
    return np.asarray(proba.detach().to("cpu", torch.float64).numpy())


@dataclass(frozen=True)
class BankInputs:
    """What every chunk of a bank reads (see :func:`bank_chunk`)."""

    features: Tensor
    labels: Tensor
    masks: BoolArray
    trainer: ShadowTrainer
    heads_per_seed: int


def bank_chunk(shared: BankInputs, unit: tuple[int, int]) -> tuple[Predictor, FloatArray]:
    """One unit of :func:`train_bank`: the heads ``start .. start + heads_per_seed`` of the
    bank, trained by one trainer call seeded ``seed``, with their (h, n, C) probabilities on
    the bank's dataset."""
    start, seed = unit
    # a copy: inputs from an object store are read-only buffers, torch wants writable ones
    chunk = torch.from_numpy(shared.masks[start : start + shared.heads_per_seed].copy())
    predictor = shared.trainer(
        shared.features, shared.labels, chunk.to(shared.features.device), seed
    )
    with torch.no_grad():
        return predictor, to_numpy(predictor(shared.features))


def train_bank(
    *,
    features: Tensor,
    labels: Tensor,
    masks: BoolArray,
    trainer: ShadowTrainer,
    heads_per_seed: int,
    seed: int,
    map_units: UnitMap = serial_map,
) -> HeadBank:
    """Train one head per row of ``masks`` (B, n) on the rows of ``(features, labels)`` it
    selects (see :func:`sized_masks`).

    The trainer is called once per group of ``heads_per_seed`` heads, with a fresh seed each
    time: heads of one call share their initialisation (see ``heads.train_heads``), so groups
    make the references vary in initialisation as the victim's does from theirs. The calls
    are independent units (:func:`bank_chunk`), run by ``map_units`` (default: in this
    process, in order); the bank does not depend on how they run.

    Raises:
        ValueError: if ``masks`` is not (B, n) bool, or the trainer's output has a bad shape.
    """
    num_heads = int(masks.shape[0])
    if masks.ndim != 2 or masks.shape[1] != features.shape[0] or masks.dtype != np.bool_:
        raise ValueError(
            f"masks must be a bool array (B, {features.shape[0]}); got {masks.shape} {masks.dtype}"
        )
    units = [
        (start, subseed(seed, f"bank-init-{start}"))
        for start in range(0, num_heads, heads_per_seed)
    ]
    shared = BankInputs(
        features=features,
        labels=labels,
        masks=masks,
        trainer=trainer,
        heads_per_seed=heads_per_seed,
    )
    parts: list[Any] = list(map_units(bank_chunk, units, shared=shared))
    predictors = [predictor for predictor, _ in parts]
    shapes = [np.shape(p) for _, p in parts]
    heads = sum(shape[0] for shape in shapes if shape)
    if any(len(shape) != 3 or shape[1:] != shapes[0][1:] for shape in shapes) or (
        (heads, shapes[0][1]) != masks.shape
    ):
        raise ValueError(
            f"the trainer's predictor returned shapes {shapes}; expected "
            f"({num_heads}, {features.shape[0]}, C) in all"
        )
    # the chunks copied into one array, each let go once copied: a bank holds its
    # probabilities once plus a chunk, not twice (512 MB each at 5*10^4 members' LiRA bank)
    proba = np.empty((heads, *shapes[0][1:]), dtype=np.result_type(*(p for _, p in parts)))
    start = 0
    for i, (_, chunk) in enumerate(parts):
        proba[start : start + len(chunk)] = chunk
        start += len(chunk)
        parts[i] = None
    return HeadBank(
        features=features,
        labels=labels,
        in_mask=masks,
        proba=proba,
        predictors=tuple(predictors),
    )


def reset_features(features: Tensor, *, fraction: float, rng: np.random.Generator) -> Tensor:
    """Shokri et al. (2017, Sec. IV-C) "noisy real data", for continuous features.

    In each row, ``round(fraction * d)`` coordinates (at least one) chosen at random are reset
    to the same coordinate of another random row of the pool, i.e. redrawn from that
    coordinate's empirical marginal (Shokri flip binary features; resampling is the continuous
    analogue that keeps every coordinate's marginal).
    """
    n, d = features.shape
    k = max(1, round(fraction * d))
    cols = np.argsort(rng.random((n, d)), axis=1)[:, :k]
    donors = rng.integers(n, size=(n, k))
    out = features.clone()
    rows = torch.from_numpy(np.repeat(np.arange(n), k))
    c = torch.from_numpy(cols.reshape(-1))
    out[rows, c] = features[torch.from_numpy(donors.reshape(-1)), c]
    return out


@dataclass(frozen=True)
class SynthesisConfig:
    """Parameters of Shokri et al. (2017) Algorithm 1 (names as in the paper)."""

    per_class: int
    k_max: int
    k_min: int
    conf_min: float
    rej_max: int
    iter_max: int


def synthesize(
    *,
    oracle: Predictor,
    marginals: Tensor,
    num_classes: int,
    config: SynthesisConfig,
    rng: np.random.Generator,
) -> tuple[Tensor, Tensor, int]:
    """Shokri et al. (2017) Algorithm 1: hill-climb records the target classifies confidently.

    All ``num_classes * per_class`` records climb in parallel (one batched query per
    iteration). A random record draws each coordinate from that coordinate's empirical
    marginal in ``marginals`` (the attacker's pool: the algorithm needs a sampling domain for
    continuous features). Per record, as in the paper: a proposal is accepted when the target's
    confidence in the record's class does not drop; an accepted proposal that the target
    classifies as that class with confidence above ``conf_min`` is output with probability
    equal to that confidence; after ``rej_max`` consecutive rejections ``k`` halves (not below
    ``k_min``); each proposal re-draws ``k`` coordinates of the best record so far.

    Returns:
        ``(features, labels, queries)``: the records that were output (records that did not
        converge within ``iter_max`` are dropped), their classes, and the number of records
        sent to the oracle.
    """
    n_pool, d = marginals.shape
    dt = marginals.dtype
    classes = np.repeat(np.arange(num_classes), config.per_class)
    r = classes.size

    def redraw(base: Tensor, k: np.ndarray) -> Tensor:
        cols = np.argsort(rng.random((base.shape[0], d)), axis=1)
        chosen = np.arange(d)[None, :] < k[:, None]  # the first k[i] of a random order
        which = np.zeros_like(chosen)
        np.put_along_axis(which, cols, chosen, axis=1)
        donors = torch.from_numpy(rng.integers(n_pool, size=(base.shape[0], d)))
        fresh = marginals[donors, torch.arange(d)[None, :]]
        return torch.where(torch.from_numpy(which), fresh, base)

    full = np.full(r, d)
    x = redraw(torch.zeros(r, d, dtype=dt), full)
    x_best = x.clone()
    y_best = np.zeros(r)
    rejects = np.zeros(r, dtype=int)
    k = np.full(r, config.k_max)
    active = np.ones(r, dtype=bool)
    out = torch.zeros(r, d, dtype=dt)
    queries = 0
    for _ in range(config.iter_max):
        idx = np.flatnonzero(active)
        if idx.size == 0:
            break
        with torch.no_grad():
            proba = to_numpy(oracle(x[torch.from_numpy(idx)]))
        queries += idx.size
        conf = proba[np.arange(idx.size), classes[idx]]
        accept = conf >= y_best[idx]
        confident = accept & (conf > config.conf_min) & (proba.argmax(1) == classes[idx])
        emit = confident & (rng.random(idx.size) < conf)
        done = idx[emit]
        out[torch.from_numpy(done)] = x[torch.from_numpy(done)]
        active[done] = False
        acc = idx[accept & ~emit]
        x_best[torch.from_numpy(acc)] = x[torch.from_numpy(acc)]
        y_best[acc] = conf[accept & ~emit]
        rejects[acc] = 0
        rej = idx[~accept]
        rejects[rej] += 1
        shrink = rej[rejects[rej] > config.rej_max]
        k[shrink] = np.maximum(config.k_min, np.ceil(k[shrink] / 2)).astype(int)
        rejects[shrink] = 0
        live = np.flatnonzero(active)
        x[torch.from_numpy(live)] = redraw(x_best[torch.from_numpy(live)], k[live])
    kept = ~active
    return (
        out[torch.from_numpy(kept)],
        torch.from_numpy(classes[kept]).to(torch.long),
        queries,
    )


def recipe_trainer(
    *,
    config: HeadConfig,
    num_classes: int,
    protect: Callable[[Params, int], Params] | None = None,
) -> ShadowTrainer:
    """A :data:`ShadowTrainer` that follows the victim's recipe (``heads.train_heads``).

    Args:
        config: the victim's head recipe.
        num_classes: ``C``.
        protect: for the adaptive attacker, ``protect(params, seed) -> params`` applies the
            victim's mechanism (and epsilon) to a batch of heads, with noise drawn per head.

    Returns:
        ``trainer(features, labels, masks, seed) -> predict``, ``predict`` giving (B, q, C).
    """

    def trainer(features: Tensor, labels: Tensor, masks: Tensor, seed: int) -> Predictor:
        # a convex recipe's heads start from the head on all their rows (the same minimisers)
        init = warm_start(features, labels, masks=masks, num_classes=num_classes, config=config)
        params = train_heads(
            features,
            labels,
            masks=masks,
            num_classes=num_classes,
            config=config,
            seed=seed,
            init=init,
        )
        if protect is not None:
            params = protect(params, subseed(seed, "protect"))

        def predict(queries: Tensor) -> Tensor:
            return torch.softmax(batched_logits(params, queries, config=config), dim=-1)

        return predict

    return trainer


def default_k_max(num_features: int) -> int:
    """``k_max`` when unset: half the features (Shokri use 128 of 600 binary features)."""
    return max(1, math.ceil(num_features / 2))
