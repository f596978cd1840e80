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

import base64
import datetime
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jinja2

from alm_opacus.io import atomic_write_text
from alm_opacus.report.results import ResultRow, read_results
from alm_opacus.report.risk import BASELINE, RISK_FOLDER, CellScores, top_size
from alm_opacus.report.series import (
    NO_LEAK,
    WEAK_EPSILON,
    Point,
    Stat,
    format_epsilon,
    methods,
    no_leak,
    points,
    replace_one,
)
from alm_opacus.report.table import CITED, TPR_LEVELS, tradeoff_cells
from alm_opacus.report.verdict import USEFUL_FRACTION, Pick, Verdict, decide
from alm_opacus.report.words import guarantee_short, guarantee_words

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
        """The facts of a run's settings (``config.json``); ``nonmembers`` resolved to the
        member count where the split leaves it unset, ``num_classes`` from the argument or
        else the settings' ``num_classes`` (recorded by the run)."""
        split = settings.get("split") or {}
        members = split.get("members")
        nonmembers = split.get("nonmembers") or members
        options = settings.get("attack_options") or {}
        classes = num_classes if num_classes is not None else settings.get("num_classes")
        return cls(
            dataset=str(settings.get("dataset", "")),
            members=int(members) if members else None,
            nonmembers=int(nonmembers) if nonmembers else None,
            num_classes=int(classes) if classes else None,
            attacks=tuple(settings.get("attacks") or ()),
            num_reference=options.get("num_reference", num_reference),
        )


def _environment() -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(Path(__file__).parent / "templates"),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
    )


def _png(path: Path) -> str:
    return "data:image/png;base64," + base64.b64encode(path.read_bytes()).decode("ascii")


def _figure(path: Path, caption: str) -> dict[str, str]:
    return {"stem": path.stem, "alt": path.stem, "src": _png(path), "caption": caption}


# -- verdict ------------------------------------------------------------------------------


def _auc(stat: Stat) -> str:
    if math.isnan(stat.mean):
        return "-"
    if stat.kind == "ci95":
        return f"{stat.mean:.3f} [{stat.low:.2f}, {stat.high:.2f}]"
    if stat.kind == "std":
        return f"{stat.mean:.3f} ±{stat.high - stat.mean:.3f}"
    return f"{stat.mean:.3f}"


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
        _auc(pick.auc),
        _lb(pick.eps_lower_bound),
    ]
    return [*cells, _band(pick.inside_no_leak)] if band else cells


def _verdict_view(verdict: Verdict, rows: Sequence[ResultRow]) -> dict[str, Any]:
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
            _auc(baseline.mia_auc),
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
            _auc(reference.mia_auc),
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


def _results_view(rows: Sequence[ResultRow], facts: RunFacts) -> dict[str, Any]:
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


def _guarantees(rows: Sequence[ResultRow]) -> dict[str, Any]:
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


