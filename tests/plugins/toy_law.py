"""A toy noise law written outside alm_opacus, as a plugin writes one: ``toy``.

At scale b the toy's noise is Laplace noise of scale 2b (its unit law is 2·Laplace(0, 1)), so
every part has a closed form that differs from the Laplace law at the same scale, and a test
can tell which parts were used:

- the mechanism: pure (Δ₁/(2b))-DP, calibrated at b = Δ₁/(2ε);
- the cell law: folded tail S(u) = P(|Z| > u) = e^{−u/2}, inverse u = −2·ln v;
- the first pass: x = −2t·ln V (numpy, within the first pass's error bound);
- one release's PLD and one DP-SGD step's: dp_accounting's Laplace PLDs at scale 2b;
- the claim rule: the Laplace profile at scale 2b.

It imports public names only, registers the law once and, for the harness, a post-training
method ``toy`` that releases with it. Registered through the entry point groups
``alm_opacus.noise_laws`` and ``alm_opacus.methods`` (the tests fake them).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import ClassVar

import mpmath
import numpy as np
import torch
from dp_accounting.pld import privacy_loss_distribution as pld_lib
from numpy.typing import NDArray

from alm_opacus.mechanisms import analysis
from alm_opacus.mechanisms.sampling import NoiseGenerator, uniform_open
from alm_opacus.plugin import (
    CellLaw,
    ClaimRule,
    NoiseLaw,
    PostTrainingMethod,
    PureAdditiveNoiseMechanism,
    StepProfile,
    register_method,
    register_noise_law,
)

#: The unit law's stretch: Z = STRETCH · Laplace(0, 1).
STRETCH = 2.0


class ToyMechanism(PureAdditiveNoiseMechanism):
    """Laplace noise of scale 2b at scale b: pure (Δ₁/(2b))-DP."""

    name: ClassVar[str] = "toy"
    _unit_std: ClassVar[float] = STRETCH * math.sqrt(2.0)

    def _calibrate(self, *, epsilon: float, delta: float, sensitivity: float) -> float:
        return sensitivity / (STRETCH * epsilon)

    def _standard_noise(
        self, shape: int | Sequence[int], *, generator: NoiseGenerator
    ) -> torch.Tensor:
        # a difference of two Exp(1) draws is Laplace(0, 1)
        dims = (shape,) if isinstance(shape, int) else tuple(shape)
        u = uniform_open((2, *dims), generator=generator)
        return STRETCH * (torch.log(u[1]) - torch.log(u[0]))

    def _epsilon(self, *, delta: float, scale: float, sensitivity: float, dim: int | None) -> float:
        return super()._epsilon(
            delta=delta, scale=STRETCH * scale, sensitivity=sensitivity, dim=dim
        )

    def _delta(self, *, epsilon: float, scale: float, sensitivity: float, dim: int | None) -> float:
        return super()._delta(
            epsilon=epsilon, scale=STRETCH * scale, sensitivity=sensitivity, dim=dim
        )

    # the base class hands these the stretched scale (Laplace's own b)
    def _scalar_epsilon(self, *, delta: float, scale: float, sensitivity: float) -> float:
        return analysis.laplace_epsilon(delta=delta, scale=scale, sensitivity=sensitivity)

    def _scalar_delta(self, *, epsilon: float, scale: float, sensitivity: float) -> float:
        return analysis.laplace_delta(epsilon=epsilon, scale=scale, sensitivity=sensitivity)


class ToyCells(CellLaw):
    """S(u) = e^{−u/2}, so u = −2·ln v."""

    name = "toy"

    def inverse_tail_(self, v: torch.Tensor) -> torch.Tensor:
        return v.log_().mul_(-STRETCH)

    def log_tail(self, u: NDArray[np.float64]) -> NDArray[np.float64]:
        return np.asarray(-u / STRETCH, dtype=np.float64)

    def tail_interval(self, u: mpmath.iv.mpf) -> mpmath.iv.mpf:
        return mpmath.iv.exp(-u / STRETCH)


def toy_first_pass(
    words: np.ndarray,
    t: float,
    x: np.ndarray,
    ints: np.ndarray,
    index: np.ndarray,
    tail: np.ndarray,
    spare: np.ndarray,
) -> None:
    """x = t·S⁻¹(V) = −2t·ln V, V = |float(w)|·2⁻⁶³ (one rounding, as the kernels)."""
    np.multiply(np.abs(words.astype(np.float64)), 2.0**-63, out=spare)
    np.log(spare, out=x)
    x *= -STRETCH * t


def toy_release_pld(
    *, scale: float, sensitivity: float, dim: int | None, interval: float
) -> pld_lib.PrivacyLossDistribution:
    """One release: the Laplace PLD at scale 2b (a one-coordinate shift dominates under L1)."""
    return pld_lib.from_laplace_mechanism(
        STRETCH * scale, sensitivity=sensitivity, value_discretization_interval=interval
    )


def _toy_step(
    *, noise_multiplier: float, sample_rate: float, dim: int | None, interval: float
) -> pld_lib.PrivacyLossDistribution:
    return pld_lib.from_laplace_mechanism(
        STRETCH * noise_multiplier,
        sensitivity=1.0,
        sampling_prob=sample_rate,
        value_discretization_interval=interval,
    )


def _toy_span(*, noise_multiplier: float, sample_rate: float, dim: int | None) -> float:
    # a q-subsampled pure ε₀-DP step: losses in [ln(1 − q(1 − e^{−ε₀})), ln(1 + q(e^{ε₀} − 1))]
    eps0 = 1.0 / (STRETCH * noise_multiplier)
    return math.log1p(sample_rate * math.expm1(eps0)) - math.log1p(sample_rate * math.expm1(-eps0))


def _toy_claim_epsilon(*, delta: float, scale: float, sensitivity: float) -> float:
    return analysis.laplace_epsilon(delta=delta, scale=STRETCH * scale, sensitivity=sensitivity)


TOY_LAW = register_noise_law(
    NoiseLaw(
        name="toy",
        mechanism=ToyMechanism,
        cell_law=ToyCells(),
        first_pass=toy_first_pass,
        release_pld=toy_release_pld,
        step_profile=StepProfile(build=_toy_step, span=_toy_span, norm="l1"),
        claim_rule=ClaimRule(
            pure=True,
            norm="l1",
            epsilon=_toy_claim_epsilon,
            bound="Delta_1 / (2 b) (toy)",
            profile="the toy profile (Laplace at scale 2b)",
        ),
    )
)


@register_method("toy")
class ToyMethod(PostTrainingMethod):
    """The toy law's noise added once to the trained head, L1 sensitivity."""

    name = "toy"
    mechanism = "toy"
