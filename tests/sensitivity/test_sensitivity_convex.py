"""The convex head's Newton-CG trainer, against scikit-learn and autograd gradients."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch
from sklearn.linear_model import LogisticRegression

from alm_opacus.data import Dataset
from alm_opacus.heads import HeadConfig, clip_features, head_objective
from alm_opacus.sensitivity import DEFAULT_TOL, train_convex_heads

N = 150
CONFIG = HeadConfig(l2=0.02, clip_radius=1.0)


@pytest.fixture(scope="module")
def data(digits: Dataset) -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.from_numpy(digits.images[:N].reshape(N, -1).astype(np.float64))
    return x, torch.from_numpy(digits.labels[:N])


def _masks() -> torch.Tensor:
    masks = torch.ones(5, N, dtype=torch.bool)
    masks[torch.arange(1, 5), torch.tensor([0, 17, 80, 149])] = False
    masks[4, :60] = False
    return masks


def test_matches_sklearn(data: tuple[torch.Tensor, torch.Tensor]) -> None:
    # sklearn minimises C * sum CE + ||w||^2 / 2; ours is mean CE + l2 ||w||^2 / 2 over
    # weights and biases, so C = 1 / (n_b * l2) with the bias as a constant feature.
    x, y = data
    masks = _masks()
    fit = train_convex_heads(x, y, masks=masks, num_classes=10, config=CONFIG)
    xa = np.hstack([clip_features(x, CONFIG.clip_radius).numpy(), np.ones((N, 1))])
    for b in (0, 4):
        rows = masks[b].numpy()
        ref = LogisticRegression(
            C=1 / (rows.sum() * CONFIG.l2), fit_intercept=False, tol=1e-12, max_iter=10_000
        ).fit(xa[rows], y.numpy()[rows])
        ours = np.hstack([fit.params["fc.weight"][b].numpy(), fit.params["fc.bias"][b][:, None]])
        assert np.max(np.abs(ours - ref.coef_)) <= 1e-5 * np.max(np.abs(ref.coef_))


def test_gradient_norms_by_autograd(data: tuple[torch.Tensor, torch.Tensor]) -> None:
    x, y = data
    masks = _masks()
    fit = train_convex_heads(x, y, masks=masks, num_classes=10, config=CONFIG, tol=1e-11)
    params = {k: v.clone().requires_grad_(True) for k, v in fit.params.items()}
    head_objective(params, x, y, masks, config=CONFIG).sum().backward()
    grads = torch.cat([params[k].grad.flatten(1) for k in sorted(params)], 1)  # type: ignore[union-attr]
    norms = torch.linalg.vector_norm(grads, dim=1)
    assert (norms <= 1e-11).all()
    torch.testing.assert_close(norms, fit.grad_norms, rtol=0, atol=1e-13)
    assert fit.tol == 1e-11 and fit.iterations >= 1


def test_deterministic_and_batch_independent(data: tuple[torch.Tensor, torch.Tensor]) -> None:
    x, y = data
    masks = _masks()
    a = train_convex_heads(x, y, masks=masks, num_classes=10, config=CONFIG)
    b = train_convex_heads(x, y, masks=masks, num_classes=10, config=CONFIG)
    assert all(torch.equal(a.params[k], b.params[k]) for k in a.params)
    alone = train_convex_heads(x, y, masks=masks[2:3], num_classes=10, config=CONFIG)
    for k in a.params:
        diff = (alone.params[k][0] - a.params[k][2]).abs().max()
        assert float(diff) <= 2 * DEFAULT_TOL / CONFIG.l2  # both within tol/l2 of w*


@pytest.mark.parametrize(
    ("config", "name"),
    [
        (HeadConfig(kind="mlp", l2=0.1), "kind='mlp'"),
        (HeadConfig(l2=0.0), "l2=0.0"),
        (HeadConfig(l2=0.1, dtype="float32"), "dtype='float32'"),
    ],
)
def test_rejects_non_convex_configs(
    data: tuple[torch.Tensor, torch.Tensor], config: HeadConfig, name: str
) -> None:
    x, y = data
    with pytest.raises(ValueError, match=re.escape(name)):
        train_convex_heads(x, y, masks=_masks(), num_classes=10, config=config)


def test_errors(data: tuple[torch.Tensor, torch.Tensor]) -> None:
    x, y = data
    with pytest.raises(RuntimeError, match="did not reach tol"):
        train_convex_heads(x, y, masks=_masks(), num_classes=10, config=CONFIG, max_iter=1)
    with pytest.raises(ValueError, match="tol=0"):
        train_convex_heads(x, y, masks=_masks(), num_classes=10, config=CONFIG, tol=0)
    empty = _masks()
    empty[3] = False
    with pytest.raises(ValueError, match="at least one example"):
        train_convex_heads(x, y, masks=empty, num_classes=10, config=CONFIG)


def test_a_warm_start_reaches_the_same_minimiser_in_fewer_iterations(
    data: tuple[torch.Tensor, torch.Tensor],
) -> None:
    x, y = data
    masks = _masks()
    cold = train_convex_heads(x, y, masks=masks, num_classes=10, config=CONFIG)
    ones = torch.ones(1, N, dtype=torch.bool)
    whole = train_convex_heads(x, y, masks=ones, num_classes=10, config=CONFIG).params
    warm = train_convex_heads(
        x, y, masks=masks, num_classes=10, config=CONFIG, init={k: v[0] for k, v in whole.items()}
    )
    per_head = train_convex_heads(
        x, y, masks=masks, num_classes=10, config=CONFIG, init=cold.params
    )
    for fit in (warm, per_head):
        assert (fit.grad_norms <= DEFAULT_TOL).all()
        for k in cold.params:  # both within tol / l2 of the one minimiser
            diff = (fit.params[k] - cold.params[k]).abs().max()
            assert float(diff) <= 2 * DEFAULT_TOL / CONFIG.l2
    assert warm.iterations < cold.iterations
    assert per_head.iterations <= 1  # started at the minimiser: at most one polishing step
    with pytest.raises(ValueError, match=r"init=.* is invalid"):
        train_convex_heads(
            x,
            y,
            masks=masks,
            num_classes=10,
            config=CONFIG,
            init={"fc.weight": whole["fc.weight"][:, :5]},
        )
