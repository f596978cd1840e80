"""TensorBoard output of a run under ``<out>/tb``, (re)written whole from the rows.

:func:`write_tensorboard` builds the folder from the full list of rows in a temporary
folder and then swaps it in, so ``tb/`` holds exactly the rows it was given: a resumed run
(whose rows include the earlier run's) and a re-run both leave no stale events behind.

What it draws is the trade-off:

* **One run per method** (``alm [random-dp]``: the method and its guarantee kind), the mean
  over seeds, so each method is one line in one colour; ``none [none]`` is the unprotected
  head, drawn flat across the grid. Chance levels are in the chart titles (no run of their
  own, which would take a colour).
* **Step = a stated log-spaced ε**: ``step = round(S · log10(ε / ε₀))`` with ``S`` steps per
  decade (100 unless two grid epsilons would share a step) and ``ε₀`` the power of ten at or
  below the smallest grid ε, so the x axis *is* log ε: with ε₀ = 0.1, step 0 is ε = 0.1, 100
  is 1, 200 is 10. Every chart title says so, and ``grid/epsilon`` logs the value at each
  step.
* **Custom scalars**: one chart per metric (accuracy, utility loss, the strongest attack's
  AUC, MIA accuracy and TPR at each FPR the evaluation set resolves), one line per method.
* **HParams**: one session per release (method, ε, seed and noise draw are hyperparameters;
  test accuracy, AUC, MIA accuracy and TPR@FPR its metrics), so the HParams scatter view of
  AUC against ε or against accuracy is the trade-off with every draw as a point.
* **Root run**: the custom-scalars layout, a ``read_me`` text, the hparams experiment and
  the plots as images.

TensorBoard's Time Series view colours runs from a palette of 7; :func:`dashboard_urls`
gives links that colour by method only, with smoothing off.
"""

from __future__ import annotations

import math
import re
import time
from collections import defaultdict
from collections.abc import Mapping, Sequence
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
    WEAK_EPSILON,
    Point,
    cells,
    format_epsilon,
    infeasible_rows,
    points,
)
from alm_opacus.report.words import guarantee_words

LAYOUT_NAME = "trade-off"
HPARAMS_FOLDER = "hparams"
README_TAG = "read_me"
#: TensorBoard's Time Series palette has this many colours (tensorboard 2.21): more method
#: runs than this share colours.
PALETTE_SIZE = 7
#: Steps per decade of epsilon, unless two grid epsilons would share a step.
STEPS_PER_DECADE = 100
#: (results field, tag, title) of each charted metric; TPRs only where resolved.
METRICS = (
    ("mia_auc", "mia_auc", "AUC of the strongest attack"),
    ("mia_accuracy", "mia_accuracy", "MIA accuracy of the strongest attack"),
    ("tpr_at_fpr_0_01", "tpr_at_fpr_0.01", "TPR at 1% FPR"),
    ("tpr_at_fpr_0_001", "tpr_at_fpr_0.001", "TPR at 0.1% FPR"),
)
#: hparams metric tag -> display name
HPARAM_METRICS = {
    "hparams/test_accuracy": "test accuracy",
    "hparams/utility_loss": "utility loss",
    "hparams/mia_auc": "AUC (strongest attack)",
    "hparams/mia_accuracy": "MIA accuracy (strongest attack)",
    "hparams/tpr_at_fpr_0.01": "TPR at 1% FPR",
    "hparams/tpr_at_fpr_0.001": "TPR at 0.1% FPR",
}
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


def _method_label(rows: Sequence[ResultRow], method: str) -> str:
    found = [r for r in rows if r.method == method and r.status != "infeasible"] or [
        r for r in rows if r.method == method
    ]
    kinds = list(dict.fromkeys(r.guarantee for r in found))
    relation = found[0].neighbouring if found else ""
    guarantee = kinds[0] if len(kinds) == 1 else "mixed"
    return run_label(method, guarantee, relation)


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


