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

import itertools
import math
import textwrap
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
from matplotlib.patches import Patch
from matplotlib.ticker import FuncFormatter, NullFormatter

from alm_opacus.report.folders import replace_folder
from alm_opacus.report.results import ResultRow
from alm_opacus.report.series import (
    BASELINE,
    CHANCE,
    CHANCE_COLOUR,
    NO_LEAK,
    WEAK_DELTA_UNKNOWN_N,
    WEAK_EPSILON,
    Point,
    Stat,
    format_epsilon,
    guarantee_style,
    infeasible_rows,
    method_colours,
    no_leak,
    points,
)

__all__ = [
    "DP_KINDS",
    "FIGURES",
    "MIN_TEXT_PX",
    "PAGE_WIDTH_PX",
    "PNG_DPI",
    "WEAK_LABEL",
    "attack_figure",
    "equal_noise_figure",
    "figures",
    "mia_figure",
    "roc_figure",
    "roc_grid_figure",
    "tradeoff_figure",
    "utility_figure",
    "write_plots",
]

RocMap = Mapping[tuple[str, float, str], tuple[Sequence[float], Sequence[float]]]
Getter = Callable[[Point], Stat]

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
#: Resolution of the PNGs.
PNG_DPI = 120
#: report.html shows each PNG at ``max-width: 100%`` in a column this wide (CSS px).
PAGE_WIDTH_PX = 1100
#: No text of a figure is smaller than this (CSS px) on that page.
MIN_TEXT_PX = 10
#: Every figure's width (inches): 8.8 * PNG_DPI = 1056 px, inside the column even with the
#: page's padding, so the page shows each PNG at its own size (never scaled down).
WIDTH = 8.8
#: Font sizes (points): at PNG_DPI a point is 1.67 px, so SMALL is 15 px on the page.
FONT = 10.0
SMALL = 9.0
#: Guarantee kinds that are differential privacy; every other kind is drawn hollow.
DP_KINDS = frozenset({"pure-dp", "approx-dp"})
NOT_DP = "not DP"
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
NO_LEAK_COLOUR = "#2e8b57"
NO_LEAK_LABEL = "no-leak band: a release that never saw the members"
#: The footnote's line length (characters): it fits the figure's width at SMALL.
_NOTE_CHARS = 118
#: (field, name, FPR) of the TPR panels.
_TPR_PANELS = (
    ("tpr_at_fpr_0_01", "TPR at 1% FPR", 0.01),
    ("tpr_at_fpr_0_001", "TPR at 0.1% FPR", 0.001),
)


def is_dp(kind: str) -> bool:
    """Whether a guarantee kind (under replace-one) is differential privacy."""
    return kind in DP_KINDS


def series_label(method: str, kind: str, *, converted: bool = False) -> str:
    """A series' legend label: ``"dpsgd (approx-dp)†"``, ``"alm (random-dp, not DP)"``."""
    extra = "" if is_dp(kind) else f", {NOT_DP}"
    return f"{method} ({kind}{extra})" + ("†" if converted else "")


def _marker_face(kind: str, colour: str) -> str:
    """Filled for a DP guarantee, hollow (white) for any other."""
    return colour if is_dp(kind) else "white"


def _wrap(lines: Sequence[str]) -> str:
    return "\n".join(
        textwrap.fill(line, _NOTE_CHARS, subsequent_indent="  ") for line in lines if line
    )


