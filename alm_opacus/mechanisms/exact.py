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
(integer per-example clipping), `discrete_noise` and `dequantize`; every sum is exact in
int64, so summing across processes is exact too.
"""

from __future__ import annotations

import abc
import contextlib
import math
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import ClassVar

import mpmath
import numpy as np
import torch
from numpy.typing import NDArray
from scipy import special

from alm_opacus._validation import check_positive, check_sensitivity
from alm_opacus.mechanisms.sampling import NoiseGenerator, Shape, uniform_words

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
    "grid_for",
    "inflated_sensitivity",
    "plan_release",
    "quantize",
    "scaled_cells",
    "step_grid",
]

#: Largest relative inflation of the sensitivity that grid rounding may cost (2⁻⁷ ≈ 0.78%).
INFLATION = 2.0**-7
#: Coordinates processed at once by the fast path (its buffers stay in cache).
_CHUNK = 1 << 16
_LOW63 = (1 << 63) - 1
#: Bound on the relative error of the float64 inverse tails, and an absolute floor in units
#: of the scale (docs/mechanisms.md: measured ≤ 2⁻⁵⁰ against mpmath, tested ≤ 2⁻⁴⁸; 2× that).
_REL_ERROR = 2.0**-47
_ABS_ERROR = 2.0**-48
#: The first pass's margin per unit of t (docs/mechanisms.md, "Exact sampling"); the second
#: pass's bound on V's relative uncertainty. Tests widen them to send draws down the slower,
#: exact paths.
_FIRST_MARGIN = 2.0**-39
_SECOND_MARGIN = 2.0**-50
#: Above this many cells per scale unit a noise draw could overflow int64 arithmetic.
_MAX_CELLS = 2.0**52


# --------------------------------------------------------------------------------------------
# The grid.
# --------------------------------------------------------------------------------------------


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
    info = torch.finfo(dtype)
    if math.ldexp(1.0, exponent) < info.tiny or math.ldexp(1.0, exponent + bits) > info.max:
        raise ValueError(
            f"sensitivity={sensitivity!r} over dim={dim} needs a grid step 2^{exponent}, "
            f"outside what {dtype} represents exactly"
        )
    return Grid(exponent=exponent, limit=1 << bits, bound=1 << (bits - 1))


def step_grid(*, max_grad_norm: float, norm: str, dim: int, inflation: float = INFLATION) -> Grid:
    """The grid of a DP-SGD step: each example's clipped gradient is rounded once, so the
    sum moves by at most C + w(d)·γ/2 when one example is added or removed (int64 range)."""
    grid = grid_for(sensitivity=max_grad_norm, norm=norm, dim=dim, inflation=inflation,
                    rounding=0.5)  # fmt: skip
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


# --------------------------------------------------------------------------------------------
# Cell-integrated laws.
# --------------------------------------------------------------------------------------------


class CellLaw(abc.ABC):
    """A symmetric continuous law Z of unit scale, rounded to the integers after scaling.

    At scale t (in cells), P(K = k) = P(|k| − ½ < |tZ| < |k| + ½)/(1 + [k ≠ 0]). Subclasses
    give the folded tail S(u) = P(|Z| > u): in float64 (and its inverse) for the fast path,
    rigorously as an mpmath interval for exact decisions, and its log for PMFs.
    """

    name: ClassVar[str]

    @abc.abstractmethod
    def inverse_tail_(self, v: torch.Tensor) -> torch.Tensor:
        """u ≥ 0 with S(u) = v for float64 v in (0, 1], computed in place (returns ``v``)."""

    def first_pass_(self, v: torch.Tensor, scale: float) -> torch.Tensor:
        """``scale`` times `inverse_tail_`, in place, as the first pass computes it (a faster
        form may err by up to 2⁻⁵²/V in absolute terms, which the first pass's margin
        covers)."""
        return self.inverse_tail_(v).mul_(scale)

    @abc.abstractmethod
    def log_tail(self, u: NDArray[np.float64]) -> NDArray[np.float64]:
        """ln S(u), float64, accurate in the far tail."""

    @abc.abstractmethod
    def tail_interval(self, u: mpmath.iv.mpf) -> mpmath.iv.mpf:
        """A rigorous enclosure of S(u) for an interval u ≥ 0 (at ``mpmath.iv``'s precision)."""


class LogisticCells(CellLaw):
    """Logistic: S(u) = 2/(1 + eᵘ), so u = ln((2 − v)/v)."""

    name = "alm"

    def inverse_tail_(self, v: torch.Tensor) -> torch.Tensor:
        return v.reciprocal_().mul_(2.0).sub_(1.0).log_()

    def log_tail(self, u: NDArray[np.float64]) -> NDArray[np.float64]:
        return np.asarray(math.log(2.0) - np.logaddexp(0.0, u), dtype=np.float64)

    def tail_interval(self, u: mpmath.iv.mpf) -> mpmath.iv.mpf:
        return 2 / (1 + mpmath.iv.exp(u))


class LaplaceCells(CellLaw):
    """Laplace: S(u) = e⁻ᵘ, so u = −ln v."""

    name = "laplace"

    def inverse_tail_(self, v: torch.Tensor) -> torch.Tensor:
        return v.log_().neg_()

    def first_pass_(self, v: torch.Tensor, scale: float) -> torch.Tensor:
        return v.log_().mul_(-scale)

    def log_tail(self, u: NDArray[np.float64]) -> NDArray[np.float64]:
        return np.asarray(-u, dtype=np.float64)

    def tail_interval(self, u: mpmath.iv.mpf) -> mpmath.iv.mpf:
        return mpmath.iv.exp(-u)


class GaussianCells(CellLaw):
    """Standard normal: S(u) = erfc(u/√2) = 2Φ(−u), so u = −Φ⁻¹(v/2)."""

    name = "gaussian"

    def inverse_tail_(self, v: torch.Tensor) -> torch.Tensor:
        return torch.special.ndtri(v.mul_(0.5), out=v).neg_()

    def first_pass_(self, v: torch.Tensor, scale: float) -> torch.Tensor:
        # √2·erfinv(1 − V): twice as fast as ndtri; 1 − V rounds by ≤ 2⁻⁵⁴, which moves u by
        # at most 2⁻⁵⁴ over the density (≥ V·√(2/π)): under 2⁻⁵²/V
        return torch.erfinv(v.neg_().add_(1.0), out=v).mul_(math.sqrt(2.0) * scale)

    def log_tail(self, u: NDArray[np.float64]) -> NDArray[np.float64]:
        return np.asarray(math.log(2.0) + special.log_ndtr(-u), dtype=np.float64)

    def tail_interval(self, u: mpmath.iv.mpf) -> mpmath.iv.mpf:
        return _erfc_interval(u / mpmath.iv.sqrt(2))


_IV_LOCK = threading.RLock()


@contextlib.contextmanager
def _iv_precision(bits: int) -> Iterator[None]:
    """Set ``mpmath.iv``'s working precision (global state: serialised by a lock)."""
    with _IV_LOCK:
        old = mpmath.iv.prec
        mpmath.iv.prec = bits
        try:
            yield
        finally:
            mpmath.iv.prec = old


def _erfc_interval(x: mpmath.iv.mpf) -> mpmath.iv.mpf:
    """Rigorous erfc(x) for an interval x ≥ 0: the alternating Maclaurin series of erf with
    its remainder bounded by the first omitted term (terms decrease once n + 1 > x²), in
    interval arithmetic at a precision that absorbs the cancellation in 1 − erf."""
    iv = mpmath.iv
    x_hi = float(x.b)
    base = iv.prec
    extra = int(3.0 * x_hi * x_hi) + 32  # the largest term is ~e^{x²}; erfc is ~e^{-x²}
    with _iv_precision(base + extra):
        x2 = x * x
        power = iv.mpf(x)  # x^{2n+1}/n!
        total = iv.mpf(0)
        n = 0
        tiny = iv.mpf(2) ** (-(base + extra))
        while True:
            term = power / (2 * n + 1)
            if n + 1 > x_hi * x_hi and term.b < tiny.a:
                total += iv.mpf([-term.b, term.b])  # alternating remainder
                break
            total = total - term if n % 2 else total + term
            n += 1
            power = power * x2 / n
        out = 1 - 2 / iv.sqrt(iv.pi) * total
    return out


#: Cell laws by canonical mechanism name (``gaussian-classic`` draws the Gaussian's).
CELL_LAWS: dict[str, CellLaw] = {
    "alm": LogisticCells(),
    "laplace": LaplaceCells(),
    "gaussian": GaussianCells(),
    "gaussian-classic": GaussianCells(),
}


def cell_law(mechanism: object) -> CellLaw:
    """The cell law of a mechanism (an instance or a registry name).

    Raises:
        ValueError: for a mechanism without an exact cell law.
    """
    from alm_opacus.mechanisms.base import create_mechanism

    name = getattr(mechanism, "name", None) if not isinstance(mechanism, str) else None
    if name is None:
        name = create_mechanism(str(mechanism)).name
    try:
        return CELL_LAWS[name]
    except KeyError:
        raise ValueError(
            f"mechanism {name!r} has no exact cell law: expected one of {sorted(CELL_LAWS)}"
        ) from None


# --------------------------------------------------------------------------------------------
# Exact sampling.
# --------------------------------------------------------------------------------------------


def _cells_per_scale(scale: float, grid: Grid) -> float:
    t = check_positive(scale, name="scale") / grid.gamma  # exact: γ is a power of two
    if t > _MAX_CELLS:
        raise ValueError(
            f"scale={scale!r} is 2^{math.log2(t):.1f} grid steps of 2^{grid.exponent}: "
            "beyond the int64 range of an exact draw; use a coarser grid"
        )
    return t


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
    t = _cells_per_scale(scale, grid)
    dims = (shape,) if isinstance(shape, int) else tuple(shape)
    if any(isinstance(n, bool) or not isinstance(n, int) or n < 0 for n in dims):
        raise ValueError(f"shape={shape!r} is invalid: expected non-negative integers")
    count = math.prod(dims)
    words = uniform_words(count, generator=generator)
    out = torch.empty(count, dtype=torch.int64)
    pending: list[torch.Tensor] = []
    # One pass per chunk through buffers reused across chunks (they stay in cache). V is the
    # word's 63 low bits over 2^63 (its sign bit is K's sign); |float(w)| is within one unit.
    # The first pass trusts a cell when x lies farther than this margin from both of its
    # boundaries (docs/mechanisms.md, "Exact sampling"): t·2⁻³⁹ for the float error of the
    # inverse, and t·2⁻⁴⁸/V for V's unseen bits and roundings over the law's density.
    threshold = 0.5 - t * _FIRST_MARGIN - 2.0**-40
    size = min(count, _CHUNK)
    signed, v, j, margin = (torch.empty(size, dtype=torch.float64) for _ in range(4))
    for start in range(0, count, _CHUNK):
        stop = min(count, start + _CHUNK)
        n = stop - start
        sw, vv, jj, mm = signed[:n], v[:n], j[:n], margin[:n]
        sw.copy_(words[start:stop])
        torch.abs(sw, out=vv).mul_(2.0**-63)
        torch.reciprocal(vv, out=mm)
        law.first_pass_(vv, t)
        torch.round(vv, out=jj)
        frac = vv.sub_(jj).abs_().add_(mm, alpha=t * 2.0**-48)  # in doubt at 1/2 − t·2⁻³⁹
        out[start:stop] = jj.copysign_(sw)
        # NaN (an infinite inverse at V ≈ 0) is in doubt too: test "not below", never "above"
        if not float(frac.max()) < threshold:
            pending.append(torch.nonzero(~(frac < threshold)).flatten() + start)
    if pending:
        index = torch.cat(pending)
        magnitude = _second_pass(law, t, words[index], generator)
        out[index] = torch.where(words[index] < 0, -magnitude, magnitude)
    return out.reshape(dims)


def _second_pass(
    law: CellLaw, t: float, words: torch.Tensor, generator: NoiseGenerator
) -> torch.Tensor:
    """|K| for the draws the first pass left in doubt: 64 more bits of V each, a float
    inversion with a per-draw bound, and interval arithmetic for what is still in doubt."""
    more = uniform_words(len(words), generator=generator)
    high = words ^ (words >> 63)  # the 63 magnitude bits: |w| − [w < 0]
    low = more.to(torch.float64) + torch.where(more < 0, 2.0**64, 0.0)  # unsigned, rounded
    v = (high.to(torch.float64) + low.mul_(2.0**-64)).mul_(2.0**-63)
    x = law.inverse_tail_(v.clone()).mul_(t)
    j = torch.round(x)
    # V is known to relative 2^-51 (two roundings and the unseen bits) and the law's density
    # is at least V/2 in V-space, so x moves by at most t·2^-50; plus the float error.
    margin = x * _REL_ERROR + t * (_SECOND_MARGIN + _ABS_ERROR) + 2.0**-40
    doubt = ~((x - j).abs() < 0.5 - margin) | (v < 2.0**-60)
    magnitude = j.to(torch.int64)
    for i in torch.nonzero(doubt).flatten().tolist():
        value = (int(high[i]) << 64) | (int(more[i]) & ((1 << 64) - 1))
        guess = float(j[i])  # infinite only if all 127 bits were 0 (probability 2^-127)
        start = int(guess) if math.isfinite(guess) and guess >= 0 else 0
        magnitude[i] = _decide(law, t, value, 127, start, generator)
    return magnitude


def _decide(
    law: CellLaw, t: float, value: int, bits: int, guess: int, generator: NoiseGenerator
) -> int:
    """The exact cell j ≥ 0 with S((j + ½)/t) < V ≤ S((j − ½)/t), V ∈ [value, value + 1)/2^bits.

    Interval arithmetic encloses each tail; while V's interval straddles an enclosure, 64 more
    bits of V are drawn and the precision raised. V equals a boundary with probability 0, so
    this ends with probability 1 (after one refinement in all but ~2⁻⁶⁰ of the calls).
    """
    j = guess
    scale = Fraction(t)
    prec = bits + 40
    while True:
        with _iv_precision(prec):
            v_lo, v_hi = Fraction(value, 1 << bits), Fraction(value + 1, 1 << bits)
            upper = _interval_tail(law, Fraction(2 * j - 1, 2) / scale) if j > 0 else None
            lower = _interval_tail(law, Fraction(2 * j + 1, 2) / scale)
            above = upper is None or v_hi <= upper[0]  # V < S((j - ½)/t)
            below = v_lo >= lower[1]  # V > S((j + ½)/t)
            if above and below:
                return j
            if v_hi <= lower[0]:
                j += 1
                continue
            if upper is not None and v_lo >= upper[1]:
                j -= 1
                continue
        word = int(uniform_words(1, generator=generator)[0]) & ((1 << 64) - 1)
        value, bits, prec = (value << 64) | word, bits + 64, prec + 64


def _interval_tail(law: CellLaw, u: Fraction) -> tuple[Fraction, Fraction]:
    """[lo, hi] ∋ S(u) as exact fractions, from the law's interval enclosure."""
    iv = mpmath.iv
    point = iv.mpf(u.numerator) / iv.mpf(u.denominator)
    lo, hi = law.tail_interval(point)._mpi_  # raw endpoints, no rounding
    return _fraction(lo), _fraction(hi)


def _fraction(raw: tuple[int, int, int, int]) -> Fraction:
    """The exact value of a raw mpmath float (sign, mantissa, exponent, bit count)."""
    sign, man, exp, _ = raw
    if man == 0 and exp != 0:
        raise ArithmeticError("interval enclosure is not finite")
    value = Fraction(int(man)) * (Fraction(2) ** int(exp))
    return -value if sign else value


# --------------------------------------------------------------------------------------------
# Releases: quantize, add exact noise, dequantize.
# --------------------------------------------------------------------------------------------


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


def dequantize(cells: torch.Tensor, *, grid: Grid, dtype: torch.dtype) -> torch.Tensor:
    """γ·clamp(cells, ±limit) in ``dtype``: exact whenever ``grid`` was made for that dtype
    (or a wider one); clamping is post-processing."""
    clamped = cells.clamp(-grid.limit, grid.limit).to(torch.float64)
    return clamped.mul_(grid.gamma).to(dtype)


def exact_release(
    value: torch.Tensor,
    *,
    mechanism: object,
    scale: float,
    grid: Grid,
    generator: NoiseGenerator,
) -> torch.Tensor:
    """γ·(round(clamp_B(value)/γ) + K) in ``value``'s dtype and device, K exact cell noise."""
    cells = quantize(value, grid=grid)
    noise = discrete_noise(tuple(value.shape), mechanism=mechanism, scale=scale, grid=grid,
                           generator=generator)  # fmt: skip
    return dequantize(cells + noise, grid=grid, dtype=value.dtype).to(value.device)


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
    do not, or until the sensitivity has doubled, and the larger inflation is what the plan
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
        if fits or widened >= 2 * sensitivity:
            return ReleasePlan(grid=grid, sensitivity=widened, scale=scale)
        grid = Grid(exponent=grid.exponent + 1, limit=grid.limit, bound=grid.bound)


# --------------------------------------------------------------------------------------------
# DP-SGD: integer clipping.
# --------------------------------------------------------------------------------------------


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


# --------------------------------------------------------------------------------------------
# Profiles of the cell laws (scalar, exact by summation) and their PLDs.
# --------------------------------------------------------------------------------------------


def cell_log_pmf(mechanism: object, *, scale: float, grid: Grid, k: NDArray[np.int64]) -> NDArray:
    """ln P(K = k) of the cell law at ``scale`` on ``grid`` (float64, accurate in the tails)."""
    law = cell_law(mechanism)
    t = _cells_per_scale(scale, grid)
    a = np.abs(np.asarray(k, dtype=np.float64))
    inner = law.log_tail(np.maximum(a - 0.5, 0.0) / t)
    outer = law.log_tail((a + 0.5) / t)
    with np.errstate(divide="ignore"):
        log_mass = inner + np.log(-np.expm1(outer - inner))
    return np.where(a == 0, np.log(-np.expm1(law.log_tail(np.full_like(a, 0.5 / t)))),
                    log_mass - math.log(2.0))  # fmt: skip


def _support(t: float, shift: int, tail: float) -> NDArray[np.int64]:
    width = math.ceil(tail * t) + abs(shift) + 2
    return np.arange(-width, width + 1, dtype=np.int64)


def cell_delta(
    mechanism: object, *, epsilon: float, scale: float, grid: Grid, shift: int, tail: float = 60.0
) -> float:
    """δ(ε) of the scalar pair (K, K + shift) by direct summation of max(0, p − e^ε q).

    The support is ±(tail·t + shift) cells; the mass beyond (below e^{-tail/…}) is added to
    the result, which therefore upper-bounds the exact sum.
    """
    t = _cells_per_scale(scale, grid)
    k = _support(t, shift, tail)
    log_p = cell_log_pmf(mechanism, scale=scale, grid=grid, k=k)
    log_q = cell_log_pmf(mechanism, scale=scale, grid=grid, k=k - shift)
    p, q = np.exp(log_p), np.exp(log_q)
    missing = max(0.0, 1.0 - float(p.sum()))
    return float(np.maximum(p - math.exp(epsilon) * q, 0.0).sum()) + missing


def cell_pld(
    mechanism: object,
    *,
    scale: float,
    grid: Grid,
    shift: int,
    value_discretization_interval: float = 1e-4,
    tail: float = 60.0,
) -> object:
    """dp_accounting's PLD of the scalar pair (K, K + shift), built from the two PMFs."""
    from dp_accounting.pld import privacy_loss_distribution as pld

    t = _cells_per_scale(scale, grid)
    k = _support(t, shift, tail)
    log_p = cell_log_pmf(mechanism, scale=scale, grid=grid, k=k)
    log_q = cell_log_pmf(mechanism, scale=scale, grid=grid, k=k - shift)
    upper = {int(i): float(v) for i, v in zip(k, log_p, strict=True) if np.isfinite(v)}
    lower = {int(i): float(v) for i, v in zip(k, log_q, strict=True) if np.isfinite(v)}
    return pld.from_two_probability_mass_functions(
        lower, upper, pessimistic_estimate=True,
        value_discretization_interval=value_discretization_interval,
    )  # fmt: skip
