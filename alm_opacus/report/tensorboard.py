"""TensorBoard output of a run under ``<out>/tb``, (re)written whole from the rows.

:func:`write_tensorboard` builds the folder from the full list of rows in a temporary
folder and then swaps it in, so ``tb/`` holds exactly the rows it was given: a resumed run
(whose rows include the earlier run's) and a re-run both leave no stale events behind.

* **Runs** (sub-folders): ``<method> [<guarantee>]/seed=<s>`` per method and seed, and
  ``<method> [<guarantee>]/mean`` (the mean over seeds, when there are several); an
  add/remove guarantee says so: ``dpsgd [approx-dp, add-remove]``. ``none [none]/...`` is the
  unprotected baseline and ``chance`` a random guess, both drawn flat across the grid.
* **Step** = the index of epsilon in the sorted grid (monotonic, one event per step), with
  the value beside it as the scalars ``grid/epsilon``, ``grid/epsilon_replace_one`` and
  ``grid/weak_guarantee`` (1 where the replace-one epsilon exceeds 10).
* **Scalars**: ``test_accuracy``, ``utility_loss``, ``noise_std``; ``best/<metric>`` (the
  strongest attack for that metric) with ``best/<metric>/low|high`` (its error bar, as in
  the plots); ``attack/<attack>/<metric>``; ``eps_lower_bound_ceiling``.
* **Root run**: the custom-scalars layout "trade-off", a ``read_me`` text (the grid, how to
  read the charts, the infeasible cells), the hparams experiment, and the plots as images.
* **HParams**: one session per (method, epsilon, seed) cell under ``hparams/``, with
  ``method``, ``epsilon``, ``delta``, ``guarantee``, ``neighbouring``, ``seed``, ``status``
  (and the run's settings) as columns.
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

LAYOUT_NAME = "trade-off"
CHANCE_RUN = "chance"
HPARAMS_FOLDER = "hparams"
README_TAG = "read_me"
#: (results field, tag) of each attack metric
METRICS = (
    ("mia_auc", "mia_auc"),
    ("mia_accuracy", "mia_accuracy"),
    ("tpr_at_fpr_0_01", "tpr_at_fpr_0.01"),
    ("tpr_at_fpr_0_001", "tpr_at_fpr_0.001"),
)
#: hparams metric tag -> display name
HPARAM_METRICS = {
    "hparams/test_accuracy": "test accuracy",
    "hparams/utility_loss": "utility loss",
    "hparams/best_mia_auc": "AUC (strongest attack)",
    "hparams/best_mia_auc_low": "AUC bar low",
    "hparams/best_mia_auc_high": "AUC bar high",
    "hparams/best_mia_accuracy": "MIA accuracy (strongest attack)",
    "hparams/best_tpr_at_fpr_0.01": "TPR at 1% FPR",
    "hparams/best_tpr_at_fpr_0.001": "TPR at 0.1% FPR",
    "hparams/noise_std": "noise std",
}
Steps = dict[int, list[summary_pb2.Summary.Value]]


def run_label(method: str, guarantee: str, neighbouring: str) -> str:
    """The run-name prefix of a method: its guarantee kind, and add-remove where it applies."""
    relation = f", {ADD_REMOVE}" if neighbouring == ADD_REMOVE else ""
    return f"{method} [{guarantee}{relation}]"


def epsilon_grid(rows: Sequence[ResultRow], epsilons: Sequence[float]) -> list[float]:
    """The sorted finite epsilons of ``epsilons`` and ``rows``: step k is the k-th."""
    found = {float(e) for e in epsilons} | {r.epsilon for r in rows}
    return sorted(e for e in found if math.isfinite(e))


def _point_values(point: Point, rows: Sequence[ResultRow]) -> dict[str, float]:
    """The scalars of one point; ``rows`` are its cells' rows (for the per-attack tags)."""
    values = {
        "test_accuracy": point.test_accuracy.mean,
        "utility_loss": point.utility_loss.mean,
        "noise_std": point.noise_std,
        "best/eps_lower_bound": point.eps_lower_bound,
        "eps_lower_bound_ceiling": point.eps_lower_bound_ceiling,
    }
    for field, tag in METRICS:
        stat = getattr(point, field)
        values[f"best/{tag}"] = stat.mean
        if stat.kind:
            values |= {f"best/{tag}/low": stat.low, f"best/{tag}/high": stat.high}
    per_attack: dict[str, list[ResultRow]] = defaultdict(list)
    for row in rows:
        if row.attack:
            per_attack[row.attack].append(row)
    for attack, attack_rows in per_attack.items():
        for field, tag in (*METRICS, ("eps_lower_bound", "eps_lower_bound")):
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


