"""``report.html``: one static, self-contained page per run, readable offline.

The page is rendered from the Jinja2 template ``templates/report.html.j2`` with autoescaping
on: this module computes every text and number, the template only lays them out. Every
figure is embedded as a PNG data URI and the style sheet is inline: no server, no script, no
network (no CDN, no web font).

The page answers first, then shows the detail (``docs/reading_results.md``):

1. the title and one line of what ran;
2. **the verdict** (``report.verdict``): the recommendation, its caveats and a small table,
   per method, of the best accuracy at a meaningful guarantee;
3. **the trade-off figure** (``plots/tradeoff.png``: attack AUC against utility, one line
   per method);
4. the table (``report.table``, with the empirical ε lower bound and the verdict's marks);
5. what each method guarantees, in plain words (``report.words``);
6. the other figures of ``plots/`` (:data:`PLOT_ORDER`);
7. the per-member risk (``report.risk``), per method at the largest ε whose guarantee is not
   weak: it is computed from the private data, so a page that includes it is for the data
   owner, and says so at the top;
8. notes on how strong the attacks were; the settings last, with resolved values.

The *shareable* variant (``render_report(..., shareable=True)``, or :func:`shareable_report`
from a run folder's shared files alone) leaves out the per-member section, every member
index and score, and the split seed, and says so at the top. Nothing this module imports
imports torch, so ``alm-opacus export`` can render it quickly.
"""

from __future__ import annotations

import datetime
import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import jinja2

from alm_opacus.io import atomic_write_text
from alm_opacus.report.html_context import (
    figure_entry,
    guarantees_section,
    results_section,
    risk_epsilon,
    risk_section,
    verdict_section,
)
from alm_opacus.report.html_settings import RunFacts, attack_notes, settings_section
from alm_opacus.report.results import BASELINE, ResultRow, read_results
from alm_opacus.report.risk import CellScores
from alm_opacus.report.series import (
    format_epsilon,
    methods,
    points,
)
from alm_opacus.report.verdict import decide

# The page's sections are built in html_context and html_settings; RunFacts and risk_epsilon
# stay importable from here.
__all__ = [
    "PLOT_ORDER",
    "REPORT_FILE",
    "SHAREABLE_WITHHELD",
    "RunFacts",
    "render_report",
    "risk_epsilon",
    "shareable_report",
    "write_report",
]

#: The report's name in the run folder.
REPORT_FILE = "report.html"
#: The template, shipped as package data beside this module.
TEMPLATE = "report.html.j2"
#: The figures of ``plots/``, in the order shown, with a caption each: the first is the
#: trade-off, shown right under the verdict; the page shows those that exist.
PLOT_ORDER: tuple[tuple[str, str], ...] = (
    (
        "tradeoff",
        "The trade-off: the strongest attack's AUC, with its 95% interval, against test "
        "accuracy, one line per method, points labelled by ε′ (replace-one). Lower right is "
        "better: high utility, little leakage. A guarantee that is not DP is drawn apart and "
        "named “not DP”; where the run has the no-leak reference, its band is what the same "
        "statistic reads when nothing leaks.",
    ),
    (
        "attacks_vs_epsilon",
        "The strongest attack's AUC and TPR at a low FPR the evaluation set resolves, against "
        "ε′, with 95% intervals.",
    ),
    ("fig1_utility_loss", "Utility loss against ε (the ALM paper's Figure 1)."),
    ("fig2_mia", "MIA accuracy against ε and against utility loss (the ALM paper's Figure 2)."),
    (
        "equal_noise",
        "Equal noise and equal utility: is a method better, or does it add more noise?",
    ),
    (
        "roc_loglog",
        "ROC curves on log-log axes at the ε in the title: per method, the attack whose curve "
        "has the largest AUC. Each curve is one release, the first noise draw of one seed (the "
        "last seed run), so the AUC in its legend is that draw's; the table's AUC is the mean "
        "over every draw and seed of the strongest attack.",
    ),
    (
        "roc_by_epsilon",
        "ROC curves at every ε, as in the figure above: each curve is the first noise draw of "
        "one seed, not the mean the table shows.",
    ),
)
#: What the shareable page leaves out of the settings: the split seed re-draws the member
#: indices (the split is a public function of data set, sizes and seed); the paths describe
#: the owner's machine. The same keys as ``alm_opacus.run.rundir.WITHHELD_KEYS``.
SHAREABLE_WITHHELD = ("split_seed", "out", "cache_dir", "data_root")
_STYLE = """
body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;max-width:1100px;
margin:1.5em auto;padding:0 1em;color:#222;line-height:1.45;font-size:16px}
h1{font-size:1.5em;margin-bottom:.2em}h2{border-bottom:1px solid #ccc;padding-bottom:.2em;
margin-top:1.8em}h3{font-size:1.05em}.lead{color:#444;margin-top:0}
table{border-collapse:collapse;font-size:.85em;margin:.6em 0}
td,th{border:1px solid #ccc;padding:.2em .5em;text-align:left;vertical-align:top}
th{background:#f3f3f3}td.n{text-align:right;font-variant-numeric:tabular-nums}
tr.cited td{background:#eef5ff}tr.reference td{color:#555;font-style:italic}
figure{margin:1em 0}figure img{max-width:100%;border:1px solid #eee}
figcaption{font-size:.9em;color:#444}.warn{background:#fff4e0;border:1px solid #e0a040;
padding:.6em .8em}.note{background:#eef5ff;border:1px solid #8ab;padding:.6em .8em}
.verdict{border-left:4px solid #1f77b4;padding:.2em 1em;background:#f7fafd}
.answer{font-size:1.1em;font-weight:600}.verdict li{margin:.3em 0}
.small{font-size:.85em;color:#444}.notes li{margin:.25em 0}nav a{margin-right:1em}
code{background:#f5f5f5}
"""
_NAV = (
    ("verdict", "verdict"),
    ("tradeoff", "trade-off"),
    ("table", "table"),
    ("guarantees", "guarantees"),
    ("figures", "more figures"),
    ("risk", "per-member risk"),
    ("attacks", "attack strength"),
    ("settings", "settings"),
)


