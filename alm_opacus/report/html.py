"""``report.html``: one static, self-contained page per run, readable offline.

Every figure is embedded as a PNG data URI and the style sheet is inline: no server, no
script, no network (no CDN, no web font). The page holds the settings; per method the
guarantee in plain words (``report.words``); the trade-off figures of ``plots/``; the
table (``report.table``, with the definitions of its words); the per-member risk
(``report.risk``: it is computed from the private data, so a page that includes it is for
the data owner, and says so at the top); and notes on how strong the attacks were.
"""

from __future__ import annotations

import base64
import datetime
import html
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from alm_opacus.io import atomic_write_text
from alm_opacus.report.results import ResultRow
from alm_opacus.report.risk import (
    BASELINE,
    RISK_FOLDER,
    CellScores,
    top_size,
)
from alm_opacus.report.series import format_epsilon, points, replace_one
from alm_opacus.report.table import TPR_LEVELS, tradeoff_cells
from alm_opacus.report.words import guarantee_words

__all__ = ["PLOT_ORDER", "REPORT_FILE", "RunFacts", "render_report", "write_report"]

#: The report's name in the run folder.
REPORT_FILE = "report.html"
#: The trade-off figures of ``plots/``, in the order shown, with a caption each.
PLOT_ORDER: tuple[tuple[str, str], ...] = (
    ("fig1_utility_loss", "Utility loss against ε (the ALM paper's Figure 1)."),
    (
        "attacks_vs_epsilon",
        "The strongest attack's AUC and TPR at low FPR against ε, with 95% intervals.",
    ),
    ("fig2_mia", "MIA accuracy against ε and against utility loss (the ALM paper's Figure 2)."),
    (
        "equal_noise",
        "Equal noise and equal utility: is a method better, or does it add more noise?",
    ),
    ("roc_loglog", "ROC curves on log-log axes at the largest ε."),
    ("roc_by_epsilon", "ROC curves at every ε."),
)
_RISK_CAPTIONS = {
    "hist": "Attack scores of members and non-members: where the two coincide, the attack "
    "cannot tell them apart.",
    "class_auc": "Membership AUC per class with its 95% DeLong interval: some classes leak "
    "more than others.",
    "top16": "The 16 members the attack finds most exposed (title: the dataset row).",
    "top_overlap": "Are the same members exposed as in the unprotected head, as ε grows?",
}
_STYLE = """
body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;max-width:1100px;
margin:1.5em auto;padding:0 1em;color:#222;line-height:1.45}
h1{font-size:1.5em}h2{border-bottom:1px solid #ccc;padding-bottom:.2em;margin-top:1.8em}
table{border-collapse:collapse;font-size:.85em;margin:.6em 0}
td,th{border:1px solid #ccc;padding:.2em .5em;text-align:left;vertical-align:top}
th{background:#f3f3f3}td.n{text-align:right;font-variant-numeric:tabular-nums}
figure{margin:1em 0}figure img{max-width:100%;border:1px solid #eee}
figcaption{font-size:.85em;color:#555}.warn{background:#fff4e0;border:1px solid #e0a040;
padding:.6em .8em}.notes li{margin:.25em 0}nav a{margin-right:1em}code{background:#f5f5f5}
"""


@dataclass(frozen=True)
class RunFacts:
    """What the views need of a run besides its rows, read from its ``config.json``."""

    dataset: str = ""
    members: int | None = None
    nonmembers: int | None = None
    num_classes: int | None = None
    attacks: tuple[str, ...] = ()
    num_reference: int | None = None

    @classmethod
    def from_settings(
        cls,
        settings: Mapping[str, Any],
        *,
        num_classes: int | None = None,
        num_reference: int | None = None,
    ) -> RunFacts:
        split = settings.get("split") or {}
        members = split.get("members")
        nonmembers = split.get("nonmembers") or members
        options = settings.get("attack_options") or {}
        return cls(
            dataset=str(settings.get("dataset", "")),
            members=int(members) if members else None,
            nonmembers=int(nonmembers) if nonmembers else None,
            num_classes=num_classes,
            attacks=tuple(settings.get("attacks") or ()),
            num_reference=options.get("num_reference", num_reference),
        )


def _e(text: object) -> str:
    return html.escape(str(text))


def _png(path: Path) -> str:
    return "data:image/png;base64," + base64.b64encode(path.read_bytes()).decode("ascii")


def _figure(path: Path, caption: str) -> str:
    return (
        f'<figure><img alt="{_e(path.stem)}" src="{_png(path)}">'
        f"<figcaption>{_e(caption)}</figcaption></figure>"
    )


def _table(header: Sequence[str], body: Sequence[Sequence[object]], numeric: set[int]) -> str:
    head = "".join(f"<th>{_e(h)}</th>" for h in header)
    lines = [
        "<tr>"
        + "".join(
            f'<td class="n">{_e(c)}</td>' if i in numeric else f"<td>{_e(c)}</td>"
            for i, c in enumerate(cells)
        )
        + "</tr>"
        for cells in body
    ]
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(lines)}</tbody></table>"