def _runs(rows: Sequence[ResultRow], grid: Sequence[float]) -> dict[str, Steps]:
    """Every scalar and statement, by run name and step."""
    by_cell = cells(rows)
    seeds = sorted({r.seed for r in rows})
    groups: list[tuple[str, Sequence[int]]] = [(f"seed={s}", [s]) for s in seeds]
    if len(seeds) > 1:
        groups.append(("mean", seeds))
    runs: dict[str, Steps] = defaultdict(lambda: defaultdict(list))
    for who, chosen in groups:
        for point in points(rows, seeds=chosen):
            run = f"{run_label(point.method, point.guarantee, point.neighbouring)}/{who}"
            cell_rows = [r for s in point.seeds for r in by_cell[(point.method, point.epsilon, s)]]
            values = _point_values(point, cell_rows)
            if who == "mean":
                values["seeds"] = float(len(point.seeds))
            tag = f"statement/eps={format_epsilon(point.epsilon)}"
            texts = [] if who == "mean" else [events.text(tag, cell_rows[0].statement)]
            if point.method == BASELINE:  # flat across the grid: a reference line
                for step in range(len(grid)):
                    runs[run][step] += events.scalars(values)
                runs[run][0] += texts
                continue
            step = grid.index(point.epsilon)
            runs[run][step] += events.scalars(values | _grid_values(point)) + texts
    for step in range(len(grid)):
        runs[CHANCE_RUN][step] += events.scalars({f"best/{t}": CHANCE[f] for f, t in METRICS})
    return runs


def _hparam_value(value: object) -> events.HParamValue:
    return value if isinstance(value, str | int | float | bool) else str(value)


def _session(
    cell_rows: Sequence[ResultRow], settings: Mapping[str, object]
) -> dict[str, events.HParamValue]:
    first = cell_rows[0]
    return {
        **{k: _hparam_value(v) for k, v in settings.items()},
        "method": first.method,
        "epsilon": first.epsilon,
        "delta": first.delta,
        "guarantee": first.guarantee,
        "neighbouring": first.neighbouring or "unstated",
        "epsilon_replace_one": first.epsilon_replace_one,
        "seed": first.seed,
        "status": first.status or "ok",
        "noise_source": first.noise_source or "unstated",
    }


def _session_metrics(cell_rows: Sequence[ResultRow]) -> dict[str, float]:
    found = points(cell_rows)
    if not found:
        return {}
    p = found[0]
    return {
        "hparams/test_accuracy": p.test_accuracy.mean,
        "hparams/utility_loss": p.utility_loss.mean,
        "hparams/best_mia_auc": p.mia_auc.mean,
        "hparams/best_mia_auc_low": p.mia_auc.low,
        "hparams/best_mia_auc_high": p.mia_auc.high,
        "hparams/best_mia_accuracy": p.mia_accuracy.mean,
        "hparams/best_tpr_at_fpr_0.01": p.tpr_at_fpr_0_01.mean,
        "hparams/best_tpr_at_fpr_0.001": p.tpr_at_fpr_0_001.mean,
        "hparams/noise_std": p.noise_std,
    }


def _write_hparams(
    rows: Sequence[ResultRow], folder: Path, settings: Mapping[str, object], wall_time: float
) -> summary_pb2.Summary.Value:
    """One session per cell under ``hparams/``; returns the experiment for the root run."""
    sessions = []
    for (method, epsilon, seed), cell_rows in sorted(cells(rows).items()):
        hparams = _session(cell_rows, settings)
        sessions.append(hparams)
        name = f"{HPARAMS_FOLDER}/{method}/eps={format_epsilon(epsilon)}/seed={seed}"
        start, end = events.hparams_session(hparams, wall_time=wall_time)
        metrics = events.scalars(_session_metrics(cell_rows))
        events.write_run(folder / name, {0: [start, *metrics, end]}, wall_time=wall_time)
    return events.hparams_experiment(sessions, HPARAM_METRICS)


