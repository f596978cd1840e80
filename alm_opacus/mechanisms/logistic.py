"""The additive logistic mechanism (ALM) of Yang, Gohari & Topcu."""

from __future__ import annotations

import math
from typing import ClassVar

import torch

from alm_opacus.mechanisms import analysis
from alm_opacus.mechanisms.base import PureAdditiveNoiseMechanism
from alm_opacus.mechanisms.sampling import NoiseGenerator, Shape, standard_logistic

__all__ = ["LogisticMechanism"]


class LogisticMechanism(PureAdditiveNoiseMechanism):
    """Logistic noise of scale s: pure ε-DP with ε = Δ₁/s.

    Source: ALM paper, Theorem 4.1 and Remark 4.1. Registered as ``alm`` and ``logistic``.
    """

    name: ClassVar[str] = "alm"
    _unit_std: ClassVar[float] = math.pi / math.sqrt(3.0)  # Var = s²π²/3

    def _standard_noise(self, shape: Shape, *, generator: NoiseGenerator) -> torch.Tensor:
        return standard_logistic(shape, generator=generator)

    def _scalar_epsilon(self, *, delta: float, scale: float, sensitivity: float) -> float:
        return analysis.logistic_epsilon(delta=delta, scale=scale, sensitivity=sensitivity)

    def _scalar_delta(self, *, epsilon: float, scale: float, sensitivity: float) -> float:
        return analysis.logistic_delta(epsilon=epsilon, scale=scale, sensitivity=sensitivity)
