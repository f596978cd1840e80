"""`BufferedGradSampleModule`: Opacus's per-sample gradients bit for bit (every layer kind a
head or an encoder uses, tied and 3-D linear layers, short and growing batches, functorch),
Opacus's accumulation across backward passes without aliasing, the reuse of each buffer once
the optimizer consumed it, and the engine's choice of module for each grad sample mode."""

from __future__ import annotations

import warnings
from collections.abc import Callable

import pytest
import torch
from opacus import GradSampleModule
from opacus.grad_sample import GradSampleModuleExpandedWeights
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from alm_opacus.training import PrivacyEngine
from alm_opacus.training.grad_sample import BufferedGradSampleModule

# the first layer's inputs need no gradient: Opacus's hooks warn on every backward pass
pytestmark = pytest.mark.filterwarnings("ignore:Full backward hook is firing")


class _Mixed(nn.Module):
    """An embedding, a linear layer used twice in one pass on 3-D inputs (tied), a layer norm,
    a 1-D convolution and a linear head on 2-D inputs."""

    def __init__(self) -> None:
        super().__init__()
        self.embedding = nn.Embedding(20, 8)
        self.tied = nn.Linear(8, 8)
        self.norm = nn.LayerNorm(8)
        self.conv = nn.Conv1d(1, 2, 3)
        self.head = nn.Linear(12, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.tied(torch.relu(self.tied(self.embedding(x))))
        h = self.norm(h).mean(dim=1)
        return self.head(self.conv(h[:, None, :]).flatten(1))


class _TiedFlat(nn.Module):
    """One linear layer applied twice in one pass to 2-D inputs (the direct path's case)."""

    def __init__(self) -> None:
        super().__init__()
        self.tied = nn.Linear(5, 5)
        self.head = nn.Linear(5, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.tanh(self.tied(torch.tanh(self.tied(x)))))


def _mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(5, 7), nn.ReLU(), nn.Linear(7, 3))


