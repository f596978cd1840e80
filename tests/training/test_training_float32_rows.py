"""`BufferedGradSampleModule`'s float32 rows for an exact optimizer: bit for bit Opacus's
float64 per-sample gradients rounded to float32, put back exactly (`widen_grad_sample`)
wherever anything but the float32 tiles reads them, and exact training unchanged by them."""

from __future__ import annotations

import warnings
from collections.abc import Callable

import pytest
import torch
from opacus import GradSampleModule
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from alm_opacus.training import PrivacyEngine
from alm_opacus.training import optimizer as optimizer_module
from alm_opacus.training.grad_sample import BufferedGradSampleModule, widen_grad_sample

pytestmark = pytest.mark.filterwarnings("ignore:Full backward hook is firing")


def _head() -> nn.Module:
    return nn.Linear(37, 11).double()  # widths that leave vector tails


def _mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(5, 7), nn.ReLU(), nn.Linear(7, 3)).double()


def _tied() -> nn.Module:
    """One linear layer applied twice in one pass (a second pass through the same hooks)."""
    tied = nn.Linear(5, 5)
    return nn.Sequential(tied, nn.Tanh(), tied, nn.Tanh(), nn.Linear(5, 3)).double()


def _pair(make: Callable[[], nn.Module]) -> tuple[nn.Module, nn.Module]:
    """The same seeded float64 model under Opacus's module and under ours, ours marked as an
    exact optimizer marks its parameters."""
    torch.manual_seed(0)
    theirs = GradSampleModule(make().double())
    torch.manual_seed(0)
    ours = BufferedGradSampleModule(make().double())
    for p in ours.parameters():
        p._float32_rows = True
    return theirs, ours


def _backward(module: nn.Module, x: torch.Tensor) -> None:
    y = torch.arange(len(x)) % 3
    nn.functional.cross_entropy(module(x), y).backward()


def _extreme_inputs(batch: int, width: int) -> torch.Tensor:
    """Inputs whose products reach float32's overflow, its subnormals and its underflow to
    zero, and both signs, beside ordinary values."""
    g = torch.Generator().manual_seed(3)
    x = torch.randn(batch, width, generator=g, dtype=torch.float64)
    x[0, :6] = torch.tensor([1e40, -3e39, 1e-39, -2e-44, 1e-47, 0.0], dtype=torch.float64)
    x[1] *= 1e-38  # every product near the subnormal range
    return x


def test_float32_rows_are_opacus_products_rounded_once_more() -> None:
    theirs, ours = _pair(_head)
    x = _extreme_inputs(9, 37)
    for module in (theirs, ours):
        _backward(module, x)
    p, q = theirs._module.weight, ours._module.weight
    assert q.grad_sample.dtype == torch.float32 and q.grad_sample.shape == (9, 11, 37)
    expected = p.grad_sample.to(torch.float32)
    assert torch.equal(q.grad_sample, expected)  # inf and subnormals included
    assert (
        torch.isinf(expected).any() and (expected.abs() < 1.2e-38).logical_and(expected != 0).any()
    )
    widen_grad_sample(q)
    assert q.grad_sample.dtype == torch.float64 and torch.equal(q.grad_sample, p.grad_sample)
    # the bias is not a product: float64 as in Opacus
    assert torch.equal(ours._module.bias.grad_sample, theirs._module.bias.grad_sample)


def test_unmarked_and_float32_weights_keep_opacus_products() -> None:
    theirs, ours = _pair(_head)
    ours._module.weight._float32_rows = False
    x = torch.randn(4, 37, dtype=torch.float64)
    for module in (theirs, ours):
        _backward(module, x)
    assert ours._module.weight.grad_sample.dtype == torch.float64
    assert torch.equal(ours._module.weight.grad_sample, theirs._module.weight.grad_sample)
    torch.manual_seed(0)
    single = BufferedGradSampleModule(nn.Linear(37, 11))  # float32 weights: no rounding at all
    single._module.weight._float32_rows = True
    _backward(single, x.float())
    assert getattr(single._module.weight, "_float32_factors", None) is None


