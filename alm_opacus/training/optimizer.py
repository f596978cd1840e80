"""`MechanismDPOptimizer`: Opacus's `DPOptimizer` with the noise of a registered mechanism.

One DP-SGD step (Abadi et al. 2016, Algorithm 1) releases ``Σ_i clip(g_i) + Z``. Adding or
removing one example moves the sum by at most ``max_grad_norm`` in the clipping norm, so the
clipping norm must be the norm the mechanism's guarantee is stated in: L1 for the logistic
(ALM) and Laplace mechanisms (their pure-DP bound is Δ₁/scale), L2 for the Gaussian. ``Z`` has
i.i.d. coordinates of scale ``noise_multiplier * max_grad_norm`` (for ``gaussian`` that is
Opacus's standard deviation). The per-sample norm is taken over the concatenation of every
parameter's per-sample gradient, as Opacus's flat clipping does for L2.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from opacus.optimizers import DPOptimizer
from opacus.optimizers.optimizer import _check_processed_flag, _mark_as_processed
from torch.optim import Optimizer

from alm_opacus._validation import check_positive
from alm_opacus.mechanisms import AdditiveNoiseMechanism, create_mechanism
from alm_opacus.mechanisms.sampling import NoiseGenerator, SecureGenerator, is_secure

__all__ = [
    "CLIP_NORM_ORDERS",
    "TRAINING_MECHANISMS",
    "MechanismDPOptimizer",
    "clip_factors",
    "per_sample_norms",
    "training_mechanism",
]

#: Mechanisms a DP-SGD step may use (canonical names; aliases such as ``logistic`` resolve).
TRAINING_MECHANISMS = ("alm", "laplace", "gaussian")

#: The vector norm (``torch.linalg.vector_norm``'s ``ord``) of each sensitivity norm.
CLIP_NORM_ORDERS: dict[str, float] = {"l1": 1.0, "l2": 2.0}

# Opacus's guard against division by zero in the clip factor; kept identical so that the
# Gaussian path clips exactly as DPOptimizer does (and every clipped norm is < max_grad_norm).
_CLIP_EPSILON = 1e-6


def training_mechanism(name: str) -> AdditiveNoiseMechanism:
    """The registered mechanism ``name``, if DP-SGD supports it.

    Raises:
        ValueError: if ``name`` is unknown or is not one of `TRAINING_MECHANISMS`.
    """
    mechanism = create_mechanism(name)
    if mechanism.name not in TRAINING_MECHANISMS:
        raise ValueError(
            f"noise_mechanism={name!r} is invalid for DP-SGD: expected one of "
            f"{TRAINING_MECHANISMS} (or the alias 'logistic')"
        )
    return mechanism


def per_sample_norms(grad_samples: Sequence[torch.Tensor], *, norm: str) -> torch.Tensor:
    """Norm of each example's gradient, all parameters concatenated.

    Args:
        grad_samples: one tensor per parameter, each ``(batch, *param.shape)``.
        norm: ``"l1"`` or ``"l2"``.

    Returns:
        ``(batch,)`` norms. For ``"l2"`` this is exactly Opacus's computation (the norm of the
        per-parameter norms), for ``"l1"`` the sum of the per-parameter L1 norms.

    Raises:
        ValueError: on an unknown norm.
    """
    if norm not in CLIP_NORM_ORDERS:
        raise ValueError(f"norm={norm!r} is invalid: expected one of {sorted(CLIP_NORM_ORDERS)}")
    order = CLIP_NORM_ORDERS[norm]
    per_param = [g.reshape(len(g), -1).norm(order, dim=-1) for g in grad_samples]
    device = per_param[0].device
    return torch.stack([n.to(device) for n in per_param], dim=1).norm(order, dim=1)


def clip_factors(norms: torch.Tensor, *, max_grad_norm: float) -> torch.Tensor:
    """Opacus's factors ``min(1, C / (norm + 1e-6))``: every clipped norm is below ``C``."""
    return (max_grad_norm / (norms + _CLIP_EPSILON)).clamp(max=1.0)


def _check_max_grad_norm(max_grad_norm: Any) -> float:
    if isinstance(max_grad_norm, bool) or not isinstance(max_grad_norm, int | float):
        raise ValueError(
            f"max_grad_norm={max_grad_norm!r} is invalid: expected one positive number "
            "(flat clipping; per-layer clipping is not supported with a noise mechanism)"
        )
    return check_positive(max_grad_norm, name="max_grad_norm")


