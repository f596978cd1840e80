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

import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from tensorboard.compat.proto import summary_pb2

from alm_opacus.report import events
from alm_opacus.report.draws import DrawRecord
from alm_opacus.report.folders import replace_folder
from alm_opacus.report.results import ResultRow
from alm_opacus.report.series import points
from alm_opacus.report.tb_hparams import (
    HPARAM_COLUMNS,
    HPARAM_METRICS,
    HPARAMS_FOLDER,
    hparams_sessions,
    write_hparams,
)
from alm_opacus.report.tb_runs import (
    LAYOUT_NAME,
    METRICS,
    NO_LEAK_RUN,
    PALETTE_SIZE,
    POLYMER_PALETTE,
    README_TAG,
    STEPS_PER_DECADE,
    TIME_SERIES_PALETTE,
    TRADEOFF_EPSILON_TAG,
    TRADEOFF_TAG,
    UTILITY_SCALE,
    EpsilonAxis,
    Steps,
    TradeoffStep,
    coloured_runs,
    epsilon_grid,
    run_label,
    run_order,
    run_scalars,
    tradeoff_steps,
)
from alm_opacus.report.tb_views import ROOT_RUN, dashboard_urls, layout, read_me

# The runs' scalars, the hparams sessions and the dashboards' layout, links and read-me are
# built in tb_runs, tb_hparams and tb_views; their public names stay importable from here.
__all__ = [
    "HPARAMS_FOLDER",
    "HPARAM_COLUMNS",
    "HPARAM_METRICS",
    "LAYOUT_NAME",
    "METRICS",
    "NO_LEAK_RUN",
    "PALETTE_SIZE",
    "POLYMER_PALETTE",
    "README_TAG",
    "ROOT_RUN",
    "STEPS_PER_DECADE",
    "TIME_SERIES_PALETTE",
    "TRADEOFF_EPSILON_TAG",
    "TRADEOFF_TAG",
    "UTILITY_SCALE",
    "EpsilonAxis",
    "Steps",
    "TradeoffStep",
    "coloured_runs",
    "dashboard_urls",
    "epsilon_grid",
    "read_me",
    "run_label",
    "run_order",
    "tradeoff_steps",
    "write_tensorboard",
]


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
    runs = run_scalars(rows, axis, tradeoff, members)
    sessions = hparams_sessions(rows, draws, hparams or {}, members)
    # TensorBoard lists, and so colours, runs by start time: write them in run_order
    order = run_order(rows, [".", *(name for name, _, _ in sessions)])
    start = {name: wall_time + k for k, name in enumerate(order)}

    def build(folder: Path) -> None:
        for name, steps in runs.items():
            events.write_run(folder / name, steps, wall_time=start[name])
        root = [
            write_hparams(sessions, folder, start, members),
            events.custom_scalars(layout(rows, axis)),
            events.text(README_TAG, read_me(rows, axis, tradeoff=tradeoff, members=members)),
            *(_images(images) if images is not None and images.is_dir() else []),
        ]
        events.write_run(folder, {0: root}, wall_time=start["."])

    replace_folder(target, build)
    return target
