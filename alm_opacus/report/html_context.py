"""The sections of ``report.html`` as template context: the verdict, the table, the
guarantees in words, the figures and the per-member risk. Every text and number is computed
here; :mod:`alm_opacus.report.html` lays them out with its template."""

from __future__ import annotations

import base64
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from alm_opacus.report.html_settings import RunFacts
from alm_opacus.report.results import BASELINE, ResultRow
from alm_opacus.report.risk import RISK_FOLDER, CellScores, top_size
from alm_opacus.report.series import (
    WEAK_EPSILON,
    Point,
    format_epsilon,
    format_stat,
    methods,
    no_leak,
    points,
    replace_one,
)
from alm_opacus.report.table import CITED, tradeoff_cells
from alm_opacus.report.verdict import USEFUL_FRACTION, Pick, Verdict
from alm_opacus.report.words import guarantee_short, guarantee_words

__all__ = [
    "RISK_CAPTIONS",
    "figure_entry",
    "guarantees_section",
    "results_section",
    "risk_epsilon",
    "risk_section",
    "verdict_section",
]

RISK_CAPTIONS = {
    "hist": "Attack scores of members and non-members: where the two coincide, the attack "
    "cannot tell them apart.",
    "class_auc": "Membership AUC per class with its 95% DeLong interval: some classes leak "
    "more than others.",
    "top16": "The 16 members the attack finds most exposed (title: the dataset row).",
    "top_overlap": "Are the same members exposed as in the unprotected head, as ε grows?",
}


def _png(path: Path) -> str:
    return "data:image/png;base64," + base64.b64encode(path.read_bytes()).decode("ascii")


def figure_entry(path: Path, caption: str) -> dict[str, str]:
    return {"stem": path.stem, "alt": path.stem, "src": _png(path), "caption": caption}


# -- verdict ------------------------------------------------------------------------------


def _lb(value: float) -> str:
    return "-" if math.isnan(value) else f"{value:.2f}"


def _band(inside: bool | None) -> str:
    if inside is None:
        return "—"
    return "inside: no leak shown" if inside else "outside"


def _pick_cells(pick: Pick, *, kind: str, band: bool) -> list[str]:
    epsilon = f"{pick.epsilon_common:.3g}"
    if not math.isclose(pick.epsilon_common, pick.epsilon):
        epsilon += f" (ε = {format_epsilon(pick.epsilon)})"
    useful = "—" if pick.useful is None else ("yes" if pick.useful else "no")
    cells = [
        f"{CITED} {pick.method}",
        kind,
        epsilon,
        f"{pick.delta_common:.2g}",
        f"{pick.accuracy:.3f}",
        useful,
        format_stat(pick.auc),
        _lb(pick.eps_lower_bound),
    ]
    return [*cells, _band(pick.inside_no_leak)] if band else cells


