"""Integer clipping for exact DP-SGD steps: per-example gradients rounded to grid cells
whose cell norm is at most R exactly, so that the batch's cell sum moves by at most R cells
when one example is added or removed.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch

from alm_opacus.mechanisms.clip_kernels import cell_sum_kernel, norm_tile_kernel
from alm_opacus.mechanisms.grid import Grid

__all__ = ["clip_to_cells", "enforce_radius", "fused_cell_sums", "scaled_cells"]


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
        raise ValueError(
            f"radius={radius!r} cells over a batch of {batch} leaves float64's "
            "exact integer range; use a coarser grid"
        )


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


# --------------------------------------------------------------------------------------------
# The fused float32 path: clip, round and sum in one cache-resident sweep per parameter, by
# the compiled kernels (`alm_opacus.mechanisms.kernels`). Where numba does not import, the
# float64 path above does the step (`fused_cell_sums` returns None).
# --------------------------------------------------------------------------------------------

#: float32's unit roundoff.
_U32 = 2.0**-24
#: Columns of one norm tile: γ_T = T·u32/(1 − T·u32) ≈ 2⁻¹¹ bounds the float32 error of a tile's
#: sum of T non-negative terms in any order (Higham, Accuracy and Stability, eq. 4.4).
_TILE = 8192
#: The compiled cell sums' column block (a float32 accumulator of 32 KB); it divides `_TILE`,
#: so a block never straddles two norm tiles. Each block reads a segment of every example's
#: row: longer segments are fewer page crossings and longer prefetch streams, and on the
#: 64 x 1.07M step of `scripts/bench_dpsgd.py` 8192 columns took 18.8 ms to 2048's 24.0.
_KERNEL_WIDTH = 8192
#: The batches the compiled cell sums take: its flush keeps 1 in reserve for any batch below
#: 2²⁸ (`clip_kernels._EXACT_SUM`).
_MAX_BATCH = 2**28
#: The clip bound is taken (1 − 2⁻²⁰) below C: it absorbs the float32 roundings of the
#: per-example scale and of each product (≤ (1 + 2⁻²⁴)² in all) and of C itself.
_SHRINK = 1.0 - 2.0**-20


def fused_cell_sums(
    rows: Sequence[torch.Tensor],
    *,
    budgets: Sequence[float] | None,
    max_grad_norm: float,
    norm: str,
    grid: Grid,
    radius: float,
) -> list[torch.Tensor] | None:
    """Σᵢ cᵢ per parameter, int64, with every example's cells cᵢ of norm ≤ ``radius``,
    computed in float32 tiles that stay in cache; ``None`` where the proof below does not
    apply or numba does not import (then `scaled_cells` and `enforce_radius` do the step in
    float64).

    Why no per-example check of the rounded norm is needed. For each example a rigorous
    upper bound N ≥ ‖g‖ is computed (each tile's float32 sum of |g| or g² is within γ_T of the
    exact sum, whatever the summation order, and the tiles are added in float64), the
    factor is f = min(1, C(1 − 2⁻²⁰)/(N + 10⁻⁶)) and s = f/γ is rounded to float32. Then
    y = fl(s·g) satisfies ‖y‖ ≤ (1 + 2⁻²⁴)²·f‖g‖/γ < C/γ, and rounding to integers moves each
    coordinate by ≤ ½, so ‖c‖ ≤ C/γ + w(d)/2 = R by the triangle inequality (per-layer
    budgets: per parameter, and then in the norm of the budgets by Minkowski's inequality
    for L2, by addition for L1). The cells are summed exactly by `_tile_sums`: in float32 runs
    of integers below 2²⁴, flushed into int64 column sums of magnitude ≤ B·R.

    Args:
        rows: each parameter's per-sample gradients as ``(batch, k)`` float32 CPU tensors.
        budgets: per-parameter budgets C_k, or ``None`` for flat clipping at ``max_grad_norm``.
        max_grad_norm: C.
        norm: ``"l1"`` or ``"l2"``.
        grid: the step grid.
        radius: R in cells (`cell_radius`), used for the exact-sum range.

    Returns:
        int64 sums shaped ``(k,)`` per parameter, or ``None``.
    """
    batch = len(rows[0])
    if not 0 < batch < _MAX_BATCH or batch * radius >= 2.0**53:
        return None
    if any(r.dtype != torch.float32 or r.device.type != "cpu" for r in rows):
        return None
    if norm_tile_kernel(norm) is None or cell_sum_kernel() is None:
        return None
    # The bounds are a few numbers per example: numpy's small-array calls cost a fraction
    # of torch's, which on a 5,770-weight head were most of the clipping's time.
    tiles = [_norm_tiles(r, norm=norm) for r in rows]  # of L1 norms, or of squared L2 norms
    bounds = [t.sum(1) * (1.0 + 2.0**-40) for t, _ in tiles]  # the float64 additions
    if budgets is None:  # one bound on the concatenation (float64 additions: 2⁻⁴⁰ covers)
        bounds = [np.sum(bounds, axis=0) * (1.0 + 2.0**-40)] * len(rows)
        budgets = [max_grad_norm] * len(rows)
    if norm == "l2":  # the square root rounds by ≤ 2⁻⁵³
        bounds = [np.sqrt(b) * (1.0 + 2.0**-50) for b in bounds]
    inverse = math.ldexp(1.0, -grid.exponent)
    scales = []
    for bound, budget in zip(bounds, budgets, strict=True):
        if not np.isfinite(bound).all():
            return None  # a non-finite gradient (or float32 overflow): the float64 path decides
        factor = np.minimum(budget * _SHRINK / (bound + 1e-6), 1.0)
        scale = (factor * inverse).astype(np.float32)
        if (scale < 2.0**-100).any():
            return None  # near float32's subnormals the scale's rounding is not relative
        scales.append(scale)
    return [
        _tile_sums(r, s, tiles=t, norm=norm) for r, s, t in zip(rows, scales, tiles, strict=True)
    ]


def _norm_bound(rows: torch.Tensor, *, norm: str) -> torch.Tensor:
    """float64 upper bounds on each row's norm (L1), or on its squared norm (L2): the sum of
    `_norm_tiles` (float64 additions of the tiles: within 2⁻⁴⁰ in all)."""
    return torch.from_numpy(_norm_tiles(rows, norm=norm)[0].sum(1) * (1.0 + 2.0**-40))


def _norm_tiles(rows: torch.Tensor, *, norm: str) -> tuple[np.ndarray, int]:
    """``(bounds, T)``: float64 upper bounds ``(batch, tiles)`` on the exact Σ|x| (L1) or Σx²
    (L2) of each row's tiles of T columns.

    Each tile's sum is taken in float32 by the compiled `clip_kernels.norm_tile_kernel`: of
    rounded squares (L2), of exact |x| (L1). A float32 overflow is handed back as
    non-finite. Whatever the summation order, a float32 sum of T non-negative terms is
    within γ_T of the exact sum.

    Raises:
        RuntimeError: where numba does not import (`fused_cell_sums` checks first).
    """
    kernel = norm_tile_kernel(norm)
    if kernel is None:  # pragma: no cover - fused_cell_sums hands the step back first
        raise RuntimeError("the norm tiles need numba")
    batch, length = rows.shape
    width = min(_TILE, max(length, 1))
    tiles = np.zeros((batch, -(-length // width)), dtype=np.float64)
    kernel(rows.detach().contiguous().numpy(), width, tiles)
    gamma = width * _U32 / (1.0 - width * _U32)
    # each term: one float32 rounding (squares) or none (abs), plus ≤ 2⁻¹²⁶ if flushed to
    # zero; each tile's sum within γ_T; the square root and its float64 square ≤ 2u; the
    # float64 product with the factor ≤ 2⁻⁵³ (2⁻⁴⁰ covers it)
    factor = (1.0 + 2.0**-40) / ((1.0 - _U32) ** 3 * (1.0 - gamma))
    tiles *= factor
    tiles += width * 2.0**-126
    return tiles, width


def _tile_sums(
    rows: torch.Tensor, scale: np.ndarray, *, tiles: tuple[np.ndarray, int], norm: str
) -> torch.Tensor:
    """Σᵢ round(scaleᵢ·rowsᵢ) exactly, int64 (see `fused_cell_sums`): the cells are float32
    integers; ``scale`` is float32, one per row.

    Compiled (`clip_kernels._cell_sums`): one pass, a float32 accumulator per column block flushed
    by the cells' bounds. A cell of tile t is at most sᵢ·Pᵢₜ·(1 + 2⁻²⁰) + ½, where Pᵢₜ
    bounds the tile's largest |x| (its L1 bound, or the square root of its squared L2 bound,
    from ``tiles``): fl(s·x) errs by 2⁻²⁴ relative and rounding adds ½.

    Raises:
        RuntimeError: where numba does not import (`fused_cell_sums` checks first).
    """
    kernel = cell_sum_kernel()
    if kernel is None:  # pragma: no cover - fused_cell_sums hands the step back first
        raise RuntimeError("the cell sums need numba")
    bounds, columns = tiles
    largest = np.sqrt(bounds) * (1.0 + 2.0**-50) if norm == "l2" else bounds
    cell_bounds = largest * scale.astype(np.float64)[:, None] * (1.0 + 2.0**-20) + 0.5
    total = np.zeros(rows.shape[1], dtype=np.int64)
    kernel(rows.detach().contiguous().numpy(), scale, cell_bounds, columns, _KERNEL_WIDTH, total)
    return torch.from_numpy(total)
