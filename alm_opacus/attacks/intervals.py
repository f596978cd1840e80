"""95% intervals for the attack metrics over the evaluation set, per release and over draws.

* **AUC: DeLong et al. (1988).** The AUC is a two-sample U-statistic; its variance is
  estimated from the structural components ``V10(x_i)`` (the share of non-members scored below
  member ``i``, ties 1/2) and ``V01(y_j)`` (the share of members scored above non-member
  ``j``): ``Var = S10 / m + S01 / n`` with ``S`` the sample variances (DeLong, DeLong &
  Clarke-Pearson 1988, Sec. 2; the midrank algorithm of Sun & Xu 2014, Eq. 9-11). The
  interval is ``AUC +- z * sqrt(Var)``, clipped to [0, 1].
* **TPR at a fixed FPR: stratified bootstrap.** Members and non-members are resampled with
  replacement, each within its own group (the evaluation set is balanced by design), and the
  2.5% and 97.5% percentiles of the resampled TPRs are the interval. ``AttackConfig.
  interval_resamples`` (default 2,000) resamples: the tails then hold 50 resamples each, and
  on evaluation sets of the default digits size the endpoints' Monte Carlo sd over bootstrap
  seeds is about one TPR step (1/150), a few % of the interval's width
  (``tests/attacks/test_attack_intervals.py``).
* **Over R noise draws** (one release per draw, the same evaluation examples): the reported
  value is the mean over draws, and its interval covers both sources of error. The AUC's
  variance is DeLong's on the draw-averaged kernel (the mean over draws of AUCs is itself a
  U-statistic of the examples, with ``V10`` and ``V01`` averaged over draws) plus the
  between-draw variance over ``R`` (law of total variance; the between-draw term also holds
  a little evaluation noise, so the sum errs on the wide side). The TPR's bootstrap resamples
  the draws with replacement and, within a resample, applies one resample of the examples to
  every draw (they share the examples).

A TPR at FPR ``alpha`` is reported only where the evaluation set has at least ``1 / alpha``
non-members: with fewer, FPR moves in steps larger than ``alpha`` and the value is the TPR at
zero false positives, which says nothing about ``alpha`` (:func:`tpr_supported`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
from scipy import stats

from alm_opacus.attacks.base import BoolArray, FloatArray


def tpr_supported(*, fpr: float, nonmembers: int) -> bool:
    """Whether ``nonmembers`` non-members can resolve an FPR of ``fpr`` (``n * fpr >= 1``)."""
    return nonmembers * fpr >= 1 - 1e-9


def delong_components(scores: FloatArray, is_member: BoolArray) -> tuple[FloatArray, FloatArray]:
    """DeLong's structural components from midranks (Sun & Xu 2014, Eq. 9-10).

    Args:
        scores: (..., q) scores, larger = more member-like (leading axes: draws).
        is_member: (q,) bool.

    Returns:
        ``(v10, v01)``: (..., m) for members and (..., n) for non-members; the AUC is
        ``v10.mean(-1)``.
    """
    pos, neg = scores[..., is_member], scores[..., ~is_member]
    m, n = pos.shape[-1], neg.shape[-1]
    joint = stats.rankdata(np.concatenate([pos, neg], axis=-1), axis=-1)
    t_pos = stats.rankdata(pos, axis=-1)
    t_neg = stats.rankdata(neg, axis=-1)
    v10 = (joint[..., :m] - t_pos) / n
    v01 = 1.0 - (joint[..., m:] - t_neg) / m
    return v10, v01


def delong_variance(v10: FloatArray, v01: FloatArray) -> float:
    """``S10 / m + S01 / n`` for (m,) and (n,) components (DeLong et al. 1988)."""
    return float(v10.var(ddof=1) / v10.size + v01.var(ddof=1) / v01.size)


def auc_interval(
    scores: FloatArray, is_member: BoolArray, *, level: float = 0.95
) -> tuple[float, float]:
    """DeLong interval of one release's AUC (or, for (R, q) scores, of the mean over draws).

    Args:
        scores: (q,) scores, or (R, q) for ``R`` noise draws on the same examples.
        is_member: (q,) bool.
        level: coverage.

    Returns:
        ``(low, high)`` within [0, 1].
    """
    s = np.atleast_2d(np.asarray(scores, dtype=np.float64))
    if min(int(is_member.sum()), int((~is_member).sum())) < 2:
        return math.nan, math.nan  # a sample variance needs two of each
    v10, v01 = delong_components(s, is_member)
    aucs = v10.mean(-1)
    variance = delong_variance(v10.mean(0), v01.mean(0))
    if s.shape[0] > 1:  # independent draws: their spread, over R, on top
        variance += float(aucs.var(ddof=1)) / s.shape[0]
    half = stats.norm.ppf(0.5 + level / 2) * math.sqrt(max(variance, 0.0))
    centre = float(aucs.mean())
    return float(max(0.0, centre - half)), float(min(1.0, centre + half))


def tpr_at_fprs(
    pos: FloatArray, neg: FloatArray, levels: tuple[float, ...]
) -> dict[float, FloatArray]:
    """TPR at each FPR for a batch of score sets, as ``metrics.tpr_at_fpr`` defines it.

    With ``k = floor(alpha * n)`` false positives allowed, the best threshold lies just above
    the (k+1)-th largest non-member score ``v``, so TPR = share of members scored above ``v``.

    Args:
        pos: (..., m) member scores; neg: (..., n) non-member scores.

    Returns:
        level -> (...) TPRs.
    """
    n = neg.shape[-1]
    ks = {level: math.floor(level * n + 1e-12 * n) for level in levels}
    inside = sorted({k for k in ks.values() if k < n})
    # the (k+1)-th largest non-member score for every k at once, without a full sort
    ranked = -np.partition(-neg, inside, axis=-1) if inside else neg
    out = {}
    for level, k in ks.items():
        if k >= n:
            out[level] = np.ones(pos.shape[:-1])
            continue
        out[level] = (pos > ranked[..., k : k + 1]).mean(-1)
    return out


def tpr_intervals(
    scores: FloatArray,
    is_member: BoolArray,
    *,
    levels: tuple[float, ...],
    level: float = 0.95,
    resamples: int = 2000,
    seed: int = 0,
) -> dict[float, tuple[float, float]]:
    """Percentile-bootstrap intervals of TPR at each FPR in ``levels``.

    Args:
        scores: (q,) scores, or (R, q) for ``R`` noise draws on the same examples (the mean
            over draws is bootstrapped, draws resampled too).
        is_member: (q,) bool.
        levels: the FPRs.
        level: coverage.
        resamples: bootstrap resamples.
        seed: seeds the resampling.

    Returns:
        FPR -> ``(low, high)``; ``(nan, nan)`` where :func:`tpr_supported` is false.
    """
    (out,) = shared_tpr_intervals(
        [scores], is_member, levels=levels, level=level, resamples=resamples, seed=seed
    )
    return out


def shared_tpr_intervals(
    score_sets: Sequence[FloatArray],
    is_member: BoolArray,
    *,
    levels: tuple[float, ...],
    level: float = 0.95,
    resamples: int = 2000,
    seed: int = 0,
    threads: int = 1,
) -> list[dict[float, tuple[float, float]]]:
    """:func:`tpr_intervals` of several attacks' scores on one evaluation set, all from the
    same bootstrap resamples (common random numbers): each set's intervals are those
    :func:`tpr_intervals` gives it with this ``seed``, and the resamples, most of the cost,
    are drawn once for all of them.

    Args:
        score_sets: each (q,) or (R, q), with the same ``R``.
        is_member, levels, level, resamples, seed: as :func:`tpr_intervals`.
        threads: split the sets among this many threads, each drawing the same resamples
            from ``seed`` (the same intervals; numpy releases the GIL in its loops).

    Raises:
        ValueError: if the sets differ in their number of draws or examples.
    """
    sets = [np.atleast_2d(np.asarray(s, dtype=np.float64)) for s in score_sets]
    if len({s.shape for s in sets}) > 1:
        shapes = sorted({s.shape for s in sets})
        raise ValueError(f"score sets of shapes {shapes}: expected one (R, q) shape")
    threads = min(threads, len(sets))
    if threads > 1:
        groups = [list(range(i, len(sets), threads)) for i in range(threads)]

        def part(group: list[int]) -> list[dict[float, tuple[float, float]]]:
            chosen = [sets[i] for i in group]
            return shared_tpr_intervals(
                chosen, is_member, levels=levels, level=level, resamples=resamples, seed=seed
            )

        with ThreadPoolExecutor(max_workers=threads) as pool:
            parts = list(pool.map(part, groups))
        merged: dict[int, dict[float, tuple[float, float]]] = {}
        for group, found in zip(groups, parts, strict=True):
            merged.update(zip(group, found, strict=True))
        return [merged[i] for i in range(len(sets))]
    pos_idx, neg_idx = np.flatnonzero(is_member), np.flatnonzero(~is_member)
    supported = tuple(lv for lv in levels if tpr_supported(fpr=lv, nonmembers=neg_idx.size))
    outs = [{lv: (math.nan, math.nan) for lv in levels} for _ in sets]
    if not supported or not sets:
        return outs
    draws = sets[0].shape[0]
    rng = np.random.default_rng(seed)
    tail = (1 - level) / 2
    m, n = pos_idx.size, neg_idx.size
    ks = {lv: math.floor(lv * n + 1e-12 * n) for lv in supported}
    ranked_sets = [_Ranked.of(s[:, pos_idx], s[:, neg_idx]) for s in sets]
    stats_by_level: list[dict[float, list[FloatArray]]] = [{lv: [] for lv in ks} for _ in sets]
    # A resample is a multiset: counts per example. The (k+1)-th largest resampled
    # non-member score is the first of a draw's ranked scores whose running count reaches
    # k + 1 (only the top few are read), and the TPR counts the resampled members above it:
    # the statistic of materialised resamples, in O(q) per resample instead of O(R q log q).
    chunk = bootstrap_chunk(m, n)
    starts = range(0, resamples, chunk)
    # The counts are drawn chunk by chunk (each scatter in cache), then read a group of chunks
    # at a time: at 5*10^4 examples a chunk is 2 resamples, and reading them one chunk at a
    # time cost a Python loop over attacks, draws and levels per 2 resamples. Row by row the
    # same values: the same draws in the same order, each resample's statistic its own row's.
    per_read = max(1, GROUP_ELEMENTS // (chunk * max(m, n)))
    for first in range(0, len(starts), per_read):
        drawn = []
        for start in starts[first : first + per_read]:
            b = min(chunk, resamples - start)
            which = rng.integers(draws, size=(b, draws)) if draws > 1 else np.zeros((b, 1), int)
            pos = _counts(rng.integers(m, size=(b, m)), m)
            drawn.append((which, pos, _counts(rng.integers(n, size=(b, n)), n)))
        which, pos_counts, neg_counts = (np.concatenate(part) for part in zip(*drawn, strict=True))
        for ranked, stats_of in zip(ranked_sets, stats_by_level, strict=True):
            tpr = ranked.resampled_tprs(pos_counts, neg_counts, ks)
            for lv in ks:
                stats_of[lv].append(np.take_along_axis(tpr[lv], which, axis=1).mean(-1))
    for out, stats_of in zip(outs, stats_by_level, strict=True):
        for lv in supported:
            low, high = np.quantile(np.concatenate(stats_of[lv]), [tail, 1 - tail])
            out[lv] = (float(low), float(high))
    return outs


@dataclass(frozen=True)
class _Ranked:
    """One attack's scores ranked for the bootstrap: each draw's non-members and members,
    best first, as positions (``order``) and values (``ranked``)."""

    order: npt.NDArray[np.int64]
    ranked: FloatArray
    pos_order: npt.NDArray[np.int64]
    pos_ranked: FloatArray

    @classmethod
    def of(cls, pos: FloatArray, neg: FloatArray) -> _Ranked:
        order = np.argsort(-neg, axis=1, kind="stable")
        pos_order = np.argsort(-pos, axis=1, kind="stable")
        return cls(
            order=order,
            ranked=np.take_along_axis(neg, order, axis=1),
            pos_order=pos_order,
            pos_ranked=np.take_along_axis(pos, pos_order, axis=1),
        )

    def resampled_tprs(
        self,
        pos_counts: npt.NDArray[np.int64],
        neg_counts: npt.NDArray[np.int64],
        ks: dict[float, int],
    ) -> dict[float, FloatArray]:
        """Per level, the (b, R) TPRs of ``b`` resamples (their counts) on each draw."""
        b, m = pos_counts.shape
        n = neg_counts.shape[1]
        draws = self.ranked.shape[0]
        tpr = {lv: np.ones((b, draws)) for lv in ks}
        for r in range(draws):
            # members strictly above each level's threshold: a prefix of the ranked members
            aboves = {}
            for lv, k in ks.items():
                if k < n:
                    threshold = self.ranked[r, _first_reaching(neg_counts, self.order[r], k + 1)]
                    aboves[lv] = np.searchsorted(-self.pos_ranked[r], -threshold, side="left")
            if not aboves:
                continue
            # resampled members at or above each ranked member score, as far as any prefix
            # reaches (at a low FPR a prefix is a small part of the members)
            width = max(1, max(int(a.max()) for a in aboves.values()))
            cumulative = np.cumsum(pos_counts[:, self.pos_order[r, :width]], axis=1)
            for lv, above in aboves.items():
                tpr[lv][:, r] = (
                    np.where(above > 0, cumulative[np.arange(b), np.maximum(above - 1, 0)], 0) / m
                )
        return tpr


#: Elements of each (resamples, examples) array of a bootstrap chunk: 1 MiB of int64, inside a
#: core's L2 cache. With 2^22 (32 MiB) the scatter of the counts ran from memory once q passed a
#: few thousand, and the cost per example doubled between q = 2,000 and 10,000
#: (scripts/bench_scale.py's metric-attacks stage grew as n^1.4 there).
CHUNK_ELEMENTS = 2**17
#: Elements of each (resamples, examples) array the bootstrap reads at once: chunks grouped up
#: to 16 MiB of int64 (:func:`shared_tpr_intervals`).
GROUP_ELEMENTS = 2**21


def bootstrap_chunk(m: int, n: int) -> int:
    """Resamples per chunk of :func:`tpr_intervals` with ``m`` members and ``n`` non-members:
    a working set that stays in cache whatever ``q``, so the cost per example is constant."""
    return max(1, min(500, CHUNK_ELEMENTS // max(m, n)))


def _counts(draws: npt.NDArray[np.int64], size: int) -> npt.NDArray[np.int64]:
    """(b, size) counts of each value in each row of ``draws`` (b, k)."""
    b = draws.shape[0]
    flat = (draws + size * np.arange(b)[:, None]).ravel()
    return np.bincount(flat, minlength=b * size).reshape(b, size)


def _first_reaching(
    counts: npt.NDArray[np.int64], order: npt.NDArray[np.int64], target: int
) -> npt.NDArray[np.int64]:
    """Per row of ``counts``, the first position ``j`` of ``order`` with
    ``counts[order[:j + 1]].sum() >= target`` (``target`` <= the row's total)."""
    width = min(order.size, 2 * target + 64)  # the target is almost always reached here
    running = np.cumsum(counts[:, order[:width]], axis=1)
    short = running[:, -1] < target
    if short.any():  # the rare rest: the whole order
        running = np.cumsum(counts[:, order], axis=1)
    return np.argmax(running >= target, axis=1)
