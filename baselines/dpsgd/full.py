"""``dpsgd-full``: DP-SGD on the encoder and the head together, through Opacus.

Per-example gradients are undefined under BatchNorm (it mixes the examples of a batch), so
the model goes through ``opacus.validators.ModuleValidator.fix`` first, which replaces each
BatchNorm by a GroupNorm (with the BatchNorm's affine parameters copied in). The model
``encoder -> linear`` then trains like the ``dpsgd`` head: Poisson sampling, flat clipping
and the noise multiplier for (epsilon, delta, sample rate, epochs).

As a method it takes images (``inputs = "images"``) and the public encoder from the
context. It is opt-in (``--methods dpsgd-full`` or ``all,dpsgd-full``): every run trains
the whole encoder, about 5 s on digits against a fraction of a second for a head.

The attacker's shadow and reference models stay heads on the public encoder's features:
imitating the victim would cost one full DP-SGD fine-tune per shadow. Those attacks are
therefore mis-specified against this release (weaker), which its attacker note says.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import Tensor, nn

from alm_opacus.methods import InputKind, MethodContext, Predict, ReleaseRequest, register_method
from alm_opacus.plugin import AttackerFactory, uniform_init
from baselines.dpsgd.accounting import SigmaCache
from baselines.dpsgd.config import DEFAULT_ACCOUNTANT, DPSGDConfig
from baselines.dpsgd.loop import ALM_TRAINING, OpacusRun, TrainingBackend, fit_private
from baselines.dpsgd.method import DPSGDMethod, OpacusFit, _Prepared

__all__ = [
    "FULL_TUNING_GRID",
    "DPSGDFullMethod",
    "DPSGDFullRun",
    "dpsgd_full_finetune",
    "predictor",
    "private_model",
]

#: lr x clip tried at each epsilon, on the public split. Every weight of the encoder moves,
#: so the learning rates are far below the head's (1 and 4); on digits' public split, lr 0.3
#: and above did worse at every clip tried.
FULL_TUNING_GRID: tuple[dict[str, float], ...] = (
    {"lr": 0.03, "max_grad_norm": 1.0},
    {"lr": 0.03, "max_grad_norm": 2.0},
    {"lr": 0.1, "max_grad_norm": 1.0},
    {"lr": 0.1, "max_grad_norm": 2.0},
)

_PREDICT_BATCH = 512


def private_model(*, encoder: nn.Module, num_classes: int, seed: int) -> nn.Module:
    """``encoder -> linear head``, BatchNorm replaced by GroupNorm, in-place ops turned off.

    ``ModuleValidator.fix`` gives each GroupNorm fresh affine parameters; the BatchNorm's
    learned scale and shift are copied into them, so the encoder starts from its public
    pre-training as far as GroupNorm allows. The head reads the raw encoder output: with
    the head methods' unit-norm features its logits start near zero and, at the small
    learning rates the encoder needs, barely moved in 60 steps.

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
    from opacus.validators import ModuleValidator

    out_dim = getattr(encoder, "out_dim", None)
    if not isinstance(out_dim, int):
        raise ValueError("encoder has no integer out_dim attribute; cannot size the head")
    g = torch.Generator().manual_seed(seed)
    head = nn.Linear(out_dim, num_classes)
    with torch.no_grad():
        head.weight.copy_(uniform_init(tuple(head.weight.shape), fan_in=out_dim, generator=g))
        head.bias.copy_(uniform_init(tuple(head.bias.shape), fan_in=out_dim, generator=g))
    model = ModuleValidator.fix(nn.Sequential(copy.deepcopy(encoder), head))
    original = dict(encoder.named_modules())
    for name, module in model[0].named_modules():
        before = original.get(name)
        if (
            isinstance(module, nn.GroupNorm)
            and isinstance(before, nn.modules.batchnorm._BatchNorm)
            and module.affine
            and before.affine
        ):
            with torch.no_grad():
                module.weight.copy_(before.weight)
                module.bias.copy_(before.bias)
    for module in model.modules():
        # In-place activations would overwrite views that Opacus's backward hooks return.
        if isinstance(getattr(module, "inplace", None), bool):
            module.inplace = False
    errors = ModuleValidator.validate(model, strict=False)
    if errors:
        raise ValueError(f"the model is not trainable with Opacus after fix: {errors}")
    return model


