"""The Laplace mechanism."""

from __future__ import annotations

import math
from typing import ClassVar

import torch

from alm_opacus.mechanisms import analysis
from alm_opacus.mechanisms.base import PureAdditiveNoiseMechanism
from alm_opacus.mechanisms.sampling import NoiseGenerator, Shape, standard_laplace

__all__ = ["LaplaceMechanism"]


class LaplaceMechanism(PureAdditiveNoiseMechanism):
    """Laplace noise of scale b = Δ₁/ε: pure ε-DP (Dwork & Roth 2014, Theorem 3.6)."""

    name: ClassVar[str] = "laplace"
    _unit_std: ClassVar[float] = math.sqrt(2.0)  # Var = 2b²

    def _standard_noise(self, shape: Shape, *, generator: NoiseGenerator) -> torch.Tensor:
        return standard_laplace(shape, generator=generator)

    def _scalar_epsilon(self, *, delta: float, scale: float, sensitivity: float) -> float:
        return analysis.laplace_epsilon(delta=delta, scale=scale, sensitivity=sensitivity)

    def _scalar_delta(self, *, epsilon: float, scale: float, sensitivity: float) -> float:
        return analysis.laplace_delta(epsilon=epsilon, scale=scale, sensitivity=sensitivity)
