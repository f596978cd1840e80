"""The canary audit: its hand-batched DP-SGD loop against the real Opacus optimizer, and
the empirical epsilon lower bound against the accountant's epsilon."""

from __future__ import annotations

import importlib.util
import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from scipy import stats
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from alm_opacus.mechanisms import make_generator
from alm_opacus.training import PrivacyEngine
from alm_opacus.training.audit import (
    CANARY_FEATURE,
    CanaryAuditConfig,
    accountant_epsilon,
    audit_data,
    calibrated_noise_multiplier,
    choose_threshold,
    initial_parameters,
    run_canary_audit,
    run_canary_audits,
    train_batched,
)

pytestmark = [
    pytest.mark.filterwarnings("ignore:Full backward hook is firing"),
    pytest.mark.filterwarnings("ignore:Using a non-full backward hook"),
]

# One epoch of 2 Poisson steps at q = 1/2 over 32 real examples (+ canary), batch 16.
SMALL = CanaryAuditConfig(sample_rate=0.5, steps=2, num_examples=32, expected_batch_size=16)


def _opacus_model(config: CanaryAuditConfig) -> nn.Linear:
    w0, b0 = initial_parameters(config)
    model = nn.Linear(3, 1, dtype=torch.float64)
    with torch.no_grad():
        model.weight.copy_(w0[None])
        model.bias.fill_(b0)
    return model


def _opacus_runs(
    config: CanaryAuditConfig, *, sigma: float, runs: int, batch_size: int, seed: int
) -> tuple[np.ndarray, np.ndarray]:
    """Train ``runs`` models WITH the canary through PrivacyEngine; one epoch per run."""
    x, y = audit_data(config)
    loader = DataLoader(TensorDataset(x, y), batch_size=batch_size,
                        generator=torch.Generator().manual_seed(seed + 1))  # fmt: skip
    model = _opacus_model(config)
    engine = PrivacyEngine(secure_mode=False)
    private, opt, dp_loader = engine.make_private(
        module=model, optimizer=torch.optim.SGD(model.parameters(), lr=config.learning_rate),
        data_loader=loader, noise_multiplier=sigma, max_grad_norm=config.max_grad_norm,
        noise_mechanism=config.noise_mechanism,
        noise_generator=torch.Generator().manual_seed(seed),
        exact=False,  # the batched loop replays the floating-point step
    )  # fmt: skip
    assert opt.expected_batch_size == config.expected_batch_size
    assert dp_loader.sample_rate == config.sample_rate and len(dp_loader) == config.steps
    fresh = _opacus_model(config)
    scores, biases = [], []
    for _ in range(runs):
        with torch.no_grad():
            model.weight.copy_(fresh.weight)
            model.bias.copy_(fresh.bias)
        for xb, yb in dp_loader:
            opt.zero_grad()
            nn.functional.binary_cross_entropy_with_logits(private(xb)[:, 0], yb).backward()
            opt.step()
        with torch.no_grad():
            scores.append(float(model.weight[0, CANARY_FEATURE] - fresh.weight[0, CANARY_FEATURE]))
            biases.append(float(model.bias[0]))
    return np.array(scores), np.array(biases)


