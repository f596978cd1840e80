"""Plots of a run, as PNG and PDF: the ALM paper's Figures 1 and 2, the attack metrics with
their intervals, the equal-noise and equal-utility views, and ROC curves on log-log axes.

Conventions shared by every figure (docs/reading_results.md explains them to users):

* colour = method (:func:`~alm_opacus.report.series.method_colours`); marker and line
  style = guarantee kind (:data:`~alm_opacus.report.series.GUARANTEE_STYLES`), one series
  per (method, kind), so a line never joins points of different kinds;
* epsilon is on a log axis and under replace-one: add/remove epsilons (DP-SGD) are
  converted (marked †); the region epsilon > 10 is shaded as a weak guarantee;
* each point is the mean over seeds of each seed's strongest attack; error bars are the
  95% intervals (AUC, TPR) or +-1 std (utility, accuracy), see ``series.Stat``;
* the unprotected baseline (method ``none``) and chance are drawn as reference lines;
* infeasible cells are not plotted and are listed in the footnote.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # headless: plots are files, never windows

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.artist import Artist
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import FuncFormatter, NullFormatter

from alm_opacus.report.folders import replace_folder
from alm_opacus.report.results import ResultRow
from alm_opacus.report.series import (
    BASELINE,
    CHANCE,
    CHANCE_COLOUR,
    WEAK_EPSILON,
    Point,
    Stat,
    format_epsilon,
    guarantee_style,
    infeasible_rows,
    method_colours,
    points,
)

RocMap = Mapping[tuple[str, float, str], tuple[Sequence[float], Sequence[float]]]
Getter = Callable[[Point], Stat]
#: What the error bars are, per kind of ``series.Stat``.
_BAR_NOTE = {
    "ci95": "AUC and TPR bars: 95% interval over the evaluation set (several seeds: the union "
    "of the per-seed intervals)",
    "std": "utility and accuracy bars (and AUC/TPR bars where no interval was recorded): "
    "±1 std over seeds and noise draws",
}
#: Reference artists, listed after the series in the legend.
_REFERENCES = ("unprotected (none)", "unprotected: 95% interval", "chance")
WEAK_COLOUR = "#fbe0c0"
WEAK_LABEL = f"ε > {WEAK_EPSILON:g}: weak guarantee"


class _Figure:
    """One figure of a run: its points, colours and the notes for its footnote."""

    def __init__(self, rows: Sequence[ResultRow], *, panels: int, title: str) -> None:
        self.rows = rows
        self.points = points(rows)
        self.protected = [p for p in self.points if p.method != BASELINE]
        self.baseline = [p for p in self.points if p.method == BASELINE]
        self.colours = method_colours([p.method for p in self.points])
        self.fig, axes = plt.subplots(1, panels, figsize=(5.2 * panels, 4.2), squeeze=False)
        self.axes: list[Axes] = list(axes[0])
        self.fig.suptitle(title)
        self.bars: set[str] = set()

    def series(
        self, keep: Callable[[Point], bool] = lambda p: True
    ) -> dict[tuple[str, str], list[Point]]:
        """Protected points per (method, guarantee kind under replace-one), by epsilon."""
        out: dict[tuple[str, str], list[Point]] = defaultdict(list)
        for point in self.protected:
            if keep(point):
                out[(point.method, point.common_guarantee)].append(point)
        return {k: sorted(v, key=lambda p: p.epsilon_common) for k, v in sorted(out.items())}

    def draw(
        self,
        ax: Axes,
        x: Callable[[Point], float],
        y: Getter,
        *,
        keep: Callable[[Point], bool] = lambda p: True,
        label_points: bool = False,
    ) -> None:
        """One error-bar series per (method, kind): ``y`` against ``x``."""
        for (method, kind), pts in self.series(keep).items():
            pts = [p for p in pts if not math.isnan(y(p).mean) and not math.isnan(x(p))]
            if not pts:
                continue
            xs = np.array([x(p) for p in pts])
            stats = [y(p) for p in pts]
            means = np.array([s.mean for s in stats])
            err = np.array(
                [
                    [s.mean - s.low if s.kind else 0.0 for s in stats],
                    [s.high - s.mean if s.kind else 0.0 for s in stats],
                ]
            )
            self.bars |= {s.kind for s in stats if s.kind}
            marker, line = guarantee_style(kind)
            label = f"{method} ({kind})" + ("†" if any(p.converted for p in pts) else "")
            ax.errorbar(
                xs,
                means,
                yerr=np.nan_to_num(err),
                color=self.colours[method],
                marker=marker,
                ls=line,
                capsize=3,
                ms=5,
                lw=1.3,
                label=label,
            )
            if label_points:
                for xv, yv, p in zip(xs, means, pts, strict=True):
                    ax.annotate(
                        format_epsilon(p.epsilon_common),
                        (xv, yv),
                        fontsize=6,
                        xytext=(3, 3),
                        textcoords="offset points",
                        color=self.colours[method],
                    )

    def references(self, ax: Axes, y: Getter, *, chance: float | None = None) -> None:
        """The unprotected baseline (its mean, and its interval as a band) and chance."""
        if self.baseline:
            stat = y(self.baseline[0])
            if not math.isnan(stat.mean):
                ax.axhline(stat.mean, color="black", lw=1, ls="--", label=_REFERENCES[0])
                if stat.kind == "ci95":
                    ax.axhspan(
                        stat.low, stat.high, color="black", alpha=0.07, lw=0, label=_REFERENCES[1]
                    )
        if chance is not None:
            ax.axhline(chance, color=CHANCE_COLOUR, lw=1, ls=":", label=_REFERENCES[2])

    def epsilon_axis(self, ax: Axes) -> None:
        """Log x axis of replace-one epsilon, with the weak region shaded and labelled."""
        ax.set_xlabel("ε (replace-one)")
        _log_axis(ax, "x")
        if not ax.has_data():
            return
        left, right = ax.get_xlim()
        if right > WEAK_EPSILON:
            start = max(left, WEAK_EPSILON)
            ax.axvspan(start, right, color=WEAK_COLOUR, lw=0, zorder=0, label=WEAK_LABEL)
            ax.text(
                math.sqrt(start * right),
                0.98,
                WEAK_LABEL,
                fontsize=7,
                ha="center",
                va="top",
                transform=ax.get_xaxis_transform(),
                color="#8a4b08",
            )
            ax.set_xlim(left, right)

    def finish(self) -> Figure:
        """The legends (series, then guarantee kinds) and the footnote; returns the figure."""
        handles, labels = _unique_handles(self.axes)
        fig = self.fig
        fig.legend(handles, labels, loc="upper left", bbox_to_anchor=(1.0, 0.92), fontsize=8)
        kinds = sorted({p.common_guarantee for p in self.protected})
        styles = [
            Line2D([], [], color="0.3", marker=guarantee_style(k)[0], ls=guarantee_style(k)[1])
            for k in kinds
        ]
        if kinds:
            fig.legend(
                styles,
                kinds,
                title="guarantee (marker, line)",
                loc="lower left",
                bbox_to_anchor=(1.0, 0.08),
                fontsize=8,
                title_fontsize=8,
            )
        note = footnote(self.rows, self.points, bars=sorted(self.bars))
        if note:
            fig.text(0.01, -0.01, note, fontsize=7, va="top", ha="left", wrap=False)
        fig.subplots_adjust(wspace=0.3, top=0.84)
        return fig


def _log_axis(ax: Axes, which: str) -> None:
    if ax.has_data():
        _set_log(ax, which)
    else:
        ax.text(
            0.5,
            0.5,
            "no data for this plot in the run",
            ha="center",
            va="center",
            transform=ax.transAxes,
        )


def _set_log(ax: Axes, which: str) -> None:
    """A log axis labelled in plain numbers (0.1, 1, 10, 1000): easier to read than
    powers of ten, and faster to draw (no mathtext)."""
    (ax.set_xscale if which == "x" else ax.set_yscale)("log")
    axis = ax.xaxis if which == "x" else ax.yaxis
    axis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))
    axis.set_minor_formatter(NullFormatter())


def _unique_handles(axes: Sequence[Axes]) -> tuple[list[Artist], list[str]]:
    """Each label once: the series first, then the reference lines and the weak region."""
    seen: dict[str, Artist] = {}
    for ax in axes:
        for handle, label in zip(*ax.get_legend_handles_labels(), strict=True):
            seen.setdefault(label, handle)
    order = sorted(seen, key=lambda label: (label in (*_REFERENCES, WEAK_LABEL), label))
    return [seen[label] for label in order], order


def footnote(rows: Sequence[ResultRow], found: Sequence[Point], *, bars: Sequence[str]) -> str:
    """The figure footnote: error bars, converted epsilons, and cells left out."""
    lines = [_BAR_NOTE[b] for b in bars]
    converted = sorted({p.method for p in found if p.converted})
    if converted:
        lines.append(
            f"† {', '.join(converted)}: add/remove (ε, δ) shown as replace-one "
            "(2ε, (1 + e^ε)δ); where that δ ≥ 1 the point is marked 'none'"
        )
    left_out: dict[str, dict[float, list[int]]] = defaultdict(lambda: defaultdict(list))
    for row in infeasible_rows(rows):
        left_out[row.method][row.epsilon].append(row.seed)
    for method, where in left_out.items():
        text = ", ".join(
            f"{format_epsilon(e)} (seeds {', '.join(map(str, s))})" for e, s in where.items()
        )
        lines.append(f"not plotted, infeasible: {method} at ε = {text}")
    return "\n".join(lines)


def _stat(name: str) -> Getter:
    return lambda p: getattr(p, name)


def _epsilon(p: Point) -> float:
    return p.epsilon_common


def utility_figure(rows: Sequence[ResultRow]) -> Figure:
    """ALM paper, Figure 1: utility loss against epsilon, one series per mechanism."""
    view = _Figure(rows, panels=1, title="Utility loss vs privacy budget (ALM paper, Fig. 1)")
    (ax,) = view.axes
    view.draw(ax, _epsilon, _stat("utility_loss"))
    ax.axhline(0.0, color="black", lw=1, ls="--", label=_REFERENCES[0])
    view.epsilon_axis(ax)
    ax.set_ylabel("utility loss  1 − M(protected)/M(unprotected)")
    return view.finish()


def mia_figure(rows: Sequence[ResultRow]) -> Figure:
    """ALM paper, Figure 2: the strongest attack's MIA accuracy against epsilon (left) and
    against utility loss (right, points labelled by epsilon)."""
    view = _Figure(rows, panels=2, title="MIA accuracy (ALM paper, Fig. 2)")
    left, right = view.axes
    accuracy = _stat("mia_accuracy")
    view.draw(left, _epsilon, accuracy)
    view.draw(right, lambda p: p.utility_loss.mean, accuracy, label_points=True)
    for ax in (left, right):
        view.references(ax, accuracy, chance=CHANCE["mia_accuracy"])
        ax.set_ylabel("MIA accuracy (strongest attack)")
    view.epsilon_axis(left)
    left.set_title("vs privacy budget")
    right.set_xlabel("utility loss")
    right.set_title("vs utility loss (labels: ε)")
    return view.finish()


def attack_figure(rows: Sequence[ResultRow]) -> Figure:
    """The strongest attack's AUC, TPR at 1% FPR and TPR at 0.1% FPR against epsilon, with
    their 95% intervals."""
    view = _Figure(rows, panels=3, title="Membership inference vs privacy budget")
    panels = (
        ("mia_auc", "AUC"),
        ("tpr_at_fpr_0_01", "TPR at 1% FPR"),
        ("tpr_at_fpr_0_001", "TPR at 0.1% FPR"),
    )
    for ax, (name, text) in zip(view.axes, panels, strict=True):
        view.draw(ax, _epsilon, _stat(name))
        view.references(ax, _stat(name), chance=CHANCE[name])
        view.epsilon_axis(ax)
        ax.set_ylabel(f"{text} (strongest attack)")
    return view.finish()


def _weight_noise(p: Point) -> bool:
    """Noise added once to the released weights (not DP-SGD's per-step gradient noise)."""
    return math.isnan(p.noise_multiplier) and p.noise_std > 0


def equal_noise_figure(rows: Sequence[ResultRow]) -> Figure:
    """Issue 13.5: utility loss and the strongest attack's AUC against the standard deviation
    of the noise on one weight (post-training mechanisms: is a method better, or does it add
    more noise?), and AUC against utility loss for every method (the equal-utility view)."""
    view = _Figure(rows, panels=3, title="Equal noise and equal utility")
    noise, auc = (lambda p: p.noise_std), _stat("mia_auc")
    left, middle, right = view.axes
    view.draw(left, noise, _stat("utility_loss"), keep=_weight_noise, label_points=True)
    view.draw(middle, noise, auc, keep=_weight_noise, label_points=True)
    view.draw(right, lambda p: p.utility_loss.mean, auc, label_points=True)
    left.axhline(0.0, color="black", lw=1, ls="--", label=_REFERENCES[0])
    for ax in (middle, right):
        view.references(ax, auc, chance=CHANCE["mia_auc"])
    for ax in (left, middle):
        _log_axis(ax, "x")
        ax.set_xlabel("noise std per released weight")
    left.set_ylabel("utility loss")
    middle.set_ylabel("AUC (strongest attack)")
    right.set_ylabel("AUC (strongest attack)")
    right.set_xlabel("utility loss")
    right.set_title("equal utility (labels: ε)", fontsize=9)
    left.set_title("equal noise (labels: ε)", fontsize=9)
    return view.finish()


def roc_floor(rocs: RocMap) -> float:
    """The smallest FPR the evaluation set resolves, 1 / (non-members): the smallest positive
    FPR of any curve (every FPR is a multiple of it). The ROC axes start there, since an FPR
    below one false positive cannot be read off the evaluation set."""
    steps = [min((x for x in fpr if x > 0), default=1.0) for fpr, _ in rocs.values()]
    return min(steps, default=1e-2)


def _roc_panel(
    ax: Axes, rocs: RocMap, epsilon: float, colours: Mapping[str, str], floor: float
) -> None:
    """At ``epsilon``: per method its strongest attack by AUC, the unprotected head, chance."""
    best: dict[str, tuple[float, str, np.ndarray, np.ndarray]] = {}
    for (method, eps, attack), (fpr, tpr) in rocs.items():
        if eps != epsilon and not math.isinf(eps):
            continue
        f, t = np.asarray(fpr, dtype=float), np.asarray(tpr, dtype=float)
        auc = float(np.sum(np.diff(f) * (t[1:] + t[:-1]) / 2))
        if method not in best or auc > best[method][0]:
            best[method] = (auc, attack, f, t)
    for method, (auc, attack, f, t) in sorted(best.items()):
        label = f"{method}: {attack} (AUC {auc:.2f})"
        ax.plot(np.clip(f, floor, 1), np.clip(t, floor, 1), lw=1.2, color=colours[method],
                label=label)  # fmt: skip
    ax.plot([floor, 1], [floor, 1], color=CHANCE_COLOUR, ls=":", lw=0.8, label="chance")
    _set_log(ax, "x")
    _set_log(ax, "y")
    ax.set_xlim(floor, 1)
    ax.set_ylim(floor, 1)
    ax.set_title(f"ε = {format_epsilon(epsilon)}", fontsize=9)
    ax.legend(fontsize=6, loc="lower right", title=f"FPR from 1/{round(1 / floor)}",
              title_fontsize=6)  # fmt: skip


def _roc_colours(rocs: RocMap) -> dict[str, str]:
    return method_colours(sorted({m for (m, _, _) in rocs}))


def roc_figure(rocs: RocMap, *, epsilon: float | None = None) -> Figure:
    """ROC curves on log-log axes (Carlini et al. 2022) at ``epsilon`` (default: the largest
    finite one): per method, its strongest attack by AUC, plus the unprotected head."""
    finite = sorted({e for (_, e, _) in rocs if not math.isinf(e)})
    target = epsilon if epsilon is not None else (finite[-1] if finite else math.inf)
    fig, ax = plt.subplots(figsize=(5.5, 5))
    _roc_panel(ax, rocs, target, _roc_colours(rocs), roc_floor(rocs))
    ax.set_title(f"ROC (log-log), ε = {format_epsilon(target)}")
    ax.set_xlabel("false positive rate")
    ax.set_ylabel("true positive rate")
    return fig


def roc_grid_figure(rocs: RocMap) -> Figure:
    """:func:`roc_figure` at every finite epsilon, as small multiples on shared axes."""
    finite = sorted({e for (_, e, _) in rocs if math.isfinite(e)})
    cols = min(len(finite), 4)
    grid_rows = -(-len(finite) // cols)
    fig, axes = plt.subplots(grid_rows, cols, figsize=(3.6 * cols, 3.4 * grid_rows),
                             sharex=True, sharey=True, squeeze=False)  # fmt: skip
    colours, floor = _roc_colours(rocs), roc_floor(rocs)
    for ax, epsilon in zip(axes.flat, finite, strict=False):
        _roc_panel(ax, rocs, epsilon, colours, floor)
    for ax in axes.flat[len(finite) :]:
        ax.set_visible(False)
    fig.supxlabel("false positive rate")
    fig.supylabel("true positive rate")
    fig.suptitle("ROC (log-log) at each ε: strongest attack per method")
    return fig


def figures(rows: Sequence[ResultRow], rocs: RocMap) -> dict[str, Callable[[], Figure]]:
    """Every figure of a run, by file stem, as a function that draws it: ``roc_loglog`` is
    at the largest finite epsilon, ``roc_by_epsilon`` at each epsilon."""
    out: dict[str, Callable[[], Figure]] = {
        "fig1_utility_loss": lambda: utility_figure(rows),
        "fig2_mia": lambda: mia_figure(rows),
        "attacks_vs_epsilon": lambda: attack_figure(rows),
        "equal_noise": lambda: equal_noise_figure(rows),
    }
    if rocs:
        out["roc_loglog"] = lambda: roc_figure(rocs)
    if any(math.isfinite(e) for (_, e, _) in rocs):
        out["roc_by_epsilon"] = lambda: roc_grid_figure(rocs)
    return out


def write_plots(rows: Sequence[ResultRow], rocs: RocMap, folder: Path) -> list[Path]:
    """Replace ``folder`` with every figure of :func:`figures`, as ``<stem>.png`` (120 dpi)
    and ``<stem>.pdf``: afterwards it holds exactly this run's figures.

    Returns:
        The paths written (inside ``folder``), PNG then PDF per figure.

    Raises:
        ValueError: if ``folder`` exists and is not a folder.
    """
    drawers = figures(rows, rocs)
    names = [f"{stem}{suffix}" for stem in drawers for suffix in (".png", ".pdf")]

    def build(tmp: Path) -> None:
        for stem, draw in drawers.items():
            fig = draw()
            try:
                for suffix, dpi in ((".png", 120), (".pdf", None)):
                    path = tmp / f"{stem}{suffix}"
                    fig.savefig(path, format=suffix[1:], dpi=dpi, bbox_inches="tight")
            finally:
                plt.close(fig)

    replace_folder(folder, build)
    return [folder / name for name in names]
