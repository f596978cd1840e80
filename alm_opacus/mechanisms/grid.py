"""The power-of-two grid of exact releases and DP-SGD steps, and (de)quantisation.

γ = 2^exponent is chosen so that rounding d coordinates inflates the sensitivity by at most
`INFLATION` (`alm_opacus.mechanisms.exact` explains why the release is then exact).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from alm_opacus._validation import check_positive, check_sensitivity
from alm_opacus.mechanisms.kernels import dequantize_kernel

__all__ = [
    "INFLATION",
    "Grid",
    "cell_radius",
    "cells_per_scale",
    "dequantize",
    "grid_for",
    "inflated_sensitivity",
    "max_exponent",
    "min_exponent",
    "quantize",
    "smallest_epsilon",
    "step_grid",
]

#: Largest relative inflation of the sensitivity that grid rounding may cost (2⁻⁷ ≈ 0.78%).
INFLATION = 2.0**-7
#: Above this many cells per scale unit a noise draw could overflow int64 arithmetic.
_MAX_CELLS = 2.0**52


@dataclass(frozen=True)
class Grid:
    """A power-of-two grid γ = 2^exponent and the integer ranges of a release.

    Attributes:
        exponent: γ = 2**exponent.
        limit: outputs n + K are clamped to [-limit, limit] cells; γ·m is exact in the release
            dtype for every such m (limit = 2ᵖ, p the dtype's significand bits).
        bound: clean values are clamped to [-bound, bound] cells before rounding (B = bound·γ).
    """

    exponent: int
    limit: int
    bound: int

    @property
    def gamma(self) -> float:
        """The grid step γ."""
        return math.ldexp(1.0, self.exponent)

    @property
    def clamp(self) -> float:
        """B: the largest |clean value| represented (larger ones are clamped)."""
        return math.ldexp(float(self.bound), self.exponent)


def _significand_bits(dtype: torch.dtype) -> int:
    if not dtype.is_floating_point:
        raise ValueError(f"dtype={dtype} is invalid: expected a floating-point dtype")
    return round(-math.log2(torch.finfo(dtype).eps)) + 1


def _weight(norm: str, dim: int) -> float:
    """How many grid steps the rounding of d coordinates adds to the sensitivity."""
    if isinstance(dim, bool) or not isinstance(dim, int) or dim < 1:
        raise ValueError(f"dim={dim!r} is invalid: expected an integer ≥ 1")
    if norm == "l1":
        return float(dim)
    if norm == "l2":
        return math.sqrt(dim)
    raise ValueError(f"norm={norm!r} is invalid: expected 'l1' or 'l2'")


def grid_for(
    *,
    sensitivity: float,
    norm: str,
    dim: int,
    dtype: torch.dtype = torch.float64,
    inflation: float = INFLATION,
    rounding: float = 1.0,
) -> Grid:
    """The coarsest power-of-two grid whose rounding inflates ``sensitivity`` by ≤ ``inflation``.

    Args:
        sensitivity: Δ in ``norm``, > 0.
        norm: ``"l1"`` or ``"l2"``.
        dim: number of rounded coordinates d.
        dtype: the release dtype (sets the integer range).
        inflation: largest relative inflation, in (0, 1).
        rounding: grid steps each coordinate's rounding adds: 1 for a release (both
            neighbours are rounded), ½ for a DP-SGD step (one example's rounding).

    Returns:
        The grid: ``rounding · w(d) · γ ≤ inflation · Δ`` with w(d) = d (L1) or √d (L2).

    Raises:
        ValueError: on bad input, or a grid too fine for ``dtype``'s exponent range.
    """
    delta = check_sensitivity(sensitivity)
    if not 0.0 < inflation < 1.0:
        raise ValueError(f"inflation={inflation!r} is invalid: expected a number in (0, 1)")
    weight = rounding * _weight(norm, dim)
    target = inflation * delta / weight
    exponent = math.frexp(target)[1] - 1  # 2**exponent <= target < 2**(exponent + 1)
    while weight * math.ldexp(1.0, exponent) > inflation * delta:  # float safety
        exponent -= 1
    bits = _significand_bits(dtype)
    if not min_exponent(dtype) <= exponent <= max_exponent(dtype):
        raise ValueError(
            f"sensitivity={sensitivity!r} over dim={dim} needs a grid step 2^{exponent}, "
            f"outside what {dtype} represents exactly: expected a step in "
            f"[2^{min_exponent(dtype)}, 2^{max_exponent(dtype)}]"
        )
    return Grid(exponent=exponent, limit=1 << bits, bound=1 << (bits - 1))


def min_exponent(dtype: torch.dtype) -> int:
    """The smallest e with 2^e a normal float of ``dtype`` (finer grids lose precision)."""
    _significand_bits(dtype)
    return math.frexp(torch.finfo(dtype).tiny)[1] - 1


def max_exponent(dtype: torch.dtype) -> int:
    """The largest e whose grid 2^e keeps every output γ·m, |m| ≤ 2ᵖ, finite in ``dtype``.

    Compared as exponents (never as floats, which overflow near float64's range).
    """
    bits = _significand_bits(dtype)
    return math.frexp(torch.finfo(dtype).max)[1] - 1 - bits


def step_grid(*, max_grad_norm: float, norm: str, dim: int, inflation: float = INFLATION) -> Grid:
    """The grid of a DP-SGD step: each example's clipped gradient is rounded once, so the
    sum moves by at most C + w(d)·γ/2 when one example is added or removed (int64 range)."""
    grid = grid_for(
        sensitivity=max_grad_norm, norm=norm, dim=dim, inflation=inflation, rounding=0.5
    )
    return Grid(exponent=grid.exponent, limit=1 << 53, bound=1 << 52)


def inflated_sensitivity(
    *, sensitivity: float, norm: str, dim: int, grid: Grid, rounding: float = 1.0
) -> float:
    """Δ' = Δ + rounding · w(d) · γ, the sensitivity of the rounded query (rounded up)."""
    value = check_sensitivity(sensitivity) + rounding * _weight(norm, dim) * grid.gamma
    return math.nextafter(value, math.inf)


def cell_radius(*, max_grad_norm: float, norm: str, dim: int, grid: Grid) -> float:
    """R = C/γ + w(d)/2: the norm, in cells, of a clipped example's rounded gradient."""
    return check_positive(max_grad_norm, name="max_grad_norm") / grid.gamma + 0.5 * _weight(
        norm, dim
    )


def cells_per_scale(scale: float, grid: Grid) -> float:
    t = check_positive(scale, name="scale") / grid.gamma  # exact: γ is a power of two
    if t > _MAX_CELLS:
        raise ValueError(
            f"scale={scale!r} is 2^{math.log2(t):.1f} grid steps of 2^{grid.exponent}: "
            "beyond the int64 range of an exact draw; use a coarser grid"
        )
    return t


def smallest_epsilon(*, dim: int, delta: float = 0.0) -> float:
    """The smallest ε at which an exact release of ``dim`` coordinates can draw its noise.

    The draw counts noise in grid steps, at most 2⁵² per scale unit (int64 arithmetic). At
    small ε the release widens its grid (``exact.plan_release``) up to γ ∈ [Δ/w, 2Δ/w), with
    w = d (L1) or √d (L2), so the sensitivity becomes Δ' < 3Δ and a scale of k·Δ'/ε spans
    fewer than 3·k·w/ε steps, whatever Δ. The laws whose scale grows as 1/ε bind: Laplace and
    logistic noise (L1, k = 1) and the classic Gaussian (L2, k = sqrt(2 ln(1.25/δ))); the
    analytic Gaussian and DP-SGD's accountant give a bounded scale as ε → 0.

    Args:
        dim: the number of released coordinates d (a head's parameters), ≥ 1.
        delta: the run's δ (0 for pure DP, where no Gaussian law runs).

    Returns:
        ``3·max(d, sqrt(2 ln(1.25/δ))·√d) / 2⁵²``, rounded up: every ε at or above it can
        be drawn.

    Raises:
        ValueError: for ``dim`` < 1.
    """
    steps = _weight("l1", dim)
    if delta > 0:
        steps = max(steps, math.sqrt(2.0 * math.log(1.25 / delta)) * _weight("l2", dim))
    return math.nextafter(3.0 * steps / _MAX_CELLS, math.inf)


def quantize(value: torch.Tensor, *, grid: Grid) -> torch.Tensor:
    """round(clamp_B(value)/γ) as int64 cells (half to even; exact: γ is a power of two).

    Raises:
        ValueError: if ``value`` holds NaN.
    """
    v = value.detach().to(device="cpu", dtype=torch.float64)
    if bool(torch.isnan(v).any()):
        raise ValueError("value holds NaN: nothing to release")
    return torch.round(v.clamp(-grid.clamp, grid.clamp).mul(math.ldexp(1.0, -grid.exponent))).to(
        torch.int64
    )


#: Release dtypes `dequantize` writes in one compiled pass.
_COMPILED_DTYPES = (torch.float32, torch.float64)


def dequantize(cells: torch.Tensor, *, grid: Grid, dtype: torch.dtype) -> torch.Tensor:
    """γ·clamp(cells, ±limit) in ``dtype``: exact whenever ``grid`` was made for that dtype
    (or a wider one); clamping is post-processing.

    Each value is formed in float64 and rounded once to ``dtype``; int64 cells on the CPU
    going to float32 or float64 take one compiled pass (`kernels.dequantize_kernel`), the
    same arithmetic without the float64 intermediate tensor."""
    kernel = dequantize_kernel() if dtype in _COMPILED_DTYPES else None
    if kernel is not None and cells.dtype == torch.int64 and cells.device.type == "cpu":
        out = torch.empty(cells.shape, dtype=dtype)
        flat = cells.contiguous().reshape(-1)
        kernel(flat.numpy(), grid.gamma, grid.limit, out.reshape(-1).numpy())
        return out
    clamped = cells.clamp(-grid.limit, grid.limit).to(torch.float64)
    return clamped.mul_(grid.gamma).to(dtype)
