"""Exact noise on a power-of-two grid: the floats a release ships are the ones the proof covers.

A release of a clean vector v under a mechanism of scale s is

    release = γ · (n + K),   n = round(clamp_B(v) / γ) ∈ Zᵈ,   K ∈ Zᵈ i.i.d.,

computed in int64 and converted to the release dtype without rounding (γ is a power of two
and |n + K| ≤ 2ᵖ, p the dtype's significand bits; larger outputs are clamped, which is
post-processing). K is the continuous noise law at scale s/γ *rounded to the nearest
integer* ("cell-integrated": P(K = k) = P(k − ½ < Z < k + ½)), so that

    n + K = round(n + Z)

is a post-processing of the continuous mechanism n + Z applied to the integer query n. Every
profile, calibration and accountant of the continuous mechanism therefore holds verbatim for
the shipped floats, with the sensitivity of n: rounding moves each coordinate by at most γ/2,
so two neighbouring releases differ by at most Δ + dγ in L1 and Δ + √d·γ in L2
(`docs/mechanisms.md`, "Exact releases"). The scale is calibrated to that inflated
sensitivity, and γ is chosen so that the inflation is at most `INFLATION` (0.78%).

K is sampled exactly from random bits, never as a float function of a float uniform: a
uniform V = 0.b₁b₂… (bits drawn as needed) is compared with the law's tail at the two cell
boundaries. A float64 inversion proposes the cell and decides it when V lies farther from
both boundaries than a rigorous bound on the float error; the few draws that land within it
are decided by interval arithmetic (mpmath's ``iv``), drawing more bits of V until the
comparison is certain. The law of K is therefore exactly the cell-integrated law, whatever
the float library's last-bit behaviour.

Composable primitives for DP-SGD (and a distributed optimizer): `step_grid`, `clip_to_cells`
(integer per-example clipping), `discrete_noise` and `dequantize`, and their fused forms
`noisy_cells` (K summed into the cells as it is drawn) and `noisy_dequantized` (then converted
to the gradients' floats in the same pass); every sum is exact in int64, so summing across
processes is exact too.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from alm_opacus.mechanisms.cell_clipping import (
    clip_to_cells,
    enforce_radius,
    fused_cell_sums,
    scaled_cells,
)
from alm_opacus.mechanisms.cell_laws import (
    CELL_LAWS,
    CellLaw,
    _erfc_interval,  # noqa: F401  (re-exported: the slow paths are tested through here)
    cell_delta,
    cell_law,
    cell_log_pmf,
    cell_pld,
)
from alm_opacus.mechanisms.exact_passes import eager_first_pass, second_pass
from alm_opacus.mechanisms.grid import (
    INFLATION,
    Grid,
    cell_radius,
    cells_per_scale,
    dequantize,
    grid_for,
    inflated_sensitivity,
    max_exponent,
    quantize,
    step_grid,
)
from alm_opacus.mechanisms.kernels import finish_kernel, first_pass_kernel
from alm_opacus.mechanisms.sampling import (
    NoiseGenerator,
    SecureGenerator,
    Shape,
    uniform_words,
)

__all__ = [
    "CELL_LAWS",
    "INFLATION",
    "CellLaw",
    "Grid",
    "ReleasePlan",
    "cell_delta",
    "cell_law",
    "cell_log_pmf",
    "cell_pld",
    "cell_radius",
    "clip_to_cells",
    "dequantize",
    "discrete_noise",
    "enforce_radius",
    "exact_release",
    "fused_cell_sums",
    "grid_for",
    "inflated_sensitivity",
    "is_narrow",
    "noisy_cells",
    "noisy_dequantized",
    "plan_release",
    "quantize",
    "release_dtype",
    "scaled_cells",
    "step_grid",
]

#: Coordinates processed at once by the fast path (its buffers stay in cache).
_CHUNK = 1 << 17
#: The first pass's margin per unit of t (docs/mechanisms.md, "Exact sampling"); the second
#: pass's bound on V's relative uncertainty. Tests widen them to send draws down the slower,
#: exact paths.
_FIRST_MARGIN = 2.0**-39
_SECOND_MARGIN = 2.0**-50
#: Whether the first pass runs compiled where numba imports (tests switch it off to check the
#: tensor path).
_USE_KERNELS = True
#: Whether a compiled law's first pass runs as one fused loop per tile (tests switch it off
#: to compare it, bit for bit, with the chunked reference: `kernels.first_pass_kernel`).
_FUSED = True
#: The first pass leaves every draw with V < 2⁻ᵏ in doubt, so that its margin is one constant
#: per call (see `discrete_noise`); k is chosen per call within these bounds.
_SMALL_V_BITS = (4, 24)


# --------------------------------------------------------------------------------------------
# Exact sampling.
# --------------------------------------------------------------------------------------------


def discrete_noise(
    shape: Shape, *, mechanism: object, scale: float, grid: Grid, generator: NoiseGenerator
) -> torch.Tensor:
    """I.i.d. integer noise K, the mechanism's law at ``scale`` rounded to the grid, exactly.

    Args:
        shape: output shape.
        mechanism: an `AdditiveNoiseMechanism` or its registry name.
        scale: the continuous noise scale (s, b or σ), > 0.
        grid: the grid; K is in cells of γ.
        generator: a `SecureGenerator` (default everywhere) or a seeded ``torch.Generator``.

    Returns:
        An int64 tensor on the CPU.

    Raises:
        ValueError: on a bad scale or shape, or a mechanism without a cell law.
    """
    law = cell_law(mechanism)
    t = cells_per_scale(scale, grid)
    dims = (shape,) if isinstance(shape, int) else tuple(shape)
    if any(isinstance(n, bool) or not isinstance(n, int) or n < 0 for n in dims):
        raise ValueError(f"shape={shape!r} is invalid: expected non-negative integers")
    out = torch.empty(math.prod(dims), dtype=torch.int64)
    _draw_into([(None, out.numpy())], law=law, t=t, generator=generator, finish="store")
    return out.reshape(dims)


def noisy_cells(
    cells: Sequence[torch.Tensor],
    *,
    mechanism: object,
    scale: float,
    grid: Grid,
    generator: NoiseGenerator,
) -> torch.Tensor:
    """The integer ``cells``, flattened and concatenated, plus i.i.d. exact noise K: bit for
    bit ``torch.cat(cells) + discrete_noise(total, ...)`` from the same generator state (the
    same words, in the same order, make the same decisions), K summed into the cells as it
    is drawn rather than stored in a tensor of its own.

    Args:
        cells: integer tensors (an exact DP-SGD step's clipped sums, one per parameter).
        mechanism: an `AdditiveNoiseMechanism` or its registry name.
        scale: the continuous noise scale (s, b or σ), > 0.
        grid: the grid; the cells and K are in cells of γ.
        generator: a `SecureGenerator` (default everywhere) or a seeded ``torch.Generator``.

    Returns:
        A new one-dimensional int64 tensor on the CPU (``cells`` are not modified).

    Raises:
        ValueError: on a bad scale, non-integer ``cells``, or a mechanism without a cell law.
    """
    law = cell_law(mechanism)
    t = cells_per_scale(scale, grid)
    bases = _integer_cells(cells)
    out = torch.empty(sum(len(b) for b in bases), dtype=torch.int64)
    segments, at = [], 0
    for base in bases:
        segments.append((base, out.numpy()[at : at + len(base)]))
        at += len(base)
    _draw_into(segments, law=law, t=t, generator=generator, finish="sum")
    return out


def noisy_dequantized(
    cells: Sequence[torch.Tensor],
    *,
    dtypes: Sequence[torch.dtype],
    mechanism: object,
    scale: float,
    grid: Grid,
    generator: NoiseGenerator,
) -> list[torch.Tensor]:
    """γ·clamp(cells + K, ±limit) for each of ``cells``, in its dtype and shape, K i.i.d.
    exact noise: bit for bit `dequantize` of `noisy_cells` (the same draws). Where the
    first pass is compiled and every dtype is float32 or float64, one compiled pass per tile
    goes from the keystream's words to the released floats, with no intermediate tensor.

    Args:
        cells: integer tensors (an exact DP-SGD step's clipped sums, one per parameter).
        dtypes: the float dtype of each output (the parameters').
        mechanism: an `AdditiveNoiseMechanism` or its registry name.
        scale: the continuous noise scale (s, b or σ), > 0.
        grid: the grid of the cells and of K.
        generator: a `SecureGenerator` (default everywhere) or a seeded ``torch.Generator``.

    Returns:
        New float tensors on the CPU (``cells`` are not modified).

    Raises:
        ValueError: on a bad scale, non-integer ``cells``, dtypes not matching them one to
            one, or a mechanism without a cell law.
    """
    if len(dtypes) != len(cells):
        raise ValueError(
            f"dtypes has {len(dtypes)} entries for {len(cells)} cell tensors: expected one each"
        )
    law = cell_law(mechanism)
    kernel = first_pass_kernel(law.name, fused=_FUSED) if _USE_KERNELS else None
    if kernel is None or any(d not in (torch.float32, torch.float64) for d in dtypes):
        flat = noisy_cells(cells, mechanism=law.name, scale=scale, grid=grid, generator=generator)
        pieces = flat.split([c.numel() for c in cells])
        pairs = zip(pieces, cells, dtypes, strict=True)
        return [dequantize(p, grid=grid, dtype=d).view(c.shape) for p, c, d in pairs]
    t = cells_per_scale(scale, grid)
    bases = _integer_cells(cells)
    outs = [torch.empty(c.shape, dtype=d) for c, d in zip(cells, dtypes, strict=True)]
    segments = [(b, o.view(-1).numpy()) for b, o in zip(bases, outs, strict=True)]
    _draw_into(segments, law=law, t=t, generator=generator, finish="dequantize", grid=grid)
    return outs


def _integer_cells(cells: Sequence[torch.Tensor]) -> list[np.ndarray]:
    """Each of ``cells`` as a flat int64 CPU array (a view where it already is one).

    Raises:
        ValueError: on a float, complex or bool tensor.
    """
    for c in cells:
        if c.is_floating_point() or c.is_complex() or c.dtype == torch.bool:
            raise ValueError(f"cells of dtype {c.dtype} are invalid: expected integer cells")
    return [c.reshape(-1).to(device="cpu", dtype=torch.int64).numpy() for c in cells]


#: One stretch of the draw: its base cells (None for plain K) and where its values go.
_Segment = tuple[np.ndarray | None, np.ndarray]


def _draw_into(
    segments: Sequence[_Segment],
    *,
    law: CellLaw,
    t: float,
    generator: NoiseGenerator,
    finish: str,
    grid: Grid | None = None,
) -> None:
    """K at ``t`` cells per scale for every coordinate of ``segments``, one draw across all
    of them in order, finished into each segment's output (`kernels.FINISHES`: ``"store"``
    writes K, ``"sum"`` base + K, ``"dequantize"`` γ·clamp(base + K) on ``grid``, compiled
    first pass only).

    The words, the decisions and so K are the same whatever the finish: the first pass
    turns each word into K where its cell is certain (0 and a note where it is not), and the
    second pass decides the draws noted, all at once after the first pass, from more words.
    """
    count = sum(len(out) for _, out in segments)
    secure = isinstance(generator, SecureGenerator)
    # A seeded generator draws every word up front (its stream, hence a seeded run, is as
    # before); a secure one fills this thread's chunk buffer, so the words never leave the
    # cache.
    words = None if secure else uniform_words(count, generator=generator)
    # One pass per chunk through buffers reused across chunks (they stay in cache). V is the
    # word's 63 low bits over 2^63 (its sign bit is K's sign); |float(w)| is within one unit.
    # The first pass trusts a cell when x lies farther than m from both of its boundaries
    # (docs/mechanisms.md, "Exact sampling"): m = t·2⁻³⁹ + 2⁻⁴⁰ for the float error of the
    # inverse, plus t·2⁻⁴⁸/V for V's unseen bits and roundings over the law's density. That
    # last term is at most t·2⁻⁴⁸⁺ᵏ for V ≥ 2⁻ᵏ, so the first pass uses that constant and
    # leaves every draw with V < 2⁻ᵏ in doubt: it flags a superset of the draws the per-draw
    # margin would, and the later passes decide those exactly. This saves a reciprocal and a
    # fused add per coordinate. k only decides how many draws the later passes see, about
    # 2⁻ᵏ + t·2⁻⁴⁷⁺ᵏ of them: the k nearest (47 − log₂ t)/2 minimises that.
    low, high = _SMALL_V_BITS
    k = min(high, max(low, round((47 - math.log2(max(t, 1.0))) / 2)))
    threshold = 0.5 - t * _FIRST_MARGIN - 2.0**-40 - t * 2.0 ** (k - 48)
    kernel = first_pass_kernel(law.name, fused=_FUSED) if _USE_KERNELS else None
    if kernel is None and finish == "dequantize":
        raise ValueError("the dequantize finish needs the compiled first pass")
    gamma, limit = (grid.gamma, grid.limit) if grid is not None else (1.0, 0)
    v, j, signs, small, fine, keystream = _scratch()
    buffer = keystream if secure else None
    # the draws in doubt, in the order drawn: segment, position in it, word
    noted: list[tuple[int, np.ndarray, np.ndarray]] = []
    segment, first = 0, 0  # the segment holding the next coordinate, and its first index
    for start in range(0, count, _CHUNK):
        stop = min(count, start + _CHUNK)
        n = stop - start
        w = (
            generator.words_into(buffer, n)  # type: ignore[union-attr]
            if buffer is not None
            else words[start:stop]  # type: ignore[index]
        )
        chunk = w.numpy()
        at = start
        while at < stop:  # each segment overlapping the chunk
            while first + len(segments[segment][1]) <= at:
                first += len(segments[segment][1])
                segment += 1
            base, out = segments[segment]
            end = min(stop, first + len(out))
            lo, hi = at - first, end - first
            part = chunk[at - start : end - start]
            held = None if base is None else base[lo:hi]
            if kernel is not None:  # the same pass, compiled (`alm_opacus.mechanisms.kernels`)
                doubt = kernel(
                    part, t, 1 << (63 - k), threshold, out[lo:hi], held, finish, gamma, limit
                )
            else:
                m = end - at
                doubt = eager_first_pass(
                    law,
                    t,
                    k,
                    threshold,
                    torch.from_numpy(part),
                    torch.from_numpy(out[lo:hi]),
                    None if held is None else torch.from_numpy(held),
                    (v[:m], j[:m], signs[:m], small[:m], fine[:m]),
                )
            if len(doubt):
                noted.append((segment, doubt + lo, part[doubt]))  # copies: buffers are reused
            at = end
    if not noted:
        return
    drawn = np.concatenate([w for _, _, w in noted])
    magnitude = second_pass(
        law, t, torch.from_numpy(drawn), generator, margin=_SECOND_MARGIN
    ).numpy()
    signed = np.where(drawn < 0, -magnitude, magnitude)
    done = 0
    for segment, index, w in noted:
        base, out = segments[segment]
        value = signed[done : done + len(w)]
        done += len(w)
        if base is None:
            out[index] = value
        elif finish == "sum":
            out[index] = base[index] + value
        else:
            finished = np.empty(len(index), out.dtype)
            apply = finish_kernel(finish)
            assert apply is not None  # the dequantize finish runs compiled only
            apply(value, base[index], finished, gamma, limit)
            out[index] = finished


#: Per-thread chunk buffers, kept between calls: allocating them afresh cost 6-7% of a 1M
#: draw in page faults whenever the allocator had returned the memory to the OS.
_SCRATCH = threading.local()
_Scratch = tuple[torch.Tensor, torch.Tensor, torch.Tensor, np.ndarray, np.ndarray, torch.Tensor]


def _scratch() -> _Scratch:
    """This thread's buffers: v and j (float64), the sign bits, two masks, the keystream."""
    got: _Scratch | None = getattr(_SCRATCH, "buffers", None)
    if got is None:
        f64, i64 = torch.float64, torch.int64
        got = (
            torch.empty(_CHUNK, dtype=f64),
            torch.empty(_CHUNK, dtype=f64),
            torch.empty(_CHUNK, dtype=i64),
            np.empty(_CHUNK, dtype=np.bool_),
            np.empty(_CHUNK, dtype=np.bool_),
            torch.empty(_CHUNK + 2, dtype=i64),
        )
        _SCRATCH.buffers = got
    return got


def exact_release(
    value: torch.Tensor,
    *,
    mechanism: object,
    scale: float,
    grid: Grid,
    generator: NoiseGenerator,
) -> torch.Tensor:
    """γ·(round(clamp_B(value)/γ) + K) in ``value``'s dtype and device, K exact cell noise.

    A float16 or bfloat16 ``value`` is released in float32, then rounded to its dtype and
    clamped to its largest finite float (post-processing; see `release_dtype`).
    """
    cells = quantize(value, grid=grid)
    noise = discrete_noise(
        tuple(value.shape), mechanism=mechanism, scale=scale, grid=grid, generator=generator
    )
    if not is_narrow(value.dtype):
        return dequantize(cells + noise, grid=grid, dtype=value.dtype).to(value.device)
    top = torch.finfo(value.dtype).max
    wide = dequantize(cells + noise, grid=grid, dtype=torch.float32).clamp_(-top, top)
    return wide.to(device=value.device, dtype=value.dtype)


@dataclass(frozen=True)
class ReleasePlan:
    """How one exact release is made.

    Attributes:
        grid: the grid (γ, B, output range).
        sensitivity: Δ' = Δ + w(d)·γ, the sensitivity the scale is calibrated to.
        scale: the continuous noise scale for (ε, δ) at Δ'.
    """

    grid: Grid
    sensitivity: float
    scale: float


def plan_release(
    *,
    mechanism: object,
    epsilon: float,
    delta: float,
    sensitivity: float,
    dim: int,
    dtype: torch.dtype = torch.float64,
    inflation: float = INFLATION,
) -> ReleasePlan:
    """The grid and scale of an exact (ε, δ) release of ``dim`` coordinates in ``dtype``.

    γ is the coarsest grid with inflation ≤ ``inflation``; if 40 noise scales would then
    exceed the dtype's free integer range (float32 at very small ε), γ is doubled until they
    do not, until the sensitivity has doubled, or until a coarser γ would put outputs beyond
    the dtype's largest finite float (float16), and the larger inflation is what the plan
    (and statement) records. Outputs beyond the range are clamped (post-processing).

    Raises:
        ValueError: on bad budgets or a grid outside the dtype's range.
    """
    calibrate = mechanism.calibrate  # type: ignore[attr-defined]
    norm = mechanism.norm  # type: ignore[attr-defined]
    grid = grid_for(sensitivity=sensitivity, norm=norm, dim=dim, dtype=dtype, inflation=inflation)
    while True:
        widened = inflated_sensitivity(sensitivity=sensitivity, norm=norm, dim=dim, grid=grid)
        scale = float(calibrate(epsilon=epsilon, delta=delta, sensitivity=widened))
        fits = scale / grid.gamma * 40 <= grid.limit - grid.bound
        # γ·limit must stay finite in dtype: a wider grid would ship ±inf
        widest = grid.exponent >= max_exponent(dtype)
        if fits or widened >= 2 * sensitivity or widest:
            return ReleasePlan(grid=grid, sensitivity=widened, scale=scale)
        grid = Grid(exponent=grid.exponent + 1, limit=grid.limit, bound=grid.bound)


def is_narrow(dtype: torch.dtype) -> bool:
    """Whether ``dtype`` has fewer significand bits than float32 (float16, bfloat16)."""
    return torch.finfo(dtype).eps > torch.finfo(torch.float32).eps


def release_dtype(dtypes: Sequence[torch.dtype]) -> torch.dtype:
    """The dtype whose exact integer range a release of tensors in ``dtypes`` is planned
    for: the narrowest of them, but never narrower than float32.

    float16 and bfloat16 hold only 2¹¹ and 2⁸ exact grid steps, far too few for the noise:
    planned in their own range, nearly every output was clamped to ±2ᵖ·γ (±0.25 for a
    bfloat16 head). Tensors in them are released in float32 and rounded to their dtype,
    which is post-processing.
    """
    narrowest = max(dtypes, key=lambda d: torch.finfo(d).eps)
    return torch.float32 if is_narrow(narrowest) else narrowest
