"""What every view of a run (table, plots, TensorBoard) reads off the rows, computed once.

A *cell* is one (method, epsilon, seed); it holds one row per attack. Its *strongest attack*
for a metric is the attack row with the largest value of that metric, over ALL attack rows
of the cell ("-clean" reference attackers included). A :class:`Point` is one
(method, epsilon) over the seeds that finished it: the mean of each seed's strongest attack,
with an error bar (see :class:`Stat`).

Epsilons are compared under one neighbouring relation, replace-one (the post-training
mechanisms' own). An add/remove guarantee (DP-SGD) is converted by group privacy for a group
of two: replacing one row is removing it and then adding another, so chaining the add/remove
inequality twice gives P[M(D) in S] <= e^eps (e^eps P[M(D'') in S] + delta) + delta, that is
replace-one (2 epsilon, (1 + e^epsilon) delta) (Dwork & Roth 2014, Theorem 2.2, for pure DP;
the delta term is the same two-step chain).
"""

from __future__ import annotations

import math
import zlib
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from alm_opacus.report.results import BASELINE, ResultRow

#: Above this (replace-one) epsilon the guarantee is marked as weak in every view.
WEAK_EPSILON = 10.0
#: Above ``1 / n`` (n members) a replace-one delta is weak: a mechanism may then publish one
#: member's row outright and still meet it. Where n is not known, this delta is the line.
WEAK_DELTA_UNKNOWN_N = 1e-3
#: The attack metrics of a random guess: AUC and accuracy 0.5, and TPR equal to the FPR.
CHANCE = {"mia_auc": 0.5, "mia_accuracy": 0.5, "tpr_at_fpr_0_01": 0.01, "tpr_at_fpr_0_001": 0.001}
#: The common neighbouring relation every comparison is made under.
COMMON_RELATION = "replace-one"
ADD_REMOVE = "add-remove"
INFEASIBLE = "infeasible"
#: The no-leak reference release: the unprotected recipe trained on as many public rows as
#: there are members, so it never saw a member or a non-member. Attacked like every release,
#: its strongest-attack figures are what the same max-over-attacks statistic reads when
#: nothing leaks (selection over attacks, the evaluation set's sampling noise): the floor
#: every protected row is read against. It is a reference, never a protection:
#: :func:`points` leaves it out and :func:`no_leak` returns it.
NO_LEAK = "no-leak"

#: Marker and line style per guarantee kind (the kinds of ``alm_opacus.protect.Guarantee``),
#: strongest first; an unknown kind gets the last style.
GUARANTEE_STYLES: dict[str, tuple[str, object]] = {
    "pure-dp": ("o", "-"),
    "approx-dp": ("s", "--"),
    "random-dp": ("^", "-."),
    "per-query": ("D", ":"),
    "none": ("X", (0, (1, 3))),
}
_PALETTE = (
    "#1f77b4",
    "#ff7f0e",
    "#2ca02c",
    "#d62728",
    "#9467bd",
    "#8c564b",
    "#e377c2",
    "#bcbd22",
    "#17becf",
    "#393b79",
    "#637939",
    "#8c6d31",
    "#843c39",
    "#7b4173",
    "#00a087",
)
BASELINE_COLOUR = "black"
CHANCE_COLOUR = "grey"


def to_replace_one(*, epsilon: float, delta: float) -> tuple[float, float]:
    """An add/remove (epsilon, delta) guarantee as a replace-one one: (2 eps, (1 + e^eps) delta).

    Group privacy for a group of two (see the module docstring); delta may exceed 1, which
    means the conversion proves nothing.
    """
    if epsilon < 0 or delta < 0:
        raise ValueError(f"epsilon={epsilon}, delta={delta}: expected non-negative values")
    return 2.0 * epsilon, delta * (1.0 + math.exp(min(epsilon, 700.0)))