class _Figure:
    """One figure of a run: its points, colours and the notes for its footnote. Panels are
    stacked, one per row, at the page's width; the legends sit at the right."""

    def __init__(
        self, rows: Sequence[ResultRow], *, panels: int, title: str, height: float = 3.2
    ) -> None:
        self.rows = rows
        self.points = points(rows)
        self.protected = [p for p in self.points if p.method != BASELINE]
        self.baseline = [p for p in self.points if p.method == BASELINE]
        self.colours = method_colours([p.method for p in self.points])
        self.fig, axes = plt.subplots(
            panels, 1, figsize=(WIDTH, height * panels + 0.9), squeeze=False
        )
        self.axes: list[Axes] = list(axes[:, 0])
        self.fig.suptitle(title, fontsize=FONT + 2)
        self.bars: set[str] = set()
        self.notes: list[str] = []
        #: (axes, colour, (x, y, text) per point in epsilon order) of each labelled series
        self.labels: list[tuple[Axes, str, list[tuple[float, float, str]]]] = []
        self.segments: dict[Axes, list[tuple[tuple[float, float], tuple[float, float]]]] = {}

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
            colour = self.colours[method]
            ax.errorbar(
                xs,
                means,
                yerr=np.nan_to_num(err),
                color=colour,
                marker=marker,
                mfc=_marker_face(kind, colour),
                mec=colour,
                mew=1.3,
                ls=line,
                capsize=3,
                ms=6,
                lw=1.3,
                label=series_label(method, kind, converted=any(p.converted for p in pts)),
            )
            if label_points:  # placed in finish(), once the layout is final
                spots = [
                    (float(xv), float(yv), format_epsilon(p.epsilon_common))
                    for xv, yv, p in zip(xs, means, pts, strict=True)
                ]
                self.labels.append((ax, colour, spots))
                spans = [
                    ((float(xv), s.low), (float(xv), s.high))
                    for xv, s in zip(xs, stats, strict=True)
                    if s.kind
                ]
                lines = [(a[:2], b[:2]) for a, b in itertools.pairwise(spots)]
                self.segments.setdefault(ax, []).extend([*spans, *lines])

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
        ax.set_xlabel("ε′ (replace-one ε)")
        _log_axis(ax, "x")
        if not ax.has_data():
            return
        left, right = ax.get_xlim()
        if right > WEAK_EPSILON:
            start = max(left, WEAK_EPSILON)
            ax.axvspan(start, right, color=WEAK_COLOUR, lw=0, zorder=0, label=WEAK_LABEL)
            ax.text(
                math.sqrt(start * right),
                0.97,
                WEAK_LABEL,
                fontsize=SMALL,
                ha="center",
                va="top",
                transform=ax.get_xaxis_transform(),
                color="#8a4b08",
                # its own ground: a reference line may cross the top of the panel
                bbox={"boxstyle": "square,pad=0.15", "fc": WEAK_COLOUR, "ec": "none"},
                zorder=4,
            )
            ax.set_xlim(left, right)

    def finish(self) -> Figure:
        """The legends (series, then guarantee kinds) at the right and the footnote under
        the panels; returns the figure."""
        fig = self.fig
        panels = len(self.axes)
        height = fig.get_figheight()
        fig.subplots_adjust(
            left=0.09,
            right=0.64,
            top=1 - 0.75 / height,
            bottom=0.55 / height,
            hspace=0.45 if panels > 1 else 0.2,
        )
        self._place_labels()
        handles, labels = _unique_handles(self.axes)
        top = self.axes[0].get_position().y1
        fig.legend(
            handles,
            labels,
            loc="upper left",
            bbox_to_anchor=(0.655, top),
            fontsize=SMALL,
            frameon=False,
        )
        kinds = sorted({p.common_guarantee for p in self.protected})
        if kinds:
            styles = [_kind_handle(k) for k in kinds]
            names = [k if is_dp(k) else f"{k} ({NOT_DP})" for k in kinds]
            fig.legend(
                styles,
                names,
                title="guarantee (marker, line)",
                loc="lower left",
                bbox_to_anchor=(0.655, self.axes[-1].get_position().y0),
                fontsize=SMALL,
                title_fontsize=SMALL,
                frameon=False,
            )
        notes = footnote(self.rows, self.points, bars=sorted(self.bars)).splitlines()
        note = _wrap([*self.notes, *notes])
        if note:
            fig.text(0.01, 0.0, note, fontsize=SMALL, va="top", ha="left")
        return fig

    def _place_labels(self) -> None:
        left_out = 0
        for ax in self.axes:
            series = [(colour, spots) for a, colour, spots in self.labels if a is ax]
            if not series:
                continue
            placer = _Labels(
                ax, [(x, y) for _, spots in series for x, y, _ in spots], self.segments.get(ax, [])
            )
            for colour, spots in series:
                for group in _groups(ax, spots):
                    x, y = (float(np.mean([s[k] for s in group])) for k in (0, 1))
                    placer.add(x, y, ", ".join(s[2] for s in group), colour)
            left_out += placer.left_out
        if left_out:
            self.notes.append(f"{left_out} ε′ label(s) left out where points crowd")


def _kind_handle(kind: str) -> Line2D:
    marker, line = guarantee_style(kind)
    return Line2D(
        [],
        [],
        color="0.3",
        marker=marker,
        ls=line,
        mfc=_marker_face(kind, "0.3"),
        mec="0.3",
        mew=1.3,
        ms=6,
    )


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
            fontsize=FONT,
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


def _weak_words(members: int | None) -> str:
    line = f"1/{members}" if members else f"{WEAK_DELTA_UNKNOWN_N:g}"
    return f"ε′ > {WEAK_EPSILON:g} or δ′ > {line}"


# --- the trade-off ---------------------------------------------------------------------------

#: Offsets (points) tried for a point's label, nearest first; the farther rings get a
#: leader line to their point.
_LABEL_OFFSETS: tuple[tuple[float, float], ...] = tuple(
    (r * dx, r * dy)
    for r in (1.0, 2.0, 3.2, 4.6)
    for dx, dy in ((5, 5), (5, -5), (-5, 5), (-5, -5), (0, 7), (0, -7), (7, 0), (-7, 0))
)
#: Points of one method nearer than this (display px at 100 dpi) share one label.
_MERGE_PX = 12.0


