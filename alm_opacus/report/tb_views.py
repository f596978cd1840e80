"""What TensorBoard shows of ``tb/`` besides the scalars: the custom-scalars layout, the
links that open each dashboard, and the read-me of the Text tab."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Sequence
from urllib.parse import quote, urlencode

from tensorboard.plugins.custom_scalar import layout_pb2

from alm_opacus.report.results import ResultRow
from alm_opacus.report.series import (
    CHANCE,
    NO_LEAK,
    WEAK_EPSILON,
    format_epsilon,
    infeasible_rows,
    no_leak,
    points,
)
from alm_opacus.report.tb_hparams import weak_rule
from alm_opacus.report.tb_runs import (
    LAYOUT_NAME,
    METRICS,
    NO_LEAK_RUN,
    PALETTE_SIZE,
    TRADEOFF_EPSILON_TAG,
    TRADEOFF_TAG,
    UTILITY_SCALE,
    X_UTILITY,
    EpsilonAxis,
    TradeoffStep,
    coloured_runs,
)
from alm_opacus.report.words import guarantee_words

__all__ = [
    "ROOT_RUN",
    "dashboard_urls",
    "layout",
    "read_me",
]


def _resolved(rows: Sequence[ResultRow], field: str) -> bool:
    return any(not math.isnan(getattr(r, field)) for r in rows)


def _escape(text: str) -> str:
    """``text`` as a regex that matches it literally, in Python's ``re`` and in JavaScript
    (only the metacharacters escaped, so a filter box shows it readably)."""
    return re.sub(r"([.^$*+?()\[\]{}|\\])", r"\\\1", text)


def _exact(tag: str) -> str:
    """A regex matching exactly ``tag``."""
    return f"^{_escape(tag)}$"


def layout(rows: Sequence[ResultRow], axis: EpsilonAxis) -> layout_pb2.Layout:
    def line(title: str, *tags: str) -> layout_pb2.Chart:
        return layout_pb2.Chart(title=title, multiline=layout_pb2.MultilineChartContent(tag=tags))

    def margin(title: str, tag: str) -> layout_pb2.Chart:
        series = layout_pb2.MarginChartContent.Series(
            value=tag, lower=f"{tag}/low", upper=f"{tag}/high"
        )
        return layout_pb2.Chart(title=title, margin=layout_pb2.MarginChartContent(series=[series]))

    reference = f"; flat: {NO_LEAK_RUN}" if any(r.method == NO_LEAK for r in rows) else ""
    trade_off = [
        line(
            f"AUC of the strongest attack (y) vs {X_UTILITY} (x); one point per ε, "
            f"chance 0.5{reference}",
            _exact(TRADEOFF_TAG),
        ),
        margin(f"the same AUC with its 95% interval (x: {X_UTILITY})", TRADEOFF_TAG),
        line(
            f"log10 ε′ (replace-one) of each point (x: {X_UTILITY})", _exact(TRADEOFF_EPSILON_TAG)
        ),
    ]
    by_epsilon = [
        line("test accuracy vs ε (none: unprotected)", r"^test_accuracy$"),
        line("utility loss vs ε (1 − acc/acc(none))", r"^utility_loss$"),
    ]
    for field, tag, title in METRICS:
        if not _resolved(rows, field):
            continue  # the evaluation set cannot resolve this FPR: nothing to draw
        by_epsilon.append(line(f"{title} vs ε (chance: {CHANCE[field]:g})", _exact(f"best/{tag}")))
    by_epsilon += [
        margin("AUC of the strongest attack vs ε, with its 95% interval", "best/mia_auc"),
        line("noise std per weight vs ε", r"^noise_std$"),
        line(
            "log10 ε at each step, and log10 ε′ (replace-one)",
            r"^grid/log10_epsilon$",
            r"^grid/log10_epsilon_replace_one$",
        ),
        line(
            f"weak guarantee (1: replace-one ε′ > {WEAK_EPSILON:g} or δ′ too large)",
            r"^grid/weak_guarantee$",
        ),
    ]
    attacks = [
        line(f"{tag} per attack vs ε", f"^attack/.*/{_escape(tag)}$")
        for _, tag, _ in (*METRICS, ("", "eps_lower_bound", ""))
    ]
    return layout_pb2.Layout(
        category=[
            layout_pb2.Category(title=f"{LAYOUT_NAME}: attack vs utility", chart=trade_off),
            layout_pb2.Category(title=f"against ε ({axis.caption()})", chart=by_epsilon),
            layout_pb2.Category(title=f"attacks ({axis.caption()})", chart=attacks, closed=True),
        ]
    )


#: The tags the Time Series link shows, as a regex for its tag filter: the trade-off's
#: two cards (Time Series lists matching cards by name, and hides pinned cards while a
#: filter is set; clearing the filter shows the pinned trade-off on top of every card).
_KEY_TAGS = f"^({_escape(TRADEOFF_TAG)}|{_escape(TRADEOFF_EPSILON_TAG)})$"
#: The method runs and the reference: no slash (the hparams sessions have one) and not the
#: root run ".". The one group makes each run its own colour group in Time Series.
_METHOD_RUNS = r"^(?!\.$)([^/]+)$"
#: The root run (the read-me, the layout, the plots), as a run-filter regex.
ROOT_RUN = r"^\.$"


def dashboard_urls(base: str = "http://localhost:6006") -> dict[str, str]:
    """Links that open TensorBoard (2.21) on this folder with smoothing off, only the method
    runs, and the trade-off chart first: Time Series with the trade-off card pinned on top,
    one colour per method (each method run its own colour group; the hparams sessions match
    none, so they take none of the 7 colours) and only the key tags; Custom Scalars with the
    "trade-off" layout (its first chart is the trade-off); HParams; Text and Images on the
    root run.

    Args:
        base: where ``tensorboard --logdir <out>/tb`` serves.

    Returns:
        URLs by view: ``time series``, ``custom scalars``, ``hparams``, ``read me``,
        ``images``.
    """
    pinned = [{"plugin": "scalars", "tag": TRADEOFF_TAG}]
    series = {
        "pinnedCards": json.dumps(pinned, ensure_ascii=False, separators=(",", ":")),
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


def _weak_table(rows: Sequence[ResultRow], axis: EpsilonAxis, members: int | None) -> list[str]:
    """The read-me's step table: one line per (step, method), with the replace-one ε′, δ′
    the weak flag is decided on (DP-SGD's ε = 10 is ε′ = 20: weak)."""
    found = sorted(
        (p for p in points(rows) if math.isfinite(p.epsilon)),
        key=lambda p: (axis.step(p.epsilon), p.method),
    )
    lines = [
        f"Weak: {weak_rule(members)} (replace-one, per method: an add/remove ε "
        "is 2ε under replace-one).",
        "",
        "| step | ε asked | method | ε′ | δ′ | weak |",
        "|---|---|---|---|---|---|",
    ]
    for p in found:
        delta = "≥ 1 (proves nothing)" if p.vacuous else f"{p.delta_common:.2g}"
        lines.append(
            f"| {axis.step(p.epsilon)} | {format_epsilon(p.epsilon)} | {p.method} | "
            f"{format_epsilon(p.epsilon_common)} | {delta} | "
            f"{'**weak**' if p.weak_for(members) else ''} |"
        )
    return lines


def read_me(
    rows: Sequence[ResultRow],
    axis: EpsilonAxis,
    *,
    tradeoff: Sequence[TradeoffStep] = (),
    members: int | None = None,
) -> str:
    """The Markdown shown in TensorBoard's Text tab: how to read this folder.

    Args:
        rows: the run's rows.
        axis: the ε axis of the charts against ε.
        tradeoff: the trade-off chart's steps (:func:`tradeoff_steps`), for the points moved.
        members: the number of members (the weak δ′ line is 1/n); ``None``: not known.

    Returns:
        The read-me, as Markdown.
    """
    urls = dashboard_urls()
    coloured = coloured_runs(rows)
    reference = no_leak(rows)
    lines = [
        "# How to read this run",
        "",
        "## The trade-off (first chart)",
        "",
        f"`{TRADEOFF_TAG}`: the strongest attack's AUC (y) against utility (x = "
        f"round({X_UTILITY})), one point per (method, ε), one line per method; the "
        "unprotected head `none` is one point. Lower and further right is better: less "
        f"leak at more accuracy. `{TRADEOFF_EPSILON_TAG}` gives the ε′ of each point.",
    ]
    if reference is not None:
        lines += [
            "",
            f"`{NO_LEAK_RUN}` is flat across the utility range: the same strongest-attack "
            f"AUC on a release that never saw the members ({reference.mia_auc.mean:.3f}, "
            f"95% interval [{reference.mia_auc.low:.3f}, {reference.mia_auc.high:.3f}]). "
            "Above 0.5 it is the maximum over attacks (selection), not a leak; a point "
            "within its band shows no measurable leak. It is a reference, not a protection.",
        ]
    lines += _bullets(
        "Points moved right because another ε of the method had the same step:",
        [
            f"{t.method} at ε = {format_epsilon(t.epsilon)}: step {t.step} "
            f"(accuracy ×{UTILITY_SCALE} rounds to {t.wanted})"
            for t in tradeoff
            if t.moved
        ],
    )
    lines += [
        "",
        "## Charts against ε",
        "",
        f"Their x axis is **log ε**: {axis.caption()}; ε values are charted as log10.",
        "",
        *_weak_table(rows, axis, members),
        "",
        "## Runs, colours, links",
        "",
        "* One run per method, the mean over seeds (scalar `seeds` counts them); the run's "
        "name gives the guarantee kind. `none [none]` is the unprotected head, flat across "
        "the ε grid. Chance is in each chart's title.",
        f"* Colours follow this order: {', '.join(f'`{r}`' for r in coloured)}"
        + (
            f"; TensorBoard has {PALETTE_SIZE} colours, so runs after the seventh share "
            "one (hover a line to read its run)."
            if len(coloured) > PALETTE_SIZE
            else ": each its own."
        ),
        f"* Open with smoothing off (TensorBoard smooths by 0.6 by default, which bends a sweep "
        f"of a few points): [Time Series]({urls['time series']}) (the two trade-off cards; "
        "clear its tag filter for every tag, the trade-off pinned on top), "
        f"[Custom Scalars]({urls['custom scalars']}) (the trade-off first, then one chart "
        f"per metric against ε), [HParams]({urls['hparams']}) (one session per (method, ε); "
        "its scatter view of AUC against ε′, Log scale, is the ε trade-off).",
        "* TensorBoard scales each chart to the 5th-95th percentile of its values by "
        "default, which can cut off the end points of a sweep: untick *Ignore outliers in "
        "chart scaling* to see every point.",
        "* The Scalars dashboards select no run when more than 40 match the run filter; the "
        "links keep only the method runs.",
        "* `best/<metric>` is the strongest attack for that metric, over every attack row; "
        "`best/<metric>/low` and `/high` are its error bar (95% interval over the evaluation "
        "set, or ±1 std where none was recorded). A TPR the evaluation set cannot resolve "
        "(fewer non-members than 1/FPR) is not logged.",
        "* Guarantee kinds: "
        + "; ".join(
            f"`{k}`: {guarantee_words(k)}"
            for k in dict.fromkeys(r.guarantee for r in rows if r.guarantee and r.method != NO_LEAK)
        )
        + ".",
        "* A run marked `add-remove` states an add/remove epsilon (DP-SGD). Under replace-one, "
        "the relation of the post-training mechanisms, it is (2ε, (1 + e^ε)δ): see "
        "`grid/epsilon_replace_one` and `grid/delta_replace_one`.",
    ]
    lines += _bullets(
        "## Infeasible cells (not plotted)",
        [
            f"{r.method} at epsilon {format_epsilon(r.epsilon)}, seed {r.seed}: "
            f"{r.reason or 'no reason recorded'}"
            for r in infeasible_rows(rows)
        ],
    )
    return "\n".join(lines)


def _bullets(heading: str, items: Sequence[str]) -> list[str]:
    """A read-me block: ``heading`` and one bullet per item, after a blank line; nothing
    where there are no items."""
    return ["", heading, "", *(f"* {item}" for item in items)] if items else []
