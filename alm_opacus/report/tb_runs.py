"""The scalars of ``tb/``, run by run: one run per method (and the unprotected head and the
no-leak reference), their steps (log ε, and per-mille accuracy on the trade-off chart) and
the order that gives each its colour. The layout is described in
:mod:`alm_opacus.report.tensorboard`."""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from tensorboard.compat.proto import summary_pb2

from alm_opacus.report import events
from alm_opacus.report.results import BASELINE, ResultRow
from alm_opacus.report.series import (
    ADD_REMOVE,
    NO_LEAK,
    Point,
    cells,
    format_epsilon,
    methods,
    no_leak,
    points,
)

__all__ = [
    "LAYOUT_NAME",
    "METRICS",
    "NO_LEAK_RUN",
    "PALETTE_SIZE",
    "POLYMER_PALETTE",
    "README_TAG",
    "STEPS_PER_DECADE",
    "TIME_SERIES_PALETTE",
    "TRADEOFF_EPSILON_TAG",
    "TRADEOFF_TAG",
    "UTILITY_SCALE",
    "X_UTILITY",
    "EpsilonAxis",
    "Steps",
    "TradeoffStep",
    "coloured_runs",
    "epsilon_grid",
    "run_label",
    "run_order",
    "run_scalars",
    "tradeoff_steps",
]

LAYOUT_NAME = "trade-off"
README_TAG = "read_me"
#: The run of the no-leak reference release (never a method: see ``series.NO_LEAK``).
NO_LEAK_RUN = f"{NO_LEAK} (reference)"
#: Custom Scalars (a Polymer dashboard) colours the run at position i of TensorBoard's run
#: list with ``POLYMER_PALETTE[i % 7]`` (tensorboard 2.21, ``tf_color_scale``,
#: ``tensorboardColorBlindAssist``).
POLYMER_PALETTE = ("#ff7043", "#0077bb", "#cc3311", "#33bbee", "#ee3377", "#009988", "#bbbbbb")
#: Time Series gives its k-th colour group ``TIME_SERIES_PALETTE[k % 7]`` (the "default"
#: palette of tensorboard 2.21's settings); runs matching no group get none of them.
TIME_SERIES_PALETTE = (
    "#425066",
    "#12b5cb",
    "#e52592",
    "#f9ab00",
    "#9334e6",
    "#7cb342",
    "#e8710a",
)
#: Both palettes have this many colours: more coloured runs than this share colours.
PALETTE_SIZE = 7
#: Steps per decade of epsilon, unless two grid epsilons would share a step.
STEPS_PER_DECADE = 100
#: The trade-off chart's step is test accuracy times this, rounded (per-mille).
UTILITY_SCALE = 1000
X_UTILITY = f"test accuracy ×{UTILITY_SCALE}"
#: The trade-off: the strongest attack's AUC, at step round(test accuracy × 1000). The tag
#: is the chart's title in Time Series, so it names its own x axis.
TRADEOFF_TAG = f"tradeoff/AUC vs {X_UTILITY}"
#: log10 of each trade-off point's replace-one ε′, at the same steps: which ε a point is.
TRADEOFF_EPSILON_TAG = f"tradeoff/log10 ε′ vs {X_UTILITY}"
#: (results field, tag, title) of each charted metric; TPRs only where resolved.
METRICS = (
    ("mia_auc", "mia_auc", "AUC of the strongest attack"),
    ("mia_accuracy", "mia_accuracy", "MIA accuracy of the strongest attack"),
    ("tpr_at_fpr_0_01", "tpr_at_fpr_0.01", "TPR at 1% FPR"),
    ("tpr_at_fpr_0_001", "tpr_at_fpr_0.001", "TPR at 0.1% FPR"),
)
#: hparams metric tag -> (Point field, display name), in column order: the HParams view
#: The :data:`POLYMER_PALETTE` slots of the methods (orange, blue, teal, cyan, red: the
#: most distinct first), of the unprotected head (magenta) and of the reference (grey).
_METHOD_SLOTS = (0, 1, 5, 3, 2)
_BASELINE_SLOT = 4
_REFERENCE_SLOT = 6
Steps = dict[int, list[summary_pb2.Summary.Value]]


