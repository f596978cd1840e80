"""Output perturbation (Chaudhuri et al. 2011): the L2-Laplace noise law and the release."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy import stats

from alm_opacus.mechanisms import create_mechanism, make_generator
from alm_opacus.methods import ReleaseRequest, create_method
from baselines import dperm
from baselines.dperm import L2LaplaceNoise


def _rng(kind: str):  # type: ignore[no-untyped-def]
    return np.random.default_rng(2024) if kind == "numpy" else make_generator(secure_mode=True)


@pytest.mark.parametrize("kind", ["numpy", "secure"])
@pytest.mark.parametrize(("dim", "scale"), [(1, 0.5), (7, 2.0), (650, 0.01)])
def test_noise_norm_follows_gamma(dim, scale, kind):
    # density of b proportional to exp(-||b|| / scale)  =>  ||b|| ~ Gamma(dim, scale).
    # The secure draws are not seeded: the p-value is uniform under the null, so a correct
    # sampler fails the secure cases with probability 1e-6 each (the seeded ones never).
    rng = _rng(kind)
    norms = np.array(
        [np.linalg.norm(L2LaplaceNoise.sample(dim, scale=scale, rng=rng)) for _ in range(4000)]
    )
    alpha = 1e-3 if kind == "numpy" else 1e-6
    assert stats.kstest(norms, stats.gamma(a=dim, scale=scale).cdf).pvalue > alpha


@pytest.mark.parametrize("kind", ["numpy", "secure"])
@pytest.mark.parametrize("dim", [3, 50])
def test_noise_direction_is_uniform(dim, kind):
    # For u uniform on the sphere S^{dim-1}, u_1^2 ~ Beta(1/2, (dim-1)/2), and E u = 0.
    # Secure draws: each KS check fails a correct sampler with probability 1e-6. A coordinate
    # has variance 1/dim, so the mean bound 5/sqrt(4000) is 5 sqrt(dim) >= 8.6 standard errors.
    rng = _rng(kind)
    draws = np.stack([L2LaplaceNoise.sample(dim, scale=1.0, rng=rng) for _ in range(4000)])
    u = draws / np.linalg.norm(draws, axis=1, keepdims=True)
    law = stats.beta(0.5, (dim - 1) / 2)
    alpha = 1e-3 if kind == "numpy" else 1e-6
    assert stats.kstest(u[:, 0] ** 2, law.cdf).pvalue > alpha
    assert stats.kstest(u[:, -1] ** 2, law.cdf).pvalue > alpha
    assert np.abs(u.mean(0)).max() < 5 / math.sqrt(4000)


def test_privacy_loss_is_bounded_by_epsilon():
    # log nu(b) - log nu(b - v) = (||b - v|| - ||b||) / scale <= ||v|| / scale = epsilon
    rng = np.random.default_rng(1)
    epsilon, sensitivity, dim = 0.8, 0.3, 20
    scale = L2LaplaceNoise.calibrate(epsilon=epsilon, sensitivity=sensitivity)
    assert L2LaplaceNoise.epsilon(scale=scale, sensitivity=sensitivity) == pytest.approx(epsilon)
    b = np.stack([L2LaplaceNoise.sample(dim, scale=scale, rng=rng) for _ in range(2000)])
    v = rng.normal(size=(2000, dim))
    v *= sensitivity / np.linalg.norm(v, axis=1, keepdims=True)
    loss = (np.linalg.norm(b - v, axis=1) - np.linalg.norm(b, axis=1)) / scale
    assert loss.max() <= epsilon + 1e-12


@pytest.mark.parametrize(("dim", "kind"), [(5, "seeded"), (64, "seeded"), (64, "secure")])
def test_exact_noise_norm_follows_gamma(dim, kind):
    # s sqrt(V) G with V ~ chi^2_{P+1} has density proportional to exp(-||b||/s), so the
    # noise norm is Gamma(P, s); on the grid it moves by at most sqrt(P) gamma / 2 (far below
    # the KS resolution here). The floor is lowered so that the pure mixture is tested.
    plan = dperm.exact_plan(epsilon=1.0, sensitivity=1.0, dim=dim)
    plan = dperm.ExactL2Plan(release=plan.release, floor=1e-300)
    g = make_generator(seed=3) if kind == "seeded" else make_generator(secure_mode=True)
    clean = {"w": torch.full((3000, dim), 0.25, dtype=torch.float64)}
    released = dperm.perturb_exact(clean, plan=plan, generator=g)["w"]
    cells = released / plan.release.grid.gamma
    assert torch.equal(cells, torch.round(cells))  # every shipped value is on the grid
    norms = (released - 0.25).norm(dim=1).numpy()
    law = stats.gamma(a=dim, scale=plan.release.scale)
    assert stats.kstest(norms, law.cdf).pvalue > 1e-6


def test_exact_plan_floor_is_the_gaussian_at_floor_delta():
    # every mixture component has sigma >= floor, an (epsilon, FLOOR_DELTA) Gaussian at Delta'
    plan = dperm.exact_plan(epsilon=0.5, sensitivity=2.0, dim=650)
    rp = plan.release
    assert rp.sensitivity == pytest.approx(2.0 + math.sqrt(650) * rp.grid.gamma, rel=1e-12)
    assert rp.sensitivity <= 2.0 * (1 + 2**-7) and rp.scale == rp.sensitivity / 0.5
    gauss = create_mechanism("gaussian")
    achieved = gauss.delta(epsilon=0.5, scale=plan.floor, sensitivity=rp.sensitivity)
    assert achieved == pytest.approx(dperm.FLOOR_DELTA, rel=1e-3)
    # the floor binds only far below the mixture's bulk: s sqrt(V), V ~ chi^2_651
    assert stats.chi2(651).cdf((plan.floor / rp.scale) ** 2) < 1e-100


def test_float_noise_is_opt_in_and_states_none(pixel_features, make_context):
    x, y = pixel_features
    ctx = make_context()
    method = create_method("dperm", {"exact": False, "tune": False})
    prepared = method.prepare(features=x[:150], labels=y[:150], seed=0, context=ctx)
    release = method.release(
        prepared,
        ReleaseRequest(
            features=x[:150], labels=y[:150], epsilon=2.0, delta=1e-5, seed=0, draw=0, context=ctx
        ),
    )
    s = release.statement
    assert s.guarantee.value == "none" and s.epsilon == math.inf and s.nominal_epsilon == 2.0
    assert s.grid is None and "floating-point" in str(s) and "Mironov" in str(s)
    assert create_method("dperm").options.exact  # the default is exact


def test_release_is_exact_approx_dp_with_analytic_l2_sensitivity(pixel_features, make_context):
    x, y = pixel_features
    ctx = make_context()
    method = create_method("dperm")
    prepared = method.prepare(features=x[:150], labels=y[:150], seed=0, context=ctx)
    release = method.release(
        prepared,
        ReleaseRequest(
            features=x[:150], labels=y[:150], epsilon=2.0, delta=1e-5, seed=0, draw=0, context=ctx
        ),
    )
    s = release.statement
    assert s.guarantee.value == "approx-dp" and s.epsilon == 2.0
    assert s.delta == dperm.FLOOR_DELTA == s.delta_spent
    assert s.sensitivity is not None
    assert (s.sensitivity.norm, s.sensitivity.source.value) == ("l2", "analytic")
    # calibrated to Delta' = Delta + sqrt(P) gamma, within 2^-7 of Delta
    assert s.grid is not None and s.grid_sensitivity is not None
    assert s.grid_sensitivity == pytest.approx(s.sensitivity.value + math.sqrt(650) * s.grid)
    assert s.grid_sensitivity <= s.sensitivity.value * (1 + 2**-7)
    assert s.noise_scale == pytest.approx(s.grid_sensitivity / 2.0)
    l2 = release.chosen_config["l2"]
    assert l2 in [c["l2"] for c in dperm.TUNING_GRID]
    assert len(release.info["tuning"]["tried"]) == len(dperm.TUNING_GRID)
    # the released head is the clean convex head plus noise of the stated scale
    clean = prepared.fits[l2].params
    noise = torch.cat(
        [(release.module.state_dict()[k] - clean[k][0]).flatten() for k in sorted(clean)]
    )
    assert noise.numel() == 10 * 65 == release.info["num_params"]
    shipped = torch.cat([release.module.state_dict()[k].flatten() for k in sorted(clean)])
    assert torch.equal(shipped / s.grid, torch.round(shipped / s.grid))
    assert float(noise.norm()) > 0
    # Chaudhuri et al. 2011, Cor. 8 with L = sqrt(2 (R^2 + 1)), R = 1: 2L / (n lambda)
    assert s.sensitivity.value == pytest.approx(4 / (150 * l2), rel=1e-6)
    assert s.neighbouring == "replace-one" and s.noise == "secure"
    # E ||b||^2 = P (P + 1) scale^2 spread over P coordinates
    assert release.noise_std == pytest.approx(math.sqrt(651) * s.noise_scale, rel=1e-12)


def test_shadow_trainer_shape_and_draws_differ(pixel_features, make_context):
    x, y = pixel_features
    ctx = make_context()
    method = create_method("dperm", {"l2": 1.0})
    prepared = method.prepare(features=x[:100], labels=y[:100], seed=0, context=ctx)
    r0, r1 = (
        method.release(
            prepared,
            ReleaseRequest(
                features=x[:100],
                labels=y[:100],
                epsilon=5.0,
                delta=1e-5,
                seed=0,
                draw=d,
                context=ctx,
            ),
        )
        for d in (0, 1)
    )
    assert not torch.equal(r0.predict_proba(x[600:610]), r1.predict_proba(x[600:610]))
    assert r0.attacker is not None
    trainer = r0.attacker()
    masks = torch.zeros(4, 120, dtype=torch.bool)
    masks[:, ::2] = True
    predict = trainer(x[700:820], y[700:820], masks, 0)
    assert predict(x[:5]).shape == (4, 5, 10)


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda: L2LaplaceNoise.sample(0, scale=1.0, rng=np.random.default_rng()), "dim=0"),
        (lambda: L2LaplaceNoise.sample(3, scale=0.0, rng=np.random.default_rng()), "scale=0.0"),
        (lambda: L2LaplaceNoise.calibrate(epsilon=math.nan, sensitivity=1.0), "epsilon=nan"),
        (lambda: L2LaplaceNoise.calibrate(epsilon=1.0, sensitivity=-2.0), "sensitivity=-2.0"),
    ],
)
def test_bad_input_is_named(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_a_release_states_what_it_spent_whatever_ran_before(pixel_features, make_context):
    """Each cell is an alternative release of the member fit: its statement cannot depend on
    which cells ran before it in the same process (a Ray worker runs some, the driver others;
    issue 20 found dperm's running sum differing between the two)."""
    x, y = pixel_features
    ctx = make_context()
    method = create_method("dperm")

    def statements(order: tuple[float, ...]) -> dict[float, object]:
        prepared = method.prepare(features=x[:150], labels=y[:150], seed=0, context=ctx)
        out = {}
        for epsilon in order:
            release = method.release(
                prepared,
                ReleaseRequest(
                    features=x[:150],
                    labels=y[:150],
                    epsilon=epsilon,
                    delta=1e-5,
                    seed=0,
                    draw=0,
                    context=ctx,
                ),
            )
            out[epsilon] = release.statement
        return out

    forward, backward = statements((1.0, 0.5, 1.0)), statements((0.5, 1.0))
    for epsilon in (0.5, 1.0):
        a, b = forward[epsilon], backward[epsilon]
        assert (a.epsilon_spent, a.delta_spent) == (b.epsilon_spent, b.delta_spent)
        # one approx-DP release composed alone: its own (epsilon, delta)
        assert (a.epsilon_spent, a.delta_spent) == (epsilon, dperm.FLOOR_DELTA)
        assert a.guarantee_spent is a.guarantee
