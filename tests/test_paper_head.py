"""The ALM paper's fine-tuning recipe (alm_opacus.paper_head, ``solver="keras"``) against a
per-head loop written from Keras's documented Adam update, and through Algorithm 2."""

from __future__ import annotations

import math

import pytest
import torch

from alm_opacus.heads import HeadConfig, train_heads
from alm_opacus.paper_head import PAPER_RECIPE, epoch_generator, glorot_uniform


def _reference(
    x: torch.Tensor, y: torch.Tensor, rows: torch.Tensor, *, epochs: int, batch: int, seed: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """One head, one row at a time where it matters: Keras's Adam (tf.keras.optimizers.Adam:
    lr_t = lr sqrt(1 - b2^t) / (1 - b1^t), w -= lr_t m / (sqrt(v) + 1e-7)), mean
    cross-entropy per batch, Glorot-uniform kernel, zero bias."""
    g = torch.Generator().manual_seed(seed)
    d, c = x.shape[1], 3
    limit = math.sqrt(6 / (d + c))
    kernel = (torch.rand(d, c, generator=g, dtype=torch.float64) * 2 - 1) * limit
    w, b = kernel.t().clone(), torch.zeros(c, dtype=torch.float64)
    mw, vw, mb, vb = (torch.zeros_like(w), torch.zeros_like(w), torch.zeros(c), torch.zeros(c))
    mb, vb = mb.double(), vb.double()
    t = 0
    for epoch in range(epochs):
        order = torch.randperm(len(rows), generator=epoch_generator(seed, epoch))
        for start in range(0, len(rows), batch):
            chosen = rows[order[start : start + batch]]
            gw, gb = torch.zeros_like(w), torch.zeros_like(b)
            for i in chosen.tolist():  # the gradient of the batch mean, row by row
                p = torch.softmax(w @ x[i] + b, 0)
                p[y[i]] -= 1
                gw += torch.outer(p, x[i]) / len(chosen)
                gb += p / len(chosen)
            t += 1
            lr_t = 1e-3 * math.sqrt(1 - 0.999**t) / (1 - 0.9**t)
            for param, grad, m, v in ((w, gw, mw, vw), (b, gb, mb, vb)):
                m.mul_(0.9).add_(0.1 * grad)
                v.mul_(0.999).add_(0.001 * grad * grad)
                param -= lr_t * m / (v.sqrt() + 1e-7)
    return w, b


def test_the_keras_solver_matches_a_loop_written_from_kerass_update() -> None:
    g = torch.Generator().manual_seed(0)
    n, d = 23, 4
    x = torch.randn(n, d, generator=g, dtype=torch.float64)
    y = torch.randint(0, 3, (n,), generator=g)
    masks = torch.ones(3, n, dtype=torch.bool)
    masks[1, 5] = False  # two neighbours of equal size share each epoch's order
    masks[2, 7] = False
    config = HeadConfig(solver="keras", steps=3, lr=1e-3, batch_size=5)
    params = train_heads(x, y, masks=masks, num_classes=3, config=config, seed=2)
    for h in range(3):
        w, b = _reference(x, y, masks[h].nonzero().flatten(), epochs=3, batch=5, seed=2)
        torch.testing.assert_close(params["fc.weight"][h], w, rtol=1e-10, atol=1e-12)
        torch.testing.assert_close(params["fc.bias"][h], b, rtol=1e-10, atol=1e-12)
    assert not torch.equal(params["fc.weight"][1], params["fc.weight"][2])


def test_the_paper_recipe_is_kerass_default_and_glorot_bounds_hold() -> None:
    assert (PAPER_RECIPE.solver, PAPER_RECIPE.steps, PAPER_RECIPE.batch_size) == ("keras", 20, 525)
    assert PAPER_RECIPE.lr == 1e-3 and PAPER_RECIPE.l2 == 0.0
    k = glorot_uniform(128, 10, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    limit = math.sqrt(6 / 138)
    assert k.abs().max() <= limit and k.abs().max() > 0.9 * limit  # U(-l, l), filled to l
    assert abs(float(k.var()) - limit**2 / 3) < 0.1 * limit**2 / 3


def test_the_paper_recipe_runs_through_algorithm_2() -> None:
    from alm_opacus.sensitivity import sample_sensitivity

    g = torch.Generator().manual_seed(1)
    x = torch.nn.functional.normalize(torch.randn(60, 8, generator=g, dtype=torch.float64), dim=1)
    y = torch.randint(0, 3, (60,), generator=g)
    recipe = PAPER_RECIPE.replace(steps=2, batch_size=16)
    sample = sample_sensitivity(x, y, num_classes=3, config=recipe, seed=0, m=6, gamma=0.5)
    assert sample.value_l2 > 0 and math.isfinite(sample.value_l1)
    assert sample.value_l1 >= sample.value_l2


@pytest.mark.parametrize(
    ("changes", "match"),
    [
        ({"batch_size": 10}, "batch_size=10 is invalid with solver='adam'"),
        ({"solver": "keras", "batch_size": 0}, "batch_size=0 is invalid"),
    ],
)
def test_batch_size_belongs_to_the_keras_solver(changes: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        HeadConfig(**changes)
