"""`MechanismDPOptimizer`: Opacus's `DPOptimizer` with the noise of a registered mechanism.

One DP-SGD step (Abadi et al. 2016, Algorithm 1) releases ``Σ_i clip(g_i) + Z``. Adding or
removing one example moves the sum by at most ``max_grad_norm`` in the clipping norm, so the
clipping norm must be the norm the mechanism's guarantee is stated in: L1 for the logistic
(ALM) and Laplace mechanisms (their pure-DP bound is Δ₁/scale), L2 for the Gaussian. ``Z`` has
i.i.d. coordinates of scale ``noise_multiplier * max_grad_norm`` (for ``gaussian`` that is
Opacus's standard deviation). The per-sample norm is taken over the concatenation of every
parameter's per-sample gradient, as Opacus's flat clipping does for L2.

Exact steps (the default, ``docs/mechanisms.md``): each clipped example is rounded to a
power-of-two grid γ in int64 (`alm_opacus.mechanisms.exact.clip_to_cells`, which enforces its
cell norm exactly), the batch sum is exact in int64, integer noise K is drawn exactly from the
mechanism's law rounded to the grid, and ``γ·(Σ cells + K)`` becomes the gradient (any later
rounding to the parameter dtype is post-processing). One example moves the sum by at most
Δ' = C + w(d)·γ/2 (w = d in L1, √d in L2), so the noise scale is ``noise_multiplier · Δ'``
and every accountant of the continuous mechanism holds unchanged; γ keeps Δ' ≤ C(1 + 2⁻⁷).
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
from alm_opacus.mechanisms.exact import (
    Grid,
    cell_radius,
    dequantize,
    discrete_noise,
    enforce_radius,
    inflated_sensitivity,
    scaled_cells,
    step_grid,
)
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
        exact: whether steps are exact on a grid (default) or floating-point.
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
        exact: bool = True,
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
            exact: integer clipping and exact grid noise (default); ``False`` keeps the
                floating-point step, which a floating-point adversary can exploit (Mironov
                2012): for comparisons only.
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
        self.exact = bool(exact)

    @property
    def noise_grid(self) -> Grid | None:
        """The grid of an exact step at the current ``max_grad_norm`` (``None``: float steps)."""
        if not self.exact:
            return None
        return step_grid(max_grad_norm=self.max_grad_norm, norm=self.clipping_norm,
                         dim=self.noise_dim)  # fmt: skip

    @property
    def noise_sensitivity(self) -> float:
        """Δ': what one example moves the noised sum by (``max_grad_norm`` for float steps);
        the noise scale is ``noise_multiplier`` times this."""
        grid = self.noise_grid
        if grid is None:
            return float(self.max_grad_norm)
        return inflated_sensitivity(sensitivity=self.max_grad_norm, norm=self.clipping_norm,
                                    dim=self.noise_dim, grid=grid, rounding=0.5)  # fmt: skip

    @property
    def noise_scale(self) -> float:
        """The scale of each coordinate's noise, ``noise_multiplier · noise_sensitivity``."""
        return self.noise_multiplier * self.noise_sensitivity

    def clip_and_accumulate(self) -> None:
        """Clip each example's gradient to ``max_grad_norm`` in the mechanism's norm and add
        the clipped gradients into ``p.summed_grad`` (Opacus's flat clipping otherwise)."""
        grad_samples = self.grad_samples
        if len(grad_samples[0]) == 0:  # an empty Poisson batch
            factors = torch.zeros((0,), device=grad_samples[0].device)
        else:
            norms = per_sample_norms(grad_samples, norm=self.clipping_norm)
            factors = clip_factors(norms, max_grad_norm=self.max_grad_norm)
        grid = self.noise_grid
        if grid is not None:
            self._accumulate_cells(factors, grid)
            return
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

    def _accumulate_cells(self, factors: torch.Tensor, grid: Grid) -> None:
        """The exact step's clipping: each example's clipped gradient rounded to cells with
        its cell norm at most R = C/γ + w(d)/2, summed in int64 into ``p.summed_grad``."""
        cells = []
        for p in self.params:
            _check_processed_flag(p.grad_sample)
            cells.append(scaled_cells(self._get_flat_grad_sample(p), factors, grid=grid))
        radius = cell_radius(max_grad_norm=self.max_grad_norm, norm=self.clipping_norm,
                             dim=self.noise_dim, grid=grid)  # fmt: skip
        enforce_radius(cells, norm=self.clipping_norm, radius=radius)
        for p, c in zip(self.params, cells, strict=True):
            summed = c.sum(0).to(torch.int64)  # integers under 2^53: exact
            if p.summed_grad is not None:
                p.summed_grad += summed
            else:
                p.summed_grad = summed
            _mark_as_processed(p.grad_sample)

    def cell_noise(self, p: torch.Tensor) -> torch.Tensor:
        """Exact integer noise for ``p``'s cells (int64, ``p``'s shape and device): the
        mechanism's law at ``noise_scale``, rounded to `noise_grid`. A distributed optimizer
        adds it on one rank before an int64 all-reduce of the cells."""
        grid = self.noise_grid
        if grid is None:
            raise ValueError("cell_noise needs an exact optimizer (exact=True)")
        scale = self.noise_scale
        if scale == 0.0:
            return torch.zeros(p.shape, dtype=torch.int64, device=p.device)
        noise = discrete_noise(tuple(p.shape), mechanism=self.mechanism, scale=scale, grid=grid,
                               generator=self.generator)  # fmt: skip
        return noise.to(p.device)

    def cells_to_grad(self, cells: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
        """γ·cells in ``p``'s dtype, shaped as ``p`` (post-processing of the noisy cells)."""
        grid = self.noise_grid
        if grid is None:
            raise ValueError("cells_to_grad needs an exact optimizer (exact=True)")
        return dequantize(cells, grid=grid, dtype=torch.float64).to(p.dtype).view_as(p)

    def add_noise(self) -> None:
        """Add i.i.d. mechanism noise of scale ``noise_scale`` to every coordinate of the
        clipped sum; the result goes to ``p.grad``. Exact steps add `cell_noise` to the int64
        cells and convert with `cells_to_grad`."""
        exact = self.exact
        scale = self.noise_scale
        for p in self.params:
            _check_processed_flag(p.summed_grad)
            summed = p.summed_grad
            if exact:
                if summed.is_floating_point():
                    raise ValueError(
                        "an exact step needs p.summed_grad as int64 grid cells (from "
                        "clip_and_accumulate); got a float tensor"
                    )
                p.grad = self.cells_to_grad(summed + self.cell_noise(p), p)
            else:
                if scale == 0.0:
                    noise = torch.zeros_like(summed)
                else:
                    noise = self.mechanism.sample(
                        tuple(summed.shape), scale=scale, generator=self.generator,
                        dtype=summed.dtype,
                    ).to(summed.device)  # fmt: skip
                p.grad = (summed + noise).view_as(p)
            _mark_as_processed(p.summed_grad)
