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

import enum
import math
import textwrap
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from alm_opacus.report.results import ResultRow
from alm_opacus.report.series import (
    BASELINE,
    WEAK_DELTA_UNKNOWN_N,
    WEAK_EPSILON,
    Point,
    Stat,
    cells,
    format_epsilon,
    is_infeasible,
    is_weak,
    no_leak,
    points,
)

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

#: The guarantee kinds (under replace-one) that are differential privacy.
DP_KINDS = ("pure-dp", "approx-dp")
#: The share of the unprotected head's gain over chance that a useful accuracy keeps.
USEFUL_FRACTION = 0.5
#: Not-DP kinds in words, for the caveats.
_NOT_DP_WORDS = {
    "random-dp": "random-DP",
    "per-query": "per-query DP (the model as a whole is not DP)",
    "none": "without a guarantee",
}


class Outcome(str, enum.Enum):
    """Which recommendation the run supports (the branches of :func:`decide`)."""

    #: no protected release finished (no row but the baseline, or every cell infeasible)
    NO_RESULTS = "no-results"
    #: no method has a DP row (e.g. only random-DP rows)
    NO_DP = "no-dp"
    #: DP rows exist, but every one is weak
    NO_MEANINGFUL = "no-meaningful"
    #: meaningful rows exist, but without the unprotected head usefulness is undefined
    NO_BASELINE = "no-baseline"
    #: no method keeps useful accuracy at a meaningful guarantee
    NONE_USEFUL = "none-useful"
    #: exactly one method does
    ONE_USEFUL = "one-useful"
    #: several methods do
    SEVERAL_USEFUL = "several-useful"


@dataclass(frozen=True)
class Pick:
    """One (method, ε) point the verdict cites."""

    method: str
    #: the ε the cell asked for, under the method's own relation
    epsilon: float
    #: the guarantee kind under replace-one (``Point.common_guarantee``)
    guarantee: str
    epsilon_common: float
    delta_common: float
    #: mean test accuracy over seeds and noise draws
    accuracy: float
    #: the strongest attack's AUC with its 95% interval
    auc: Stat
    eps_lower_bound: float
    #: whether ``accuracy`` is useful (None: no baseline, so undefined)
    useful: bool | None
    #: whether the AUC's mean lies inside the no-leak band (None: the run has no reference)
    inside_no_leak: bool | None

    @property
    def key(self) -> tuple[str, float]:
        return (self.method, self.epsilon)


@dataclass(frozen=True)
class MethodVerdict:
    """What one method reaches."""

    method: str
    #: the guarantee kinds of its feasible points, under replace-one, in grid order
    kinds: tuple[str, ...]
    #: whether any of its rows is DP under replace-one
    dp: bool
    #: its best accuracy at a meaningful guarantee (None: no such row)
    best: Pick | None
    #: a method without DP rows: its best accuracy at ε′ ≤ 10, δ′ ≤ 1/n (not DP)
    best_not_dp: Pick | None
    #: whether every cell of the method was infeasible
    infeasible: bool


@dataclass(frozen=True)
class Comparison:
    """Two methods at equal utility: AUCs interpolated at one accuracy both reach."""

    method: str
    other: str
    #: the common accuracy level (the highest both methods reach)
    accuracy: float
    auc: Stat
    other_auc: Stat
    #: whether the two AUC intervals do not overlap
    separated: bool
    #: the method whose interval lies lower, where ``separated`` (else None)
    leaks_less: str | None


@dataclass(frozen=True)
class Verdict:
    """The computed verdict of a run (see the module docstring for the rule)."""

    outcome: Outcome
    methods: tuple[MethodVerdict, ...]
    #: the unprotected head's mean accuracy (nan without a baseline)
    baseline_accuracy: float
    #: chance accuracy, 1 / number of classes (0 where unknown)
    chance: float
    #: the useful-accuracy line (nan without a baseline)
    useful_accuracy: float
    members: int | None
    #: the no-leak band: the reference's strongest-attack AUC (None: no reference)
    no_leak: Stat | None
    comparisons: tuple[Comparison, ...]
    #: the recommendation, one sentence
    sentence: str
    caveats: tuple[str, ...]
    #: the (method, ε) rows the verdict cites: per method the point it reports
    #: (:attr:`MethodVerdict.best`, else :attr:`MethodVerdict.best_not_dp`)
    cited: frozenset[tuple[str, float]]

    @property
    def text(self) -> str:
        """The recommendation and its caveats, as one paragraph."""
        return " ".join([self.sentence, *self.caveats])

    def method(self, name: str) -> MethodVerdict:
        """The :class:`MethodVerdict` of ``name``.

        Raises:
            KeyError: if the run has no such method.
        """
        for found in self.methods:
            if found.method == name:
                return found
        raise KeyError(name)


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


def _overlap(a: Stat, b: Stat) -> bool:
    if a.kind == "" or b.kind == "":
        return True  # no interval: nothing shows a difference
    return not (a.high < b.low or b.high < a.low)


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
    separated = not _overlap(auc, other_auc)
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


# -- words ------------------------------------------------------------------------------------


