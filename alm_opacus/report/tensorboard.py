"""TensorBoard output of a run under ``<out>/tb``, (re)written whole from the rows.

:func:`write_tensorboard` builds the folder from the full list of rows in a temporary
folder and then swaps it in, so ``tb/`` holds exactly the rows it was given: a resumed run
(whose rows include the earlier run's) and a re-run both leave no stale events behind.

What it draws is the trade-off, first:

* **One run per method** (``alm [random-dp]``: the method and its guarantee kind), the mean
  over seeds, so each method is one line in one colour; ``none [none]`` is the unprotected
  head; ``no-leak (reference)`` (where the run has the :data:`~series.NO_LEAK` release) is
  what the same strongest-attack statistic reads when nothing leaks, drawn flat. Chance
  levels are in the chart titles (no run of their own, which would take a colour).
* **The trade-off chart** (:data:`TRADEOFF_TAG`): the strongest attack's AUC with
  ``step = round(test accuracy × 1000)``, one point per (method, ε), so each method is one
  line of attack strength against utility; the unprotected head is its single point. Two
  ε of one method at the same per-mille step keep both points: the larger ε moves to the
  next free step (:func:`tradeoff_steps`), 0.001 of accuracy, below what an evaluation set
  of fewer than 1000 examples resolves, and the read-me lists every move.
* **Charts against ε, at a stated log-spaced step**: ``step = round(S · log10(ε / ε₀))``
  with ``S`` steps per decade (100 unless two grid epsilons would share a step) and ``ε₀``
  the power of ten at or below the smallest grid ε, so the x axis *is* log ε (ε₀ = 0.1:
  step 0 is ε = 0.1, 100 is 1, 200 is 10). Every chart title says so, ε values are charted
  as log10, and the read-me maps each step to ε, ε′ and the weak flag per method.
* **Custom scalars**: the trade-off category first, then one chart per metric against ε,
  one line per method; a closed category per attack.
* **HParams**: one session per (method, ε) point, as many as the table's lines (their runs
  sit under ``hparams/``, so the run filters of :func:`dashboard_urls` leave them out);
  the columns are ε′, the guarantee kind, ``method`` and the weak flag, then the metrics,
  the strongest attack's AUC first (the view colours its plots by the first metric).
* **Root run**: the custom-scalars layout, a ``read_me`` text, the hparams experiment and
  the plots as images.

Colours: TensorBoard 2.21 colours runs by their position in its run list, which it sorts
by start time (the first event's wall time), then name; Custom Scalars takes
``POLYMER_PALETTE[position % 7]``, Time Series the next colour of ``TIME_SERIES_PALETTE``
per colour group (its link makes each method run a group and the other runs none). Each run
is written with the start time of its place in :func:`run_order`, which puts the methods,
the unprotected head and the reference at chosen palette slots (the sessions and the root
run fill the gaps), so up to five methods, the head and the reference get seven distinct
colours in both views, whatever their names and however many sessions follow.
"""

from __future__ import annotations

import json
import math
import re
import time
from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote, urlencode

import numpy as np
from tensorboard.compat.proto import summary_pb2
from tensorboard.plugins.custom_scalar import layout_pb2

from alm_opacus.report import events
from alm_opacus.report.draws import DrawRecord
from alm_opacus.report.folders import replace_folder
from alm_opacus.report.results import ResultRow
from alm_opacus.report.series import (
    ADD_REMOVE,
    BASELINE,
    CHANCE,
    NO_LEAK,
    WEAK_DELTA_UNKNOWN_N,
    WEAK_EPSILON,
    Point,
    cells,
    format_epsilon,
    infeasible_rows,
    methods,
    no_leak,
    points,
)
from alm_opacus.report.words import guarantee_words

