"""The exact sampler's slower passes (`alm_opacus.mechanisms.exact`): its first pass in
tensor operations where numba does not import, and the draws a first pass leaves in doubt:
64 more bits of V and a float inversion with a per-draw bound, then interval arithmetic
(mpmath's ``iv``) on exact fractions for the few still in doubt, drawing more bits of V
until the comparison with the cell boundaries is certain (docs/mechanisms.md, "Exact
sampling").
"""

from __future__ import annotations

import math
from fractions import Fraction

import mpmath
import numpy as np
import torch

from alm_opacus.mechanisms.cell_laws import CellLaw, _iv_precision
from alm_opacus.mechanisms.sampling import NoiseGenerator, uniform_words

__all__ = ["eager_first_pass", "second_pass"]

_SIGN_BIT = -(1 << 63)

#: Bound on the relative error of the float64 inverse tails, and an absolute floor in units
#: of the scale (docs/mechanisms.md: measured ≤ 2⁻⁵⁰ against mpmath, tested ≤ 2⁻⁴⁸; 2× that).
_REL_ERROR = 2.0**-47
_ABS_ERROR = 2.0**-48


def second_pass(
    law: CellLaw, t: float, words: torch.Tensor, generator: NoiseGenerator, *, margin: float
) -> torch.Tensor:
    """|K| for the draws the first pass left in doubt: 64 more bits of V each, a float
    inversion with a per-draw bound, and interval arithmetic for what is still in doubt.
    ``margin`` bounds V's relative uncertainty (`exact._SECOND_MARGIN`; tests widen it)."""
    # numpy: a step leaves about one draw in doubt, and on so few numbers torch's per-call
    # cost was most of the pass (the same IEEE operations, so the same values)
    more = uniform_words(len(words), generator=generator).numpy()
    drawn = words.numpy()
    high = drawn ^ (drawn >> 63)  # the 63 magnitude bits: |w| − [w < 0]
    low = more.astype(np.float64) + np.where(more < 0, 2.0**64, 0.0)  # unsigned, rounded
    v = (high.astype(np.float64) + low * 2.0**-64) * 2.0**-63
    x = law.inverse_tail_(torch.from_numpy(v.copy())).numpy() * t
    j = np.round(x)  # half to even, as torch.round
    # V is known to relative 2^-51 (two roundings and the unseen bits) and the law's density
    # is at least V/2 in V-space, so x moves by at most t·2^-50; plus the float error.
    bound = x * _REL_ERROR + t * (margin + _ABS_ERROR) + 2.0**-40
    doubt = ~(np.abs(x - j) < 0.5 - bound) | (v < 2.0**-60)
    magnitude = np.where(doubt, 0.0, j).astype(np.int64)  # NaN and ±inf are in doubt
    for i in np.flatnonzero(doubt).tolist():
        value = (int(high[i]) << 64) | (int(more[i]) & ((1 << 64) - 1))
        guess = float(j[i])  # infinite only if all 127 bits were 0 (probability 2^-127)
        start = int(guess) if math.isfinite(guess) and guess >= 0 else 0
        magnitude[i] = _decide(law, t, value, 127, start, generator)
    return torch.from_numpy(magnitude)


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


def eager_first_pass(
    law: CellLaw,
    t: float,
    k: int,
    threshold: float,
    words: torch.Tensor,
    out: torch.Tensor,
    base: torch.Tensor | None,
    buffers: tuple[torch.Tensor, torch.Tensor, torch.Tensor, np.ndarray, np.ndarray],
) -> np.ndarray:
    """The first pass in tensor operations (where numba is missing): K into ``out`` (base +
    K where ``base`` is given) and the indices of the draws in doubt."""
    vv, jj, sign, sm, ok = buffers
    _unit(words, vv).abs_()
    np.less(vv.numpy(), 2.0**-k, out=sm)  # numpy compares 4x faster
    law.first_pass_(vv, t)
    torch.round(vv, out=jj)
    # NaN (an infinite inverse at V ≈ 0) is in doubt too: test "not below", never "above"
    d = np.subtract(vv.numpy(), jj.numpy(), out=vv.numpy())
    np.less(np.abs(d, out=d), threshold, out=ok)
    # K = ±j with w's sign: j ≥ 0, so OR-ing w's sign bit into j's float64 bits is copysign
    # (−0.0 converts to 0), at a third of copysign's cost
    jj.view(torch.int64).bitwise_or_(torch.bitwise_and(words, _SIGN_BIT, out=sign))
    if base is None:
        out.copy_(jj)
    else:
        torch.add(base, sign.copy_(jj), out=out)  # sign is free again
    return np.flatnonzero(np.logical_or(sm, np.logical_not(ok, out=ok), out=sm))


def _unit(words: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """``words``/2⁶³ into float64 ``out``: numpy converts the int64 words (one rounding, as a
    copy would) and scales them by 2⁻⁶³ (exact) in one pass, faster than torch here."""
    np.multiply(words.numpy(), 2.0**-63, out=out.numpy())
    return out
