"""A noise law defined in one module outside the package (``toy_law.py`` here), registered as
a plugin, runs through an exact release, a DP-SGD step, the accountant and a harness run.

The toy law at scale b is Laplace noise of scale 2b, so each number below tells the toy's
parts from Laplace's at the same scale: the noise is Laplace(2b) and not Laplace(b), the
epsilons are Δ/(2b) and not Δ/b.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import importlib.util
import math
import sys
import types
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch
from opacus import GradSampleModule
from scipy import stats
from torch import nn

from alm_opacus.registry import Registry

HERE = Path(__file__).resolve().parent
#: The toy module registers through both groups, as a plugin package that adds a law and
#: its post-training method would declare it.
GROUPS = ("alm_opacus.noise_laws", "alm_opacus.methods")

# inputs never require grad here, which Opacus's hooks mention on every backward pass
pytestmark = pytest.mark.filterwarnings("ignore:Full backward hook is firing")


@pytest.fixture
def toy(monkeypatch: pytest.MonkeyPatch) -> Iterator[types.ModuleType]:
    """The toy plugin, found through faked entry points; everything it registers vanishes
    after the test (and the module is imported afresh by the next)."""
    real = importlib.metadata.entry_points

    def entry_points(**select: str) -> object:
        group = select.get("group")
        if group not in GROUPS:
            return real(**select)  # numba asks for every group
        toy = importlib.metadata.EntryPoint(name="toy", value="toy_law", group=group)
        return [*real(group=group), toy]

    # Registry.isolated restores the registries that exist when it starts (the plugin API
    # imports them all), and loads each before it saves them: so patch inside the block
    importlib.import_module("alm_opacus.plugin")
    with Registry.isolated(reload=GROUPS):
        monkeypatch.syspath_prepend(str(HERE))
        monkeypatch.setattr(importlib.metadata, "entry_points", entry_points)
        try:
            from alm_opacus.mechanisms import available_mechanisms

            assert "toy" in available_mechanisms()  # the first lookup loads the plugin
            yield sys.modules["toy_law"]
        finally:
            monkeypatch.undo()
            sys.modules.pop("toy_law", None)


def test_the_law_is_registered_once_and_every_layer_finds_its_part(
    toy: types.ModuleType,
) -> None:
    from alm_opacus.accounting.pld import RELEASE_PLDS
    from alm_opacus.accounting.subsampled import STEP_PROFILES
    from alm_opacus.claims import CLAIM_RULES
    from alm_opacus.mechanisms import create_mechanism
    from alm_opacus.mechanisms.exact import cell_law
    from alm_opacus.mechanisms.kernels import FIRST_PASS_FILLS, first_pass_kernel
    from alm_opacus.methods import available_methods
    from alm_opacus.noise_laws import NOISE_LAWS, available_noise_laws
    from alm_opacus.plugin import NoiseLaw, register_noise_law
    from alm_opacus.training.optimizer import training_mechanism

    law = NOISE_LAWS["toy"]
    assert law is toy.TOY_LAW
    assert available_noise_laws() == ["alm", "gaussian", "gaussian-classic", "laplace", "toy"]
    assert type(create_mechanism("toy")) is toy.ToyMechanism
    assert cell_law("toy") is law.cell_law
    assert FIRST_PASS_FILLS["toy"] is toy.toy_first_pass and first_pass_kernel("toy") is not None
    assert RELEASE_PLDS["toy"] is toy.toy_release_pld
    assert STEP_PROFILES["toy"] is law.step_profile and CLAIM_RULES["toy"] is law.claim_rule
    assert training_mechanism("toy").name == "toy" and "toy" in available_methods()
    # a second registration under a taken name is refused...
    with pytest.raises(ValueError, match="noise law 'toy': noise law 'toy' is already registered"):
        register_noise_law(dataclasses.replace(law, claim_rule=None))

    # ...all or nothing: a law whose alias is taken leaves no part behind
    class Other(toy.ToyMechanism):  # type: ignore[name-defined]
        name = "toy-other"

    with pytest.raises(ValueError, match="mechanism 'laplace' is already registered"):
        register_noise_law(NoiseLaw(name="toy-other", mechanism=Other, aliases=("laplace",)))
    assert "toy-other" not in NOISE_LAWS and "toy-other" not in available_noise_laws()
    with pytest.raises(ValueError, match="mechanism's own name 'toy'"):
        NoiseLaw(name="stretched", mechanism=toy.ToyMechanism)


def test_the_cell_law_is_laplace_at_twice_the_scale(toy: types.ModuleType) -> None:
    from alm_opacus.mechanisms.exact import Grid, cell_log_pmf
    from alm_opacus.mechanisms.kernels import inverse_x

    grid = Grid(exponent=-10, limit=2**52, bound=2**40)
    k = np.arange(-4000, 4001, dtype=np.int64)
    ours = cell_log_pmf("toy", scale=0.7, grid=grid, k=k)
    theirs = cell_log_pmf("laplace", scale=1.4, grid=grid, k=k)
    np.testing.assert_allclose(ours, theirs, rtol=1e-12)
    assert not np.allclose(ours, cell_log_pmf("laplace", scale=0.7, grid=grid, k=k))
    # the plugin's first pass: x = t·S⁻¹(V) = −2t·ln V
    words = np.array([1 << 62, -(1 << 61), 12345, -(2**63 - 1)], dtype=np.int64)
    v = np.abs(words.astype(np.float64)) * 2.0**-63
    np.testing.assert_allclose(inverse_x("toy", words, 3.0), -6.0 * np.log(v), rtol=1e-15)


def test_an_exact_release_draws_the_toy_law_and_states_its_claim(toy: types.ModuleType) -> None:
    from alm_opacus.accounting import PipelineAccountant
    from alm_opacus.mechanisms import analysis, create_mechanism
    from alm_opacus.mechanisms.exact import plan_release
    from alm_opacus.protect import Guarantee, PostTrainingPrivacyEngine

    module = nn.Linear(200, 100, dtype=torch.float64)  # 20,100 coordinates
    with torch.no_grad():
        for p in module.parameters():
            p.zero_()
    accountant = PipelineAccountant()
    engine = PostTrainingPrivacyEngine(mechanism="toy")
    protected = engine.make_private(
        module, epsilon=2.0, sensitivity=1.0, seed=0, accountant=accountant
    )
    statement = protected.statement
    assert statement.mechanism == "toy" and statement.guarantee is Guarantee.PURE_DP
    assert statement.epsilon == 2.0 and statement.delta == 0.0
    plan = plan_release(
        mechanism=create_mechanism("toy"), epsilon=2.0, delta=0.0, sensitivity=1.0, dim=20_100
    )
    b = plan.scale
    assert statement.noise_scale == b == plan.sensitivity / 4.0  # Δ'/(2ε)
    noise = torch.cat([p.detach().flatten() for p in protected.parameters()]).numpy()
    cells = noise / plan.grid.gamma
    assert np.array_equal(cells, np.round(cells))  # exact: integers on the grid
    # Laplace(2b), not Laplace(b): at b the CDFs differ by ≥ 0.09 somewhere, far beyond the
    # KS critical value at p = 1e-6 for n = 20,100 (0.019); the seed is fixed
    assert stats.kstest(noise, stats.laplace(scale=2 * b).cdf).pvalue > 1e-3
    assert stats.kstest(noise, stats.laplace(scale=b).cdf).pvalue < 1e-6
    assert np.mean(np.abs(noise)) == pytest.approx(2 * b, rel=0.03)  # E|X| = 2b, sd ~0.7%
    # the claim rule: ε ≥ Δ'/(2b) is proven, a smaller ε is refused
    with pytest.raises(ValueError, match=r"Delta_1 / \(2 b\) \(toy\)"):
        dataclasses.replace(statement, epsilon=1.9)
    # the accountant composes the release with the toy's PLD
    assert accountant.get_epsilon(0.0) == pytest.approx(2.0, rel=1e-12)
    # scalar Laplace(2b): δ(ε) = 1 − e^{(ε − Δ'/(2b))/2}, so δ = 0.1 buys ε = 2 + 2·ln 0.9
    expected = analysis.laplace_epsilon(delta=0.1, scale=2 * b, sensitivity=plan.sensitivity)
    assert expected == pytest.approx(2.0 + 2.0 * math.log(0.9), rel=1e-9)
    assert accountant.get_epsilon(0.1) == pytest.approx(expected, rel=2e-3)


def test_the_accountant_gives_the_closed_forms(toy: types.ModuleType) -> None:
    from alm_opacus.accounting import release_pld, step_pld
    from alm_opacus.accounting.pld import release_loss_span
    from alm_opacus.mechanisms import analysis, create_mechanism

    mechanism = create_mechanism("toy")
    assert mechanism.calibrate(epsilon=0.5, delta=0.0, sensitivity=3.0) == 3.0
    assert mechanism.epsilon(delta=0.0, scale=0.8, sensitivity=1.0) == 1 / 1.6
    assert mechanism.std(1.0) == pytest.approx(2 * math.sqrt(2))
    pld = release_pld(mechanism="toy", scale=0.8, sensitivity=1.0)
    # the loss lies in ±Δ/(2b), which sizes the accountant's grid
    assert release_loss_span(mechanism="toy", scale=0.8, sensitivity=1.0) == 2 / 1.6
    assert pld.get_epsilon_for_delta(0.0) == pytest.approx(1 / 1.6, abs=2e-4)
    for delta in (1e-3, 1e-6):
        exact = analysis.laplace_epsilon(delta=delta, scale=1.6, sensitivity=1.0)
        assert pld.get_epsilon_for_delta(delta) == pytest.approx(exact, rel=1e-3)
    # one unsampled step at σ: the scalar Laplace profile at 2σ (Laplace at σ: twice as much)
    one = step_pld(mechanism="toy", noise_multiplier=2.0, sample_rate=1.0)
    for delta in (0.0, 1e-3):
        exact = analysis.laplace_epsilon(delta=delta, scale=4.0, sensitivity=1.0)
        assert one.get_epsilon_for_delta(delta) == pytest.approx(exact, abs=2e-4)
    # T such steps: the largest loss T/(2σ), reached at a tiny δ (composition truncates
    # the tails, so δ = 0 itself reads inf)
    steps = step_pld(mechanism="toy", noise_multiplier=2.0, sample_rate=1.0, steps=3)
    assert steps.get_epsilon_for_delta(1e-12) == pytest.approx(0.75, abs=1e-3)
    # subsampled: the amplified pure bound ln(1 + q(e^{ε₀} − 1)) per step, ε₀ = 1/(2σ)
    single = step_pld(mechanism="toy", noise_multiplier=0.5, sample_rate=0.1)
    assert single.get_epsilon_for_delta(0.0) == pytest.approx(
        math.log1p(0.1 * math.expm1(1.0)), abs=1e-3
    )


def test_a_dp_sgd_step_clips_in_l1_adds_toy_noise_and_is_accounted(
    toy: types.ModuleType,
) -> None:
    from alm_opacus.accounting import PipelineAccountant
    from alm_opacus.training import MechanismDPOptimizer

    # the noise of one step, on a zero gradient: Laplace(2σC') with C' the grid-rounded C
    param = nn.Parameter(torch.zeros(20_000, dtype=torch.float64))
    opt = MechanismDPOptimizer(
        torch.optim.SGD([param], lr=1.0),
        noise_multiplier=1.5,
        max_grad_norm=0.4,
        expected_batch_size=1,
        noise_mechanism="toy",
        generator=torch.Generator().manual_seed(3),
    )
    assert opt.noise_mechanism == "toy" and opt.clipping_norm == "l1"
    param.summed_grad = torch.zeros_like(param, dtype=torch.int64)  # type: ignore[attr-defined]
    opt.add_noise()  # on the cells of an exact step
    assert param.grad is not None
    noise = param.grad.numpy()
    b = opt.noise_scale
    assert b == pytest.approx(1.5 * opt.noise_sensitivity) and opt.noise_sensitivity > 0.4
    assert stats.kstest(noise, stats.laplace(scale=2 * b).cdf).pvalue > 1e-3
    assert stats.kstest(noise, stats.laplace(scale=b).cdf).pvalue < 1e-6

    # a whole step through Opacus's machinery, recorded by the accountant's hook
    torch.manual_seed(0)
    module = GradSampleModule(nn.Sequential(nn.Linear(5, 4), nn.ReLU(), nn.Linear(4, 3)).double())
    before = [p.detach().clone() for p in module.parameters()]
    step = MechanismDPOptimizer(
        torch.optim.SGD(module.parameters(), lr=0.1),
        noise_multiplier=2.0,
        max_grad_norm=1.0,
        expected_batch_size=16,
        noise_mechanism="toy",
        generator=torch.Generator().manual_seed(4),
    )
    accountant = PipelineAccountant()
    step.attach_step_hook(accountant.get_optimizer_hook_fn(sample_rate=1.0))
    x = 10 * torch.randn(16, 5, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    nn.functional.cross_entropy(module(x), torch.arange(16) % 3).backward()
    step.step()
    after = list(module.parameters())
    assert all(
        torch.isfinite(p).all() and not torch.equal(p, q)
        for p, q in zip(after, before, strict=True)
    )
    assert accountant.get_epsilon(0.0) == pytest.approx(1 / 4.0, rel=1e-12)  # 1/(2σ)


@pytest.mark.slow
def test_a_harness_run_releases_with_the_toy_law(
    toy: types.ModuleType, tmp_path: Path, shared_cache: Path
) -> None:
    from alm_opacus.run.config import RunConfig
    from alm_opacus.run.harness import run

    config = RunConfig(
        dataset="digits",
        methods=("toy", "laplace"),
        epsilons=(1.0,),
        noise_draws=1,
        attacks=("loss",),
        reproducible_noise=True,
        out=str(tmp_path / "run"),
        cache_dir=str(shared_cache),
        progress=False,
    )
    rows = {r.method: r for r in run(config).rows if r.method in ("toy", "laplace")}
    toy_row, laplace_row = rows["toy"], rows["laplace"]
    # the default sensitivity is sampled (random-DP), for the toy as for Laplace
    assert toy_row.guarantee == laplace_row.guarantee == "random-dp"
    assert toy_row.epsilon == 1.0 and toy_row.delta == laplace_row.delta
    assert "toy" in toy_row.statement and "laplace" not in toy_row.statement.lower(), (
        toy_row.statement
    )
    # the same head and sensitivity; the toy calibrates b = Δ'/(2ε), Laplace b = Δ'/ε, so
    # both add noise of the same law (Laplace(Δ'/ε)) and the same standard deviation
    assert toy_row.sensitivity == laplace_row.sensitivity
    assert toy_row.noise_scale == pytest.approx(laplace_row.noise_scale / 2, rel=1e-12)
    assert toy_row.noise_std == pytest.approx(laplace_row.noise_std, rel=1e-12)
    assert 0.0 < toy_row.test_accuracy <= 1.0


def test_the_toy_plugin_imports_public_names_only() -> None:
    spec = importlib.util.spec_from_file_location("plugin_api", HERE.parent / "test_plugin_api.py")
    assert spec is not None and spec.loader is not None
    rules = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(rules)
    assert rules.private_imports((HERE / "toy_law.py").read_text()) == []


def test_the_toy_law_is_unknown_outside_its_plugin() -> None:
    from alm_opacus.mechanisms import available_mechanisms
    from alm_opacus.noise_laws import available_noise_laws

    assert "toy" not in available_mechanisms()
    assert available_noise_laws() == ["alm", "gaussian", "gaussian-classic", "laplace"]
