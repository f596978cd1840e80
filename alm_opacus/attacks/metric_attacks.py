"""Metric attacks (Yeom et al. 2018; Song & Mittal 2021): correctness, loss, confidence,
entropy and modified entropy.

Each computes one signal per example (``scores.py``). The threshold is fitted on the shadow
bank's in/out pairs, per class or globally (``AttackConfig.threshold_scope``), and frozen
before any target is scored; the raw signal is the threshold-free score for the ROC.
"""

from __future__ import annotations

import abc

import numpy as np
import numpy.typing as npt

from alm_opacus.attacks.base import AttackKind, FloatArray
from alm_opacus.attacks.context import ShadowContext, concat_pairs
from alm_opacus.attacks.registry import Attack, AttackScores, TargetQuery, register_attack
from alm_opacus.attacks.scores import (
    confidence_score,
    correctness_score,
    entropy_score,
    in_blocks,
    loss_score,
    modified_entropy_score,
)
from alm_opacus.attacks.thresholds import Threshold


class MetricAttack(Attack):
    """A signal, thresholded at a value chosen on shadow data."""

    threshold: Threshold | None = None
    banks = frozenset({"shadow"})

    @abc.abstractmethod
    def signal(self, proba: FloatArray, labels: npt.NDArray[np.int64]) -> FloatArray:
        """(..., q) scores from (..., q, C) probabilities, larger = more member-like."""

    def fit(self, context: ShadowContext) -> None:
        proba, labels, is_member = concat_pairs(context.shadow_bank())
        self.threshold = Threshold.fit(
            scores=in_blocks(self.signal, proba, labels),
            labels=labels,
            is_member=is_member,
            num_classes=context.num_classes,
            scope=self.config.threshold_scope,
        )

    def score(self, query: TargetQuery) -> AttackScores:
        if self.threshold is None:
            raise RuntimeError(f"attack {self.name!r} was scored before fit()")
        s = in_blocks(self.signal, query.proba, query.labels)
        return AttackScores(scores=s, decisions=self.threshold.apply(s, query.labels))


@register_attack(AttackKind.LOSS)
class LossAttack(MetricAttack):
    """Member iff the cross-entropy loss is below a threshold (Yeom et al. 2018)."""

    def signal(self, proba: FloatArray, labels: npt.NDArray[np.int64]) -> FloatArray:
        return loss_score(proba, labels)


@register_attack(AttackKind.CONFIDENCE)
class ConfidenceAttack(MetricAttack):
    """Member iff ``p_y >= tau_y`` (Song & Mittal 2021, I_conf)."""

    def signal(self, proba: FloatArray, labels: npt.NDArray[np.int64]) -> FloatArray:
        return confidence_score(proba, labels)


@register_attack(AttackKind.ENTROPY)
class EntropyAttack(MetricAttack):
    """Member iff the prediction entropy is below ``tau_y`` (Song & Mittal 2021, I_entr)."""

    def signal(self, proba: FloatArray, labels: npt.NDArray[np.int64]) -> FloatArray:
        return entropy_score(proba, labels)


@register_attack(AttackKind.MODIFIED_ENTROPY)
class ModifiedEntropyAttack(MetricAttack):
    """Member iff ``Mentr(p, y) <= tau_y`` (Song & Mittal 2021, I_Mentr)."""

    def signal(self, proba: FloatArray, labels: npt.NDArray[np.int64]) -> FloatArray:
        return modified_entropy_score(proba, labels)


@register_attack(AttackKind.CORRECTNESS)
class CorrectnessAttack(MetricAttack):
    """Member iff correctly classified (Yeom et al. 2018; Song & Mittal 2021, I_corr).

    The rule has no free threshold, so nothing is fitted; its ROC has a single inner point.
    """

    def signal(self, proba: FloatArray, labels: npt.NDArray[np.int64]) -> FloatArray:
        return correctness_score(proba, labels)

    def fit(self, context: ShadowContext) -> None:
        del context
        self.threshold = Threshold(value=0.5)
