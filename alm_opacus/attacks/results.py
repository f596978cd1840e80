"""Result dataclasses: one attack on one release (:class:`AttackResult`), and one attack over
the noise draws of a cell (:class:`AggregateResult`, built by ``aggregate.aggregate_results``).

They turn into rows of ``results.csv`` (columns named in DESIGN.md and ``report/results.py``)
and an :class:`AttackResult` round-trips through plain dicts (``to_dict`` / ``from_dict``).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from alm_opacus.attacks.base import BoolArray, FloatArray

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

INTERVAL_COLUMNS: tuple[str, ...] = (
    "mia_auc_ci_low",
    "mia_auc_ci_high",
    *(f"tpr_at_fpr_{level:g}_ci_{end}" for level in TPR_FPR_LEVELS for end in ("low", "high")),
    "eps_lower_bound_ceiling",
)
"""The appended columns of ``results.csv`` this package fills (``report.results.ResultRow``)."""


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
        method: ``"split-half"`` or ``"shadow-threshold"`` (with ``", pooled over R draws"``
            when counts of several releases were pooled).
        ceiling: the largest bound these counts' sizes can give at this delta and confidence
            (the bound of perfect decisions). A claim above it cannot be refuted here.
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
    ceiling: float = math.nan


@dataclass(frozen=True)
class AttackResult:
    """One attack against one release.

    Attributes:
        attack: the attack's stable name.
        mia_accuracy: accuracy at the threshold chosen on shadow data (never on the evaluation
            set), on the balanced evaluation set.
        mia_advantage: ``max |TPR - FPR|`` over the ROC (threshold-free).
        mia_auc: area under the ROC (threshold-free).
        tpr_at_fpr: TPR at each FPR of :data:`TPR_FPR_LEVELS`; NaN where the evaluation set has
            too few non-members to resolve that FPR (``intervals.tpr_supported``).
        eps_lower_bound: the empirical epsilon lower bound (``epsilon_bound.epsilon``).
        epsilon_bound: how it was obtained.
        roc: the ROC arrays.
        num_members: members in the evaluation set.
        num_nonmembers: non-members in the evaluation set.
        seconds: time of this attack on this release (shadow training excluded).
        notes: caveats (e.g. fewer attack pairs than asked).
        auc_ci: interval of ``mia_auc`` (DeLong; ``intervals.py``).
        tpr_ci: interval of each ``tpr_at_fpr`` (stratified bootstrap); NaN where the TPR is.
        scores: (q,) the attack's threshold-free scores, kept to aggregate over draws.
        is_member: (q,) the evaluation set's membership, aligned with ``scores``.
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
    auc_ci: tuple[float, float] = (math.nan, math.nan)
    tpr_ci: dict[float, tuple[float, float]] = field(default_factory=dict)
    scores: FloatArray | None = None
    is_member: BoolArray | None = None

    @property
    def eps_lower_bound_ceiling(self) -> float:
        """The largest ``eps_lower_bound`` this evaluation set can give (``EpsilonBound``)."""
        return self.epsilon_bound.ceiling

    def to_row(self) -> dict[str, Any]:
        """``{"attack": ..., <METRIC_COLUMNS>..., <INTERVAL_COLUMNS>...}`` for ``results.csv``."""
        row: dict[str, Any] = {"attack": self.attack}
        row.update(
            mia_accuracy=self.mia_accuracy,
            mia_advantage=self.mia_advantage,
            mia_auc=self.mia_auc,
        )
        for level in TPR_FPR_LEVELS:
            row[f"tpr_at_fpr_{level:g}"] = self.tpr_at_fpr[level]
        row["eps_lower_bound"] = self.eps_lower_bound
        row.update(interval_row(self.auc_ci, self.tpr_ci, self.eps_lower_bound_ceiling))
        return row

    def with_attack(self, name: str) -> AttackResult:
        """The same result under another ``attack`` name (e.g. with an attacker's suffix)."""
        return dataclasses.replace(self, attack=name)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (arrays as lists)."""
        out = asdict(self)
        out["tpr_at_fpr"] = {f"{k:g}": v for k, v in self.tpr_at_fpr.items()}
        out["tpr_ci"] = {f"{k:g}": list(v) for k, v in self.tpr_ci.items()}
        out["auc_ci"] = list(self.auc_ci)
        out["roc"] = {k: np.asarray(v).tolist() for k, v in asdict(self.roc).items()}
        out["notes"] = list(self.notes)
        for name in ("scores", "is_member"):
            value = getattr(self, name)
            out[name] = None if value is None else np.asarray(value).tolist()
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> AttackResult:
        """Inverse of :meth:`to_dict`."""
        data = dict(data)
        data["tpr_at_fpr"] = {float(k): float(v) for k, v in data["tpr_at_fpr"].items()}
        data["tpr_ci"] = {
            float(k): (float(v[0]), float(v[1])) for k, v in data.get("tpr_ci", {}).items()
        }
        low, high = data.get("auc_ci", (math.nan, math.nan))
        data["auc_ci"] = (float(low), float(high))
        data["roc"] = RocCurve(
            **{k: np.asarray(v, dtype=np.float64) for k, v in data["roc"].items()}
        )
        data["epsilon_bound"] = EpsilonBound(**data["epsilon_bound"])
        data["notes"] = tuple(data.get("notes", ()))
        if data.get("scores") is not None:
            data["scores"] = np.asarray(data["scores"], dtype=np.float64)
        if data.get("is_member") is not None:
            data["is_member"] = np.asarray(data["is_member"], dtype=bool)
        return cls(**data)


def interval_row(
    auc_ci: tuple[float, float], tpr_ci: dict[float, tuple[float, float]], ceiling: float
) -> dict[str, float]:
    """The :data:`INTERVAL_COLUMNS` of one row."""
    row = {"mia_auc_ci_low": auc_ci[0], "mia_auc_ci_high": auc_ci[1]}
    for level in TPR_FPR_LEVELS:
        low, high = tpr_ci.get(level, (math.nan, math.nan))
        row[f"tpr_at_fpr_{level:g}_ci_low"] = low
        row[f"tpr_at_fpr_{level:g}_ci_high"] = high
    row["eps_lower_bound_ceiling"] = ceiling
    return row


@dataclass(frozen=True)
class AggregateResult:
    """One attack over the ``R`` independent noise draws of one cell.

    Attributes:
        attack: the attack's name.
        num_draws: ``R``.
        mean: metric -> mean over draws (``mia_accuracy``, ``mia_advantage``, ``mia_auc``,
            ``tpr_at_fpr_*``; NaN for a TPR the evaluation set cannot resolve).
        std: metric -> sample standard deviation over draws (``ddof=1``; NaN when ``R == 1``).
        auc_ci: interval of the mean AUC (evaluation set and draws; ``intervals.py``).
        tpr_ci: interval of each mean TPR.
        epsilon_bound: the empirical epsilon lower bound from the draws' pooled counts
            (``aggregate.pool_epsilon_bounds``), with its ceiling.
        notes: caveats (the draws' notes, unresolvable TPRs, a ceiling below the claim).
    """

    attack: str
    num_draws: int
    mean: dict[str, float]
    std: dict[str, float]
    auc_ci: tuple[float, float]
    tpr_ci: dict[float, tuple[float, float]]
    epsilon_bound: EpsilonBound
    notes: tuple[str, ...] = ()

    @property
    def eps_lower_bound(self) -> float:
        """The pooled 95% lower bound (not a mean of per-draw bounds)."""
        return self.epsilon_bound.epsilon

    @property
    def eps_lower_bound_ceiling(self) -> float:
        return self.epsilon_bound.ceiling

    def to_row(self) -> dict[str, Any]:
        """``attack``, :data:`METRIC_COLUMNS` (means; the pooled bound), ``<metric>_std``,
        ``num_draws`` and :data:`INTERVAL_COLUMNS`: the names of ``results.csv``'s columns."""
        row: dict[str, Any] = {"attack": self.attack}
        row.update({c: self.mean[c] for c in METRIC_COLUMNS if c != "eps_lower_bound"})
        row["eps_lower_bound"] = self.eps_lower_bound
        row.update({f"{c}_std": self.std[c] for c in self.std})
        row["num_draws"] = self.num_draws
        row.update(interval_row(self.auc_ci, self.tpr_ci, self.eps_lower_bound_ceiling))
        return row
