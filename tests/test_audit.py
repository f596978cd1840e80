"""The audit never contradicts a claim (issue 5): an empirical epsilon lower bound above a
release's claimed epsilon would be a bug in a mechanism or in a statement."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch

from alm_opacus.attacks import epsilon_lower_bound
from alm_opacus.data.split import SplitSizes
from alm_opacus.mechanisms import create_mechanism, make_generator
from alm_opacus.run.evaluation import CLEAN_SUFFIX
from alm_opacus.run.harness import RunConfig, run
from alm_opacus.ssl import SSLConfig

SEEDS = range(20)


@pytest.mark.parametrize(
    "mechanism,epsilon,delta,informative",
    [
        ("alm", 1.0, 0.0, 0.4),
        ("alm", 3.0, 0.0, 0.4),
        ("laplace", 1.0, 0.0, 0.4),
        ("gaussian", 1.0, 1e-5, 0.4),
        # The textbook sigma is larger than the analytic one, so the audit finds less.
        ("gaussian-classic", 0.5, 1e-5, 0.05),
    ],
)
def test_mechanism_audit_is_tight_and_never_violated(
    mechanism: str, epsilon: float, delta: float, informative: float
) -> None:
    """Distinguish M(0) from M(sensitivity) with the optimal (likelihood-ratio, here: a
    threshold) test, the threshold chosen on one half and the bound computed on the other."""
    mech = create_mechanism(mechanism)
    scale = mech.calibrate(epsilon=epsilon, delta=delta, sensitivity=1.0)
    bounds = []
    for seed in SEEDS:
        g = make_generator(seed=seed)
        n = 20_000
        out_world = mech.sample(2 * n, scale=scale, generator=g).numpy()  # neighbour: f = 0
        in_world = 1.0 + mech.sample(2 * n, scale=scale, generator=g).numpy()  # f = Δ
        # Threshold chosen on the first half by the same Clopper-Pearson bound, so that the
        # bound on the second half is not inflated by selection.
        grid = np.quantile(np.r_[out_world[:n], in_world[:n]], np.linspace(0.5, 0.999, 60))
        scores = [
            epsilon_lower_bound(
                false_positives=int((out_world[:n] > t).sum()),
                negatives=n,
                false_negatives=int((in_world[:n] <= t).sum()),
                positives=n,
                delta=delta,
            )[0]
            for t in grid
        ]
        best = grid[int(np.argmax(scores))]
        fp = int((out_world[n:] > best).sum())
        fn = int((in_world[n:] <= best).sum())
        eps, _, _ = epsilon_lower_bound(
            false_positives=fp, negatives=n, false_negatives=fn, positives=n, delta=delta
        )
        bounds.append(eps)
    assert max(bounds) <= epsilon, (mechanism, max(bounds))
    # ...and the audit is informative: the median bound reaches a fair share of the claim.
    assert float(np.median(bounds)) >= informative * epsilon


@pytest.mark.slow
def test_harness_audit_over_20_seeds_never_exceeds_the_claim(tmp_path: Path) -> None:
    config = RunConfig(
        methods=("alm", "laplace", "gaussian"),
        epsilons=(1.0, 8.0),
        seeds=tuple(SEEDS),
        noise_draws=1,
        attacks=("loss", "confidence", "lira-offline"),
        options={"sensitivity": "analytic"},
        split=SplitSizes(members=60, attacker=120, public=300),
        ssl=SSLConfig(epochs=5),
        out=str(tmp_path / "audit"),
        cache_dir=str(tmp_path / "cache"),
        progress=False,
    )
    torch.manual_seed(0)
    rows = run(config).rows
    audited = [r for r in rows if r.guarantee in ("pure-dp", "approx-dp")]
    # Each attack is run twice per release: with shadows that know the noise, and "-clean".
    assert len(audited) == 20 * 3 * 2 * 3 * 2
    assert {r.attack for r in audited} == {
        a + suffix for a in ("loss", "confidence", "lira-offline") for suffix in ("", CLEAN_SUFFIX)
    }
    violations = [
        (r.method, r.epsilon, r.seed, r.attack, r.eps_lower_bound)
        for r in audited
        if r.eps_lower_bound > r.epsilon
    ]
    assert not violations
    # The unprotected head is the positive control: the same attacks do find membership.
    none = [r for r in rows if r.method == "none"]
    assert all(math.isinf(r.epsilon) for r in none)
    assert np.mean([r.mia_auc for r in none if r.attack == "lira-offline"]) > 0.55
