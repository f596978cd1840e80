"""The units of a run: a :class:`Cell` of the grid and the :class:`CellOutcome` it produces.

The harness computes outcomes and the writer records them; both import this module, neither
imports the other.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from alm_opacus.report.draws import DrawRecord
from alm_opacus.report.results import ResultRow, cell_key
from alm_opacus.report.risk import CellScores

__all__ = ["Cell", "CellOutcome", "RocKey", "RocMap"]

#: (method, epsilon, attack) of a ROC curve.
RocKey = tuple[str, float, str]
RocMap = dict[RocKey, tuple[list[float], list[float]]]


@dataclass(frozen=True)
class Cell:
    """One (method, epsilon, seed) of the grid; the baseline's epsilon is ``inf``."""

    method: str
    epsilon: float
    seed: int
    draws: int

    @property
    def key(self) -> tuple[str, str, int]:
        return cell_key(self.method, self.epsilon, self.seed)


@dataclass
class CellOutcome:
    """What one cell produced: its rows, the first draw's ROC curves (bounded after the rows'
    metrics were computed on the full ones: ``attacks.roc_bounds.bound_roc``), its chosen config,
    one record per release (noise draw), and the per-example scores behind ``risk/`` (computed
    from the private data: the driver writes them under ``report.risk.RISK_FOLDER``).

    Attributes:
        baseline_accuracy: for an unprotected baseline's cell, its test accuracy: the
            reference of every utility loss of its seed (``None`` for other cells).
    """

    rows: list[ResultRow]
    rocs: RocMap
    chosen: dict[str, Any] | None = None
    baseline_accuracy: float | None = None
    draws: list[DrawRecord] = field(default_factory=list)
    scores: CellScores | None = None