class _Labels:
    """Places text labels next to points: each label takes the first offset of
    :data:`_LABEL_OFFSETS` where it overlaps no other label, no marker, and (where it can)
    no error bar or line; a label with no free offset is left out (and counted, for the
    footnote). Works in display pixels, once the axes' layout and limits are final."""

    def __init__(
        self,
        ax: Axes,
        markers: Sequence[tuple[float, float]],
        segments: Sequence[tuple[tuple[float, float], tuple[float, float]]] = (),
    ) -> None:
        self.ax = ax
        ax.get_xlim(), ax.get_ylim()  # settle a pending autoscale before reading transData
        self.renderer = ax.figure.canvas.get_renderer()  # type: ignore[attr-defined]
        self.frame = ax.get_window_extent(self.renderer)
        self.px = ax.figure.dpi / 72  # pixels per point
        pad = 5.0 * self.px
        centres = ax.transData.transform(np.asarray(markers, dtype=float).reshape(-1, 2))
        #: (n, 4) boxes x0, y0, x1, y1 that no label may cover
        self.hard = np.hstack([centres - pad, centres + pad])
        #: small boxes along the error bars and lines, avoided where there is room
        dots = [np.empty((0, 2))]
        for a, b in segments:
            (x0, y0), (x1, y1) = ax.transData.transform([a, b])
            if not all(map(math.isfinite, (x0, y0, x1, y1))):
                continue
            steps = max(int(math.hypot(x1 - x0, y1 - y0) / (2 * self.px)), 1)
            t = np.linspace(0, 1, steps + 1)[:, None]
            dots.append(np.array([x0, y0]) + t * np.array([x1 - x0, y1 - y0]))
        line = np.vstack(dots)
        self.soft = np.hstack([line - self.px, line + self.px])
        self.left_out = 0

    def add(self, x: float, y: float, text: str, colour: str) -> None:
        probe = self.ax.text(0, 0, text, fontsize=SMALL)
        size = probe.get_window_extent(self.renderer).size
        width, height = float(size[0]) + 2 * self.px, float(size[1]) + 2 * self.px
        probe.remove()
        anchor = self.ax.transData.transform((x, y))
        for avoid in (np.vstack([self.hard, self.soft]), self.hard):
            for k, (dx, dy) in enumerate(_LABEL_OFFSETS):
                left = anchor[0] + dx * self.px - (0 if dx > 0 else width if dx < 0 else width / 2)
                low = anchor[1] + dy * self.px - (0 if dy > 0 else height if dy < 0 else height / 2)
                box = np.array([left, low, left + width, low + height])
                if not self._free(box, avoid):
                    continue
                self.hard = np.vstack([self.hard, box])
                self._draw(x, y, text, colour, (dx, dy), far=k >= 8)
                return
        self.left_out += 1

    def _free(self, box: np.ndarray, avoid: np.ndarray) -> bool:
        f = self.frame
        if box[0] < f.x0 or box[1] < f.y0 or box[2] > f.x1 or box[3] > f.y1:
            return False
        hit = (
            (avoid[:, 0] < box[2])
            & (avoid[:, 2] > box[0])
            & (avoid[:, 1] < box[3])
            & (avoid[:, 3] > box[1])
        )
        return not bool(hit.any())

    def _draw(
        self, x: float, y: float, text: str, colour: str, offset: tuple[float, float], *, far: bool
    ) -> None:
        dx, dy = offset
        self.ax.annotate(
            text,
            (x, y),
            xytext=offset,
            textcoords="offset points",
            ha="left" if dx > 0 else "right" if dx < 0 else "center",
            va="bottom" if dy > 0 else "top" if dy < 0 else "center",
            fontsize=SMALL,
            color=colour,
            # beyond the first ring a leader line shows whose label it is
            arrowprops={"arrowstyle": "-", "color": colour, "lw": 0.6} if far else None,
            # a white ground keeps the label readable where it crosses a line
            bbox={"boxstyle": "square,pad=0.1", "fc": "white", "ec": "none", "alpha": 0.8},
            zorder=5,
        )


def _groups(
    ax: Axes, spots: Sequence[tuple[float, float, str]]
) -> list[list[tuple[float, float, str]]]:
    """Consecutive (x, y, label) spots of one series that sit on top of each other, as
    groups that share one label."""
    out: list[list[tuple[float, float, str]]] = []
    last: np.ndarray | None = None
    ax.get_xlim(), ax.get_ylim()  # settle a pending autoscale before reading transData
    scale = 100.0 / ax.figure.dpi
    for spot in spots:
        here = ax.transData.transform(spot[:2])
        if out and last is not None and float(np.hypot(*(here - last))) * scale < _MERGE_PX:
            out[-1].append(spot)
        else:
            out.append([spot])
            last = here
    return out