def verdict_section(verdict: Verdict, rows: Sequence[ResultRow]) -> dict[str, Any]:
    """The verdict section: the sentence, its caveats, and per method one line."""
    band = verdict.no_leak is not None
    line = verdict.useful_accuracy
    useful_head = "useful" if math.isnan(line) else f"useful (≥ {line:.2f})"
    header = [
        "method",
        "guarantee",
        "ε′",
        "δ′",
        "accuracy",
        useful_head,
        "strongest attack's AUC [95% CI]",
        "ε_lb",
    ]
    if band:
        header.append("no-leak band")
    body: list[list[str]] = []
    classes: list[str] = []
    baseline = next((p for p in points(rows) if p.method == BASELINE), None)
    if baseline is not None:
        cells = [
            "none (unprotected)",
            "no guarantee",
            "—",
            "—",
            f"{baseline.test_accuracy.mean:.3f}",
            "—",
            format_stat(baseline.mia_auc),
            _lb(baseline.eps_lower_bound),
        ]
        body.append([*cells, "—"] if band else cells)
        classes.append("reference")
    for found in verdict.methods:
        if found.best is not None:
            kind = guarantee_short(found.best.guarantee) + " DP, meaningful"
            body.append(_pick_cells(found.best, kind=kind, band=band))
            classes.append("cited")
        elif found.best_not_dp is not None:
            kind = f"{found.best_not_dp.guarantee}: not DP"
            body.append(_pick_cells(found.best_not_dp, kind=kind, band=band))
            classes.append("cited")
        else:
            why = (
                "every cell infeasible"
                if found.infeasible
                else "no row with a meaningful guarantee"
                if found.dp
                else f"{'/'.join(found.kinds)}: not DP, no row at ε′ ≤ {WEAK_EPSILON:g}"
            )
            body.append([found.method, why] + ["—"] * (len(header) - 2))
            classes.append("")
    reference = no_leak(rows)
    if reference is not None:
        cells = [
            "no-leak reference",
            "never saw the members",
            "—",
            "—",
            f"{reference.test_accuracy.mean:.3f}",
            "—",
            format_stat(reference.mia_auc),
            _lb(reference.eps_lower_bound),
            "the band",
        ]
        body.append(cells)
        classes.append("reference")
    members = f"1/{verdict.members}" if verdict.members else "0.001"
    notes = [
        f"A meaningful guarantee: differential privacy (pure or approximate) compared under "
        f"replace-one, with ε′ ≤ {WEAK_EPSILON:g} and δ′ ≤ {members} (the rule of the table's "
        "* mark). Random DP is not DP. Per method the line shows its best accuracy at such a "
        "guarantee; a method without DP rows shows its best accuracy at the same ε′, δ′ line, "
        "marked not DP.",
    ]
    if not math.isnan(line):
        notes.append(
            f"Useful accuracy keeps at least {USEFUL_FRACTION:g} of the unprotected head's gain "
            f"over chance: {verdict.chance:.2f} + {USEFUL_FRACTION:g} × "
            f"({verdict.baseline_accuracy:.2f} − {verdict.chance:.2f}) = {line:.2f}."
        )
    notes.append(f"The lines marked {CITED} are marked in the table too.")
    if band:
        notes.append(
            "The no-leak band is the 95% interval of the strongest attack's AUC on a release "
            "trained on public rows only: an AUC inside it is indistinguishable from a release "
            "that never saw the members."
        )
    return {
        "sentence": verdict.sentence,
        "caveats": list(verdict.caveats),
        "header": header,
        "rows": body,
        "numeric": {3, 4, 6, 7},
        "classes": classes,
        "notes": notes,
    }


# -- table and guarantees -----------------------------------------------------------------


def results_section(rows: Sequence[ResultRow], facts: RunFacts) -> dict[str, Any]:
    header, body, footnotes = tradeoff_cells(
        rows, members=facts.members, nonmembers=facts.nonmembers, num_classes=facts.num_classes
    )
    text = {"method", "kind", "AUC [95% CI]"}
    return {
        "header": header,
        "rows": body,
        "numeric": {i for i, h in enumerate(header) if h not in text},
        "classes": ["cited" if cells[0].startswith(CITED) else "" for cells in body],
        "notes": footnotes,
    }


def guarantees_section(rows: Sequence[ResultRow]) -> dict[str, Any]:
    body = []
    for method in methods(rows):
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
    header = (
        "method",
        "kind",
        "the guarantee in plain words",
        "replace-one (ε′, δ′) over the grid",
    )
    return {"header": header, "rows": body}


# -- per-member risk ----------------------------------------------------------------------


def risk_epsilon(
    method: str,
    epsilons: Sequence[float],
    found: Mapping[tuple[str, float], Point],
    *,
    members: int | None,
) -> tuple[float, bool]:
    """The ε the risk section shows for ``method``: the largest of ``epsilons`` whose
    guarantee (under replace-one) is not weak, else the smallest.

    Returns:
        ``(epsilon, fallback)``: ``fallback`` is True where every ε is weak.
    """
    strong = [
        e for e in epsilons if (method, e) in found and not found[(method, e)].weak_for(members)
    ]
    if strong:
        return max(strong), False
    return min(epsilons), True


