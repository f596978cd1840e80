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
        block[j] += np.int64(acc[j])  # an integer below 2²⁴: converted exactly
        acc[j] = _ZERO32


#: Rows the compiled cell sums add per sweep of a column block, where their cells' bounds
#: fit the accumulator together: one read of the accumulator per 8 rows instead of per row
#: (on the 64 x 1.07M step of `scripts/bench_dpsgd.py`, 22 ms per step became 13 ms).
#: `_add_group` writes its eight rows out (numba vectorises that, not a loop over rows):
#: change both together.
_GROUP = 8


@_jit_uncontracted
def _add_row(acc: np.ndarray, row: np.ndarray, s: np.float32) -> None:
    for j in range(len(acc)):
        acc[j] += np.rint(row[j] * s)


@_jit_uncontracted
def _add_group(acc: np.ndarray, rows: np.ndarray, scale: np.ndarray, i: int, start: int) -> None:
    """acc[j] += the cells of rows i..i+7 at column start + j, added pairwise: each partial
    sum is an integer within the rows' bounds, so exact when those fit (`_cell_sums`)."""
    stop = start + len(acc)
    r0, r1 = rows[i, start:stop], rows[i + 1, start:stop]
    r2, r3 = rows[i + 2, start:stop], rows[i + 3, start:stop]
    r4, r5 = rows[i + 4, start:stop], rows[i + 5, start:stop]
    r6, r7 = rows[i + 6, start:stop], rows[i + 7, start:stop]
    s0, s1, s2, s3 = scale[i], scale[i + 1], scale[i + 2], scale[i + 3]
    s4, s5, s6, s7 = scale[i + 4], scale[i + 5], scale[i + 6], scale[i + 7]
    for j in range(len(acc)):
        c01 = np.rint(r0[j] * s0) + np.rint(r1[j] * s1)
        c23 = np.rint(r2[j] * s2) + np.rint(r3[j] * s3)
        c45 = np.rint(r4[j] * s4) + np.rint(r5[j] * s5)
        c67 = np.rint(r6[j] * s6) + np.rint(r7[j] * s7)
        acc[j] += (c01 + c23) + (c45 + c67)


@_jit_uncontracted
def _cell_sums(
    rows: np.ndarray, scale: np.ndarray, bounds: np.ndarray, tile: int, width: int, out: np.ndarray
) -> None:
    """out[j] += Σᵢ rint(scaleᵢ·rowsᵢⱼ), exactly: float32 rows and scale, int64 ``out``.

    ``bounds[i, t]`` must bound |rint(scaleᵢ·rowsᵢⱼ)| for every column j of the ``tile``
    columns numbered t. Each column block of ``width`` (within one tile) is summed in a
    float32 accumulator, flushed into ``out`` before the bounds of the rows it holds could
    sum past `_EXACT_SUM`: every partial sum is then an integer of magnitude < 2²⁴, so every
    float32 addition is exact, whatever the order of the additions. Rows are added
    `_GROUP` at a time where the group's bounds fit beside what the accumulator holds, one
    by one otherwise (a row whose bound alone passes 2²⁴ is added to an empty accumulator,
    exactly, and flushed at once). ``np.rint`` rounds half to even, as ``torch.round``;
    compiled without contraction, fl(s·x) is rounded once, as torch rounds it. Inner loops
    index slices from 0 (no wraparound checks: LLVM vectorises them)."""
    batch, length = rows.shape
    acc_all = np.zeros(width, np.float32)
    for start in range(0, length, width):
        stop = min(length, start + width)
        acc = acc_all[: stop - start]
        block = out[start:stop]
        t = start // tile
        held = 0.0
        i = 0
        while i < batch:
            if i + _GROUP <= batch:
                group = 0.0
                for k in range(i, i + _GROUP):
                    group += bounds[k, t]
                if held > 0.0 and held + group >= _EXACT_SUM:
                    _flush(acc, block)
                    held = 0.0
                if group < _EXACT_SUM:
                    _add_group(acc, rows, scale, i, start)
                    held += group
                    i += _GROUP
                    continue
            largest = bounds[i, t]
            if held > 0.0 and held + largest >= _EXACT_SUM:
                _flush(acc, block)
                held = 0.0
            _add_row(acc, rows[i, start:stop], scale[i])
            held += largest
            if held >= _EXACT_SUM:
                _flush(acc, block)
                held = 0.0
            i += 1
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
