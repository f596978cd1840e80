"""``dpsgd-alm`` and ``dpsgd-laplace``: registration, the alm_pld accountant's sigma and check,
the statement, L1 clipping with the mechanism's noise, and where the randomness comes from."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

import baselines
from alm_opacus.accounting import PipelineAccountant, find_noise_multiplier
from alm_opacus.heads import HeadConfig
from alm_opacus.methods import (
    MethodContext,
    NoisePolicy,
    Release,
    ReleaseRequest,
    create_method,
    default_methods,
    method_class,
    method_options,
)
from alm_opacus.run.cli import parse_config
from alm_opacus.run.harness import plan_run
from baselines.dpsgd import (
    ALM_TRAINING,
    TUNING_GRID,
    DPSGDConfig,
    DPSGDMethod,
    SigmaCache,
    dpsgd_linear_heads,
    init_params,
    run_opacus,
    train_dpsgd_head,
)
from baselines.dpsgd.head import HeadNet

MECHANISMS = {"dpsgd-alm": "alm", "dpsgd-laplace": "laplace"}
HEAD = HeadConfig()
FIXED = {"epochs": 2, "batch_size": 20, "lr": 1.0, "clip": 1.0}
# unit std of each law, the ALM paper's Var = s^2 pi^2 / 3 and Laplace's Var = 2 b^2
UNIT_STD = {"alm": math.pi / math.sqrt(3.0), "laplace": math.sqrt(2.0)}


@pytest.fixture(scope="module")
def tiny() -> tuple[torch.Tensor, torch.Tensor]:
    """240 x 8 unit-norm features, 3 classes: rows :40 are members, 40: public."""
    g = torch.Generator().manual_seed(0)
    x = torch.nn.functional.normalize(torch.randn(240, 8, generator=g, dtype=torch.float64), dim=1)
    return x, torch.randint(0, 3, (240,), generator=g)


def _context(tiny: tuple[torch.Tensor, torch.Tensor], **fields: object) -> MethodContext:
    x, y = tiny
    base = {"num_classes": 3, "head": HEAD, "public_features": x[40:], "public_labels": y[40:]}
    return MethodContext(**{**base, **fields})  # type: ignore[arg-type]


def _release(
    name: str, tiny: tuple[torch.Tensor, torch.Tensor], ctx: MethodContext, **options: object
) -> Release:
    x, y = tiny
    method = create_method(name, {**FIXED, **options})
    prepared = method.prepare(features=x[:40], labels=y[:40], seed=0, context=ctx)
    return method.release(
        prepared,
        ReleaseRequest(
            features=x[:40], labels=y[:40], epsilon=2.0, delta=1e-5, seed=0, draw=0, context=ctx
        ),
    )


def test_both_are_registered_in_all_and_planned_beside_dpsgd(tmp_path: Path) -> None:
    for name, mechanism in MECHANISMS.items():
        cls = method_class(name)
        assert issubclass(cls, DPSGDMethod) and cls.noise_mechanism == mechanism
        assert cls.tuning_grid == TUNING_GRID  # the same tuning budget as dpsgd
        assert name in default_methods() and name in baselines.TUNING_GRIDS
    config = parse_config(
        [
            "--methods",
            "dpsgd,dpsgd-alm,dpsgd-laplace",
            "--epsilons",
            "1,100",
            "--out",
            str(tmp_path),
        ]
    )
    planned = {c.method for c in plan_run(config).cells}
    assert {"dpsgd", "dpsgd-alm", "dpsgd-laplace"} <= planned


@pytest.mark.parametrize("name", sorted(MECHANISMS))
def test_l1_grid_is_dpsgds_with_clips_scaled_by_sqrt_p(name: str, tiny) -> None:  # type: ignore[no-untyped-def]
    # Same budget (4 configurations, same learning rates); clips on the L1 scale: the
    # linear head on 8 features and 3 classes has p = 3 * (8 + 1) = 27 trainable numbers.
    x, y = tiny
    ctx = _context(tiny)
    method = create_method(name)
    prepared = method.prepare(features=x[:40], labels=y[:40], seed=0, context=ctx)
    grid = method.grid(prepared, context=ctx)  # type: ignore[attr-defined]
    assert [c["lr"] for c in grid] == [c["lr"] for c in TUNING_GRID]
    assert [c["max_grad_norm"] for c in grid] == pytest.approx(
        [c["max_grad_norm"] * math.sqrt(27) for c in TUNING_GRID], rel=1e-15
    )
    # dpsgd's own grid is unscaled
    dpsgd = create_method("dpsgd")
    assert (
        dpsgd.grid(
            dpsgd.prepare(features=x[:40], labels=y[:40], seed=0, context=ctx),  # type: ignore[attr-defined]
            context=ctx,
        )
        == TUNING_GRID
    )


def test_shared_accountant_option_leaves_them_on_alm_pld() -> None:
    # --accountant rdp is dpsgd's; alm_pld is the only accountant of logistic/Laplace steps
    values = {"accountant": "rdp", "dpsgd-alm.lr": 2.0}
    assert create_method("dpsgd", method_options("dpsgd", values)).accountant == "rdp"  # type: ignore[attr-defined]
    alm = create_method("dpsgd-alm", method_options("dpsgd-alm", values))
    assert alm.accountant == "alm_pld" and alm.options.lr == 2.0  # type: ignore[attr-defined]


@pytest.mark.parametrize("name", sorted(MECHANISMS))
def test_statement_is_approx_dp_by_alm_pld_with_l1_sensitivity(tiny, name: str) -> None:
    release = _release(name, tiny, _context(tiny))
    s, training = release.statement, release.training
    assert s.guarantee.value == "approx-dp" and (s.epsilon, s.delta) == (2.0, 1e-5)
    assert s.neighbouring == "add-remove" and s.noise == "secure"
    assert s.sensitivity is not None and s.sensitivity.norm == "l1"
    assert s.sensitivity.value == FIXED["clip"]
    law = "logistic" if MECHANISMS[name] == "alm" else "laplace"
    assert s.mechanism == f"dp-sgd with {law} noise (opacus, alm_pld accountant)"
    notes = " ".join(s.notes)
    assert "accounting profile" in notes and "(2 epsilon, (1 + e^epsilon) delta)" in notes
    assert "os.urandom" in notes
    assert training is not None and training.accountant == "alm_pld"
    assert training.mechanism == MECHANISMS[name] and training.clip_norm_kind == "l1"
    assert 0 < s.epsilon_spent == training.epsilon_spent <= 2.0
    # exact steps: the noise scale is sigma times the grid-rounded sensitivity C' <= C(1 + 2^-7)
    assert s.grid is not None and s.grid_sensitivity is not None
    assert training.clip_norm < s.grid_sensitivity <= training.clip_norm * (1 + 2.0**-7)
    scale = training.noise_multiplier * s.grid_sensitivity
    assert s.noise_scale == pytest.approx(scale, rel=1e-12)
    assert release.noise_std == pytest.approx(scale * UNIT_STD[MECHANISMS[name]], rel=1e-12)
    assert release.info["optimizer"] == "MechanismDPOptimizer"
    assert "adaptive" in release.attacker_note and "L1 clipping" in release.attacker_note


@pytest.mark.parametrize("mechanism", ["alm", "laplace"])
def test_sigma_is_the_alm_pld_search_and_the_history_recomputes_within_target(
    tiny, mechanism: str
) -> None:
    x, y = tiny
    cache = SigmaCache()
    config = DPSGDConfig(lr=1.0, max_grad_norm=1.0, epochs=2, batch_size=20)
    run = train_dpsgd_head(
        x[:40],
        y[:40],
        num_classes=3,
        head=HEAD,
        config=config,
        epsilon=2.0,
        delta=1e-5,
        accountant="alm_pld",
        seed=0,
        noise_seed=0,
        sigmas=cache,
        backend=ALM_TRAINING,
        mechanism=mechanism,
    )
    dim = 3 * (8 + 1)  # the head's weights and biases, all noised
    assert (run.mechanism, run.clipping_norm, run.noise_dim) == (mechanism, "l1", dim)
    expected = find_noise_multiplier(
        target_epsilon=2.0,
        target_delta=1e-5,
        sample_rate=run.sample_rate,
        steps=run.steps,
        mechanism=mechanism,
        dim=dim,
    )
    assert run.noise_multiplier == expected
    # an independent accountant fed the run's history: <= target, within the 1% tolerance
    acc = PipelineAccountant()
    acc.step(
        noise_multiplier=run.noise_multiplier,
        sample_rate=run.sample_rate,
        mechanism=mechanism,
        dim=dim,
        num_steps=run.steps,
    )
    again = acc.get_epsilon(delta=1e-5)
    assert again == pytest.approx(run.epsilon_spent, rel=1e-9)
    assert 0.99 * 2.0 <= again <= 2.0
    # the cache keys the mechanism and the dimension: no Gaussian or other-dim collision
    key = dict(epsilon=2.0, delta=1e-5, sample_rate=run.sample_rate, epochs=2)
    assert cache.cached(**key, accountant="alm_pld", mechanism=mechanism, dim=dim) == expected
    assert cache.cached(**key, accountant="alm_pld") is None
    assert cache.cached(**key, accountant="alm_pld", mechanism=mechanism, dim=dim + 1) is None


def test_sigma_cache_file_keeps_mechanisms_apart(tmp_path: Path) -> None:
    key = dict(epsilon=2.0, delta=1e-5, sample_rate=0.5, epochs=2, accountant="alm_pld")
    first = SigmaCache(tmp_path)
    alm, _ = first.noise_multiplier(**key, mechanism="logistic", dim=27)  # alias of alm
    gauss, _ = first.noise_multiplier(**key)
    again = SigmaCache(tmp_path)  # from the file
    assert again.cached(**key, mechanism="alm", dim=27) == alm != gauss
    assert again.cached(**key) == gauss


def test_non_pld_accountant_is_refused_for_logistic_noise() -> None:
    with pytest.raises(ValueError, match="noise_mechanism='alm' needs accountant='alm_pld'"):
        SigmaCache().noise_multiplier(
            epsilon=2.0, delta=1e-5, sample_rate=0.5, epochs=2, accountant="rdp", mechanism="alm"
        )


def test_one_step_clips_in_l1_and_adds_logistic_noise(tiny) -> None:
    # One step at q = 1 on one example: the update is -lr (clip_1(g) + Z) / 1 with
    # Z ~ Logistic(0, sigma C) per coordinate, so (after - before) / -lr - clip_1(g) is the
    # noise: it replays from the seed, and clip_1(g) has L1 norm C.
    x, y = tiny
    xb, yb = x[:1], y[:1]
    init = init_params(d=8, num_classes=3, head=HEAD, seed=0)
    model = HeadNet(init, "linear")
    logits = model(xb)
    residual = (torch.softmax(logits, 1)[0] - torch.nn.functional.one_hot(yb, 3)[0]).detach()
    xt = torch.cat([xb[0], xb.new_ones(1)])
    grad = torch.cat([torch.outer(residual, xb[0]), residual[:, None]], 1).detach()  # (3, 9)
    clip, sigma = 0.05, 0.5
    l1 = float(residual.abs().sum() * xt.abs().sum())  # the rank-one gradient's L1 norm
    clipped = grad * min(1.0, clip / (l1 + 1e-6))
    assert float(clipped.abs().sum()) == pytest.approx(clip, rel=1e-4)
    before = torch.cat([init["fc.weight"], init["fc.bias"][:, None]], 1)
    config = DPSGDConfig(lr=1.0, max_grad_norm=clip, epochs=1, batch_size=1)
    run = run_opacus(
        xb,
        yb,
        model=model,
        config=config,
        noise_multiplier=sigma,
        accountant="alm_pld",
        noise_seed=7,
        backend=ALM_TRAINING,
        private_kwargs={"noise_mechanism": "alm"},
    )
    assert (run.optimizer, run.mechanism, run.clipping_norm) == (
        "MechanismDPOptimizer",
        "alm",
        "l1",
    )
    assert run.noise_steps == (("alm", sigma, 1.0, 1, 27),) and run.history == ()
    after = torch.cat([model.fc.weight, model.fc.bias[:, None]], 1).detach()
    noise = (before - after) - clipped
    # the same seeded generator, the exact sampler: the noise is γ times the logistic law at
    # sigma C' rounded to the grid (C' the grid-rounded clip); the clipped gradient itself
    # was rounded to the grid too, by at most γ/2 per coordinate
    from alm_opacus.mechanisms.exact import Grid, discrete_noise

    assert run.grid is not None and run.noise_sensitivity is not None
    grid = Grid(exponent=math.frexp(run.grid)[1] - 1, limit=2**53, bound=2**52)
    generator = ALM_TRAINING.generators(7, torch.device("cpu"))[1]
    assert generator is not None
    # one draw for every parameter of the step, in the optimizer's order (step_cell_noise)
    shapes = [p.shape for p in (model.fc.weight, model.fc.bias)]
    flat = (
        run.grid
        * discrete_noise(
            sum(math.prod(s) for s in shapes),
            mechanism="alm",
            scale=sigma * run.noise_sensitivity,
            grid=grid,
            generator=generator,
        ).double()
    )
    draws = [
        d.view(s) for d, s in zip(flat.split([math.prod(s) for s in shapes]), shapes, strict=True)
    ]
    torch.testing.assert_close(
        noise, torch.cat([draws[0], draws[1][:, None]], 1), atol=run.grid / 2 + 1e-12, rtol=0
    )


def test_batched_shadows_match_the_engine_without_noise(tiny) -> None:
    # sigma = 0 and q = 1: the batched attacker's L1 clipping equals MechanismDPOptimizer's
    x, y = tiny
    config = DPSGDConfig(lr=2.0, max_grad_norm=0.3, epochs=6, batch_size=200)
    init = init_params(d=8, num_classes=3, head=HEAD, seed=3)
    model = run_opacus(
        x[:40],
        y[:40],
        model=HeadNet(init, "linear"),
        config=config,
        noise_multiplier=0.0,
        accountant="alm_pld",
        noise_seed=0,
        backend=ALM_TRAINING,
        # the batched attacker re-implements the floating-point step
        private_kwargs={"noise_mechanism": "alm", "exact": False},
    ).module
    ones = torch.ones(2, 40, dtype=torch.bool)
    ours = dpsgd_linear_heads(
        x[:40],
        y[:40],
        masks=ones,
        num_classes=3,
        head=HEAD,
        config=config,
        sigma=0.0,
        seed=3,
        mechanism="alm",
    )
    l2 = dpsgd_linear_heads(
        x[:40], y[:40], masks=ones, num_classes=3, head=HEAD, config=config, sigma=0.0, seed=3
    )
    for b in range(2):
        torch.testing.assert_close(
            ours["fc.weight"][b], model.fc.weight.detach(), atol=1e-12, rtol=0
        )
        torch.testing.assert_close(ours["fc.bias"][b], model.fc.bias.detach(), atol=1e-12, rtol=0)
    assert not torch.allclose(ours["fc.weight"], l2["fc.weight"])  # the L1 clip binds harder


@pytest.mark.parametrize("name", sorted(MECHANISMS))
def test_adaptive_shadows_train_with_the_mechanism(tiny, name: str) -> None:
    x, y = tiny
    release = _release(name, tiny, _context(tiny))
    assert release.attacker is not None
    trainer = release.attacker()
    masks = torch.zeros(3, 60, dtype=torch.bool)
    masks[:, 1::2] = True
    assert trainer(x[100:160], y[100:160], masks, 0)(x[:5]).shape == (3, 5, 3)


@pytest.mark.parametrize("reproducible", [False, True])
def test_seeded_runs_replay_and_secure_runs_differ(tiny, reproducible: bool) -> None:
    x, _ = tiny
    ctx = _context(tiny, noise=NoisePolicy(reproducible=reproducible))
    releases = [_release("dpsgd-alm", tiny, ctx) for _ in range(2)]
    answers = [r.predict_proba(x[100:140]) for r in releases]
    assert torch.equal(answers[0], answers[1]) == reproducible
    assert releases[0].statement.noise == ("seeded" if reproducible else "secure")
    note = "seeded from public labels" if reproducible else "os.urandom"
    assert note in " ".join(releases[0].statement.notes)
