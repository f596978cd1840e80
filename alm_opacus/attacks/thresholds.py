"""Decision thresholds fitted on *shadow* data, then frozen.

A :class:`Threshold` is built from shadow heads' scores before any target exists, and only
applied afterwards; nothing in this module sees the evaluation set's membership.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from alm_opacus.attacks.base import BoolArray, FloatArray, ThresholdScope
from alm_opacus.attacks.metrics import best_threshold


@dataclass(frozen=True)
class Threshold:
    """Flag a member when ``score >= threshold`` (of its class, when per class).

    Attributes:
        value: the global threshold.
        per_class: (C,) class thresholds, or None for a global rule. A class with no in/out
            shadow pairs falls back to ``value``.
    """

    value: float
    per_class: FloatArray | None = None

    def apply(self, scores: FloatArray, labels: npt.NDArray[np.int64]) -> BoolArray:
        """Membership decisions for ``scores`` (q,) of examples labelled ``labels`` (q,)."""
        if self.per_class is None:
            return np.asarray(scores >= self.value)
        return np.asarray(scores >= self.per_class[labels])

    @classmethod
    def fit(
        cls,
        *,
        scores: FloatArray,
        labels: npt.NDArray[np.int64],
        is_member: BoolArray,
        num_classes: int,
        scope: ThresholdScope,
    ) -> Threshold:
        """Maximise balanced accuracy on shadow pairs, globally or per class.

        Song & Mittal (2021) set class-dependent thresholds "by maximizing the attack accuracy
        on the shadow training and test data" of each class; balanced accuracy is used here
        because the evaluation set is balanced while a class's shadow pairs need not be.

        Args:
            scores: (P,) shadow scores.
            labels: (P,) labels of the shadow pairs.
            is_member: (P,) whether each pair was in its shadow head's training half.
            num_classes: ``C``.
            scope: per class or global.

        Returns:
            The fitted rule.

        Raises:
            ValueError: if the shadow pairs hold no members or no non-members.
        """
        value = best_threshold(scores=scores, is_member=is_member)
        if ThresholdScope(scope) is ThresholdScope.GLOBAL:
            return cls(value=value)
        per_class = np.full(num_classes, value, dtype=np.float64)
        for c in range(num_classes):
            sel = labels == c
            if is_member[sel].any() and not is_member[sel].all():
                per_class[c] = best_threshold(scores=scores[sel], is_member=is_member[sel])
        return cls(value=value, per_class=per_class)
