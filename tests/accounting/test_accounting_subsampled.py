"""Poisson-subsampled DP-SGD steps (alm, laplace, gaussian) against independent references."""

from __future__ import annotations

import math

import numpy as np
import pytest
from dp_accounting import dp_event
from dp_accounting.pld import PLDAccountant
from dp_accounting.pld import privacy_loss_distribution as pld_lib
from dp_accounting.pld.privacy_loss_distribution import (
    _create_pld_pmf_from_monotone_privacy_loss,
)
from dp_accounting.pld.privacy_loss_mechanism import AdjacencyType
from scipy import integrate, stats

from alm_opacus.accounting import (
    LogisticPrivacyLoss,
    PipelineAccountant,
    pure_subsampled_delta,
    release_pld,
    step_pld,
)
from alm_opacus.accounting.subsampled import pure_step_pld, step_loss_span
from alm_opacus.mechanisms import analysis


def laplace_accountant(*, sigma, q, steps, dim):
    acc = PipelineAccountant()
    acc.step(noise_multiplier=sigma, sample_rate=q, mechanism="laplace", dim=dim, num_steps=steps)
    return acc


@pytest.mark.parametrize(("sigma", "q", "steps"), [(2.0, 0.05, 200), (8.0, 0.01, 1000)])
@pytest.mark.parametrize("dim", [1, None])
def test_laplace_dpsgd_agrees_with_dp_accounting_poisson_laplace_event(sigma, q, steps, dim):
    # dp_accounting's own route: PoissonSampledDpEvent(LaplaceDpEvent) through its
    # PLDAccountant at its default grid 1e-4. Both are pessimistic PLDs of the same pair
    # on different grids; 1% is the bar and far above either grid's error.
    ref = PLDAccountant()
    ref.compose(
        dp_event.SelfComposedDpEvent(
            dp_event.PoissonSampledDpEvent(q, dp_event.LaplaceDpEvent(sigma)), steps
        )
    )
    acc = laplace_accountant(sigma=sigma, q=q, steps=steps, dim=dim)
    for delta in [1e-5, 1e-7]:
        assert acc.get_epsilon(delta) == pytest.approx(ref.get_epsilon(delta), rel=0.01)


def mixture_densities(*, scale, q, adjacency):
    f = stats.logistic(scale=scale)
    mixed = lambda x: (1 - q) * f.pdf(x) + q * f.pdf(x + 1.0)  # noqa: E731  (shift = clip)
    if adjacency == "remove":
        return mixed, f.pdf
    return f.pdf, mixed


@pytest.mark.slow
@pytest.mark.parametrize("adjacency", ["remove", "add"])
@pytest.mark.parametrize(("sigma", "q"), [(0.7, 0.25), (2.0, 0.6)])
def test_one_logistic_step_matches_integrated_mixture(adjacency, sigma, q):
    # Reference: the hockey-stick integral of the subsampled mixture against the plain
    # logistic law, by quadrature (abs error ~1e-12). Connect-the-dots keeps δ exact at
    # grid points (Doroshenko et al. 2022), so at grid epsilons only quadrature error and
    # float rounding remain: 1e-8.
    h = 1e-4
    pld = step_pld(
        mechanism="alm",
        noise_multiplier=sigma,
        sample_rate=q,
        dim=1,
        value_discretization_interval=h,
    )
    upper, lower = mixture_densities(scale=sigma, q=q, adjacency=adjacency)
    pmf = pld._pmf_remove if adjacency == "remove" else pld._pmf_add
    for k in [0, 700, 3000]:
        eps = k * h
        exact = integrate.quad(
            lambda x, e=eps: max(0.0, upper(x) - math.exp(e) * lower(x)),
            -np.inf,
            np.inf,
            epsabs=1e-13,
            limit=500,
        )[0]
        assert pmf.get_delta_for_epsilon(eps) == pytest.approx(exact, abs=1e-8)


