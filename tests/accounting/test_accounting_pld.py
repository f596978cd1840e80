"""PLDs of single releases against closed forms, integration and dp_accounting."""

from __future__ import annotations

import math

import numpy as np
import pytest
from dp_accounting.pld import common
from dp_accounting.pld import privacy_loss_distribution as pld_lib
from dp_accounting.pld.privacy_loss_mechanism import AdjacencyType
from scipy import integrate, stats

from alm_opacus.accounting import LogisticPrivacyLoss, dpsgd_pld, release_pld
from alm_opacus.mechanisms import analysis


def logistic_pld_from_cdf(*, scale, sensitivity, interval):
    """Independent reference: the PLD's CDF from scipy's logistic, via dp_accounting."""
    p = stats.logistic(scale=scale)
    q = stats.logistic(loc=sensitivity, scale=scale)
    d = sensitivity / scale
    k = np.arange(math.floor(-d / interval) - 2, math.ceil(d / interval) + 3)
    losses = k * interval
    # Vectorised bisection for x with ln p(x)/q(x) = loss (the loss decreases in x).
    lo = np.full(losses.shape, -60.0 * scale - 1.0)
    hi = np.full(losses.shape, 60.0 * scale + sensitivity + 1.0)
    for _ in range(200):
        mid = (lo + hi) / 2
        above = p.logpdf(mid) - q.logpdf(mid) > losses
        lo, hi = np.where(above, mid, lo), np.where(above, hi, mid)
    values = np.where(losses >= d, 1.0, np.where(losses <= -d, 0.0, p.sf(lo)))
    table = dict(zip(k.tolist(), values.tolist(), strict=True))

    def cdf(loss):  # P_{x~p}[ln p(x)/q(x) ≤ loss]
        key = round(loss / interval)
        return table.get(key, 1.0 if key > 0 else 0.0)

    return pld_lib.create_from_cdf(cdf, value_discretization_interval=interval)


@pytest.mark.parametrize(("scale", "sensitivity"), [(1.0, 1.0), (0.5, 1.5)])
def test_scalar_logistic_pld_matches_closed_form_and_reference(scale, sensitivity):
    h = 1e-3
    ours = release_pld(
        mechanism="alm",
        scale=scale,
        sensitivity=sensitivity,
        dim=1,
        value_discretization_interval=h,
    )
    ref = logistic_pld_from_cdf(scale=scale, sensitivity=sensitivity, interval=h)
    d = sensitivity / scale
    for eps in np.linspace(0.05, 0.95 * d, 7):
        exact = analysis.logistic_delta(epsilon=eps, scale=scale, sensitivity=sensitivity)
        got = ours.get_delta_for_epsilon(eps)
        assert got >= exact * (1 - 1e-12)  # pessimistic
        assert got == pytest.approx(exact, rel=1e-2, abs=1e-6)
        assert got == pytest.approx(ref.get_delta_for_epsilon(eps), rel=2e-2, abs=1e-6)
    assert ours.get_epsilon_for_delta(0.0) == pytest.approx(d, abs=2 * h)


@pytest.mark.parametrize("adjacency", [AdjacencyType.REMOVE, AdjacencyType.ADD])
@pytest.mark.parametrize("q", [0.2, 1.0])
def test_logistic_privacy_loss_hockey_stick_by_integration(adjacency, q):
    s, sens = 1.5, 2.0
    f = stats.logistic(scale=s)
    if adjacency == AdjacencyType.REMOVE:
        upper = lambda x: (1 - q) * f.pdf(x) + q * f.pdf(x + sens)  # noqa: E731
        lower = f.pdf
    else:
        upper = f.pdf
        lower = lambda x: (1 - q) * f.pdf(x) + q * f.pdf(x - sens)  # noqa: E731
    loss = LogisticPrivacyLoss(s, sensitivity=sens, sampling_prob=q, adjacency_type=adjacency)
    for eps in [0.05, 0.3, 0.6]:
        expected = integrate.quad(
            lambda x, e=eps: max(0.0, upper(x) - math.exp(e) * lower(x)),
            -np.inf,
            np.inf,
            epsabs=1e-12,
            limit=400,
            points=None,
        )[0]
        assert loss.get_delta_for_epsilon(eps) == pytest.approx(expected, abs=1e-7)


