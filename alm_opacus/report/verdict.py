"""The verdict of a run: which protection to choose, computed from the results, never typed.

One pure function, :func:`decide`, reads the run's rows and returns a :class:`Verdict`: per
method the best utility it reaches at a meaningful guarantee, one recommendation sentence,
and its caveats. Every view (the printed table, ``report.html``) shows the same verdict and
marks the (method, ε) rows it cites (:attr:`Verdict.cited`: per method, the point it
reports).

**The rule.**

* A *meaningful guarantee* is a row whose guarantee, compared under replace-one, is DP
  (:data:`DP_KINDS`: ``pure-dp`` or ``approx-dp``, ``Point.common_guarantee``) and not weak
  (``series.is_weak`` for the run's n members): ε′ ≤ ``series.WEAK_EPSILON`` (10) and
  δ′ ≤ 1/n (``series.WEAK_DELTA_UNKNOWN_N`` where n is not known). It is the rule the table's
  ``*`` mark uses. A random-DP row (a sampled sensitivity, Rubinstein & Aldà 2017) is never a
  guarantee; per-query rows, and rows whose conversion to replace-one proves nothing, neither.
* Per method (``series.points``: the no-leak reference is no method), its *best* point is the
  one with the highest mean test accuracy among its meaningful rows (ties: the smaller ε′),
  with that point's strongest-attack AUC and 95% interval. A method with no DP row at all
  (e.g. ALM with a sampled sensitivity) gets instead its best accuracy among the rows that
  pass the same ε′, δ′ line (:attr:`MethodVerdict.best_not_dp`), reported apart and named
  "not DP".
* *Useful accuracy* keeps at least :data:`USEFUL_FRACTION` (one half) of the unprotected
  head's gain over chance: acc ≥ chance + USEFUL_FRACTION · (acc(none) − chance), chance
  = 1 / number of classes (0 where the count is unknown, said in a caveat). Without the
  unprotected head (method ``none``) usefulness is undefined and the verdict says so.
* The recommendation (:class:`Outcome`) follows, in this order: no finished release; no
  method with a DP row; no meaningful row; no baseline; else none, one, or several methods
  useful at a meaningful guarantee.
* The caveats, from computed facts only: the not-DP methods and their best accuracy; whether
  the AUC intervals of the points named overlap ("differences within the intervals are not
  differences") or separate; an equal-utility comparison (:class:`Comparison`) between the
  named method and every other method whose accuracies reach a common level; where the run
  has the no-leak reference (``series.no_leak``), whether each named point's AUC lies inside
  its 95% interval, the *no-leak band*; methods without a meaningful or feasible row.

The equal-utility comparison interpolates each method's AUC (mean and interval bounds)
linearly against its mean accuracy, between measured points (of points with equal accuracy,
the one with the smaller ε′), at the highest accuracy both methods reach (so one side is a
measured point); the methods differ there only when the intervals separate.
"""

from __future__ import annotations

import math
import textwrap
from collections.abc import Sequence

import numpy as np

from alm_opacus.report.results import BASELINE, ResultRow
from alm_opacus.report.series import (
    Point,
    Stat,
    cells,
    is_infeasible,
    is_weak,
    no_leak,
    points,
)
from alm_opacus.report.verdict_types import (
    DP_KINDS,
    USEFUL_FRACTION,
    Comparison,
    MethodVerdict,
    Outcome,
    Pick,
    Verdict,
    intervals_overlap,
)
from alm_opacus.report.verdict_words import (
    comparison_caveat,
    interval_caveats,
    join_names,
    meaningful_words,
    no_leak_caveats,
    not_dp_caveat,
    sentence_of,
)

# The verdict's types and its words live in verdict_types and verdict_words; the public
# names stay importable from here.
__all__ = [
    "DP_KINDS",
    "USEFUL_FRACTION",
    "Comparison",
    "MethodVerdict",
    "Outcome",
    "Pick",
    "Verdict",
    "decide",
    "format_verdict",
    "useful_accuracy",
]


#: The outcome for 0, 1 and 2 or more methods useful at a meaningful guarantee.
_BY_COUNT = (Outcome.NONE_USEFUL, Outcome.ONE_USEFUL, Outcome.SEVERAL_USEFUL)


def useful_accuracy(*, baseline: float, chance: float) -> float:
    """The useful-accuracy line: chance + :data:`USEFUL_FRACTION` · (baseline − chance)."""
    return chance + USEFUL_FRACTION * (baseline - chance)


