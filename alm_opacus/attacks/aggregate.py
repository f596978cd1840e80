"""One cell's attack results over its noise draws: means, intervals, and one pooled audit.

The harness calls :func:`aggregate_results` once per (method, epsilon, seed) cell with the
results of every draw (and of every attacker: names differ by suffix), and
:func:`best_attack` to pick the strongest row.

**The epsilon lower bound is pooled, not averaged.** A mean of per-draw 95% lower bounds is
not a 95% lower bound of anything. :func:`pool_epsilon_bounds` sums the draws' decision
counts (false positives and negatives, and the trials they come from) and bounds once:

* Draws are independent releases, so their counts are independent. Each draw's test
  satisfies ``FPR_r + e^eps FNR_r >= 1 - delta`` and ``FNR_r + e^eps FPR_r >= 1 - delta``
  under an (eps, delta)-DP claim (Kairouz et al. 2015, Thm. 2.1), and averaging these
  linear constraints keeps them for the mean rates ``FPR = mean_r FPR_r`` and ``FNR``.
* The pooled false positives are a sum of independent Bernoulli trials whose rates differ
  between draws. Their sum is less spread than a binomial with the same mean in the lower
  tail (Hoeffding 1956, Thm. 4), so the Clopper–Pearson upper bound on the mean rate keeps
  its coverage: the pooled bound is a valid 95% bound on the mean rates.
* Within one draw the examples share that release's noise, so they are not independent
  trials. That "one run" heuristic is the same one the per-draw bound already rests on
  (``docs/threat_model.md``); pooling adds no assumption to it. For a bound that assumes
  nothing across draws, ``how="bonferroni-max"`` takes the largest per-draw bound, each at
  confidence ``1 - (1 - c) / R`` (a union bound); its ceiling is *lower* than one draw's.

Beside every bound, ``ceiling`` is the largest bound the pooled counts could give (perfect
decisions): where it is below the claimed epsilon, the audit cannot see a violation of the
claim, and the result's notes say so.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import TypeVar

import numpy as np
import torch

from alm_opacus.attacks.base import BoolArray, FloatArray
from alm_opacus.attacks.intervals import auc_interval, shared_tpr_intervals
from alm_opacus.attacks.metrics import epsilon_bound_ceiling, epsilon_lower_bound
from alm_opacus.attacks.results import (
    TPR_FPR_LEVELS,
    AggregateResult,
    AttackResult,
    EpsilonBound,
)
from alm_opacus.attacks.shadow_data import subseed

MEAN_METRICS: tuple[str, ...] = (
    "mia_accuracy",
    "mia_advantage",
    "mia_auc",
    *(f"tpr_at_fpr_{level:g}" for level in TPR_FPR_LEVELS),
)
"""The metrics :class:`AggregateResult` averages over draws."""

POOLING = ("pooled", "bonferroni-max")
_CEILING_NOTE = "eps_lower_bound cannot exceed"


def pool_epsilon_bounds(bounds: Sequence[EpsilonBound], *, how: str = "pooled") -> EpsilonBound:
    """One empirical epsilon lower bound from the bounds of ``R`` independent draws.

    Args:
        bounds: the per-draw bounds (their counts, delta and confidence are used).
        how: ``"pooled"`` (sum the counts, bound once) or ``"bonferroni-max"`` (the largest
            per-draw bound, each at confidence ``1 - (1 - c) / R``). See the module docstring.

    Returns:
        The bound, its summed counts, and its ceiling. For ``bonferroni-max`` the counts and
        rates are those of the draw that gave the largest bound.

    Raises:
        ValueError: on no bounds, an unknown ``how``, or draws with different delta,
            confidence or method.
    """
    if not bounds:
        raise ValueError("bounds is empty: nothing to pool")
    if how not in POOLING:
        raise ValueError(f"how={how!r} is invalid: expected one of {list(POOLING)}")
    first = bounds[0]
    for b in bounds:
        if (b.delta, b.confidence, b.method) != (first.delta, first.confidence, first.method):
            raise ValueError(
                "the draws' bounds differ in delta, confidence or method: "
                f"{(b.delta, b.confidence, b.method)} vs "
                f"{(first.delta, first.confidence, first.method)}"
            )
    r = len(bounds)
    if how == "bonferroni-max":
        return _bonferroni_max(bounds)
    counts = {
        k: sum(getattr(b, k) for b in bounds)
        for k in ("false_positives", "negatives", "false_negatives", "positives")
    }
    eps, fpr_u, fnr_u = epsilon_lower_bound(
        **counts, delta=first.delta, confidence=first.confidence
    )
    return EpsilonBound(
        epsilon=eps,
        fpr_upper=fpr_u,
        fnr_upper=fnr_u,
        **counts,
        delta=first.delta,
        confidence=first.confidence,
        threshold=math.nan,
        method=first.method if r == 1 else f"{first.method}, pooled over {r} draws",
        ceiling=epsilon_bound_ceiling(
            negatives=counts["negatives"],
            positives=counts["positives"],
            delta=first.delta,
            confidence=first.confidence,
        ),
    )


def _bonferroni_max(bounds: Sequence[EpsilonBound]) -> EpsilonBound:
    r, first = len(bounds), bounds[0]
    each = 1 - (1 - first.confidence) / r
    best: EpsilonBound | None = None
    for b in bounds:
        eps, fpr_u, fnr_u = epsilon_lower_bound(
            false_positives=b.false_positives,
            negatives=b.negatives,
            false_negatives=b.false_negatives,
            positives=b.positives,
            delta=b.delta,
            confidence=each,
        )
        if best is None or eps > best.epsilon:
            best = EpsilonBound(
                epsilon=eps,
                fpr_upper=fpr_u,
                fnr_upper=fnr_u,
                false_positives=b.false_positives,
                negatives=b.negatives,
                false_negatives=b.false_negatives,
                positives=b.positives,
                delta=b.delta,
                confidence=first.confidence,
                threshold=b.threshold,
                method=f"{first.method}, max of {r} draws (Bonferroni)",
                ceiling=math.nan,
            )
    assert best is not None
    ceiling = max(
        epsilon_bound_ceiling(
            negatives=b.negatives, positives=b.positives, delta=b.delta, confidence=each
        )
        for b in bounds
    )
    return dataclasses.replace(best, ceiling=ceiling)


def ceiling_note(bound: EpsilonBound, claimed_epsilon: float | None) -> str | None:
    """The caveat for a claim the audit cannot refute, or None."""
    if claimed_epsilon is None or not math.isfinite(claimed_epsilon):
        return None
    if bound.ceiling >= claimed_epsilon:
        return None
    return (
        f"{_CEILING_NOTE} {bound.ceiling:.3f} on this evaluation set "
        f"({bound.positives} + {bound.negatives} trials at {bound.confidence:.0%}), below the "
        f"claimed epsilon {claimed_epsilon:g}: the audit cannot see a violation of the claim, "
        "so a bound below the claim is no evidence that the claim holds"
    )


def aggregate_results(
    results: Sequence[AttackResult],
    *,
    claimed_epsilon: float | None = None,
    pooling: str = "pooled",
    interval_level: float = 0.95,
    interval_resamples: int = 2000,
    seed: int = 0,
) -> list[AggregateResult]:
    """Each attack's metrics over the noise draws of one cell.

    Args:
        results: results of the same attacks on ``R`` independent draws of one release, in
            any order (grouped by ``attack``, first-seen order kept).
        claimed_epsilon: the epsilon the release claims, on the same neighbouring relation as
            the audit (replace-one); adds a note where the bound's ceiling is below it.
        pooling: see :func:`pool_epsilon_bounds`.
        interval_level: coverage of the intervals.
        interval_resamples: bootstrap resamples of the TPR intervals.
        seed: seeds the bootstrap (one set of resamples, shared by the attacks).

    Returns:
        One :class:`AggregateResult` per attack.

    Raises:
        ValueError: if ``results`` is empty, or an attack's draws disagree on the evaluation
            set.
    """
    if not results:
        raise ValueError("results is empty: nothing to aggregate")
    groups: dict[str, list[AttackResult]] = {}
    for result in results:
        groups.setdefault(result.attack, []).append(result)
    scored = {attack: _stacked(attack, group) for attack, group in groups.items()}
    tpr_cis = _shared_tpr_intervals(
        scored, level=interval_level, resamples=interval_resamples, seed=seed
    )
    return [
        _aggregate(
            attack,
            group,
            scored=scored[attack],
            tpr_ci=tpr_cis.get(attack),
            claimed_epsilon=claimed_epsilon,
            pooling=pooling,
            level=interval_level,
        )
        for attack, group in groups.items()
    ]


_Scored = tuple[FloatArray, BoolArray]


def _stacked(attack: str, group: list[AttackResult]) -> _Scored | None:
    """The group's (R, q) scores and their membership, or None where a draw kept none.

    Raises:
        ValueError: if the draws were scored on different examples.
    """
    if not all(r.scores is not None and r.is_member is not None for r in group):
        return None
    member = np.asarray(group[0].is_member)
    if any(not np.array_equal(np.asarray(r.is_member), member) for r in group):
        raise ValueError(f"attack {attack!r}: the draws were scored on different examples")
    return np.stack([np.asarray(r.scores) for r in group]), member


def _shared_tpr_intervals(
    scored: dict[str, _Scored | None], *, level: float, resamples: int, seed: int
) -> dict[str, dict[float, tuple[float, float]]]:
    """Every scored attack's TPR intervals, from one set of bootstrap resamples per
    evaluation set and number of draws (`shared_tpr_intervals`): the attacks of a cell are
    compared on the same resamples, and drawing them, most of the bootstrap's cost, is done
    once instead of once per attack."""
    batches: dict[tuple[tuple[int, ...], bytes], list[tuple[str, FloatArray, BoolArray]]] = {}
    for attack, item in scored.items():
        if item is not None:
            scores, member = item
            key = (scores.shape, member.tobytes())
            batches.setdefault(key, []).append((attack, scores, member))
    out: dict[str, dict[float, tuple[float, float]]] = {}
    for batch in batches.values():
        cis = shared_tpr_intervals(
            [scores for _, scores, _ in batch],
            batch[0][2],
            levels=TPR_FPR_LEVELS,
            level=level,
            resamples=resamples,
            seed=subseed(seed, "aggregate-tpr"),
            threads=torch.get_num_threads(),  # the cell's: one in a small run, all in a large
        )
        out.update(zip([attack for attack, _, _ in batch], cis, strict=True))
    return out


def _aggregate(
    attack: str,
    group: list[AttackResult],
    *,
    scored: _Scored | None,
    tpr_ci: dict[float, tuple[float, float]] | None,
    claimed_epsilon: float | None,
    pooling: str,
    level: float,
) -> AggregateResult:
    values = {c: np.asarray([r.to_row()[c] for r in group], dtype=np.float64) for c in MEAN_METRICS}
    # the draws' own ceiling notes give way to the pooled bound's (its ceiling is higher)
    notes = [
        note
        for note in dict.fromkeys(note for r in group for note in r.notes)
        if not note.startswith(_CEILING_NOTE)
    ]
    if scored is not None and tpr_ci is not None:
        auc_ci = auc_interval(scored[0], scored[1], level=level)
    elif len(group) == 1:
        auc_ci, tpr_ci = group[0].auc_ci, dict(group[0].tpr_ci)
    else:
        auc_ci, tpr_ci = (math.nan, math.nan), {}
        notes.append("no intervals over draws: some results carry no scores")
    bound = pool_epsilon_bounds([r.epsilon_bound for r in group], how=pooling)
    note = ceiling_note(bound, claimed_epsilon)
    if note is not None:
        notes.append(note)
    return AggregateResult(
        attack=attack,
        num_draws=len(group),
        mean={c: float(v.mean()) for c, v in values.items()},
        std={c: float(v.std(ddof=1)) if v.size > 1 else math.nan for c, v in values.items()},
        auc_ci=auc_ci,
        tpr_ci=tpr_ci,
        epsilon_bound=bound,
        notes=tuple(notes),
    )


_R = TypeVar("_R", AttackResult, AggregateResult)


def best_attack(results: Sequence[_R]) -> _R:
    """The strongest attack row: the largest AUC (the mean over draws for aggregates) over
    every attack and attacker given; the first one on ties.

    Raises:
        ValueError: if ``results`` is empty or no row has a finite AUC.
    """
    best: _R | None = None
    best_auc = -math.inf
    for r in results:
        auc = r.mia_auc if isinstance(r, AttackResult) else r.mean["mia_auc"]
        if math.isfinite(auc) and auc > best_auc:
            best, best_auc = r, auc
    if best is None:
        raise ValueError("no result with a finite AUC to choose from")
    return best
