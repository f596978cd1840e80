"""A DP-SGD head: the head as an ``nn.Module`` Opacus can hook, its initialisation and size,
and :func:`train_dpsgd_head`, one private training run of it (:mod:`baselines.dpsgd.loop`)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from alm_opacus.plugin import (
    Head,
    HeadConfig,
    Params,
    check_delta,
    check_epsilon,
    check_features_labels,
    clip_features,
    linear_init,
)
from baselines.dpsgd.accounting import GAUSSIAN, SigmaCache
from baselines.dpsgd.config import DEFAULT_ACCOUNTANT, DPSGDConfig, check_accountant
from baselines.dpsgd.loop import ALM_TRAINING, OpacusRun, TrainingBackend, fit_private

__all__ = ["DPSGDRun", "HeadNet", "head_size", "init_params", "train_dpsgd_head"]


@dataclass(kw_only=True)
class DPSGDRun(OpacusRun):
    """One DP-SGD head training run: the trained head (``alm_opacus.heads.Head``)."""

    head: Head


class HeadNet(nn.Module):
    """The head as plain ``nn.Linear`` calls (Opacus hooks them), with ``Head``'s names."""

    fc: nn.Linear
    fc1: nn.Linear
    fc2: nn.Linear

    def __init__(self, params: Params, kind: str) -> None:
        super().__init__()
        self.kind = kind
        for name in sorted({k.split(".")[0] for k in params}):
            weight = params[f"{name}.weight"]
            layer = nn.Linear(weight.shape[1], weight.shape[0], dtype=weight.dtype)
            with torch.no_grad():
                layer.weight.copy_(weight)
                layer.bias.copy_(params[f"{name}.bias"])
            setattr(self, name, layer)

    def forward(self, x: Tensor) -> Tensor:
        if self.kind == "linear":
            out: Tensor = self.fc(x)
            return out
        out = self.fc2(torch.relu(self.fc1(x)))
        return out


def head_size(*, d: int, num_classes: int, head: HeadConfig) -> int:
    """The trainable numbers of :func:`init_params`' head, weights and biases (what the
    optimizer noises): ``(d + 1) C`` for a linear head, ``(d + 1) H + (H + 1) C`` for an MLP."""
    if head.kind == "linear":
        return (d + 1) * num_classes
    return (d + 1) * head.hidden + (head.hidden + 1) * num_classes


def init_params(*, d: int, num_classes: int, head: HeadConfig, seed: int) -> Params:
    """The head's initialisation (``alm_opacus.heads.linear_init``), from a seeded generator."""
    sizes = (
        {"fc": (num_classes, d)}
        if head.kind == "linear"
        else {"fc1": (head.hidden, d), "fc2": (num_classes, head.hidden)}
    )
    return linear_init(sizes, generator=torch.Generator().manual_seed(seed), dtype=head.torch_dtype)


def train_dpsgd_head(
    features: Tensor,
    labels: Tensor,
    *,
    num_classes: int,
    head: HeadConfig,
    config: DPSGDConfig,
    epsilon: float,
    delta: float,
    accountant: str = DEFAULT_ACCOUNTANT,
    seed: int,
    noise_seed: int | None,
    device: str = "cpu",
    sigmas: SigmaCache | None = None,
    backend: TrainingBackend = ALM_TRAINING,
    mechanism: str = GAUSSIAN,
) -> DPSGDRun:
    """Train one head with DP-SGD through Opacus, at (epsilon, delta).

    Args:
        features: (n, d) features; clipped to ``head.clip_radius`` first (per example).
        labels: (n,) labels.
        num_classes: ``C``.
        head: the architecture (``kind``, ``hidden``, ``dtype``, ``clip_radius``); its
            ``steps``, ``lr`` and ``l2`` are not used.
        config: the DP-SGD recipe.
        epsilon: target epsilon > 0.
        delta: target delta in (0, 1).
        accountant: ``"alm_pld"``, ``"prv"`` or ``"rdp"``.
        seed: seeds the initialisation.
        noise_seed: seeds Poisson sampling and the gradient noise; ``None``: the backend's
            secure source (the AES-CTR keystream).
        device: torch device.
        sigmas: the run's noise multipliers (default: a fresh cache).
        backend: the engine and its generators (default: ``alm_opacus.training``'s, exact).
        mechanism: the per-step noise (see :func:`fit_private`).

    Returns:
        The run; ``epsilon_spent <= epsilon``.

    Raises:
        ValueError: on bad budgets, an unknown accountant or mismatched shapes.
        RuntimeError: if the accountant reports more than ``epsilon`` after training
            (never released).
    """
    check_epsilon(epsilon)
    check_delta(delta, allow_zero=False)
    check_accountant(accountant)
    check_features_labels(features, labels)
    d = int(features.shape[1])
    x = clip_features(features.to(device=device, dtype=head.torch_dtype), head.clip_radius)
    model = HeadNet(init_params(d=d, num_classes=num_classes, head=head, seed=seed), head.kind)
    model = model.to(device)  # initialised on the CPU (the same draw on every device)
    run = fit_private(
        x,
        labels.to(device=device, dtype=torch.long),
        model=model,
        config=config,
        epsilon=epsilon,
        delta=delta,
        accountant=accountant,
        noise_seed=noise_seed,
        sigmas=sigmas,
        backend=backend,
        mechanism=mechanism,
    )
    released = Head(in_features=d, num_classes=num_classes, config=head).to(device)
    released.load_state_dict({k: v.detach().clone() for k, v in model.state_dict().items()})
    return DPSGDRun(head=released, **vars(run))