def _settings(settings: Mapping[str, Any], facts: RunFacts) -> str:
    keep = (
        "dataset",
        "methods",
        "epsilons",
        "delta",
        "seeds",
        "split_seed",
        "split",
        "noise_draws",
        "attacks",
        "attack_options",
        "head",
        "method_options",
        "reproducible_noise",
        "device",
        "environment",
    )
    body = [[k, _compact(settings[k])] for k in keep if k in settings]
    if facts.num_classes:
        body.append(["classes", str(facts.num_classes)])
    return _table(("setting", "value"), body, set())


def _compact(value: object) -> str:
    if isinstance(value, dict):
        return "; ".join(f"{k}={_compact(v)}" for k, v in value.items())
    if isinstance(value, list | tuple):
        return ", ".join(_compact(v) for v in value)
    if isinstance(value, float):
        return format_epsilon(value) if math.isinf(value) else f"{value:g}"
    return str(value)


def _guarantees(rows: Sequence[ResultRow], facts: RunFacts) -> str:
    body = []
    for method in dict.fromkeys(r.method for r in rows):
        found = [r for r in rows if r.method == method and r.status == "ok"]
        if not found:
            continue
        kinds = dict.fromkeys((r.guarantee, r.neighbouring) for r in found)
        words = " / ".join(guarantee_words(k, neighbouring=n) for k, n in kinds)
        if method == BASELINE:
            shown = "—"
        else:
            pairs = sorted({replace_one(r) for r in found})
            shown = ", ".join(f"({e:.3g}, {d:.2g})" for e, d in pairs)
        body.append([method, "/".join(k for k, _ in kinds), words, shown])
    return _table(
        ("method", "kind", "the guarantee in plain words", "replace-one (ε′, δ′) over the grid"),
        body,
        set(),
    )


def _risk(
    risk: Mapping[tuple[str, float], CellScores], plots: Sequence[Path], facts: RunFacts
) -> str:
    if not risk:
        return "<p>No per-member risk: the run ran neither a LiRA nor the loss attack.</p>"
    parts = [
        '<p class="warn">Computed from the private data: each row below names a member (its '
        f"row in the dataset, <code>split.json</code>). The files are in <code>{_e(RISK_FOLDER)}/"
        "</code>, one per release, for the data owner only.</p>",
        "<p>Score: the attack's per-example statistic (LiRA: the log likelihood ratio, or "
        "offline LiRA's z-score; loss: log p<sub>y</sub>), the mean over the release's noise "
        "draws; rank 1 is the most exposed member. The Python API returns the same: "
        "<code>alm_opacus.report.risk.risk_table(run, method=..., epsilon=...)</code>.</p>",
    ]
    members = facts.members or 0
    for method in sorted({m for m, _ in risk}, key=lambda m: m != BASELINE):
        cell = max((c for (m, _), c in risk.items() if m == method), key=lambda c: c.epsilon)
        kind = "lira" if "lira" in cell.scores else next(iter(cell.scores))
        ranks = cell.ranks(kind)
        base = risk.get((BASELINE, math.inf))
        clean = (
            dict(zip(base.rows.tolist(), base.scores.get(kind, []), strict=False)) if base else {}
        )
        top = sorted((i for i in range(len(ranks)) if cell.is_member[i]), key=lambda i: ranks[i])[
            :10
        ]
        body = [
            [
                int(cell.rows[i]),
                int(cell.labels[i]),
                f"{cell.scores[kind][i]:.3f}",
                f"{ranks[i]:.0f}",
                _fmt(clean.get(int(cell.rows[i]))),
            ]
            for i in top
        ]
        where = "unprotected" if method == BASELINE else f"ε = {format_epsilon(cell.epsilon)}"
        parts.append(
            f"<h3>{_e(method)} ({_e(where)}): the 10 most exposed members "
            f"({_e(cell.attacks[kind])})</h3>"
        )
        parts.append(
            _table(("row", "label", "score", "rank", "score, unprotected"), body, {0, 1, 2, 3, 4})
        )
    if members:
        k = top_size(members)
        parts.append(
            f"<p>The overlap figure compares the {k} most exposed members (at most "
            f"100, and at most a quarter of the {members} members; chance: "
            f"{k}/{members}).</p>"
        )
    for path in plots:
        prefix = path.stem.split("_")[0] if not path.stem.startswith("top") else path.stem
        caption = _RISK_CAPTIONS.get(prefix, _RISK_CAPTIONS.get(path.stem.rsplit("_", 1)[0], ""))
        parts.append(_figure(path, f"{path.stem}: {caption}"))
    return "\n".join(parts)


def _fmt(value: object) -> str:
    return "—" if value is None else f"{float(value):.3f}"  # type: ignore[arg-type]