@pytest.mark.parametrize("make", [_mlp, _tied], ids=["accumulated", "tied"])
def test_second_passes_see_opacus_float64_values(make: Callable[[], nn.Module]) -> None:
    """A tied layer's second pass and accumulated backward passes widen the float32 rows
    first: the per-sample gradients are then Opacus's, bit for bit and float64."""
    theirs, ours = _pair(make)
    g = torch.Generator().manual_seed(1)
    batches = [torch.randn(n, 5, generator=g, dtype=torch.float64) for n in (4, 6)]
    passes = batches if make is _mlp else batches[:1]
    for x in passes:
        for module in (theirs, ours):
            _backward(module, x)
    if make is _tied:  # the head's single pass keeps its float32 rows
        assert ours._module[0].weight.grad_sample.dtype == torch.float64
        assert ours._module[4].weight.grad_sample.dtype == torch.float32
        widen_grad_sample(ours._module[4].weight)
    for p, q in zip(theirs.parameters(), ours.parameters(), strict=True):
        mine = q.grad_sample if isinstance(q.grad_sample, list) else [q.grad_sample]
        them = p.grad_sample if isinstance(p.grad_sample, list) else [p.grad_sample]
        assert len(mine) == len(them) == len(passes)
        for a, b in zip(them, mine, strict=True):
            assert b.dtype == torch.float64 and torch.equal(a, b)


def _train(*, mechanism: str, rows: bool, steps: int = 10) -> list[torch.Tensor]:
    """Exact seeded DP-SGD of a float64 MLP for ``steps`` fixed batches; ``rows=False``
    unmarks the parameters (every step through Opacus's float64 products)."""
    torch.manual_seed(0)
    model = _mlp()
    data = TensorDataset(torch.randn(64, 5, dtype=torch.float64), torch.zeros(64).long())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        private, optimizer, _ = PrivacyEngine(secure_mode=False).make_private(
            module=model,
            optimizer=torch.optim.SGD(model.parameters(), lr=0.5),
            data_loader=DataLoader(data, batch_size=16),
            noise_multiplier=0.7,
            max_grad_norm=0.3,
            noise_mechanism=mechanism,
            noise_generator=torch.Generator().manual_seed(5),
        )
    for p in private.parameters():
        p._float32_rows = rows
    g = torch.Generator().manual_seed(1)
    for _ in range(steps):
        x = torch.randn(16, 5, generator=g, dtype=torch.float64)
        y = torch.randint(0, 3, (16,), generator=g)
        optimizer.zero_grad()
        nn.functional.cross_entropy(private(x), y).backward()
        held = model[0].weight.grad_sample.dtype
        assert held == (torch.float32 if rows else torch.float64)
        optimizer.step()
    return [p.detach().clone() for p in private.parameters()]


@pytest.mark.parametrize("mechanism", ["alm", "laplace", "gaussian"])
@pytest.mark.parametrize("fused", [True, False], ids=["tiles", "float64-path"])
def test_exact_training_is_unchanged_by_float32_rows(
    mechanism: str, fused: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same parameters after 10 exact steps with and without float32 rows, whether the
    float32 tiles take the step or the float64 path does (where the rows are widened)."""
    seen: list[torch.dtype] = []
    if not fused:
        monkeypatch.setattr(optimizer_module, "fused_cell_sums", lambda *a, **k: None)
        norms = optimizer_module.per_sample_norms

        def watched(grad_samples: list[torch.Tensor], **kwargs: str) -> torch.Tensor:
            seen.extend(g.dtype for g in grad_samples)
            return norms(grad_samples, **kwargs)

        monkeypatch.setattr(optimizer_module, "per_sample_norms", watched)
    with_rows = _train(mechanism=mechanism, rows=True)
    # the float64 path clips Opacus's float64 gradients, never the float32 rows
    assert set(seen) == (set() if fused else {torch.float64})
    without = _train(mechanism=mechanism, rows=False)
    for a, b in zip(with_rows, without, strict=True):
        assert torch.equal(a, b)
    assert any(not torch.equal(a, b) for a, b in zip(with_rows, _train_start(), strict=True))


def _train_start() -> list[torch.Tensor]:
    torch.manual_seed(0)
    return [p.detach().clone() for p in _mlp().parameters()]


def test_an_exact_optimizer_marks_its_parameters_and_a_float_one_does_not() -> None:
    for exact in (True, False):
        model = _mlp()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            PrivacyEngine().make_private(
                module=model,
                optimizer=torch.optim.SGD(model.parameters(), lr=0.5),
                data_loader=DataLoader(TensorDataset(torch.randn(8, 5)), batch_size=4),
                noise_multiplier=1.0,
                max_grad_norm=1.0,
                noise_mechanism="gaussian",
                exact=exact,
            )
        assert all(p._float32_rows is exact for p in model.parameters())
