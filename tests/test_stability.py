"""The stability sensitivity of full-batch gradient descent (alm_opacus.sensitivity.stability):
the proven bound holds on every constructed neighbouring pair, a halved bound does not, its
constants match an independent Hessian, and the releases it calibrates claim DP, never
random-DP."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
import torch

from alm_opacus.heads import HeadConfig, flat_params, train_heads
from alm_opacus.sensitivity import analytic_sensitivity
from alm_opacus.sensitivity.stability import (
    UNIT_ROUNDOFF,
    GradientDescentLoop,
    softmax_ce_smoothness,
    stability_sensitivity,
)


def _data(n: int, d: int, c: int, *, seed: int, radius: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows with norms spread over (0, 2R]: about half are clipped."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=g, dtype=torch.float64)
    x = x / x.norm(dim=1, keepdim=True) * torch.rand(n, 1, generator=g, dtype=torch.float64)
    return x * 2 * radius, torch.randint(0, c, (n,), generator=g)


def _pairs(
    n: int, d: int, c: int, *, pairs: int, seed: int, radius: float, adjacency: str
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``pairs`` neighbouring data sets as masks over ``n + pairs`` rows: row ``i`` of the
    base set replaced by (replace-one) or dropped for (remove-one) an extra row."""
    x, y = _data(n + pairs, d, c, seed=seed, radius=radius)
    g = np.random.default_rng(seed)
    base = torch.zeros(pairs, n + pairs, dtype=torch.bool)
    base[:, :n] = True
    other = base.clone()
    for k, i in enumerate(g.integers(0, n, size=pairs)):
        other[k, i] = False
        if adjacency == "replace-one":
            other[k, n + k] = True
    return x, y, base, other


def _distances(
    x: torch.Tensor, y: torch.Tensor, a: torch.Tensor, b: torch.Tensor, config: HeadConfig, c: int
) -> tuple[np.ndarray, np.ndarray]:
    wa = flat_params(train_heads(x, y, masks=a, num_classes=c, config=config, seed=0))
    wb = flat_params(train_heads(x, y, masks=b, num_classes=c, config=config, seed=0))
    diff = wa - wb
    return diff.norm(dim=1).numpy(), diff.abs().sum(1).numpy()


RECIPES = [  # (steps, lr, l2, radius): contraction 1 - eta lambda, rho = 1, and rho > 1
    (50, 1.0, 0.0, 1.0),
    (200, 0.5, 0.05, 1.0),
    (10, 2.4, 0.0, 1.0),
    (20, 0.3, 0.0, 3.0),
    (40, 1.2, 0.01, 1.5),
]


@pytest.mark.parametrize("adjacency", ["replace-one", "remove-one"])
@pytest.mark.parametrize(("steps", "lr", "l2", "radius"), RECIPES)
def test_the_bound_holds_on_every_constructed_neighbouring_pair(
    adjacency: str, steps: int, lr: float, l2: float, radius: float
) -> None:
    n, d, c, pairs = 25, 4, 3, 120
    x, y, a, b = _pairs(n, d, c, pairs=pairs, seed=steps, radius=radius, adjacency=adjacency)
    config = HeadConfig(solver="gd", steps=steps, lr=lr, l2=l2, clip_radius=radius)
    l2_dist, l1_dist = _distances(x, y, a, b, config, c)
    bound = stability_sensitivity(
        n=n,
        steps=steps,
        lr=lr,
        l2=l2,
        clip_radius=radius,
        num_features=d,
        num_classes=c,
        adjacency=adjacency,
    )
    assert (l2_dist <= bound.value_l2).all(), (l2_dist.max(), bound.value_l2)
    assert (l1_dist <= bound.value_l1).all(), (l1_dist.max(), bound.value_l1)
    assert l2_dist.max() > 0  # the pairs do differ
    # the L1 bound's looseness: sqrt(P) against the measured ||v||_1 / ||v||_2
    assert (l1_dist / l2_dist).max() <= math.sqrt(bound.num_params)


def test_a_halved_bound_is_falsified_by_a_constructed_pair() -> None:
    """The differing row sits at +R or -R on one axis with a label the other rows make
    unlikely, so each step's gradient difference is close to 2L/n and they add up."""
    n, radius, steps, lr = 100, 3.0, 200, 0.2  # lr <= 2 / beta = 0.4: rho = 1
    x = torch.zeros(n + 1, 2, dtype=torch.float64)
    y = torch.zeros(n + 1, dtype=torch.long)
    x[n - 1, 0], x[n, 0] = radius, -radius
    y[n - 1] = y[n] = 1
    a = torch.ones(1, n + 1, dtype=torch.bool)
    a[0, n] = False
    b = torch.ones(1, n + 1, dtype=torch.bool)
    b[0, n - 1] = False
    config = HeadConfig(solver="gd", steps=steps, lr=lr, l2=0.0, clip_radius=radius)
    l2_dist, _ = _distances(x, y, a, b, config, 2)
    bound = stability_sensitivity(
        n=n, steps=steps, lr=lr, l2=0.0, clip_radius=radius, num_features=2, num_classes=2
    )
    assert bound.contraction == pytest.approx(1.0)
    assert bound.value_l2 / 2 < l2_dist[0] <= bound.value_l2


