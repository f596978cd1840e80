"""Integer clipping for exact DP-SGD steps: per-example gradients rounded to grid cells
whose cell norm is at most R exactly, so that the batch's cell sum moves by at most R cells
when one example is added or removed.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch

from alm_opacus.mechanisms.grid import Grid
from alm_opacus.mechanisms.kernels import cell_sum_kernel, norm_tile_kernel

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
# The fused float32 path: clip, round and sum in one cache-resident sweep per parameter.
# --------------------------------------------------------------------------------------------

#: float32's unit roundoff, and the bound below which every float32 integer sum is exact
#: whatever the order.
_U32 = 2.0**-24
_EXACT32 = 2.0**24
#: Columns of one norm tile: γ_T = T·u32/(1 − T·u32) ≈ 2⁻¹¹ bounds the float32 error of a tile's
#: sum of T non-negative terms in any order (Higham, Accuracy and Stability, eq. 4.4).
_TILE = 8192
#: Elements of one (batch, columns) tile of the cell sums: 1 MiB of float32 where the whole
#: batch is summed at once, 4 MiB where runs are (fewer, longer calls); measured fastest.
_SUM_TILE = 1 << 18
_RUN_TILE = 1 << 20
#: Rows at least this long take BLAS ``sasum`` for their L1 tiles (at 5,760 columns and a
#: batch of 256: 0.26 ms against 0.68 ms for torch's ``abs().sum()``, which writes |g| out).
_ASUM_MIN = 1024
#: Whether the norm tiles and the cell sums run compiled where numba imports (tests switch it
#: off to check the tensor path, the one without numba); and the compiled cell sums' column
#: block (a float32 accumulator that stays in L1 cache; it divides `_TILE`, so a block never
#: straddles two norm tiles).
_USE_KERNEL = True
_KERNEL_WIDTH = 2048
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
    apply (then `scaled_cells` and `enforce_radius` do the step in float64).

    Why no per-example check of the rounded norm is needed. For each example a rigorous
    upper bound N ≥ ‖g‖ is computed (each tile's float32 sum of |g| or g² is within γ_T of the
    exact sum, whatever torch's summation order, and the tiles are added in float64), the
    factor is f = min(1, C(1 − 2⁻²⁰)/(N + 10⁻⁶)) and s = f/γ is rounded to float32. Then
    y = fl(s·g) satisfies ‖y‖ ≤ (1 + 2⁻²⁴)²·f‖g‖/γ < C/γ, and rounding to integers moves each
    coordinate by ≤ ½, so ‖c‖ ≤ C/γ + w(d)/2 = R by the triangle inequality (per-layer
    budgets: per parameter, and then in the norm of the budgets by Minkowski's inequality
    for L2, by addition for L1). Every |cᵢⱼ| ≤ R, so when B·R < 2²⁴ every partial sum of the
    batch is a float32 integer and the column sums are exact in any order; otherwise runs of
    G examples with G·R < 2²⁴ are summed so, and the runs in float64 (or, when R ≥ 2²⁴, every
    cell is converted to float64 exactly); float64 sums of integers are exact below 2⁵³.

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
    if batch == 0 or any(r.dtype != torch.float32 or r.device.type != "cpu" for r in rows):
        return None
    group = _sum_group(batch=batch, radius=radius)
    if group is None:
        return None
    tiles = [_norm_tiles(r, norm=norm) for r in rows]  # of L1 norms, or of squared L2 norms
    bounds = [t.sum(1).mul_(1.0 + 2.0**-40) for t, _ in tiles]  # the float64 additions
    if budgets is None:  # one bound on the concatenation (float64 additions: 2⁻⁴⁰ covers)
        bounds = [torch.stack(bounds).sum(0).mul_(1.0 + 2.0**-40)] * len(rows)
        budgets = [max_grad_norm] * len(rows)
    if norm == "l2":  # the square root rounds by ≤ 2⁻⁵³
        bounds = [b.sqrt().mul_(1.0 + 2.0**-50) for b in bounds]
    inverse = math.ldexp(1.0, -grid.exponent)
    scales = []
    for bound, budget in zip(bounds, budgets, strict=True):
        if not bool(torch.isfinite(bound).all()):
            return None  # a non-finite gradient (or float32 overflow): the float64 path decides
        factor = (budget * _SHRINK / (bound + 1e-6)).clamp_(max=1.0)
        scale = factor.mul_(inverse).to(torch.float32)
        if bool((scale < 2.0**-100).any()):
            return None  # near float32's subnormals the scale's rounding is not relative
        scales.append(scale.view(-1, 1))
    return [
        _tile_sums(r, s, group=group, tiles=t, norm=norm)
        for r, s, t in zip(rows, scales, tiles, strict=True)
    ]


def _sum_group(*, batch: int, radius: float) -> int | None:
    """How many examples' cells a float32 column sum may add exactly: G with G·R < 2²⁴ (every
    partial sum is then a float32 integer, in any order), at most the batch; 0 when even one
    cell may exceed that (the cells are then summed in float64); None when B·R ≥ 2⁵³."""
    if batch * radius >= 2.0**53:
        return None
    if radius == 0:
        return batch
    group = min(batch, math.floor((_EXACT32 - 1.0) / radius)) if radius < _EXACT32 else 0
    while group > 0 and group * radius >= _EXACT32:  # float safety
        group -= 1
    return group


def _norm_bound(rows: torch.Tensor, *, norm: str) -> torch.Tensor:
    """float64 upper bounds on each row's norm (L1), or on its squared norm (L2): the sum of
    `_norm_tiles` (float64 additions of the tiles: within 2⁻⁴⁰ in all)."""
    return _norm_tiles(rows, norm=norm)[0].sum(1).mul_(1.0 + 2.0**-40)


def _norm_tiles(rows: torch.Tensor, *, norm: str) -> tuple[torch.Tensor, int]:
    """``(bounds, T)``: float64 upper bounds ``(batch, tiles)`` on the exact Σ|x| (L1) or Σx²
    (L2) of each row's tiles of T columns.

    Each tile's sum is taken in float32: of rounded squares (L2), of exact |x| (L1).
    Compiled (`kernels._l2_tiles`, `_l1_tiles`) where numba imports; else torch's
    ``vector_norm`` (a sum of rounded squares, then a rounded square root: torch does not
    rescale, as its overflow to inf for |x| > 1.8e19 shows), BLAS ``sasum`` or torch's
    ``abs().sum()``. A float32 overflow is handed back as non-finite. Whatever the summation
    order, a float32 sum of T non-negative terms is within γ_T of the exact sum.
    """
    batch, length = rows.shape
    width = min(_TILE, max(length, 1))
    count = -(-length // width)
    kernel = norm_tile_kernel(norm) if _USE_KERNEL and rows.is_contiguous() else None
    if kernel is not None:
        computed = np.zeros((batch, count), dtype=np.float64)
        kernel(rows.detach().numpy(), width, computed)
        tiles = torch.from_numpy(computed)
    elif norm == "l2":
        full = length - length % width
        parts = []
        for start, stop, size in ((0, full, width), (full, length, length - full)):
            if stop > start:
                chunks = rows[:, start:stop].reshape(batch, -1, size)
                parts.append(torch.linalg.vector_norm(chunks, 2, dim=2).double().square_())
        tiles = torch.cat(parts, dim=1) if parts else torch.zeros(batch, count)
    elif length < _ASUM_MIN:  # short rows: torch's abs and sum beat a BLAS call per row
        tiles = rows.abs().sum(dim=1, keepdim=True).double()
    else:
        from scipy.linalg import blas

        data = rows.detach().contiguous().numpy()
        sums = [[blas.sasum(row[a : a + width]) for a in range(0, length, width)] for row in data]
        tiles = torch.tensor(sums, dtype=torch.float64)
    gamma = width * _U32 / (1.0 - width * _U32)
    # each term: one float32 rounding (squares) or none (abs), plus ≤ 2⁻¹²⁶ if flushed to
    # zero; each tile's sum within γ_T; the square root and its float64 square ≤ 2u; the
    # float64 product with the factor ≤ 2⁻⁵³ (2⁻⁴⁰ covers it)
    factor = (1.0 + 2.0**-40) / ((1.0 - _U32) ** 3 * (1.0 - gamma))
    return tiles.to(torch.float64).mul_(factor).add_(width * 2.0**-126), width


def _tile_sums(
    rows: torch.Tensor,
    scale: torch.Tensor,
    *,
    group: int,
    tiles: tuple[torch.Tensor, int],
    norm: str,
) -> torch.Tensor:
    """Σᵢ round(scaleᵢ·rowsᵢ) exactly, int64 (see `fused_cell_sums`): the cells are float32
    integers.

    Compiled (`kernels._cell_sums`) where numba imports: one pass, a float32 accumulator per
    column block flushed by the cells' bounds. A cell of tile t is at most
    sᵢ·Pᵢₜ·(1 + 2⁻²⁰) + ½, where Pᵢₜ bounds the tile's largest |x| (its L1 bound, or the
    square root of its squared L2 bound, from ``tiles``): fl(s·x) errs by 2⁻²⁴ relative and
    rounding adds ½.

    Otherwise in torch: with ``group`` ≥ the batch (B·R < 2²⁴) each tile's columns are
    summed in float32, exact by that bound. Otherwise each tile's largest |cell| m sets the
    run G = max(group, ⌊(2²⁴ − 1)/m⌋): every partial sum of G cells is an integer below 2²⁴
    in magnitude, so each run's float32 sum is exact in any order, and the runs are added in
    float64 (integers below 2⁵³); with G = 0 every cell is converted to float64. A gradient's
    cells are usually far below the bound R (which assumes one example's whole norm in one
    coordinate), so the L1 steps of large models, where R ≥ 2²⁴, still sum in float32."""
    batch, length = rows.shape
    kernel = cell_sum_kernel() if _USE_KERNEL else None
    if kernel is not None and rows.is_contiguous() and batch < 2**28:
        bounds, columns = tiles
        largest = bounds.sqrt().mul_(1.0 + 2.0**-50) if norm == "l2" else bounds
        cell_bounds = (largest * scale.double()).mul_(1.0 + 2.0**-20).add_(0.5)
        total = np.zeros(length, dtype=np.float64)
        kernel(
            rows.detach().numpy(),
            scale.reshape(-1).contiguous().numpy(),
            cell_bounds.numpy(),
            columns,
            _KERNEL_WIDTH,
            total,
        )
        return torch.from_numpy(total).to(torch.int64)
    elements = _SUM_TILE if group == 0 or group >= batch else _RUN_TILE
    width = min(max(1024, elements // max(batch, 1)), max(length, 1))
    tile = torch.empty(batch, width, dtype=torch.float32)
    summed = torch.empty(length, dtype=torch.float32 if group >= batch else torch.float64)
    for start in range(0, length, width):
        stop = min(length, start + width)
        cells = torch.mul(rows[:, start:stop], scale, out=tile[:, : stop - start]).round_()
        out = summed[start:stop]
        if group >= batch:
            torch.sum(cells, dim=0, out=out)
            continue
        run = max(group, _exact_run(cells))
        if run >= batch:
            out.copy_(cells.sum(dim=0))
        elif run == 0:
            torch.sum(cells.to(torch.float64), dim=0, out=out)
        else:
            out.copy_(cells[:run].sum(dim=0))
            for first in range(run, batch, run):
                out += cells[first : first + run].sum(dim=0)
    return summed.to(torch.int64)


def _exact_run(cells: torch.Tensor) -> int:
    """The most rows of ``cells`` (float32 integers) whose column sums are exact in float32 in
    any order: ⌊(2²⁴ − 1)/m⌋ for the largest magnitude m (all rows when m = 0)."""
    low, high = torch.aminmax(cells)
    group = _sum_group(batch=len(cells), radius=max(-float(low), float(high)))
    return 0 if group is None else group
