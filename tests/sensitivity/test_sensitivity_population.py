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


def test_pairs_are_iid_replace_one_subsets_of_the_members_size() -> None:
    rows = draw_population_pairs(population=50, n=20, m=3000, seed=1)
    assert rows.shape == (3000, 21)
    assert all(len(set(r.tolist())) == 21 for r in rows[:100])  # no row twice in a pair
    assert np.array_equal(draw_population_pairs(population=50, n=20, m=5, seed=1), rows[:5])
    # i.i.d. uniform subsets: every row is x (the first extra) with probability 1/50
    counts = np.bincount(rows[:, 19], minlength=50)
    assert counts.min() > 20 and counts.max() < 110  # 60 expected each
    with pytest.raises(ValueError, match="needs at least 21"):
        draw_population_pairs(population=20, n=20, m=1, seed=0)


def test_each_distance_is_that_of_two_heads_trained_on_the_pair(population) -> None:  # type: ignore[no-untyped-def]
    x, y = population
    sample = sample_population_sensitivity(x, y, n=40, num_classes=10, config=FAST, seed=3,
                                           m=4, population="digits rows", chunk_size=4)  # fmt: skip
    rows = draw_population_pairs(population=200, n=40, m=4, seed=3)
    for k in (0, 3):
        masks = torch.zeros(2, 200, dtype=torch.bool)
        masks[:, torch.as_tensor(rows[k, :39])] = True
        masks[0, int(rows[k, 39])] = True
        masks[1, int(rows[k, 40])] = True
        flat = flat_params(train_heads(x, y, masks=masks, num_classes=10, config=FAST, seed=3))
        diff = flat[0] - flat[1]
        # same arithmetic in another batch: 50 Adam steps keep the two within 1e-9 relative
        assert sample.l1[k] == pytest.approx(float(diff.abs().sum()), rel=1e-9)
        assert sample.l2[k] == pytest.approx(float(diff.norm()), rel=1e-9)
    info = sample.to_info("l1")
    assert info.source.value == "sampled" and info.population == "digits rows"
    assert sample.n == 40 and np.array_equal(sample.pairs, rows[:, 39:])
