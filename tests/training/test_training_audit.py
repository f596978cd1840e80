"""The white-box canary audit: it observes the real optimizer, its score is the likelihood
ratio, and it catches an optimizer that adds half the noise it claims (issue 23, item 5)."""

from __future__ import annotations

import importlib.util
import json
import math
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from scipy import stats

from alm_opacus.attacks.metrics import clopper_pearson, epsilon_from_rates
from alm_opacus.mechanisms import make_generator
from alm_opacus.mechanisms.exact import step_grid
from alm_opacus.training.audit import (
    CanaryAuditConfig,
    _observe,
    accountant_epsilon,
    calibrated_noise_multiplier,
    canary_scores,
    canary_shift,
    choose_threshold,
    mechanism_optimizer,
    miscalibrated_optimizer,
    run_canary_audit,
    run_canary_audits,
)

LAWS = {"alm": stats.logistic, "laplace": stats.laplace, "gaussian": stats.norm}
SMALL = CanaryAuditConfig(trials=300, chunk=128)


def _observations(
    config: CanaryAuditConfig,
    *,
    sigma: float,
    with_canary: bool,
    seed: int,
    factory: Any = mechanism_optimizer,
) -> np.ndarray:
    return _observe(
        config,
        trials=config.trials,
        with_canary=with_canary,
        noise_multiplier=sigma,
        make_optimizer=factory,
        generator=make_generator(seed=seed),
    )


def test_the_canary_is_clipped_to_the_norm() -> None:
    config = replace(SMALL, max_grad_norm=0.5, canary_magnitude=2.0)
    # Opacus's factor C / (norm + 1e-6) on a gradient of norm 2C: contribution 2C^2/(2C + 1e-6)
    assert canary_shift(config) == pytest.approx(2 * 0.5 / (2 * 0.5 + 1e-6), rel=1e-12)


def test_without_noise_the_auditor_sees_the_clipped_sampled_canaries() -> None:
    config = replace(SMALL, sample_rate=0.5, steps=3, noise_mechanism="laplace")
    seen_in = _observations(config, sigma=0.0, with_canary=True, seed=0)
    seen_out = _observations(config, sigma=0.0, with_canary=False, seed=0)
    assert seen_in.shape == (300, 3) and np.all(seen_out == 0.0)
    shift = canary_shift(config)
    sampled = seen_in != 0
    # the step is exact: each example's clipped gradient is rounded to the grid γ of its
    # chunk's dimension (128 or 44 canaries), so the canary lands within half a cell
    half_cell = (
        max(
            math.ldexp(
                0.5, step_grid(max_grad_norm=config.max_grad_norm, norm="l1", dim=w).exponent
            )
            for w in (128, 44)
        )
        / config.max_grad_norm
    )
    assert half_cell < 1e-3
    np.testing.assert_allclose(seen_in[sampled], shift, rtol=0, atol=half_cell)
    # 900 Poisson draws at q = 1/2: 450 +- 15; outside 450 +- 90 has probability < 1e-8
    assert 360 < sampled.sum() < 540


@pytest.mark.parametrize("mechanism", ["alm", "laplace", "gaussian"])
def test_the_auditor_sees_the_optimizers_noise(mechanism: str) -> None:
    config = replace(SMALL, noise_mechanism=mechanism, trials=2000, chunk=500)
    law = LAWS[mechanism]
    seen = _observations(config, sigma=0.7, with_canary=False, seed=1)[:, 0]
    assert stats.kstest(seen, law(scale=0.7).cdf).pvalue > 1e-4
    broken = _observations(
        config, sigma=0.7, with_canary=False, seed=2, factory=miscalibrated_optimizer(0.5)
    )[:, 0]
    assert stats.kstest(broken, law(scale=0.35).cdf).pvalue > 1e-4
    # KS at n = 2000 against a scale off by 2x: p ~ 1e-40 in simulation
    assert stats.kstest(broken, law(scale=0.7).cdf).pvalue < 1e-8


@pytest.mark.parametrize("mechanism", ["alm", "laplace", "gaussian"])
@pytest.mark.parametrize(("sample_rate", "steps"), [(1.0, 1), (0.3, 2)])
def test_the_score_is_the_log_likelihood_ratio(
    mechanism: str, sample_rate: float, steps: int
) -> None:
    config = replace(SMALL, noise_mechanism=mechanism, sample_rate=sample_rate, steps=steps)
    law, sigma, c = LAWS[mechanism], 0.8, canary_shift(config)
    x = np.random.default_rng(0).normal(0.5, 1.5, size=(50, steps))
    ratio = law.pdf(x - c, scale=sigma) / law.pdf(x, scale=sigma)  # densities, not logs
    expected = np.log(1 - sample_rate + sample_rate * ratio).sum(axis=1)
    scores = canary_scores(x, config=config, noise_multiplier=sigma)
    np.testing.assert_allclose(scores, expected, atol=2.0**-30)  # scores sit on a 2^-30 grid


def test_the_threshold_separates_separable_scores() -> None:
    t = choose_threshold(
        scores_in=np.arange(10.0, 20.0),
        scores_out=np.arange(0.0, 10.0),
        delta=1e-5,
        confidence=0.95,
    )
    assert 9.0 < t <= 10.0


