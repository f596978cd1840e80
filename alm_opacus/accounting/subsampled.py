"""PLDs of Poisson-subsampled additive-noise steps: one DP-SGD step, add/remove neighbours.

A DP-SGD step clips each per-example gradient to norm C, sums a Poisson sample (rate q) and
adds i.i.d. noise of scale ``noise_multiplier * C`` per coordinate. Divided by C, it is the
additive mechanism with sensitivity 1 and scale σ = noise_multiplier, subsampled with
probability q. Under add/remove of one example, dp_accounting's two PLDs per step are
REMOVE: (q·P_v + (1 − q)·P_0, P_0) and ADD: (P_0, q·P_v + (1 − q)·P_0), with P_v the noise
law shifted by the clipped gradient v; δ is the larger of the two after composition.

Which profile each mechanism gets (proofs in ``docs/accounting.md``):

- ``gaussian`` (L2 clipping): dp_accounting's subsampled Gaussian PLD, exact in any dimension.
- ``laplace`` (L1 clipping): dp_accounting's subsampled scalar Laplace PLD, valid in every
  dimension (Theorem 1 there: under an L1 bound the one-coordinate shift dominates).
- ``alm`` (L1 clipping): the scalar logistic PLD, subsampled, valid in every dimension
  (Theorem 3 there: under an L1 bound the one-coordinate shift dominates, as for Laplace).
  The subsampled randomized-response pair of a pure (1/σ)-DP mechanism (Theorem 2), which
  `alm` used before Theorem 3, stays available as `pure_step_pld`.

Every PLD is pessimistic (connect-the-dots), so composing them bounds δ(ε) from above.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from dp_accounting.pld import pld_pmf, privacy_loss_mechanism
from dp_accounting.pld import privacy_loss_distribution as pld_lib
from dp_accounting.pld.privacy_loss_mechanism import AdjacencyType
from scipy import special

from alm_opacus._validation import check_positive
from alm_opacus.accounting.pld import (
    DEFAULT_VALUE_DISCRETIZATION_INTERVAL,
    LAPLACE_MAX_PURE_EPSILON,
    LogisticPrivacyLoss,
    PrivacyLossDistribution,
    _check_interval,
    _check_sample_rate,
    _check_steps,
    _connect_dots,
    log_mixture,
)
from alm_opacus.mechanisms import create_mechanism
from alm_opacus.mechanisms.base import _check_dim, _load_noise_laws
from alm_opacus.registry import Registry

__all__ = [
    "PURE_STEP_PROFILE",
    "StepProfile",
    "available_step_mechanisms",
    "canonical_step_mechanism",
    "pure_step_pld",
    "pure_subsampled_delta",
    "pure_subsampled_pairs",
    "register_step_profile",
    "step_loss_span",
    "step_pld",
]

Direction = Literal["remove", "add"]
LossMasses = list[tuple[float, float]]


def pure_subsampled_pairs(
    *, pure_epsilon: float, sample_rate: float
) -> dict[Direction, LossMasses]:
    """The two-point PLDs of q-subsampled randomized response at ε₀, both directions.

    Randomized response A = (p, 1 − p), B = (1 − p, p), p = e^{ε₀}/(1 + e^{ε₀}), dominates
    every pure ε₀-DP pair (Kairouz, Oh & Viswanath 2015). REMOVE is ((1 − q)B + qA, B), ADD
    is (B, (1 − q)B + qA); each is a list of (privacy loss, mass under the upper law).
    Derivation in ``docs/accounting.md`` (Theorem 2).

    Args:
        pure_epsilon: ε₀ > 0 (may exceed 709: everything is computed in log space).
        sample_rate: q in (0, 1].

    Returns:
        ``{"remove": [(loss, mass), ...], "add": [...]}``, masses summing to 1.
    """
    eps0 = check_positive(pure_epsilon, name="pure_epsilon")
    q = _check_sample_rate(sample_rate)
    p, not_p = float(special.expit(eps0)), float(special.expit(-eps0))
    up = log_mixture(q, eps0)  # ln(1 + q(e^{ε₀} − 1))
    down = log_mixture(q, -eps0)  # ln(1 − q(1 − e^{−ε₀}))
    return {
        "remove": [(up, (1 - q) * not_p + q * p), (down, (1 - q) * p + q * not_p)],
        "add": [(-up, not_p), (-down, p)],
    }


def pure_subsampled_delta(
    *, epsilon: float, pure_epsilon: float, sample_rate: float, direction: Direction
) -> float:
    """Exact δ(ε) = Σ mass·max(0, 1 − e^{ε − loss}) of `pure_subsampled_pairs`.

    Closed forms (ε ≥ 0, x = e^{ε₀}): REMOVE δ = max(0, 1 + q(x − 1) − e^ε)/(1 + x);
    ADD δ = max(0, 1 − e^ε(1 − q(1 − 1/x)))·x/(1 + x).

    Args:
        epsilon: any real ε.
        pure_epsilon: ε₀ > 0.
        sample_rate: q in (0, 1].
        direction: ``"remove"`` or ``"add"``.

    Returns:
        δ(ε) in [0, 1].

    Raises:
        ValueError: if ``direction`` is not ``"remove"`` or ``"add"``, or an argument is invalid.
    """
    pairs = pure_subsampled_pairs(pure_epsilon=pure_epsilon, sample_rate=sample_rate)
    if direction not in pairs:
        raise ValueError(f"direction={direction!r} is invalid: expected 'remove' or 'add'")
    eps = float(epsilon)
    return math.fsum(m * max(0.0, -math.expm1(eps - loss)) for loss, m in pairs[direction])


def _connect_dots_atoms(masses: LossMasses, interval: float) -> dict[int, float]:
    """Spread each atom over its two grid neighbours, keeping δ exact at every grid point.

    An atom of mass p at loss L ∈ [a, b] (b = a + h) goes to a and b with p_b =
    p·(1 − e^{a−L})/(1 − e^{−h}) and p_a = p − p_b: then Σ p and Σ p·e^{−L} are kept, so
    δ(ε) = Σ p·(1 − e^{ε−L})₊ is unchanged for ε ≤ a, and on [a, b] the new δ is the chord
    of a function convex in e^ε, hence above it (connect-the-dots, Doroshenko et al. 2022).
    Rounding every loss up instead would add up to h per step: n·h after n steps.
    """
    out: dict[int, float] = defaultdict(float)
    for loss, mass in masses:
        low = math.floor(loss / interval)
        gap = loss - low * interval  # in [0, h)
        upper = mass * math.expm1(-gap) / math.expm1(-interval)
        out[low] += mass - upper
        out[low + 1] += upper
    return dict(out)


def _pure_step(
    *, noise_multiplier: float, sample_rate: float, interval: float
) -> PrivacyLossDistribution:
    pairs = pure_subsampled_pairs(pure_epsilon=1.0 / noise_multiplier, sample_rate=sample_rate)
    symmetric = sample_rate == 1.0  # q = 1: both directions are randomized response itself
    return PrivacyLossDistribution.create_from_rounded_probability(
        _connect_dots_atoms(pairs["remove"], interval),
        0.0,
        interval,
        pessimistic_estimate=True,
        rounded_probability_mass_function_add=None
        if symmetric
        else _connect_dots_atoms(pairs["add"], interval),
        infinity_mass_add=None if symmetric else 0.0,
        symmetric=symmetric,
    )


def _gaussian_step(
    *, noise_multiplier: float, sample_rate: float, dim: int | None, interval: float
) -> PrivacyLossDistribution:
    return pld_lib.from_gaussian_mechanism(
        noise_multiplier,
        sensitivity=1.0,
        sampling_prob=sample_rate,
        value_discretization_interval=interval,
    )


def _laplace_step(
    *, noise_multiplier: float, sample_rate: float, dim: int | None, interval: float
) -> PrivacyLossDistribution:
    # Valid for every dim: docs/accounting.md, Theorem 1.
    if 1.0 / noise_multiplier > LAPLACE_MAX_PURE_EPSILON:  # dp_accounting would overflow
        return _pure_step(
            noise_multiplier=noise_multiplier, sample_rate=sample_rate, interval=interval
        )
    return pld_lib.from_laplace_mechanism(
        noise_multiplier,
        sensitivity=1.0,
        sampling_prob=sample_rate,
        value_discretization_interval=interval,
    )


def _logistic_step(
    *, noise_multiplier: float, sample_rate: float, dim: int | None, interval: float
) -> PrivacyLossDistribution:
    # The scalar subsampled logistic PLD, valid for every dim: under an L1 bound the
    # one-coordinate shift dominates (docs/accounting.md, Theorem 3).

    def pmf(adjacency: AdjacencyType) -> pld_pmf.PLDPmf:
        loss = LogisticPrivacyLoss(
            noise_multiplier, sampling_prob=sample_rate, adjacency_type=adjacency
        )
        return _connect_dots(loss, interval)

    remove = pmf(AdjacencyType.REMOVE)
    if sample_rate == 1.0:
        return PrivacyLossDistribution(remove)
    return PrivacyLossDistribution(remove, pmf(AdjacencyType.ADD))


def _gaussian_span(*, noise_multiplier: float, sample_rate: float, dim: int | None) -> float:
    widths = []
    for adjacency in (AdjacencyType.REMOVE, AdjacencyType.ADD):
        bounds = privacy_loss_mechanism.GaussianPrivacyLoss(
            noise_multiplier, sampling_prob=sample_rate, adjacency_type=adjacency
        ).connect_dots_bounds()
        assert bounds.epsilon_upper is not None and bounds.epsilon_lower is not None
        widths.append(bounds.epsilon_upper - bounds.epsilon_lower)
    return max(widths)


def _pure_span(*, noise_multiplier: float, sample_rate: float, dim: int | None) -> float:
    # Both directions have losses in [ln(1 − q(1 − e^{−ε₀})), ln(1 + q(e^{ε₀} − 1))], negated.
    eps0 = 1.0 / noise_multiplier
    return log_mixture(sample_rate, eps0) - log_mixture(sample_rate, -eps0)


@dataclass(frozen=True)
class StepProfile:
    """How one Poisson-subsampled step of a mechanism becomes a PLD.

    Attributes:
        build: ``(*, noise_multiplier, sample_rate, dim, interval) -> PLD`` of one step.
        span: ``(*, noise_multiplier, sample_rate, dim) -> float``, the width of the finite
            privacy-loss support of one step (largest over both directions); it sizes grids.
        norm: the clipping norm the profile assumes, ``"l1"`` or ``"l2"``.
    """

    build: Callable[..., PrivacyLossDistribution]
    span: Callable[..., float]
    norm: Literal["l1", "l2"]


#: DP-SGD step profiles by canonical mechanism name: each noise law's that has one
#: (`alm_opacus.noise_laws`), and those of `register_step_profile`.
STEP_PROFILES: Registry[StepProfile] = Registry("step profile", load=_load_noise_laws)


def register_step_profile(name: str, profile: StepProfile, *, force: bool = False) -> None:
    """Register the DP-SGD step profile of a mechanism (its canonical name).

    Raises:
        ValueError: if ``name`` is already registered and ``force`` is false.
    """
    # no cache to clear: a cached step PLD is keyed by its profile (``entries.entry_pld``)
    STEP_PROFILES.add(name, profile, force=force)


def pure_step_pld(
    *,
    noise_multiplier: float,
    sample_rate: float,
    steps: int = 1,
    value_discretization_interval: float = DEFAULT_VALUE_DISCRETIZATION_INTERVAL,
) -> PrivacyLossDistribution:
    """PLD of ``steps`` subsampled pure (1/σ)-DP steps through randomized response.

    Valid for any pure (1/σ)-DP step in any dimension (Theorem 2 in ``docs/accounting.md``);
    the profile ``alm`` steps had before Theorem 3 made the scalar logistic one valid.

    Raises:
        ValueError: if an argument is out of range.
    """
    single = _pure_step(
        noise_multiplier=check_positive(noise_multiplier, name="noise_multiplier"),
        sample_rate=_check_sample_rate(sample_rate),
        interval=_check_interval(value_discretization_interval),
    )
    n = _check_steps(steps)
    return single.self_compose(n) if n > 1 else single


def _pure_build(
    *, noise_multiplier: float, sample_rate: float, dim: int | None, interval: float
) -> PrivacyLossDistribution:
    return _pure_step(noise_multiplier=noise_multiplier, sample_rate=sample_rate, interval=interval)


#: The randomized-response step profile (Theorem 2), valid for any pure (1/σ)-DP step;
#: ``register_step_profile("alm", PURE_STEP_PROFILE, force=True)`` restores the accounting
#: ``alm`` had before Theorem 3 (``scripts/logistic_accounting.py`` compares the two).
PURE_STEP_PROFILE = StepProfile(_pure_build, _pure_span, "l1")
#: The built-in laws' profiles (registered with their laws by `alm_opacus.noise_laws`).
GAUSSIAN_STEP_PROFILE = StepProfile(_gaussian_step, _gaussian_span, "l2")
LAPLACE_STEP_PROFILE = StepProfile(_laplace_step, _pure_span, "l1")
LOGISTIC_STEP_PROFILE = StepProfile(_logistic_step, _pure_span, "l1")


def available_step_mechanisms() -> list[str]:
    """Canonical names that DP-SGD steps may use (sorted)."""
    return STEP_PROFILES.names()


def canonical_step_mechanism(mechanism: str) -> str:
    """Canonical name of a DP-SGD step mechanism (``logistic`` → ``alm``).

    Raises:
        ValueError: if the mechanism is unknown or has no step profile.
    """
    name = create_mechanism(mechanism).name
    if name not in STEP_PROFILES:
        raise ValueError(
            f"mechanism={mechanism!r} has no DP-SGD step profile: expected one of "
            f"{available_step_mechanisms()}"
        )
    return name


def step_loss_span(
    *, mechanism: str, noise_multiplier: float, sample_rate: float, dim: int | None = None
) -> float:
    """Width of one step's finite privacy-loss support (sizes the PLD grid).

    Raises:
        ValueError: if the mechanism has no step profile or an argument is out of range.
    """
    return STEP_PROFILES[canonical_step_mechanism(mechanism)].span(
        noise_multiplier=check_positive(noise_multiplier, name="noise_multiplier"),
        sample_rate=_check_sample_rate(sample_rate),
        dim=_check_dim(dim),
    )


def step_pld(
    *,
    mechanism: str = "gaussian",
    noise_multiplier: float,
    sample_rate: float,
    steps: int = 1,
    dim: int | None = None,
    value_discretization_interval: float = DEFAULT_VALUE_DISCRETIZATION_INTERVAL,
) -> PrivacyLossDistribution:
    """Pessimistic PLD of ``steps`` Poisson-subsampled DP-SGD steps (add/remove neighbours).

    Args:
        mechanism: ``"gaussian"`` (L2 clipping), ``"alm"``/``"logistic"`` or ``"laplace"``
            (L1 clipping).
        noise_multiplier: σ > 0; the noise scale is σ times the clipping norm.
        sample_rate: Poisson sampling probability q in (0, 1].
        steps: number of identical steps ≥ 1.
        dim: number of noised coordinates (``None``: any). Every registered profile holds
            in every dimension (Theorems 1 and 3 of ``docs/accounting.md``); a profile
            registered later may use it.
        value_discretization_interval: PLD grid step.

    Returns:
        A dp_accounting ``PrivacyLossDistribution`` with both ADD and REMOVE parts when q < 1.

    Raises:
        ValueError: if the mechanism has no step profile or an argument is out of range.
    """
    profile = STEP_PROFILES[canonical_step_mechanism(mechanism)]
    n = _check_steps(steps)
    single = profile.build(
        noise_multiplier=check_positive(noise_multiplier, name="noise_multiplier"),
        sample_rate=_check_sample_rate(sample_rate),
        dim=_check_dim(dim),
        interval=_check_interval(value_discretization_interval),
    )
    return single.self_compose(n) if n > 1 else single