def grid_caption(grid: Sequence[float]) -> str:
    """What the step axis means, for chart titles."""
    weak = [k for k, e in enumerate(grid) if e > WEAK_EPSILON]
    text = f"x = step k: the k-th ε of [{', '.join(format_epsilon(e) for e in grid)}]"
    return text + (f"; steps ≥ {weak[0]}: ε > {WEAK_EPSILON:g}, weak guarantee" if weak else "")


def _layout(grid: Sequence[float]) -> layout_pb2.Layout:
    def line(title: str, *tags: str) -> layout_pb2.Chart:
        return layout_pb2.Chart(title=title, multiline=layout_pb2.MultilineChartContent(tag=tags))

    def margin(title: str, tag: str) -> layout_pb2.Chart:
        series = layout_pb2.MarginChartContent.Series(
            value=tag, lower=f"{tag}/low", upper=f"{tag}/high"
        )
        return layout_pb2.Chart(title=title, margin=layout_pb2.MarginChartContent(series=[series]))

    trade_off = [
        line("utility loss vs ε", r"^utility_loss$"),
        line("test accuracy vs ε", r"^test_accuracy$"),
        line(
            "AUC of the strongest attack vs ε (chance run: 0.5; none: unprotected)",
            r"^best/mia_auc$",
        ),
        margin("AUC of the strongest attack, with its error bar", "best/mia_auc"),
        line("MIA accuracy of the strongest attack vs ε", r"^best/mia_accuracy$"),
        line("TPR at 1% FPR vs ε", r"^best/tpr_at_fpr_0\.01$"),
        line("TPR at 0.1% FPR vs ε", r"^best/tpr_at_fpr_0\.001$"),
        line("noise std per weight vs ε (equal-noise view: use a log y axis)", r"^noise_std$"),
        line(
            "ε at each step (replace-one: converted for add-remove runs)",
            r"^grid/epsilon$",
            r"^grid/epsilon_replace_one$",
        ),
        line(
            f"weak guarantee at each step (1: replace-one ε > {WEAK_EPSILON:g})",
            r"^grid/weak_guarantee$",
        ),
    ]
    attacks = [
        line(f"{tag} per attack vs ε", f"^attack/.*/{re.escape(tag)}$")
        for _, tag in (*METRICS, ("", "eps_lower_bound"))
    ]
    return layout_pb2.Layout(
        category=[
            layout_pb2.Category(title=f"{LAYOUT_NAME} ({grid_caption(grid)})", chart=trade_off),
            layout_pb2.Category(
                title=f"attacks ({grid_caption(grid)})", chart=attacks, closed=True
            ),
        ]
    )


#: The trade-off tags, as a regex for TensorBoard's tag filter.
_KEY_TAGS = (
    r"^(utility_loss|test_accuracy|noise_std|best/(mia_auc|mia_accuracy|tpr_at_fpr_0\.01|"
    r"tpr_at_fpr_0\.001)|grid/(epsilon|epsilon_replace_one|weak_guarantee))$"
)
#: Every run but the hparams sessions (which would push the run count past the 40 that the
#: Scalars and Custom Scalars dashboards select by default).
_RUNS = "^(?!hparams/)"
#: The root run (the read-me, the layout, the plots), as a run-filter regex.
ROOT_RUN = r"^\.$"