@dataclass(kw_only=True)
class DPSGDFullRun(OpacusRun):
    """One full fine-tuning run: the model (encoder and head) and its accounting."""

    model: nn.Module


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
    noise_seed: int | None,
    device: str = "cpu",
    sigmas: SigmaCache | None = None,
    backend: TrainingBackend = ALM_TRAINING,
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
        accountant: ``"alm_pld"``, ``"prv"`` or ``"rdp"``.
        seed: seeds the head's initialisation.
        noise_seed: seeds Poisson sampling and noise; ``None``: the backend's secure source.
        device: torch device.
        sigmas: the run's noise multipliers (default: a fresh cache).
        backend: the engine and its generators (default: ``alm_opacus.training``'s, exact).

    Returns:
        The run (model in eval mode); ``epsilon_spent <= epsilon``.

    Raises:
        ValueError: on bad budgets, an unknown accountant, mismatched shapes or a model that
            Opacus cannot train.
        RuntimeError: if the accountant reports more than ``epsilon`` after training.
    """
    if labels.shape != (images.shape[0],):
        raise ValueError(f"labels must be ({images.shape[0]},); got {tuple(labels.shape)}")
    model = private_model(encoder=encoder, num_classes=num_classes, seed=seed).to(device)
    run = fit_private(
        images.to(device=device, dtype=torch.float32),
        labels.to(device=device, dtype=torch.long),
        model=model,
        config=config,
        epsilon=epsilon,
        delta=delta,
        accountant=accountant,
        noise_seed=noise_seed,
        sigmas=sigmas,
        backend=backend,
    )
    model.eval()
    return DPSGDFullRun(model=model, **vars(run))


def predictor(model: nn.Module, *, device: str) -> Predict:
    """``images (q, ...) -> probabilities (q, C)`` on the CPU, in batches, without grad."""

    def predict_proba(images: Tensor) -> Tensor:
        out = []
        with torch.no_grad():
            for lo in range(0, len(images), _PREDICT_BATCH):
                batch = images[lo : lo + _PREDICT_BATCH].to(device=device, dtype=torch.float32)
                out.append(torch.softmax(model(batch), dim=-1).float().cpu())
        return torch.cat(out) if out else torch.empty(0)

    return predict_proba


@register_method("dpsgd-full")
class DPSGDFullMethod(DPSGDMethod):
    """DP-SGD on encoder and head together, one independent run per (epsilon, draw).

    Takes images and ``context.encoder``. Options as for ``dpsgd``, scoped to this method
    (``dpsgd-full.lr``, ``dpsgd-full.clip``, ``dpsgd-full.epochs``, ``dpsgd-full.batch_size``;
    a ``dpsgd.lr`` never reaches it), plus the shared ``accountant`` and ``tune``.
    """

    name: ClassVar[str] = "dpsgd-full"
    tuning_grid: ClassVar[tuple[dict[str, float], ...]] = FULL_TUNING_GRID
    inputs: ClassVar[InputKind] = "images"
    in_all: ClassVar[bool] = False
    mechanism: ClassVar[str] = "dp-sgd on encoder and head"
    notes: ClassVar[tuple[str, ...]] = (
        "encoder and head are both released and both trained on the members with DP-SGD "
        "(BatchNorm replaced by GroupNorm); the encoder's starting weights saw public data only",
    )

    def prepare(
        self, *, features: Tensor, labels: Tensor, seed: int, context: MethodContext
    ) -> _Prepared:
        if context.encoder is None or context.public_images is None:
            raise ValueError(
                "dpsgd-full needs context.encoder and context.public_images (the harness "
                "passes them to methods with inputs='images'); got None"
            )
        if features.ndim != 4:
            raise ValueError(
                f"dpsgd-full takes images (n, C, H, W); got shape {tuple(features.shape)}"
            )
        return super().prepare(features=features, labels=labels, seed=seed, context=context)

    def _public(self, context: MethodContext) -> Tensor | None:
        return context.public_images

    def _fit(
        self,
        x: Tensor,
        y: Tensor,
        *,
        config: DPSGDConfig,
        seed: int,
        noise_seed: int | None,
        request: ReleaseRequest,
    ) -> OpacusFit:
        context = request.context
        assert context.encoder is not None  # checked in prepare
        run = dpsgd_full_finetune(
            encoder=context.encoder,
            images=x,
            labels=y,
            num_classes=context.num_classes,
            config=config,
            epsilon=request.epsilon,
            delta=request.delta,
            accountant=self.accountant,
            seed=seed,
            noise_seed=noise_seed,
            device=context.device,
            sigmas=SigmaCache.of(context),
        )
        return OpacusFit(
            module=run.model, predict_proba=predictor(run.model, device=context.device), run=run
        )

    def attacker_before_release(
        self, prepared: _Prepared, request: ReleaseRequest
    ) -> AttackerFactory | None:
        return None  # the plain attacker, as :meth:`_attacker` says

    def _attacker(
        self, *, config: DPSGDConfig, run: OpacusRun, context: MethodContext
    ) -> tuple[AttackerFactory | None, str]:
        """The plain attacker (the harness may then share its prepared attacks)."""
        return None, (
            "mis-specified: shadow and reference models are plain heads on the public "
            "encoder's features, while the victim fine-tuned the encoder too (a full DP-SGD "
            "fine-tune per shadow is too slow); these attacks are weaker than against a head"
        )