@pytest.mark.parametrize(("sigma", "q", "steps"), [(1.0, 0.1, 50), (3.0, 0.02, 400)])
def test_logistic_steps_compose_as_dp_accounting_does_by_hand(sigma, q, steps):
    # By hand: dp_accounting's own discretiser on the logistic loss, both directions,
    # then its self_compose. Same grid, same pessimistic rounding: equal to float rounding.
    h = 1e-4

    def pmf(adjacency):
        loss = LogisticPrivacyLoss(sigma, sampling_prob=q, adjacency_type=adjacency)
        return _create_pld_pmf_from_monotone_privacy_loss(
            loss, value_discretization_interval=h, use_connect_dots=True
        )

    by_hand = pld_lib.PrivacyLossDistribution(
        pmf(AdjacencyType.REMOVE), pmf(AdjacencyType.ADD)
    ).self_compose(steps)
    acc = PipelineAccountant()
    for _ in range(steps):
        acc.step(noise_multiplier=sigma, sample_rate=q, mechanism="logistic", dim=1)
    assert acc.noise_steps == [
        {
            "mechanism": "alm",
            "noise_multiplier": sigma,
            "sample_rate": q,
            "num_steps": steps,
            "dim": 1,
        }
    ]
    for delta in [1e-4, 1e-6]:
        expected = by_hand.get_epsilon_for_delta(delta)
        assert acc.get_epsilon(delta, value_discretization_interval=h) == pytest.approx(
            expected, rel=1e-9
        )
        # The automatic grid (≈1e-4·ε) answers within 0.5% of the fixed one.
        assert acc.get_epsilon(delta) == pytest.approx(expected, rel=5e-3)


def brute_force_pure_delta(*, epsilon, eps0, q, direction):
    """Hockey-stick of subsampled randomized response, from the two laws themselves."""
    p = math.exp(eps0) / (1 + math.exp(eps0))
    a, b = np.array([p, 1 - p]), np.array([1 - p, p])
    mixed = (1 - q) * b + q * a
    upper, lower = (mixed, b) if direction == "remove" else (b, mixed)
    return float(np.sum(np.maximum(0.0, upper - math.exp(epsilon) * lower)))


def closed_form_pure_delta(*, epsilon, eps0, q, direction):
    """docs/accounting.md, Theorem 2 (ε ≥ 0)."""
    x = math.exp(eps0)
    if direction == "remove":
        return max(0.0, 1 + q * (x - 1) - math.exp(epsilon)) / (1 + x)
    return max(0.0, 1 - math.exp(epsilon) * (1 - q * (1 - 1 / x))) * x / (1 + x)


@pytest.mark.parametrize("direction", ["remove", "add"])
@pytest.mark.parametrize(("eps0", "q"), [(0.5, 1.0), (2.0, 0.1), (8.0, 0.01)])
def test_pure_subsampled_pair_matches_closed_form_and_brute_force(direction, eps0, q):
    for epsilon in [0.0, 0.01, 0.1, 0.5, 1.0, 3.0]:
        brute = brute_force_pure_delta(epsilon=epsilon, eps0=eps0, q=q, direction=direction)
        closed = closed_form_pure_delta(epsilon=epsilon, eps0=eps0, q=q, direction=direction)
        ours = pure_subsampled_delta(
            epsilon=epsilon, pure_epsilon=eps0, sample_rate=q, direction=direction
        )
        assert ours == pytest.approx(brute, rel=1e-12, abs=1e-15)
        assert ours == pytest.approx(closed, rel=1e-12, abs=1e-15)


@pytest.mark.parametrize(("sigma", "q"), [(0.5, 0.1), (2.0, 1.0), (0.01, 0.5)])
def test_pure_step_is_the_pure_pair_on_the_grid(sigma, q):
    h = 1e-4
    pld = pure_step_pld(noise_multiplier=sigma, sample_rate=q, value_discretization_interval=h)
    for epsilon in [0.0, 0.05, 0.3, 1.0]:
        exact = max(
            pure_subsampled_delta(
                epsilon=epsilon, pure_epsilon=1 / sigma, sample_rate=q, direction=d
            )
            for d in ("remove", "add")
        )
        got = pld.get_delta_for_epsilon(epsilon)
        # Connect-the-dots: exact at grid points (these ε are), never below in between.
        assert got == pytest.approx(exact, rel=1e-9, abs=1e-15)
        between = epsilon + 0.37 * h
        exact_between = max(
            pure_subsampled_delta(
                epsilon=between, pure_epsilon=1 / sigma, sample_rate=q, direction=d
            )
            for d in ("remove", "add")
        )
        assert exact_between * (1 - 1e-9) <= pld.get_delta_for_epsilon(between) <= got


@pytest.mark.parametrize(("sigma", "q"), [(0.8, 0.2), (2.0, 1.0)])
def test_scalar_logistic_step_is_below_the_pure_pair(sigma, q):
    # The scalar mechanism is (1/σ)-DP, so the pure pair must dominate it.
    h = 1e-4
    scalar = step_pld(
        mechanism="alm",
        noise_multiplier=sigma,
        sample_rate=q,
        dim=1,
        value_discretization_interval=h,
    )
    pure = pure_step_pld(noise_multiplier=sigma, sample_rate=q, value_discretization_interval=h)
    vector = step_pld(
        mechanism="alm", noise_multiplier=sigma, sample_rate=q, value_discretization_interval=h
    )
    for epsilon in np.linspace(0, 1 / sigma, 9):
        # Theorem 3: any dimension gets the scalar profile, which Theorem 2's pure pair bounds
        assert vector.get_delta_for_epsilon(epsilon) == scalar.get_delta_for_epsilon(epsilon)
        assert scalar.get_delta_for_epsilon(epsilon) <= pure.get_delta_for_epsilon(epsilon)