def dashboard_urls(base: str = "http://localhost:6006") -> dict[str, str]:
    """Links that open TensorBoard (2.21) on this folder with smoothing off and the hparams
    sessions hidden: Time Series colours the runs by method and shows only the trade-off
    tags; Custom Scalars shows the "trade-off" layout; Text and Images select the root run
    (the read-me and the plots). Checked in headless Chromium.

    Args:
        base: where ``tensorboard --logdir <out>/tb`` serves.

    Returns:
        URLs by view: ``time series``, ``custom scalars``, ``read me``, ``images``.
    """
    series = {"smoothing": "0", "runFilter": _RUNS, "runColorGroup": r"regex:^([^ ]+)",
              "tagFilter": _KEY_TAGS}  # fmt: skip
    custom = {"_smoothingWeight": "0", "regexInput": _RUNS}
    return {
        "time series": f"{base}/?{urlencode(series, quote_via=quote)}#timeseries",
        "custom scalars": f"{base}/#custom_scalars&{urlencode(custom, quote_via=quote)}",
        "read me": f"{base}/#text&{urlencode({'regexInput': ROOT_RUN}, quote_via=quote)}",
        "images": f"{base}/#images&{urlencode({'regexInput': ROOT_RUN}, quote_via=quote)}",
    }


def read_me(rows: Sequence[ResultRow], grid: Sequence[float]) -> str:
    """The Markdown shown in TensorBoard's Text tab: how to read this folder."""
    urls = dashboard_urls()
    lines = [
        "# How to read this run",
        "",
        "Every scalar chart has **step k = the k-th epsilon of the grid** on its x axis:",
        "",
        "| step | epsilon | weak guarantee (epsilon > 10) |",
        "|---|---|---|",
        *[
            f"| {k} | {format_epsilon(e)} | {'yes' if e > WEAK_EPSILON else ''} |"
            for k, e in enumerate(grid)
        ],
        "",
        "* One run per `method [guarantee]` and seed; `…/mean` is the mean over seeds (its "
        "scalar `seeds` counts them). `none [none]` is the unprotected model and `chance` a "
        "random guess, drawn flat across the grid. Type `mean` in the run filter to compare "
        "methods on their means only.",
        "* **Set smoothing to 0** (TensorBoard smooths by 0.6 by default, which bends a "
        "sweep of a few points): the Smoothing slider in the settings of Time Series and in "
        "the side bar of Custom Scalars. These links (for `--port 6006`) open the charts "
        "with smoothing off, the hparams sessions hidden and, in Time Series, one colour "
        f"per method: [Time Series]({urls['time series']}), "
        f"[Custom Scalars]({urls['custom scalars']}). The Scalars and Custom Scalars "
        "dashboards select no run at all when more than 40 match the run filter.",
        "* `best/<metric>` is the strongest attack for that metric, over every attack row; "
        "`best/<metric>/low` and `/high` are its error bar (95% interval over the evaluation "
        "set, or ±1 std where none was recorded).",
        "* A run marked `add-remove` states an add/remove epsilon (DP-SGD). Under replace-one, "
        "the relation of the post-training mechanisms, it is (2ε, (1 + e^ε)δ): see "
        "`grid/epsilon_replace_one` and `grid/delta_replace_one`.",
        "* The plots (Images tab) are the same figures as `plots/` in the run folder, with "
        "the equal-noise and equal-utility views that a step axis cannot show.",
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
    images: Path | None = None,
) -> Path:
    """(Re)write ``logdir`` from ``rows``: afterwards it holds exactly these rows.

    Args:
        rows: every row of the run (finished cells of an earlier run included).
        logdir: the TensorBoard folder (``<out>/tb``); replaced as a whole.
        epsilons: the run's epsilon grid; step k of every chart is its k-th smallest value
            (epsilons of ``rows`` outside it are added), so steps stay put while cells finish.
        hparams: the run's settings, added as columns of every hparams session.
        images: a folder of PNG plots (``<out>/plots``, from ``write_plots``) to show in the
            Images tab; ``None``: none.

    Returns:
        ``logdir`` as a Path.

    Raises:
        ValueError: if ``logdir`` exists and is not a folder.
    """
    target = Path(logdir)
    grid = epsilon_grid(rows, epsilons)
    wall_time = time.time()

    def build(folder: Path) -> None:
        for name, steps in _runs(rows, grid).items():
            events.write_run(folder / name, steps, wall_time=wall_time)
        root = [
            _write_hparams(rows, folder, hparams or {}, wall_time),
            events.custom_scalars(_layout(grid)),
            events.text(README_TAG, read_me(rows, grid)),
            *(_images(images) if images is not None and images.is_dir() else []),
        ]
        events.write_run(folder, {0: root}, wall_time=wall_time)

    replace_folder(target, build)
    return target