def _auc(stat: Stat) -> str:
    if stat.kind == "ci95":
        return f"{stat.mean:.2f} [{stat.low:.2f}, {stat.high:.2f}]"
    if stat.kind == "std":
        return f"{stat.mean:.2f} ±{stat.high - stat.mean:.2f}"
    return f"{stat.mean:.2f}"


def _where(pick: Pick) -> str:
    """``ε′ = 2 (ε = 1)``, or ``ε′ = 10`` where the two coincide."""
    shown = f"ε′ = {pick.epsilon_common:.3g}"
    if not math.isclose(pick.epsilon_common, pick.epsilon):
        shown += f" (ε = {format_epsilon(pick.epsilon)})"
    return shown


def _meaningful(members: int | None) -> str:
    line = f"1/{members}" if members else f"{WEAK_DELTA_UNKNOWN_N:g}"
    return f"a meaningful guarantee (ε′ ≤ {WEAK_EPSILON:g}, δ′ ≤ {line})"


def _against(baseline: float) -> str:
    return "" if math.isnan(baseline) else f" against {baseline:.2f} unprotected"


def _names(items: Sequence[str]) -> str:
    if len(items) <= 1:
        return "".join(items)
    return ", ".join(items[:-1]) + " and " + items[-1]


def _interval_caveat(named: Sequence[Pick]) -> list[str]:
    """Whether the AUC intervals of the points named overlap, pair by pair."""
    if len(named) < 2:
        return []
    out = []
    overlapping = []
    for i, a in enumerate(named):
        for b in named[i + 1 :]:
            if _overlap(a.auc, b.auc):
                overlapping.append((a, b))
            else:
                low, high = (a, b) if a.auc.high < b.auc.low else (b, a)
                out.append(
                    f"{low.method}'s AUC interval at {_where(low)} ({_auc(low.auc)}) lies below "
                    f"{high.method}'s at {_where(high)} ({_auc(high.auc)}): {low.method} leaks "
                    "less at these points."
                )
    if overlapping:
        shown = _names(
            list(dict.fromkeys(f"{p.method} {_auc(p.auc)}" for pair in overlapping for p in pair))
        )
        out.insert(
            0,
            f"The AUC intervals of the points named overlap ({shown}): differences within the "
            "intervals are not differences.",
        )
    return out


def _comparison_caveat(found: Comparison) -> str:
    head = (
        f"At equal utility (accuracy {found.accuracy:.2f}, interpolated between measured "
        f"points) {found.method}'s AUC is {_auc(found.auc)} and {found.other}'s "
        f"{_auc(found.other_auc)}"
    )
    if found.separated:
        return f"{head}: {found.leaks_less} leaks less."
    return f"{head}: the intervals overlap, so neither is shown to leak less."


def _no_leak_caveat(named: Sequence[Pick], band: Stat | None) -> list[str]:
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
            f"{_names([f'{p.method} at {_where(p)} (AUC {p.auc.mean:.2f})' for p in inside])} "
            f"{'lies' if len(inside) == 1 else 'lie'} inside {where}: indistinguishable from a "
            "release that never saw the members."
        )
    if above:
        out.append(
            f"{_names([f'{p.method} at {_where(p)} (AUC {p.auc.mean:.2f})' for p in above])} "
            f"{'lies' if len(above) == 1 else 'lie'} outside {where}: the attacks tell its "
            "members apart."
        )
    return out


def _not_dp_caveat(found: MethodVerdict, baseline: float) -> str:
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


def _sentence(
    outcome: Outcome,
    *,
    ranked: Sequence[Pick],
    verdicts: Sequence[MethodVerdict],
    members: int | None,
    baseline: float,
    line: float,
) -> str:
    meaningful = _meaningful(members)
    at = f"At {meaningful}"
    if outcome is Outcome.NO_RESULTS:
        return "No protected release of this run finished, so there is nothing to recommend."
    if outcome is Outcome.NO_DP:
        kinds = _names([f"{v.method}: {'/'.join(v.kinds)}" for v in verdicts if not v.infeasible])
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
    sentence = _sentence(
        outcome, ranked=ranked, verdicts=verdicts, members=members, baseline=baseline, line=line
    )

    # the points named: the useful ones (else the best), then the not-DP methods' best
    named = [p for p in ranked if p.useful] or ranked[:1]
    not_dp = [v for v in verdicts if not v.dp and not v.infeasible]
    named += [v.best_not_dp for v in not_dp if v.best_not_dp is not None]
    caveats = [_not_dp_caveat(v, baseline) for v in not_dp]
    caveats += _interval_caveat(named)
    comparisons: list[Comparison] = []
    if named:
        subject = named[0].method
        for other in by_method:
            if other != subject:
                done = _compare(subject, other, by_method)
                if done is not None:
                    comparisons.append(done)
    caveats += [_comparison_caveat(c) for c in comparisons]
    if named:
        caveats += _no_leak_caveat(named, band)
    weak_only = [v.method for v in verdicts if v.dp and v.best is None]
    if weak_only and outcome is not Outcome.NO_MEANINGFUL:
        caveats.append(f"{_names(weak_only)}: no row with {_meaningful(members)}.")
    infeasible = [v.method for v in verdicts if v.infeasible]
    if infeasible:
        caveats.append(f"{_names(infeasible)}: every cell infeasible (see the table's notes).")
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