def replace_one(row: ResultRow) -> tuple[float, float]:
    """The (epsilon, delta) of ``row`` under replace-one: the row's own
    ``epsilon_replace_one``/``delta_replace_one`` where set, else converted from add/remove,
    else the row's epsilon and delta (already replace-one, or of unknown relation)."""
    if row.neighbouring != ADD_REMOVE:
        return row.epsilon, row.delta
    if not math.isnan(row.epsilon_replace_one):
        delta = row.delta_replace_one
        if math.isnan(delta):
            delta = to_replace_one(epsilon=row.epsilon, delta=row.delta)[1]
        return row.epsilon_replace_one, delta
    return to_replace_one(epsilon=row.epsilon, delta=row.delta)


@dataclass(frozen=True)
class Stat:
    """A mean over seeds with its error bar ``[low, high]``.

    ``kind`` says what the bar is: ``"ci95"``, the 95% interval over the evaluation set (one
    seed), or the union of the per-seed intervals (several seeds: wider than the interval
    of the mean); ``"std"``, +-1 standard deviation over seeds and noise draws
    (sqrt(var over seeds + mean within-seed variance over draws)); ``""``, no bar.
    """

    mean: float
    low: float
    high: float
    kind: str

    @staticmethod
    def of(
        values: Sequence[float],
        *,
        std: Sequence[float] = (),
        low: Sequence[float] = (),
        high: Sequence[float] = (),
    ) -> Stat:
        """The mean of ``values``, with the CI bounds ``low``/``high`` where all are set,
        else the spread from ``std`` (the within-seed standard deviations)."""
        vals = np.asarray(values, dtype=float)
        if not len(vals) or np.isnan(vals).all():
            return Stat(math.nan, math.nan, math.nan, "")
        mean = float(np.nanmean(vals))
        lows, highs = np.asarray(low, dtype=float), np.asarray(high, dtype=float)
        if len(lows) == len(vals) and not np.isnan(lows).any() and not np.isnan(highs).any():
            return Stat(mean, float(lows.min()), float(highs.max()), "ci95")
        within = np.nan_to_num(np.asarray(std, dtype=float)) if len(std) else np.zeros(1)
        spread = math.sqrt(float(np.nanvar(vals)) + float(np.mean(within**2)))
        return Stat(mean, mean - spread, mean + spread, "std" if spread > 0 else "")


@dataclass(frozen=True)
class Point:
    """One (method, epsilon): means over the seeds that finished the cell."""

    method: str
    guarantee: str
    neighbouring: str
    #: the epsilon the cell was asked for (its relation is ``neighbouring``)
    epsilon: float
    #: epsilon and delta under replace-one (:func:`replace_one`)
    epsilon_common: float
    delta_common: float
    delta: float
    seeds: tuple[int, ...]
    test_accuracy: Stat
    utility_loss: Stat
    mia_auc: Stat
    mia_accuracy: Stat
    tpr_at_fpr_0_01: Stat
    tpr_at_fpr_0_001: Stat
    noise_std: float
    #: DP-SGD's noise multiplier (nan for noise added once to the weights)
    noise_multiplier: float
    eps_lower_bound: float
    eps_lower_bound_ceiling: float

    @property
    def converted(self) -> bool:
        """Whether the epsilon was converted from add/remove to replace-one."""
        return self.neighbouring == ADD_REMOVE

    @property
    def vacuous(self) -> bool:
        """Whether the replace-one delta reaches 1, so that the conversion proves nothing."""
        return self.delta_common >= 1.0

    @property
    def common_guarantee(self) -> str:
        """The guarantee kind under replace-one: ``none`` where the conversion is vacuous."""
        return "none" if self.vacuous else self.guarantee

    @property
    def weak(self) -> bool:
        """Whether the replace-one guarantee shown is weak (:func:`is_weak`, n unknown)."""
        return is_weak(epsilon=self.epsilon_common, delta=self.delta_common)

    def weak_for(self, members: int | None) -> bool:
        """:func:`is_weak` of the replace-one guarantee shown, for ``members`` members."""
        return is_weak(epsilon=self.epsilon_common, delta=self.delta_common, members=members)


