"""Plots of a run, as PNG and PDF: the trade-off first (attack strength against utility, one
line per method), then the ALM paper's Figures 1 and 2, the attack metrics with their
intervals, the equal-noise and equal-utility views, and ROC curves on log-log axes.

Conventions shared by every figure (docs/reading_results.md explains them to users):

* colour = method (:func:`~alm_opacus.report.series.method_colours`); marker and line
  style = guarantee kind (:data:`~alm_opacus.report.series.GUARANTEE_STYLES`); a guarantee
  that is not DP (random DP, per-query, none) is drawn with hollow markers and named
  "not DP" in the legend, so that it never looks like a DP one;
* epsilon is on a log axis and under replace-one: add/remove epsilons (DP-SGD) are
  converted (marked †); the region epsilon > 10 is shaded as a weak guarantee;
* each point is the mean over seeds of each seed's strongest attack; error bars are the
  95% intervals (AUC, TPR) or +-1 std (utility, accuracy), see ``series.Stat``;
* the unprotected baseline (method ``none``), the no-leak reference where the run has one,
  and chance are drawn as references, never as methods;
* infeasible cells are not plotted and are listed in the footnote; a panel the evaluation
  set cannot resolve (TPR at an FPR below one non-member) is not drawn;
* every figure is drawn for report.html's column (:data:`PAGE_WIDTH_PX`): its PNG is at
  most that wide, so no text is shown smaller than :data:`MIN_TEXT_PX`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # headless: plots are files, never windows

import matplotlib.pyplot as plt
from matplotlib.figure import Figure

from alm_opacus.report.epsilon_plots import (
    attack_figure,
    equal_noise_figure,
    mia_figure,
    utility_figure,
)
from alm_opacus.report.folders import replace_folder
from alm_opacus.report.plot_style import (
    DP_KINDS,
    MIN_TEXT_PX,
    NO_LEAK_COLOUR,
    NO_LEAK_LABEL,
    NOT_DP,
    PAGE_WIDTH_PX,
    PNG_DPI,
    WEAK_COLOUR,
    WEAK_LABEL,
    footnote,
    is_dp,
    save_figure,
    series_label,
)
from alm_opacus.report.results import ResultRow
from alm_opacus.report.roc_plots import (
    RocMap,
    roc_epsilon,
    roc_figure,
    roc_floor,
    roc_grid_figure,
)
from alm_opacus.report.tradeoff_plot import tradeoff_figure

# The figures live in their own modules (plot_style, tradeoff_plot, epsilon_plots,
# roc_plots); their public names stay importable from here.
__all__ = [
    "DP_KINDS",
    "FIGURES",
    "MIN_TEXT_PX",
    "NOT_DP",
    "NO_LEAK_COLOUR",
    "NO_LEAK_LABEL",
    "PAGE_WIDTH_PX",
    "PNG_DPI",
    "WEAK_COLOUR",
    "WEAK_LABEL",
    "RocMap",
    "attack_figure",
    "equal_noise_figure",
    "figures",
    "footnote",
    "is_dp",
    "mia_figure",
    "roc_epsilon",
    "roc_figure",
    "roc_floor",
    "roc_grid_figure",
    "series_label",
    "tradeoff_figure",
    "utility_figure",
    "write_plots",
]

#: The figures of ``plots/``, by file stem, in the order report.html shows them: the

#: trade-off first. report.html and TensorBoard's Images tab load them by these names.
FIGURES = (
    "tradeoff",
    "fig1_utility_loss",
    "attacks_vs_epsilon",
    "fig2_mia",
    "equal_noise",
    "roc_loglog",
    "roc_by_epsilon",
)


def figures(
    rows: Sequence[ResultRow],
    rocs: RocMap,
    *,
    members: int | None = None,
    nonmembers: int | None = None,
    num_classes: int | None = None,
) -> dict[str, Callable[[], Figure]]:
    """Every figure of a run, by file stem in :data:`FIGURES` order, as a function that
    draws it: ``roc_loglog`` is at :func:`roc_epsilon`, ``roc_by_epsilon`` at each
    epsilon."""
    out: dict[str, Callable[[], Figure]] = {
        "tradeoff": lambda: tradeoff_figure(rows, members=members, num_classes=num_classes),
        "fig1_utility_loss": lambda: utility_figure(rows),
        "attacks_vs_epsilon": lambda: attack_figure(rows, nonmembers=nonmembers),
        "fig2_mia": lambda: mia_figure(rows),
        "equal_noise": lambda: equal_noise_figure(rows),
    }
    if rocs:
        out["roc_loglog"] = lambda: roc_figure(rocs, rows=rows, members=members)
    if any(math.isfinite(e) for (_, e, _) in rocs):
        out["roc_by_epsilon"] = lambda: roc_grid_figure(rocs, rows=rows, members=members)
    return {stem: out[stem] for stem in FIGURES if stem in out}


def write_plots(
    rows: Sequence[ResultRow],
    rocs: RocMap,
    folder: Path,
    *,
    members: int | None = None,
    nonmembers: int | None = None,
    num_classes: int | None = None,
) -> list[Path]:
    """Replace ``folder`` with every figure of :func:`figures`, as ``<stem>.png``
    (:data:`PNG_DPI`) and ``<stem>.pdf``: afterwards it holds exactly this run's figures.

    Args:
        rows: the run's rows.
        rocs: the ROC curves of ``rocs.jsonl`` (:mod:`alm_opacus.report.rocs`).
        folder: where the figures go (replaced whole).
        members: the member count (the weak-δ′ line 1/n); unknown: 1e-3.
        nonmembers: the evaluation set's non-member count, which decides the TPR panels
            drawn; unknown: a panel is drawn where some row has a value.
        num_classes: the class count (the chance accuracy line of the trade-off).

    Returns:
        The paths written (inside ``folder``), PNG then PDF per figure.

    Raises:
        ValueError: if ``folder`` exists and is not a folder.
    """
    drawers = figures(rows, rocs, members=members, nonmembers=nonmembers, num_classes=num_classes)
    names = [f"{stem}{suffix}" for stem in drawers for suffix in (".png", ".pdf")]

    def build(tmp: Path) -> None:
        for stem, draw in drawers.items():
            fig = draw()
            try:
                save_figure(fig, [(tmp / f"{stem}.png", PNG_DPI), (tmp / f"{stem}.pdf", None)])
            finally:
                plt.close(fig)

    replace_folder(folder, build)
    return [folder / name for name in names]