def _miss_probability(
    n: int, p_fp: float, p_fn: float, *, claim: float, delta: float, confidence: float, above: bool
) -> float:
    """P(bound > claim) (``above``) or P(bound <= claim) with FP ~ Bin(n, p_fp) and
    FN ~ Bin(n, p_fn) independent: the exact law of the audit at a fixed threshold
    (outcomes of probability < 1e-16 each are left out; they cannot add up to 1e-9)."""
    fp, fn = np.arange(n + 1), np.arange(n + 1)
    pfp, pfn = stats.binom.pmf(fp, n, p_fp), stats.binom.pmf(fn, n, p_fn)
    fp, pfp, fn, pfn = fp[pfp > 1e-16], pfp[pfp > 1e-16], fn[pfn > 1e-16], pfn[pfn > 1e-16]
    each = 1 - (1 - confidence) / 2
    _, fpr = clopper_pearson(successes=fp, trials=n, confidence=each, side="upper")
    _, fnr = clopper_pearson(successes=fn, trials=n, confidence=each, side="upper")
    bounds = epsilon_from_rates(fpr=fpr[:, None], fnr=fnr[None, :], delta=delta)
    hit = bounds > claim if above else bounds <= claim
    return float((pfp[:, None] * pfn[None, :] * hit).sum())


# (mechanism, trials, threshold point in units of C): at a claim of (2, 1e-3), one step at
# q = 1, these make both failure probabilities below 1e-6 (computed in the test).
CATCH = [("alm", 2000, 1.0), ("laplace", 2000, 0.65), ("gaussian", 8000, 1.85)]


@pytest.mark.parametrize(("mechanism", "trials", "point"), CATCH)
def test_the_audit_catches_half_the_noise_and_passes_the_right_noise(
    mechanism: str, trials: int, point: float
) -> None:
    config = CanaryAuditConfig(
        noise_mechanism=mechanism,
        target_epsilon=2.0,
        target_delta=1e-3,
        trials=trials,
        chunk=500,
        confidence=0.999,
    )
    sigma = calibrated_noise_multiplier(config)
    claim = accountant_epsilon(config, noise_multiplier=sigma)
    # The threshold is fixed in advance (no selection trials): "in" iff x >= point.
    threshold = float(canary_scores(np.array([[point]]), config=config, noise_multiplier=sigma)[0])
    law, c = LAWS[mechanism], canary_shift(config)
    for scale, above in ((sigma / 2, False), (sigma, True)):
        failure = _miss_probability(
            trials,
            law.sf(point, scale=scale),
            law.cdf(point - c, scale=scale),
            claim=claim,
            delta=config.target_delta,
            confidence=config.confidence,
            above=above,
        )
        assert failure < 1e-6, (scale, failure)  # the test's own false-failure probability
    broken = run_canary_audit(
        config,
        seed=0,
        noise_multiplier=sigma,
        epsilon=claim,
        make_optimizer=miscalibrated_optimizer(0.5),
        threshold=threshold,
    )
    right = run_canary_audit(
        config, seed=0, noise_multiplier=sigma, epsilon=claim, threshold=threshold
    )
    assert broken.violation and broken.epsilon_lower_bound > claim
    assert not right.violation and right.epsilon_lower_bound <= claim
    assert right.scalar_epsilon <= claim + 1e-9


def test_a_chosen_threshold_audit_is_below_the_claim_and_reports_it() -> None:
    config = CanaryAuditConfig(
        noise_mechanism="laplace",
        target_epsilon=2.0,
        trials=1000,
        chunk=500,
        sample_rate=0.5,
        steps=2,
    )
    result = run_canary_audits(config, seeds=[3])[0]
    assert 0 < result.epsilon_lower_bound <= result.accountant_epsilon <= 2.0
    assert result.epsilon_ceiling > result.epsilon_lower_bound
    assert result.to_dict()["tightness"] == pytest.approx(result.tightness)


@pytest.mark.parametrize("seeds", [[], [1, 1]])
def test_audits_need_distinct_seeds(seeds: list[int]) -> None:
    with pytest.raises(ValueError, match="seeds="):
        run_canary_audits(SMALL, seeds=seeds, noise_multiplier=1.0)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"noise_mechanism": "gaussian-classic"}, "gaussian-classic"),
        ({"sample_rate": 0.0}, "sample_rate=0.0"),
        ({"steps": 0}, "steps=0"),
        ({"trials": 1.5}, "trials=1.5"),
        ({"canary_magnitude": 0.5}, "canary_magnitude=0.5"),
        ({"confidence": 1.0}, "confidence=1.0"),
    ],
)
def test_config_refuses_bad_values(kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        CanaryAuditConfig(**kwargs)


def test_the_audit_script_writes_its_table_into_the_docs(tmp_path: Path) -> None:
    spec = importlib.util.spec_from_file_location(
        "audit_dpsgd", Path(__file__).parents[2] / "scripts" / "audit_dpsgd.py"
    )
    assert spec is not None and spec.loader is not None
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    doc = tmp_path / "doc.md"
    doc.write_text("before\n<!-- generated audit -->\nold\n<!-- end generated audit -->\nafter\n")
    out = tmp_path / "audit"
    args = [
        "--mechanisms",
        "laplace",
        "--trials",
        "laplace=500",
        "--seeds",
        "2",
        "--out",
        str(out),
        "--write",
        str(doc),
    ]
    torch_threads = torch.get_num_threads()
    assert script.main(args) == 0
    torch.set_num_threads(torch_threads)
    row = json.loads((out / "audit_dpsgd.json").read_text())["rows"][0]
    assert row["mechanism"] == "laplace" and len(row["bounds"]) == 2
    assert row["max"] <= row["claim"] and row["violations"] == 0
    text = doc.read_text()
    assert text.startswith("before\n") and text.endswith("after\n") and "old" not in text
    assert "| laplace | 500 |" in text and "min (" in text
