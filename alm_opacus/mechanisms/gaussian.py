"""Gaussian mechanisms: analytic calibration, and the textbook one kept to reproduce the paper."""

from __future__ import annotations

from typing import ClassVar

import torch

from alm_opacus._validation import check_epsilon, check_positive, check_sensitivity
from alm_opacus.mechanisms import analysis
from alm_opacus.mechanisms.base import AdditiveNoiseMechanism, Norm
from alm_opacus.mechanisms.sampling import NoiseGenerator, Shape, standard_normal

__all__ = ["ClassicGaussianMechanism", "GaussianMechanism"]


class GaussianMechanism(AdditiveNoiseMechanism):
    """Gaussian noise of standard deviation σ, calibrated analytically to L2 sensitivity.

    `calibrate` returns the smallest σ that is (ε, δ)-DP, for every ε > 0 (Balle & Wang
    2018, Theorem 8 and Algorithm 1). Its profile is exact for any dimension, by rotation
    invariance, so ``dim`` is accepted and ignored.
    """

    name: ClassVar[str] = "gaussian"
    norm: ClassVar[Norm] = "l2"
    pure: ClassVar[bool] = False
    _unit_std: ClassVar[float] = 1.0

    def _calibrate(self, *, epsilon: float, delta: float, sensitivity: float) -> float:
        return analysis.analytic_gaussian_scale(
            epsilon=epsilon, delta=delta, sensitivity=sensitivity
        )

    def _standard_noise(self, shape: Shape, *, generator: NoiseGenerator) -> torch.Tensor:
        return standard_normal(shape, generator=generator)

    def _epsilon(self, *, delta: float, scale: float, sensitivity: float, dim: int | None) -> float:
        return analysis.gaussian_epsilon(delta=delta, scale=scale, sensitivity=sensitivity)

    def _delta(self, *, epsilon: float, scale: float, sensitivity: float, dim: int | None) -> float:
        return analysis.gaussian_delta(epsilon=epsilon, scale=scale, sensitivity=sensitivity)


class ClassicGaussianMechanism(GaussianMechanism):
    """Textbook σ = sqrt(2·ln(1.25/δ))·Δ₂/ε (Dwork & Roth 2014, Theorem A.1).

    Kept to reproduce the ALM paper's Gaussian baseline. The theorem proves (ε, δ)-DP only
    for ε < 1. For ε ≥ 1 `calibrate` still returns the formula's σ; what that σ guarantees is
    `achieved_delta`, the exact δ of the Gaussian profile, which may exceed the target
    (ε = 10, δ = 1e-5 gives about 2.3e-5). `epsilon` and `delta` are the exact profile.
    """

    name: ClassVar[str] = "gaussian-classic"

    def _calibrate(self, *, epsilon: float, delta: float, sensitivity: float) -> float:
        return analysis.classic_gaussian_scale(
            epsilon=epsilon, delta=delta, sensitivity=sensitivity
        )

    @staticmethod
    def theorem_applies(*, epsilon: float) -> bool:
        """Whether Theorem A.1 covers this ε (it requires ε < 1).

        Raises:
            ValueError: if ``epsilon`` is NaN, infinite or non-positive.
        """
        return check_epsilon(epsilon) < 1.0

    def achieved_delta(self, *, epsilon: float, scale: float, sensitivity: float) -> float:
        """The δ that ``scale`` actually achieves at ε, from the exact Gaussian profile.

        Args:
            epsilon: ε > 0.
            scale: σ > 0, typically from `calibrate`.
            sensitivity: Δ₂ > 0.

        Returns:
            δ(ε) in [0, 1). For ε < 1 and σ from `calibrate` it is at most the target δ.

        Raises:
            ValueError: if an argument is out of range.
        """
        return analysis.gaussian_delta(
            epsilon=check_epsilon(epsilon),
            scale=check_positive(scale, name="scale"),
            sensitivity=check_sensitivity(sensitivity),
        )
