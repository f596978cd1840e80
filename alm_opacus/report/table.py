"""The trade-off table printed at the end of a run.

The default form is long: one line per (method, epsilon), at most :data:`MAX_WIDTH`
columns, every header word defined under it. ``wide=True`` gives the side-by-side form (one
line per epsilon, one column block per method), which grows with the number of methods.

Conventions (the footnotes say them to the reader):

* a guarantee is compared under replace-one: ε′, δ′ (add/remove rows converted, †);
* ``*`` marks a weak guarantee, decided on the ε′, δ′ shown (``series.is_weak``);
* ``!`` marks a test accuracy below chance (1 / number of classes);
* a TPR at an FPR the evaluation set's non-members cannot resolve prints as ``—``, with the
  count it would need; the default form leaves such a column out;
* ``ε_lb`` is the empirical ε lower bound (the audit of the claim), beside the claim's ε′, δ′;
* ``►`` marks the rows the run's verdict (``report.verdict.decide``) cites.
"""

from __future__ import annotations

import math
import textwrap
from collections import defaultdict
from collections.abc import Sequence

from alm_opacus.report.results import BASELINE, ResultRow
from alm_opacus.report.series import (
    COMMON_RELATION,
    WEAK_DELTA_UNKNOWN_N,
    WEAK_EPSILON,
    Point,
    Stat,
    format_epsilon,
    format_stat,
    infeasible_rows,
    methods,
    points,
)
from alm_opacus.report.verdict import Verdict, decide
from alm_opacus.report.words import GUARANTEE_SHORT, guarantee_words

__all__ = [
    "CITED",
    "HEADER",
    "MAX_WIDTH",
    "TPR_LEVELS",
    "format_tradeoff_table",
    "tradeoff_cells",
]

#: The widest line of the default table, footnotes included.
MAX_WIDTH = 100
#: (field, header, FPR) of the TPR columns.
TPR_LEVELS = (("tpr_at_fpr_0_01", "TPR@1%", 0.01), ("tpr_at_fpr_0_001", "TPR@0.1%", 0.001))
DASH = "—"
#: The mark before the method of a row the verdict cites.
CITED = "►"


def _num(value: float) -> str:
    return "-" if math.isnan(value) else f"{value:.3f}"


def _lower_bound(value: float) -> str:
    return "-" if math.isnan(value) else f"{value:.2f}"


def _with_bar(stat: Stat) -> str:
    return format_stat(stat, sep=",")


def _resolved(rows: Sequence[ResultRow], field: str, fpr: float, nonmembers: int | None) -> bool:
    """Whether the evaluation set resolves ``fpr``: ``nonmembers * fpr >= 1`` (Clopper-Pearson
    needs one false positive to be possible); with no count given, whether any row has it."""
    if nonmembers is not None:
        return nonmembers * fpr >= 1 - 1e-9
    return any(not math.isnan(getattr(r, field)) for r in rows)


class _Context:
    """What the formatting of one table needs besides its rows."""

    def __init__(
        self,
        rows: Sequence[ResultRow],
        *,
        members: int | None,
        nonmembers: int | None,
        num_classes: int | None,
    ) -> None:
        self.rows = rows
        self.members = members
        self.nonmembers = nonmembers
        self.chance = 1.0 / num_classes if num_classes else math.nan
        self.resolved = {f: _resolved(rows, f, fpr, nonmembers) for f, _, fpr in TPR_LEVELS}
        self.verdict: Verdict = decide(rows, members=members, num_classes=num_classes)
        self.below_chance = False
        self.weak = False
        self.converted: set[str] = set()

    def weak_mark(self, point: Point) -> str:
        if point.method == BASELINE or not point.weak_for(self.members):
            return ""
        self.weak = True
        return "*"

    def accuracy(self, point: Point) -> str:
        text = _num(point.test_accuracy.mean)
        if point.test_accuracy.mean < self.chance:
            self.below_chance = True
            return text + "!"
        return text

    def tpr(self, point: Point, field: str) -> str:
        if not self.resolved[field]:
            return DASH
        return _num(getattr(point, field).mean)

    def cited(self, point: Point) -> bool:
        return (point.method, point.epsilon) in self.verdict.cited

    @property
    def header(self) -> tuple[str, ...]:
        """:data:`HEADER` without the TPR columns the evaluation set cannot resolve."""
        dropped = {h for f, h, _ in TPR_LEVELS if not self.resolved[f]}
        return tuple(h for h in HEADER if h not in dropped)


