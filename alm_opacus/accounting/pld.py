"""Privacy-loss distributions (dp_accounting PLDs) of our mechanisms and of DP-SGD steps.

All PLDs are *pessimistic* (dp_accounting's ``pessimistic_estimate=True`` / connect-the-dots
discretisation, Doroshenko et al. 2022): composing them bounds δ(ε) from above, up to
floating-point error. Which PLD a one-shot release gets:

- ``gaussian`` / ``gaussian-classic``: the Gaussian PLD with L2 sensitivity, exact for any
  dimension by rotation invariance.
- ``laplace``: dp_accounting's scalar Laplace PLD, for every dimension: under an L1 bound the
  one-coordinate shift dominates (``docs/accounting.md``, Theorem 1).
- ``alm``: the exact scalar PLD (`LogisticPrivacyLoss`), for every dimension: under an L1
  bound the one-coordinate shift dominates (``docs/accounting.md``, Theorem 3).
- ``alm`` otherwise: the randomized-response PLD of a pure ε₀-DP mechanism, ε₀ = Δ₁/scale,
  which dominates every ε₀-DP mechanism (no proof that one coordinate dominates).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np
from dp_accounting.pld import common, pld_pmf, privacy_loss_mechanism
from dp_accounting.pld import privacy_loss_distribution as pld_lib
from dp_accounting.pld.privacy_loss_distribution import PrivacyLossDistribution
from dp_accounting.pld.privacy_loss_mechanism import AdjacencyType
from scipy import special

from alm_opacus._validation import check_positive, check_sensitivity
from alm_opacus.mechanisms import analysis, create_mechanism
from alm_opacus.mechanisms.analysis import _log_logistic_cdf, _logistic_log_delta
from alm_opacus.mechanisms.base import _check_dim, _load_noise_laws
from alm_opacus.registry import Registry

__all__ = [
    "DEFAULT_VALUE_DISCRETIZATION_INTERVAL",
    "LogisticPrivacyLoss",
    "PrivacyLossDistribution",
    "compose",
    "dpsgd_pld",
    "log_mixture",
    "register_release_pld",
    "release_loss_span",
    "release_pld",
]

DEFAULT_VALUE_DISCRETIZATION_INTERVAL = 1e-4  # dp_accounting's default


def log_mixture(sample_rate: float, loss: float) -> float:
    """ln(1 − q + q·e^loss) without overflow: a loss after Poisson subsampling at rate q."""
    if sample_rate == 1.0:
        return loss
    if loss <= 0.0:
        return math.log1p(sample_rate * math.expm1(loss))
    return float(np.logaddexp(math.log1p(-sample_rate), math.log(sample_rate) + loss))


class LogisticPrivacyLoss(privacy_loss_mechanism.AdditiveNoisePrivacyLoss):
    """Privacy loss of scalar logistic noise, for dp_accounting.

    The loss ln f(x + Δ) − ln f(x) (REMOVE) is decreasing in x with range (−Δ/s, Δ/s), as
    dp_accounting's `AdditiveNoisePrivacyLoss` requires; the noise is symmetric and
    log-concave, so a smaller sensitivity is more private. Poisson subsampling is supported
    through the base class. Tails are always rounded pessimistically.
    """

    def __init__(
        self,
        scale: float,
        sensitivity: float = 1.0,
        sampling_prob: float = 1.0,
        adjacency_type: AdjacencyType = AdjacencyType.REMOVE,
        log_mass_truncation_bound: float = -50.0,
    ) -> None:
        self._scale = check_positive(scale, name="scale")
        self._log_mass_truncation_bound = log_mass_truncation_bound
        super().__init__(check_sensitivity(sensitivity), False, sampling_prob, adjacency_type)

    @property
    def scale(self) -> float:
        """The logistic scale s."""
        return self._scale

    def get_delta_for_epsilon(self, epsilon: Any) -> Any:
        """Hockey-stick divergence; closed form of `analysis.logistic_delta` when unsampled."""
        if self.sampling_prob != 1.0:
            return super().get_delta_for_epsilon(epsilon)
        scalar = np.ndim(epsilon) == 0
        deltas = np.clip(np.exp(_logistic_log_delta(epsilon, self.sensitivity / self._scale)), 0, 1)
        return float(deltas[0]) if scalar else deltas

    def privacy_loss_tail(self) -> privacy_loss_mechanism.TailPrivacyLossDistribution:
        """Cut each tail of mu_upper at mass ≤ exp(log_mass_truncation_bound).

        Mass left of the cut is given the supremum of the loss (pessimistic); mass right of
        it the loss at the cut, which bounds the (decreasing) loss there.
        """
        lower = -self._scale * math.log(2.0 / math.exp(self._log_mass_truncation_bound) - 1.0)
        upper = -lower
        if self.adjacency_type == AdjacencyType.ADD:
            upper += self.sensitivity
        else:
            lower -= self.sensitivity
        return privacy_loss_mechanism.TailPrivacyLossDistribution(
            lower,
            upper,
            {
                self.connect_dots_bounds().epsilon_upper: float(self.mu_upper_cdf(lower)),
                self.privacy_loss(upper): 1.0 - float(self.mu_upper_cdf(upper)),
            },
        )

    def connect_dots_bounds(self) -> privacy_loss_mechanism.ConnectDotsBounds:
        """Range of the loss: ±Δ/s unsampled; its subsampled image otherwise."""
        d, q = self.sensitivity / self._scale, self.sampling_prob
        if q == 1.0:
            return privacy_loss_mechanism.ConnectDotsBounds(epsilon_upper=d, epsilon_lower=-d)
        up, down = log_mixture(q, d), log_mixture(q, -d)
        if self.adjacency_type == AdjacencyType.ADD:
            return privacy_loss_mechanism.ConnectDotsBounds(epsilon_upper=-down, epsilon_lower=-up)
        return privacy_loss_mechanism.ConnectDotsBounds(epsilon_upper=up, epsilon_lower=down)

    def _privacy_loss_without_subsampling_remove(self, x: float) -> float:
        return float(
            analysis.logistic_privacy_loss(
                x + self.sensitivity, scale=self._scale, sensitivity=self.sensitivity
            )
        )

    def _inverse_privacy_loss_without_subsampling_remove(self, privacy_loss: float) -> float:
        d = self.sensitivity / self._scale
        if privacy_loss >= d:
            return -math.inf
        if privacy_loss <= -d:
            return math.inf
        t = float(analysis._logistic_threshold(np.asarray(privacy_loss), d))
        return self._scale * t - self.sensitivity

    def noise_cdf(self, x: Any) -> Any:
        return special.expit(np.divide(x, self._scale))

    def noise_log_cdf(self, x: Any) -> Any:
        return _log_logistic_cdf(np.divide(x, self._scale))

    @classmethod
    def from_privacy_guarantee(
        cls,
        privacy_parameters: common.DifferentialPrivacyParameters,
        sensitivity: float = 1,
        pessimistic_estimate: bool = True,
        sampling_prob: float = 1.0,
        adjacency_type: AdjacencyType = AdjacencyType.REMOVE,
    ) -> LogisticPrivacyLoss:
        """Pure calibration s = Δ / ln(1 + (e^ε − 1)/q); δ is not used."""
        amplified = math.log1p(math.expm1(privacy_parameters.epsilon) / sampling_prob)
        return cls(
            sensitivity / amplified,
            sensitivity=sensitivity,
            sampling_prob=sampling_prob,
            adjacency_type=adjacency_type,
        )


def _check_interval(value_discretization_interval: float) -> float:
    return check_positive(value_discretization_interval, name="value_discretization_interval")


def _connect_dots(
    loss: privacy_loss_mechanism.AdditiveNoisePrivacyLoss, interval: float
) -> pld_pmf.PLDPmf:
    """Pessimistic connect-the-dots PMF (Doroshenko et al. 2022, Algorithm 1)."""
    bounds = loss.connect_dots_bounds()
    assert bounds.epsilon_lower is not None and bounds.epsilon_upper is not None
    lo = math.floor(bounds.epsilon_lower / interval)
    hi = math.ceil(bounds.epsilon_upper / interval)
    deltas = loss.get_delta_for_epsilon(np.arange(lo, hi + 1) * interval)
    return pld_pmf.create_pmf_pessimistic_connect_dots_fixed_gap(interval, lo, hi, deltas)


def _logistic_scalar_pld(
    *, scale: float, sensitivity: float, interval: float
) -> PrivacyLossDistribution:
    # Unsampled: ADD and REMOVE give the same PLD, so one symmetric PMF suffices.
    loss = LogisticPrivacyLoss(scale, sensitivity=sensitivity)
    return PrivacyLossDistribution(_connect_dots(loss, interval))


def _laplace_scalar_pld(
    *, scale: float, sensitivity: float, interval: float
) -> PrivacyLossDistribution:
    return pld_lib.from_laplace_mechanism(
        scale, sensitivity=sensitivity, value_discretization_interval=interval
    )


def _gaussian_pld(
    *, scale: float, sensitivity: float, dim: int | None, interval: float
) -> PrivacyLossDistribution:
    return pld_lib.from_gaussian_mechanism(
        scale, sensitivity=sensitivity, value_discretization_interval=interval
    )


ReleasePLDBuilder = Callable[..., PrivacyLossDistribution]
#: One release's PLD builder by canonical mechanism name: each noise law's
#: (`alm_opacus.noise_laws`), and those of `register_release_pld`.
RELEASE_PLDS: Registry[ReleasePLDBuilder] = Registry("release PLD", load=_load_noise_laws)


def register_release_pld(name: str, builder: ReleasePLDBuilder, *, force: bool = False) -> None:
    """Register ``builder(*, scale, sensitivity, dim, interval) -> PLD`` for a mechanism name.

    Args:
        name: canonical mechanism name (``create_mechanism(name).name``).
        builder: returns a pessimistic PLD of one release.
        force: overwrite an existing registration.

    Raises:
        ValueError: if ``name`` is already registered and ``force`` is false.
    """
    RELEASE_PLDS.add(name, builder, force=force)


#: dp_accounting's Laplace loss evaluates exp(Δ/b) and overflows past ~709; beyond this
#: the randomized-response PLD (valid for every pure-DP mechanism) stands in.
LAPLACE_MAX_PURE_EPSILON = 700.0


def _laplace_pld(
    *, scale: float, sensitivity: float, dim: int | None, interval: float
) -> PrivacyLossDistribution:
    # Every dim: the one-coordinate shift dominates under L1 (docs/accounting.md, Theorem 1).
    if sensitivity / scale > LAPLACE_MAX_PURE_EPSILON:
        pure = common.DifferentialPrivacyParameters(epsilon=sensitivity / scale, delta=0.0)
        return pld_lib.from_privacy_parameters(pure, value_discretization_interval=interval)
    return _laplace_scalar_pld(scale=scale, sensitivity=sensitivity, interval=interval)


def _logistic_pld(
    *, scale: float, sensitivity: float, dim: int | None, interval: float
) -> PrivacyLossDistribution:
    # Every dim: the one-coordinate shift dominates under L1 (docs/accounting.md, Theorem 3).
    return _logistic_scalar_pld(scale=scale, sensitivity=sensitivity, interval=interval)


def release_pld(
    *,
    mechanism: str,
    scale: float,
    sensitivity: float,
    dim: int | None = None,
    value_discretization_interval: float = DEFAULT_VALUE_DISCRETIZATION_INTERVAL,
) -> PrivacyLossDistribution:
    """Pessimistic dp_accounting PLD of one release ``value + noise``.

    Args:
        mechanism: registered mechanism name (aliases accepted).
        scale: noise scale > 0.
        sensitivity: sensitivity in the mechanism's norm, > 0.
        dim: number of released coordinates (``None``: any). Ignored: the scalar PLDs of
            ALM and Laplace hold in every dimension under an L1 bound (Theorems 1 and 3 of
            ``docs/accounting.md``), and the Gaussian's by rotation.
        value_discretization_interval: PLD grid step; smaller is tighter and slower.

    Returns:
        A dp_accounting ``PrivacyLossDistribution``.

    Raises:
        ValueError: if the mechanism is unknown or has no PLD, or an argument is out of range.
    """
    name = create_mechanism(mechanism).name
    if name not in RELEASE_PLDS:
        raise ValueError(f"mechanism={mechanism!r} has no registered PLD")
    return RELEASE_PLDS[name](
        scale=check_positive(scale, name="scale"),
        sensitivity=check_sensitivity(sensitivity),
        dim=_check_dim(dim),
        interval=_check_interval(value_discretization_interval),
    )


def release_loss_span(
    *, mechanism: str, scale: float, sensitivity: float, dim: int | None = None
) -> float:
    """Width of the finite privacy-loss support of one release (sizes the PLD grid).

    A pure ε₀-DP mechanism has its loss in [−ε₀, ε₀] (ε₀ its own ε at δ = 0: Δ/scale for ALM
    and Laplace); a Gaussian release is measured on dp_accounting's truncated support (mass
    e^{-50} cut from each tail).

    Raises:
        ValueError: if the mechanism is unknown or an argument is out of range.
    """
    mech = create_mechanism(mechanism)
    s = check_positive(scale, name="scale")
    sens = check_sensitivity(sensitivity)
    if mech.pure:  # 2·(Δ/s) is the float 2Δ/s: doubling is exact
        return 2.0 * mech.epsilon(delta=0.0, scale=s, sensitivity=sens)
    bounds = privacy_loss_mechanism.GaussianPrivacyLoss(s, sensitivity=sens).connect_dots_bounds()
    assert bounds.epsilon_upper is not None and bounds.epsilon_lower is not None
    return bounds.epsilon_upper - bounds.epsilon_lower


def dpsgd_pld(
    *,
    noise_multiplier: float,
    sample_rate: float,
    steps: int = 1,
    value_discretization_interval: float = DEFAULT_VALUE_DISCRETIZATION_INTERVAL,
) -> PrivacyLossDistribution:
    """Pessimistic PLD of ``steps`` Poisson-subsampled Gaussian steps (DP-SGD, add/remove).

    Sensitivity 1 and noise standard deviation ``noise_multiplier``, as Opacus clips to
    ``max_grad_norm`` and adds ``noise_multiplier * max_grad_norm``. Both the ADD and the
    REMOVE PLDs are kept, and the reported δ is the larger of the two.

    Args:
        noise_multiplier: σ > 0.
        sample_rate: Poisson sampling probability in (0, 1].
        steps: number of identical steps ≥ 1.
        value_discretization_interval: PLD grid step.

    Returns:
        A dp_accounting ``PrivacyLossDistribution``.

    Raises:
        ValueError: if an argument is out of range.
    """
    sigma = check_positive(noise_multiplier, name="noise_multiplier")
    q = _check_sample_rate(sample_rate)
    n = _check_steps(steps)
    single = pld_lib.from_gaussian_mechanism(
        sigma,
        sensitivity=1.0,
        sampling_prob=q,
        value_discretization_interval=_check_interval(value_discretization_interval),
    )
    return single.self_compose(n) if n > 1 else single


def _check_sample_rate(sample_rate: float) -> float:
    q = float(sample_rate)
    if not 0.0 < q <= 1.0:  # also rejects NaN
        raise ValueError(f"sample_rate={sample_rate!r} is invalid: expected a number in (0, 1]")
    return q


def _check_steps(steps: int) -> int:
    if isinstance(steps, bool) or not isinstance(steps, int | np.integer) or steps < 1:
        raise ValueError(f"steps={steps!r} is invalid: expected an integer ≥ 1")
    return int(steps)


def compose(plds: Iterable[PrivacyLossDistribution]) -> PrivacyLossDistribution | None:
    """Compose PLDs (all on the same grid); ``None`` for an empty iterable."""
    out: PrivacyLossDistribution | None = None
    for pld in plds:
        out = pld if out is None else out.compose(pld)
    return out
