"""Attack metrics on a balanced evaluation set: ROC, AUC, advantage, TPR at low FPR, and the
empirical epsilon lower bound with Clopper–Pearson intervals.

Convention: a larger score means "more likely a member"; a threshold ``t`` flags a member
when ``score >= t``. Everything here is a pure function of arrays.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt
from scipy import stats

from alm_opacus._validation import check_delta
from alm_opacus.attacks.base import BoolArray, EpsilonBoundMethod, FloatArray
from alm_opacus.attacks.intervals import auc_interval, tpr_intervals, tpr_supported
from alm_opacus.attacks.results import TPR_FPR_LEVELS, AttackResult, EpsilonBound, RocCurve

ArrayLike = npt.ArrayLike


def _scores_and_labels(scores: ArrayLike, is_member: ArrayLike) -> tuple[FloatArray, BoolArray]:
    s = np.asarray(scores, dtype=np.float64)
    m = np.asarray(is_member)
    if s.ndim != 1 or m.shape != s.shape:
        raise ValueError(
            f"scores and is_member must be 1-d of one length; got {s.shape}, {m.shape}"
        )
    if m.dtype != np.bool_:
        raise ValueError(f"is_member must be a bool array; got dtype {m.dtype}")
    if np.isnan(s).any():
        raise ValueError(f"scores hold {int(np.isnan(s).sum())} NaN values")
    if m.all() or not m.any():
        raise ValueError("is_member must hold both members and non-members")
    return s, m


def roc_curve(*, scores: ArrayLike, is_member: ArrayLike) -> RocCurve:
    """The full ROC of the rule ``score >= t``, one point per distinct score.

    Args:
        scores: (q,) attack scores, larger = more member-like.
        is_member: (q,) bool ground truth.

    Returns:
        FPR and TPR ascending from (0, 0) to (1, 1), and the thresholds (``+inf`` first),
        as ``sklearn.metrics.roc_curve(..., drop_intermediate=False)`` gives them.

    Raises:
        ValueError: on shape mismatch, NaN scores, or a single class.
    """
    s, m = _scores_and_labels(scores, is_member)
    pos, neg = np.sort(s[m]), np.sort(s[~m])
    # One point per distinct score t (ties move the curve diagonally, not stepwise). Two
    # plain sorts, then their merge: a stable argsort of two sorted runs is timsort's linear
    # merge, and the members before each distinct value count the rest. An argsort carrying
    # the labels was most of a metric attack's fit at 20,000 members (scripts/bench_scale.py),
    # and the unique() and two searches this replaces were half of the ROC's time at 10^4.
    values = np.concatenate([pos, neg])
    order = np.argsort(values, kind="stable")
    merged = values[order]
    first = np.empty(merged.size, dtype=bool)
    first[0] = True
    np.not_equal(merged[1:], merged[:-1], out=first[1:])
    starts = np.flatnonzero(first)  # where each distinct value begins, ascending
    members_below = np.r_[0, np.cumsum(order < pos.size)][starts]
    tps = (pos.size - members_below)[::-1]  # members scored >= t, t descending
    fps = (neg.size - (starts - members_below))[::-1]
    tpr = np.r_[0.0, tps / pos.size]
    fpr = np.r_[0.0, fps / neg.size]
    thresholds = np.r_[np.inf, merged[starts][::-1]]
    return RocCurve(fpr=fpr, tpr=tpr, thresholds=thresholds)


def roc_auc(roc: RocCurve) -> float:
    """Area under the ROC by the trapezoid rule (ties count one half, as in Mann–Whitney U)."""
    return float(np.sum(np.diff(roc.fpr) * (roc.tpr[1:] + roc.tpr[:-1]) / 2))


def advantage(roc: RocCurve) -> float:
    """``max_t |TPR(t) - FPR(t)|`` over the ROC: threshold-free (Yeom et al. 2018, Def. 4)."""
    return float(np.max(np.abs(roc.tpr - roc.fpr)))


def tpr_at_fpr(roc: RocCurve, *, fpr: float) -> float:
    """The largest TPR among the ROC points with ``FPR <= fpr`` (Carlini et al. 2022, Sec. III)."""
    if not 0 <= fpr <= 1:
        raise ValueError(f"fpr={fpr!r} is invalid: expected a number in [0, 1]")
    return float(roc.tpr[roc.fpr <= fpr + 1e-12].max())


def clopper_pearson(
    *, successes: ArrayLike, trials: ArrayLike, confidence: float = 0.95, side: str = "two-sided"
) -> tuple[FloatArray, FloatArray]:
    """Exact (Clopper–Pearson 1934) binomial confidence bounds, via Beta quantiles.

    With ``k`` successes in ``n`` trials, the lower bound is ``Beta(a; k, n - k + 1)`` and the
    upper bound ``Beta(1 - a; k + 1, n - k)``, with ``a = (1 - confidence) / 2`` two-sided and
    ``a = 1 - confidence`` one-sided; the bound on the unused side is 0 or 1.

    Args:
        successes: counts ``k`` (broadcast with ``trials``).
        trials: counts ``n >= 1``.
        confidence: coverage of the interval (two-sided) or of the bound (one-sided).
        side: ``"two-sided"``, ``"upper"`` (returns (0, upper)) or ``"lower"`` (returns (lower, 1)).

    Returns:
        ``(lower, upper)`` as float arrays.

    Raises:
        ValueError: on a bad side, confidence, or counts outside ``0 <= k <= n``, ``n >= 1``.
    """
    k = np.asarray(successes, dtype=np.float64)
    n = np.asarray(trials, dtype=np.float64)
    if side not in ("two-sided", "upper", "lower"):
        raise ValueError(f"side={side!r} is invalid: expected 'two-sided', 'upper' or 'lower'")
    if not 0 < confidence < 1:
        raise ValueError(f"confidence={confidence!r} is invalid: expected a number in (0, 1)")
    if np.any(n < 1) or np.any(k < 0) or np.any(k > n) or np.any(k != np.round(k)):
        raise ValueError(
            f"successes={successes!r}, trials={trials!r}: expected 0 <= k <= n, n >= 1"
        )
    k, n = np.broadcast_arrays(k, n)
    tail = (1 - confidence) / 2 if side == "two-sided" else 1 - confidence
    with np.errstate(invalid="ignore", divide="ignore"):
        lower = np.where(k > 0, stats.beta.ppf(tail, np.maximum(k, 1), n - k + 1), 0.0)
        upper = np.where(k < n, stats.beta.ppf(1 - tail, k + 1, np.maximum(n - k, 1)), 1.0)
    if side == "upper":
        lower = np.zeros_like(upper)
    elif side == "lower":
        upper = np.ones_like(lower)
    return np.asarray(lower, dtype=np.float64), np.asarray(upper, dtype=np.float64)


def epsilon_from_rates(*, fpr: ArrayLike, fnr: ArrayLike, delta: float) -> FloatArray:
    """The smallest epsilon consistent with a test's (FPR, FNR) under (epsilon, delta)-DP.

    Any test between neighbouring datasets satisfies ``FPR + e^eps FNR >= 1 - delta`` and
    ``FNR + e^eps FPR >= 1 - delta`` (Kairouz, Oh & Viswanath 2015, Thm. 2.1), hence
    ``eps >= max(ln((1 - delta - FPR) / FNR), ln((1 - delta - FNR) / FPR), 0)``.
    """
    a = np.asarray(fpr, dtype=np.float64)
    b = np.asarray(fnr, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        e1 = np.where((1 - delta - a > 0) & (b > 0), np.log((1 - delta - a) / b), 0.0)
        e2 = np.where((1 - delta - b > 0) & (a > 0), np.log((1 - delta - b) / a), 0.0)
        # a zero rate (only possible for a point estimate, never for a CP upper bound) means
        # the data cannot bound epsilon at all
        e1 = np.where((b == 0) & (1 - delta - a > 0), np.inf, e1)
        e2 = np.where((a == 0) & (1 - delta - b > 0), np.inf, e2)
    return np.maximum(np.maximum(e1, e2), 0.0)


def epsilon_lower_bound(
    *,
    false_positives: int,
    negatives: int,
    false_negatives: int,
    positives: int,
    delta: float,
    confidence: float = 0.95,
) -> tuple[float, float, float]:
    """Empirical epsilon lower bound from one test's error counts (Jagielski et al. 2020;
    Nasr et al. 2021).

    The FPR and FNR are replaced by one-sided Clopper–Pearson upper bounds, each at level
    ``1 - (1 - confidence) / 2`` so that both hold jointly with probability ``confidence``
    (Bonferroni), and then :func:`epsilon_from_rates` is applied. It is sound only when the
    test (its threshold) was chosen independently of these counts.

    Args:
        false_positives: non-members flagged as members.
        negatives: non-members.
        false_negatives: members not flagged.
        positives: members.
        delta: the delta the release claims.
        confidence: joint confidence of the bound.

    Returns:
        ``(epsilon_lower, fpr_upper, fnr_upper)``.

    Raises:
        ValueError: on counts outside their range, a bad delta or confidence.
    """
    eps, fpr_u, fnr_u = _epsilon_lower_bounds(
        np.asarray([false_positives]),
        negatives,
        np.asarray([false_negatives]),
        positives,
        delta=delta,
        confidence=confidence,
    )
    return float(eps[0]), float(fpr_u[0]), float(fnr_u[0])


def _epsilon_lower_bounds(
    fp: npt.NDArray[np.int64] | FloatArray,
    negatives: int,
    fn: npt.NDArray[np.int64] | FloatArray,
    positives: int,
    *,
    delta: float,
    confidence: float,
) -> tuple[FloatArray, FloatArray, FloatArray]:
    check_delta(delta)
    if not 0 < confidence < 1:
        raise ValueError(f"confidence={confidence!r} is invalid: expected a number in (0, 1)")
    each = 1 - (1 - confidence) / 2
    fpr_u = _upper_bounds(fp, negatives, confidence=each)
    fnr_u = _upper_bounds(fn, positives, confidence=each)
    return epsilon_from_rates(fpr=fpr_u, fnr=fnr_u, delta=delta), fpr_u, fnr_u


def _upper_bounds(
    successes: npt.NDArray[np.int64] | FloatArray, trials: int, *, confidence: float
) -> FloatArray:
    """One-sided Clopper–Pearson upper bounds, read from the table of every count ``0..n``
    (`_upper_table`): a run asks for the same ``n`` and confidence thousands of times (every
    ROC point of every split of every attack), and ``beta.ppf``'s per-call cost was most of
    the split-half bound's. The values are ``clopper_pearson``'s, element for element."""
    counts = np.asarray(successes, dtype=np.float64)
    n = int(trials)
    whole = counts == np.round(counts)
    if n != trials or n < 1 or not np.all(whole & (counts >= 0) & (counts <= n)):
        # anything but counts 0..n of whole trials: computed directly (or refused, as there)
        _, upper = clopper_pearson(
            successes=counts, trials=trials, confidence=confidence, side="upper"
        )
        return np.asarray(upper, dtype=np.float64)
    return _upper_table(n, float(confidence))[counts.astype(np.int64)]


@functools.lru_cache(maxsize=64)
def _upper_table(trials: int, confidence: float) -> FloatArray:
    """One-sided Clopper–Pearson upper bounds of ``k = 0..trials`` successes (read-only)."""
    _, upper = clopper_pearson(
        successes=np.arange(trials + 1), trials=trials, confidence=confidence, side="upper"
    )
    table = np.asarray(upper, dtype=np.float64)
    table.flags.writeable = False
    return table


def best_threshold(*, scores: ArrayLike, is_member: ArrayLike) -> float:
    """The threshold maximising balanced accuracy ``(TPR + TNR) / 2`` on the given data.

    Meant for *shadow* data only. The threshold is the midpoint between the chosen score and
    the next lower one, so that a score between the two classes generalises symmetrically.

    Returns:
        A finite threshold, or ``-inf`` (flag everything) / ``+inf`` (flag nothing).
    """
    roc = roc_curve(scores=scores, is_member=is_member)
    i = int(np.argmax(roc.tpr - roc.fpr))  # Youden's J; i = 0 is "flag nothing"
    if i == 0:
        return math.inf
    # the thresholds are the distinct scores, descending: the next lower score is the next one
    if i + 1 == roc.thresholds.size:
        return -math.inf
    return float((roc.thresholds[i] + roc.thresholds[i + 1]) / 2)


def evaluate_attack(
    *,
    attack: str,
    scores: ArrayLike,
    decisions: ArrayLike,
    is_member: ArrayLike,
    delta: float,
    confidence: float = 0.95,
    method: EpsilonBoundMethod = EpsilonBoundMethod.SPLIT_HALF,
    seed: int = 0,
    seconds: float = 0.0,
    notes: Sequence[str] = (),
    interval_level: float = 0.95,
    interval_resamples: int = 2000,
    intervals: bool = True,
) -> AttackResult:
    """Score one attack on the balanced evaluation set.

    A TPR at FPR ``alpha`` is NaN (with a note) where the evaluation set has fewer than
    ``1 / alpha`` non-members (``intervals.tpr_supported``).

    Args:
        attack: the attack's name (the ``attack`` column).
        scores: (q,) threshold-free scores: ROC, AUC, advantage, TPR at low FPR.
        decisions: (q,) bool membership guesses at the threshold chosen on shadow data:
            ``mia_accuracy``, and the epsilon bound under ``SHADOW_THRESHOLD``.
        is_member: (q,) bool ground truth.
        delta: the release's claimed delta.
        confidence: joint confidence of the epsilon bound.
        method: how the bound's threshold is kept independent of its counts.
        seed: seeds the split of ``SPLIT_HALF`` and the bootstrap of the TPR intervals.
        seconds: time the attack took on this release.
        notes: caveats to carry into the result.
        interval_level: coverage of the AUC and TPR intervals.
        interval_resamples: bootstrap resamples of the TPR intervals.
        intervals: compute the intervals (``False``: NaN; ``aggregate_results`` computes them
            from the kept scores, so a caller that aggregates need not pay twice).

    Returns:
        The :class:`AttackResult`.

    Raises:
        ValueError: on shape mismatches or a single class.
    """
    s, m = _scores_and_labels(scores, is_member)
    d = np.asarray(decisions)
    if d.shape != s.shape or d.dtype != np.bool_:
        raise ValueError(f"decisions must be a bool array of shape {s.shape}; got {d.shape}")
    method = EpsilonBoundMethod(method)
    roc = roc_curve(scores=s, is_member=m)
    if method is EpsilonBoundMethod.SHADOW_THRESHOLD:
        bound = _bound_at_decisions(
            d, m, delta=delta, confidence=confidence, threshold=math.nan, method=method
        )
    else:
        bound = _bound_split_half(s, m, delta=delta, confidence=confidence, seed=seed)
    tprs, tpr_notes = supported_tprs(roc, nonmembers=int((~m).sum()))
    return AttackResult(
        attack=attack,
        mia_accuracy=float(np.mean(d == m)),
        mia_advantage=advantage(roc),
        mia_auc=roc_auc(roc),
        tpr_at_fpr=tprs,
        eps_lower_bound=bound.epsilon,
        epsilon_bound=bound,
        roc=roc,
        num_members=int(m.sum()),
        num_nonmembers=int((~m).sum()),
        seconds=float(seconds),
        notes=(*notes, *tpr_notes),
        auc_ci=auc_interval(s, m, level=interval_level) if intervals else (math.nan, math.nan),
        tpr_ci=tpr_intervals(
            s,
            m,
            levels=TPR_FPR_LEVELS,
            level=interval_level,
            resamples=interval_resamples,
            seed=seed,
        )
        if intervals
        else {},
        scores=s,
        is_member=m,
    )


def supported_tprs(roc: RocCurve, *, nonmembers: int) -> tuple[dict[float, float], list[str]]:
    """TPR at each of :data:`TPR_FPR_LEVELS`, NaN where ``nonmembers`` cannot resolve it."""
    tprs, notes = {}, []
    for level in TPR_FPR_LEVELS:
        if tpr_supported(fpr=level, nonmembers=nonmembers):
            tprs[level] = tpr_at_fpr(roc, fpr=level)
            continue
        tprs[level] = math.nan
        notes.append(
            f"tpr_at_fpr_{level:g} is NaN: the evaluation set has {nonmembers} non-members "
            f"and an FPR of {level:g} needs at least {math.ceil(1 / level - 1e-9):,} (with "
            "fewer, it would be the TPR at zero false positives)"
        )
    return tprs, notes


def _bound_at_decisions(
    d: BoolArray,
    m: BoolArray,
    *,
    delta: float,
    confidence: float,
    threshold: float,
    method: EpsilonBoundMethod,
) -> EpsilonBound:
    fp, neg = int((d & ~m).sum()), int((~m).sum())
    fn, pos = int((~d & m).sum()), int(m.sum())
    eps, fpr_u, fnr_u = epsilon_lower_bound(
        false_positives=fp,
        negatives=neg,
        false_negatives=fn,
        positives=pos,
        delta=delta,
        confidence=confidence,
    )
    return EpsilonBound(
        epsilon=eps,
        fpr_upper=fpr_u,
        fnr_upper=fnr_u,
        false_positives=fp,
        negatives=neg,
        false_negatives=fn,
        positives=pos,
        delta=delta,
        confidence=confidence,
        threshold=threshold,
        method=method.value,
        ceiling=epsilon_bound_ceiling(
            negatives=neg, positives=pos, delta=delta, confidence=confidence
        ),
    )


def epsilon_bound_ceiling(
    *, negatives: int, positives: int, delta: float, confidence: float
) -> float:
    """The largest :func:`epsilon_lower_bound` that ``negatives`` and ``positives`` trials can
    give: the bound of perfect decisions (no false positive, no false negative).

    E.g. 75 + 75 trials at 95% (the split-half bound on 150 + 150 examples) cannot exceed
    2.987 at delta = 0, so they cannot show that a claim of epsilon = 3 or more is violated.
    """
    return epsilon_lower_bound(
        false_positives=0,
        negatives=negatives,
        false_negatives=0,
        positives=positives,
        delta=delta,
        confidence=confidence,
    )[0]


def _bound_split_half(
    s: FloatArray, m: BoolArray, *, delta: float, confidence: float, seed: int
) -> EpsilonBound:
    rng = np.random.default_rng(seed)
    select = np.zeros(s.size, dtype=bool)
    for group in (np.flatnonzero(m), np.flatnonzero(~m)):
        select[rng.permutation(group)[: group.size // 2]] = True
    held = ~select
    if m[select].all() or not m[select].any() or m[held].all() or not m[held].any():
        raise ValueError("the split-half bound needs at least 2 members and 2 non-members")
    # choose on one half: the threshold maximising the same bound computed there ...
    roc = roc_curve(scores=s[select], is_member=m[select])
    pos, neg = int(m[select].sum()), int((~m[select]).sum())
    fp = np.rint(roc.fpr * neg)
    fn = np.rint((1 - roc.tpr) * pos)
    eps, _, _ = _epsilon_lower_bounds(fp, neg, fn, pos, delta=delta, confidence=confidence)
    threshold = float(roc.thresholds[int(np.argmax(eps))])
    # ... and bound on the other half only, so that the selection cannot inflate it
    return _bound_at_decisions(
        s[held] >= threshold,
        m[held],
        delta=delta,
        confidence=confidence,
        threshold=threshold,
        method=EpsilonBoundMethod.SPLIT_HALF,
    )
