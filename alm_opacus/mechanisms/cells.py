"""Integer clipping for exact DP-SGD steps: per-example gradients rounded to grid cells
whose cell norm is at most R exactly, so that the batch's cell sum moves by at most R cells
when one example is added or removed.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from alm_opacus.mechanisms.grid import Grid

__all__ = ["clip_to_cells", "enforce_radius", "scaled_cells"]


def clip_to_cells(
    clipped: Sequence[torch.Tensor], *, grid: Grid, norm: str, radius: float
) -> list[torch.Tensor]:
    """Round each example's clipped gradient to cells, with its cell norm ≤ ``radius`` exactly.

    Float clipping leaves norms within float error of C, and rounding adds at most w(d)/2
    cells, so a rounded example exceeds R = C/γ + w(d)/2 only through float error; such an
    example is shrunk toward zero (truncation never increases a coordinate) until the exact
    check passes. Removing one example then moves the batch's cell sum by at most R cells.

    The cells are float64 tensors holding integers: every sum and sum of squares below is of
    integers under 2⁵³, hence exact in float64 whatever the summation order (a check refuses
    grids where that could fail), and cheaper than int64 arithmetic.

    Args:
        clipped: one tensor per parameter, each ``(batch, *shape)``, already clipped.
        grid: the step grid.
        norm: ``"l1"`` or ``"l2"``.
        radius: R in cells (`cell_radius`).

    Returns:
        float64 tensors of the same shapes, holding the cells (exact integers).

    Raises:
        ValueError: if R² (L2) or R (L1) times the batch reaches 2⁵³.
    """
    scale = math.ldexp(1.0, -grid.exponent)
    return enforce_radius(
        [g.to(torch.float64).mul(scale).round_() for g in clipped], norm=norm, radius=radius
    )


def enforce_radius(cells: list[torch.Tensor], *, norm: str, radius: float) -> list[torch.Tensor]:
    """Shrink, in place, every example whose cells exceed ``radius`` in ``norm`` (see
    `clip_to_cells`); ``cells`` are float64 tensors of integers, ``(batch, *shape)`` each.

    Raises:
        ValueError: on a non-finite cell, or a radius beyond float64's exact integers.
    """
    if not cells or len(cells[0]) == 0:
        return cells
    _check_exact_range(radius=radius, norm=norm, batch=len(cells[0]))
    # the integer Σc² is compared with R² rounded down by 2⁻⁵⁰: never above R²
    target = radius * radius * (1 - 2.0**-50) if norm == "l2" else float(math.floor(radius))
    for _ in range(64):
        # exact below 2^53; a larger sum is still far above the target, and NaN is refused
        size = _cell_sizes(cells, norm=norm)
        if not bool(torch.isfinite(size).all()):
            raise ValueError("a per-sample gradient is not finite: nothing to clip")
        over = size > target
        if not bool(over.any()):
            return cells
        # shrink to (1 − 2⁻²⁰) of the bound; truncation toward zero only lowers |cells|
        length = size.sqrt() if norm == "l2" else size
        limit = math.sqrt(target) if norm == "l2" else target
        factor = torch.where(over, limit * (1 - 2.0**-20) / length.clamp(min=1.0), 1.0)
        for c in cells:
            c.mul_(factor.view(-1, *[1] * (c.dim() - 1))).trunc_()
    raise RuntimeError("integer clipping did not converge")  # pragma: no cover


def _check_exact_range(*, radius: float, norm: str, batch: int) -> None:
    if (radius * radius if norm == "l2" else radius) * batch >= 2.0**53:
        raise ValueError(f"radius={radius!r} cells over a batch of {batch} leaves float64's "
                         "exact integer range; use a coarser grid")  # fmt: skip


def scaled_cells(grad_sample: torch.Tensor, factors: torch.Tensor, *, grid: Grid) -> torch.Tensor:
    """round(factorᵢ·gᵢ/γ) per example, float64 holding integers, in two passes (the
    factor and 1/γ are multiplied first: 1/γ is a power of two, so nothing else rounds)."""
    scale = factors.to(grad_sample.device, torch.float64) * math.ldexp(1.0, -grid.exponent)
    return torch.mul(grad_sample, scale.view(-1, *[1] * (grad_sample.dim() - 1))).round_()


def _cell_sizes(cells: Sequence[torch.Tensor], *, norm: str) -> torch.Tensor:
    """Per example, Σ|c| (L1) or Σc² (L2) over every parameter's cells (exact)."""
    total = torch.zeros(len(cells[0]), dtype=torch.float64, device=cells[0].device)
    for c in cells:
        flat = c.reshape(len(c), -1)
        if norm == "l1":
            total += torch.linalg.vector_norm(flat, 1, dim=1)
        else:
            total += torch.einsum("ij,ij->i", flat, flat)
    return total