LAYOUT_NAME = "trade-off"
HPARAMS_FOLDER = "hparams"
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
_X_UTILITY = f"test accuracy ×{UTILITY_SCALE}"
#: The trade-off: the strongest attack's AUC, at step round(test accuracy × 1000). The tag
#: is the chart's title in Time Series, so it names its own x axis.
TRADEOFF_TAG = f"tradeoff/AUC vs {_X_UTILITY}"
#: log10 of each trade-off point's replace-one ε′, at the same steps: which ε a point is.
TRADEOFF_EPSILON_TAG = f"tradeoff/log10 ε′ vs {_X_UTILITY}"
#: (results field, tag, title) of each charted metric; TPRs only where resolved.
METRICS = (
    ("mia_auc", "mia_auc", "AUC of the strongest attack"),
    ("mia_accuracy", "mia_accuracy", "MIA accuracy of the strongest attack"),
    ("tpr_at_fpr_0_01", "tpr_at_fpr_0.01", "TPR at 1% FPR"),
    ("tpr_at_fpr_0_001", "tpr_at_fpr_0.001", "TPR at 0.1% FPR"),
)
#: hparams metric tag -> (Point field, display name), in column order: the HParams view
#: shows the first five and colours its plots by the first.
HPARAM_METRICS = {
    "hparams/mia_auc": ("mia_auc", "AUC (strongest attack)"),
    "hparams/test_accuracy": ("test_accuracy", "test accuracy"),
    "hparams/utility_loss": ("utility_loss", "utility loss"),
    "hparams/tpr_at_fpr_0.01": ("tpr_at_fpr_0_01", "TPR at 1% FPR"),
    "hparams/mia_accuracy": ("mia_accuracy", "MIA accuracy (strongest attack)"),
    "hparams/tpr_at_fpr_0.001": ("tpr_at_fpr_0_001", "TPR at 0.1% FPR"),
}
#: The hparams the HParams view shows, with their display names: the experiment lists only
#: these, as the view shows five columns whatever their number (listed by name), and a
#: sixth column would push the metrics off a 1400 px screen. The session's other hparams
#: (the asked ε, which the session's name gives, the run's settings) are recorded with it.
HPARAM_COLUMNS = {
    "epsilon_replace_one": "ε′ (replace-one)",
    "guarantee": "guarantee (replace-one)",
    "method": "method",
    "weak_guarantee": "weak",  # named with its rule by _weak_rule
}
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