def two_laplace_closed_form(a, b, epsilon):
    """δ(ε ≥ 0) of Laplace(0,1)² against the shift (a, b): docs/accounting.md, Theorem 1."""
    k = math.exp(-epsilon)
    if k <= math.exp(-(a + b)):
        return 0.0
    c = 1 + min(a, b) / 2 if k >= math.exp(-abs(a - b)) else 1 + (math.log(k) + a + b) / 4
    return math.exp(epsilon) * (k - math.sqrt(k) * math.exp(-(a + b) / 2) * c)


@pytest.mark.parametrize(("a", "b"), [(1.0, 0.5), (0.3, 0.3), (2.0, 1.0), (0.2, 1.5)])
def test_two_laplace_coordinates_match_the_proof_and_stay_below_one(a, b):
    # The proof's closed form against dp_accounting composing the two scalar PLDs (grid
    # 1e-5: connect-the-dots error ~1e-10 here), then the theorem's claim itself.
    h = 1e-5
    two = pld_lib.from_laplace_mechanism(1.0, sensitivity=a, value_discretization_interval=h)
    two = two.compose(
        pld_lib.from_laplace_mechanism(1.0, sensitivity=b, value_discretization_interval=h)
    )
    for epsilon in np.linspace(0.0, 0.99 * (a + b), 8):
        closed = two_laplace_closed_form(a, b, epsilon)
        assert two.get_delta_for_epsilon(epsilon) == pytest.approx(closed, abs=1e-8)
        assert closed <= 1 - math.exp((epsilon - a - b) / 2)  # one coordinate shifted by a + b


@pytest.mark.slow
@pytest.mark.parametrize("shift", [(0.5, 0.5), (0.8, 0.2)])
def test_subsampled_two_dimensional_laplace_is_dominated_by_the_scalar_step(shift):
    # Direct 2-D integration of the subsampled mixtures (no PLD, no proof used):
    # midpoint sum on a 0.02 grid over [-20, 20]², truncated mass < 1e-8; the kinks of
    # the Laplace density cost ~4e-4 in δ, so 2e-3 covers the grid error.
    q, sigma, cell = 0.5, 1.0, 0.02
    x = np.arange(-20, 20, cell) + cell / 2
    f = lambda t: stats.laplace.pdf(t, scale=sigma)  # noqa: E731
    base_x, base_y = f(x), f(x)
    shift_x, shift_y = f(x + shift[0]), f(x + shift[1])
    p0 = np.outer(base_x, base_y)
    mixed = (1 - q) * p0 + q * np.outer(shift_x, shift_y)
    scalar = step_pld(
        mechanism="laplace",
        noise_multiplier=sigma,
        sample_rate=q,
        dim=1,
        value_discretization_interval=1e-5,
    )
    for epsilon in [0.0, 0.1, 0.3, 0.6]:
        for upper, lower in [(mixed, p0), (p0, mixed)]:
            two_d = float(np.sum(np.maximum(0.0, upper - math.exp(epsilon) * lower))) * cell**2
            assert two_d <= scalar.get_delta_for_epsilon(epsilon) + 2e-3


@pytest.mark.parametrize("t", [0.1, 1.0, 5.0])
def test_the_logistic_likelihood_ratio_has_the_lemmas_law(t):
    # docs/accounting.md, Theorem 3, Lemma: with U = expit(X) uniform, W_t = f(X − t)/f(X)
    # equals e^{-t}(1 − (1 − e^{-t})U)^{-2}; the identity pointwise, then its hockey-stick
    # E[(W − e^ε)+] in closed form against the logistic profile.
    u = np.linspace(1e-6, 1 - 1e-6, 1001)
    x = np.log(u) - np.log1p(-u)
    ratio = np.exp(stats.logistic.logpdf(x - t) - stats.logistic.logpdf(x))
    kappa = -math.expm1(-t)
    np.testing.assert_allclose(ratio, math.exp(-t) / (1 - kappa * u) ** 2, rtol=1e-9)
    for epsilon in np.linspace(-0.9 * t, 0.9 * t, 7):
        gamma = math.exp(epsilon)
        low = max(1.0, gamma * math.exp(t))  # Y = e^t W has density y^{-3/2}/(2 kappa)

        def antiderivative(y, gamma=gamma):
            return math.exp(-t) * math.sqrt(y) + gamma / math.sqrt(y)

        closed = (antiderivative(math.exp(2 * t)) - antiderivative(low)) / kappa
        if epsilon > 0:
            expected = analysis.logistic_delta(epsilon=epsilon, scale=1.0, sensitivity=t)
            assert closed == pytest.approx(expected, rel=1e-9, abs=1e-15)
        else:  # the same hockey-stick, computed by quadrature
            quad = integrate.quad(
                lambda z, g=gamma: max(0.0, stats.logistic.pdf(z - t) - g * stats.logistic.pdf(z)),
                -60,
                60 + t,
                points=[t / 2],
                epsabs=1e-13,
                limit=200,
            )[0]
            assert closed == pytest.approx(quad, rel=1e-7)


