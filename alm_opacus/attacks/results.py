"""Result dataclasses: one attack on one release, and the mean/std over noise draws.

They turn into rows of ``results.csv`` (columns named in DESIGN.md) and round-trip through
plain dicts (``to_dict`` / ``from_dict``) for saving.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from alm_opacus.attacks.base import FloatArray

TPR_FPR_LEVELS: tuple[float, ...] = (0.001, 0.01)
"""FPRs at which TPR is reported (Carlini et al. 2022 argue for 0.1% and below)."""

METRIC_COLUMNS: tuple[str, ...] = (
    "mia_accuracy",
    "mia_advantage",
    "mia_auc",
    *(f"tpr_at_fpr_{level:g}" for level in TPR_FPR_LEVELS),
    "eps_lower_bound",
)
"""The metric columns of ``results.csv`` this package fills, in DESIGN.md's order."""


@dataclass(frozen=True)
class RocCurve:
    """ROC points of the rule ``score >= threshold``; ``thresholds[0] = +inf``."""

    fpr: FloatArray
    tpr: FloatArray
    thresholds: FloatArray


@dataclass(frozen=True)
class EpsilonBound:
    """How ``eps_lower_bound`` was obtained.

    Attributes:
        epsilon: the lower bound (0 when nothing can be concluded).
        fpr_upper: one-sided Clopper–Pearson upper bound on the FPR.
        fnr_upper: one-sided Clopper–Pearson upper bound on the FNR.
        false_positives, negatives, false_negatives, positives: the counts bounded.
        delta: the release's delta used.
        confidence: joint confidence of the two upper bounds (Bonferroni).
        threshold: the score threshold used (NaN when the attack's own decisions were used).
        method: ``"split-half"`` or ``"shadow-threshold"``.
    """

    epsilon: float
    fpr_upper: float
    fnr_upper: float
    false_positives: int
    negatives: int
    false_negatives: int
    positives: int
    delta: float
    confidence: float
    threshold: float
    method: str


@dataclass(frozen=True)
class AttackResult:
    """One attack against one release.

    Attributes:
        attack: the attack's stable name.
        mia_accuracy: accuracy at the threshold chosen on shadow data (never on the evaluation
            set), on the balanced evaluation set.
        mia_advantage: ``max |TPR - FPR|`` over the ROC (threshold-free).
        mia_auc: area under the ROC (threshold-free).
        tpr_at_fpr: TPR at each FPR of :data:`TPR_FPR_LEVELS`.
        eps_lower_bound: the empirical epsilon lower bound (``epsilon_bound.epsilon``).
        epsilon_bound: how it was obtained.
        roc: the ROC arrays.
        num_members: members in the evaluation set.
        num_nonmembers: non-members in the evaluation set.
        seconds: time of this attack on this release (shadow training excluded).
        notes: caveats (e.g. fewer attack pairs than asked).
    """

    attack: str
    mia_accuracy: float
    mia_advantage: float
    mia_auc: float
    tpr_at_fpr: dict[float, float]
    eps_lower_bound: float
    epsilon_bound: EpsilonBound
    roc: RocCurve
    num_members: int
    num_nonmembers: int
    seconds: float = 0.0
    notes: tuple[str, ...] = field(default_factory=tuple)

    def to_row(self) -> dict[str, Any]:
        """``{"attack": ..., <METRIC_COLUMNS>...}`` for ``results.csv``."""
        row: dict[str, Any] = {"attack": self.attack}
        row.update(
            mia_accuracy=self.mia_accuracy,
            mia_advantage=self.mia_advantage,
            mia_auc=self.mia_auc,
        )
        for level in TPR_FPR_LEVELS:
            row[f"tpr_at_fpr_{level:g}"] = self.tpr_at_fpr[level]
        row["eps_lower_bound"] = self.eps_lower_bound
        return row

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (arrays as lists)."""
        out = asdict(self)
        out["tpr_at_fpr"] = {f"{k:g}": v for k, v in self.tpr_at_fpr.items()}
        out["roc"] = {k: np.asarray(v).tolist() for k, v in asdict(self.roc).items()}
        out["notes"] = list(self.notes)
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> AttackResult:
        """Inverse of :meth:`to_dict`."""
        data = dict(data)
        data["tpr_at_fpr"] = {float(k): float(v) for k, v in data["tpr_at_fpr"].items()}
        data["roc"] = RocCurve(
            **{k: np.asarray(v, dtype=np.float64) for k, v in data["roc"].items()}
        )
        data["epsilon_bound"] = EpsilonBound(**data["epsilon_bound"])
        data["notes"] = tuple(data.get("notes", ()))
        return cls(**data)


@dataclass(frozen=True)
class AggregateResult:
    """One attack's metrics over ``R`` independent noise draws of a release.

    Attributes:
        attack: the attack's name.
        num_draws: ``R``.
        mean: column -> mean over draws.
        std: column -> sample standard deviation (``ddof=1``; NaN when ``R == 1``).
    """

    attack: str
    num_draws: int
    mean: dict[str, float]
    std: dict[str, float]

    def to_row(self) -> dict[str, Any]:
        """``attack``, then each metric column (the mean) and ``<column>_std``."""
        row: dict[str, Any] = {"attack": self.attack}
        row.update({c: self.mean[c] for c in METRIC_COLUMNS})
        row.update({f"{c}_std": self.std[c] for c in METRIC_COLUMNS})
        row["num_draws"] = self.num_draws
        return row


def aggregate_results(results: Sequence[AttackResult]) -> list[AggregateResult]:
    """Mean and standard deviation of each attack's metrics over noise draws.

    Args:
        results: results of the same attacks on ``R`` independent draws of one release, in
            any order (grouped by ``attack``, first-seen order kept).

    Returns:
        One :class:`AggregateResult` per attack.

    Raises:
        ValueError: if ``results`` is empty.
    """
    if not results:
        raise ValueError("results is empty: nothing to aggregate")
    groups: dict[str, list[AttackResult]] = {}
    for result in results:
        groups.setdefault(result.attack, []).append(result)
    out = []
    for attack, group in groups.items():
        rows = [r.to_row() for r in group]
        values = {c: np.asarray([row[c] for row in rows], dtype=np.float64) for c in METRIC_COLUMNS}
        out.append(
            AggregateResult(
                attack=attack,
                num_draws=len(group),
                mean={c: float(v.mean()) for c, v in values.items()},
                std={
                    c: float(v.std(ddof=1)) if v.size > 1 else math.nan for c, v in values.items()
                },
            )
        )
    return out
