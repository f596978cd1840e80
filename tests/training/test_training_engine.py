"""PrivacyEngine: the two-line switch from an Opacus loop, one budget across releases and
DP-SGD, refusals before anything is modified, and Opacus's own paths left unchanged."""

from __future__ import annotations

import difflib
import math
import pickle
from pathlib import Path
from typing import Any

import opacus
import pytest
import torch
from opacus.data_loader import DPDataLoader
from opacus.optimizers import DPOptimizer
from opacus.utils.uniform_sampler import UniformWithReplacementSampler
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from alm_opacus.accounting import InfeasibleBudget, PipelineAccountant
from alm_opacus.mechanisms import SecureGenerator
from alm_opacus.training import (
    MechanismDPOptimizer,
    PrivacyEngine,
    SecureDPDataLoader,
    noise_multiplier_for,
)

pytestmark = [
    pytest.mark.filterwarnings("ignore:Full backward hook is firing"),
    pytest.mark.filterwarnings("ignore:Secure RNG turned off"),
    pytest.mark.filterwarnings("ignore:Optimal order is the"),
]

DELTA = 1e-5

# A standard Opacus training loop (Opacus's README/tutorial shape) ...
OPACUS_LOOP = """\
import torch
from opacus import PrivacyEngine

model = torch.nn.Linear(4, 2)
optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
privacy_engine = PrivacyEngine()
model, optimizer, train_loader = privacy_engine.make_private(
    module=model,
    optimizer=optimizer,
    data_loader=train_loader,
    noise_multiplier=1.0,
    max_grad_norm=1.0,
)
for epoch in range(5):
    for x, y in train_loader:
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
epsilon = privacy_engine.get_epsilon(delta=1e-5)
"""

# ... and the same loop with logistic (ALM) noise: the README's snippet.
ALM_LOOP = """\
import torch
from alm_opacus.training import PrivacyEngine, l1_clip

model = torch.nn.Linear(4, 2)
optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
privacy_engine = PrivacyEngine()
model, optimizer, train_loader = privacy_engine.make_private(
    module=model,
    optimizer=optimizer,
    data_loader=train_loader,
    noise_multiplier=1.0,
    max_grad_norm=l1_clip(1.0, params=model), noise_mechanism="alm",
)
for epoch in range(5):
    for x, y in train_loader:
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
epsilon = privacy_engine.get_epsilon(delta=1e-5)
"""


def _data(n: int = 512, seed: int = 0) -> TensorDataset:
    g = torch.Generator().manual_seed(seed)
    y = torch.arange(n) % 2
    # two well-separated clusters: any reasonable training reaches ~100% accuracy
    x = 3.0 * (2 * y[:, None] - 1).float() * torch.ones(1, 4) + torch.randn(n, 4, generator=g)
    return TensorDataset(x, y)


def _loader(batch_size: int = 64, **kw: Any) -> DataLoader[tuple[torch.Tensor, ...]]:
    return DataLoader(_data(), batch_size=batch_size, **kw)


def _run(source: str) -> dict[str, Any]:
    namespace: dict[str, Any] = {"train_loader": _loader()}
    exec(compile(source, "<loop>", "exec"), namespace)
    return namespace