def _risk(
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
        caption = _RISK_CAPTIONS.get(prefix, _RISK_CAPTIONS.get(path.stem.rsplit("_", 1)[0], ""))
        view["figures"].append(_figure(path, f"{path.stem}: {caption}"))
    return view


def _fmt(value: object) -> str:
    return "—" if value is None else f"{float(value):.3f}"  # type: ignore[arg-type]


# -- attack notes and settings --------------------------------------------------------------


def _attack_notes(rows: Sequence[ResultRow], facts: RunFacts) -> list[str]:
    attacks = sorted({r.attack for r in rows if r.attack})
    notes = [
        f"Attacks run: {', '.join(attacks) or 'none'}. Each number in the table is the "
        "strongest of them (the largest value over every attack and attacker), which errs on "
        "the attacker's side; a maximum over many attacks reads above 0.5 even where nothing "
        "leaks (the no-leak reference measures by how much, where the run has it).",
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
        levels = []
        for _, _, fpr in TPR_LEVELS:
            state = (
                "resolved"
                if facts.nonmembers * fpr >= 1
                else f"not (it needs {math.ceil(1 / fpr - 1e-9)} non-members)"
            )
            levels.append(f"TPR at {100 * fpr:g}% FPR is {state}")
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
            "The empirical ε lower bound (ε_lb in the table, an audit of the claim) can never "
            f"exceed {max(ceilings):.2f} on an evaluation set this size at 95% confidence: a "
            "claimed ε′ above that cannot be refuted here, whatever the attack."
        )
    return notes


def _value(value: object) -> str:
    """A setting's value in words: ``not set`` for None, ``yes``/``no`` for booleans."""
    if value is None:
        return "not set"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return format_epsilon(value) if math.isinf(value) else f"{value:g}"
    if isinstance(value, dict):
        return ", ".join(f"{k}={_value(v)}" for k, v in value.items()) or "defaults"
    if isinstance(value, list | tuple):
        return ", ".join(_value(v) for v in value)
    return str(value)


def _options(method: str, options: object) -> str:
    """One method's options: ``not set`` reads ``tuned`` where the method tunes them."""
    if not isinstance(options, dict) or not options:
        return f"{method}: no options"
    unset = "tuned (below)" if options.get("tune") is True else "default"
    shown = ", ".join(f"{k}={unset if v is None else _value(v)}" for k, v in options.items())
    return f"{method}: {shown}"


def _delta_lines(
    settings: Mapping[str, Any], rows: Sequence[ResultRow], members: int | None
) -> list[str]:
    """δ as resolved: the value the rows used, and where it came from."""
    used: dict[str, set[float]] = {}
    for r in rows:
        if r.method not in (BASELINE, NO_LEAK) and r.status == "ok":
            used.setdefault(r.method, set()).add(r.delta)
    positive = sorted({d for ds in used.values() for d in ds if d > 0})
    asked = settings.get("delta")
    if asked is None:
        n = f"n = {members} members" if members else "n members"
        source = f"the default, min(1e-5, 1/(10 n)) for {n}"
    else:
        source = "as set (--delta)"
    lines = [f"{', '.join(f'{d:g}' for d in positive) or '0'} ({source})"]
    none_needed = sorted(m for m, ds in used.items() if ds == {0.0})
    if none_needed:
        lines.append(f"0 for {', '.join(none_needed)}: its guarantee needs no δ")
    return lines


def _settings(
    settings: Mapping[str, Any], facts: RunFacts, rows: Sequence[ResultRow], *, shareable: bool
) -> list[tuple[str, list[str]]]:
    out: list[tuple[str, list[str]]] = []

    def add(name: str, *lines: str) -> None:
        out.append((name, list(lines)))

    if "dataset" in settings:
        add("dataset", str(settings["dataset"]))
    if facts.num_classes:
        add("classes", f"{facts.num_classes} (chance accuracy {1 / facts.num_classes:.3g})")
    if "methods" in settings:
        # a resume with fewer methods keeps the earlier rows of the others (config.json's
        # methods_kept): listed apart, not as methods of this run
        methods, kept = settings["methods"], settings.get("methods_kept") or []
        if isinstance(methods, list):
            methods = [m for m in methods if m not in kept]
        add("methods", _value(methods))
        if kept:
            add("kept from an earlier run", _value(kept))
    if "epsilons" in settings:
        add("ε grid", _value(settings["epsilons"]) + " (each under its method's own relation)")
    if "delta" in settings or rows:
        add("δ", *_delta_lines(settings, rows, facts.members))
    for key, name in (("seeds", "seeds"), ("noise_draws", "noise draws per release")):
        if key in settings:
            add(name, _value(settings[key]))
    split = settings.get("split")
    if isinstance(split, dict):
        members = split.get("members")
        nonmembers = split.get("nonmembers")
        shown = f"{members} (= members, the default)" if nonmembers is None else str(nonmembers)
        add(
            "split",
            f"members {_value(members)}, non-members {shown}, attacker "
            f"{_value(split.get('attacker'))}, public {_value(split.get('public'))}",
        )
    if not shareable and "split_seed" in settings:
        add("split seed", _value(settings["split_seed"]))
    if "attacks" in settings:
        add("attacks", _value(settings["attacks"]))
    if "attack_options" in settings:
        add("attack options", _value(settings["attack_options"]) or "defaults")
    for key in ("head", "ssl"):
        if isinstance(settings.get(key), dict):
            add(key, _value(settings[key]))
    options = settings.get("method_options")
    if isinstance(options, dict):
        add("method options", *(_options(m, o) for m, o in options.items()))
    chosen = settings.get("chosen_configs") or []
    if chosen:
        add(
            "chosen by tuning",
            *(
                f"{c.get('method')} ε = {_value(c.get('epsilon'))} (seed {c.get('seed')}): "
                f"{_value(c.get('config'))}"
                for c in chosen
            ),
        )
    if "reproducible_noise" in settings:
        add(
            "noise",
            "seeded (reproducible: private only while the seed is secret)"
            if settings["reproducible_noise"]
            else "secure (OS randomness, cannot be replayed)",
        )
    for key in ("device", "environment"):
        if key in settings:
            add(key, _value(settings[key]))
    return out


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
    figures = [_figure(plots[s], c) for s, c in PLOT_ORDER if plots[s].exists()]
    tradeoff = next((f for f in figures if f["stem"] == PLOT_ORDER[0][0]), None)
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    names = methods(rows)
    title = f"alm_opacus run: {facts.dataset or 'dataset'} ({', '.join(names)})"
    risk_view = None if shareable else _risk(risk, risk_plots, facts, rows)
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
            verdict=_verdict_view(verdict, rows),
            tradeoff=tradeoff,
            results=_results_view(rows, facts),
            guarantees=_guarantees(rows),
            figures=[f for f in figures if f is not tradeoff],
            risk=risk_view,
            attacks=_attack_notes(rows, facts),
            settings=_settings(settings, facts, rows, shareable=shareable),
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