def _inputs(model: nn.Module, batch: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    if isinstance(model, _Mixed):
        return torch.randint(0, 20, (batch, 4), generator=g)
    return torch.randn(batch, 5, generator=g)


def _pair(make: Callable[[], nn.Module], **kwargs: bool) -> tuple[nn.Module, nn.Module]:
    """The same seeded model under Opacus's module and under ours."""
    torch.manual_seed(0)
    theirs = GradSampleModule(make(), **kwargs)
    torch.manual_seed(0)
    ours = BufferedGradSampleModule(make(), **kwargs)
    return theirs, ours


def _backward(module: nn.Module, x: torch.Tensor, *, reduction: str = "mean") -> None:
    y = torch.arange(len(x)) % 3
    nn.functional.cross_entropy(module(x), y, reduction=reduction).backward()


@pytest.mark.parametrize("make", [_mlp, _Mixed, _TiedFlat], ids=["mlp", "mixed", "tied"])
@pytest.mark.parametrize("functorch", [False, True])
def test_per_sample_gradients_are_opacus_bit_for_bit(
    make: Callable[[], nn.Module], functorch: bool
) -> None:
    theirs, ours = _pair(make, force_functorch=functorch)
    for step, batch in enumerate((6, 9, 4, 9)):  # the buffer grows, then is viewed shorter
        x = _inputs(theirs._module, batch, seed=step)
        for module in (theirs, ours):
            module.zero_grad()
            _backward(module, x)
        pairs = zip(theirs.parameters(), ours.parameters(), strict=True)
        for p, q in pairs:
            assert q.grad_sample.shape == (batch, *q.shape)
            assert torch.equal(p.grad_sample, q.grad_sample)
            assert torch.equal(p.grad, q.grad)
        for p in (*theirs.parameters(), *ours.parameters()):
            p.grad_sample = None  # what DPOptimizer.zero_grad does


def test_sum_reduction_and_the_linear_fast_path_match_opacus() -> None:
    theirs, ours = _pair(lambda: nn.Linear(6, 4), loss_reduction="sum")
    x = torch.randn(5, 6)
    for module in (theirs, ours):
        _backward(module, x, reduction="sum")
    assert torch.equal(theirs._module.weight.grad_sample, ours._module.weight.grad_sample)
    assert torch.equal(theirs._module.bias.grad_sample, ours._module.bias.grad_sample)


def test_accumulation_across_backward_passes_stacks_like_opacus_without_aliasing() -> None:
    theirs, ours = _pair(_mlp)
    batches = [torch.randn(4, 5), torch.randn(4, 5), torch.randn(6, 5)]
    first = None
    for x in batches:
        for module in (theirs, ours):
            _backward(module, x)
        if first is None:
            first = ours._module[0].weight.grad_sample.clone()
    for p, q in zip(theirs.parameters(), ours.parameters(), strict=True):
        assert isinstance(q.grad_sample, list) and len(q.grad_sample) == 3
        for a, b in zip(p.grad_sample, q.grad_sample, strict=True):
            assert torch.equal(a, b)
    # the later passes did not write into the first pass's per-sample gradients
    assert torch.equal(ours._module[0].weight.grad_sample[0], first)


def test_a_consumed_buffer_is_reused_and_an_unconsumed_one_is_not() -> None:
    _, ours = _pair(_mlp)
    weight = ours._module[0].weight
    _backward(ours, torch.randn(8, 5))
    storage = weight.grad_sample.data_ptr()
    kept = weight.grad_sample
    weight.grad_sample = None  # consumed, as after DPOptimizer.zero_grad
    _backward(ours, torch.randn(8, 5))
    assert weight.grad_sample.data_ptr() == storage  # no new allocation
    assert kept.data_ptr() == storage  # a kept reference sees the new batch (documented)
    _backward(ours, torch.randn(8, 5))  # not consumed: the new pass gets its own tensor
    assert isinstance(weight.grad_sample, list)
    assert weight.grad_sample[1].data_ptr() != storage


def test_removing_the_hooks_releases_the_buffers() -> None:
    _, ours = _pair(_mlp)
    _backward(ours, torch.randn(8, 5))
    assert isinstance(ours, BufferedGradSampleModule) and ours._grad_sample_buffers
    ours.remove_hooks()
    assert ours._grad_sample_buffers == {}


def _loader() -> DataLoader[tuple[torch.Tensor, ...]]:
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(64, 5, generator=g), torch.randint(0, 3, (64,), generator=g)
    return DataLoader(TensorDataset(x, y), batch_size=16)


def _make_private(module: nn.Module, **kwargs: object) -> tuple[nn.Module, object]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        private, optimizer, _ = PrivacyEngine().make_private(
            module=module,
            optimizer=torch.optim.SGD(module.parameters(), lr=0.5),
            data_loader=_loader(),
            noise_multiplier=0.0,
            max_grad_norm=1.0,
            noise_mechanism="gaussian",
            **kwargs,
        )
    return private, optimizer


@pytest.mark.parametrize(
    ("kwargs", "expected"),
    [
        ({}, BufferedGradSampleModule),
        ({"grad_sample_mode": "functorch"}, BufferedGradSampleModule),
        ({"grad_sample_mode": "ew"}, GradSampleModuleExpandedWeights),
    ],
)
def test_the_engine_buffers_the_hooks_modes_only(kwargs: dict[str, str], expected: type) -> None:
    if kwargs.get("grad_sample_mode") == "ew":
        pytest.importorskip("torch.nn.utils._expanded_weights")
    private, _ = _make_private(_mlp(), **kwargs)
    assert type(private) is expected
    if expected is BufferedGradSampleModule:
        assert private.force_functorch == (kwargs.get("grad_sample_mode") == "functorch")


def test_a_module_wrapped_by_opacus_or_by_us_is_taken_as_it_is() -> None:
    opacus_wrapped = GradSampleModule(_mlp())
    private, _ = _make_private(opacus_wrapped)
    assert private is opacus_wrapped
    ours, _ = _make_private(_mlp())
    again, _ = _make_private(ours)
    assert again is ours
    with pytest.raises(ValueError, match="doesn't match"):  # Opacus's own check and message
        _make_private(ours, loss_reduction="sum")


def test_training_with_buffers_equals_training_with_opacus_module() -> None:
    """Noise-free Gaussian DP-SGD (float steps, so clipping is Opacus's bit for bit): the
    same parameters after 12 steps whether Opacus's module or ours holds the gradients."""
    results = []
    for wrap in (lambda m: GradSampleModule(m), lambda m: m):
        torch.manual_seed(0)
        private, optimizer = _make_private(wrap(_mlp()), exact=False)
        g = torch.Generator().manual_seed(1)
        for _ in range(12):
            x, y = torch.randn(16, 5, generator=g), torch.randint(0, 3, (16,), generator=g)
            optimizer.zero_grad()  # type: ignore[attr-defined]
            nn.functional.cross_entropy(private(x), y).backward()
            optimizer.step()  # type: ignore[attr-defined]
        results.append([p.detach().clone() for p in private.parameters()])
    for a, b in zip(*results, strict=True):
        assert torch.equal(a, b)