def _is_dp(point: Point) -> bool:
    return point.common_guarantee in DP_KINDS


def _pick(point: Point, *, line: float, band: Stat | None) -> Pick:
    accuracy = point.test_accuracy.mean
    inside = None
    if band is not None:
        inside = bool(band.low <= point.mia_auc.mean <= band.high)
    return Pick(
        method=point.method,
        epsilon=point.epsilon,
        guarantee=point.common_guarantee,
        epsilon_common=point.epsilon_common,
        delta_common=point.delta_common,
        accuracy=accuracy,
        auc=point.mia_auc,
        eps_lower_bound=point.eps_lower_bound,
        useful=None if math.isnan(line) else bool(accuracy >= line),
        inside_no_leak=inside,
    )


def _best(found: Sequence[Point]) -> Point | None:
    usable = [p for p in found if not math.isnan(p.test_accuracy.mean)]
    if not usable:
        return None
    return max(usable, key=lambda p: (p.test_accuracy.mean, -p.epsilon_common))


def _method_verdict(
    method: str,
    found: Sequence[Point],
    *,
    members: int | None,
    line: float,
    band: Stat | None,
) -> MethodVerdict:
    def strong(p: Point) -> bool:
        return not math.isinf(p.epsilon_common) and not is_weak(
            epsilon=p.epsilon_common, delta=p.delta_common, members=members
        )

    dp = any(_is_dp(p) for p in found)
    best = _best([p for p in found if _is_dp(p) and strong(p)])
    not_dp = None
    if not dp:
        not_dp = _best([p for p in found if p.common_guarantee != "none" and strong(p)])
    return MethodVerdict(
        method=method,
        kinds=tuple(dict.fromkeys(p.common_guarantee for p in found)),
        dp=dp,
        best=None if best is None else _pick(best, line=line, band=band),
        best_not_dp=None if not_dp is None else _pick(not_dp, line=line, band=band),
        infeasible=not found,
    )


def _curve(found: Sequence[Point]) -> np.ndarray:
    """(accuracy, auc, low, high) rows sorted by accuracy; of points with equal accuracy the
    one with the smaller ε′ stays (the one a user would choose)."""
    by_accuracy: dict[float, Point] = {}
    for p in found:
        acc = p.test_accuracy.mean
        if math.isnan(acc) or math.isnan(p.mia_auc.mean):
            continue
        if acc not in by_accuracy or p.epsilon_common < by_accuracy[acc].epsilon_common:
            by_accuracy[acc] = p
    ordered = sorted(by_accuracy.items())
    return np.array(
        [[acc, p.mia_auc.mean, p.mia_auc.low, p.mia_auc.high] for acc, p in ordered], dtype=float
    ).reshape(-1, 4)


def _at(curve: np.ndarray, accuracy: float, kind: str) -> Stat:
    values = [float(np.interp(accuracy, curve[:, 0], curve[:, k])) for k in (1, 2, 3)]
    return Stat(values[0], values[1], values[2], kind)


def _compare(method: str, other: str, by_method: dict[str, list[Point]]) -> Comparison | None:
    mine, theirs = _curve(by_method[method]), _curve(by_method[other])
    if not len(mine) or not len(theirs):
        return None
    level = min(mine[-1, 0], theirs[-1, 0])
    if level < max(mine[0, 0], theirs[0, 0]):
        return None  # no accuracy both reach
    kind = "ci95" if all(p.mia_auc.kind == "ci95" for p in by_method[method]) else "std"
    auc = _at(mine, level, kind)
    kind = "ci95" if all(p.mia_auc.kind == "ci95" for p in by_method[other]) else "std"
    other_auc = _at(theirs, level, kind)
    separated = not intervals_overlap(auc, other_auc)
    lower = None
    if separated:
        lower = method if auc.high < other_auc.low else other
    return Comparison(
        method=method,
        other=other,
        accuracy=level,
        auc=auc,
        other_auc=other_auc,
        separated=separated,
        leaks_less=lower,
    )