def tradeoff_figure(
    rows: Sequence[ResultRow], *, members: int | None = None, num_classes: int | None = None
) -> Figure:
    """The answer to "which protection, at which ε?": the strongest attack's AUC (with its
    95% interval) against test accuracy, one line per method joining its ε points in ε order,
    each point labelled by its replace-one ε′.

    The x axis is test accuracy, not utility loss: it is the number a practitioner decides
    on ("is 0.31 usable?"), it reads against the unprotected head's accuracy and chance
    (1 / classes), both drawn as vertical lines, without a division to undo, and a release
    below chance shows as one. Lower right is better: accurate, and an attack that reads no
    more than on a release that never saw the members (the no-leak band, where the run has
    the :data:`~alm_opacus.report.series.NO_LEAK` reference).

    A point whose replace-one guarantee is not DP (random DP, per-query, none) is hollow and
    its legend entry says "not DP"; a segment that touches such a point is dotted. A point
    whose guarantee is weak (``Point.weak_for(members)``) is drawn pale. Artists carry a
    ``gid``: ``tradeoff-line:<method>`` (segments), ``tradeoff-point:<method>`` (points),
    ``no-leak band``.

    Args:
        rows: the run's rows (``results.csv``).
        members: the member count, for the weak-δ′ line 1/n (unknown: 1e-3).
        num_classes: the class count, for the chance accuracy line (unknown: none drawn).

    Returns:
        The figure (one panel, legend and notes below it).
    """
    found = points(rows)
    protected = [
        p
        for p in found
        if p.method != BASELINE
        and not math.isnan(p.mia_auc.mean)
        and not math.isnan(p.test_accuracy.mean)
    ]
    baseline = next((p for p in found if p.method == BASELINE), None)
    reference = no_leak(rows)
    colours = method_colours([p.method for p in found])
    by_method: dict[str, list[Point]] = defaultdict(list)
    for p in sorted(protected, key=lambda p: p.epsilon_common):
        by_method[p.method].append(p)

    fig = plt.figure(figsize=(WIDTH, 5.6))
    ax = fig.add_axes((0.085, 0.11, 0.895, 0.76))
    fig.suptitle(
        "Privacy against utility: the strongest attack's AUC against test accuracy",
        fontsize=FONT + 2,
        x=0.085,
        ha="left",
        y=0.985,
    )
    ax.set_title(
        "better: lower right (accurate, and the attack no stronger than on a release "
        "that never saw the members)\npoint labels: ε′ (replace-one ε); pale: weak "
        f"guarantee ({_weak_words(members)})",
        fontsize=SMALL,
        loc="left",
    )
    ax.set_xlabel("test accuracy (mean over noise draws and seeds)", fontsize=FONT)
    ax.set_ylabel("AUC of the strongest attack", fontsize=FONT)
    ax.tick_params(labelsize=FONT)

    legend = _tradeoff_series(ax, by_method, colours, members)
    chance_accuracy = 1.0 / num_classes if num_classes else math.nan
    legend += _tradeoff_references(ax, baseline, reference, chance_accuracy, num_classes)
    if any(p.weak_for(members) for p in protected):
        pale = Line2D([], [], color="0.3", marker="o", ls="", ms=8, alpha=0.45)
        legend.append((pale, f"pale: weak guarantee ({_weak_words(members)})"))
    shown = [*protected, *([baseline] if baseline is not None else [])]
    _tradeoff_limits(ax, shown, reference, chance_accuracy)
    # the labels go last: their free places depend on the final axes and limits
    left_out, merged = _tradeoff_labels(ax, by_method, shown, colours)

    handles, labels = zip(*legend, strict=True)
    lg = ax.legend(
        handles,
        labels,
        loc="upper center",
        bbox_to_anchor=(0.5, -0.12),
        ncol=2,
        fontsize=SMALL,
        frameon=False,
        handlelength=2.6,
    )
    kinds = {p.mia_auc.kind for p in shown}
    notes = [
        (
            "vertical bars: 95% interval of the AUC over the evaluation set (several seeds: the "
            "union)"
            if "ci95" in kinds
            else "vertical bars: ±1 std of the AUC"
        )
        + (" (±1 std where no interval was recorded)" if {"ci95", "std"} <= kinds else "")
        + "; horizontal bars: ±1 std of the accuracy over noise draws and seeds",
        "hollow marker, dotted line: the guarantee is not DP (random DP: the sensitivity was "
        "sampled, not proven; none: no guarantee, e.g. δ′ ≥ 1 after conversion)",
    ]
    if reference is not None:
        notes.append(
            "no-leak band: the strongest attack's AUC on a release of the same recipe "
            "trained on public rows only (95% interval; the line is its mean): what "
            "this statistic reads when nothing leaks"
        )
    else:
        notes.append(
            "this run has no no-leak reference: the strongest of many attacks reads "
            "somewhat above 0.5 even where nothing leaks (selection over attacks)"
        )
    if left_out:
        notes.append(f"{left_out} ε′ label(s) left out where points crowd")
    if merged:
        notes.append("points that coincide share one label, their ε′ in order")
    rest = footnote(rows, shown, bars=[])
    _note_under(fig, lg, _wrap([*notes, *rest.splitlines()]))
    return fig


def _xy(p: Point) -> tuple[float, float]:
    """A point's place in the trade-off: (test accuracy, strongest attack's AUC)."""
    return p.test_accuracy.mean, p.mia_auc.mean