def _grid_values(point: Point) -> dict[str, float]:
    return {
        "grid/epsilon": point.epsilon,
        "grid/epsilon_replace_one": point.epsilon_common,
        "grid/delta_replace_one": point.delta_common,
        "grid/weak_guarantee": float(point.weak),
    }


def _runs(rows: Sequence[ResultRow], axis: EpsilonAxis) -> dict[str, Steps]:
    """Every scalar and statement, by run (one per method) and step."""
    by_cell = cells(rows)
    runs: dict[str, Steps] = defaultdict(lambda: defaultdict(list))
    labels = {m: _method_label(rows, m) for m in dict.fromkeys(r.method for r in rows)}
    for point in points(rows):
        run = labels[point.method]
        cell_rows = [r for s in point.seeds for r in by_cell[(point.method, point.epsilon, s)]]
        values = _point_values(point, cell_rows)
        first = cell_rows[0]
        text = events.text(
            f"statement/eps={format_epsilon(point.epsilon)}",
            f"seed {first.seed}: {first.statement}",
        )
        if point.method == BASELINE:  # flat across the grid: a reference line
            for step in axis.steps:
                runs[run][step] += events.scalars(values)
            runs[run][axis.steps[0] if axis.steps else 0] += [text]
            continue
        runs[run][axis.step(point.epsilon)] += events.scalars(values | _grid_values(point))
        runs[run][axis.step(point.epsilon)] += [text]
    return runs


def _hparam_value(value: object) -> events.HParamValue:
    return value if isinstance(value, str | int | float | bool) else str(value)


def _sessions(
    rows: Sequence[ResultRow], draws: Sequence[DrawRecord], settings: Mapping[str, object]
) -> list[tuple[str, dict[str, events.HParamValue], dict[str, float]]]:
    """(run name, hparams, metrics) per release: from ``draws`` where a cell has them, else
    one session per cell from its rows (draw ``-1``: the mean over its draws)."""
    by_cell = cells(rows)
    reference = {r.seed: r.test_accuracy for r in rows if r.method == BASELINE}
    have = {(d.method, d.epsilon, d.seed) for d in draws}
    out = []

    def hparams(first: ResultRow, draw: int) -> dict[str, events.HParamValue]:
        return {
            **{k: _hparam_value(v) for k, v in settings.items()},
            "method": first.method,
            "epsilon": first.epsilon,
            "seed": first.seed,
            "draw": draw,
            "guarantee": first.guarantee,
            "neighbouring": first.neighbouring or "unstated",
            "epsilon_replace_one": first.epsilon_replace_one,
            "status": first.status or "ok",
        }

    for d in draws:
        cell_rows = by_cell.get((d.method, d.epsilon, d.seed))
        if not cell_rows:
            continue
        ref = reference.get(d.seed, math.nan)
        metrics = {
            "hparams/test_accuracy": d.test_accuracy,
            "hparams/utility_loss": 1 - d.test_accuracy / ref if ref else math.nan,
            "hparams/mia_auc": d.mia_auc,
            "hparams/mia_accuracy": d.mia_accuracy,
            "hparams/tpr_at_fpr_0.01": d.tpr_at_fpr_0_01,
            "hparams/tpr_at_fpr_0.001": d.tpr_at_fpr_0_001,
        }
        name = (
            f"{HPARAMS_FOLDER}/{d.method}/eps={format_epsilon(d.epsilon)}/seed={d.seed}/"
            f"draw={d.draw}"
        )
        out.append((name, hparams(cell_rows[0], d.draw), metrics))
    for (method, epsilon, seed), cell_rows in sorted(by_cell.items()):
        if (method, epsilon, seed) in have:
            continue
        found = points(cell_rows)
        metrics = {}
        if found:
            p = found[0]
            metrics = {
                "hparams/test_accuracy": p.test_accuracy.mean,
                "hparams/utility_loss": p.utility_loss.mean,
                "hparams/mia_auc": p.mia_auc.mean,
                "hparams/mia_accuracy": p.mia_accuracy.mean,
                "hparams/tpr_at_fpr_0.01": p.tpr_at_fpr_0_01.mean,
                "hparams/tpr_at_fpr_0.001": p.tpr_at_fpr_0_001.mean,
            }
        name = f"{HPARAMS_FOLDER}/{method}/eps={format_epsilon(epsilon)}/seed={seed}/mean"
        out.append((name, hparams(cell_rows[0], -1), metrics))
    return out