def risk_section(
    risk: Mapping[tuple[str, float], CellScores],
    plots: Sequence[Path],
    facts: RunFacts,
    rows: Sequence[ResultRow],
) -> dict[str, Any]:
    found = {(p.method, p.epsilon): p for p in points(rows)}
    view: dict[str, Any] = {
        "warning": "Computed from the private data: each row below names a member (its row "
        f"in the dataset, split.json). The files are in {RISK_FOLDER}/, one per release, for "
        "the data owner only.",
        "intro": [
            "Score: the attack's per-example statistic (LiRA: the log likelihood ratio, or "
            "offline LiRA's z-score; loss: log p_y), the mean over the release's noise draws; "
            "rank 1 is the most exposed member. Per method the release shown is the one at the "
            f"largest ε whose guarantee is not weak (ε′ ≤ {WEAK_EPSILON:g}, δ′ small), the "
            "most useful release that still claims protection. The Python API returns the "
            "same for any release: alm_opacus.report.risk.risk_table(run, method=..., "
            "epsilon=...)."
        ],
        "blocks": [],
        "overlap": "",
        "figures": [],
    }
    if not risk:
        view["intro"] = ["No per-member risk: the run ran neither a LiRA nor the loss attack."]
        return view
    for method in sorted({m for m, _ in risk}, key=lambda m: (m != BASELINE, m)):
        epsilons = sorted(e for m, e in risk if m == method)
        note = ""
        if method == BASELINE:
            epsilon, where = epsilons[0], "unprotected"
        else:
            epsilon, fallback = risk_epsilon(method, epsilons, found, members=facts.members)
            point = found.get((method, epsilon))
            shown = ""
            if point is not None and not math.isclose(point.epsilon_common, epsilon):
                shown = f", ε′ = {point.epsilon_common:.3g}"
            where = f"ε = {format_epsilon(epsilon)}{shown}"
            if fallback:
                note = (
                    f"Every ε of {method} is weak (ε′ > {WEAK_EPSILON:g} or δ′ too large): "
                    "the smallest is shown."
                )
        cell = risk[(method, epsilon)]
        kind = "lira" if "lira" in cell.scores else next(iter(cell.scores))
        ranks = cell.ranks(kind)
        base = risk.get((BASELINE, math.inf))
        clean = (
            dict(zip(base.rows.tolist(), base.scores.get(kind, []), strict=False)) if base else {}
        )
        members = [i for i in range(len(ranks)) if cell.is_member[i]]
        top = sorted(members, key=lambda i: ranks[i])[:10]
        body = [
            [
                str(int(cell.rows[i])),
                str(int(cell.labels[i])),
                f"{cell.scores[kind][i]:.3f}",
                f"{ranks[i]:.0f}",
                _fmt(clean.get(int(cell.rows[i]))),
            ]
            for i in top
        ]
        view["blocks"].append(
            {
                "heading": f"{method} ({where}): the 10 most exposed members "
                f"({cell.attacks[kind]})",
                "note": note,
                "header": ("row", "label", "score", "rank", "score, unprotected"),
                "rows": body,
                "numeric": {0, 1, 2, 3, 4},
            }
        )
    if facts.members:
        k = top_size(facts.members)
        view["overlap"] = (
            f"The overlap figure compares the {k} most exposed members (at most 100, and at "
            f"most a quarter of the {facts.members} members; chance: {k}/{facts.members})."
        )
    for path in plots:
        prefix = path.stem.split("_")[0] if not path.stem.startswith("top") else path.stem
        caption = RISK_CAPTIONS.get(prefix, RISK_CAPTIONS.get(path.stem.rsplit("_", 1)[0], ""))
        view["figures"].append(figure_entry(path, f"{path.stem}: {caption}"))
    return view


def _fmt(value: object) -> str:
    return "—" if value is None else f"{float(value):.3f}"  # type: ignore[arg-type]