def _tradeoff_series(
    ax: Axes,
    by_method: Mapping[str, Sequence[Point]],
    colours: Mapping[str, str],
    members: int | None,
) -> list[tuple[Artist, str]]:
    """Per method, its points joined in ε order; returns the legend entries (one per
    method and guarantee kind)."""
    legend: list[tuple[Artist, str]] = []
    for method, pts in sorted(by_method.items()):
        colour = colours[method]
        for a, b in itertools.pairwise(pts):
            solid = is_dp(a.common_guarantee) and is_dp(b.common_guarantee)
            pale = a.weak_for(members) and b.weak_for(members)
            ax.plot(
                *zip(_xy(a), _xy(b), strict=True),
                color=colour,
                ls="-" if solid else ":",
                lw=1.6,
                alpha=0.45 if pale else 1.0,
                zorder=2,
                gid=f"tradeoff-line:{method}",
            )
        for p in pts:
            kind = p.common_guarantee
            drawn = ax.errorbar(
                *_xy(p),
                yerr=_bar(p.mia_auc),
                xerr=_bar(p.test_accuracy),
                fmt=guarantee_style(kind)[0],
                color=colour,
                mfc=_marker_face(kind, colour),
                mec=colour,
                mew=1.5,
                ms=8,
                elinewidth=1.0,
                capsize=3,
                alpha=0.45 if p.weak_for(members) else 1.0,
                zorder=3,
            )
            drawn.lines[0].set_gid(f"tradeoff-point:{method}")
        for kind in dict.fromkeys(p.common_guarantee for p in pts):
            converted = any(p.converted for p in pts if p.common_guarantee == kind)
            handle = Line2D(
                [],
                [],
                color=colour,
                marker=guarantee_style(kind)[0],
                mfc=_marker_face(kind, colour),
                mec=colour,
                mew=1.5,
                ms=8,
                ls="-" if is_dp(kind) else ":",
                lw=1.6,
            )
            legend.append((handle, series_label(method, kind, converted=converted)))
    return legend


def _tradeoff_references(
    ax: Axes,
    baseline: Point | None,
    reference: Point | None,
    chance_accuracy: float,
    num_classes: int | None,
) -> list[tuple[Artist, str]]:
    """The unprotected head (a star, and its accuracy as a dashed line), chance accuracy and
    AUC, and the no-leak band; returns their legend entries."""
    legend: list[tuple[Artist, str]] = []
    if baseline is not None and not math.isnan(baseline.test_accuracy.mean):
        acc = baseline.test_accuracy.mean
        ax.axvline(acc, color="black", ls="--", lw=1, zorder=1)
        if not math.isnan(baseline.mia_auc.mean):
            ax.errorbar(
                acc,
                baseline.mia_auc.mean,
                yerr=_bar(baseline.mia_auc),
                fmt="*",
                color="black",
                ms=13,
                capsize=3,
                zorder=4,
            )
        star = Line2D([], [], color="black", marker="*", ms=13, ls="--", lw=1)
        legend.append((star, f"unprotected (none): accuracy {acc:.2f} (dashed line)"))
    if not math.isnan(chance_accuracy):
        ax.axvline(chance_accuracy, color=CHANCE_COLOUR, ls="-.", lw=1, zorder=1)
        line = Line2D([], [], color=CHANCE_COLOUR, ls="-.", lw=1)
        legend.append((line, f"chance accuracy (1/{num_classes})"))
    ax.axhline(CHANCE["mia_auc"], color=CHANCE_COLOUR, ls=":", lw=1.2, zorder=1)
    legend.append((Line2D([], [], color=CHANCE_COLOUR, ls=":", lw=1.2), "chance AUC (0.5)"))
    if reference is not None and not math.isnan(reference.mia_auc.mean):
        band = reference.mia_auc
        low, high = (band.low, band.high) if band.kind else (band.mean, band.mean)
        ax.axhspan(low, high, color=NO_LEAK_COLOUR, alpha=0.16, lw=0, zorder=0, gid="no-leak band")
        ax.axhline(band.mean, color=NO_LEAK_COLOUR, lw=1, zorder=1)
        legend.append((Patch(facecolor=NO_LEAK_COLOUR, alpha=0.3), NO_LEAK_LABEL))
    return legend


def _tradeoff_labels(
    ax: Axes,
    by_method: Mapping[str, Sequence[Point]],
    shown: Sequence[Point],
    colours: Mapping[str, str],
) -> tuple[int, bool]:
    """Each point's ε′ label, placed clear of the markers, bars, lines and other labels;
    returns (labels left out, whether coinciding points share a label)."""
    segments = [
        ((_xy(p)[0], p.mia_auc.low), (_xy(p)[0], p.mia_auc.high)) for p in shown if p.mia_auc.kind
    ]
    segments += [
        ((p.test_accuracy.low, _xy(p)[1]), (p.test_accuracy.high, _xy(p)[1]))
        for p in shown
        if p.test_accuracy.kind
    ]
    segments += [(_xy(a), _xy(b)) for pts in by_method.values() for a, b in itertools.pairwise(pts)]
    placer = _Labels(ax, [_xy(p) for p in shown], segments)
    merged = False
    for method, pts in sorted(by_method.items()):
        spots = [(*_xy(p), format_epsilon(p.epsilon_common)) for p in pts]
        for group in _groups(ax, spots):
            x, y = (float(np.mean([s[k] for s in group])) for k in (0, 1))
            placer.add(x, y, ", ".join(s[2] for s in group), colours[method])
            merged |= len(group) > 1
    return placer.left_out, merged


def _bar(stat: Stat) -> np.ndarray | None:
    """One point's (2, 1) error bar, or None where the stat has none."""
    if not stat.kind or math.isnan(stat.low) or math.isnan(stat.high):
        return None
    return np.array([[max(stat.mean - stat.low, 0.0)], [max(stat.high - stat.mean, 0.0)]])