@pytest.mark.slow
def test_switching_an_opacus_loop_to_logistic_noise_changes_two_lines() -> None:
    diff = [
        line
        for line in difflib.unified_diff(OPACUS_LOOP.splitlines(), ALM_LOOP.splitlines(), n=0)
        if line[:1] in "+-" and not line.startswith(("+++", "---"))
    ]
    assert len([d for d in diff if d.startswith("-")]) == 2
    assert len([d for d in diff if d.startswith("+")]) == 2

    plain, ours = _run(OPACUS_LOOP), _run(ALM_LOOP)
    assert type(plain["optimizer"]) is DPOptimizer  # Opacus's own path, untouched
    opt, engine = ours["optimizer"], ours["privacy_engine"]
    assert isinstance(opt, MechanismDPOptimizer) and opt.noise_mechanism == "alm"
    assert opt.clipping_norm == "l1" and isinstance(opt.generator, SecureGenerator)
    assert isinstance(ours["train_loader"], SecureDPDataLoader)
    # the hook recorded 5 epochs x 8 logistic steps of dimension 10 at q = 1/8, nothing else
    acc = engine.accountant
    assert isinstance(acc, PipelineAccountant) and acc.history == [] and acc.releases == []
    assert acc.noise_steps == [
        {
            "mechanism": "alm",
            "noise_multiplier": 1.0,
            "sample_rate": 0.125,
            "num_steps": 40,
            "dim": 10,
        }
    ]
    reference = PipelineAccountant()
    reference.step(noise_multiplier=1.0, sample_rate=0.125, mechanism="alm", dim=10, num_steps=40)
    assert ours["epsilon"] == reference.get_epsilon(DELTA)
    assert math.isfinite(ours["epsilon"]) and math.isfinite(plain["epsilon"])
    x, y = _data().tensors
    # per-step noise std in the mean gradient is pi/sqrt(3)/64 ~ 0.03 against a signal ~1
    assert (ours["model"](x).argmax(1) == y).float().mean() > 0.95


def test_opacus_own_engine_is_unchanged_by_the_import() -> None:
    engine = opacus.PrivacyEngine(accountant="alm_pld")  # registered by alm_opacus.accounting
    model = nn.Linear(4, 2)
    _, opt, loader = engine.make_private(
        module=model,
        optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
        data_loader=_loader(),
        noise_multiplier=1.0,
        max_grad_norm=1.0,
    )
    assert type(opt) is DPOptimizer and type(loader) is DPDataLoader
    assert type(loader.batch_sampler) is UniformWithReplacementSampler
    assert isinstance(engine.accountant, PipelineAccountant)


def _train(model: nn.Module, opt: Any, loader: Any) -> None:
    for x, y in loader:
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()


def _engine_with_release(epsilon: float) -> PrivacyEngine:
    engine = PrivacyEngine()
    # a post-training ALM release at epsilon = sensitivity / scale, add/remove neighbours
    engine.accountant.record_release(
        mechanism="alm", scale=1.0 / epsilon, sensitivity=1.0, dim=None, neighbouring="add-remove"
    )
    return engine


@pytest.mark.slow
@pytest.mark.parametrize("mechanism", ["gaussian", "alm", "laplace"])
def test_calibration_counts_a_release_recorded_first(mechanism: str) -> None:
    engine = _engine_with_release(1.0)
    assert engine.get_epsilon(DELTA) == pytest.approx(1.0, abs=0.01)
    model = nn.Linear(4, 2)
    model, opt, loader = engine.make_private_with_epsilon(
        module=model,
        optimizer=torch.optim.SGD(model.parameters(), lr=0.5),
        data_loader=_loader(),
        target_epsilon=3.0,
        target_delta=DELTA,
        epochs=2,
        max_grad_norm=1.0,
        noise_mechanism=mechanism,
    )
    for _ in range(2):
        _train(model, opt, loader)
    total = engine.get_epsilon(DELTA)
    # the search stops within its 1% tolerance below the target, never above it
    assert 3.0 * 0.99 <= total <= 3.0
    # calibrating DP-SGD alone (Opacus's behaviour) would have overshot the total
    alone = noise_multiplier_for(
        accountant=PipelineAccountant(),
        target_epsilon=3.0,
        target_delta=DELTA,
        sample_rate=0.125,
        steps=16,
        noise_mechanism=mechanism,
        dim=10,
    )
    assert alone < opt.noise_multiplier
    overshoot = _engine_with_release(1.0).accountant
    overshoot.step(
        noise_multiplier=alone, sample_rate=0.125, mechanism=mechanism, dim=10, num_steps=16
    )
    assert overshoot.get_epsilon(DELTA) > 3.0


