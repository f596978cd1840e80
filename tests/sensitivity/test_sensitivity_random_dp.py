"""The random-DP confidence of the sampler, against scipy.stats.binom and Monte Carlo."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest
from scipy import stats

from alm_opacus.sensitivity import (
    gamma_for_confidence,
    marginal_gamma,
    order_for_confidence,
    sampler_confidence,
    sampler_failure_probability,
)


@pytest.mark.parametrize(
    ("m", "order", "gamma"),
    [(1, 1, 0.5), (10, 10, 0.1), (50, 45, 0.05), (200, 200, 0.01), (200, 190, 0.1), (7, 1, 0.3)],
)
def test_matches_binomial_tail(m: int, order: int, gamma: float) -> None:
    conf = sampler_confidence(m=m, order=order, gamma=gamma)
    fail = sampler_failure_probability(m=m, order=order, gamma=gamma)
    assert conf == pytest.approx(stats.binom.cdf(order - 1, m, 1 - gamma), rel=1e-12, abs=1e-300)
    assert fail == pytest.approx(stats.binom.sf(order - 1, m, 1 - gamma), rel=1e-10, abs=1e-300)
    assert conf + fail == pytest.approx(1.0, abs=1e-14)


def test_maximum_has_closed_form() -> None:
    for m, gamma in [(200, 0.05), (200, 0.01), (30, 0.2)]:
        assert sampler_confidence(m=m, order=m, gamma=gamma) == pytest.approx(
            1 - (1 - gamma) ** m, rel=1e-13
        )
    # precision where the confidence is 1 to float64: the failure keeps its digits
    assert sampler_failure_probability(m=2000, order=2000, gamma=0.05) == pytest.approx(
        0.95**2000, rel=1e-10
    )


def _simulate(draw, *, m: int, order: int, reps: int, seed: int):  # type: ignore[no-untyped-def]
    rng = np.random.default_rng(seed)
    sample = np.sort(draw(rng, (reps, m)), axis=1)[:, order - 1]
    fresh = draw(rng, (reps,))
    return sample, fresh


@pytest.mark.parametrize("ties", [False, True], ids=["continuous", "with-ties"])
def test_monte_carlo_confidence_and_marginal_gamma(ties: bool) -> None:
    m, order, gamma, reps = 40, 38, 0.1, 40_000
    if ties:
        # Discrete distances: P(G = 3) = 0.3 straddles the 0.9-quantile, so ties are common.
        values, probs = np.array([0.0, 1.0, 2.0, 3.0]), np.array([0.4, 0.2, 0.1, 0.3])

        def draw(rng, size):  # type: ignore[no-untyped-def]
            return rng.choice(values, size=size, p=probs)

        quantile = 3.0  # smallest t with P(G > t) <= 0.1
    else:

        def draw(rng, size):  # type: ignore[no-untyped-def]
            return rng.exponential(size=size)

        quantile = -math.log(gamma)
    sample, fresh = _simulate(draw, m=m, order=order, reps=reps, seed=11)
    bad = np.mean(sample < quantile)
    exceed = np.mean(fresh > sample)
    fail = sampler_failure_probability(m=m, order=order, gamma=gamma)
    marginal = marginal_gamma(m=m, order=order)
    tol_bad = 5 * math.sqrt(fail * (1 - fail) / reps)
    tol_exceed = 5 * math.sqrt(marginal * (1 - marginal) / reps)
    if ties:  # the bounds hold, not with equality
        assert bad <= fail + tol_bad
        assert exceed <= marginal + tol_exceed
    else:
        assert abs(bad - fail) <= tol_bad
        assert abs(exceed - marginal) <= tol_exceed


def test_inverses() -> None:
    for m, order, conf in [(200, 200, 0.99), (200, 180, 0.95), (50, 40, 0.5), (5, 5, 0.999)]:
        gamma = gamma_for_confidence(m=m, order=order, confidence=conf)
        assert sampler_confidence(m=m, order=order, gamma=gamma) >= conf
        below = gamma * (1 - 1e-9)
        assert sampler_confidence(m=m, order=order, gamma=below) < conf
    for m, gamma, conf in [(200, 0.05, 0.99), (200, 0.1, 0.999), (100, 0.2, 0.9)]:
        k = order_for_confidence(m=m, gamma=gamma, confidence=conf)
        assert sampler_confidence(m=m, order=k, gamma=gamma) >= conf
        assert k == 1 or sampler_confidence(m=m, order=k - 1, gamma=gamma) < conf
    assert marginal_gamma(m=200, order=200) == pytest.approx(1 / 201)


def test_order_for_confidence_explains_too_small_m() -> None:
    # 1 - 0.99^m >= 0.99 needs m >= 459
    with pytest.raises(ValueError, match="need m >= 459"):
        order_for_confidence(m=200, gamma=0.01, confidence=0.99)


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"m": 0, "order": 1, "gamma": 0.1}, "m=0"),
        ({"m": 10, "order": 0, "gamma": 0.1}, "order=0"),
        ({"m": 10, "order": 11, "gamma": 0.1}, "order=11"),
        ({"m": 10, "order": 10, "gamma": 0.0}, "gamma=0.0"),
        ({"m": 10, "order": 10, "gamma": 1.0}, "gamma=1.0"),
        ({"m": 10, "order": 10, "gamma": float("nan")}, "gamma=nan"),
        ({"m": 2.5, "order": 1, "gamma": 0.1}, "m=2.5"),
    ],
)
def test_invalid_arguments(kwargs: dict[str, float], name: str) -> None:
    with pytest.raises(ValueError, match=re.escape(name)):
        sampler_confidence(**kwargs)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=re.escape("confidence=1.5")):
        gamma_for_confidence(m=10, order=10, confidence=1.5)