def _tradeoff_limits(
    ax: Axes, shown: Sequence[Point], reference: Point | None, chance_accuracy: float
) -> None:
    """Limits that hold every bar, the reference lines and a margin for the labels."""
    xs = [p.test_accuracy.mean for p in shown]
    xs += [
        v
        for p in shown
        if p.test_accuracy.kind
        for v in (p.test_accuracy.low, p.test_accuracy.high)
    ]
    if not math.isnan(chance_accuracy):
        xs.append(chance_accuracy)
    ys = [CHANCE["mia_auc"]]
    ys += [v for p in shown for v in (p.mia_auc.low, p.mia_auc.high, p.mia_auc.mean)]
    if reference is not None:
        ys += [reference.mia_auc.low, reference.mia_auc.high]
    xs = [v for v in xs if not math.isnan(v)]
    ys = [v for v in ys if not math.isnan(v)]
    if xs:
        span = max(max(xs) - min(xs), 0.1)
        ax.set_xlim(max(min(xs) - 0.08 * span, 0.0), min(max(xs) + 0.08 * span, 1.0))
    if ys:
        span = max(max(ys) - min(ys), 0.05)
        ax.set_ylim(min(ys) - 0.06 * span, max(ys) + 0.1 * span)


def _note_under(fig: Figure, above: Artist, text: str) -> None:
    """``text`` in the figure, left-aligned, just under ``above`` (e.g. a legend)."""
    if not text:
        return
    renderer = fig.canvas.get_renderer()  # type: ignore[attr-defined]
    box = above.get_window_extent(renderer).transformed(fig.transFigure.inverted())
    fig.text(0.01, box.y0 - 0.01, text, fontsize=SMALL, va="top", ha="left")


# --- against epsilon -------------------------------------------------------------------------


def utility_figure(rows: Sequence[ResultRow]) -> Figure:
    """ALM paper, Figure 1: utility loss against epsilon, one series per mechanism."""
    view = _Figure(
        rows, panels=1, title="Utility loss vs privacy budget (ALM paper, Fig. 1)", height=4.0
    )
    (ax,) = view.axes
    view.draw(ax, _epsilon, _stat("utility_loss"))
    ax.axhline(0.0, color="black", lw=1, ls="--", label=_REFERENCES[0])
    view.epsilon_axis(ax)
    ax.set_ylabel("utility loss\n1 − acc / acc(unprotected)")
    return view.finish()


def mia_figure(rows: Sequence[ResultRow]) -> Figure:
    """ALM paper, Figure 2: the strongest attack's MIA accuracy against epsilon (top) and
    against utility loss (bottom, points labelled by epsilon)."""
    view = _Figure(rows, panels=2, title="MIA accuracy (ALM paper, Fig. 2)")
    top, bottom = view.axes
    accuracy = _stat("mia_accuracy")
    view.draw(top, _epsilon, accuracy)
    view.draw(bottom, lambda p: p.utility_loss.mean, accuracy, label_points=True)
    for ax in (top, bottom):
        view.references(ax, accuracy, chance=CHANCE["mia_accuracy"])
        ax.set_ylabel("MIA accuracy\n(strongest attack)")
    view.epsilon_axis(top)
    top.set_title("vs privacy budget", fontsize=FONT)
    bottom.set_xlabel("utility loss")
    bottom.set_title("vs utility loss (labels: ε′)", fontsize=FONT)
    return view.finish()


def _resolved(found: Sequence[Point], field: str, fpr: float, nonmembers: int | None) -> bool:
    """Whether a TPR panel can be read: the evaluation set resolves ``fpr``
    (``nonmembers * fpr >= 1``, where the count is known) and some point has a value."""
    if nonmembers is not None and nonmembers * fpr < 1 - 1e-9:
        return False
    return any(not math.isnan(getattr(p, field).mean) for p in found)


def attack_figure(rows: Sequence[ResultRow], *, nonmembers: int | None = None) -> Figure:
    """The strongest attack's AUC, TPR at 1% FPR and TPR at 0.1% FPR against epsilon, with
    their 95% intervals. A TPR panel is drawn only where the evaluation set resolves its FPR
    (at least 1/FPR non-members; with ``nonmembers`` unknown, where some row has a value);
    the footnote names the panels left out."""
    found = points(rows)
    panels = [("mia_auc", "AUC")]
    left_out = []
    for field, name, fpr in _TPR_PANELS:
        if _resolved(found, field, fpr, nonmembers):
            panels.append((field, name))
        elif nonmembers is not None and nonmembers * fpr < 1 - 1e-9:
            left_out.append(
                f"{name} not drawn: the evaluation set's {nonmembers} non-members "
                f"cannot resolve it (it needs at least {round(1 / fpr)})"
            )
        else:
            left_out.append(f"{name} not drawn: no row of the run has a value for it")
    view = _Figure(rows, panels=len(panels), title="Membership inference vs privacy budget")
    view.notes += left_out
    for ax, (name, text) in zip(view.axes, panels, strict=True):
        view.draw(ax, _epsilon, _stat(name))
        view.references(ax, _stat(name), chance=CHANCE[name])
        view.epsilon_axis(ax)
        ax.set_ylabel(f"{text}\n(strongest attack)")
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
    top, middle, bottom = view.axes
    view.draw(top, noise, _stat("utility_loss"), keep=_weight_noise, label_points=True)
    view.draw(middle, noise, auc, keep=_weight_noise, label_points=True)
    view.draw(bottom, lambda p: p.utility_loss.mean, auc, label_points=True)
    top.axhline(0.0, color="black", lw=1, ls="--", label=_REFERENCES[0])
    for ax in (middle, bottom):
        view.references(ax, auc, chance=CHANCE["mia_auc"])
    for ax in (top, middle):
        _log_axis(ax, "x")
        ax.set_xlabel("noise std per released weight")
    top.set_ylabel("utility loss")
    middle.set_ylabel("AUC\n(strongest attack)")
    bottom.set_ylabel("AUC\n(strongest attack)")
    bottom.set_xlabel("utility loss")
    top.set_title("equal noise: utility (labels: ε′)", fontsize=FONT)
    middle.set_title("equal noise: attack (labels: ε′)", fontsize=FONT)
    bottom.set_title("equal utility (labels: ε′)", fontsize=FONT)
    return view.finish()


