"""The verdict in words: the recommendation sentence and its caveats, from the computed
facts only (:mod:`alm_opacus.report.verdict` states the rule)."""

from __future__ import annotations

import math
from collections.abc import Sequence

from alm_opacus.report.series import (
    WEAK_DELTA_UNKNOWN_N,
    WEAK_EPSILON,
    Stat,
    format_epsilon,
    format_stat,
)
from alm_opacus.report.verdict_types import (
    DP_KINDS,
    Comparison,
    MethodVerdict,
    Outcome,
    Pick,
    intervals_overlap,
)

__all__ = [
    "comparison_caveat",
    "interval_caveats",
    "join_names",
    "meaningful_words",
    "no_leak_caveats",
    "not_dp_caveat",
    "sentence_of",
]

#: Not-DP kinds in words, for the caveats.
_NOT_DP_WORDS = {
    "random-dp": "random-DP",
    "per-query": "per-query DP (the model as a whole is not DP)",
    "none": "without a guarantee",
}


def _auc(stat: Stat) -> str:
    return format_stat(stat, digits=2)


def _where(pick: Pick) -> str:
    """``ε′ = 2 (ε = 1)``, or ``ε′ = 10`` where the two coincide."""
    shown = f"ε′ = {pick.epsilon_common:.3g}"
    if not math.isclose(pick.epsilon_common, pick.epsilon):
        shown += f" (ε = {format_epsilon(pick.epsilon)})"
    return shown


def meaningful_words(members: int | None) -> str:
    line = f"1/{members}" if members else f"{WEAK_DELTA_UNKNOWN_N:g}"
    return f"a meaningful guarantee (ε′ ≤ {WEAK_EPSILON:g}, δ′ ≤ {line})"


def _against(baseline: float) -> str:
    return "" if math.isnan(baseline) else f" against {baseline:.2f} unprotected"


def join_names(items: Sequence[str]) -> str:
    if len(items) <= 1:
        return "".join(items)
    return ", ".join(items[:-1]) + " and " + items[-1]


def interval_caveats(named: Sequence[Pick]) -> list[str]:
    """Whether the AUC intervals of the points named overlap, pair by pair."""
    if len(named) < 2:
        return []
    out = []
    overlapping = []
    for i, a in enumerate(named):
        for b in named[i + 1 :]:
            if intervals_overlap(a.auc, b.auc):
                overlapping.append((a, b))
            else:
                low, high = (a, b) if a.auc.high < b.auc.low else (b, a)
                out.append(
                    f"{low.method}'s AUC interval at {_where(low)} ({_auc(low.auc)}) lies below "
                    f"{high.method}'s at {_where(high)} ({_auc(high.auc)}): {low.method} leaks "
                    "less at these points."
                )
    if overlapping:
        shown = join_names(
            list(dict.fromkeys(f"{p.method} {_auc(p.auc)}" for pair in overlapping for p in pair))
        )
        out.insert(
            0,
            f"The AUC intervals of the points named overlap ({shown}): differences within the "
            "intervals are not differences.",
        )
    return out


def comparison_caveat(found: Comparison) -> str:
    head = (
        f"At equal utility (accuracy {found.accuracy:.2f}, interpolated between measured "
        f"points) {found.method}'s AUC is {_auc(found.auc)} and {found.other}'s "
        f"{_auc(found.other_auc)}"
    )
    if found.separated:
        return f"{head}: {found.leaks_less} leaks less."
    return f"{head}: the intervals overlap, so neither is shown to leak less."


def no_leak_caveats(named: Sequence[Pick], band: Stat | None) -> list[str]:
    if band is None:
        return [
            "This run has no no-leak reference, so an AUC a little above 0.5 may be the "
            "maximum over attacks rather than leakage."
        ]
    out = []
    inside = [p for p in named if p.inside_no_leak]
    above = [p for p in named if p.inside_no_leak is False]
    where = f"the no-leak band [{band.low:.2f}, {band.high:.2f}]"
    if inside:
        out.append(
            f"{join_names([f'{p.method} at {_where(p)} (AUC {p.auc.mean:.2f})' for p in inside])} "
            f"{'lies' if len(inside) == 1 else 'lie'} inside {where}: indistinguishable from a "
            "release that never saw the members."
        )
    if above:
        out.append(
            f"{join_names([f'{p.method} at {_where(p)} (AUC {p.auc.mean:.2f})' for p in above])} "
            f"{'lies' if len(above) == 1 else 'lie'} outside {where}: the attacks tell its "
            "members apart."
        )
    return out


def not_dp_caveat(found: MethodVerdict, baseline: float) -> str:
    kinds = [k for k in found.kinds if k not in DP_KINDS]
    words = " / ".join(_NOT_DP_WORDS.get(k, k) for k in kinds) or "not DP"
    head = f"{found.method}'s rows are {words}, not DP"
    pick = found.best_not_dp
    if pick is None:
        return f"{head}, and none has ε′ ≤ {WEAK_EPSILON:g} with a small δ′."
    useful = " (useful)" if pick.useful else ""
    return (
        f"{head}: at ε′ ≤ {WEAK_EPSILON:g} its best accuracy is {pick.accuracy:.2f}{useful} at "
        f"{_where(pick)}{_against(baseline)}, AUC {_auc(pick.auc)}."
    )


def sentence_of(
    outcome: Outcome,
    *,
    ranked: Sequence[Pick],
    verdicts: Sequence[MethodVerdict],
    members: int | None,
    baseline: float,
    line: float,
) -> str:
    meaningful = meaningful_words(members)
    at = f"At {meaningful}"
    if outcome is Outcome.NO_RESULTS:
        return "No protected release of this run finished, so there is nothing to recommend."
    if outcome is Outcome.NO_DP:
        kinds = join_names(
            [f"{v.method}: {'/'.join(v.kinds)}" for v in verdicts if not v.infeasible]
        )
        return (
            f"No method in this run gives a DP guarantee ({kinds}), so none can be recommended "
            f"at {meaningful}."
        )
    if outcome is Outcome.NO_MEANINGFUL:
        return (
            f"No row of this run has {meaningful}: every DP row is weak, so none can be "
            "recommended."
        )
    top = ranked[0]
    if outcome is Outcome.NO_BASELINE:
        return (
            f"{at} the best accuracy is {top.method}'s {top.accuracy:.2f} at {_where(top)} (AUC "
            f"{_auc(top.auc)}); without the unprotected head (method none) this run cannot say "
            "whether that is useful."
        )
    useful_line = f"useful: ≥ {line:.2f}"
    if outcome is Outcome.NONE_USEFUL:
        return (
            f"{at} no method keeps useful accuracy on this data: the best is {top.method} at "
            f"{_where(top)} with accuracy {top.accuracy:.2f}{_against(baseline)} "
            f"({useful_line})."
        )
    useful = [p for p in ranked if p.useful]
    if outcome is Outcome.ONE_USEFUL:
        return (
            f"{at} only {top.method} keeps useful accuracy: {top.accuracy:.2f} at {_where(top)}"
            f"{_against(baseline)} ({useful_line}), with the strongest attack's AUC "
            f"{_auc(top.auc)} there."
        )
    listed = "; ".join(
        f"{p.method} {p.accuracy:.2f} at {_where(p)}, AUC {_auc(p.auc)}" for p in useful
    )
    return (
        f"{at} {len(useful)} methods keep useful accuracy ({useful_line}; unprotected "
        f"{baseline:.2f}): the best is {top.method}, then in order {listed}."
    )