def _attack_notes(rows: Sequence[ResultRow], facts: RunFacts) -> str:
    attacks = sorted({r.attack for r in rows if r.attack})
    notes = [
        f"Attacks run: {', '.join(attacks) or 'none'}. Each number in the table is the "
        "strongest of them (the largest value over every attack and attacker), which errs on "
        "the attacker's side.",
        "Where a method supplies a noise-aware attacker (the post-training mechanisms), "
        "unsuffixed attacks are its: its shadow and reference heads are protected like the "
        "release (same mechanism and ε), and names ending in -clean are the clean-reference "
        "attacker's, whose heads are unprotected. For the other methods the attacker's heads "
        "follow the victim's recipe, unprotected.",
        "LiRA (Carlini et al. 2022) uses "
        f"{facts.num_reference or 'its'} reference heads of the victim's size; lira-offline "
        "scores each candidate with the references that did not train on it (full strength), "
        "lira-offline-pool only with references that never saw a candidate (a stricter "
        "attacker, weaker).",
    ]
    if facts.nonmembers:
        levels = [
            f"TPR at {100 * fpr:g}% FPR is "
            + ("resolved" if facts.nonmembers * fpr >= 1 else
               f"not (it needs {math.ceil(1 / fpr - 1e-9)} non-members)")
            for _, _, fpr in TPR_LEVELS
        ]  # fmt: skip
        notes.append(
            f"The evaluation set has {facts.members} members and {facts.nonmembers} "
            f"non-members: the smallest false positive rate it resolves is 1/{facts.nonmembers}"
            f", so the ROC axes start there and a TPR is shown only at FPRs of at least that: "
            + "; ".join(levels)
            + "."
        )
    ceilings = [
        r.eps_lower_bound_ceiling for r in rows if not math.isnan(r.eps_lower_bound_ceiling)
    ]
    if ceilings:
        notes.append(
            "The empirical ε lower bound (an audit of the claim) can never exceed "
            f"{max(ceilings):.2f} on an evaluation set this size at 95% confidence: a claimed "
            "ε above that cannot be refuted here, whatever the attack."
        )
    return "<ul class=notes>" + "".join(f"<li>{_e(n)}</li>" for n in notes) + "</ul>"


def render_report(
    out: Path,
    *,
    rows: Sequence[ResultRow],
    settings: Mapping[str, Any],
    facts: RunFacts,
    risk: Mapping[tuple[str, float], CellScores],
    risk_plots: Sequence[Path],
) -> str:
    """The page as text (see the module docstring)."""
    header, body, footnotes = tradeoff_cells(
        rows, members=facts.members, nonmembers=facts.nonmembers, num_classes=facts.num_classes
    )
    plots = [(out / "plots" / f"{stem}.png", caption) for stem, caption in PLOT_ORDER]
    plots = [(p, c) for p, c in plots if p.exists()]
    methods = list(dict.fromkeys(r.method for r in rows))
    epsilons = sorted({p.epsilon for p in points(rows)})
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    title = f"alm_opacus run: {facts.dataset or 'dataset'} ({', '.join(methods)})"
    sections = [
        f"<h1>{_e(title)}</h1>",
        f"<p>Written {_e(stamp)} from <code>{_e(out.name)}</code>: methods "
        f"{_e(', '.join(methods))}; ε {_e(', '.join(format_epsilon(e) for e in epsilons))}."
        "</p>",
    ]
    if risk:
        sections.append(
            '<p class="warn">This page includes per-member risk computed from the private '
            "data. Give it only to the data owner; share <code>results.csv</code> and "
            "<code>plots/</code> instead.</p>"
        )
    sections += [
        '<nav><a href="#settings">settings</a><a href="#guarantees">guarantees</a>'
        '<a href="#tradeoff">trade-off</a><a href="#table">table</a><a href="#risk">risk</a>'
        '<a href="#attacks">attack strength</a></nav>',
        '<h2 id="settings">Settings</h2>',
        _settings(settings, facts),
        '<h2 id="guarantees">What each method guarantees</h2>',
        _guarantees(rows, facts),
        '<h2 id="tradeoff">Trade-off</h2>',
        *[_figure(p, c) for p, c in plots],
        '<h2 id="table">Table</h2>',
        _table(header, body, {1, 3, 4, 5, 6, 7, 8, 9}),
        "<ul class=notes>" + "".join(f"<li>{_e(n)}</li>" for n in footnotes) + "</ul>",
        '<h2 id="risk">Per-member risk</h2>',
        _risk(risk, risk_plots, facts),
        '<h2 id="attacks">Attack strength</h2>',
        _attack_notes(rows, facts),
    ]
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>{_e(title)}</title><style>{_STYLE}</style></head><body>\n"
        + "\n".join(sections)
        + "\n</body></html>\n"
    )


def write_report(
    out: Path,
    *,
    rows: Sequence[ResultRow],
    settings: Mapping[str, Any],
    facts: RunFacts,
    risk: Mapping[tuple[str, float], CellScores],
    risk_plots: Sequence[Path],
) -> Path:
    """Write ``out / REPORT_FILE`` atomically and return its path."""
    path = Path(out) / REPORT_FILE
    atomic_write_text(
        path,
        render_report(
            Path(out), rows=rows, settings=settings, facts=facts, risk=risk, risk_plots=risk_plots
        ),
    )
    return path
