"""`MechanismDPOptimizer`: Opacus's `DPOptimizer` with the noise of a registered mechanism.

One DP-SGD step (Abadi et al. 2016, Algorithm 1) releases ``Σ_i clip(g_i) + Z``. Adding or
removing one example moves the sum by at most ``max_grad_norm`` in the clipping norm, so the
clipping norm must be the norm the mechanism's guarantee is stated in: L1 for the logistic
(ALM) and Laplace mechanisms (their pure-DP bound is Δ₁/scale), L2 for the Gaussian. ``Z`` has
i.i.d. coordinates of scale ``noise_multiplier * max_grad_norm`` (for ``gaussian`` that is
Opacus's standard deviation). The per-sample norm is taken over the concatenation of every
parameter's per-sample gradient, as Opacus's flat clipping does for L2.

Per-layer clipping (a list of budgets ``C_k``, one per parameter) clips parameter k's
per-sample gradient to ``C_k`` in the same norm. The norm of the concatenation is the norm of
the vector of per-parameter norms (for L1 their sum, for L2 the root of their squares), so
every clipped example then has norm at most ``C = ‖(C_1, …, C_K)‖`` in the mechanism's norm:
the sensitivity of the sum is C, as under flat clipping at C, and the noise scale is σC.
The step's guarantee depends on the clipped examples only through that bound (every
profile of `alm_opacus.accounting` is for shifts of norm at most C, `docs/accounting.md`),
so per-layer clipping is accounted exactly as flat clipping at C. For ``gaussian`` this is
Opacus's ``DPPerLayerOptimizer`` (C the L2 norm of the budgets); for ``alm`` and ``laplace``
the budgets add up to C.

Exact steps (the default, ``docs/mechanisms.md``): each clipped example is rounded to a
power-of-two grid γ with its cell norm at most R (`alm_opacus.mechanisms.cell_clipping`: float32
tiles under a rigorous norm bound, or float64 with an exact check), the batch sum is exact in
int64, integer noise K is drawn exactly from the mechanism's law rounded to the grid, and
``γ·(Σ cells + K)`` becomes the gradient (any later rounding to the parameter dtype is
post-processing). One example moves the sum by at most
Δ' = C + w(d)·γ/2 (w = d in L1, √d in L2), so the noise scale is ``noise_multiplier · Δ'``
and every accountant of the continuous mechanism holds unchanged; γ keeps Δ' ≤ C(1 + 2⁻⁷).
Per-layer budgets round the same way: each example's cells are bounded in the norm of C.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from opacus.optimizers import DPOptimizer
from opacus.optimizers.optimizer import _check_processed_flag, _mark_as_processed
from opacus.optimizers.utils import params as trainable_params
from torch.optim import Optimizer

from alm_opacus.mechanisms.exact import (
    Grid,
    cell_radius,
    dequantize,
    discrete_noise,
    enforce_radius,
    fused_cell_sums,
    inflated_sensitivity,
    noisy_cells,
    noisy_dequantized,
    scaled_cells,
    step_grid,
)
from alm_opacus.mechanisms.sampling import NoiseGenerator, SecureGenerator, is_secure
from alm_opacus.training.arguments import (
    TRAINING_MECHANISMS,
    _check_budgets,
    _check_max_grad_norm,
    training_mechanism,
)
from alm_opacus.training.clipping import (
    CLIP_NORM_ORDERS,
    clip_factors,
    l1_row_norms,
    per_sample_norms,
)
from alm_opacus.training.grad_sample import widen_grad_sample

__all__ = [
    "CLIP_NORM_ORDERS",
    "TRAINING_MECHANISMS",
    "MechanismDPOptimizer",
    "clip_factors",
    "l1_row_norms",
    "per_sample_norms",
    "training_mechanism",
]


class MechanismDPOptimizer(DPOptimizer):
    """Opacus's `DPOptimizer` whose noise comes from ``noise_mechanism``.

    Hooks, grad samplers, virtual steps (``signal_skip_step``), gradient accumulation and the
    accountant hook work as in Opacus; only `clip_and_accumulate` (the mechanism's norm) and
    `add_noise` (the mechanism's sampler) differ. With ``noise_mechanism="gaussian"`` the
    clipping is Opacus's, bit for bit (flat, and per-layer as ``DPPerLayerOptimizer``).

    Attributes:
        max_grad_norm: the bound C of one clipped example in the mechanism's norm (with
            per-layer budgets, their norm in that norm: their sum for L1).
        max_grad_norms: the per-layer budgets, or ``None`` for flat clipping.
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
        max_grad_norm: float | list[float],
        expected_batch_size: float | None,
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
            max_grad_norm: clipping bound ``C`` > 0, in the mechanism's norm; or a list of
                per-layer budgets, one per trainable parameter (``clipping="per_layer"``),
                whose norm in the mechanism's norm is then C.
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
        budgets = _per_layer_budgets(max_grad_norm, optimizer=optimizer, norm=mechanism.norm)
        bound = _check_max_grad_norm(max_grad_norm) if budgets is None else budgets[1]
        super().__init__(
            optimizer,
            noise_multiplier=sigma,
            max_grad_norm=bound,
            expected_batch_size=expected_batch_size,
            loss_reduction=loss_reduction,
            generator=source,
            secure_mode=secure_mode,
        )
        self.max_grad_norms = None if budgets is None else budgets[0]
        self.mechanism = mechanism
        self.noise_mechanism = mechanism.name
        self.clipping_norm = mechanism.norm
        self.noise_dim = sum(p.numel() for p in self.params)
        self.noise_seeded = not is_secure(source)
        self.exact = bool(exact)
        for p in self.params:  # `BufferedGradSampleModule` may hand float32 rows to the tiles
            p._float32_rows = self.exact

    @property
    def noise_grid(self) -> Grid | None:
        """The grid of an exact step at the current ``max_grad_norm`` (``None``: float steps)."""
        if not self.exact:
            return None
        # kept for the clipping bound it was made for: a step reads it several times
        key = (self.max_grad_norm, self.clipping_norm, self.noise_dim)
        held = getattr(self, "_held_grid", None)
        if held is None or held[0] != key:
            grid = step_grid(
                max_grad_norm=self.max_grad_norm, norm=self.clipping_norm, dim=self.noise_dim
            )
            held = self._held_grid = (key, grid)
        return held[1]

    @property
    def noise_sensitivity(self) -> float:
        """Δ': what one example moves the noised sum by (``max_grad_norm`` for float steps);
        the noise scale is ``noise_multiplier`` times this."""
        grid = self.noise_grid
        if grid is None:
            return float(self.max_grad_norm)
        return inflated_sensitivity(
            sensitivity=self.max_grad_norm,
            norm=self.clipping_norm,
            dim=self.noise_dim,
            grid=grid,
            rounding=0.5,
        )

    @property
    def noise_scale(self) -> float:
        """The scale of each coordinate's noise, ``noise_multiplier · noise_sensitivity``."""
        return self.noise_multiplier * self.noise_sensitivity

    def clip_and_accumulate(self) -> None:
        """Clip each example's gradient to ``max_grad_norm`` in the mechanism's norm (each
        parameter's part to its budget, with per-layer budgets) and add the clipped
        gradients into ``p.summed_grad`` (Opacus's clipping otherwise)."""
        grid = self.noise_grid
        if grid is not None and self._accumulate_fused(self.grad_samples, grid):
            return
        for p in self.params:  # the float64 path: Opacus's float64 per-sample gradients
            widen_grad_sample(p)
        grad_samples = self.grad_samples
        if len(grad_samples[0]) == 0:  # an empty Poisson batch
            factors = [torch.zeros((0,), device=grad_samples[0].device)] * len(self.params)
        elif self.max_grad_norms is None:
            norms = per_sample_norms(grad_samples, norm=self.clipping_norm)
            factors = [clip_factors(norms, max_grad_norm=self.max_grad_norm)] * len(self.params)
        else:
            factors = [
                clip_factors(per_sample_norms([g], norm=self.clipping_norm), max_grad_norm=c)
                for g, c in zip(grad_samples, self.max_grad_norms, strict=True)
            ]
        if grid is not None:
            self._accumulate_cells(factors, grid)
            return
        for p, factor_of_p in zip(self.params, factors, strict=True):
            _check_processed_flag(p.grad_sample)
            grad_sample = self._get_flat_grad_sample(p).to(p.dtype)
            factor = factor_of_p.to(grad_sample.device).to(p.dtype)
            grad = torch.einsum("i,i...", factor, grad_sample)
            if p.summed_grad is not None:
                p.summed_grad += grad
            else:
                p.summed_grad = grad
            _mark_as_processed(p.grad_sample)

    def _accumulate_fused(self, grad_samples: list[torch.Tensor], grid: Grid) -> bool:
        """The exact step's clipping in float32 tiles (`fused_cell_sums`: a rigorous norm
        bound replaces the check of each rounded example); ``False`` where it does not apply
        (GPU gradients, a non-finite gradient, an int range it cannot cover), and then nothing
        was accumulated.

        Float64 gradients are rounded to float32 first (`BufferedGradSampleModule` hands an
        ``nn.Linear`` weight's rows over already rounded, bit for bit the same). Privacy is
        unchanged: the proof bounds the cells of whatever vector is clipped, and fl32(g) is
        a function of the example as g is. Nor is utility: fl32 moves the clipped gradient
        by ≤ 2⁻²⁴·C in its norm, which is ≤ 2⁻¹⁷·w(d) cells on a step grid (C/γ < 2⁷·w(d),
        `step_grid`), against the up to w(d)/2 cells by which rounding to cells moves it.
        """
        if len(grad_samples[0]) == 0:  # an empty Poisson batch: the float64 path sums zeros
            return False
        radius = cell_radius(
            max_grad_norm=self.max_grad_norm, norm=self.clipping_norm, dim=self.noise_dim, grid=grid
        )
        rows = [g.reshape(len(g), -1).to(torch.float32) for g in grad_samples]
        sums = fused_cell_sums(
            rows,
            budgets=self.max_grad_norms,
            norm=self.clipping_norm,
            max_grad_norm=self.max_grad_norm,
            grid=grid,
            radius=radius,
        )
        if sums is None:
            return False
        for p, summed in zip(self.params, sums, strict=True):
            _check_processed_flag(p.grad_sample)
            summed = summed.view(p.shape)
            if p.summed_grad is not None:
                p.summed_grad += summed
            else:
                p.summed_grad = summed
            _mark_as_processed(p.grad_sample)
        return True

    def _accumulate_cells(self, factors: list[torch.Tensor], grid: Grid) -> None:
        """The exact step's clipping: each example's clipped gradient rounded to cells with
        its cell norm at most R = C/γ + w(d)/2, summed in int64 into ``p.summed_grad``."""
        cells = []
        for p, factor in zip(self.params, factors, strict=True):
            _check_processed_flag(p.grad_sample)
            cells.append(scaled_cells(self._get_flat_grad_sample(p), factor, grid=grid))
        radius = cell_radius(
            max_grad_norm=self.max_grad_norm, norm=self.clipping_norm, dim=self.noise_dim, grid=grid
        )
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
        noise = discrete_noise(
            tuple(p.shape),
            mechanism=self.mechanism,
            scale=scale,
            grid=grid,
            generator=self.generator,
        )
        return noise.to(p.device)

    def step_cell_noise(self, parts: Sequence[torch.Tensor]) -> torch.Tensor:
        """Exact integer noise for a whole step, flattened in the order of ``parts`` (int64,
        on ``parts[0]``'s device): one `discrete_noise` call for every coordinate, which is
        the same law as one `cell_noise` per parameter (i.i.d. coordinates) at a fraction of
        the per-call cost. The single-process and distributed optimizers both draw it."""
        count = sum(t.numel() for t in parts)
        grid = self.noise_grid
        if grid is None:
            raise ValueError("step_cell_noise needs an exact optimizer (exact=True)")
        device = parts[0].device if parts else torch.device("cpu")
        scale = self.noise_scale
        if scale == 0.0:
            return torch.zeros(count, dtype=torch.int64, device=device)
        noise = discrete_noise(
            count, mechanism=self.mechanism, scale=scale, grid=grid, generator=self.generator
        )
        return noise.to(device)

    def noisy_step_cells(self, parts: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """The clipped cells ``parts`` plus the step's exact noise, each flattened (int64, on
        its part's device): bit for bit ``part + step_cell_noise(parts)[its coordinates]``
        from the same generator state. Where every part is on the CPU the noise is summed
        into a copy of the cells as it is drawn (`noisy_cells`), with no noise tensor of its
        own; ``parts`` are never modified."""
        grid = self.noise_grid
        if grid is None:
            raise ValueError("noisy_step_cells needs an exact optimizer (exact=True)")
        sizes = [t.numel() for t in parts]
        scale = self.noise_scale
        if scale > 0.0 and all(t.device.type == "cpu" for t in parts):
            noisy = noisy_cells(
                parts, mechanism=self.mechanism, scale=scale, grid=grid, generator=self.generator
            )
            return list(noisy.split(sizes))
        noise = self.step_cell_noise(parts).cpu().split(sizes)
        pairs = zip(parts, noise, strict=True)
        return [t.reshape(-1).to(torch.int64) + n.to(t.device) for t, n in pairs]

    def noisy_step_grads(self) -> list[torch.Tensor]:
        """Each parameter's noisy gradient γ·(cells + K), in its dtype and shape: bit for bit
        `cells_to_grad` of `noisy_step_cells` of the ``summed_grad`` cells. On the CPU it is
        one compiled pass from the keystream's words to the floats (`noisy_dequantized`)."""
        grid = self.noise_grid
        if grid is None:
            raise ValueError("noisy_step_grads needs an exact optimizer (exact=True)")
        parts = [p.summed_grad for p in self.params]
        scale = self.noise_scale
        if scale > 0.0 and all(t.device.type == "cpu" for t in [*parts, *self.params]):
            grads = noisy_dequantized(
                parts,
                dtypes=[p.dtype for p in self.params],
                mechanism=self.mechanism,
                scale=scale,
                grid=grid,
                generator=self.generator,
            )
            return [g.view_as(p) for g, p in zip(grads, self.params, strict=True)]
        pairs = zip(self.noisy_step_cells(parts), self.params, strict=True)
        return [self.cells_to_grad(cells, p) for cells, p in pairs]

    def cells_to_grad(self, cells: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
        """γ·cells in ``p``'s dtype, shaped as ``p`` (post-processing of the noisy cells)."""
        grid = self.noise_grid
        if grid is None:
            raise ValueError("cells_to_grad needs an exact optimizer (exact=True)")
        # the value in float64 rounded once to p's dtype: what dequantize computes in any dtype
        return dequantize(cells, grid=grid, dtype=p.dtype).view_as(p)

    def float_noise(self, summed: torch.Tensor) -> torch.Tensor:
        """Floating-point noise of scale `noise_scale` shaped as ``summed`` (``exact=False``)."""
        scale = self.noise_scale
        if scale == 0.0:
            return torch.zeros_like(summed)
        return self.mechanism.sample(
            tuple(summed.shape), scale=scale, generator=self.generator, dtype=summed.dtype
        ).to(summed.device)

    def check_summed(self, summed: torch.Tensor) -> None:
        """Refuse a float clipped sum in an exact step (it must hold int64 cells)."""
        if self.exact and summed.is_floating_point():
            raise ValueError(
                "an exact step needs p.summed_grad as int64 grid cells (from "
                "clip_and_accumulate); got a float tensor"
            )

    def add_noise(self) -> None:
        """Add i.i.d. mechanism noise of scale `noise_scale` to every coordinate of the
        clipped sum; the result goes to ``p.grad``. Exact steps sum the noise of every
        parameter (one draw, `step_cell_noise`'s) into the int64 cells and convert them
        (`noisy_step_grads`)."""
        for p in self.params:
            _check_processed_flag(p.summed_grad)
            self.check_summed(p.summed_grad)
        if self.exact:
            for p, grad in zip(self.params, self.noisy_step_grads(), strict=True):
                p.grad = grad
                _mark_as_processed(p.summed_grad)
            return
        for p in self.params:
            p.grad = (p.summed_grad + self.float_noise(p.summed_grad)).view_as(p)
            _mark_as_processed(p.summed_grad)


def _per_layer_budgets(
    max_grad_norm: Any, *, optimizer: Optimizer, norm: str
) -> tuple[list[float], float] | None:
    """``(budgets, C)`` for a list of per-layer budgets (C their norm in ``norm``), else None.

    Raises:
        ValueError: on a bad budget, or a count other than the trainable parameters'.
    """
    if not isinstance(max_grad_norm, list | tuple):
        return None
    budgets = _check_budgets(max_grad_norm)
    count = len(trainable_params(optimizer))
    if len(budgets) != count:
        raise ValueError(
            f"max_grad_norm has {len(budgets)} per-layer budgets but the optimizer has "
            f"{count} trainable parameters: expected one budget per parameter"
        )
    order = CLIP_NORM_ORDERS[norm]
    total = torch.linalg.vector_norm(torch.tensor(budgets, dtype=torch.float64), ord=order)
    return budgets, float(total)
