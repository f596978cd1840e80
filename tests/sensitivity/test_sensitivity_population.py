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
    sample = sample_population_sensitivity(x, y, n=40, num_classes=10, config=FAST, seed=3,
                                           m=4, population="digits rows", chunk_size=4)  # fmt: skip
    rows = draw_population_pairs(population=200, n=40, m=4, seed=3)
    for k in (0, 3):
        # the two data sets, materialised row by row (repeats included): an independent path
        d1 = torch.as_tensor(np.r_[rows[k, :39], rows[k, 39]])
        d2 = torch.as_tensor(np.r_[rows[k, :39], rows[k, 40]])
        ones = torch.ones(1, 40, dtype=torch.bool)
        flat = torch.cat([
            flat_params(train_heads(x[d], y[d], masks=ones, num_classes=10, config=FAST, seed=3))
            for d in (d1, d2)
        ])  # fmt: skip
        diff = flat[0] - flat[1]
        # counts weigh a repeated row as its copies do; sums in another order: 50 Adam steps
        # keep the two paths within 1e-9 relative (see test_sensitivity_sampler's tolerances)
        assert sample.l1[k] == pytest.approx(float(diff.abs().sum()), rel=1e-9)
        assert sample.l2[k] == pytest.approx(float(diff.norm()), rel=1e-9)
    info = sample.to_info("l1")
    assert info.source.value == "sampled" and info.population == "digits rows"
    assert sample.n == 40 and np.array_equal(sample.pairs, rows[:, 39:])