def run_label(method: str, guarantee: str, neighbouring: str) -> str:
    """The run of a method: its name and guarantee kind, and add-remove where it applies."""
    relation = f", {ADD_REMOVE}" if neighbouring == ADD_REMOVE else ""
    return f"{method} [{guarantee}{relation}]"


def epsilon_grid(rows: Sequence[ResultRow], epsilons: Sequence[float]) -> list[float]:
    """The sorted finite epsilons of ``epsilons`` and ``rows``."""
    found = {float(e) for e in epsilons} | {r.epsilon for r in rows}
    return sorted(e for e in found if math.isfinite(e))


class EpsilonAxis:
    """The log-spaced step of each epsilon: ``round(per_decade * log10(epsilon / origin))``.

    Args:
        grid: the finite epsilons to place (positive).
    """

    def __init__(self, grid: Sequence[float]) -> None:
        finite = sorted({float(e) for e in grid if math.isfinite(e) and e > 0})
        self.origin = 10.0 ** math.floor(math.log10(finite[0])) if finite else 1.0
        self.per_decade = STEPS_PER_DECADE
        while len({self._step(e) for e in finite}) < len(finite):
            self.per_decade *= 10  # two epsilons within a step: a finer step
        self.grid = finite

    def _step(self, epsilon: float) -> int:
        return round(self.per_decade * math.log10(epsilon / self.origin))

    def step(self, epsilon: float) -> int:
        """The step of a finite epsilon."""
        return self._step(float(epsilon))

    def epsilon(self, step: int) -> float:
        """The epsilon at ``step`` (the inverse, to the step's rounding)."""
        return self.origin * 10.0 ** (step / self.per_decade)

    @property
    def steps(self) -> list[int]:
        return [self.step(e) for e in self.grid]

    def caption(self) -> str:
        """What the x axis means, for chart titles and the read-me."""
        marks = ", ".join(f"{self.step(e)} ↔ ε={format_epsilon(e)}" for e in self.grid[:4])
        return (
            f"x = {self.per_decade}·log10(ε/{format_epsilon(self.origin)}) (log ε): "
            f"{marks}{', …' if len(self.grid) > 4 else ''}"
        )


@dataclass(frozen=True)
class TradeoffStep:
    """Where one (method, ε) point sits on the trade-off chart's x axis."""

    method: str
    epsilon: float
    guarantee: str
    #: the step drawn: ``wanted``, or the next free step of the method's run
    step: int
    #: round(test accuracy × :data:`UTILITY_SCALE`)
    wanted: int

    @property
    def moved(self) -> bool:
        """Whether another ε of the method took ``wanted`` first."""
        return self.step != self.wanted


def tradeoff_steps(found: Sequence[Point]) -> list[TradeoffStep]:
    """The trade-off step of every point with a test accuracy, one list for all methods.

    A point's step is ``round(test accuracy × 1000)``. Points of one method that round alike
    are all kept: taken by increasing ε, a point whose step is taken goes to the next free
    step (0.001 of accuracy), so the line reads left to right in ε where the accuracy does
    not move: a larger ε that buys no accuracy shows as a rise at the same utility, which is
    what the chart is for. Keeping one of the points would hide either that rise or the
    cheaper ε.

    Args:
        found: the points (``series.points``).

    Returns:
        One :class:`TradeoffStep` per point whose test accuracy is a number, by method and ε.
    """
    taken: dict[str, set[int]] = defaultdict(set)
    out = []
    for point in sorted(found, key=lambda p: (p.method, p.epsilon)):
        accuracy = point.test_accuracy.mean
        if math.isnan(accuracy):
            continue
        wanted = round(accuracy * UTILITY_SCALE)
        step = wanted
        while step in taken[point.method]:
            step += 1
        taken[point.method].add(step)
        out.append(TradeoffStep(point.method, point.epsilon, point.guarantee, step, wanted))
    return out