def _runs(
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
            for k in axis.steps:
                runs[run][k] += events.scalars(values)
            runs[run][axis.steps[0] if axis.steps else 0] += [text]
            continue
        runs[run][axis.step(point.epsilon)] += events.scalars(values | _grid_values(point, members))
        runs[run][axis.step(point.epsilon)] += [text]
    reference = no_leak(rows)
    if reference is not None:
        values = _reference_values(reference)
        for k in axis.steps:
            runs[NO_LEAK_RUN][k] += events.scalars(values)
        if tradeoff:  # flat across the utility range of every point drawn
            line = _tradeoff_values(reference)
            del line[TRADEOFF_EPSILON_TAG]
            for k in sorted({min(t.step for t in tradeoff), max(t.step for t in tradeoff)}):
                runs[NO_LEAK_RUN][k] += events.scalars(line)
    return runs


def _hparam_value(value: object) -> events.HParamValue:
    return value if isinstance(value, str | int | float | bool) else str(value)


def _sessions(
    rows: Sequence[ResultRow],
    draws: Sequence[DrawRecord],
    settings: Mapping[str, object],
    members: int | None,
) -> list[tuple[str, dict[str, events.HParamValue], dict[str, float]]]:
    """(run name, hparams, metrics): one session per (method, ε) point, its numbers the
    point's (the mean over seeds of each seed's strongest attack, as in the table), so the
    sessions are as many as the table's lines, not one per release. Infinite values (the
    unprotected head's ε) are left out: the plugin serves JSON, which has no inf."""
    releases = Counter((d.method, d.epsilon) for d in draws)
    by_cell = cells(rows)
    out = []
    for point in points(rows):
        # the releases averaged: the draw records, else the draws each seed's row counts
        drawn = releases.get((point.method, point.epsilon)) or sum(
            by_cell[(point.method, point.epsilon, s)][0].noise_draws for s in point.seeds
        )
        hparams: dict[str, events.HParamValue] = {
            "method": point.method,
            "epsilon": point.epsilon,
            "guarantee": point.common_guarantee,
            "epsilon_replace_one": point.epsilon_common,
            "delta_replace_one": point.delta_common,
            "neighbouring": point.neighbouring or "unstated",
            "seeds": len(point.seeds),
            "releases": drawn,
            **{k: _hparam_value(v) for k, v in settings.items()},
        }
        if math.isfinite(point.epsilon_common):  # no guarantee: neither weak nor not
            hparams["weak_guarantee"] = point.weak_for(members)
        metrics = {tag: getattr(point, field).mean for tag, (field, _) in HPARAM_METRICS.items()}
        name = f"{HPARAMS_FOLDER}/{point.method}/eps={format_epsilon(point.epsilon)}"
        out.append((name, hparams, metrics))
    return out


def _write_hparams(
    sessions: Sequence[tuple[str, dict[str, events.HParamValue], dict[str, float]]],
    folder: Path,
    start: Mapping[str, float],
    members: int | None,
) -> summary_pb2.Summary.Value:
    """Write each session (:func:`_sessions`) under ``folder`` at its ``start`` time;
    returns the experiment for the root run."""
    for name, hparams, metrics in sessions:
        begin, end = events.hparams_session(hparams, wall_time=start[name])
        events.write_run(
            folder / name, {0: [begin, *events.scalars(metrics), end]}, wall_time=start[name]
        )
    logged = {tag for _, _, metrics in sessions for tag, v in metrics.items() if not math.isnan(v)}
    return events.hparams_experiment(
        [h for _, h, _ in sessions],
        {tag: shown for tag, (_, shown) in HPARAM_METRICS.items() if tag in logged},
        columns=tuple(HPARAM_COLUMNS),
        display_names={**HPARAM_COLUMNS, "weak_guarantee": f"weak ({_weak_rule(members)})"},
    )


def _resolved(rows: Sequence[ResultRow], field: str) -> bool:
    return any(not math.isnan(getattr(r, field)) for r in rows)


def _escape(text: str) -> str:
    """``text`` as a regex that matches it literally, in Python's ``re`` and in JavaScript
    (only the metacharacters escaped, so a filter box shows it readably)."""
    return re.sub(r"([.^$*+?()\[\]{}|\\])", r"\\\1", text)


def _exact(tag: str) -> str:
    """A regex matching exactly ``tag``."""
    return f"^{_escape(tag)}$"


def _layout(rows: Sequence[ResultRow], axis: EpsilonAxis) -> layout_pb2.Layout:
    def line(title: str, *tags: str) -> layout_pb2.Chart:
        return layout_pb2.Chart(title=title, multiline=layout_pb2.MultilineChartContent(tag=tags))

    def margin(title: str, tag: str) -> layout_pb2.Chart:
        series = layout_pb2.MarginChartContent.Series(
            value=tag, lower=f"{tag}/low", upper=f"{tag}/high"
        )
        return layout_pb2.Chart(title=title, margin=layout_pb2.MarginChartContent(series=[series]))

    reference = f"; flat: {NO_LEAK_RUN}" if any(r.method == NO_LEAK for r in rows) else ""
    trade_off = [
        line(
            f"AUC of the strongest attack (y) vs {_X_UTILITY} (x); one point per ε, "
            f"chance 0.5{reference}",
            _exact(TRADEOFF_TAG),
        ),
        margin(f"the same AUC with its 95% interval (x: {_X_UTILITY})", TRADEOFF_TAG),
        line(
            f"log10 ε′ (replace-one) of each point (x: {_X_UTILITY})", _exact(TRADEOFF_EPSILON_TAG)
        ),
    ]
    by_epsilon = [
        line("test accuracy vs ε (none: unprotected)", r"^test_accuracy$"),
        line("utility loss vs ε (1 − acc/acc(none))", r"^utility_loss$"),
    ]
    for field, tag, title in METRICS:
        if not _resolved(rows, field):
            continue  # the evaluation set cannot resolve this FPR: nothing to draw
        by_epsilon.append(line(f"{title} vs ε (chance: {CHANCE[field]:g})", _exact(f"best/{tag}")))
    by_epsilon += [
        margin("AUC of the strongest attack vs ε, with its 95% interval", "best/mia_auc"),
        line("noise std per weight vs ε", r"^noise_std$"),
        line(
            "log10 ε at each step, and log10 ε′ (replace-one)",
            r"^grid/log10_epsilon$",
            r"^grid/log10_epsilon_replace_one$",
        ),
        line(
            f"weak guarantee (1: replace-one ε′ > {WEAK_EPSILON:g} or δ′ too large)",
            r"^grid/weak_guarantee$",
        ),
    ]
    attacks = [
        line(f"{tag} per attack vs ε", f"^attack/.*/{_escape(tag)}$")
        for _, tag, _ in (*METRICS, ("", "eps_lower_bound", ""))
    ]
    return layout_pb2.Layout(
        category=[
            layout_pb2.Category(title=f"{LAYOUT_NAME}: attack vs utility", chart=trade_off),
            layout_pb2.Category(title=f"against ε ({axis.caption()})", chart=by_epsilon),
            layout_pb2.Category(title=f"attacks ({axis.caption()})", chart=attacks, closed=True),
        ]
    )


#: The tags the Time Series link shows, as a regex for its tag filter: the trade-off's
#: two cards (Time Series lists matching cards by name, and hides pinned cards while a
#: filter is set; clearing the filter shows the pinned trade-off on top of every card).
_KEY_TAGS = f"^({_escape(TRADEOFF_TAG)}|{_escape(TRADEOFF_EPSILON_TAG)})$"
#: The method runs and the reference: no slash (the hparams sessions have one) and not the
#: root run ".". The one group makes each run its own colour group in Time Series.
_METHOD_RUNS = r"^(?!\.$)([^/]+)$"
#: The root run (the read-me, the layout, the plots), as a run-filter regex.
ROOT_RUN = r"^\.$"


def dashboard_urls(base: str = "http://localhost:6006") -> dict[str, str]:
    """Links that open TensorBoard (2.21) on this folder with smoothing off, only the method
    runs, and the trade-off chart first: Time Series with the trade-off card pinned on top,
    one colour per method (each method run its own colour group; the hparams sessions match
    none, so they take none of the 7 colours) and only the key tags; Custom Scalars with the
    "trade-off" layout (its first chart is the trade-off); HParams; Text and Images on the
    root run.

    Args:
        base: where ``tensorboard --logdir <out>/tb`` serves.

    Returns:
        URLs by view: ``time series``, ``custom scalars``, ``hparams``, ``read me``,
        ``images``.
    """
    pinned = [{"plugin": "scalars", "tag": TRADEOFF_TAG}]
    series = {
        "pinnedCards": json.dumps(pinned, ensure_ascii=False, separators=(",", ":")),
        "smoothing": "0",
        "runFilter": _METHOD_RUNS,
        "runColorGroup": f"regex:{_METHOD_RUNS}",
        "tagFilter": _KEY_TAGS,
    }
    custom = {"_smoothingWeight": "0", "regexInput": _METHOD_RUNS}
    return {
        "time series": f"{base}/?{urlencode(series, quote_via=quote)}#timeseries",
        "custom scalars": f"{base}/#custom_scalars&{urlencode(custom, quote_via=quote)}",
        "hparams": f"{base}/#hparams",
        "read me": f"{base}/#text&{urlencode({'regexInput': ROOT_RUN}, quote_via=quote)}",
        "images": f"{base}/#images&{urlencode({'regexInput': ROOT_RUN}, quote_via=quote)}",
    }


def _weak_rule(members: int | None) -> str:
    """The weak-guarantee rule (``series.is_weak``) in words, for ``members`` members."""
    line = f"1/{members}" if members else f"{WEAK_DELTA_UNKNOWN_N:g}"
    return f"ε′ > {WEAK_EPSILON:g} or δ′ > {line}"


def _weak_table(rows: Sequence[ResultRow], axis: EpsilonAxis, members: int | None) -> list[str]:
    """The read-me's step table: one line per (step, method), with the replace-one ε′, δ′
    the weak flag is decided on (DP-SGD's ε = 10 is ε′ = 20: weak)."""
    found = sorted(
        (p for p in points(rows) if math.isfinite(p.epsilon)),
        key=lambda p: (axis.step(p.epsilon), p.method),
    )
    lines = [
        f"Weak: {_weak_rule(members)} (replace-one, per method: an add/remove ε "
        "is 2ε under replace-one).",
        "",
        "| step | ε asked | method | ε′ | δ′ | weak |",
        "|---|---|---|---|---|---|",
    ]
    for p in found:
        delta = "≥ 1 (proves nothing)" if p.vacuous else f"{p.delta_common:.2g}"
        lines.append(
            f"| {axis.step(p.epsilon)} | {format_epsilon(p.epsilon)} | {p.method} | "
            f"{format_epsilon(p.epsilon_common)} | {delta} | "
            f"{'**weak**' if p.weak_for(members) else ''} |"
        )
    return lines


def read_me(
    rows: Sequence[ResultRow],
    axis: EpsilonAxis,
    *,
    tradeoff: Sequence[TradeoffStep] = (),
    members: int | None = None,
) -> str:
    """The Markdown shown in TensorBoard's Text tab: how to read this folder.

    Args:
        rows: the run's rows.
        axis: the ε axis of the charts against ε.
        tradeoff: the trade-off chart's steps (:func:`tradeoff_steps`), for the points moved.
        members: the number of members (the weak δ′ line is 1/n); ``None``: not known.

    Returns:
        The read-me, as Markdown.
    """
    urls = dashboard_urls()
    coloured = coloured_runs(rows)
    reference = no_leak(rows)
    lines = [
        "# How to read this run",
        "",
        "## The trade-off (first chart)",
        "",
        f"`{TRADEOFF_TAG}`: the strongest attack's AUC (y) against utility (x = "
        f"round({_X_UTILITY})), one point per (method, ε), one line per method; the "
        "unprotected head `none` is one point. Lower and further right is better: less "
        f"leak at more accuracy. `{TRADEOFF_EPSILON_TAG}` gives the ε′ of each point.",
    ]
    if reference is not None:
        lines += [
            "",
            f"`{NO_LEAK_RUN}` is flat across the utility range: the same strongest-attack "
            f"AUC on a release that never saw the members ({reference.mia_auc.mean:.3f}, "
            f"95% interval [{reference.mia_auc.low:.3f}, {reference.mia_auc.high:.3f}]). "
            "Above 0.5 it is the maximum over attacks (selection), not a leak; a point "
            "within its band shows no measurable leak. It is a reference, not a protection.",
        ]
    moved = [t for t in tradeoff if t.moved]
    if moved:
        lines += ["", "Points moved right because another ε of the method had the same step:", ""]
        lines += [
            f"* {t.method} at ε = {format_epsilon(t.epsilon)}: step {t.step} "
            f"(accuracy ×{UTILITY_SCALE} rounds to {t.wanted})"
            for t in moved
        ]
    lines += [
        "",
        "## Charts against ε",
        "",
        f"Their x axis is **log ε**: {axis.caption()}; ε values are charted as log10.",
        "",
        *_weak_table(rows, axis, members),
        "",
        "## Runs, colours, links",
        "",
        "* One run per method, the mean over seeds (scalar `seeds` counts them); the run's "
        "name gives the guarantee kind. `none [none]` is the unprotected head, flat across "
        "the ε grid. Chance is in each chart's title.",
        f"* Colours follow this order: {', '.join(f'`{r}`' for r in coloured)}"
        + (
            f"; TensorBoard has {PALETTE_SIZE} colours, so runs after the seventh share "
            "one (hover a line to read its run)."
            if len(coloured) > PALETTE_SIZE
            else ": each its own."
        ),
        f"* Open with smoothing off (TensorBoard smooths by 0.6 by default, which bends a sweep "
        f"of a few points): [Time Series]({urls['time series']}) (the two trade-off cards; "
        "clear its tag filter for every tag, the trade-off pinned on top), "
        f"[Custom Scalars]({urls['custom scalars']}) (the trade-off first, then one chart "
        f"per metric against ε), [HParams]({urls['hparams']}) (one session per (method, ε); "
        "its scatter view of AUC against ε′, Log scale, is the ε trade-off).",
        "* TensorBoard scales each chart to the 5th-95th percentile of its values by "
        "default, which can cut off the end points of a sweep: untick *Ignore outliers in "
        "chart scaling* to see every point.",
        "* The Scalars dashboards select no run when more than 40 match the run filter; the "
        "links keep only the method runs.",
        "* `best/<metric>` is the strongest attack for that metric, over every attack row; "
        "`best/<metric>/low` and `/high` are its error bar (95% interval over the evaluation "
        "set, or ±1 std where none was recorded). A TPR the evaluation set cannot resolve "
        "(fewer non-members than 1/FPR) is not logged.",
        "* Guarantee kinds: "
        + "; ".join(
            f"`{k}`: {guarantee_words(k)}"
            for k in dict.fromkeys(r.guarantee for r in rows if r.guarantee and r.method != NO_LEAK)
        )
        + ".",
        "* A run marked `add-remove` states an add/remove epsilon (DP-SGD). Under replace-one, "
        "the relation of the post-training mechanisms, it is (2ε, (1 + e^ε)δ): see "
        "`grid/epsilon_replace_one` and `grid/delta_replace_one`.",
    ]
    blocked = infeasible_rows(rows)
    if blocked:
        lines += ["", "## Infeasible cells (not plotted)", ""]
        lines += [
            f"* {r.method} at epsilon {format_epsilon(r.epsilon)}, seed {r.seed}: "
            f"{r.reason or 'no reason recorded'}"
            for r in blocked
        ]
    return "\n".join(lines)


def _images(folder: Path) -> list[summary_pb2.Summary.Value]:
    """Every PNG under ``folder``, tagged ``plots/<path without suffix>``."""
    return [
        events.png(
            f"plots/{path.relative_to(folder).with_suffix('').as_posix()}", path.read_bytes()
        )
        for path in sorted(folder.rglob("*.png"))
        if not path.is_symlink()
    ]


def write_tensorboard(
    rows: Sequence[ResultRow],
    logdir: str | Path,
    *,
    epsilons: Sequence[float],
    hparams: Mapping[str, object] | None = None,
    draws: Sequence[DrawRecord] = (),
    images: Path | None = None,
    members: int | None = None,
) -> Path:
    """(Re)write ``logdir`` from ``rows``: afterwards it holds exactly these rows.

    Args:
        rows: every row of the run (finished cells of an earlier run included).
        logdir: the TensorBoard folder (``<out>/tb``); replaced as a whole.
        epsilons: the run's epsilon grid (with the epsilons of ``rows``, it fixes the x
            axis, so steps stay put while cells finish).
        hparams: the run's settings, added as columns of every hparams session.
        draws: one record per release (its noise draw): counted per session (``releases``).
        images: a folder of PNG plots (``<out>/plots``, from ``write_plots``) to show in the
            Images tab; ``None``: none.
        members: the number of members, for the weak δ′ line (1/n); ``None``: not known
            (then δ′ > 1e-3 is weak, as in the plots).

    Returns:
        ``logdir`` as a Path.

    Raises:
        ValueError: if ``logdir`` exists and is not a folder.
    """
    target = Path(logdir)
    axis = EpsilonAxis(epsilon_grid(rows, epsilons))
    tradeoff = tradeoff_steps(points(rows))
    wall_time = time.time()
    runs = _runs(rows, axis, tradeoff, members)
    sessions = _sessions(rows, draws, hparams or {}, members)
    # TensorBoard lists, and so colours, runs by start time: write them in run_order
    order = run_order(rows, [".", *(name for name, _, _ in sessions)])
    start = {name: wall_time + k for k, name in enumerate(order)}

    def build(folder: Path) -> None:
        for name, steps in runs.items():
            events.write_run(folder / name, steps, wall_time=start[name])
        root = [
            _write_hparams(sessions, folder, start, members),
            events.custom_scalars(_layout(rows, axis)),
            events.text(README_TAG, read_me(rows, axis, tradeoff=tradeoff, members=members)),
            *(_images(images) if images is not None and images.is_dir() else []),
        ]
        events.write_run(folder, {0: root}, wall_time=start["."])

    replace_folder(target, build)
    return target