def _write_hparams(
    rows: Sequence[ResultRow],
    draws: Sequence[DrawRecord],
    folder: Path,
    settings: Mapping[str, object],
    wall_time: float,
) -> summary_pb2.Summary.Value:
    """One session per release under ``hparams/``; returns the experiment for the root run."""
    sessions = _sessions(rows, draws, settings)
    for name, hparams, metrics in sessions:
        start, end = events.hparams_session(hparams, wall_time=wall_time)
        events.write_run(
            folder / name, {0: [start, *events.scalars(metrics), end]}, wall_time=wall_time
        )
    return events.hparams_experiment([h for _, h, _ in sessions], HPARAM_METRICS)


def _resolved(rows: Sequence[ResultRow], field: str) -> bool:
    return any(not math.isnan(getattr(r, field)) for r in rows)


def _layout(rows: Sequence[ResultRow], axis: EpsilonAxis) -> layout_pb2.Layout:
    def line(title: str, *tags: str) -> layout_pb2.Chart:
        return layout_pb2.Chart(title=title, multiline=layout_pb2.MultilineChartContent(tag=tags))

    def margin(title: str, tag: str) -> layout_pb2.Chart:
        series = layout_pb2.MarginChartContent.Series(
            value=tag, lower=f"{tag}/low", upper=f"{tag}/high"
        )
        return layout_pb2.Chart(title=title, margin=layout_pb2.MarginChartContent(series=[series]))

    trade_off = [
        line("test accuracy vs ε (none: unprotected)", r"^test_accuracy$"),
        line("utility loss vs ε (1 − acc/acc(none))", r"^utility_loss$"),
    ]
    for field, tag, title in METRICS:
        if not _resolved(rows, field):
            continue  # the evaluation set cannot resolve this FPR: nothing to draw
        trade_off.append(
            line(f"{title} vs ε (chance: {CHANCE[field]:g})", f"^best/{re.escape(tag)}$")
        )
    trade_off += [
        margin("AUC of the strongest attack, with its 95% interval", "best/mia_auc"),
        line("noise std per weight vs ε", r"^noise_std$"),
        line(
            "ε at each step (and under replace-one)",
            r"^grid/epsilon$",
            r"^grid/epsilon_replace_one$",
        ),
        line(
            f"weak guarantee (1: replace-one ε > {WEAK_EPSILON:g} or δ too large)",
            r"^grid/weak_guarantee$",
        ),
    ]
    attacks = [
        line(f"{tag} per attack vs ε", f"^attack/.*/{re.escape(tag)}$")
        for _, tag, _ in (*METRICS, ("", "eps_lower_bound", ""))
    ]
    return layout_pb2.Layout(
        category=[
            layout_pb2.Category(title=f"{LAYOUT_NAME} ({axis.caption()})", chart=trade_off),
            layout_pb2.Category(title=f"attacks ({axis.caption()})", chart=attacks, closed=True),
        ]
    )


#: The trade-off tags, as a regex for TensorBoard's tag filter.
_KEY_TAGS = (
    r"^(utility_loss|test_accuracy|best/(mia_auc|mia_accuracy|tpr_at_fpr_0\.01|"
    r"tpr_at_fpr_0\.001))$"
)
#: The method runs: no slash (the hparams sessions have one) and not the root run ".".
_METHOD_RUNS = r"^(?!\.$)([^/]+)$"
#: The root run (the read-me, the layout, the plots), as a run-filter regex.
ROOT_RUN = r"^\.$"