def two_logistic_delta(a, b, epsilon):
    """δ(ε) of logistic noise on two coordinates shifted by (a, b), from the proof of
    Theorem 3: log W + a + b has density ∝ e^{-z/2}·m(z) on [0, 2(a + b)], m the
    convolution of the indicators of [0, 2a] and [0, 2b]."""
    s, gamma = a + b, math.exp(epsilon)
    norm = 4 * -math.expm1(-a) * -math.expm1(-b)

    def m(z):
        return max(0.0, min(z, 2 * a, 2 * b, 2 * s - z))

    def integrand(z):
        return max(0.0, math.exp(z - s) - gamma) * math.exp(-z / 2) * m(z) / norm

    return integrate.quad(
        integrand, 0, 2 * s, points=[2 * min(a, b), 2 * max(a, b)], epsabs=1e-14, limit=200
    )[0]


@pytest.mark.parametrize(("a", "b"), [(1.0, 0.5), (0.3, 0.3), (2.0, 1.0), (0.2, 1.5)])
def test_two_logistic_coordinates_match_the_proof_and_stay_below_one(a, b):
    # The proof's law against dp_accounting composing two scalar logistic PLDs (grid 1e-5),
    # then the theorem's claim: one coordinate shifted by a + b is worse at every ε.
    h = 1e-5
    two = release_pld(
        mechanism="alm", scale=1.0, sensitivity=a, dim=1, value_discretization_interval=h
    )
    two = two.compose(
        release_pld(
            mechanism="alm", scale=1.0, sensitivity=b, dim=1, value_discretization_interval=h
        )
    )
    for epsilon in np.linspace(0.01, 0.99, 8) * (a + b):
        proof = two_logistic_delta(a, b, epsilon)
        assert two.get_delta_for_epsilon(epsilon) == pytest.approx(proof, abs=1e-7)
        one = analysis.logistic_delta(epsilon=epsilon, scale=1.0, sensitivity=a + b)
        assert proof <= one


@pytest.mark.slow
@pytest.mark.parametrize("shift", [(0.5, 0.5), (0.8, 0.2)])
def test_subsampled_two_dimensional_logistic_is_dominated_by_the_scalar_step(shift):
    # Direct 2-D integration of the subsampled mixtures (no PLD, no proof used): midpoint
    # sum on a 0.02 grid over [-25, 25]² (truncated mass < 1e-10; the smooth logistic
    # density makes the grid error ~1e-5 here), against the scalar step's PLD.
    q, sigma, cell = 0.5, 1.0, 0.02
    x = np.arange(-25, 25, cell) + cell / 2
    f = lambda t: stats.logistic.pdf(t, scale=sigma)  # noqa: E731
    p0 = np.outer(f(x), f(x))
    mixed = (1 - q) * p0 + q * np.outer(f(x + shift[0]), f(x + shift[1]))
    scalar = step_pld(
        mechanism="alm",
        noise_multiplier=sigma,
        sample_rate=q,
        dim=1,
        value_discretization_interval=1e-5,
    )
    for epsilon in [0.0, 0.1, 0.3, 0.45]:
        for upper, lower in [(mixed, p0), (p0, mixed)]:
            two_d = float(np.sum(np.maximum(0.0, upper - math.exp(epsilon) * lower))) * cell**2
            assert two_d <= scalar.get_delta_for_epsilon(epsilon) + 1e-4


@pytest.mark.parametrize("mechanism", ["gaussian", "alm", "laplace"])
def test_step_loss_span_bounds_the_pld_support(mechanism):
    h = 1e-3
    pld = step_pld(
        mechanism=mechanism, noise_multiplier=0.7, sample_rate=0.3, value_discretization_interval=h
    )
    span = step_loss_span(mechanism=mechanism, noise_multiplier=0.7, sample_rate=0.3)
    for pmf in (pld._pmf_remove, pld._pmf_add):
        dense = pmf.to_dense_pmf()
        assert (dense.size - 1) * h <= span + 2 * h  # rounding adds at most a cell per end