class MechanismDPOptimizer(DPOptimizer):
    """Opacus's `DPOptimizer` whose noise comes from ``noise_mechanism``.

    Hooks, grad samplers, virtual steps (``signal_skip_step``), gradient accumulation and the
    accountant hook work as in Opacus; only `clip_and_accumulate` (the mechanism's norm) and
    `add_noise` (the mechanism's sampler) differ. With ``noise_mechanism="gaussian"`` the
    clipping is Opacus's, bit for bit.

    Attributes:
        noise_mechanism: canonical mechanism name, read by the ``alm_pld`` accountant's hook.
        noise_dim: number of noised coordinates (all parameters), read by the same hook.
        clipping_norm: ``"l1"`` or ``"l2"``, the mechanism's sensitivity norm.
        noise_seeded: ``True`` when the noise comes from a caller's seeded
            ``torch.Generator``: the steps are then private only while that seed is secret.
    """

    def __init__(
        self,
        optimizer: Optimizer,
        *,
        noise_multiplier: float,
        max_grad_norm: float,
        expected_batch_size: int | None,
        loss_reduction: str = "mean",
        noise_mechanism: str = "alm",
        generator: NoiseGenerator | None = None,
        secure_mode: bool = False,
        **kwargs: Any,
    ) -> None:
        """Args:
            optimizer: the wrapped optimizer.
            noise_multiplier: noise scale over ``max_grad_norm``, ≥ 0.
            max_grad_norm: clipping bound ``C`` > 0, in the mechanism's norm.
            expected_batch_size: divisor of the noisy sum for ``loss_reduction="mean"``.
            loss_reduction: ``"mean"`` or ``"sum"``.
            noise_mechanism: ``"alm"`` (alias ``"logistic"``), ``"laplace"`` or ``"gaussian"``.
            generator: ``None`` (default) for a `SecureGenerator` (``os.urandom``); a seeded
                ``torch.Generator`` only for reproducible research (``noise_seeded`` is then
                set); a `SecureGenerator` to choose the device of the draws.
            secure_mode: Opacus's flag; it selects nothing here, since the noise samplers of
                `alm_opacus.mechanisms` never need Opacus's 4-draw workaround.
            **kwargs: ignored, as Opacus passes engine options through.

        Raises:
            ValueError: on an unsupported mechanism, a bad ``max_grad_norm`` or
                ``noise_multiplier``, or a generator of another kind.
        """
        mechanism = training_mechanism(noise_mechanism)
        sigma = float(noise_multiplier)
        if not 0.0 <= sigma < float("inf"):  # also rejects NaN
            raise ValueError(
                f"noise_multiplier={noise_multiplier!r} is invalid: expected a finite number ≥ 0"
            )
        source = SecureGenerator() if generator is None else generator
        if not isinstance(source, SecureGenerator | torch.Generator):
            raise ValueError(
                f"generator={generator!r} is invalid: expected None, a SecureGenerator or a "
                "torch.Generator"
            )
        super().__init__(
            optimizer,
            noise_multiplier=sigma,
            max_grad_norm=_check_max_grad_norm(max_grad_norm),
            expected_batch_size=expected_batch_size,
            loss_reduction=loss_reduction,
            generator=source,
            secure_mode=secure_mode,
        )
        self.mechanism = mechanism
        self.noise_mechanism = mechanism.name
        self.clipping_norm = mechanism.norm
        self.noise_dim = sum(p.numel() for p in self.params)
        self.noise_seeded = not is_secure(source)

    def clip_and_accumulate(self) -> None:
        """Clip each example's gradient to ``max_grad_norm`` in the mechanism's norm and add
        the clipped gradients into ``p.summed_grad`` (Opacus's flat clipping otherwise)."""
        grad_samples = self.grad_samples
        if len(grad_samples[0]) == 0:  # an empty Poisson batch
            factors = torch.zeros((0,), device=grad_samples[0].device)
        else:
            norms = per_sample_norms(grad_samples, norm=self.clipping_norm)
            factors = clip_factors(norms, max_grad_norm=self.max_grad_norm)
        for p in self.params:
            _check_processed_flag(p.grad_sample)
            grad_sample = self._get_flat_grad_sample(p).to(p.dtype)
            factor = factors.to(grad_sample.device).to(p.dtype)
            grad = torch.einsum("i,i...", factor, grad_sample)
            if p.summed_grad is not None:
                p.summed_grad += grad
            else:
                p.summed_grad = grad
            _mark_as_processed(p.grad_sample)

    def add_noise(self) -> None:
        """Add i.i.d. mechanism noise of scale ``noise_multiplier * max_grad_norm`` to every
        coordinate of the clipped sum; the result goes to ``p.grad``."""
        scale = self.noise_multiplier * self.max_grad_norm
        for p in self.params:
            _check_processed_flag(p.summed_grad)
            summed = p.summed_grad
            if scale == 0.0:
                noise = torch.zeros_like(summed)
            else:
                noise = self.mechanism.sample(
                    tuple(summed.shape), scale=scale, generator=self.generator, dtype=summed.dtype
                ).to(summed.device)
            p.grad = (summed + noise).view_as(p)
            _mark_as_processed(p.summed_grad)
