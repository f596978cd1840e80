"""Lu et al. (2022): the sensitivity chain against their Table 6, and the per-query mechanism."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy.special import expit, logsumexp

from baselines import lu


def test_table6_mnist_golden_values():
    # Lu, Asghar, Kaafar, Webb & Dickinson (IEEE TIFS 2022), Table 6, MNIST: rho = 2.2274,
    # Delta_omega = 0.0028, Delta_z_T = 0.3577, with lambda = 0.0005 (Keras L2 0.001 / 2),
    # n = 10000, |W| = 128*784 + 128*10 (no biases) and x_t = 1. rho is their printed value:
    # the chain from it (Eq. 18, then the logit bound) must give the other two columns.
    t = lu.TABLE6_MNIST
    chain = lu.sensitivity_chain(
        lipschitz=t["rho"],
        n=int(t["n"]),
        l2=t["l2"],
        input_dim=int(t["input_dim"]),
        hidden=int(t["hidden"]),
        num_classes=int(t["num_classes"]),
        activation_bound=t["x_t"],
    )
    assert chain.num_weights == 128 * 784 + 128 * 10
    assert round(chain.delta_omega, 4) == t["delta_omega"]
    assert round(chain.delta_z, 4) == t["delta_z"]
    # by hand: 2 * 2.2274 / (10000 * 0.0005 * sqrt(101632)) * 128
    assert chain.delta_z == pytest.approx(128 * 4.4548 / (5 * math.sqrt(101632)), rel=1e-12)


def test_budget_split_matches_the_paper():
    lap = lu.budget_split(epsilon=2.1, num_classes=10, noise="laplace")
    assert lap.logit == pytest.approx(2.1 / 21) and lap.delta == 0
    assert lap.logit + lap.selection == pytest.approx(2.1) == lap.per_query
    gau = lu.budget_split(epsilon=2.0, num_classes=10, noise="gaussian", delta=1e-5)
    assert gau.logit == pytest.approx(2.0 / math.sqrt(41))
    assert math.hypot(gau.logit, gau.selection) == pytest.approx(2.0)  # the paper's rule
    assert gau.per_query == pytest.approx(gau.logit + gau.selection) and gau.per_query > 2.0


def test_probability_sensitivity_is_the_supremum():
    # Brute force over C = 2 and C = 4 logits shifted by at most a in every coordinate.
    rng = np.random.default_rng(0)
    a = 0.7
    bound = lu.probability_sensitivity(logit_sensitivity=a)
    assert bound == pytest.approx(expit(a) - expit(-a))
    worst = 0.0
    for c in (2, 4):
        z = rng.normal(scale=2.0, size=(20_000, c))
        shift = rng.choice([-a, a], size=z.shape)
        p, q = (np.exp(v - logsumexp(v, axis=1, keepdims=True)) for v in (z, z + shift))
        worst = max(worst, float(np.abs(p - q).max()))
    assert worst <= bound + 1e-12
    # attained: z = (a, 0) -> (0, a) moves p_1 from expit(a) to expit(-a)
    assert worst > 0.95 * bound


def test_convexified_loss_against_logsumexp():
    losses = torch.tensor([[0.1, 2.0, 0.5, 3.0], [1.0, 1.0, 1.0, 9.0]], dtype=torch.float64)
    masks = torch.tensor([[True, True, True, True], [True, True, True, False]])
    for alpha in (0.01, 1.0, 50.0):
        got = lu.convexified_loss(losses, masks, alpha=alpha)
        ref0 = logsumexp(alpha * losses[0].numpy()) / alpha - math.log(4) / alpha
        assert float(got[0]) == pytest.approx(ref0, rel=1e-12)
        assert float(got[1]) == pytest.approx(1.0, rel=1e-12)  # masked entry ignored
    assert float(lu.convexified_loss(losses, masks, alpha=1e-6)[0]) == pytest.approx(1.4, rel=1e-5)
    assert float(lu.convexified_loss(losses, masks, alpha=200.0)[0]) == pytest.approx(3.0, abs=0.01)


def test_lipschitz_bound_holds_on_the_ball(pixel_features):
    x, y = pixel_features
    hidden, radius, clip = 16, 3.0, 1.0
    rho = lu.lipschitz_bound(hidden=hidden, weight_radius=radius, clip_radius=clip)
    g = torch.Generator().manual_seed(0)
    worst = 0.0
    for _ in range(20):
        w1 = torch.randn(hidden, 64, generator=g, dtype=torch.float64)
        w2 = torch.randn(10, hidden, generator=g, dtype=torch.float64)
        s = radius / torch.sqrt(w1.pow(2).sum() + w2.pow(2).sum())
        w1, w2 = (w1 * s).requires_grad_(), (w2 * s).requires_grad_()
        for i in range(0, 200, 20):
            z = w2 @ torch.sigmoid(w1 @ x[i])
            g1, g2 = torch.autograd.grad(
                torch.nn.functional.cross_entropy(z[None], y[i : i + 1]), [w1, w2]
            )
            worst = max(worst, float(torch.sqrt(g1.pow(2).sum() + g2.pow(2).sum())))
    assert worst <= rho


def test_release_is_per_query_with_named_gaps_and_total(pixel_features, make_context):
    x, y = pixel_features
    ctx = make_context(queries=7, lu_steps=30, lu_hidden=16, tune=False)
    method = lu.LuMethod()
    prepared = method.prepare(features=x[:100], labels=y[:100], seed=0, context=ctx)
    release = method.release(
        prepared,
        features=x[:100],
        labels=y[:100],
        epsilon=1.0,
        delta=1e-5,
        seed=0,
        draw=0,
        context=ctx,
    )
    s = release.statement
    assert s.guarantee.value == "per-query" and s.epsilon == 1.0 and s.delta == 0.0
    text = " ".join(s.notes)
    assert "Eq. 18" in text and "noiseless logits" in text and "not proven" in text
    assert release.info["epsilon_total"] == pytest.approx(7.0)
    proba = release.predict_proba(x[500:520])
    assert proba.shape == (20, 10)
    torch.testing.assert_close(proba.sum(1), torch.ones(20), rtol=0, atol=1e-5)
    # exactly one logit per query is noisy: the other C - 1 probability ratios are exact
    params = prepared.nets[release.info["config"]["l2"]]
    clean = lu._logits(params, x[500:520])[0]
    ratio = torch.log(proba.double()) - clean
    spread = (ratio - ratio.median(1, keepdim=True).values).abs() > 1e-4
    assert bool((spread.sum(1) <= 1).all())


def test_gaussian_statement_states_basic_composition(pixel_features, make_context):
    x, y = pixel_features
    ctx = make_context(lu_noise="gaussian", lu_steps=10, lu_hidden=8, tune=False)
    method = lu.LuMethod()
    prepared = method.prepare(features=x[:60], labels=y[:60], seed=0, context=ctx)
    s = method.release(
        prepared,
        features=x[:60],
        labels=y[:60],
        epsilon=1.0,
        delta=1e-5,
        seed=0,
        draw=0,
        context=ctx,
    ).statement
    assert s.guarantee.value == "per-query" and s.delta == 1e-5 and s.epsilon > 1.0


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda: lu.budget_split(epsilon=1.0, num_classes=10, noise="cauchy"), "noise='cauchy'"),
        (lambda: lu.budget_split(epsilon=0.0, num_classes=10, noise="laplace"), "epsilon=0.0"),
        (lambda: lu.budget_split(epsilon=1.0, num_classes=3, noise="gaussian"), "delta=0.0"),
        (lambda: lu.weight_sensitivity(lipschitz=1, n=0, l2=1, num_weights=1), "n=0"),
        (lambda: lu.weight_sensitivity(lipschitz=1, n=1, l2=-1, num_weights=1), "l2=-1"),
        (lambda: lu.LuConfig(alpha=0.0), "alpha=0.0"),
    ],
)
def test_bad_input_is_named(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_bad_options_are_named(pixel_features, make_context):
    x, y = pixel_features
    for options, match in (
        ({"lu_noise": "cauchy"}, "lu_noise='cauchy'"),
        ({"queries": 0}, "queries=0"),
    ):
        with pytest.raises(ValueError, match=match):
            lu.LuMethod().prepare(
                features=x[:50], labels=y[:50], seed=0, context=make_context(**options)
            )
