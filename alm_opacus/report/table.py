"""The side-by-side trade-off table printed at the end of a run: one line per epsilon."""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence

from alm_opacus.report.results import ResultRow
from alm_opacus.report.series import (
    COMMON_RELATION,
    WEAK_EPSILON,
    Point,
    Stat,
    format_epsilon,
    infeasible_rows,
    methods,
    points,
)

#: The sub-header of one method's column block.
_FIELDS = "acc  uloss  AUC [95% CI]  guarantee"


def _num(value: float) -> str:
    return "-" if math.isnan(value) else f"{value:.3f}"


def _with_bar(stat: Stat) -> str:
    if stat.kind == "ci95":
        return f"{_num(stat.mean)} [{stat.low:.2f},{stat.high:.2f}]"
    if stat.kind == "std":
        return f"{_num(stat.mean)} ±{stat.high - stat.mean:.3f}"
    return _num(stat.mean)


def _guarantee(point: Point) -> str:
    if not point.converted:
        return point.guarantee
    text = f"{point.guarantee}† ε'={point.epsilon_common:.3g} "
    return text + ("δ'≥1: none" if point.vacuous else f"δ'={point.delta_common:.2g}")


def _cell(found: Sequence[Point]) -> str:
    main = max(found, key=lambda p: len(p.seeds))
    kinds = "/".join(dict.fromkeys(_guarantee(p) for p in found))
    return (
        f"{_num(main.test_accuracy.mean)}  {_num(main.utility_loss.mean)}  "
        f"{_with_bar(main.mia_auc)}  {kinds}"
    )


def _footnotes(rows: Sequence[ResultRow], found: Sequence[Point]) -> list[str]:
    seeds = sorted({r.seed for r in rows})
    notes = [
        f"Means over seeds {seeds} of each seed's strongest attack (largest AUC over all "
        "attacks). AUC [low,high]: 95% interval over the evaluation set (with several seeds, "
        "the union of the per-seed intervals); ±: one std over seeds and noise draws, where "
        "no interval was recorded.",
        f"* epsilon > {WEAK_EPSILON:g}: a weak guarantee, not protection.",
    ]
    converted = sorted({p.method for p in found if p.converted})
    if converted:
        notes.append(
            f"† {', '.join(converted)}: an add/remove guarantee, shown under {COMMON_RELATION} "
            "(the relation of the post-training rows) as ε', δ': add/remove (ε, δ) gives "
            "replace-one (2ε, (1 + e^ε)δ). δ' ≥ 1 proves nothing."
        )
    blocked: dict[tuple[str, float, str], list[int]] = defaultdict(list)
    for row in infeasible_rows(rows):
        blocked[(row.method, row.epsilon, row.reason)].append(row.seed)
    for (method, epsilon, reason), where in blocked.items():
        notes.append(
            f"infeasible: {method} at epsilon {format_epsilon(epsilon)} (seeds "
            f"{', '.join(map(str, where))})" + (f": {reason}" if reason else "")
        )
    return notes


def format_tradeoff_table(rows: Sequence[ResultRow]) -> str:
    """One line per epsilon; per method: test accuracy, utility loss, the strongest attack's
    AUC with its interval, and the guarantee (add/remove ones converted to replace-one).
    Infeasible cells print as ``infeasible``; footnotes under the table say how to read it.

    Returns:
        The table as text, without a trailing newline.
    """
    found = points(rows)
    at: dict[tuple[str, float], list[Point]] = defaultdict(list)
    for point in found:
        at[(point.method, point.epsilon)].append(point)
    names = methods(rows)
    epsilons = sorted({r.epsilon for r in rows})
    blocked = {(r.method, r.epsilon) for r in infeasible_rows(rows)}
    body: dict[float, list[str]] = {}
    for epsilon in epsilons:
        body[epsilon] = [
            _cell(at[(m, epsilon)])
            if (m, epsilon) in at
            else "infeasible"
            if (m, epsilon) in blocked
            else ""
            for m in names
        ]
    widths = [
        max(len(name), len(_FIELDS), *(len(body[e][i]) for e in epsilons))
        for i, name in enumerate(names)
    ]

    def line(label: str, cells: Sequence[str], centre: bool = False) -> str:
        parts = [c.center(w) if centre else c.ljust(w) for c, w in zip(cells, widths, strict=True)]
        return f"{label:>9} | " + " | ".join(parts).rstrip()

    lines = [line("epsilon", names, centre=True), line("", [_FIELDS] * len(names))]
    lines.append("-" * len(lines[1]))
    for epsilon in epsilons:
        label = format_epsilon(epsilon) + ("*" if WEAK_EPSILON < epsilon < math.inf else "")
        lines.append(line(label, body[epsilon]))
    return "\n".join([*lines, "", *_footnotes(rows, found)])