def _environment() -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(Path(__file__).parent / "templates"),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
    )


# -- the page -------------------------------------------------------------------------------


def _lead(rows: Sequence[ResultRow], settings: Mapping[str, Any], facts: RunFacts) -> str:
    names = [m for m in methods(rows) if m != BASELINE]
    epsilons = sorted({p.epsilon for p in points(rows) if math.isfinite(p.epsilon)})
    seeds = sorted({r.seed for r in rows})
    draws = settings.get("noise_draws")
    parts = [
        facts.dataset or "dataset",
        f"{', '.join(names) or 'no method'} against the unprotected head",
        f"ε {', '.join(format_epsilon(e) for e in epsilons)}" if epsilons else "no ε",
        f"{len(seeds)} seed{'s' if len(seeds) != 1 else ''}"
        + (f" × {draws} noise draws" if draws else ""),
    ]
    if facts.members:
        parts.append(f"{facts.members} members, {facts.nonmembers} non-members")
    return "; ".join(parts) + "."


def render_report(
    out: Path,
    *,
    rows: Sequence[ResultRow],
    settings: Mapping[str, Any],
    facts: RunFacts,
    risk: Mapping[tuple[str, float], CellScores],
    risk_plots: Sequence[Path],
    shareable: bool = False,
) -> str:
    """The page as text (see the module docstring).

    Args:
        out: the run folder (its ``plots/*.png`` are embedded).
        rows: the run's rows.
        settings: the run's settings (``config.json``).
        facts: what the views need of the run besides its rows.
        risk: per (method, ε) the per-example scores of one seed (left out when shareable).
        risk_plots: the risk figures' PNG files (left out when shareable).
        shareable: leave out the per-member section, every member index and score, and the
            split seed, and say so at the top.

    Returns:
        The HTML page.
    """
    verdict = decide(rows, members=facts.members, num_classes=facts.num_classes)
    plots = {stem: out / "plots" / f"{stem}.png" for stem, _ in PLOT_ORDER}
    figures = [figure_entry(plots[s], c) for s, c in PLOT_ORDER if plots[s].exists()]
    tradeoff = next((f for f in figures if f["stem"] == PLOT_ORDER[0][0]), None)
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    names = methods(rows)
    title = f"alm_opacus run: {facts.dataset or 'dataset'} ({', '.join(names)})"
    risk_view = None if shareable else risk_section(risk, risk_plots, facts, rows)
    private = ""
    if risk and not shareable:
        private = (
            "This page includes per-member risk computed from the private data. Give it only "
            "to the data owner; share the page alm-opacus export writes instead."
        )
    note = ""
    if shareable:
        note = (
            "Shareable page: the per-member risk section, every member's index and score, and "
            "the split seed are left out, because they identify members of the private data "
            "(the split seed re-draws the member indices). The data owner's report.html holds "
            "them."
        )
    page = (
        _environment()
        .get_template(TEMPLATE)
        .render(
            title=title,
            lead=_lead(rows, settings, facts) + f" Written {stamp} from {out.name}.",
            style=_STYLE,
            shareable=note,
            private=private,
            nav=[(i, label) for i, label in _NAV if i != "risk" or risk_view is not None],
            verdict=verdict_section(verdict, rows),
            tradeoff=tradeoff,
            results=results_section(rows, facts),
            guarantees=guarantees_section(rows),
            figures=[f for f in figures if f is not tradeoff],
            risk=risk_view,
            attacks=attack_notes(rows, facts),
            settings=settings_section(settings, facts, rows, shareable=shareable),
        )
    )
    return str(page)


def write_report(
    out: Path,
    *,
    rows: Sequence[ResultRow],
    settings: Mapping[str, Any],
    facts: RunFacts,
    risk: Mapping[tuple[str, float], CellScores],
    risk_plots: Sequence[Path],
) -> Path:
    """Write ``out / REPORT_FILE`` (the data owner's page) atomically, owner-only (it names
    the most exposed members), and return its path."""
    path = Path(out) / REPORT_FILE
    atomic_write_text(
        path,
        render_report(
            Path(out), rows=rows, settings=settings, facts=facts, risk=risk, risk_plots=risk_plots
        ),
        private=True,
    )
    return path


def shareable_report(run: Path) -> str:
    """The shareable page of a run folder, from its shared files alone: ``results.csv``,
    ``config.json`` and ``plots/*.png`` (never ``private/``). No torch is imported.

    Args:
        run: a run folder, or an exported copy of one.

    Returns:
        The HTML page of :func:`render_report` with ``shareable=True``.

    Raises:
        ValueError: if ``run`` has no readable ``results.csv`` or ``config.json``.
    """
    run = Path(run)
    try:
        settings = json.loads((run / "config.json").read_text())
    except (OSError, ValueError) as exc:
        raise ValueError(f"{run}: no readable config.json ({exc})") from exc
    if not isinstance(settings, dict):
        raise ValueError(f"{run / 'config.json'}: expected a JSON object")
    try:
        rows = read_results(run / "results.csv")
    except OSError as exc:
        raise ValueError(f"{run}: no readable results.csv ({exc})") from exc
    facts = RunFacts.from_settings(settings)
    return render_report(
        run, rows=rows, settings=settings, facts=facts, risk={}, risk_plots=[], shareable=True
    )