def test_logistic_privacy_buckets_path_is_pessimistic():
    from dp_accounting.pld.privacy_loss_distribution import (
        _create_pld_pmf_from_monotone_privacy_loss,
    )

    loss = LogisticPrivacyLoss(1.0, sensitivity=1.0)
    pmf = _create_pld_pmf_from_monotone_privacy_loss(
        loss, value_discretization_interval=1e-3, use_connect_dots=False
    )
    for eps in [0.1, 0.5, 0.9]:
        exact = analysis.logistic_delta(epsilon=eps, scale=1.0, sensitivity=1.0)
        assert exact * (1 - 1e-9) <= pmf.get_delta_for_epsilon(eps) <= exact + 5e-3


def test_from_privacy_guarantee_is_pure_calibration():
    params = common.DifferentialPrivacyParameters(epsilon=0.5, delta=0.0)
    assert LogisticPrivacyLoss.from_privacy_guarantee(params, sensitivity=2.0).scale == 4.0


@pytest.mark.parametrize("dim", [None, 1, 7])
def test_logistic_release_uses_the_scalar_profile_in_every_dimension(dim):
    # docs/accounting.md, Theorem 3 (before it, a vector got randomized response's profile)
    ours = release_pld(mechanism="alm", scale=2.0, sensitivity=1.0, dim=dim)
    for eps in [0.1, 0.3, 0.45]:
        exact = analysis.logistic_delta(epsilon=eps, scale=2.0, sensitivity=1.0)
        assert exact <= ours.get_delta_for_epsilon(eps) == pytest.approx(exact, rel=1e-3)
        assert exact < analysis.pure_dp_delta(epsilon=eps, pure_epsilon=0.5)


@pytest.mark.parametrize("dim", [None, 1, 7])
def test_laplace_release_uses_the_scalar_profile_in_every_dimension(dim):
    # docs/accounting.md, Theorem 1: under an L1 bound the one-coordinate shift dominates.
    ours = release_pld(mechanism="laplace", scale=2.0, sensitivity=1.0, dim=dim)
    for eps in [0.1, 0.3, 0.45]:
        exact = analysis.laplace_delta(epsilon=eps, scale=2.0, sensitivity=1.0)
        assert exact <= ours.get_delta_for_epsilon(eps) == pytest.approx(exact, rel=1e-3)


def test_gaussian_release_matches_exact_profile():
    ours = release_pld(mechanism="gaussian", scale=2.0, sensitivity=1.5, dim=10_000)
    for eps in [0.1, 0.5, 1.5]:
        exact = analysis.gaussian_delta(epsilon=eps, scale=2.0, sensitivity=1.5)
        assert exact <= ours.get_delta_for_epsilon(eps) == pytest.approx(exact, rel=1e-3)


def test_release_pld_errors():
    with pytest.raises(ValueError, match="mechanism='nope' is unknown"):
        release_pld(mechanism="nope", scale=1.0, sensitivity=1.0)
    with pytest.raises(ValueError, match="scale="):
        release_pld(mechanism="alm", scale=-1.0, sensitivity=1.0)
    with pytest.raises(ValueError, match="value_discretization_interval="):
        release_pld(mechanism="alm", scale=1.0, sensitivity=1.0, value_discretization_interval=0)
    with pytest.raises(ValueError, match="sample_rate="):
        dpsgd_pld(noise_multiplier=1.0, sample_rate=1.5)
    with pytest.raises(ValueError, match="steps="):
        dpsgd_pld(noise_multiplier=1.0, sample_rate=0.5, steps=0)
