"""The device is a parameter: releases and DP-SGD on a CUDA device (skipped without one).

CI has no GPU; these run where one is present. They caught a DP-SGD head initialised on the
CPU and fed CUDA batches (``--device cuda`` failed in its first DP-SGD cell).
"""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from alm_opacus.heads import HeadConfig
from alm_opacus.protect import PostTrainingPrivacyEngine, SensitivityInfo
from alm_opacus.training import PrivacyEngine, l1_clip
from baselines.dpsgd import DPSGDConfig, train_dpsgd_head

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

CUDA = "cuda"


def _separable(n: int = 240, d: int = 8, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    y = torch.arange(n) % 3
    x = torch.randn(n, d, generator=g) + 3.0 * torch.nn.functional.one_hot(y, d).float()
    return x / x.norm(dim=1, keepdim=True), y


@pytest.mark.parametrize("mechanism", ["gaussian", "alm", "laplace"])
def test_a_dpsgd_head_trains_on_the_device_it_is_given(mechanism: str) -> None:
    x, y = _separable()
    run = train_dpsgd_head(
        x,
        y,
        num_classes=3,
        head=HeadConfig(),
        device=CUDA,
        config=DPSGDConfig(lr=2.0, max_grad_norm=1.0, epochs=3, batch_size=40),
        epsilon=8.0,
        delta=1e-5,
        accountant="alm_pld",
        seed=0,
        noise_seed=0,
        mechanism=mechanism,
    )
    assert {p.device.type for p in run.head.parameters()} == {"cuda"}
    assert 0 < run.epsilon_spent <= 8.0
    accuracy = (run.head(x.to(CUDA)).argmax(1).cpu() == y).float().mean().item()
    assert accuracy > 0.5  # three classes: chance is 1/3


@pytest.mark.parametrize("mechanism", ["alm", "laplace", "gaussian"])
def test_a_release_draws_its_noise_on_the_device_of_the_module(mechanism: str) -> None:
    head = torch.nn.Linear(8, 3).to(CUDA)
    norm = "l2" if mechanism == "gaussian" else "l1"
    released = PostTrainingPrivacyEngine(mechanism=mechanism).make_private(
        head,
        epsilon=1.0,
        delta=1e-5 if mechanism == "gaussian" else 0.0,
        sensitivity=SensitivityInfo(value=0.1, norm=norm, source="caller"),  # type: ignore[arg-type]
    )
    noisy = dict(released.module.named_parameters())
    for name, clean in head.named_parameters():
        assert noisy[name].device.type == "cuda"
        assert not torch.equal(noisy[name], clean)  # noise was added
    assert released.statement.noise == "secure"


@pytest.mark.parametrize("mechanism", ["alm", "laplace"])
def test_opacus_training_with_logistic_and_laplace_noise_on_the_device(mechanism: str) -> None:
    x, y = _separable()
    model = torch.nn.Linear(8, 3).to(CUDA)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    loader = DataLoader(TensorDataset(x.to(CUDA), y.to(CUDA)), batch_size=40)
    engine = PrivacyEngine()
    model, optimizer, loader = engine.make_private(
        module=model,
        optimizer=optimizer,
        data_loader=loader,
        noise_multiplier=1.0,
        max_grad_norm=l1_clip(1.0, params=model),
        noise_mechanism=mechanism,
    )
    for xb, yb in loader:
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(model(xb), yb).backward()
        optimizer.step()
    assert {p.device.type for p in model.parameters()} == {"cuda"}
    assert 0 < engine.get_epsilon(delta=1e-5) < float("inf")