def decide(rows: Sequence[ResultRow], *, members: int | None, num_classes: int | None) -> Verdict:
    """The verdict of a run's rows (the rule is the module docstring's).

    Args:
        rows: the run's ``results.csv`` rows (every method, seed and attack; infeasible cells
            and the no-leak reference included).
        members: members in the private split, n (the weak-δ line is 1/n); None: unknown.
        num_classes: the number of classes (chance accuracy is 1 / num_classes); None:
            unknown, chance taken as 0.

    Returns:
        The :class:`Verdict`: its outcome, the per-method facts, the sentence and caveats,
        and the rows it cites.
    """
    chance = 1.0 / num_classes if num_classes else 0.0
    found = points(rows)
    by_method: dict[str, list[Point]] = {}
    for p in found:
        by_method.setdefault(p.method, []).append(p)
    base = by_method.pop(BASELINE, [])
    baseline = base[0].test_accuracy.mean if base else math.nan
    line = math.nan if math.isnan(baseline) else useful_accuracy(baseline=baseline, chance=chance)
    reference = no_leak(rows)
    band = None if reference is None else reference.mia_auc
    names = list(dict.fromkeys(m for (m, _, _) in cells(rows) if m not in (BASELINE,)))
    names = [m for m in names if m in by_method or _all_infeasible(rows, m)]
    verdicts = [
        _method_verdict(m, by_method.get(m, []), members=members, line=line, band=band)
        for m in names
    ]
    ranked = sorted(
        (v.best for v in verdicts if v.best is not None),
        key=lambda p: (-p.accuracy, p.epsilon_common),
    )
    if not by_method:
        outcome = Outcome.NO_RESULTS
    elif not any(v.dp for v in verdicts):
        outcome = Outcome.NO_DP
    elif not ranked:
        outcome = Outcome.NO_MEANINGFUL
    elif math.isnan(baseline):
        outcome = Outcome.NO_BASELINE
    else:
        count = sum(1 for p in ranked if p.useful)
        outcome = _BY_COUNT[min(count, 2)]
    sentence = sentence_of(
        outcome, ranked=ranked, verdicts=verdicts, members=members, baseline=baseline, line=line
    )

    # the points named: the useful ones (else the best), then the not-DP methods' best
    named = [p for p in ranked if p.useful] or ranked[:1]
    not_dp = [v for v in verdicts if not v.dp and not v.infeasible]
    named += [v.best_not_dp for v in not_dp if v.best_not_dp is not None]
    caveats = [not_dp_caveat(v, baseline) for v in not_dp]
    caveats += interval_caveats(named)
    comparisons: list[Comparison] = []
    if named:
        subject = named[0].method
        for other in by_method:
            if other != subject:
                done = _compare(subject, other, by_method)
                if done is not None:
                    comparisons.append(done)
    caveats += [comparison_caveat(c) for c in comparisons]
    if named:
        caveats += no_leak_caveats(named, band)
    weak_only = [v.method for v in verdicts if v.dp and v.best is None]
    if weak_only and outcome is not Outcome.NO_MEANINGFUL:
        caveats.append(f"{join_names(weak_only)}: no row with {meaningful_words(members)}.")
    infeasible = [v.method for v in verdicts if v.infeasible]
    if infeasible:
        caveats.append(f"{join_names(infeasible)}: every cell infeasible (see the table's notes).")
    if not num_classes and outcome not in (Outcome.NO_RESULTS, Outcome.NO_DP):
        caveats.append("The number of classes is unknown, so chance accuracy is taken as 0.")
    return Verdict(
        outcome=outcome,
        methods=tuple(verdicts),
        baseline_accuracy=baseline,
        chance=chance,
        useful_accuracy=line,
        members=members,
        no_leak=band,
        comparisons=tuple(comparisons),
        sentence=sentence,
        caveats=tuple(caveats),
        cited=frozenset(
            pick.key for v in verdicts for pick in (v.best or v.best_not_dp,) if pick is not None
        ),
    )


def _all_infeasible(rows: Sequence[ResultRow], method: str) -> bool:
    mine = [r for r in rows if r.method == method]
    return bool(mine) and all(is_infeasible(r) for r in mine)


def format_verdict(verdict: Verdict, *, width: int = 100) -> str:
    """The verdict as printed under the table: ``Verdict:`` and the sentence, then one
    ``- `` line per caveat, wrapped at ``width`` columns."""
    lines = textwrap.wrap(f"Verdict: {verdict.sentence}", width=width, subsequent_indent="  ")
    for caveat in verdict.caveats:
        lines += textwrap.wrap(caveat, width=width, initial_indent="- ", subsequent_indent="  ")
    return "\n".join(lines)