def _method_label(rows: Sequence[ResultRow], method: str) -> str:
    found = [r for r in rows if r.method == method and r.status != "infeasible"] or [
        r for r in rows if r.method == method
    ]
    kinds = list(dict.fromkeys(r.guarantee for r in found))
    relation = found[0].neighbouring if found else ""
    guarantee = kinds[0] if len(kinds) == 1 else "mixed"
    return run_label(method, guarantee, relation)


def _drawn(rows: Sequence[ResultRow]) -> tuple[list[str], bool, bool]:
    """The methods with a point (the baseline left out), whether the baseline has one, and
    whether the reference has one: the runs :func:`write_tensorboard` writes."""
    found = {p.method for p in points(rows)}
    names = [m for m in methods(rows) if m in found and m != BASELINE]
    return names, BASELINE in found, no_leak(rows) is not None


def coloured_runs(rows: Sequence[ResultRow]) -> list[str]:
    """The runs that get a colour: the methods (in order of appearance), the unprotected
    head, then the no-leak reference; each only where it has a point."""
    names, baseline, reference = _drawn(rows)
    order = [_method_label(rows, m) for m in names]
    if baseline:
        order.append(_method_label(rows, BASELINE))
    if reference:
        order.append(NO_LEAK_RUN)
    return order


def run_order(rows: Sequence[ResultRow], others: Sequence[str]) -> list[str]:
    """Every run in the order TensorBoard is to list (and colour) it: the coloured runs at
    the positions of their :data:`POLYMER_PALETTE` slots (methods orange, blue, teal, cyan,
    red; the unprotected head magenta; the reference grey), ``others`` (the root run and
    the hparams sessions, which the links filter out) in the gaps and after. With more
    methods than slots, or too few other runs to fill the gaps, the coloured runs come first
    in :func:`coloured_runs` order (each its own colour up to seven).

    Args:
        rows: the run's rows.
        others: the runs that take no colour, in the order to write them.

    Returns:
        Every run name, coloured and ``others``, in list order.
    """
    names, baseline, reference = _drawn(rows)
    method_runs = [_method_label(rows, m) for m in names]
    slots = dict(zip(method_runs, _METHOD_SLOTS, strict=False))
    if baseline:
        slots[_method_label(rows, BASELINE)] = _BASELINE_SLOT
    if reference:
        slots[NO_LEAK_RUN] = _REFERENCE_SLOT
    coloured = coloured_runs(rows)
    total = len(coloured) + len(others)
    if len(method_runs) > len(_METHOD_SLOTS) or max(slots.values(), default=-1) >= total:
        return [*coloured, *others]
    order: list[str | None] = [None] * total
    for run, slot in slots.items():
        order[slot] = run
    rest = iter(others)
    return [run if run is not None else next(rest) for run in order]


def _point_values(point: Point, rows: Sequence[ResultRow]) -> dict[str, float]:
    """The scalars of one point; ``rows`` are its cells' rows (for the per-attack tags)."""
    values = {
        "test_accuracy": point.test_accuracy.mean,
        "utility_loss": point.utility_loss.mean,
        "noise_std": point.noise_std,
        "best/eps_lower_bound": point.eps_lower_bound,
        "eps_lower_bound_ceiling": point.eps_lower_bound_ceiling,
        "seeds": float(len(point.seeds)),
    }
    for field, tag, _ in METRICS:
        stat = getattr(point, field)
        values[f"best/{tag}"] = stat.mean
        if stat.kind:
            values |= {f"best/{tag}/low": stat.low, f"best/{tag}/high": stat.high}
    per_attack: dict[str, list[ResultRow]] = defaultdict(list)
    for row in rows:
        if row.attack:
            per_attack[row.attack].append(row)
    for attack, attack_rows in per_attack.items():
        for field, tag, _ in (*METRICS, ("eps_lower_bound", "eps_lower_bound", "")):
            found = [getattr(r, field) for r in attack_rows if not math.isnan(getattr(r, field))]
            values[f"attack/{attack}/{tag}"] = float(np.mean(found)) if found else math.nan
    return values


