"""Privacy profiles against independent references: scipy densities and scipy.integrate."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import integrate, optimize, stats

from alm_opacus.mechanisms import analysis, create_mechanism

SCIPY_NOISE = {
    "alm": stats.logistic,
    "laplace": stats.laplace,
    "gaussian": stats.norm,
}


def hockey_stick_by_quadrature(dist, *, epsilon, scale, sensitivity):
    """∫ max(0, p − e^ε q) for p = dist(0, scale), q = dist(Δ, scale), by scipy.integrate."""
    p, q = dist(loc=0.0, scale=scale), dist(loc=sensitivity, scale=scale)

    def excess(x):
        return max(0.0, p.pdf(x) - math.exp(epsilon) * q.pdf(x))

    # The kink where the density ratio crosses e^ε, found from scipy's log-densities.
    lo, hi = -50.0 * scale, 50.0 * scale + sensitivity
    kink = optimize.brentq(lambda x: p.logpdf(x) - q.logpdf(x) - epsilon, lo, hi, xtol=1e-13)
    opts = {"epsabs": 1e-13, "epsrel": 1e-11, "limit": 400}
    left = integrate.quad(excess, -np.inf, kink, **opts)[0]
    right = integrate.quad(excess, kink, np.inf, **opts)[0]
    return left + right


CASES = [  # (epsilon, scale, sensitivity); epsilon below Δ/scale so δ > 0 for pure mechanisms
    (0.05, 1.0, 1.0),
    (0.5, 1.0, 1.0),
    (1.0, 0.5, 1.0),
    (2.0, 1.0, 3.0),
    (0.3, 2.0, 1.5),
]


@pytest.mark.parametrize("name", ["alm", "laplace", "gaussian", "gaussian-classic"])
@pytest.mark.parametrize(("epsilon", "scale", "sensitivity"), CASES)
def test_delta_matches_numerical_integration(name, epsilon, scale, sensitivity):
    mech = create_mechanism(name)
    dist = SCIPY_NOISE.get(mech.name, stats.norm)
    expected = hockey_stick_by_quadrature(
        dist, epsilon=epsilon, scale=scale, sensitivity=sensitivity
    )
    got = mech.delta(epsilon=epsilon, scale=scale, sensitivity=sensitivity, dim=1)
    assert got == pytest.approx(expected, abs=1e-6)


@pytest.mark.parametrize(("mu", "epsilon"), [(0.1, 0.01), (1.0, 0.5), (1.0, 3.0), (3.0, 1.0)])
def test_gaussian_delta_matches_closed_form(mu, epsilon):
    # δ(ε) = Φ(Δ/2σ − εσ/Δ) − e^ε Φ(−Δ/2σ − εσ/Δ), Balle & Wang (2018), Theorem 8.
    sigma, sens = 2.0, 2.0 * mu
    a, b = sens / (2 * sigma), epsilon * sigma / sens
    expected = stats.norm.cdf(a - b) - math.exp(epsilon) * stats.norm.cdf(-a - b)
    got = analysis.gaussian_delta(epsilon=epsilon, scale=sigma, sensitivity=sens)
    assert got == pytest.approx(expected, rel=1e-10, abs=1e-15)


@pytest.mark.parametrize(("scale", "sensitivity"), [(1.0, 1.0), (0.5, 2.0), (3.0, 0.7)])
def test_logistic_largest_log_density_ratio_is_sensitivity_over_scale(scale, sensitivity):
    x = np.linspace(-60 * scale, 60 * scale + sensitivity, 200_001)
    ratio = stats.logistic.logpdf(x, scale=scale) - stats.logistic.logpdf(
        x, loc=sensitivity, scale=scale
    )
    d = sensitivity / scale
    assert ratio.max() == pytest.approx(d, rel=1e-9)
    assert ratio.min() == pytest.approx(-d, rel=1e-9)
    assert np.all(np.diff(ratio) <= 1e-12)  # monotone in the output
    ours = analysis.logistic_privacy_loss(x, scale=scale, sensitivity=sensitivity)
    np.testing.assert_allclose(ours, ratio, atol=1e-9)
    assert np.all(np.abs(ours) <= d + 1e-12)  # approached in the tails, up to rounding
    mech = create_mechanism("alm")
    assert mech.epsilon(delta=0.0, scale=scale, sensitivity=sensitivity) == pytest.approx(d)


@pytest.mark.parametrize("pure_epsilon", [0.1, 1.0, 5.0])
def test_pure_dp_profile_is_randomized_response(pure_epsilon):
    e0 = pure_epsilon
    p = np.array([math.exp(e0), 1.0]) / (1.0 + math.exp(e0))
    q = p[::-1]
    for eps in np.linspace(0.01, 1.2 * e0, 13):
        expected = np.clip(p - math.exp(eps) * q, 0.0, None).sum()
        got = analysis.pure_dp_delta(epsilon=eps, pure_epsilon=e0)
        assert got == pytest.approx(expected, rel=1e-12, abs=1e-15)


@pytest.mark.parametrize("name", ["alm", "laplace"])
@pytest.mark.parametrize("d", [0.3, 1.0, 4.0])
def test_vector_profile_dominates_scalar_profile(name, d):
    mech = create_mechanism(name)
    for eps in np.linspace(0.01, d, 9):
        scalar = mech.delta(epsilon=eps, scale=1.0, sensitivity=d, dim=1)
        vector = mech.delta(epsilon=eps, scale=1.0, sensitivity=d)
        assert vector >= scalar
        assert vector == analysis.pure_dp_delta(epsilon=eps, pure_epsilon=d)


@pytest.mark.parametrize("name", ["alm", "laplace", "gaussian"])
@pytest.mark.parametrize("dim", [1, None])
@pytest.mark.parametrize("delta", [1e-12, 1e-6, 1e-3, 0.1])
def test_epsilon_is_the_safe_inverse_of_delta(name, dim, delta):
    mech = create_mechanism(name)
    kw = {"scale": 0.8, "sensitivity": 1.3, "dim": dim}
    eps = mech.epsilon(delta=delta, **kw)
    if eps > 0:
        assert mech.delta(epsilon=eps, **kw) <= delta * (1 + 1e-12)
        assert mech.delta(epsilon=eps * (1 - 1e-7), **kw) > delta


@settings(max_examples=60, deadline=None)
@given(
    epsilon=st.floats(0.01, 30.0),
    log10_delta=st.floats(-14.0, -1.0),
    sensitivity=st.floats(1e-3, 1e3),
)
def test_analytic_gaussian_calibrate_then_epsilon_is_identity(epsilon, log10_delta, sensitivity):
    delta = 10.0**log10_delta
    mech = create_mechanism("gaussian")
    sigma = mech.calibrate(epsilon=epsilon, delta=delta, sensitivity=sensitivity)
    assert mech.delta(epsilon=epsilon, scale=sigma, sensitivity=sensitivity) <= delta * (1 + 1e-12)
    # Minimal: a slightly smaller σ violates the target (Balle & Wang 2018, Algorithm 1).
    smaller = sigma * (1 - 1e-9)
    assert mech.delta(epsilon=epsilon, scale=smaller, sensitivity=sensitivity) > delta
    back = mech.epsilon(delta=delta, scale=sigma, sensitivity=sensitivity)
    assert back == pytest.approx(epsilon, rel=1e-9)


@pytest.mark.parametrize("name", ["alm", "logistic", "laplace"])
@pytest.mark.parametrize("dim", [1, None, 1000])
@pytest.mark.parametrize("epsilon", [0.01, 0.7, 8.0])
def test_pure_calibrate_then_epsilon_is_identity(name, dim, epsilon):
    mech = create_mechanism(name)
    scale = mech.calibrate(epsilon=epsilon, delta=0.0, sensitivity=2.5)
    assert scale == pytest.approx(2.5 / epsilon)
    back = mech.epsilon(delta=0.0, scale=scale, sensitivity=2.5, dim=dim)
    assert back == pytest.approx(epsilon, rel=1e-14)


@settings(max_examples=50, deadline=None)
@given(
    epsilon=st.floats(0.01, 5.0),
    small=st.floats(0.05, 1.0),
    large=st.floats(1.0, 8.0),
)
def test_logistic_delta_grows_with_the_shift(epsilon, small, large):
    # Why the scalar profile at Δ covers every shift |Δ'| ≤ Δ (proof in docs/mechanisms.md).
    lo = analysis.logistic_delta(epsilon=epsilon, scale=1.0, sensitivity=small)
    hi = analysis.logistic_delta(epsilon=epsilon, scale=1.0, sensitivity=large)
    assert lo <= hi + 1e-15


def test_logistic_small_delta_keeps_relative_accuracy():
    d, eps = 3.0, 2.999
    expected = hockey_stick_by_quadrature(stats.logistic, epsilon=eps, scale=1.0, sensitivity=d)
    got = analysis.logistic_delta(epsilon=eps, scale=1.0, sensitivity=d)
    assert 0 < expected < 1e-6
    assert got == pytest.approx(expected, rel=1e-5)
    assert analysis.logistic_epsilon(delta=1e-300, scale=1.0, sensitivity=d) <= d


def test_laplace_closed_forms():
    assert analysis.laplace_delta(epsilon=0.5, scale=1.0, sensitivity=1.0) == pytest.approx(
        1 - math.exp(-0.25)
    )
    assert analysis.laplace_epsilon(delta=1 - math.exp(-0.25), scale=1.0, sensitivity=1.0) == (
        pytest.approx(0.5)
    )
    assert analysis.laplace_epsilon(delta=0.9, scale=1.0, sensitivity=1.0) == 0.0