def test_step_pld_errors():
    with pytest.raises(ValueError, match="mechanism='gaussian-classic' has no DP-SGD step"):
        step_pld(mechanism="gaussian-classic", noise_multiplier=1.0, sample_rate=0.1)
    with pytest.raises(ValueError, match="noise_multiplier=0"):
        step_pld(mechanism="alm", noise_multiplier=0, sample_rate=0.1)
    with pytest.raises(ValueError, match="direction='both'"):
        pure_subsampled_delta(epsilon=1.0, pure_epsilon=1.0, sample_rate=0.1, direction="both")


@pytest.mark.parametrize(("mechanism", "dim"), [("alm", 1), ("alm", None), ("laplace", None)])
def test_tiny_noise_multipliers_stay_finite_and_ordered(mechanism, dim):
    # ε₀ = 1/σ up to 1000 (> 709, where exp overflows): the PLDs are built in log space,
    # and the pure bound n·ln(1 + q(e^{ε₀} − 1)) caps ε(δ) from above.
    previous = math.inf
    for sigma in [0.001, 0.01, 0.1]:
        acc = PipelineAccountant()
        acc.step(
            noise_multiplier=sigma, sample_rate=0.5, mechanism=mechanism, dim=dim, num_steps=60
        )
        epsilon, pure = acc.get_epsilon(1e-5), acc.get_epsilon(0.0)
        assert 0 < epsilon <= pure * (1 + 1e-9) and epsilon < previous
        assert pure == pytest.approx(60 * (math.log(0.5) + 1 / sigma), rel=1e-3)
        previous = epsilon


def test_many_nearly_silent_pure_steps_do_not_drift_on_a_coarse_grid():
    # 5000 steps at ε₀ = 1e-6 on a grid 6.4e-3: rounding each loss up to the grid would add
    # ~h/2 per step (ε ≈ 16); connect-the-dots keeps Σp·e^{−L} and δ at grid points exact.
    # The pure bound, 5000·ln(1 + q(e^{1e-6} − 1)) = 2e-5, caps the true ε.
    pld = pure_step_pld(
        noise_multiplier=1e6, sample_rate=0.004, steps=5000, value_discretization_interval=6.4e-3
    )
    assert pld.get_epsilon_for_delta(1e-5) <= 6.4e-3
    logistic = step_pld(
        mechanism="alm",
        noise_multiplier=1e6,
        sample_rate=0.004,
        steps=5000,
        value_discretization_interval=6.4e-3,
    )
    assert logistic.get_epsilon_for_delta(1e-5) <= 6.4e-3
    exact = pure_subsampled_delta(
        epsilon=0.0, pure_epsilon=1e-6, sample_rate=0.004, direction="remove"
    )
    one = pure_step_pld(
        noise_multiplier=1e6, sample_rate=0.004, value_discretization_interval=6.4e-3
    )
    assert one.get_delta_for_epsilon(0.0) == pytest.approx(exact, rel=1e-6)


def test_a_replaced_step_profile_is_never_answered_from_the_entry_cache():
    # The accountant caches each entry's PLD; replacing the profile of "alm" (as
    # scripts/logistic_accounting.py does) must give the new profile's PLD at once, and
    # restoring it the old one, with no cache to clear by hand.
    from alm_opacus.accounting.entries import Entry, entry_pld
    from alm_opacus.accounting.subsampled import (
        PURE_STEP_PROFILE,
        STEP_PROFILES,
        register_step_profile,
    )

    entry = Entry("step", "alm", 2.0, 1.0, 0.05, 10, None)
    logistic = STEP_PROFILES["alm"]
    before = entry_pld(entry, 1e-3).get_delta_for_epsilon(0.1)
    try:
        register_step_profile("alm", PURE_STEP_PROFILE, force=True)
        replaced = entry_pld(entry, 1e-3).get_delta_for_epsilon(0.1)
        pure = pure_step_pld(
            noise_multiplier=2.0, sample_rate=0.05, steps=10, value_discretization_interval=1e-3
        )
    finally:
        register_step_profile("alm", logistic, force=True)
    assert replaced == pytest.approx(pure.get_delta_for_epsilon(0.1), rel=1e-12)
    assert replaced > before  # the pure pair bounds the scalar logistic step from above
    assert entry_pld(entry, 1e-3).get_delta_for_epsilon(0.1) == before