def _kind(point: Point) -> str:
    return GUARANTEE_SHORT.get(point.common_guarantee, point.common_guarantee)


def _replace_one(point: Point, ctx: _Context) -> tuple[str, str]:
    """ε′ and δ′ as shown (with † for a converted pair and * for a weak one)."""
    if point.method == BASELINE or math.isinf(point.epsilon_common):
        return "-", "-"
    mark = ""
    if point.converted:
        ctx.converted.add(point.method)
        mark = "†"
    delta = "≥1" if point.vacuous else f"{point.delta_common:.2g}"
    return f"{point.epsilon_common:.3g}{mark}", delta + ctx.weak_mark(point)


#: Every column of the default form; a TPR column the evaluation set cannot resolve is left
#: out (``tradeoff_cells`` returns the header shown).
HEADER = (
    "method",
    "ε",
    "kind",
    "ε′",
    "δ′",
    "ε_lb",
    "acc",
    "uloss",
    "AUC [95% CI]",
    *(h for _, h, _ in TPR_LEVELS),
)


def _long_cells(rows: Sequence[ResultRow], ctx: _Context) -> list[list[str]]:
    """One list of ``ctx.header`` cells per (method, epsilon), baseline first; the method
    of a row the verdict cites starts with :data:`CITED` and a space."""
    order = {m: i for i, m in enumerate(methods(rows))}
    shown = ctx.header
    body: list[tuple[tuple[int, float], list[str]]] = []
    for point in points(rows):
        epsilon, delta = _replace_one(point, ctx)
        cells = {
            "method": f"{CITED} {point.method}" if ctx.cited(point) else point.method,
            "ε": format_epsilon(point.epsilon),
            "kind": _kind(point),
            "ε′": epsilon,
            "δ′": delta,
            "ε_lb": _lower_bound(point.eps_lower_bound),
            "acc": ctx.accuracy(point),
            "uloss": _num(point.utility_loss.mean),
            "AUC [95% CI]": _with_bar(point.mia_auc),
            **{h: ctx.tpr(point, f) for f, h, _ in TPR_LEVELS},
        }
        body.append(((order[point.method], point.epsilon), [cells[h] for h in shown]))
    for row in infeasible_rows(rows):
        if any(key == (order[row.method], row.epsilon) for key, _ in body):
            continue
        blocked = [row.method, format_epsilon(row.epsilon), "infeasible"]
        body.append(((order[row.method], row.epsilon), blocked + [""] * (len(shown) - 3)))
    body.sort(key=lambda item: item[0])
    return [cells for _, cells in body]


#: The columns printed flush right.
_RIGHT = {"ε", "ε′", "δ′", "ε_lb", "acc", "uloss", *(h for _, h, _ in TPR_LEVELS)}


def _long(rows: Sequence[ResultRow], ctx: _Context) -> list[str]:
    header = ctx.header
    # the method column is indented by the mark's width, so that marked names line up
    body = [
        [line[0] if line[0].startswith(CITED) else f"  {line[0]}", *line[1:]]
        for line in _long_cells(rows, ctx)
    ]
    lines = [[f"  {header[0]}", *header[1:]], *body]
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]

    # two spaces between columns, one where two would pass MAX_WIDTH (long method names
    # and both TPR columns)
    gap = "  " if sum(widths) + 2 * (len(widths) - 1) <= MAX_WIDTH else " "

    def text(cells: Sequence[str]) -> str:
        parts = [
            c.rjust(w) if header[i] in _RIGHT else c.ljust(w)
            for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        ]
        return gap.join(parts).rstrip()

    out = [text(lines[0]), "-" * len(text(lines[0]))]
    return out + [text(cells) for cells in lines[1:]]


def _wide_cell(found: Sequence[Point], ctx: _Context) -> str:
    main = max(found, key=lambda p: len(p.seeds))
    kinds = []
    for p in found:
        kind = p.guarantee
        if p.converted:
            ctx.converted.add(p.method)
            kind += f"† ε'={p.epsilon_common:.3g} " + (
                "δ'≥1: none" if p.vacuous else f"δ'={p.delta_common:.2g}"
            )
        elif p.method != BASELINE:
            kind += f" ε'={p.epsilon_common:.3g}"
        kinds.append(kind + ctx.weak_mark(p))
    mark = f"{CITED} " if any(ctx.cited(p) for p in found) else ""
    return (
        f"{mark}{ctx.accuracy(main)}  {_num(main.utility_loss.mean)}  {_with_bar(main.mia_auc)}  "
        + "/".join(dict.fromkeys(kinds))
    )


