"""Rubinstein & Aldà's sampler on a non-private population sample (issue 11, item 2)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from alm_opacus.data import Dataset
from alm_opacus.heads import HeadConfig, flat_params, train_heads
from alm_opacus.sensitivity import draw_population_pairs, sample_population_sensitivity

FAST = HeadConfig(steps=50)


@pytest.fixture(scope="module")
def population(digits: Dataset) -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.from_numpy(digits.images[:200].reshape(200, -1).astype(np.float64))
    return torch.nn.functional.normalize(x, dim=1), torch.from_numpy(digits.labels[:200])


def test_pairs_are_iid_draws_of_the_members_size() -> None:
    from scipy import stats

    rows = draw_population_pairs(population=50, n=20, m=3000, seed=1)
    assert rows.shape == (3000, 21) and rows.min() >= 0 and rows.max() < 50
    assert np.array_equal(draw_population_pairs(population=50, n=20, m=5, seed=1), rows[:5])
    # i.i.d. uniform draws with replacement: every cell of the table is uniform on 50 rows
    counts = np.bincount(rows.ravel(), minlength=50)
    assert stats.chisquare(counts).pvalue > 1e-6
    # and a data set holds repeats as often as sampling with replacement predicts
    repeats = np.mean([20 - len(set(r[:20].tolist())) for r in rows])
    expected = 20 - 50 * (1 - (49 / 50) ** 20)  # n minus the expected number of distinct rows
    assert repeats == pytest.approx(expected, abs=0.15)
    with pytest.raises(ValueError, match="at least 2 rows"):
        draw_population_pairs(population=1, n=20, m=1, seed=0)


def test_each_distance_is_that_of_two_heads_trained_on_the_pair(population) -> None:  # type: ignore[no-untyped-def]
    x, y = population
    sample = sample_population_sensitivity(
        x, y, n=40, num_classes=10, config=FAST, seed=3, m=4, population="digits rows", chunk_size=4
    )
    rows = draw_population_pairs(population=200, n=40, m=4, seed=3)
    for k in (0, 3):
        # the two data sets, materialised row by row (repeats included): an independent path
        d1 = torch.as_tensor(np.r_[rows[k, :39], rows[k, 39]])
        d2 = torch.as_tensor(np.r_[rows[k, :39], rows[k, 40]])
        ones = torch.ones(1, 40, dtype=torch.bool)
        flat = torch.cat(
            [
                flat_params(
                    train_heads(x[d], y[d], masks=ones, num_classes=10, config=FAST, seed=3)
                )
                for d in (d1, d2)
            ]
        )
        diff = flat[0] - flat[1]
        # counts weigh a repeated row as its copies do; sums in another order: 50 Adam steps
        # keep the two paths within 1e-9 relative (see test_sensitivity_sampler's tolerances)
        assert sample.l1[k] == pytest.approx(float(diff.abs().sum()), rel=1e-9)
        assert sample.l2[k] == pytest.approx(float(diff.norm()), rel=1e-9)
    info = sample.to_info("l1")
    assert info.source.value == "sampled" and info.population == "digits rows"
    assert sample.n == 40 and np.array_equal(sample.pairs, rows[:, 39:])


# Warm starts (issue 21). Each head of either run is within tol / l2 of its unique minimiser:
# the trainer stops at ||grad F|| <= tol, and l2-strong convexity gives ||w - w*|| <=
# ||grad F|| / l2. A distance moves by at most the sum of its two heads' moves, each at most
# 2 tol / l2 between the runs, so |warm - cold| <= 4 tol / l2 in L2, and sqrt(P) times that
# in L1 (||v||_1 <= sqrt(P) ||v||_2 for P parameters).
CONVEX = HeadConfig(l2=0.01, solver="newton")


@pytest.mark.parametrize("solver", ["adam", "newton"])  # the config's Newton, or the sampler's
def test_warm_started_sampler_agrees_with_the_cold_start(population, solver: str) -> None:  # type: ignore[no-untyped-def]
    from alm_opacus.sensitivity import DEFAULT_TOL

    x, y = population
    kw = {
        "n": 60,
        "num_classes": 10,
        "config": CONVEX,
        "seed": 5,
        "m": 12,
        "population": "digits rows",
        "chunk_size": 8,
        "solver": solver,
    }
    warm = sample_population_sensitivity(x, y, **kw)  # type: ignore[arg-type]
    cold = sample_population_sensitivity(x, y, warm_start=False, **kw)  # type: ignore[arg-type]
    assert np.array_equal(warm.pairs, cold.pairs)
    bound = 4 * DEFAULT_TOL / CONVEX.l2
    params = 10 * (x.shape[1] + 1)
    assert np.max(np.abs(warm.l2 - cold.l2)) <= bound
    assert np.max(np.abs(warm.l1 - cold.l1)) <= np.sqrt(params) * bound
    assert cold.l2.min() > 1e4 * bound  # the distances themselves are far above the tolerance


def test_warm_started_algorithm_2_agrees_with_the_cold_start(population) -> None:  # type: ignore[no-untyped-def]
    from alm_opacus.sensitivity import DEFAULT_TOL, sample_sensitivity

    x, y = population
    kw = {"num_classes": 10, "config": CONVEX, "seed": 2, "m": 10, "chunk_size": 7}
    warm = sample_sensitivity(x[:80], y[:80], **kw)  # type: ignore[arg-type]
    cold = sample_sensitivity(x[:80], y[:80], warm_start=False, **kw)  # type: ignore[arg-type]
    bound = 4 * DEFAULT_TOL / CONVEX.l2
    assert np.max(np.abs(warm.l2 - cold.l2)) <= bound
    assert np.max(np.abs(warm.l1 - cold.l1)) <= np.sqrt(10 * (x.shape[1] + 1)) * bound


def test_a_chunk_is_a_pure_unit_of_work(population) -> None:  # type: ignore[no-untyped-def]
    # the pairs of a chunk depend on the seed and their indices only, so any executor may
    # run any chunk anywhere: two chunks of a run equal the run
    from alm_opacus.sensitivity import SamplerRecipe, population_chunk

    x, y = population
    recipe = SamplerRecipe(num_classes=10, config=FAST, seed=3)
    whole = sample_population_sensitivity(
        x,
        y,
        n=40,
        num_classes=10,
        config=FAST,
        seed=3,
        m=6,
        population="digits rows",
        chunk_size=12,
    )
    parts = [
        population_chunk(x, y, recipe=recipe, n=40, seed=3, pairs=range(a, b))
        for a, b in ((4, 6), (0, 4))
    ]
    np.testing.assert_allclose(np.r_[parts[1][1], parts[0][1]], whole.l2, rtol=1e-9)
    np.testing.assert_array_equal(np.r_[parts[1][2], parts[0][2]], whole.pairs)
