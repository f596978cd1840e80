"""The ε-relative PLD grid and the underflow-free ε(δ), δ(ε) readout."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from dp_accounting.pld import privacy_loss_distribution as pld_lib

from alm_opacus.accounting import PipelineAccountant, step_pld
from alm_opacus.accounting.divergence import pld_delta, pld_epsilon
from alm_opacus.accounting.pld_grid import (
    MAX_INTERVAL,
    MIN_INTERVAL,
    interval_for_epsilon,
    interval_for_span,
)


@pytest.mark.parametrize(
    ("sigma", "q", "steps"), [(1.0, 0.01, 200), (0.7, 0.2, 20), (3.0, 1.0, 5), (0.3, 0.5, 10)]
)
def test_readout_equals_dp_accounting_where_it_does_not_underflow(sigma, q, steps):
    pld = pld_lib.from_gaussian_mechanism(
        sigma, sampling_prob=q, value_discretization_interval=1e-3
    ).self_compose(steps)
    for delta in [1e-3, 1e-6, 1e-9]:
        # Same formula. FFT round-off leaves masses of ±1e-17 (summing to about -2e-14 here);
        # we drop the negative ones (pessimistic: more tail mass), dp_accounting keeps them.
        # At δ = 1e-9 that is 2e-5 of δ, which moves ε by ~1e-6 relative, only upwards.
        ours, theirs = pld_epsilon(pld, delta), pld.get_epsilon_for_delta(delta)
        assert theirs * (1 - 1e-12) <= ours <= theirs * (1 + 1e-5)
    for epsilon in [0.1, 1.0, 5.0]:
        ref = pld.get_delta_for_epsilon(epsilon)
        assert pld_delta(pld, epsilon) == pytest.approx(ref, rel=1e-9, abs=1e-18)


def test_readout_is_continuous_where_dp_accounting_snaps_to_the_grid():
    # At ε ≈ 1e4 dp_accounting's Σ p·e^{-L} underflows and its ε(δ) is always a grid point
    # (steps of 0.8192 here); ours falls strictly with σ, off the grid, never above it.
    h = 1e-4 * 2**13
    values = []
    for sigma in np.linspace(0.04807, 0.048071, 5):
        pld = step_pld(
            noise_multiplier=float(sigma),
            sample_rate=0.5,
            steps=60,
            value_discretization_interval=h,
        )
        ours, snapped = pld_epsilon(pld, 1e-5), pld.get_epsilon_for_delta(1e-5)
        assert ours <= snapped + 1e-9
        assert abs(snapped / h - round(snapped / h)) < 1e-6
        values.append(ours)
    assert all(a > b for a, b in itertools.pairwise(values))
    assert all(abs(v / h - round(v / h)) > 1e-3 for v in values)  # off the grid


@pytest.mark.parametrize(
    ("epsilon", "expected"),
    [
        (1.0, 1e-4),
        (1.9, 1e-4),
        (2.0, 2e-4),
        (0.1, 1e-4 / 16),
        (0.001, 1e-4 / 128),
        (1e4, 1e-4 * 2**13),
        (0.0, None),
    ],
)
def test_interval_for_epsilon(epsilon, expected):
    h = interval_for_epsilon(epsilon)
    assert h == (MIN_INTERVAL if expected is None else pytest.approx(expected))
    assert h <= max(1e-4 * epsilon, MIN_INTERVAL)


def test_interval_for_span_caps_points_and_overflow():
    assert 100.0 / interval_for_span(100.0, 1000) <= 1000
    assert interval_for_span(MAX_INTERVAL * 2**22 * 2, 2**22) == math.inf
    assert interval_for_epsilon(1e12) == MAX_INTERVAL < 709  # expm1(h) stays finite


@pytest.mark.parametrize(
    ("sigma", "q", "steps"), [(2.0, 0.001, 5000), (0.9, 0.02, 1000), (0.05, 0.5, 60)]
)
def test_automatic_grid_is_within_its_resolution_of_a_four_times_finer_one(sigma, q, steps):
    # The automatic grid is ≈1e-4·ε; a grid 4× finer moves ε by far less than 0.1%.
    acc = PipelineAccountant()
    acc.history = [(sigma, q, steps)]
    auto = acc.get_epsilon(1e-5)
    finer = acc.get_epsilon(1e-5, value_discretization_interval=interval_for_epsilon(auto) / 4)
    assert finer <= auto <= finer * 1.001


def test_get_delta_inverts_get_epsilon():
    acc = PipelineAccountant()
    acc.history = [(0.06, 0.5, 60)]  # ε in the thousands
    epsilon = acc.get_epsilon(1e-5)
    assert epsilon > 1000
    assert acc.get_delta(epsilon) <= 1e-5 * (1 + 1e-6)
    assert acc.get_delta(epsilon * 0.99) > 1e-5