@pytest.mark.slow
def test_opacus_engine_overshoots_where_ours_does_not() -> None:
    # The audit's finding, reproduced: Opacus calibrates DP-SGD alone and warns only. Its
    # search stops within 10% below 3 (tolerance 0.1, to keep the test short), so DP-SGD
    # alone is >= 2.7 and the total with the epsilon = 1 release is above 3.3.
    engine = opacus.PrivacyEngine(accountant="alm_pld")
    engine.accountant.record_release(mechanism="alm", scale=1.0, sensitivity=1.0, dim=None)
    model = nn.Linear(4, 2)
    with pytest.warns(UserWarning, match="non-zero privacy budget"):
        model, opt, loader = engine.make_private_with_epsilon(
            module=model,
            optimizer=torch.optim.SGD(model.parameters(), lr=0.5),
            data_loader=_loader(),
            target_epsilon=3.0,
            target_delta=DELTA,
            epochs=2,
            max_grad_norm=1.0,
            epsilon_tolerance=0.1,
        )
    for _ in range(2):
        _train(model, opt, loader)
    assert engine.get_epsilon(DELTA) > 3.3


def test_an_infeasible_target_is_refused_naming_the_spent_budget() -> None:
    engine = _engine_with_release(1.0)
    model = nn.Linear(4, 2)
    with pytest.raises(InfeasibleBudget, match=r"already spent epsilon=0\.99\d*.*1 releases"):
        engine.make_private_with_epsilon(
            module=model,
            optimizer=torch.optim.SGD(model.parameters(), lr=0.5),
            data_loader=_loader(),
            target_epsilon=0.9,
            target_delta=DELTA,
            epochs=1,
            max_grad_norm=1.0,
            noise_mechanism="alm",
        )
    assert not model._forward_hooks and not model._backward_hooks  # nothing was attached
    assert len(engine.accountant) == 1


@pytest.mark.parametrize(
    ("engine_kwargs", "kwargs", "match"),
    [
        ({"accountant": "prv"}, {"noise_mechanism": "alm"}, "accountant='prv'.*Gaussian"),
        ({}, {"noise_mechanism": "gaussian-classic"}, "noise_mechanism='gaussian-classic'"),
        ({}, {"poisson_sampling": False}, "poisson_sampling=False"),
        ({}, {"clipping": "per_layer"}, "clipping='per_layer'"),
        ({}, {"grad_sample_mode": "ghost"}, "grad_sample_mode='ghost'"),
        ({}, {"max_grad_norm": [1.0]}, r"max_grad_norm=\[1.0\]"),
    ],
)
def test_unsupported_requests_are_refused_before_the_module_changes(
    engine_kwargs: dict[str, Any], kwargs: dict[str, Any], match: str
) -> None:
    engine = PrivacyEngine(**engine_kwargs)
    model = nn.Linear(4, 2)
    args: dict[str, Any] = {
        "module": model,
        "data_loader": _loader(),
        "noise_multiplier": 1.0,
        "optimizer": torch.optim.SGD(model.parameters(), lr=0.1),
        "max_grad_norm": 1.0,
    }
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        engine.make_private(**args)
    assert not model._forward_hooks and not model._backward_hooks
    assert len(engine.accountant) == 0


def test_secure_mode_refuses_a_seed_as_opacus_does() -> None:
    model = nn.Linear(4, 2)
    with pytest.raises(ValueError, match="prohibited in secure mode"):
        PrivacyEngine().make_private(
            module=model,
            optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
            data_loader=_loader(),
            noise_multiplier=1.0,
            max_grad_norm=1.0,
            noise_generator=torch.Generator().manual_seed(0),
            noise_mechanism="alm",
        )


def _seeded_run(seed: int) -> tuple[torch.Tensor, Any, Any]:
    torch.manual_seed(0)
    model = nn.Linear(4, 2)
    engine = PrivacyEngine(secure_mode=False)
    model, opt, loader = engine.make_private(
        module=model,
        optimizer=torch.optim.SGD(model.parameters(), lr=0.5),
        data_loader=_loader(generator=torch.Generator().manual_seed(seed + 1)),
        noise_multiplier=1.0,
        max_grad_norm=1.0,
        noise_mechanism="laplace",
        noise_generator=torch.Generator().manual_seed(seed),
    )
    _train(model, opt, loader)
    return model._module.weight.detach().clone(), opt, loader


