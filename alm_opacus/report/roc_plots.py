"""ROC curves on log-log axes (Carlini et al. 2022): one panel at a chosen ε
(``plots/roc_loglog``) and small multiples at every ε (``plots/roc_by_epsilon``)."""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Mapping, Sequence

import matplotlib

matplotlib.use("Agg")  # headless: plots are files, never windows

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from alm_opacus.report.plot_style import (
    FONT,
    NO_LEAK_COLOUR,
    NOT_DP,
    SMALL,
    WIDTH,
    is_dp,
    set_log,
)
from alm_opacus.report.results import BASELINE, ResultRow
from alm_opacus.report.series import (
    CHANCE_COLOUR,
    NO_LEAK,
    format_epsilon,
    method_colours,
    points,
)

__all__ = [
    "RocMap",
    "roc_epsilon",
    "roc_figure",
    "roc_floor",
    "roc_grid_figure",
]

#: The ROC curves of ``rocs.jsonl`` (:mod:`alm_opacus.report.rocs`): (method, ε, attack) ->
#: (FPRs, TPRs), bounded (:func:`~alm_opacus.attacks.roc_bounds.bound_roc`).
RocMap = Mapping[tuple[str, float, str], tuple[Sequence[float], Sequence[float]]]


def roc_floor(rocs: RocMap) -> float:
    """The smallest FPR the evaluation set resolves, 1 / (non-members): the smallest positive
    FPR of any curve (a bounded curve keeps its points there). The ROC axes start there,
    since an FPR below one false positive cannot be read off the evaluation set."""
    steps = [min((x for x in fpr if x > 0), default=1.0) for fpr, _ in rocs.values()]
    return min(steps, default=1e-2)


class _RocFacts:
    """What the rows say about the ROC curves of ``rocs.jsonl``: the table's AUC of each
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
    set_log(ax, "x")
    set_log(ax, "y")
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
    the unprotected head. Each curve is one noise draw of one seed (``rocs.jsonl``); the
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