def dashboard_urls(base: str = "http://localhost:6006") -> dict[str, str]:
    """Links that open TensorBoard (2.21) on this folder with smoothing off and only the
    method runs: Time Series with one colour per method (the runs of the hparams sessions
    match no colour group, so they take none of the 7 colours) and only the trade-off tags;
    Custom Scalars with the "trade-off" layout; HParams; Text and Images on the root run.

    Args:
        base: where ``tensorboard --logdir <out>/tb`` serves.

    Returns:
        URLs by view: ``time series``, ``custom scalars``, ``hparams``, ``read me``,
        ``images``.
    """
    series = {
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


def read_me(rows: Sequence[ResultRow], axis: EpsilonAxis) -> str:
    """The Markdown shown in TensorBoard's Text tab: how to read this folder."""
    urls = dashboard_urls()
    methods = list(dict.fromkeys(r.method for r in rows))
    lines = [
        "# How to read this run",
        "",
        f"Every scalar chart has **log ε on its x axis**: {axis.caption()}.",
        "",
        "| step | epsilon | weak guarantee |",
        "|---|---|---|",
        *[
            f"| {axis.step(e)} | {format_epsilon(e)} | {'yes' if e > WEAK_EPSILON else ''} |"
            for e in axis.grid
        ],
        "",
        "* One run per method, the mean over seeds (scalar `seeds` counts them); the run's "
        "name gives the guarantee kind. `none [none]` is the unprotected head, flat across "
        "the grid. Chance is in each chart's title.",
        f"* Open with smoothing off (TensorBoard smooths by 0.6 by default, which bends a sweep "
        f"of a few points): [Time Series]({urls['time series']}) (one colour per method), "
        f"[Custom Scalars]({urls['custom scalars']}) (one chart per metric, one line per "
        f"method), [HParams]({urls['hparams']}) (one session per release: method, epsilon, "
        "seed and noise draw; its scatter view of AUC against epsilon or accuracy is the "
        "trade-off, every draw a point).",
        f"* The Time Series palette has {PALETTE_SIZE} colours"
        + (
            f": with {len(methods)} methods, some share one; hover a line to read its run."
            if len(methods) > PALETTE_SIZE
            else ": each method here has its own."
        )
        + " The Scalars dashboards select no run when more than 40 match the run filter; "
        "the links keep only the method runs.",
        "* `best/<metric>` is the strongest attack for that metric, over every attack row; "
        "`best/<metric>/low` and `/high` are its error bar (95% interval over the evaluation "
        "set, or ±1 std where none was recorded). A TPR the evaluation set cannot resolve "
        "(fewer non-members than 1/FPR) is not logged.",
        "* Guarantee kinds: "
        + "; ".join(
            f"`{k}`: {guarantee_words(k)}"
            for k in dict.fromkeys(r.guarantee for r in rows if r.guarantee)
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
) -> Path:
    """(Re)write ``logdir`` from ``rows``: afterwards it holds exactly these rows.

    Args:
        rows: every row of the run (finished cells of an earlier run included).
        logdir: the TensorBoard folder (``<out>/tb``); replaced as a whole.
        epsilons: the run's epsilon grid (with the epsilons of ``rows``, it fixes the x
            axis, so steps stay put while cells finish).
        hparams: the run's settings, added as columns of every hparams session.
        draws: one record per release (its noise draw): an hparams session each; cells
            without records get one session from their rows.
        images: a folder of PNG plots (``<out>/plots``, from ``write_plots``) to show in the
            Images tab; ``None``: none.

    Returns:
        ``logdir`` as a Path.

    Raises:
        ValueError: if ``logdir`` exists and is not a folder.
    """
    target = Path(logdir)
    axis = EpsilonAxis(epsilon_grid(rows, epsilons))
    wall_time = time.time()

    def build(folder: Path) -> None:
        for name, steps in _runs(rows, axis).items():
            events.write_run(folder / name, steps, wall_time=wall_time)
        root = [
            _write_hparams(rows, draws, folder, hparams or {}, wall_time),
            events.custom_scalars(_layout(rows, axis)),
            events.text(README_TAG, read_me(rows, axis)),
            *(_images(images) if images is not None and images.is_dir() else []),
        ]
        events.write_run(folder, {0: root}, wall_time=wall_time)

    replace_folder(target, build)
    return target
