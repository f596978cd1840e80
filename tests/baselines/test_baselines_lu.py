"""Lu et al. (2022): the sensitivity chain against their Table 6, and the per-query mechanism."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from scipy import stats
from scipy.special import expit, logsumexp

from alm_opacus.mechanisms import make_generator
from alm_opacus.methods import NoisePolicy, ReleaseRequest, create_method
from baselines import lu
from baselines.lu.net import answer_grid, exact_logits


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


def test_table6_mnist_row_derived_from_eq21():
    # Lu et al. (2022), Table 6, MNIST row, derived from the architecture and hyper-parameters
    # only: |V_0| = 784 inputs in [0, 1] (x_0 = 1), |V_1| = 128 tanh units (x_1 = 1), C = 10,
    # n = 10000 (Table 3), lambda = 0.001 / 2 (Keras L2 0.001 is lambda in 2 lambda ||W||^2,
    # Table 4). The expected values are the printed ones: rho 2.2274, Delta_omega 0.0028,
    # Delta_z_T 0.3577, Delta_p 1.0000 (1.0450).
    chain = lu.paper_chain(n=10_000, input_dim=784, num_classes=10, hidden=128, l2=0.001 / 2)
    # Eq. 21 with T = 2: (C - 1) sqrt(784) sqrt(128) / (C * 128)
    assert chain.rho == pytest.approx(9 * 28 * math.sqrt(128) / 1280, rel=1e-15)
    assert round(chain.rho, 4) == 2.2274
    assert round(chain.delta_omega, 4) == 0.0028
    assert round(chain.delta_z, 4) == 0.3577
    assert chain.delta_p == 1.0  # Corollary 2 caps exp(2 Delta_z) - 1 at 1
    # Their parenthesised value is exp(2 Delta_z_T) - 1 from the printed (rounded) Delta_z_T:
    assert round(math.expm1(2 * round(chain.delta_z, 4)), 4) == 1.0450
    assert chain.delta_p_uncapped == pytest.approx(1.0450, abs=2e-4)  # unrounded: 1.04506


@pytest.mark.parametrize("row", list(lu.TABLE6.values()), ids=lambda r: r.dataset)
def test_table6_rows_derived_from_eq21(row):
    # Every row whose inputs Table 3 gives reproduces from Eq. 21 with x_t = 1 (see
    # lu.TABLE6 for the Purchase rows, which do not).
    chain = lu.paper_chain(n=row.n, input_dim=row.input_dim, num_classes=row.num_classes)
    assert round(chain.rho, 4) == row.rho
    assert round(chain.delta_omega, 4) == row.delta_omega
    assert round(chain.delta_z, 4) == row.delta_z
    assert round(chain.delta_p, 4) == row.delta_p
    assert round(math.expm1(2 * round(chain.delta_z, 4)), 4) == row.delta_p_uncapped


def test_eq21_is_not_a_lipschitz_bound():
    # Their MNIST network (784 -> 128 tanh -> 10) at a point of its own domain: inputs in
    # [0, 1], first layer large enough to saturate every tanh (|h_k| = 1 = x_1), output
    # weights 0. The per-example gradient norm is sqrt(0.9) sqrt(128) = 10.73 > 2.2274.
    rho = lu.eq21_lipschitz(layer_sizes=(784, 128), activation_bounds=(1.0, 1.0), num_classes=10)
    g = torch.Generator().manual_seed(0)
    x = torch.rand(784, generator=g, dtype=torch.float64)
    # sum(x) is about 392, so tanh(w1 @ x) rounds to exactly 1 in float64
    w1 = torch.ones(128, 784, dtype=torch.float64, requires_grad=True)
    w2 = torch.zeros(10, 128, dtype=torch.float64, requires_grad=True)
    loss = torch.nn.functional.cross_entropy((w2 @ torch.tanh(w1 @ x))[None], torch.tensor([3]))
    grads = torch.autograd.grad(loss, [w1, w2])
    norm = float(torch.sqrt(sum(gr.pow(2).sum() for gr in grads)))
    # the W2 part alone is the closed form; the rest is float64 rounding of a 1280-term norm
    assert float(grads[1].norm()) == pytest.approx(
        lu.eq21_counterexample_norm(hidden=128, num_classes=10), rel=1e-12
    )
    assert norm > 4 * rho


def test_compare_chains_gives_both_chains():
    both = lu.compare_chains(n=10_000, input_dim=784, hidden=128, num_classes=10, l2=0.0005)
    assert both.paper == lu.paper_chain(n=10_000, input_dim=784, num_classes=10)
    radius = lu.default_weight_radius(l2=0.0005, num_classes=10)
    rho = lu.lipschitz_bound(hidden=128, weight_radius=radius, clip_radius=1.0)
    assert both.ours == lu.sensitivity_chain(
        lipschitz=rho, n=10_000, l2=0.0005, input_dim=784, hidden=128, num_classes=10
    )
    # ours is sqrt(2 * 128 + B^2 / 8) with B = sqrt(ln 10 / 0.001) = 47.99: 23.32
    assert both.ours.rho == pytest.approx(math.sqrt(256 + math.log(10) / 0.001 / 8), rel=1e-12)
    assert both.ours.rho > both.eq21_counterexample > both.paper.rho
    assert both.output_range == pytest.approx(math.sqrt(256) * radius, rel=1e-12)
    json.dumps(both.to_dict())


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


def test_release_states_none_with_named_gaps_and_total(pixel_features, make_context):
    # C = 10 >= 3: the C - 1 noiseless logits leave no finite epsilon, so no guarantee; the
    # paper's per-query epsilon is what the noise was calibrated to (nominal_epsilon).
    x, y = pixel_features
    ctx = make_context()
    method = create_method("lu", {"queries": 7, "steps": 30, "hidden": 16, "tune": False})
    prepared = method.prepare(features=x[:100], labels=y[:100], seed=0, context=ctx)
    release = method.release(
        prepared,
        ReleaseRequest(
            features=x[:100], labels=y[:100], epsilon=1.0, delta=1e-5, seed=0, draw=0, context=ctx
        ),
    )
    s = release.statement
    assert s.guarantee.value == "none" and s.epsilon == math.inf and s.neighbouring == ""
    assert s.nominal_epsilon == 1.0 and s.delta == 0.0 and s.noise == "secure"
    text = " ".join(s.notes)
    assert "Eq. 18" in text and "noiseless logits" in text and "not proven" in text
    assert "per query epsilon=1" in text and "k=7 queries: epsilon=7" in text
    assert release.info["epsilon_total"] == pytest.approx(7.0)
    proba = release.predict_proba(x[500:520])
    assert proba.shape == (20, 10)
    torch.testing.assert_close(proba.sum(1), torch.ones(20), rtol=0, atol=1e-5)
    # exactly one logit per query is noisy: the other C - 1 probability ratios are exact
    params = prepared.nets[release.chosen_config["l2"]]
    clean = lu.lu_logits(params, x[500:520])[0]
    ratio = torch.log(proba.double()) - clean
    # a probability float32 holds only as a subnormal (the noisy logit near ±100 at this
    # scale) has lost its relative precision: such entries are left out (NaN compares false)
    ratio[proba < torch.finfo(torch.float32).tiny] = math.nan
    spread = (ratio - ratio.nanmedian(1, keepdim=True).values).abs() > 1e-4
    assert bool((spread.sum(1) <= 1).all())


def test_gaussian_statement_states_basic_composition(pixel_features, make_context):
    x, y = pixel_features
    ctx = make_context()
    method = create_method("lu", {"noise": "gaussian", "steps": 10, "hidden": 8, "tune": False})
    prepared = method.prepare(features=x[:60], labels=y[:60], seed=0, context=ctx)
    s = method.release(
        prepared,
        ReleaseRequest(
            features=x[:60], labels=y[:60], epsilon=1.0, delta=1e-5, seed=0, draw=0, context=ctx
        ),
    ).statement
    assert s.guarantee.value == "none" and s.delta == 1e-5 and s.nominal_epsilon > 1.0


def test_binary_release_is_per_query_at_the_proven_epsilon(pixel_features, make_context):
    # C = 2: an answer is sigmoid(d + s_T eta), d = z_1 - z_2, whatever T is; |d| <= sqrt(2H) B
    # on the weight ball, so the Laplace noise at sensitivity 2 sqrt(2H) B proves
    # epsilon = 2 sqrt(2H) B / scale per query for any two data sets.
    x, y = pixel_features
    binary = (y % 2).long()
    ctx = make_context(
        num_classes=2, public_labels=binary[200:500], noise=NoisePolicy(reproducible=True)
    )
    method = create_method("lu", {"steps": 20, "hidden": 16, "tune": False, "queries": 3})
    prepared = method.prepare(features=x[:100], labels=binary[:100], seed=0, context=ctx)
    # a large nominal epsilon keeps the noise scale near 1, so float32 answers keep their
    # log-odds (the proven epsilon is far below it here)
    release = method.release(
        prepared,
        ReleaseRequest(
            features=x[:100],
            labels=binary[:100],
            epsilon=2000.0,
            delta=1e-5,
            seed=0,
            draw=0,
            context=ctx,
        ),
    )
    s = release.statement
    radius = lu.default_weight_radius(l2=0.0005, num_classes=2)
    sensitivity = 2 * math.sqrt(2 * 16) * radius
    assert s.guarantee.value == "per-query" and s.neighbouring == "replace-one"
    # exact on the grid: both neighbours' differences are rounded, so S' = S + gamma
    assert s.grid is not None and s.grid <= s.noise_scale * 2**-7
    assert s.grid_sensitivity == pytest.approx(sensitivity + s.grid, rel=1e-12)
    assert s.epsilon == pytest.approx(s.grid_sensitivity / s.noise_scale, rel=1e-12)
    assert s.epsilon < 2000.0
    assert s.delta == 0.0 and s.noise == "seeded" and "proven per query" in s.notes[0]
    # the answers' log-odds minus the clean difference are Laplace(0, scale), whichever logit
    # was selected (KS on seeded draws, so the check is deterministic)
    params = prepared.nets[release.chosen_config["l2"]]
    queries = x[torch.arange(3000) % 1000 + 500]
    clean = lu.lu_logits(params, queries)[0]
    proba = release.predict_proba(queries).double()
    residual = (torch.log(proba[:, 0]) - torch.log(proba[:, 1])) - (clean[:, 0] - clean[:, 1])
    law = stats.laplace(scale=s.noise_scale)
    assert stats.kstest(residual.numpy(), law.cdf).pvalue > 1e-3


@pytest.mark.parametrize("noise", ["laplace", "gaussian"])
def test_binary_exact_answer_law_does_not_depend_on_the_selected_logit(noise):
    # the same K under T = 0 and T = 1 (same seed): the signed cells are round(d/gamma) + K
    # and round(d/gamma) - K (rounding is odd), so the answer's law is the same for both T
    # (K is symmetric) and the answer is a function of the grid value only
    z = torch.tensor([[[0.3, -1.7], [2.5, 2.5], [-4.0, 1.0]]], dtype=torch.float64)
    scale = 0.8
    grid = answer_grid(scale=scale, noise=noise)
    cells = []
    for t in (0, 1):
        g = torch.Generator().manual_seed(7)
        index = torch.full((1, 3, 1), t, dtype=torch.int64)
        logits = exact_logits(z, index, noise=noise, scale=scale, grid=grid, generator=g)
        assert torch.equal(logits[..., 1], torch.zeros(1, 3, dtype=torch.float64))
        m = logits[..., 0] / grid.gamma
        assert torch.equal(m, torch.round(m))  # on the grid
        cells.append(m)
    difference = torch.round((z[..., 0] - z[..., 1]) / grid.gamma)
    assert torch.equal((cells[0] + cells[1]) / 2, difference)
    assert bool((cells[0] != cells[1]).any())  # K was drawn


def test_float_noise_is_opt_in_and_states_none(pixel_features, make_context):
    x, y = pixel_features
    binary = (y % 2).long()
    ctx = make_context(num_classes=2, public_labels=binary[200:500])
    options = {"steps": 20, "hidden": 16, "tune": False, "exact": False}
    method = create_method("lu", options)
    prepared = method.prepare(features=x[:100], labels=binary[:100], seed=0, context=ctx)
    release = method.release(
        prepared,
        ReleaseRequest(
            features=x[:100],
            labels=binary[:100],
            epsilon=2000.0,
            delta=1e-5,
            seed=0,
            draw=0,
            context=ctx,
        ),
    )
    s = release.statement
    assert s.guarantee.value == "none" and s.epsilon == math.inf and s.grid is None
    assert s.nominal_epsilon is not None and s.nominal_epsilon < 2000.0
    assert "floating-point" in str(s) and "Mironov" in str(s)
    assert create_method("lu").options.exact  # the default is exact


def test_output_range_bounds_every_network_on_the_ball(pixel_features):
    # |z_1 - z_2| <= sqrt(2H) B needs only ||W2||_F <= B (implied by the ball) and sigmoid
    # units, whatever the first layer: random networks stay below it, and the extreme one
    # (every unit saturated at 1, w_1 = -w_2 = B / sqrt(2H) * ones) attains it.
    x, _ = pixel_features
    g = torch.Generator().manual_seed(1)
    hidden, radius = 16, 3.0
    bound = lu.output_range(hidden=hidden, weight_radius=radius)
    worst = 0.0
    for _ in range(200):
        w1 = 10 * torch.randn(1, hidden, 64, generator=g, dtype=torch.float64)
        w2 = torch.randn(1, 2, hidden, generator=g, dtype=torch.float64)
        z = lu.lu_logits({"fc1.weight": w1, "fc2.weight": w2 * radius / w2.norm()}, x[:50])[0]
        worst = max(worst, float((z[:, 0] - z[:, 1]).abs().max()))
    assert worst <= bound
    w1 = torch.full((1, hidden, 64), 1e3, dtype=torch.float64)  # pixels >= 0: h = 1
    row = torch.full((hidden,), radius / math.sqrt(2 * hidden), dtype=torch.float64)
    z = lu.lu_logits({"fc1.weight": w1, "fc2.weight": torch.stack([row, -row])[None]}, x[:5])[0]
    # rounding: a sum of 16 float64 terms, relative error below 1e-14
    assert float((z[:, 0] - z[:, 1]).max()) == pytest.approx(bound, rel=1e-14)


@pytest.mark.parametrize("reproducible", [False, True])
def test_secure_answers_differ_and_seeded_ones_repeat(pixel_features, make_context, reproducible):
    x, y = pixel_features
    ctx = make_context(noise=NoisePolicy(reproducible=reproducible))
    method = create_method("lu", {"steps": 10, "hidden": 8, "tune": False})
    prepared = method.prepare(features=x[:60], labels=y[:60], seed=0, context=ctx)
    answers = [
        method.release(
            prepared,
            ReleaseRequest(
                features=x[:60],
                labels=y[:60],
                epsilon=50.0,
                delta=1e-5,
                seed=0,
                draw=0,
                context=ctx,
            ),
        ).predict_proba(x[500:540])
        for _ in range(2)
    ]
    assert torch.equal(answers[0], answers[1]) == reproducible


def test_secure_categorical_sampler_follows_the_weights():
    # chi-square goodness of fit of 60000 secure draws; fails a correct sampler w.p. 1e-6
    weights = torch.tensor([[0.5, 0.25, 0.125, 0.0625, 0.0625]], dtype=torch.float64)
    draws = lu.sample_categorical(
        weights.expand(60_000, -1), generator=make_generator(secure_mode=True)
    )
    counts = torch.bincount(draws.flatten(), minlength=5).numpy()
    assert stats.chisquare(counts, 60_000 * weights[0].numpy()).pvalue > 1e-6
    zero = torch.tensor([[0.0, 1.0, 0.0]]).expand(500, -1)
    assert bool(
        (lu.sample_categorical(zero, generator=make_generator(secure_mode=True)) == 1).all()
    )


def test_shadow_networks_live_in_the_run_memo(pixel_features, make_context):
    # the clean shadow networks are shared across epsilons through context.memo, and two runs
    # (contexts) share nothing
    x, y = pixel_features
    first, second = make_context(), make_context()
    method = create_method("lu", {"steps": 5, "hidden": 8, "tune": False})
    masks = torch.zeros(3, 120, dtype=torch.bool)
    masks[:, ::2] = True
    for ctx in (first, first):
        prepared = method.prepare(features=x[:60], labels=y[:60], seed=0, context=ctx)
        for epsilon in (1.0, 5.0):
            release = method.release(
                prepared,
                ReleaseRequest(
                    features=x[:60],
                    labels=y[:60],
                    epsilon=epsilon,
                    delta=1e-5,
                    seed=0,
                    draw=0,
                    context=ctx,
                ),
            )
            assert release.attacker is not None
            predict = release.attacker()(x[700:820], y[700:820], masks, 0)
            assert predict(x[:4]).shape == (3, 4, 10)
    assert len(first.memo) == 1 and len(second.memo) == 0


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


def test_bad_options_are_named():
    for options, match in (
        ({"noise": "cauchy"}, "lu.noise='cauchy'"),
        ({"queries": 0}, "queries=0"),
        ({"hidden": 0}, "hidden=0"),
        ({"l2": -1.0}, "l2=-1.0"),
    ):
        with pytest.raises(ValueError, match=match):
            create_method("lu", options)


def test_closed_form_gradient_equals_autograd() -> None:
    """The training step's gradient against autograd of the objective it claims to minimise:
    one evaluation (no trajectory), so float64 agreement to ~1e-12 is what the sums allow."""
    import torch
    from torch.nn import functional as F

    from baselines.lu.net import LuConfig, _gradients, convexified_loss

    g = torch.Generator().manual_seed(0)
    x = torch.randn(30, 7, generator=g, dtype=torch.float64)
    y = torch.randint(0, 4, (30,), generator=g)
    masks = torch.rand(3, 30, generator=g) < 0.7
    w1 = torch.randn(3, 5, 7, generator=g, dtype=torch.float64).requires_grad_(True)
    w2 = torch.randn(3, 4, 5, generator=g, dtype=torch.float64).requires_grad_(True)
    config = LuConfig(hidden=5, alpha=2.0, l2=0.01)
    z = torch.matmul(torch.sigmoid(torch.matmul(x, w1.transpose(-1, -2))), w2.transpose(-1, -2))
    ce = F.cross_entropy(z.transpose(1, 2), y.expand(3, -1), reduction="none")
    reg = w1.pow(2).flatten(1).sum(1) + w2.pow(2).flatten(1).sum(1)
    (convexified_loss(ce, masks, alpha=2.0) + 2 * 0.01 * reg).sum().backward()
    onehot = F.one_hot(y.expand(3, -1), 4).to(torch.float64)
    with torch.no_grad():
        g1, g2 = _gradients(w1, w2, x, onehot, masks, config=config)
    assert torch.allclose(g1, w1.grad, rtol=1e-10, atol=1e-12)
    assert torch.allclose(g2, w2.grad, rtol=1e-10, atol=1e-12)


def test_float32_shadow_nets_follow_the_float64_nets() -> None:
    # The adaptive attacker's shadows train in float32: the same initialisation and the same
    # full-batch Adam, so the weights agree with the float64 run to float32 rounding
    # (measured ~1e-6 on 700 rows), and come back as float64 like the released net's.
    g = torch.Generator().manual_seed(0)
    x = torch.nn.functional.normalize(torch.randn(120, 16, generator=g, dtype=torch.float64), dim=1)
    y = torch.randint(0, 10, (120,), generator=g)
    masks = torch.zeros(3, 120, dtype=torch.bool)
    masks[:, :60] = True
    kwargs = dict(masks=masks, num_classes=10, config=lu.LuConfig(), seed=0)
    wide = lu.train_lu_nets(x, y, **kwargs)
    narrow = lu.train_lu_nets(x, y, dtype=torch.float32, **kwargs)
    for k in wide:
        assert narrow[k].dtype == torch.float64
        torch.testing.assert_close(narrow[k], wide[k], rtol=0, atol=1e-4)
        assert not torch.equal(narrow[k], wide[k])  # float32 arithmetic did run
