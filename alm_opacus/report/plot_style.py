"""What every figure of ``plots/`` shares: sizes and fonts for report.html's column,
the DP / not-DP marker faces and legend labels, log axes, footnotes, and the placement of
point labels clear of markers, bars and lines. The conventions are listed in
:mod:`alm_opacus.report.plots`."""

from __future__ import annotations

import math
import textwrap
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path

import matplotlib
import numpy as np
from matplotlib.artist import Artist
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, NullFormatter

from alm_opacus.report.results import ResultRow
from alm_opacus.report.series import (
    WEAK_DELTA_UNKNOWN_N,
    WEAK_EPSILON,
    Point,
    Stat,
    format_epsilon,
    infeasible_rows,
)

__all__ = [
    "DP_KINDS",
    "FONT",
    "LABEL_OFFSETS",
    "MIN_TEXT_PX",
    "NOT_DP",
    "NO_LEAK_COLOUR",
    "NO_LEAK_LABEL",
    "PAGE_WIDTH_PX",
    "PNG_DPI",
    "REFERENCES",
    "SMALL",
    "WEAK_COLOUR",
    "WEAK_LABEL",
    "WIDTH",
    "LabelPlacer",
    "error_bar",
    "footnote",
    "is_dp",
    "label_groups",
    "log_axis",
    "marker_face",
    "note_under",
    "save_figure",
    "series_label",
    "set_log",
    "weak_words",
    "wrap_notes",
]

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
REFERENCES = ("unprotected (none)", "unprotected: 95% interval", "chance")
WEAK_COLOUR = "#fbe0c0"
WEAK_LABEL = f"ε > {WEAK_EPSILON:g}: weak guarantee"
NO_LEAK_COLOUR = "#2e8b57"
NO_LEAK_LABEL = "no-leak band: a release that never saw the members"
#: The footnote's line length (characters): it fits the figure's width at SMALL.
_NOTE_CHARS = 118


def is_dp(kind: str) -> bool:
    """Whether a guarantee kind (under replace-one) is differential privacy."""
    return kind in DP_KINDS


def series_label(method: str, kind: str, *, converted: bool = False) -> str:
    """A series' legend label: ``"dpsgd (approx-dp)†"``, ``"alm (random-dp, not DP)"``."""
    extra = "" if is_dp(kind) else f", {NOT_DP}"
    return f"{method} ({kind}{extra})" + ("†" if converted else "")


def marker_face(kind: str, colour: str) -> str:
    """Filled for a DP guarantee, hollow (white) for any other."""
    return colour if is_dp(kind) else "white"


def wrap_notes(lines: Sequence[str]) -> str:
    return "\n".join(
        textwrap.fill(line, _NOTE_CHARS, subsequent_indent="  ") for line in lines if line
    )


def log_axis(ax: Axes, which: str) -> None:
    if ax.has_data():
        set_log(ax, which)
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


def set_log(ax: Axes, which: str) -> None:
    """A log axis labelled in plain numbers (0.1, 1, 10, 1000): easier to read than
    powers of ten, and faster to draw (no mathtext)."""
    (ax.set_xscale if which == "x" else ax.set_yscale)("log")
    axis = ax.xaxis if which == "x" else ax.yaxis
    axis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))
    axis.set_minor_formatter(NullFormatter())


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


def weak_words(members: int | None) -> str:
    line = f"1/{members}" if members else f"{WEAK_DELTA_UNKNOWN_N:g}"
    return f"ε′ > {WEAK_EPSILON:g} or δ′ > {line}"


#: Offsets (points) tried for a point's label, nearest first; the farther rings get a
#: leader line to their point.
LABEL_OFFSETS: tuple[tuple[float, float], ...] = tuple(
    (r * dx, r * dy)
    for r in (1.0, 2.0, 3.2, 4.6)
    for dx, dy in ((5, 5), (5, -5), (-5, 5), (-5, -5), (0, 7), (0, -7), (7, 0), (-7, 0))
)
#: Points of one method nearer than this (display px at 100 dpi) share one label.
_MERGE_PX = 12.0


class LabelPlacer:
    """Places text labels next to points: each label takes the first offset of
    :data:`LABEL_OFFSETS` where it overlaps no other label, no marker, and (where it can)
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
            for k, (dx, dy) in enumerate(LABEL_OFFSETS):
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


def label_groups(
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


def error_bar(stat: Stat) -> np.ndarray | None:
    """One point's (2, 1) error bar, or None where the stat has none."""
    if not stat.kind or math.isnan(stat.low) or math.isnan(stat.high):
        return None
    return np.array([[max(stat.mean - stat.low, 0.0)], [max(stat.high - stat.mean, 0.0)]])


def note_under(fig: Figure, above: Artist, text: str) -> None:
    """``text`` in the figure, left-aligned, just under ``above`` (e.g. a legend)."""
    if not text:
        return
    renderer = fig.canvas.get_renderer()  # type: ignore[attr-defined]
    box = above.get_window_extent(renderer).transformed(fig.transFigure.inverted())
    fig.text(0.01, box.y0 - 0.01, text, fontsize=SMALL, va="top", ha="left")


def save_figure(fig: Figure, targets: Sequence[tuple[Path, int | None]]) -> None:
    """Write ``fig`` to each ``(path, dpi)`` (the format from the suffix; ``None``: the
    format's default dpi), cropped to one tight box computed once at the first target's dpi.

    ``bbox_inches="tight"`` renders the whole figure in each format only to measure it; the
    box measured on the figure's own canvas is the same crop (the PNGs are the same pixels)
    and costs one layout pass for every format.
    """
    if not targets:
        return
    first_dpi = targets[0][1]
    if first_dpi is not None:
        fig.set_dpi(first_dpi)
    renderer = fig.canvas.get_renderer()  # type: ignore[attr-defined]
    pad = float(matplotlib.rcParams["savefig.pad_inches"])
    box = fig.get_tightbbox(renderer).padded(pad)
    for path, dpi in targets:
        fig.savefig(path, format=Path(path).suffix[1:], dpi=dpi, bbox_inches=box)