def is_weak(*, epsilon: float, delta: float, members: int | None = None) -> bool:
    """Whether a replace-one (epsilon, delta) is a weak guarantee, not protection: epsilon
    above :data:`WEAK_EPSILON`, or delta above ``1 / members`` (above
    :data:`WEAK_DELTA_UNKNOWN_N` where the member count is not known). The baseline's
    infinite epsilon is no guarantee at all, not a weak one."""
    if math.isinf(epsilon):
        return False
    line = 1.0 / members if members else WEAK_DELTA_UNKNOWN_N
    return epsilon > WEAK_EPSILON or delta > line


def cells(rows: Sequence[ResultRow]) -> dict[tuple[str, float, int], list[ResultRow]]:
    """The rows of each (method, epsilon, seed) cell, in row order."""
    out: dict[tuple[str, float, int], list[ResultRow]] = defaultdict(list)
    for row in rows:
        out[(row.method, row.epsilon, row.seed)].append(row)
    return dict(out)


def is_infeasible(row: ResultRow) -> bool:
    return row.status == INFEASIBLE


def strongest(cell: Sequence[ResultRow], metric: str) -> ResultRow:
    """The row of ``cell`` with the largest ``metric`` (rows where it is nan lose)."""
    return max(
        cell, key=lambda r: -math.inf if math.isnan(getattr(r, metric)) else getattr(r, metric)
    )


def _stat(best: Sequence[ResultRow], metric: str, std: str | None = None) -> Stat:
    values = [getattr(r, metric) for r in best]
    spreads = [getattr(r, std) for r in best] if std else []
    if metric in ("mia_auc", "tpr_at_fpr_0_01", "tpr_at_fpr_0_001"):
        return Stat.of(
            values,
            std=spreads,
            low=[getattr(r, f"{metric}_ci_low") for r in best],
            high=[getattr(r, f"{metric}_ci_high") for r in best],
        )
    return Stat.of(values, std=spreads)


def _nanmean(values: Sequence[float]) -> float:
    finite = [v for v in values if not math.isnan(v)]
    return float(np.mean(finite)) if finite else math.nan


def _point(method: str, epsilon: float, per_seed: Sequence[Sequence[ResultRow]]) -> Point:
    first = per_seed[0][0]
    common = replace_one(first)

    def best(metric: str) -> list[ResultRow]:
        return [strongest(cell, metric) for cell in per_seed]

    def seedmax(metric: str) -> float:
        values = [getattr(r, metric) for cell in per_seed for r in cell]
        finite = [v for v in values if not math.isnan(v)]
        return max(finite) if finite else math.nan

    return Point(
        method=method,
        guarantee=first.guarantee,
        neighbouring=first.neighbouring,
        epsilon=epsilon,
        epsilon_common=common[0],
        delta_common=common[1],
        delta=first.delta,
        seeds=tuple(cell[0].seed for cell in per_seed),
        test_accuracy=_stat([c[0] for c in per_seed], "test_accuracy", "test_accuracy_std"),
        utility_loss=_stat([c[0] for c in per_seed], "utility_loss", "utility_loss_std"),
        mia_auc=_stat(best("mia_auc"), "mia_auc", "mia_auc_std"),
        mia_accuracy=_stat(best("mia_accuracy"), "mia_accuracy", "mia_accuracy_std"),
        tpr_at_fpr_0_01=_stat(best("tpr_at_fpr_0_01"), "tpr_at_fpr_0_01"),
        tpr_at_fpr_0_001=_stat(best("tpr_at_fpr_0_001"), "tpr_at_fpr_0_001"),
        noise_std=_nanmean([c[0].noise_std for c in per_seed]),
        noise_multiplier=_nanmean([c[0].noise_multiplier for c in per_seed]),
        eps_lower_bound=seedmax("eps_lower_bound"),
        eps_lower_bound_ceiling=seedmax("eps_lower_bound_ceiling"),
    )