def test_explicit_seeds_replay_and_are_recorded_as_seeded() -> None:
    w1, opt, loader = _seeded_run(3)
    w2, _, _ = _seeded_run(3)
    assert torch.equal(w1, w2)
    assert opt.noise_seeded is True and loader.seeded is True


def test_the_default_neither_replays_nor_is_seeded() -> None:
    torch.manual_seed(0)
    weights = []
    for _ in range(2):
        torch.manual_seed(0)
        model = nn.Linear(4, 2)
        engine = PrivacyEngine(secure_mode=False)  # seeds allowed, but none given
        model, opt, loader = engine.make_private(
            module=model,
            optimizer=torch.optim.SGD(model.parameters(), lr=0.5),
            data_loader=_loader(),
            noise_multiplier=1.0,
            max_grad_norm=1.0,
            noise_mechanism="alm",
        )
        assert opt.noise_seeded is False and loader.seeded is False
        _train(model, opt, loader)
        weights.append(model._module.weight.detach().clone())
    assert not torch.equal(weights[0], weights[1])


def test_checkpoints_round_trip_without_unpickling_code(tmp_path: Path) -> None:
    engine = _engine_with_release(0.5)
    model = nn.Linear(4, 2)
    model, opt, loader = engine.make_private(
        module=model,
        optimizer=torch.optim.SGD(model.parameters(), lr=0.5),
        data_loader=_loader(),
        noise_multiplier=1.0,
        max_grad_norm=1.0,
        noise_mechanism="alm",
    )
    _train(model, opt, loader)
    path = tmp_path / "ckpt.pt"
    engine.save_checkpoint(path=path, module=model, optimizer=opt)
    restored = PrivacyEngine()
    restored.load_checkpoint(path=path, module=model, optimizer=opt)
    assert restored.get_epsilon(DELTA) == engine.get_epsilon(DELTA)
    assert restored.accountant.noise_steps == engine.accountant.noise_steps


class _Payload:
    def __reduce__(self) -> tuple[Any, ...]:
        return (print, ("code ran",))


def test_a_checkpoint_holding_code_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "evil.pt"
    torch.save({"module_state_dict": _Payload()}, path)
    with pytest.raises(pickle.UnpicklingError):
        PrivacyEngine().load_checkpoint(path=path, module=nn.Linear(4, 2))


@pytest.mark.parametrize("grad_sample_mode", ["hooks", "functorch", "ew"])
def test_every_per_sample_gradient_mode_clips_in_l1(grad_sample_mode: str) -> None:
    model = nn.Linear(4, 2)
    model, opt, loader = PrivacyEngine().make_private(
        module=model,
        optimizer=torch.optim.SGD(model.parameters(), lr=0.5),
        data_loader=_loader(),
        noise_multiplier=0.0,
        max_grad_norm=0.1,
        noise_mechanism="alm",
        grad_sample_mode=grad_sample_mode,
    )
    x, y = next(iter(loader))
    nn.functional.cross_entropy(model(x), y).backward()
    opt.pre_step()
    grad_samples = [p.grad_sample for p in opt.params]
    l1 = sum(g.reshape(len(g), -1).abs().sum(1) for g in grad_samples)
    factors = (0.1 / (l1 + 1e-6)).clamp(max=1.0)
    assert bool((factors < 1).any())  # clipping binds in this batch
    grid = opt.noise_grid
    assert grid is not None
    for p, g in zip(opt.params, grad_samples, strict=True):
        # sigma = 0: the summed gradient is the sum of L1-clipped per-example gradients,
        # each coordinate of each example rounded to the grid (γ/2 each); float32 sums of
        # ~64 terms in another order: ~1e-6 relative, so 1e-5 bounds the rest
        expected = torch.einsum("i,i...", factors, g)
        assert p.summed_grad.dtype == torch.int64
        torch.testing.assert_close(
            opt.cells_to_grad(p.summed_grad, p),
            expected,
            rtol=1e-5,
            atol=1e-7 + len(g) * grid.gamma / 2,
        )
    assert opt.noise_mechanism == "alm" and opt.clipping_norm == "l1"