# --- ROC curves ------------------------------------------------------------------------------


def roc_floor(rocs: RocMap) -> float:
    """The smallest FPR the evaluation set resolves, 1 / (non-members): the smallest positive
    FPR of any curve (every FPR is a multiple of it). The ROC axes start there, since an FPR
    below one false positive cannot be read off the evaluation set."""
    steps = [min((x for x in fpr if x > 0), default=1.0) for fpr, _ in rocs.values()]
    return min(steps, default=1e-2)


class _RocFacts:
    """What the rows say about the ROC curves of ``rocs.json``: the table's AUC of each
    (method, epsilon, attack) (the mean over noise draws and seeds), the draw and seed
    counts, and each point's guarantee."""

    def __init__(self, rows: Sequence[ResultRow], members: int | None) -> None:
        self.members = members
        mean: dict[tuple[str, float, str], list[float]] = defaultdict(list)
        self.draws: dict[tuple[str, float], int] = {}
        self.seeds: dict[tuple[str, float], set[int]] = defaultdict(set)
        for row in rows:
            key = (row.method, row.epsilon)
            if not math.isnan(row.mia_auc):
                mean[(row.method, row.epsilon, row.attack)].append(row.mia_auc)
            self.draws[key] = max(self.draws.get(key, 1), int(row.noise_draws or 1))
            self.seeds[key].add(row.seed)
        self.mean = {k: float(np.mean(v)) for k, v in mean.items()}
        self.points = {(p.method, p.epsilon): p for p in points(rows)}

    def weak(self, epsilon: float) -> list[str]:
        """The methods whose guarantee at the asked ``epsilon`` is weak."""
        return sorted(
            m
            for (m, e), p in self.points.items()
            if e == epsilon and m != BASELINE and p.weak_for(self.members)
        )

    def known(self, epsilon: float) -> bool:
        return any(e == epsilon for (_, e) in self.points)

    def not_dp(self, method: str, epsilon: float) -> bool:
        point = self.points.get((method, epsilon))
        return point is not None and method != BASELINE and not is_dp(point.common_guarantee)

    def what(self) -> str:
        """What one curve is, for the legend's title."""
        seeds = set().union(*self.seeds.values()) if self.seeds else set()
        draws = max(self.draws.values(), default=1)
        seed = f"seed {min(seeds)}" if len(seeds) == 1 else "one seed (the last to finish)"
        if draws > 1:
            over = "draws and seeds" if len(seeds) > 1 else "draws"
            return (
                f"each curve: {seed}, its first of {draws} noise draws;\nAUC of that curve "
                f"[results.csv: that attack's mean over {over}]"
            )
        return f"each curve: {seed}; AUC of that curve"


def _roc_panel(
    ax: Axes,
    rocs: RocMap,
    epsilon: float,
    colours: Mapping[str, str],
    floor: float,
    facts: _RocFacts,
    *,
    fontsize: float,
) -> None:
    """At ``epsilon``: per method its strongest attack by AUC, the unprotected head (and the
    no-leak reference, where the run has one), chance."""
    best: dict[str, tuple[float, str, np.ndarray, np.ndarray]] = {}
    for (method, eps, attack), (fpr, tpr) in rocs.items():
        if eps != epsilon and not math.isinf(eps):
            continue
        f, t = np.asarray(fpr, dtype=float), np.asarray(tpr, dtype=float)
        auc = float(np.sum(np.diff(f) * (t[1:] + t[:-1]) / 2))
        if method not in best or auc > best[method][0]:
            best[method] = (auc, attack, f, t)
    for method, (auc, attack, f, t) in sorted(best.items(), key=lambda kv: kv[0] == NO_LEAK):
        eps = math.inf if method in (BASELINE, NO_LEAK) else epsilon
        name = "no-leak reference" if method == NO_LEAK else method
        if facts.not_dp(method, eps):
            name += f" ({NOT_DP})"
        label = f"{name}: {attack}, {auc:.2f}"
        mean = facts.mean.get((method, eps, attack))
        if mean is not None and facts.draws.get((method, eps), 1) > 1:
            label += f" [{mean:.2f}]"
        if method == NO_LEAK:
            colour, line = NO_LEAK_COLOUR, "--"
        else:
            colour, line = colours[method], ":" if facts.not_dp(method, eps) else "-"
        ax.plot(
            np.clip(f, floor, 1), np.clip(t, floor, 1), color=colour, ls=line, lw=1.5, label=label
        )
    ax.plot([floor, 1], [floor, 1], color=CHANCE_COLOUR, ls=":", lw=0.8, label="chance")
    _set_log(ax, "x")
    _set_log(ax, "y")
    ax.set_xlim(floor, 1)
    ax.set_ylim(floor, 1)
    ax.tick_params(labelsize=fontsize)
    ax.legend(
        fontsize=fontsize,
        loc="lower right",
        frameon=True,
        framealpha=0.85,
        handlelength=1.6,
        borderpad=0.3,
        labelspacing=0.25,
    )


