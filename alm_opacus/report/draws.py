"""One record per release (noise draw): the points of TensorBoard's HParams view.

``results.csv`` holds one row per (method, epsilon, seed, attack), aggregated over the noise
draws of the cell. The HParams view shows every release as its own session (method, epsilon,
seed and draw are its hyperparameters), so that its scatter plot is the trade-off with the
spread over draws visible. :class:`DrawRecord` is what one release measured; ``draws.csv``
in the run folder keeps them (aggregate metrics, like ``results.csv``).
"""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING

from alm_opacus.io import atomic_write_text
from alm_opacus.report.results import _fmt, _fmt_exact

if TYPE_CHECKING:
    from alm_opacus.attacks.results import AttackResult

__all__ = ["DRAWS_FILE", "DrawRecord", "draw_records", "read_draws", "write_draws"]

DRAWS_FILE = "draws.csv"


@dataclass(frozen=True)
class DrawRecord:
    """One release: its cell, its draw, its test accuracy and its strongest attack.

    ``mia_auc``, ``mia_accuracy`` and the TPRs are each the largest over the release's
    attacks (every attacker); a TPR is NaN where the evaluation set cannot resolve its FPR.
    ``attack`` is the attack with the largest AUC.
    """

    method: str
    epsilon: float
    seed: int
    draw: int
    test_accuracy: float
    mia_auc: float = math.nan
    mia_accuracy: float = math.nan
    tpr_at_fpr_0_01: float = math.nan
    tpr_at_fpr_0_001: float = math.nan
    attack: str = ""


_COLUMNS = tuple(f.name for f in fields(DrawRecord))


def _largest(values: Sequence[float]) -> float:
    finite = [v for v in values if not math.isnan(v)]
    return max(finite) if finite else math.nan


def draw_records(
    *,
    method: str,
    epsilon: float,
    seed: int,
    accuracies: Sequence[float],
    results: Sequence[Sequence[AttackResult]],
) -> list[DrawRecord]:
    """The records of one cell.

    Args:
        method, epsilon, seed: the cell.
        accuracies: per draw, the release's test accuracy.
        results: per draw, its ``AttackResult`` objects (any attacker).
    """
    out = []
    for draw, accuracy in enumerate(accuracies):
        found = list(results[draw]) if draw < len(results) else []
        auc = {r.attack: float(r.mia_auc) for r in found}
        tprs = [r.tpr_at_fpr for r in found]
        out.append(
            DrawRecord(
                method=method,
                epsilon=float(epsilon),
                seed=int(seed),
                draw=draw,
                test_accuracy=float(accuracy),
                mia_auc=_largest(list(auc.values())),
                mia_accuracy=_largest([float(r.mia_accuracy) for r in found]),
                tpr_at_fpr_0_01=_largest([float(t.get(0.01, math.nan)) for t in tprs]),
                tpr_at_fpr_0_001=_largest([float(t.get(0.001, math.nan)) for t in tprs]),
                attack=max(auc, key=lambda a: -math.inf if math.isnan(auc[a]) else auc[a])
                if auc
                else "",
            )
        )
    return out


def write_draws(path: str | Path, records: Sequence[DrawRecord]) -> None:
    """Write ``records`` to ``path`` atomically."""
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(_COLUMNS)
    for r in records:
        writer.writerow(
            [
                _fmt_exact(v) if k == "epsilon" else _fmt(v)
                for k, v in zip(_COLUMNS, (getattr(r, c) for c in _COLUMNS), strict=True)
            ]
        )
    atomic_write_text(path, buffer.getvalue())


def read_draws(path: str | Path) -> list[DrawRecord]:
    """Read ``draws.csv``.

    Raises:
        ValueError: if it is not one (naming the path).
    """
    try:
        with open(path, newline="") as handle:
            reader = csv.DictReader(handle)
            if tuple(reader.fieldnames or ()) != _COLUMNS:
                raise ValueError(f"columns {reader.fieldnames}, expected {list(_COLUMNS)}")
            out = []
            for row in reader:
                values: dict[str, object] = {}
                for f in fields(DrawRecord):
                    raw = row[f.name]
                    if f.type in ("float", float):
                        values[f.name] = math.nan if raw == "" else float(raw)
                    elif f.type in ("int", int):
                        values[f.name] = int(raw)
                    else:
                        values[f.name] = raw
                out.append(DrawRecord(**values))  # type: ignore[arg-type]
            return out
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"{path}: not a readable {DRAWS_FILE} ({exc}); use --overwrite") from exc