def test_the_smoothness_constant_is_the_largest_hessian_eigenvalue() -> None:
    """Independent check of beta = (R^2 + 1) / 2: the Hessian of softmax cross-entropy in
    [W, b] by autograd never exceeds it, and reaches it at W = 0 with two classes."""
    radius = 1.7
    beta = softmax_ce_smoothness(clip_radius=radius)
    g = torch.Generator().manual_seed(0)

    def top_eigenvalue(w0: torch.Tensor, x: torch.Tensor, label: int) -> float:
        x1 = torch.cat([x, torch.ones(1, dtype=x.dtype)])

        def loss(flat: torch.Tensor) -> torch.Tensor:
            logits = flat.view(w0.shape) @ x1
            return torch.nn.functional.cross_entropy(logits[None], torch.tensor([label]))

        h = torch.autograd.functional.hessian(loss, w0.flatten())
        return float(torch.linalg.eigvalsh(h).max())

    x = torch.randn(3, generator=g, dtype=torch.float64)
    x = x / x.norm() * radius
    assert top_eigenvalue(torch.zeros(2, 4, dtype=torch.float64), x, 0) == pytest.approx(
        beta, rel=1e-12
    )
    for _ in range(20):
        w = torch.randn(4, 4, generator=g, dtype=torch.float64)
        assert top_eigenvalue(w, x, 1) <= beta * (1 + 1e-12)


def test_the_bound_matches_its_closed_forms() -> None:
    n, d, c, radius = 1000, 16, 10, 1.0
    lip = math.sqrt(2 * (radius**2 + 1))
    common: dict[str, Any] = {"n": n, "clip_radius": radius, "num_features": d, "num_classes": c}
    plain = stability_sensitivity(steps=100, lr=1.0, l2=0.0, **common)
    assert plain.exact_l2 == pytest.approx(2 * 1.0 * lip * 100 / n, rel=1e-9)
    decayed = stability_sensitivity(steps=100, lr=0.5, l2=0.1, **common)
    assert decayed.contraction == pytest.approx(1 - 0.05, rel=1e-12)
    expected = 2 * lip / (0.1 * n) * (1 - 0.95**100)
    assert decayed.exact_l2 == pytest.approx(expected, rel=1e-9)
    # many steps: the converged head's analytic bound 2L / (lambda n) (Chaudhuri et al.)
    limit = stability_sensitivity(steps=20_000, lr=0.5, l2=0.1, **common)
    converged = analytic_sensitivity(n=n, l2=0.1, clip_radius=radius, grad_tol=0.0)
    assert limit.exact_l2 == pytest.approx(converged.value_l2, rel=1e-9)
    assert limit.exact_l2 <= converged.value_l2 * (1 + 1e-9)
    # float64 rounding is a vanishing part; L1 is sqrt(P) times L2
    assert 0 < plain.rounding_l2 < 1e-9 * plain.exact_l2
    assert plain.value_l1 == pytest.approx(math.sqrt(c * (d + 1)) * plain.value_l2, rel=1e-9)


def test_the_rounding_bound_covers_a_float32_run_against_float64() -> None:
    """Independent check of the floating-point term: the same steps in float32 and float64
    from the same start on the same (float32-exact, unclipped) data end within the sum of
    both dtypes' rounding bounds of each other."""
    from alm_opacus.heads import _train_linear  # the loop the bound is derived for

    n, d, c, steps, lr, l2, radius = 300, 20, 5, 150, 1.0, 1e-3, 1.0
    g = torch.Generator().manual_seed(1)
    x = torch.randn(n, d, generator=g)
    x = (x / x.norm(dim=1, keepdim=True) * 0.99).float()  # inside the radius: never clipped
    y = torch.randint(0, c, (n,), generator=g)
    init = {
        "fc.weight": (torch.rand(c, d, generator=g) * 2 - 1) / math.sqrt(d),
        "fc.bias": (torch.rand(c, generator=g) * 2 - 1) / math.sqrt(d),
    }
    masks = torch.ones(1, n, dtype=torch.bool)
    out = {}
    for dtype in ("float32", "float64"):
        config = HeadConfig(solver="gd", steps=steps, lr=lr, l2=l2, clip_radius=radius, dtype=dtype)
        t = config.torch_dtype
        p = _train_linear(x.to(t), y, masks, {k: v.to(t) for k, v in init.items()}, config)
        out[dtype] = flat_params(p).double()
    measured = float((out["float32"] - out["float64"]).norm())
    bounds = {
        dtype: GradientDescentLoop(
            lr=lr,
            l2=l2,
            clip_radius=radius,
            rows=n,
            num_features=d,
            num_classes=c,
            unit_roundoff=UNIT_ROUNDOFF[dtype],
        ).rounding(steps=steps)
        for dtype in UNIT_ROUNDOFF
    }
    assert 0 < measured <= bounds["float32"] + bounds["float64"]