def points(
    rows: Sequence[ResultRow], *, seeds: Sequence[int] | None = None, reference: bool = False
) -> list[Point]:
    """One :class:`Point` per feasible (method, epsilon, guarantee), over ``seeds`` (default:
    all); sorted by method, then epsilon. Infeasible cells are left out
    (:func:`infeasible_rows` lists them), and so is the :data:`NO_LEAK` reference unless
    ``reference`` (then it is all that is returned)."""
    grouped: dict[tuple[str, float, str], list[list[ResultRow]]] = defaultdict(list)
    for (method, epsilon, seed), cell in sorted(cells(rows).items()):
        if seeds is not None and seed not in seeds:
            continue
        if (method == NO_LEAK) != reference:
            continue
        if any(is_infeasible(r) for r in cell):
            continue
        grouped[(method, epsilon, cell[0].guarantee)].append(cell)
    return [_point(m, e, per_seed) for (m, e, _), per_seed in sorted(grouped.items())]


def no_leak(rows: Sequence[ResultRow], *, seeds: Sequence[int] | None = None) -> Point | None:
    """The :data:`NO_LEAK` reference's point (its strongest attack over the seeds), or
    ``None`` where the run has none."""
    found = points(rows, seeds=seeds, reference=True)
    return found[0] if found else None


def infeasible_rows(rows: Sequence[ResultRow]) -> list[ResultRow]:
    """One row per infeasible cell, sorted by method, epsilon and seed."""
    return [cell[0] for _, cell in sorted(cells(rows).items()) if is_infeasible(cell[0])]


def methods(rows: Sequence[ResultRow]) -> list[str]:
    """The methods of ``rows``: the baseline first, then in order of appearance (the
    :data:`NO_LEAK` reference is no method)."""
    names = list(dict.fromkeys(r.method for r in rows if r.method != NO_LEAK))
    return sorted(names, key=lambda m: m != BASELINE)


def method_colours(names: Sequence[str]) -> dict[str, str]:
    """A colour per method: the palette slot its name hashes to (CRC-32, so the same name
    gets the same colour in every run), moved to the next free slot only when two methods
    of ``names`` collide. The baseline is black."""
    taken: dict[int, str] = {}
    out = {BASELINE: BASELINE_COLOUR}
    for name in sorted(set(names) - {BASELINE}):
        slot = zlib.crc32(name.encode()) % len(_PALETTE)
        for probe in range(len(_PALETTE)):
            if (slot + probe) % len(_PALETTE) not in taken:
                slot = (slot + probe) % len(_PALETTE)
                break
        taken[slot] = name
        out[name] = _PALETTE[slot]
    return out


def guarantee_style(kind: str) -> tuple[str, object]:
    """(marker, line style) for a guarantee kind."""
    return GUARANTEE_STYLES.get(kind, GUARANTEE_STYLES["none"])


def format_epsilon(epsilon: float) -> str:
    """Epsilon as every view prints it: ``inf``, ``0.1``, ``1000``, ``1e+04``."""
    return "inf" if math.isinf(epsilon) else f"{epsilon:g}"


def format_stat(stat: Stat, *, digits: int = 3, interval_digits: int = 2, sep: str = ", ") -> str:
    """A mean with its error bar as every view prints it: ``0.612 [0.55, 0.67]`` (a 95%
    interval), ``0.612 ±0.031`` (one std) or ``0.612`` (no bar); ``-`` for a missing mean.

    Args:
        stat: the statistic (:class:`Stat`).
        digits: decimals of the mean and of the ± spread.
        interval_digits: decimals of the interval's bounds.
        sep: between the bounds (the narrow table uses ``","``).

    Returns:
        The text.
    """
    mean = "-" if math.isnan(stat.mean) else f"{stat.mean:.{digits}f}"
    if stat.kind == "ci95":
        return f"{mean} [{stat.low:.{interval_digits}f}{sep}{stat.high:.{interval_digits}f}]"
    if stat.kind == "std":
        return f"{mean} ±{stat.high - stat.mean:.{digits}f}"
    return mean