@pytest.mark.parametrize("mechanism", ["alm", "gaussian"])
def test_one_noiseless_full_batch_step_equals_opacus(mechanism: str) -> None:
    # q = 1 (every example in), sigma = 0 and a small clip (clipping binds for most
    # examples): the batched update must equal MechanismDPOptimizer's.
    config = replace(SMALL, noise_mechanism=mechanism, sample_rate=1.0, steps=1,
                     expected_batch_size=33, max_grad_norm=0.3, exact=False)  # fmt: skip
    batched = train_batched(config=config, noise_multiplier=0.0,
                            with_canary=torch.ones(1, dtype=torch.bool),
                            generator=make_generator(seed=0))  # fmt: skip
    x, y = audit_data(config)
    model = _opacus_model(config)
    _, opt, loader = PrivacyEngine().make_private(
        module=model, optimizer=torch.optim.SGD(model.parameters(), lr=config.learning_rate),
        data_loader=DataLoader(TensorDataset(x, y), batch_size=33), noise_multiplier=0.0,
        max_grad_norm=config.max_grad_norm, noise_mechanism=mechanism,
        exact=False,  # the batched loop replays the floating-point step
    )  # fmt: skip
    for xb, yb in loader:
        assert len(xb) == 33
        nn.functional.binary_cross_entropy_with_logits(model(xb)[:, 0], yb).backward()
        opt.step()
    # float64, one step of sums over 33 terms: agreement to ~1e-15; 1e-12 leaves margin
    torch.testing.assert_close(model.weight.detach()[0], batched.weight[0], rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(model.bias.detach(), batched.bias, rtol=1e-12, atol=1e-12)


@pytest.mark.slow
@pytest.mark.parametrize(("mechanism", "sigma"), [("alm", 0.4), ("gaussian", 1.0)])
def test_batched_loop_and_opacus_agree_in_distribution(mechanism: str, sigma: float) -> None:
    config = replace(SMALL, noise_mechanism=mechanism, exact=False)
    opacus_scores, opacus_bias = _opacus_runs(config, sigma=sigma, runs=200, batch_size=17, seed=0)
    batched = train_batched(config=config, noise_multiplier=sigma,
                            with_canary=torch.ones(3000, dtype=torch.bool),
                            generator=make_generator(seed=1))  # fmt: skip
    w0, _ = initial_parameters(config)
    scores = (batched.weight[:, CANARY_FEATURE] - w0[CANARY_FEATURE]).numpy()
    # Two-sample KS on the canary score and on the bias (data gradients + noise). Both
    # samples are seeded; if the laws were equal, p < 1e-4 would have probability 1e-4.
    # (At 200 vs 3000 runs KS only sees gross errors, e.g. sigma off by 3x: in simulation
    # p < 3e-7. The replay test below is the sharp check.)
    assert stats.ks_2samp(opacus_scores, scores).pvalue > 1e-4
    assert stats.ks_2samp(opacus_bias, batched.bias.numpy()).pvalue > 1e-4


@pytest.mark.parametrize("exact", [True, False])
@pytest.mark.parametrize("mechanism", ["alm", "laplace", "gaussian"])
def test_batched_loop_replays_opacus_from_the_same_seeds(mechanism: str, exact: bool) -> None:
    # One run, seeded: the batched loop draws its masks and its noise from the same streams
    # as PrivacyEngine's loader and optimizer, so the models must coincide: the exact step
    # (the default, what ships) and the floating-point one.
    config = replace(SMALL, noise_mechanism=mechanism, steps=4, max_grad_norm=0.5, exact=exact)
    sigma = 0.7
    x, y = audit_data(config)
    model = _opacus_model(config)
    _, opt, loader = PrivacyEngine(secure_mode=False).make_private(
        module=model, optimizer=torch.optim.SGD(model.parameters(), lr=config.learning_rate),
        data_loader=DataLoader(TensorDataset(x, y), batch_size=17,
                               generator=torch.Generator().manual_seed(11)),
        noise_multiplier=sigma, max_grad_norm=config.max_grad_norm, noise_mechanism=mechanism,
        noise_generator=torch.Generator().manual_seed(10), exact=exact,
    )  # fmt: skip
    for _ in range(2):  # 2 epochs x 2 Poisson steps
        for xb, yb in loader:
            opt.zero_grad()
            nn.functional.binary_cross_entropy_with_logits(model(xb)[:, 0], yb).backward()
            opt.step()
    batched = train_batched(config=config, noise_multiplier=sigma,
                            with_canary=torch.ones(1, dtype=torch.bool),
                            generator=torch.Generator().manual_seed(10),
                            sampling_generator=torch.Generator().manual_seed(11))  # fmt: skip
    # float64, 4 steps of sums over <= 33 terms: agreement to ~1e-14; 1e-11 leaves margin
    torch.testing.assert_close(model.weight.detach()[0], batched.weight[0], rtol=1e-11, atol=1e-11)
    torch.testing.assert_close(model.bias.detach(), batched.bias, rtol=1e-11, atol=1e-11)


def test_the_canary_is_clipped_at_full_norm_in_every_sampled_step() -> None:
    runs = train_batched(config=SMALL, noise_multiplier=0.5,
                         with_canary=torch.tensor([True, False] * 200),
                         generator=make_generator(seed=3))  # fmt: skip
    # 200 runs x 2 steps at q = 1/2: about 200 sampled steps, each at full norm
    assert 100 < runs.canary_steps < 300
    assert runs.canary_full_norm_steps == runs.canary_steps


def test_audit_data_puts_the_canary_alone_on_its_feature() -> None:
    x, y = audit_data(SMALL)
    assert x.shape == (33, 3) and y.shape == (33,)
    assert torch.all(x[:-1, CANARY_FEATURE] == 0) and x[-1, CANARY_FEATURE] == 1000.0
    assert y[-1] == 1 and y[:-1].sum() == 16


def test_threshold_separates_separable_scores() -> None:
    t = choose_threshold(scores_in=np.arange(10.0, 20.0), scores_out=np.arange(0.0, 10.0),
                         delta=1e-5, confidence=0.95)  # fmt: skip
    assert 9.0 < t <= 10.0


@pytest.fixture(scope="module", params=["alm", "gaussian"])
def calibrated(request: pytest.FixtureRequest) -> tuple[CanaryAuditConfig, float, float]:
    """(config, sigma, accountant epsilon) at target epsilon 4, calibrated once per module."""
    config = replace(SMALL, noise_mechanism=request.param, target_epsilon=4.0, runs=1000)
    sigma = calibrated_noise_multiplier(config)
    return config, sigma, accountant_epsilon(config, noise_multiplier=sigma)


@pytest.mark.slow
def test_audit_bound_never_exceeds_the_accountant_over_ten_seeds(
    calibrated: tuple[CanaryAuditConfig, float, float],
) -> None:
    config, sigma, claimed = calibrated
    assert claimed <= config.target_epsilon
    results = [run_canary_audit(config, seed=s, noise_multiplier=sigma, epsilon=claimed)
               for s in range(10)]  # fmt: skip
    bounds = np.array([r.epsilon_lower_bound for r in results])
    assert np.all(bounds <= claimed), bounds
    assert all(r.canary_full_norm == 1.0 for r in results)
    # the audit sees the canary: simulations of this configuration give bounds of 1-3
    assert bounds.mean() > 0.5, bounds


@pytest.mark.slow
def test_audit_catches_a_run_with_a_quarter_of_the_noise(
    calibrated: tuple[CanaryAuditConfig, float, float],
) -> None:
    # a violation of the claim (a quarter of the calibrated noise) pushes the bound above it
    config, sigma, claimed = calibrated
    result = run_canary_audit(config, seed=0, noise_multiplier=sigma / 4, epsilon=claimed)
    assert result.epsilon_lower_bound > claimed


@pytest.mark.parametrize("seeds", [[], [1, 1]])
def test_audits_need_distinct_seeds(seeds: list[int]) -> None:
    with pytest.raises(ValueError, match="seeds="):
        run_canary_audits(SMALL, seeds=seeds)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"noise_mechanism": "gaussian-classic"}, "gaussian-classic"),
        ({"sample_rate": 0.0}, "sample_rate=0.0"),
        ({"steps": 0}, "steps=0"),
        ({"runs": 1.5}, "runs=1.5"),
        ({"learning_rate": -1.0}, "learning_rate"),
        ({"confidence": 1.0}, "confidence=1.0"),
    ],
)
def test_config_refuses_bad_values(kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        CanaryAuditConfig(**kwargs)


def test_the_audit_script_writes_its_table(tmp_path: Path) -> None:
    spec = importlib.util.spec_from_file_location(
        "audit_dpsgd", Path(__file__).parents[2] / "scripts" / "audit_dpsgd.py"
    )
    assert spec is not None and spec.loader is not None
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    out = tmp_path / "audit"
    args = ["--mechanisms", "alm", "--runs", "200", "--seeds", "2", "--steps", "2",
            "--sample-rate", "0.5", "--batch-size", "16", "--out", str(out)]  # fmt: skip
    assert script.main(args) == 0
    saved = json.loads((out / "audit_dpsgd.json").read_text())
    row = saved["rows"][0]
    assert row["mechanism"] == "alm" and len(row["lower_bounds"]) == 2
    assert row["max_lower_bound"] <= row["accountant_epsilon"] and row["violations"] == 0
    assert "| alm |" in (out / "audit_dpsgd.md").read_text()
    assert "exact step" in (out / "audit_dpsgd.md").read_text()  # what ships is audited
    assert saved["configs"][0]["exact"] is True