@pytest.mark.parametrize(
    ("changes", "match"),
    [
        ({"n": 0}, "n=0"),
        ({"steps": 0}, "steps=0"),
        ({"lr": 0.0}, "lr=0.0"),
        ({"lr": float("nan")}, "lr=nan"),
        ({"l2": -1.0}, "l2=-1.0"),
        ({"clip_radius": -1.0}, "clip_radius=-1.0"),
        ({"num_classes": 1}, "num_classes=1"),
        ({"dtype": "float16"}, "dtype='float16'"),
        ({"adjacency": "swap"}, "adjacency='swap'"),
    ],
)
def test_invalid_values_are_refused_with_their_name(changes: dict, match: str) -> None:
    kwargs = {
        "n": 10,
        "steps": 5,
        "lr": 0.5,
        "l2": 0.0,
        "clip_radius": 1.0,
        "num_features": 3,
        "num_classes": 2,
        **changes,
    }
    with pytest.raises(ValueError, match=match):
        stability_sensitivity(**kwargs)


@pytest.mark.parametrize(
    ("method", "guarantee"), [("laplace", "pure-dp"), ("gaussian", "approx-dp")]
)
def test_stability_releases_claim_dp_on_the_gradient_descent_head(
    pixel_features: tuple[torch.Tensor, torch.Tensor], method: str, guarantee: str
) -> None:
    """``--sensitivity stability``: the released head is the one the bound covers (T GD steps
    from the seeded start), and its statement is pure or approximate DP, never random-DP."""
    from alm_opacus.method_base import MethodContext, NoisePolicy, ReleaseRequest
    from alm_opacus.methods import create_method

    x, y = pixel_features[0][:150], pixel_features[1][:150]
    context = MethodContext(
        num_classes=10, head=HeadConfig(), dataset="digits", noise=NoisePolicy(reproducible=True)
    )
    options = {"sensitivity": "stability", "stability_steps": 30, "stability_lr": 0.8}
    protect = create_method(method, options=options)
    prepared = protect.prepare(features=x, labels=y, seed=4, context=context)
    config = HeadConfig(solver="gd", steps=30, lr=0.8, l2=1e-3, clip_radius=1.0)
    expected = train_heads(
        x, y, masks=torch.ones(1, len(y), dtype=torch.bool), num_classes=10, config=config, seed=4
    )
    assert torch.equal(
        flat_params({k: v.unsqueeze(0) for k, v in prepared.head.state_dict().items()}),
        flat_params(expected),
    )
    bound = stability_sensitivity(
        n=150, steps=30, lr=0.8, l2=1e-3, clip_radius=1.0, num_features=64, num_classes=10
    )
    release = protect.release(
        prepared,
        ReleaseRequest(
            features=x, labels=y, epsilon=1.0, delta=1e-5, seed=4, draw=0, context=context
        ),
    )
    st = release.statement
    assert st.guarantee.value == guarantee
    assert st.sensitivity is not None and st.sensitivity.source.value == "analytic"
    norm = "l1" if method == "laplace" else "l2"
    assert st.sensitivity.value == (bound.value_l1 if norm == "l1" else bound.value_l2)
    assert st.sensitivity.gamma is None and st.sensitivity.confidence is None
    assert release.info["steps"] == 30 and release.info["contraction"] == bound.contraction
    # the statement names the recipe its bound covers, and survives its round trip
    assert "T=30 full-batch gradient-descent steps of eta=0.8" in str(st)
    assert type(st).from_dict(st.to_dict()) == st


def test_a_derivation_is_refused_on_a_sampled_sensitivity() -> None:
    from alm_opacus.statement import SensitivityInfo

    with pytest.raises(ValueError, match="derivation='proven' given for a sensitivity of source"):
        SensitivityInfo(
            value=1.0,
            norm="l2",
            source="sampled",  # type: ignore[arg-type]
            m=10,
            gamma=0.1,
            confidence=0.9,
            derivation="proven",
        )
