"""Compiled kernels of the exact step's clipping: rigorous per-row norm bounds from float32
tiles, and the clipped cells summed exactly in float32 accumulators
(`alm_opacus.mechanisms.cell_clipping`; the argument is in `alm_opacus.mechanisms.kernels`'s
docstring). Split from `kernels` (the noise's first pass) to keep each module readable.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from alm_opacus.mechanisms.jit import NUMBA as _numba
from alm_opacus.mechanisms.jit import jit_reassociated as _jit_reassociated
from alm_opacus.mechanisms.jit import jit_uncontracted as _jit_uncontracted

__all__ = ["cell_sum_kernel", "norm_tile_kernel"]

_ZERO32 = np.float32(0.0)
#: Bound on the magnitudes a float32 accumulator of integer cells may reach between flushes:
#: every integer of magnitude ≤ 2²⁴ is a float32, and the float64 running bound errs by far
#: less than the 1 kept in reserve for any batch below 2²⁸ (`cell_clipping.fused_cell_sums` checks).
_EXACT_SUM = 2.0**24 - 1.0


@_jit_uncontracted
def _flush(acc: np.ndarray, block: np.ndarray) -> None:
    for j in range(len(block)):
        block[j] += acc[j]
        acc[j] = _ZERO32


@_jit_uncontracted
def _cell_sums(
    rows: np.ndarray, scale: np.ndarray, bounds: np.ndarray, tile: int, width: int, out: np.ndarray
) -> None:
    """out[j] += Σᵢ rint(scaleᵢ·rowsᵢⱼ), exactly: float32 rows and scale, float64 ``out``.

    ``bounds[i, t]`` must bound |rint(scaleᵢ·rowsᵢⱼ)| for every column j of the ``tile``
    columns numbered t. Each column block of ``width`` (within one tile) is summed in a
    float32 accumulator, flushed into ``out`` before the bounds of the rows it holds could
    sum past `_EXACT_SUM`: every partial sum is then an integer of magnitude < 2²⁴, so every
    float32 addition is exact (a row whose bound alone passes it is added to an empty
    accumulator, exactly, and flushed at once). ``np.rint`` rounds half to even, as
    ``torch.round``; compiled without contraction, fl(s·x) is rounded once, as torch rounds
    it. Inner loops index slices from 0 (no wraparound checks: LLVM vectorises them)."""
    batch, length = rows.shape
    acc = np.zeros(width, np.float32)
    for start in range(0, length, width):
        stop = min(length, start + width)
        block = out[start:stop]
        t = start // tile
        held = 0.0
        for i in range(batch):
            largest = bounds[i, t]
            if held > 0.0 and held + largest >= _EXACT_SUM:
                _flush(acc, block)
                held = 0.0
            s = scale[i]
            row = rows[i, start:stop]
            for j in range(stop - start):
                acc[j] += np.rint(row[j] * s)
            held += largest
            if held >= _EXACT_SUM:
                _flush(acc, block)
                held = 0.0
        _flush(acc, block)


def cell_sum_kernel() -> Callable[..., None] | None:
    """The compiled cell sums (`_cell_sums`), or None where numba does not import."""
    return None if _numba is None else _cell_sums


@_jit_reassociated
def _magnitude(x: np.float32) -> np.float32:
    return abs(x)


@_jit_reassociated
def _square(x: np.float32) -> np.float32:
    return x * x  # rounded once; an overflow is inf, handed back


def _tile_loop(term: Callable[[np.float32], np.float32]) -> Callable[..., None]:
    """The tile loop for one norm, ``term`` being |x| (L1) or x² (L2): a closure, so that
    numba compiles (and caches, the closure's contents keyed) one loop per norm with the
    term inlined, as if written out twice."""

    @_jit_reassociated
    def tiles(rows: np.ndarray, width: int, out: np.ndarray) -> None:
        """out[i, t] = the float32 sum of term(rowsᵢⱼ) over the t-th tile of ``width``
        columns (in any order: `_jit_reassociated`); float32 rows, float64 ``out``."""
        batch, length = rows.shape
        for i in range(batch):
            for start in range(0, length, width):
                tile = rows[i, start : min(length, start + width)]
                acc = _ZERO32
                for j in range(len(tile)):
                    acc += term(tile[j])
                out[i, start // width] = acc

    return tiles


_abs_tiles = _tile_loop(_magnitude)
_square_tiles = _tile_loop(_square)
_TILES = {"l1": _abs_tiles, "l2": _square_tiles}


def norm_tile_kernel(norm: str) -> Callable[[np.ndarray, int, np.ndarray], None] | None:
    """The compiled tile sums of |x| (``"l1"``) or of x² (``"l2"``), or None where numba
    does not import."""
    return None if _numba is None else _TILES[norm]