def _roc_colours(rocs: RocMap) -> dict[str, str]:
    return method_colours(sorted({m for (m, _, _) in rocs if m != NO_LEAK}))


def roc_epsilon(
    rocs: RocMap, rows: Sequence[ResultRow] = (), *, members: int | None = None
) -> tuple[float, str]:
    """The epsilon of :func:`roc_figure` and why: the largest (asked) epsilon at which no
    method's guarantee is weak (the most informative point that still protects); where every
    epsilon is weak for some method, or the rows are not known, the smallest."""
    facts = _RocFacts(rows, members)
    finite = sorted({e for (_, e, _) in rocs if math.isfinite(e)})
    if not finite:
        return math.inf, "the unprotected head only"
    strong = [e for e in finite if facts.known(e) and not facts.weak(e)]
    if strong:
        return strong[-1], "the largest ε at which no method's guarantee is weak"
    if not rows:
        return finite[0], "the smallest ε (the guarantees are not known here)"
    return finite[0], "the smallest ε: every ε gives some method a weak guarantee"


def roc_figure(
    rocs: RocMap,
    *,
    rows: Sequence[ResultRow] = (),
    members: int | None = None,
    epsilon: float | None = None,
) -> Figure:
    """ROC curves on log-log axes (Carlini et al. 2022) at ``epsilon`` (default:
    :func:`roc_epsilon`, said in the title): per method, its strongest attack by AUC, plus
    the unprotected head. Each curve is one noise draw of one seed (``rocs.json``); the
    legend gives that curve's AUC and, in brackets, the table's (the mean over draws)."""
    if epsilon is None:
        target, why = roc_epsilon(rocs, rows, members=members)
    else:
        target, why = epsilon, "as asked"
    facts = _RocFacts(rows, members)
    fig, ax = plt.subplots(figsize=(WIDTH * 0.72, 6.2))
    _roc_panel(ax, rocs, target, _roc_colours(rocs), roc_floor(rocs), facts, fontsize=SMALL)
    legend = ax.get_legend()
    if legend is not None:
        legend.set_title(facts.what())
        legend.get_title().set_fontsize(SMALL)
    ax.set_title(f"ROC (log-log) at ε = {format_epsilon(target)}:\n{why}", fontsize=FONT + 1)
    ax.set_xlabel(f"false positive rate (from 1/{round(1 / roc_floor(rocs))}, one non-member)")
    ax.set_ylabel("true positive rate")
    fig.tight_layout()
    return fig


def roc_grid_figure(
    rocs: RocMap, *, rows: Sequence[ResultRow] = (), members: int | None = None
) -> Figure:
    """:func:`roc_figure` at every finite epsilon, as small multiples on shared axes (two per
    row, so that the legends stay readable at the page's width)."""
    finite = sorted({e for (_, e, _) in rocs if math.isfinite(e)})
    cols = min(len(finite), 2)
    grid_rows = -(-len(finite) // cols)
    facts = _RocFacts(rows, members)
    fig, axes = plt.subplots(
        grid_rows,
        cols,
        figsize=(WIDTH, 4.1 * grid_rows + 0.9),
        sharex=True,
        sharey=True,
        squeeze=False,
    )
    colours, floor = _roc_colours(rocs), roc_floor(rocs)
    for ax, epsilon in zip(axes.flat, finite, strict=False):
        _roc_panel(ax, rocs, epsilon, colours, floor, facts, fontsize=SMALL)
        weak = facts.weak(epsilon)
        ax.set_title(
            f"ε = {format_epsilon(epsilon)}" + (f"  (weak: {', '.join(weak)})" if weak else ""),
            fontsize=FONT,
        )
    for ax in axes.flat[len(finite) :]:
        ax.set_visible(False)
    fig.supxlabel(f"false positive rate (from 1/{round(1 / floor)}, one non-member)", fontsize=FONT)
    fig.supylabel("true positive rate", fontsize=FONT)
    fig.suptitle(
        "ROC (log-log) at each ε: strongest attack per method\n" + facts.what(),
        fontsize=FONT + 1,
    )
    fig.tight_layout()
    return fig


# --- the folder ------------------------------------------------------------------------------


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
        rocs: the ROC curves of ``rocs.json``.
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
                for suffix, dpi in ((".png", PNG_DPI), (".pdf", None)):
                    path = tmp / f"{stem}{suffix}"
                    fig.savefig(path, format=suffix[1:], dpi=dpi, bbox_inches="tight")
            finally:
                plt.close(fig)

    replace_folder(folder, build)
    return [folder / name for name in names]
