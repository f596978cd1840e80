"""The trade-off figure (``plots/tradeoff``): the strongest attack's AUC against test
accuracy, one line per method joining its ε points; the first figure of report.html."""

from __future__ import annotations

import itertools
import math
from collections import defaultdict
from collections.abc import Mapping, Sequence

import matplotlib

matplotlib.use("Agg")  # headless: plots are files, never windows

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.artist import Artist
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch

from alm_opacus.report.plot_style import (
    FONT,
    NO_LEAK_COLOUR,
    NO_LEAK_LABEL,
    SMALL,
    WIDTH,
    LabelPlacer,
    error_bar,
    footnote,
    is_dp,
    label_groups,
    marker_face,
    note_under,
    series_label,
    weak_words,
    wrap_notes,
)
from alm_opacus.report.results import BASELINE, ResultRow
from alm_opacus.report.series import (
    CHANCE,
    CHANCE_COLOUR,
    Point,
    format_epsilon,
    guarantee_style,
    method_colours,
    no_leak,
    points,
)

__all__ = [
    "tradeoff_figure",
]


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
        f"guarantee ({weak_words(members)})",
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
        legend.append((pale, f"pale: weak guarantee ({weak_words(members)})"))
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
    note_under(fig, lg, wrap_notes([*notes, *rest.splitlines()]))
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
                yerr=error_bar(p.mia_auc),
                xerr=error_bar(p.test_accuracy),
                fmt=guarantee_style(kind)[0],
                color=colour,
                mfc=marker_face(kind, colour),
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
                mfc=marker_face(kind, colour),
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
                yerr=error_bar(baseline.mia_auc),
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
    placer = LabelPlacer(ax, [_xy(p) for p in shown], segments)
    merged = False
    for method, pts in sorted(by_method.items()):
        spots = [(*_xy(p), format_epsilon(p.epsilon_common)) for p in pts]
        for group in label_groups(ax, spots):
            x, y = (float(np.mean([s[k] for s in group])) for k in (0, 1))
            placer.add(x, y, ", ".join(s[2] for s in group), colours[method])
            merged |= len(group) > 1
    return placer.left_out, merged


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
