"""The side-by-side trade-off table printed at the end of a run."""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence

import numpy as np

from alm_opacus.report.results import ResultRow


def best_attack_rows(rows: Sequence[ResultRow]) -> dict[tuple[str, float], list[ResultRow]]:
    """Per (method, epsilon), one row per seed: the attack with the highest AUC (or the
    attack-free row when no attack ran)."""
    per_cell: dict[tuple[str, float, int], ResultRow] = {}
    for row in rows:
        key = (row.method, row.epsilon, row.seed)
        held = per_cell.get(key)
        auc = -1.0 if math.isnan(row.mia_auc) else row.mia_auc
        if held is None or auc > (-1.0 if math.isnan(held.mia_auc) else held.mia_auc):
            per_cell[key] = row
    out: dict[tuple[str, float], list[ResultRow]] = defaultdict(list)
    for (method, epsilon, _), row in per_cell.items():
        out[(method, epsilon)].append(row)
    return out


def _mean(values: Sequence[float]) -> float:
    finite = [v for v in values if not math.isnan(v)]
    return float(np.mean(finite)) if finite else math.nan


def _num(value: float, width: int = 6) -> str:
    return f"{'-':>{width}}" if math.isnan(value) else f"{value:>{width}.3f}"


def format_tradeoff_table(rows: Sequence[ResultRow]) -> str:
    """One line per epsilon; per method: test accuracy, utility loss, best-attack AUC,
    its TPR at 1% FPR, and the guarantee. Values are means over seeds."""
    best = best_attack_rows(rows)
    methods = list(dict.fromkeys(r.method for r in rows))
    epsilons = sorted({r.epsilon for r in rows})
    header = f"{'epsilon':>8} | " + " | ".join(f"{m:^40}" for m in methods)
    sub = f"{'':>8} | " + " | ".join(
        f"{'acc':>6} {'uloss':>6} {'AUC':>6} {'TPR@1%':>6} {'guarantee':>11}" for _ in methods
    )
    lines = [header, sub, "-" * len(sub)]
    for epsilon in epsilons:
        cells = []
        for method in methods:
            cell = best.get((method, epsilon))
            if not cell:
                cells.append(f"{'':>40}")
                continue
            cells.append(
                f"{_num(_mean([r.test_accuracy for r in cell]))} "
                f"{_num(_mean([r.utility_loss for r in cell]))} "
                f"{_num(_mean([r.mia_auc for r in cell]))} "
                f"{_num(_mean([r.tpr_at_fpr_0_01 for r in cell]))} "
                f"{cell[0].guarantee:>11}"
            )
        label = "inf" if math.isinf(epsilon) else f"{epsilon:g}"
        lines.append(f"{label:>8} | " + " | ".join(cells))
    return "\n".join(lines)