_WIDE_FIELDS = "acc  uloss  AUC [95% CI]  guarantee"


def _wide(rows: Sequence[ResultRow], ctx: _Context) -> list[str]:
    found = points(rows)
    at: dict[tuple[str, float], list[Point]] = defaultdict(list)
    for point in found:
        at[(point.method, point.epsilon)].append(point)
    names = methods(rows)
    epsilons = sorted({r.epsilon for r in rows})
    blocked = {(r.method, r.epsilon) for r in infeasible_rows(rows)}
    body = {
        epsilon: [
            _wide_cell(at[(m, epsilon)], ctx)
            if (m, epsilon) in at
            else "infeasible"
            if (m, epsilon) in blocked
            else ""
            for m in names
        ]
        for epsilon in epsilons
    }
    widths = [
        max(len(name), len(_WIDE_FIELDS), *(len(body[e][i]) for e in epsilons))
        for i, name in enumerate(names)
    ]

    def line(label: str, cells: Sequence[str], centre: bool = False) -> str:
        parts = [c.center(w) if centre else c.ljust(w) for c, w in zip(cells, widths, strict=True)]
        return f"{label:>9} | " + " | ".join(parts).rstrip()

    lines = [line("epsilon", names, centre=True), line("", [_WIDE_FIELDS] * len(names))]
    lines.append("-" * len(lines[1]))
    return lines + [line(format_epsilon(e), body[e]) for e in epsilons]


def _footnotes(rows: Sequence[ResultRow], ctx: _Context, *, wide: bool) -> list[str]:
    seeds = sorted({r.seed for r in rows})
    kinds = sorted(
        {r.guarantee for r in rows if r.guarantee} | {"none"},
        key=lambda k: list(GUARANTEE_SHORT).index(k) if k in GUARANTEE_SHORT else 99,
    )
    n_text = f"{ctx.members} members" if ctx.members else "n unknown"
    line = f"1/n ({n_text})" if ctx.members else f"{WEAK_DELTA_UNKNOWN_N:g}"
    notes = [
        "method: the protection; none is the unprotected head."
        if not wide
        else "One line per epsilon, one column block per method; none is the unprotected head.",
        f"{CITED}: the row the verdict (under the table) reports for its method: its best "
        "accuracy at a meaningful guarantee (DP, ε′ ≤ 10, δ′ ≤ 1/n), or for a method that is "
        "not DP its best at that ε′, δ′ line." + ("" if ctx.verdict.cited else " (No row here.)"),
        "ε: the epsilon the cell asked for, under its method's own neighbouring relation.",
        "kind: the guarantee's kind, "
        + "; ".join(
            f"{GUARANTEE_SHORT.get(k, k) if not wide else k} = {guarantee_words(k)}" for k in kinds
        )
        + ".",
        f"ε′, δ′: the guarantee under {COMMON_RELATION}, the relation every row is compared "
        "on (the post-training mechanisms' own)."
        + (
            f" † {', '.join(sorted(ctx.converted))}: an add/remove guarantee, converted by "
            "group privacy to replace-one (2ε, (1 + e^ε)δ); δ′ ≥ 1 proves nothing (kind none)."
            if ctx.converted
            else ""
        ),
        f"*: a weak guarantee, not protection, decided on the ε′, δ′ shown: ε′ > "
        f"{WEAK_EPSILON:g} or δ′ > {line}." + ("" if ctx.weak else " (No row here.)"),
        *([] if wide else [_lower_bound_note(rows)]),
        "acc: test accuracy on the non-members; uloss: utility loss 1 − acc / acc(none) (ALM "
        f"paper, Def. 6.1); means over seeds {seeds} and noise draws."
        + (
            f" !: below chance (1/C = {ctx.chance:.3g}): worse than a uniform guess."
            if ctx.below_chance
            else ""
        ),
        "AUC [95% CI]: area under the ROC curve of the strongest membership-inference attack "
        "(the largest AUC over every attack and attacker; 0.5 is chance) with its 95% "
        "interval over the evaluation set (DeLong; several seeds: the union of the per-seed "
        "intervals); ± is one std over seeds and draws where no interval was recorded.",
    ]
    if not wide:
        nonmembers = f"{ctx.nonmembers}" if ctx.nonmembers is not None else "too few"
        shown = [(h, fpr) for f, h, fpr in TPR_LEVELS if ctx.resolved[f]]
        tpr = ""
        if shown:
            tpr = (
                f"{', '.join(h for h, _ in shown)}: the strongest attack's true positive rate "
                f"at {' and '.join(f'{100 * fpr:g}%' for _, fpr in shown)} false positive rate."
            )
        for field, header, fpr in TPR_LEVELS:
            if not ctx.resolved[field]:
                tpr += (
                    f" {header} is not shown: {nonmembers} non-members cannot resolve an FPR of "
                    f"{fpr:g}; it needs at least {math.ceil(1 / fpr - 1e-9)}."
                )
        notes.append(tpr.strip())
    blocked: dict[tuple[str, float, str], list[int]] = defaultdict(list)
    for row in infeasible_rows(rows):
        blocked[(row.method, row.epsilon, row.reason)].append(row.seed)
    for (method, epsilon, reason), where in blocked.items():
        notes.append(
            f"infeasible: {method} at epsilon {format_epsilon(epsilon)} (seeds "
            f"{', '.join(map(str, where))})" + (f": {reason}" if reason else "")
        )
    return notes


