"""``dpsgd-full``: DP-SGD on the encoder and the head together, through Opacus.

Per-example gradients are undefined under BatchNorm (it mixes the examples of a batch), so
the model goes through ``opacus.validators.ModuleValidator.fix`` first, which replaces each
BatchNorm by a GroupNorm. The whole model then trains like the ``dpsgd`` head: Poisson
sampling, flat clipping and the noise multiplier from ``make_private_with_epsilon``.

Not a registered method: the harness hands methods frozen features, not images and the
encoder. Call :func:`dpsgd_full_finetune` directly (docs/baselines.md).
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass, field

import torch
from opacus import PrivacyEngine
from opacus.validators import ModuleValidator
from torch import Tensor, nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset

from alm_opacus._validation import check_delta, check_epsilon
from baselines._common import derive_seed
from baselines.dpsgd import DEFAULT_ACCOUNTANT, DPSGDConfig, _quiet_opacus, check_accountant

__all__ = ["DPSGDFullRun", "dpsgd_full_finetune", "private_model"]


def private_model(*, encoder: nn.Module, num_classes: int, seed: int) -> nn.Module:
    """``encoder -> linear head``, BatchNorm replaced (GroupNorm) and in-place ops turned off.

    Args:
        encoder: maps inputs to (N, out_dim) features; needs an ``out_dim`` attribute. It is
            copied, not modified.
        num_classes: ``C``.
        seed: seeds the head's initialisation.

    Returns:
        The fixed model (``ModuleValidator.validate`` finds no error in it).

    Raises:
        ValueError: if the encoder has no ``out_dim`` or the fixed model is still invalid.
    """
    out_dim = getattr(encoder, "out_dim", None)
    if not isinstance(out_dim, int):
        raise ValueError("encoder has no integer out_dim attribute; cannot size the head")
    g = torch.Generator().manual_seed(seed)
    head = nn.Linear(out_dim, num_classes)
    with torch.no_grad():
        bound = out_dim**-0.5
        head.weight.copy_((torch.rand(head.weight.shape, generator=g) * 2 - 1) * bound)
        head.bias.copy_((torch.rand(head.bias.shape, generator=g) * 2 - 1) * bound)
    model = ModuleValidator.fix(nn.Sequential(copy.deepcopy(encoder), head))
    for module in model.modules():
        # In-place activations would overwrite views that Opacus's backward hooks return.
        if isinstance(getattr(module, "inplace", None), bool):
            module.inplace = False
    errors = ModuleValidator.validate(model, strict=False)
    if errors:
        raise ValueError(f"the model is not trainable with Opacus after fix: {errors}")
    return model


@dataclass
class DPSGDFullRun:
    """One full fine-tuning run: the model, its noise and the accountant's epsilon."""

    model: nn.Module
    noise_multiplier: float
    sample_rate: float
    steps: int
    epsilon_spent: float
    accountant: str
    seconds: dict[str, float] = field(default_factory=dict)


def dpsgd_full_finetune(
    *,
    encoder: nn.Module,
    images: Tensor,
    labels: Tensor,
    num_classes: int,
    config: DPSGDConfig,
    epsilon: float,
    delta: float,
    accountant: str = DEFAULT_ACCOUNTANT,
    seed: int,
    noise_seed: int,
    device: str = "cpu",
) -> DPSGDFullRun:
    """Fine-tune encoder and head together with DP-SGD at (epsilon, delta).

    Args:
        encoder: the (public) pre-trained encoder; copied, BatchNorm replaced.
        images: (n, ...) member inputs.
        labels: (n,) labels.
        num_classes: ``C``.
        config: DP-SGD recipe (lr, clip, epochs, expected batch size).
        epsilon: target epsilon > 0.
        delta: target delta in (0, 1).
        accountant: ``"prv"``, ``"rdp"`` or ``"alm_pld"``.
        seed: seeds the head's initialisation.
        noise_seed: seeds Poisson sampling and noise.
        device: torch device.

    Returns:
        The run; ``epsilon_spent <= epsilon``.

    Raises:
        ValueError: on bad budgets, an unknown accountant, mismatched shapes or a model that
            Opacus cannot train.
        RuntimeError: if the accountant reports more than ``epsilon`` after training.
    """
    epsilon = check_epsilon(epsilon)
    delta = check_delta(delta, allow_zero=False)
    accountant = check_accountant(accountant)
    if labels.shape != (images.shape[0],):
        raise ValueError(f"labels must be ({images.shape[0]},); got {tuple(labels.shape)}")
    model = private_model(encoder=encoder, num_classes=num_classes, seed=seed).to(device)
    loader = DataLoader(
        TensorDataset(images.to(device), labels.to(device=device, dtype=torch.long)),
        batch_size=config.batch_size,
        generator=torch.Generator().manual_seed(derive_seed("poisson", noise_seed)),
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=config.lr)
    start = time.perf_counter()
    with _quiet_opacus():
        engine = PrivacyEngine(accountant=accountant)
        private, dp_opt, dp_loader = engine.make_private_with_epsilon(
            module=model,
            optimizer=optimizer,
            data_loader=loader,
            target_epsilon=epsilon,
            target_delta=delta,
            epochs=config.epochs,
            max_grad_norm=config.max_grad_norm,
            poisson_sampling=True,
            noise_generator=torch.Generator(device=device).manual_seed(
                derive_seed("noise", noise_seed)
            ),
        )
        calibrated = time.perf_counter()
        private.train()
        for _ in range(config.epochs):
            for xb, yb in dp_loader:
                dp_opt.zero_grad(set_to_none=True)
                F.cross_entropy(private(xb), yb).backward()
                dp_opt.step()
        trained = time.perf_counter()
        spent = float(engine.get_epsilon(delta))
    history = engine.accountant.history
    steps = sum(int(h[2]) for h in history)
    if not spent <= epsilon:
        raise RuntimeError(
            f"the {accountant} accountant reports epsilon={spent:.6g} > target {epsilon:g}; "
            "refusing to release"
        )
    model.eval()
    return DPSGDFullRun(
        model=model,
        noise_multiplier=float(dp_opt.noise_multiplier),
        sample_rate=float(history[0][1]),
        steps=steps,
        epsilon_spent=spent,
        accountant=accountant,
        seconds={
            "calibration": calibrated - start,
            "training": trained - calibrated,
            "accounting": time.perf_counter() - trained,
        },
    )