def _log10(value: float) -> float:
    """log10 of a positive finite value, else nan (left out of the events)."""
    return math.log10(value) if math.isfinite(value) and value > 0 else math.nan


def _grid_values(point: Point, members: int | None) -> dict[str, float]:
    return {
        "grid/epsilon": point.epsilon,
        "grid/epsilon_replace_one": point.epsilon_common,
        "grid/delta_replace_one": point.delta_common,
        "grid/log10_epsilon": _log10(point.epsilon),
        "grid/log10_epsilon_replace_one": _log10(point.epsilon_common),
        "grid/weak_guarantee": float(point.weak_for(members)),
    }


def _tradeoff_values(point: Point) -> dict[str, float]:
    values = {
        TRADEOFF_TAG: point.mia_auc.mean,
        TRADEOFF_EPSILON_TAG: _log10(point.epsilon_common),
    }
    if point.mia_auc.kind:
        values |= {
            f"{TRADEOFF_TAG}/low": point.mia_auc.low,
            f"{TRADEOFF_TAG}/high": point.mia_auc.high,
        }
    return values


def _reference_values(point: Point) -> dict[str, float]:
    """The no-leak reference's scalars: its accuracy and strongest attack, nothing that
    would read as a guarantee (noise, epsilon)."""
    keep = ("test_accuracy", "utility_loss", "seeds")
    return {k: v for k, v in _point_values(point, []).items() if k in keep or k.startswith("best/")}


def run_scalars(
    rows: Sequence[ResultRow],
    axis: EpsilonAxis,
    tradeoff: Sequence[TradeoffStep],
    members: int | None,
) -> dict[str, Steps]:
    """Every scalar and statement, by run (one per method, and the reference) and step."""
    by_cell = cells(rows)
    runs: dict[str, Steps] = defaultdict(lambda: defaultdict(list))
    labels = {m: _method_label(rows, m) for m in dict.fromkeys(r.method for r in rows)}
    at = {(t.method, t.epsilon, t.guarantee): t.step for t in tradeoff}
    for point in points(rows):
        run = labels[point.method]
        cell_rows = [r for s in point.seeds for r in by_cell[(point.method, point.epsilon, s)]]
        values = _point_values(point, cell_rows)
        first = cell_rows[0]
        text = events.text(
            f"statement/eps={format_epsilon(point.epsilon)}",
            f"seed {first.seed}: {first.statement}",
        )
        step = at.get((point.method, point.epsilon, point.guarantee))
        if step is not None:
            runs[run][step] += events.scalars(_tradeoff_values(point))
        if point.method == BASELINE:  # flat across the grid: a reference line
            _flat(runs[run], axis.steps, values)
            runs[run][axis.steps[0] if axis.steps else 0] += [text]
            continue
        runs[run][axis.step(point.epsilon)] += events.scalars(values | _grid_values(point, members))
        runs[run][axis.step(point.epsilon)] += [text]
    reference = no_leak(rows)
    if reference is not None:
        _flat(runs[NO_LEAK_RUN], axis.steps, _reference_values(reference))
        if tradeoff:  # flat across the utility range of every point drawn
            line = _tradeoff_values(reference)
            del line[TRADEOFF_EPSILON_TAG]
            ends = sorted({min(t.step for t in tradeoff), max(t.step for t in tradeoff)})
            _flat(runs[NO_LEAK_RUN], ends, line)
    return runs


def _flat(run: Steps, steps: Iterable[int], values: Mapping[str, float]) -> None:
    """The same scalars at each of ``steps``: a reference drawn as a flat line."""
    for k in steps:
        run[k] += events.scalars(values)