def _lower_bound_note(rows: Sequence[ResultRow]) -> str:
    ceilings = sorted(
        {
            round(r.eps_lower_bound_ceiling, 2)
            for r in rows
            if not math.isnan(r.eps_lower_bound_ceiling)
        }
    )
    note = (
        "ε_lb: the empirical ε lower bound, the largest over attacks and seeds (a 95% "
        "split-half audit, docs/threat_model.md), on the ε′ scale: ε_lb above ε′ refutes the "
        "claim; below it proves nothing."
    )
    if ceilings:
        cap = (
            f"{ceilings[0]:.2f}"
            if len(ceilings) == 1
            else f"{ceilings[0]:.2f} to {ceilings[-1]:.2f}"
        )
        note += (
            f" This evaluation set caps it at {cap} (more noise draws, more trials), so a "
            "larger ε′ cannot be refuted here."
        )
    return note


def format_tradeoff_table(
    rows: Sequence[ResultRow],
    *,
    wide: bool = False,
    members: int | None = None,
    nonmembers: int | None = None,
    num_classes: int | None = None,
) -> str:
    """The trade-off table of a run, with footnotes that define every word of its header.

    Args:
        rows: the run's rows.
        wide: the side-by-side form (one line per epsilon, a column block per method);
            default: one line per (method, epsilon), at most :data:`MAX_WIDTH` columns.
        members: members in the private split (for the weak-delta line, 1/n).
        nonmembers: non-members in the evaluation set (which FPRs a TPR can be read at).
        num_classes: the number of classes (chance accuracy is 1 / num_classes).

    Returns:
        The table as text, without a trailing newline.
    """
    ctx = _Context(rows, members=members, nonmembers=nonmembers, num_classes=num_classes)
    lines = _wide(rows, ctx) if wide else _long(rows, ctx)
    notes = [
        textwrap.fill(n, width=MAX_WIDTH, subsequent_indent="  ")
        for n in _footnotes(rows, ctx, wide=wide)
    ]
    return "\n".join([*lines, "", *notes])


def tradeoff_cells(
    rows: Sequence[ResultRow],
    *,
    members: int | None = None,
    nonmembers: int | None = None,
    num_classes: int | None = None,
) -> tuple[tuple[str, ...], list[list[str]], list[str]]:
    """The default table as data, for other renderings (``report.html``).

    Returns:
        ``(header, body, footnotes)``: the columns shown (:data:`HEADER` without a TPR
        column the evaluation set cannot resolve), one list of cells per (method, epsilon)
        (the method of a row the verdict cites starts with :data:`CITED`), and the
        footnotes (unwrapped) that define the header's words.
    """
    ctx = _Context(rows, members=members, nonmembers=nonmembers, num_classes=num_classes)
    body = _long_cells(rows, ctx)
    return ctx.header, body, _footnotes(rows, ctx, wide=False)
