"""The analytic bound of the convex head: its pieces, and the sampled sensitivity below it."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest
import torch

from alm_opacus.data import Dataset
from alm_opacus.heads import HeadConfig, flat_params, head_objective, train_heads
from alm_opacus.protect import Guarantee, PrivacyStatement
from alm_opacus.sensitivity import (
    analytic_sensitivity,
    sample_sensitivity,
    softmax_ce_lipschitz,
    train_convex_heads,
)

N = 150


@pytest.fixture(scope="module")
def data(digits: Dataset) -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.from_numpy(digits.images[:N].reshape(N, -1).astype(np.float64))
    return x, torch.from_numpy(digits.labels[:N])


def test_formula() -> None:
    s = analytic_sensitivity(n=100, l2=0.1, clip_radius=1.0, grad_tol=1e-6, num_params=650)
    assert s.lipschitz == pytest.approx(2.0)  # sqrt(2 * (1 + 1))
    assert s.optimisation_error == pytest.approx(2e-5)
    assert s.value_l2 == pytest.approx(2 * 2.0 / (100 * 0.1) + 2e-5)
    assert s.value_l1 == pytest.approx(math.sqrt(650) * s.value_l2)
    info = s.to_info("l2")
    assert (info.value, info.norm, info.source.value, info.adjacency) == (
        s.value_l2,
        "l2",
        "analytic",
        "replace-one",
    )
    assert s.to_info("l1").value == s.value_l1
    PrivacyStatement(
        epsilon=1.0,
        delta=0.0,
        guarantee=Guarantee.PURE_DP,
        mechanism="laplace",
        sensitivity=s.to_info("l1"),
    )
    removal = analytic_sensitivity(
        n=100, l2=0.1, clip_radius=1.0, grad_tol=0.0, adjacency="remove-one"
    )
    assert removal.value_l1 is None and removal.to_info().adjacency == "remove-one"
    with pytest.raises(ValueError, match="num_params"):
        removal.to_info("l1")


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"n": 0}, "n=0"),
        ({"l2": 0.0}, "l2=0.0"),
        ({"clip_radius": float("inf")}, "clip_radius=inf"),
        ({"grad_tol": -1.0}, "grad_tol=-1.0"),
        ({"grad_tol": float("nan")}, "grad_tol=nan"),
        ({"num_params": 0}, "num_params=0"),
        ({"adjacency": "add-one"}, "adjacency='add-one'"),
    ],
)
def test_invalid_arguments(kwargs: dict[str, object], name: str) -> None:
    args: dict[str, object] = {"n": 10, "l2": 0.1, "clip_radius": 1.0, "grad_tol": 0.0}
    with pytest.raises(ValueError, match=re.escape(name)):
        analytic_sensitivity(**{**args, **kwargs})  # type: ignore[arg-type]


@pytest.mark.parametrize("radius", [0.5, 1.0, 3.0])
def test_lipschitz_constant_is_the_sup_of_gradient_norms(radius: float) -> None:
    # ||grad_w CE|| = ||p - e_y|| * ||(x, 1)||: at most sqrt(2) * sqrt(R^2 + 1), approached
    # when the softmax puts all mass on one wrong class.
    lip = softmax_ce_lipschitz(clip_radius=radius)
    g = torch.Generator().manual_seed(0)
    worst = 0.0
    for scale in (0.1, 1.0, 10.0, 100.0):
        w = (torch.randn(64, 5, 8, generator=g, dtype=torch.float64) * scale).requires_grad_(True)
        b = (torch.randn(64, 5, generator=g, dtype=torch.float64) * scale).requires_grad_(True)
        x = (
            torch.nn.functional.normalize(
                torch.randn(64, 8, generator=g, dtype=torch.float64), dim=1
            )
            * radius
        )
        y = torch.randint(0, 5, (64,), generator=g)
        logits = torch.einsum("bcd,bd->bc", w, x) + b
        torch.nn.functional.cross_entropy(logits, y, reduction="sum").backward()
        assert w.grad is not None and b.grad is not None
        norms = torch.sqrt(w.grad.pow(2).sum((1, 2)) + b.grad.pow(2).sum(1))
        assert float(norms.max()) <= lip * (1 + 1e-12)
        worst = max(worst, float(norms.max()))
    assert worst >= 0.99 * lip


def test_optimisation_error_term(data: tuple[torch.Tensor, torch.Tensor]) -> None:
    # ||w - w*|| <= ||grad F(w)|| / lambda for any w (strong convexity), checked on
    # under-trained Adam heads against the exact minimiser.
    x, y = data
    config = HeadConfig(l2=0.05, clip_radius=1.0, steps=15, lr=0.05)
    masks = torch.ones(3, N, dtype=torch.bool)
    masks[1, 5] = masks[2, :40] = False
    rough = train_heads(x, y, masks=masks, num_classes=10, config=config, seed=0)
    exact = train_convex_heads(x, y, masks=masks, num_classes=10, config=config)
    params = {k: v.clone().requires_grad_(True) for k, v in rough.items()}
    head_objective(params, x, y, masks, config=config).sum().backward()
    gnorm = torch.linalg.vector_norm(flat_params({k: v.grad for k, v in params.items()}), dim=1)  # type: ignore[misc]
    dist = torch.linalg.vector_norm(flat_params(rough) - flat_params(exact.params), dim=1)
    assert (dist > 1e-3).all()  # not trivially close
    assert (dist <= gnorm / config.l2).all()


@pytest.mark.slow
@pytest.mark.parametrize(
    ("l2", "radius"), [(0.05, 1.0), (0.01, 3.0)], ids=["l2=0.05,R=1", "l2=0.01,R=3"]
)
def test_sampled_never_exceeds_analytic(
    data: tuple[torch.Tensor, torch.Tensor], l2: float, radius: float
) -> None:
    """Every leave-one-out pair of the convex head (all n(n-1)/2 replace-one pairs at size
    n - 1, and the n remove-one pairs against the full set) stays within the bound."""
    x, y = data
    config = HeadConfig(l2=l2, clip_radius=radius)
    masks = torch.ones(N + 1, N, dtype=torch.bool)
    masks[torch.arange(N), torch.arange(N)] = False  # row N: the full set
    fit = train_convex_heads(x, y, masks=masks, num_classes=10, config=config)
    flat = flat_params(fit.params)
    num_params = flat.shape[1]
    replace = analytic_sensitivity(
        n=N - 1, l2=l2, clip_radius=radius, grad_tol=fit.tol, num_params=num_params
    )
    loo = flat[:N]
    l2_dist = torch.cdist(loo, loo, p=2.0)
    l1_dist = torch.cdist(loo, loo, p=1.0)
    assert replace.value_l1 is not None
    assert float(l2_dist.max()) <= replace.value_l2
    assert float(l1_dist.max()) <= replace.value_l1
    remove = analytic_sensitivity(
        n=N, l2=l2, clip_radius=radius, grad_tol=fit.tol, adjacency="remove-one"
    )
    assert float(torch.linalg.vector_norm(loo - flat[N], dim=1).max()) <= remove.value_l2
    # and the sampler, run as a user would, agrees with the exhaustive check
    sample = sample_sensitivity(x, y, num_classes=10, config=config, seed=0, m=40, solver="newton")
    assert sample.value_l2 <= replace.value_l2 and sample.value_l1 <= replace.value_l1
    assert sample.value_l2 <= float(l2_dist.max()) * (1 + 1e-9)
