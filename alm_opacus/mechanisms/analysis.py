"""Stateless privacy maths of additive noise: privacy profiles and calibrations.

A *privacy profile* is δ(ε) = sup over neighbours of the hockey-stick divergence
H_ε(P‖Q) = ∫ max(0, p − e^ε q). For noise Z added to a query with sensitivity Δ, P is the
law of Z and Q the law of Z + Δ. Every profile here is the exact δ(ε) of that scalar pair;
`docs/mechanisms.md` derives each one and says when it also holds for a vector release.

Kept apart from the stateful mechanism classes, as Opacus keeps ``accountants/analysis``.
Profiles are computed in log space so that small deltas (1e-12 and below) keep their
relative accuracy. Every inversion is rounded to the safe side: a returned epsilon satisfies
δ(epsilon) ≤ delta, and a returned scale satisfies δ(epsilon; scale) ≤ delta.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
from numpy.typing import ArrayLike, NDArray
from scipy import optimize, special

from alm_opacus._validation import check_delta, check_epsilon, check_positive, check_sensitivity

__all__ = [
    "LARGEST_EPSILON",
    "analytic_gaussian_scale",
    "classic_gaussian_scale",
    "gaussian_delta",
    "gaussian_epsilon",
    "laplace_delta",
    "laplace_epsilon",
    "logistic_delta",
    "logistic_epsilon",
    "logistic_privacy_loss",
    "pure_dp_delta",
    "pure_dp_epsilon",
]

FloatArray = NDArray[np.float64]

#: The largest epsilon a run accepts: :func:`analytic_gaussian_scale` brackets σ within
#: e^±100 of the classic σ, which reaches every δ in (0, 1) up to ε ≈ 6.7e86 (δ → 1; 3.4e88
#: at δ = 1e-5); above it no Gaussian scale is found. Far beyond any meaningful budget, and
#: it keeps the largest-to-smallest ratio of a grid finite (TensorBoard's log axis).
LARGEST_EPSILON = 1e86

# ---------------------------------------------------------------------------------------------
# Private, vectorised kernels. Arguments are already validated; ``d`` is the normalised shift.
# ---------------------------------------------------------------------------------------------


def _log_cosh_half(z: FloatArray) -> FloatArray:
    """log(2·cosh(z/2)), overflow-free."""
    return np.logaddexp(z / 2.0, -z / 2.0)


def _log_logistic_cdf(z: FloatArray) -> FloatArray:
    """log F(z) for the standard logistic CDF F(z) = 1 / (1 + e^{-z})."""
    return -np.logaddexp(0.0, -z)


def _logistic_threshold(epsilon: FloatArray, d: float) -> FloatArray:
    """Point t (in units of s) where ln f(t) − ln f(t − d) = epsilon, for |epsilon| < d.

    With f ∝ 1/cosh²(t/2), the equation reads cosh((t−d)/2)/cosh(t/2) = e^{ε/2}, i.e.
    tanh(t/2) = (cosh(d/2) − e^{ε/2})/sinh(d/2). Writing artanh as a log ratio and factoring
    out the exponentials gives this cancellation-free form.
    """
    return (
        (d - epsilon) / 2.0
        + np.log(-np.expm1((epsilon - d) / 2.0))
        - np.log(-np.expm1(-(epsilon + d) / 2.0))
    )


def _logistic_log_delta(epsilon: ArrayLike, d: float) -> FloatArray:
    """log δ(ε) of logistic noise of scale 1 against its shift by d (−inf where δ = 0)."""
    eps = np.atleast_1d(np.asarray(epsilon, dtype=np.float64))
    out = np.full(eps.shape, -np.inf)
    # For ε ≤ −d the loss always exceeds ε, so δ(ε) = 1 − e^ε.
    below = eps <= -d
    out[below] = np.log(-np.expm1(eps[below]))
    inside = (eps < d) & ~below
    if np.any(inside):
        e = eps[inside]
        # The loss is decreasing, so {loss > ε} = {t < t*}: δ = F(t*) − e^ε F(t* − d).
        t = _logistic_threshold(e, d)
        log_fa = _log_logistic_cdf(t)
        ratio = np.minimum(e + _log_logistic_cdf(t - d) - log_fa, 0.0)
        with np.errstate(divide="ignore"):
            out[inside] = log_fa + np.log(-np.expm1(ratio))
    return out


def _gaussian_log_delta(epsilon: ArrayLike, mu: float) -> FloatArray:
    """log δ(ε) of N(0, 1) against N(mu, 1); Balle & Wang (2018), Theorem 8."""
    eps = np.atleast_1d(np.asarray(epsilon, dtype=np.float64))
    log_pa = special.log_ndtr(mu / 2.0 - eps / mu)
    log_pb = special.log_ndtr(-mu / 2.0 - eps / mu)
    ratio = np.minimum(eps + log_pb - log_pa, 0.0)
    with np.errstate(divide="ignore"):
        return np.asarray(log_pa + np.log(-np.expm1(ratio)), dtype=np.float64)


def _laplace_log_delta(epsilon: ArrayLike, d: float) -> FloatArray:
    """log δ(ε) = log(1 − e^{(ε−d)/2}) for ε < d, else −inf (derivation in the docs)."""
    eps = np.atleast_1d(np.asarray(epsilon, dtype=np.float64))
    with np.errstate(divide="ignore", invalid="ignore"):
        inside = np.log(-np.expm1(np.minimum(eps - d, 0.0) / 2.0))
    return np.where(eps < d, inside, -np.inf)


def _pure_log_delta(epsilon: ArrayLike, pure_epsilon: float) -> FloatArray:
    """log δ(ε) of the randomized-response pair that dominates every ε₀-DP mechanism.

    δ(ε) = (e^{ε₀} − e^{ε})/(1 + e^{ε₀}) for ε < ε₀, else 0 (Kairouz, Oh & Viswanath 2015).
    """
    eps = np.atleast_1d(np.asarray(epsilon, dtype=np.float64))
    with np.errstate(divide="ignore", invalid="ignore"):
        inside = np.log(-np.expm1(np.minimum(eps - pure_epsilon, 0.0))) - np.logaddexp(
            0.0, -pure_epsilon
        )
    return np.where(eps < pure_epsilon, inside, -np.inf)


def _first_below(
    log_delta: Callable[[float], float], log_target: float, lo: float, hi: float
) -> float:
    """Root of a non-increasing ``log_delta`` on [lo, hi], rounded up to the safe side.

    Requires log_delta(lo) > log_target ≥ log_delta(hi), with both finite. Returns x with
    log_delta(x) ≤ log_target, within ~1e-12 relative of the exact root.
    """
    root = float(
        optimize.brentq(
            lambda x: log_delta(x) - log_target, lo, hi, xtol=1e-300, rtol=1e-14, maxiter=500
        )
    )
    return _round_up(log_delta, log_target, root, hi)


def _round_up(log_delta: Callable[[float], float], log_target: float, x: float, hi: float) -> float:
    """Increase x (at most to hi) until log_delta(x) ≤ log_target, by doubling steps."""
    step = 1e-13 * abs(x) or 1e-300
    while log_delta(x) > log_target and x < hi:
        x = min(hi, x + step)
        step *= 2.0
    return x


def _scalar(log_delta: FloatArray) -> float:
    return float(np.exp(log_delta[0]))


# ---------------------------------------------------------------------------------------------
# Logistic (ALM): Yang, Gohari & Topcu, Theorem 4.1 and Remark 4.1.
# ---------------------------------------------------------------------------------------------


def logistic_privacy_loss(x: ArrayLike, *, scale: float, sensitivity: float) -> FloatArray:
    """Privacy loss ln f_s(x) − ln f_s(x − Δ) of logistic noise against its shift by Δ.

    f_s(x) = e^{−x/s} / (s·(1 + e^{−x/s})²). The loss is decreasing in x, with range
    (−Δ/s, Δ/s): the mechanism is pure (Δ/s)-DP (ALM paper, Theorem 4.1, Remark 4.1).

    Args:
        x: output value(s) of the mechanism on the first dataset.
        scale: logistic scale s > 0.
        sensitivity: shift Δ > 0 between the two output distributions.

    Returns:
        The privacy loss at each x, as a float64 array of x's shape.

    Raises:
        ValueError: if ``scale`` or ``sensitivity`` is not a finite positive number.
    """
    s = check_positive(scale, name="scale")
    d = check_sensitivity(sensitivity) / s
    z = np.asarray(x, dtype=np.float64) / s
    # f ∝ cosh(z/2)^-2, so the loss is 2·[ln cosh((z − d)/2) − ln cosh(z/2)].
    return np.asarray(2.0 * (_log_cosh_half(z - d) - _log_cosh_half(z)), dtype=np.float64)


def logistic_delta(*, epsilon: float, scale: float, sensitivity: float) -> float:
    """Exact δ(ε) of scalar logistic noise of scale s against its shift by Δ.

    δ(ε) = F(t*) − e^ε F(t* − Δ/s), with F the standard logistic CDF and t* the root of
    the (decreasing) privacy loss at ε; δ(ε) = 0 for ε ≥ Δ/s.

    Args:
        epsilon: ε > 0.
        scale: logistic scale s > 0.
        sensitivity: Δ > 0.

    Returns:
        δ(ε) in [0, 1).

    Raises:
        ValueError: if an argument is NaN, infinite or non-positive.
    """
    eps = check_epsilon(epsilon)
    d = check_sensitivity(sensitivity) / check_positive(scale, name="scale")
    return _scalar(_logistic_log_delta(eps, d))


def logistic_epsilon(*, delta: float, scale: float, sensitivity: float) -> float:
    """Smallest ε ≥ 0 with δ(ε) ≤ delta for scalar logistic noise (inverse of `logistic_delta`).

    Args:
        delta: target δ in [0, 1); δ = 0 gives the pure bound Δ/s.
        scale: logistic scale s > 0.
        sensitivity: Δ > 0.

    Returns:
        ε in [0, Δ/s], rounded up so that δ(ε) ≤ delta.

    Raises:
        ValueError: if an argument is out of range.
    """
    target = check_delta(delta)
    d = check_sensitivity(sensitivity) / check_positive(scale, name="scale")
    if target == 0.0:
        return d
    log_target = math.log(target)

    def log_delta(e: float) -> float:
        return float(_logistic_log_delta(e, d)[0])

    if log_delta(0.0) <= log_target:
        return 0.0
    # δ(ε) reaches 0 only at ε = d; find a finite bracket end just below it.
    for k in range(1, 60):
        hi = d * (1.0 - 2.0**-k)
        value = log_delta(hi)
        if not math.isfinite(value):
            break
        if value <= log_target:
            return _first_below(log_delta, log_target, 0.0, hi)
    return d  # delta is below what float64 resolves near d: the pure bound is the answer.


# ---------------------------------------------------------------------------------------------
# Laplace.
# ---------------------------------------------------------------------------------------------


def laplace_delta(*, epsilon: float, scale: float, sensitivity: float) -> float:
    """Exact δ(ε) = max(0, 1 − e^{(ε − Δ/b)/2}) of scalar Laplace noise of scale b.

    Args:
        epsilon: ε > 0.
        scale: Laplace scale b > 0.
        sensitivity: Δ > 0.

    Returns:
        δ(ε) in [0, 1).

    Raises:
        ValueError: if an argument is NaN, infinite or non-positive.
    """
    eps = check_epsilon(epsilon)
    d = check_sensitivity(sensitivity) / check_positive(scale, name="scale")
    return _scalar(_laplace_log_delta(eps, d))


def laplace_epsilon(*, delta: float, scale: float, sensitivity: float) -> float:
    """Smallest ε ≥ 0 with δ(ε) ≤ delta for scalar Laplace noise: max(0, Δ/b + 2·ln(1 − δ)).

    Args:
        delta: target δ in [0, 1).
        scale: Laplace scale b > 0.
        sensitivity: Δ > 0.

    Returns:
        ε in [0, Δ/b].

    Raises:
        ValueError: if an argument is out of range.
    """
    target = check_delta(delta)
    d = check_sensitivity(sensitivity) / check_positive(scale, name="scale")
    if target == 0.0:
        return d
    closed_form = max(0.0, d + 2.0 * math.log1p(-target))
    return _round_up(lambda e: float(_laplace_log_delta(e, d)[0]), math.log(target), closed_form, d)


# ---------------------------------------------------------------------------------------------
# Any pure ε₀-DP mechanism (randomized-response dominating pair).
# ---------------------------------------------------------------------------------------------


def pure_dp_delta(*, epsilon: float, pure_epsilon: float) -> float:
    """δ(ε) = max(0, (e^{ε₀} − e^{ε})/(1 + e^{ε₀})), valid for every ε₀-DP mechanism.

    Randomized response with P = (e^{ε₀}, 1)/(1 + e^{ε₀}) and Q its reverse dominates every
    pure ε₀-DP pair (Kairouz, Oh & Viswanath 2015), so its profile bounds them all; it is
    attained by randomized response itself, so no tighter bound holds in general.

    Args:
        epsilon: ε > 0 at which to evaluate the profile.
        pure_epsilon: the mechanism's pure-DP parameter ε₀ > 0.

    Returns:
        δ(ε) in [0, 1).

    Raises:
        ValueError: if an argument is NaN, infinite or non-positive.
    """
    eps = check_epsilon(epsilon)
    eps0 = check_epsilon(pure_epsilon, name="pure_epsilon")
    return _scalar(_pure_log_delta(eps, eps0))


def pure_dp_epsilon(*, delta: float, pure_epsilon: float) -> float:
    """Smallest ε ≥ 0 with `pure_dp_delta` ≤ delta: max(0, ε₀ + ln(1 − δ(1 + e^{−ε₀}))).

    Args:
        delta: target δ in [0, 1).
        pure_epsilon: the mechanism's pure-DP parameter ε₀ > 0.

    Returns:
        ε in [0, ε₀].

    Raises:
        ValueError: if an argument is out of range.
    """
    target = check_delta(delta)
    eps0 = check_epsilon(pure_epsilon, name="pure_epsilon")
    if target == 0.0:
        return eps0
    inner = target * (1.0 + math.exp(-eps0))
    closed_form = 0.0 if inner >= 1.0 else max(0.0, eps0 + math.log1p(-inner))
    return _round_up(
        lambda e: float(_pure_log_delta(e, eps0)[0]), math.log(target), closed_form, eps0
    )


# ---------------------------------------------------------------------------------------------
# Gaussian: Balle & Wang (2018), Theorem 8 and Algorithm 1; Dwork & Roth (2014), Theorem A.1.
# ---------------------------------------------------------------------------------------------


def gaussian_delta(*, epsilon: float, scale: float, sensitivity: float) -> float:
    """Exact δ(ε) = Φ(Δ/2σ − εσ/Δ) − e^ε Φ(−Δ/2σ − εσ/Δ) (Balle & Wang 2018, Theorem 8).

    By rotation invariance this is also exact for a vector release with L2 sensitivity Δ.

    Args:
        epsilon: ε > 0.
        scale: standard deviation σ > 0.
        sensitivity: Δ (L2) > 0.

    Returns:
        δ(ε) in [0, 1).

    Raises:
        ValueError: if an argument is NaN, infinite or non-positive.
    """
    eps = check_epsilon(epsilon)
    mu = check_sensitivity(sensitivity) / check_positive(scale, name="scale")
    return _scalar(_gaussian_log_delta(eps, mu))


def gaussian_epsilon(*, delta: float, scale: float, sensitivity: float) -> float:
    """Smallest ε ≥ 0 with δ(ε) ≤ delta for the Gaussian mechanism (inverse of Theorem 8).

    Args:
        delta: target δ in (0, 1); the Gaussian mechanism has no finite ε at δ = 0.
        scale: standard deviation σ > 0.
        sensitivity: Δ (L2) > 0.

    Returns:
        ε ≥ 0, rounded up so that δ(ε) ≤ delta.

    Raises:
        ValueError: if an argument is out of range, including delta = 0.
    """
    target = check_delta(delta, allow_zero=False)
    mu = check_sensitivity(sensitivity) / check_positive(scale, name="scale")
    log_target = math.log(target)

    def log_delta(e: float) -> float:
        return float(_gaussian_log_delta(e, mu)[0])

    if log_delta(0.0) <= log_target:
        return 0.0
    hi = 1.0
    while log_delta(hi) > log_target:
        hi *= 2.0
        if hi > 1e300:  # Δ/σ so large that no float epsilon suffices
            return math.inf
    return _first_below(log_delta, log_target, 0.0, hi)


def analytic_gaussian_scale(*, epsilon: float, delta: float, sensitivity: float) -> float:
    """Smallest σ for which Gaussian noise is (ε, δ)-DP: the analytic Gaussian mechanism.

    Balle & Wang (2018) characterise (ε, δ)-DP exactly (Theorem 8) and solve for σ
    (Algorithm 1). We solve the same monotone equation δ(ε; σ) = delta directly with Brent's
    method in σ, then round σ up. Valid for every ε > 0.

    Args:
        epsilon: ε > 0.
        delta: δ in (0, 1).
        sensitivity: Δ (L2) > 0.

    Returns:
        σ with δ(ε; σ) ≤ delta, within ~1e-12 relative of the smallest such σ.

    Raises:
        ValueError: if an argument is out of range, including delta = 0.
    """
    eps = check_epsilon(epsilon)
    target = check_delta(delta, allow_zero=False)
    sens = check_sensitivity(sensitivity)
    log_target = math.log(target)

    def log_delta(log_sigma: float) -> float:
        return float(_gaussian_log_delta(eps, sens / math.exp(log_sigma))[0])

    # δ is decreasing in σ; bracket log σ around the classic value, then solve.
    lo = hi = math.log(math.sqrt(2.0 * math.log(1.25 / target)) * sens / eps)
    for _ in range(100):
        if log_delta(lo) > log_target:
            break
        lo -= 1.0
    for _ in range(100):
        if log_delta(hi) <= log_target:
            break
        hi += 1.0
    if not log_delta(lo) > log_target >= log_delta(hi):
        raise ValueError(
            f"epsilon={epsilon!r}, delta={delta!r}, sensitivity={sensitivity!r}: "
            "no Gaussian scale within floating-point range meets this target"
        )
    return math.exp(_first_below(log_delta, log_target, lo, hi))


def classic_gaussian_scale(*, epsilon: float, delta: float, sensitivity: float) -> float:
    """Textbook σ = sqrt(2·ln(1.25/δ))·Δ/ε (Dwork & Roth 2014, Theorem A.1).

    The theorem proves (ε, δ)-DP only for ε < 1. For ε ≥ 1 this still returns the formula's
    value, and the δ it actually achieves is `gaussian_delta` at that σ, which can exceed δ.

    Args:
        epsilon: ε > 0.
        delta: δ in (0, 1).
        sensitivity: Δ (L2) > 0.

    Returns:
        The textbook σ.

    Raises:
        ValueError: if an argument is out of range, including delta = 0.
    """
    eps = check_epsilon(epsilon)
    target = check_delta(delta, allow_zero=False)
    sens = check_sensitivity(sensitivity)
    return math.sqrt(2.0 * math.log(1.25 / target)) * sens / eps
