"""The figures against ε (and against noise or utility): the ALM paper's Figures 1 and 2,
the attack metrics with their intervals, and the equal-noise / equal-utility view. Each is a
stack of panels at the page's width with the legends at the right (``_Figure``)."""

from __future__ import annotations

import itertools
import math
from collections import defaultdict
from collections.abc import Callable, Sequence

import matplotlib

matplotlib.use("Agg")  # headless: plots are files, never windows

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.artist import Artist
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from alm_opacus.report.plot_style import (
    FONT,
    NOT_DP,
    REFERENCES,
    SMALL,
    WEAK_COLOUR,
    WEAK_LABEL,
    WIDTH,
    LabelPlacer,
    footnote,
    is_dp,
    label_groups,
    log_axis,
    marker_face,
    series_label,
    wrap_notes,
)
from alm_opacus.report.results import BASELINE, ResultRow
from alm_opacus.report.series import (
    CHANCE,
    CHANCE_COLOUR,
    WEAK_EPSILON,
    Point,
    Stat,
    format_epsilon,
    guarantee_style,
    method_colours,
    points,
)

__all__ = [
    "attack_figure",
    "equal_noise_figure",
    "mia_figure",
    "utility_figure",
]

#: Reads one statistic (with its bar) off a point.
Getter = Callable[[Point], Stat]
#: (field, name, FPR) of the TPR panels.
_TPR_PANELS = (
    ("tpr_at_fpr_0_01", "TPR at 1% FPR", 0.01),
    ("tpr_at_fpr_0_001", "TPR at 0.1% FPR", 0.001),
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
                mfc=marker_face(kind, colour),
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
                ax.axhline(stat.mean, color="black", lw=1, ls="--", label=REFERENCES[0])
                if stat.kind == "ci95":
                    ax.axhspan(
                        stat.low, stat.high, color="black", alpha=0.07, lw=0, label=REFERENCES[1]
                    )
        if chance is not None:
            ax.axhline(chance, color=CHANCE_COLOUR, lw=1, ls=":", label=REFERENCES[2])

    def epsilon_axis(self, ax: Axes) -> None:
        """Log x axis of replace-one epsilon, with the weak region shaded and labelled."""
        ax.set_xlabel("ε′ (replace-one ε)")
        log_axis(ax, "x")
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
        note = wrap_notes([*self.notes, *notes])
        if note:
            fig.text(0.01, 0.0, note, fontsize=SMALL, va="top", ha="left")
        return fig

    def _place_labels(self) -> None:
        left_out = 0
        for ax in self.axes:
            series = [(colour, spots) for a, colour, spots in self.labels if a is ax]
            if not series:
                continue
            placer = LabelPlacer(
                ax, [(x, y) for _, spots in series for x, y, _ in spots], self.segments.get(ax, [])
            )
            for colour, spots in series:
                for group in label_groups(ax, spots):
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
        mfc=marker_face(kind, "0.3"),
        mec="0.3",
        mew=1.3,
        ms=6,
    )


def _unique_handles(axes: Sequence[Axes]) -> tuple[list[Artist], list[str]]:
    """Each label once: the series first, then the reference lines and the weak region."""
    seen: dict[str, Artist] = {}
    for ax in axes:
        for handle, label in zip(*ax.get_legend_handles_labels(), strict=True):
            seen.setdefault(label, handle)
    order = sorted(seen, key=lambda label: (label in (*REFERENCES, WEAK_LABEL), label))
    return [seen[label] for label in order], order


def _stat(name: str) -> Getter:
    return lambda p: getattr(p, name)


def _epsilon(p: Point) -> float:
    return p.epsilon_common


def utility_figure(rows: Sequence[ResultRow]) -> Figure:
    """ALM paper, Figure 1: utility loss against epsilon, one series per mechanism."""
    view = _Figure(
        rows, panels=1, title="Utility loss vs privacy budget (ALM paper, Fig. 1)", height=4.0
    )
    (ax,) = view.axes
    view.draw(ax, _epsilon, _stat("utility_loss"))
    ax.axhline(0.0, color="black", lw=1, ls="--", label=REFERENCES[0])
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
    top.axhline(0.0, color="black", lw=1, ls="--", label=REFERENCES[0])
    for ax in (middle, bottom):
        view.references(ax, auc, chance=CHANCE["mia_auc"])
    for ax in (top, middle):
        log_axis(ax, "x")
        ax.set_xlabel("noise std per released weight")
    top.set_ylabel("utility loss")
    middle.set_ylabel("AUC\n(strongest attack)")
    bottom.set_ylabel("AUC\n(strongest attack)")
    bottom.set_xlabel("utility loss")
    top.set_title("equal noise: utility (labels: ε′)", fontsize=FONT)
    middle.set_title("equal noise: attack (labels: ε′)", fontsize=FONT)
    bottom.set_title("equal utility (labels: ε′)", fontsize=FONT)
    return view.finish()
