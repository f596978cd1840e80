"""Compiled loops (numba) for exact noise and exact clipping: the exact sampler's first pass,
one loop per cell law, and the exact DP-SGD step's norm tiles and cell sums (the last section;
their proofs are in `alm_opacus.mechanisms.cell_clipping`).

The eager first pass (`alm_opacus.mechanisms.exact`) streams each chunk through a dozen
tensor operations; on a 2-core machine each costs about a millisecond per 10⁶ draws in
memory traffic, and the Gaussian's float64 ``erfinv`` is scalar code in torch (~11 ns a
draw). The loops here read each word once and write K or a doubt flag, and the Gaussian's
central branch (85% of draws) is a rational function that vectorises. They run as one
compiled loop over tiles of 512 draws (`_fused`), whose scratch stays in the L1 cache
and which finishes each K as it is made (`FINISHES`): stored, summed into a cell, or summed
and converted to the release's float, so that a DP-SGD step goes from keystream words to its
noisy gradients in one pass.

They compute the same quantities as the eager pass, within the same error bound: V is
``|float(w)|``·2⁻⁶³ (one rounding, as numpy's conversion), x = t·S⁻¹(V), j = rint(x), and the
cell is accepted when V ≥ 2⁻ᵏ and |x − j| < ``threshold``; every other draw is returned in
doubt for the exact later passes. The inverses: logistic ln(2/V − 1) and Laplace −ln V, as in
the eager pass; Gaussian −Φ⁻¹(V/2) by Wichura's algorithm AS 241 (PPND16, Applied Statistics
37(3), 1988: relative error about 10⁻¹⁶), whose error against mpmath is held to the first
pass's bound by `test_float_inverse_tails_are_within_the_claimed_bound`. Floating-point
contraction (FMA) is allowed: it can only change last bits, which the bound covers on any
processor.

numba is a dependency; if it cannot be imported (a Python or numpy it does not support yet),
`first_pass_kernel` returns None and the eager pass runs: the law of K is the same, only the
few draws near the margin that each path leaves in doubt may differ, so a *seeded* stream is
reproducible on one installation, not across the two paths. The exact DP-SGD step then
clips in float64 (`alm_opacus.mechanisms.cell_clipping.enforce_radius`): its cell sums are as exact
and within the same radius, but may differ from the compiled path's by the rounding of each
example's factor, so the same holds for them.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable

import numpy as np

from alm_opacus.mechanisms.base import _load_noise_laws
from alm_opacus.mechanisms.jit import NUMBA as _numba
from alm_opacus.mechanisms.jit import cache_dir
from alm_opacus.mechanisms.jit import jit as _jit
from alm_opacus.mechanisms.jit import jit_uncontracted as _jit_uncontracted
from alm_opacus.registry import Registry

__all__ = [
    "FINISHES",
    "FIRST_PASS_FILLS",
    "FirstPassFill",
    "cache_dir",
    "dequantize_kernel",
    "finish_kernel",
    "first_pass_kernel",
    "gaussian_tail_inverse",
    "inverse_x",
]


# AS 241 (PPND16) coefficients, lowest degree first; B, D and F have a leading 1.
_A = (3.3871328727963666080e0, 1.3314166789178437745e2, 1.9715909503065514427e3,
      1.3731693765509461125e4, 4.5921953931549871457e4, 6.7265770927008700853e4,
      3.3430575583588128105e4, 2.5090809287301226727e3)  # fmt: skip
_B = (1.0, 4.2313330701600911252e1, 6.8718700749205790830e2, 5.3941960214247511077e3,
      2.1213794301586595867e4, 3.9307895800092710610e4, 2.8729085735721942674e4,
      5.2264952788528545610e3)  # fmt: skip
_C = (1.42343711074968357734e0, 4.63033784615654529590e0, 5.76949722146069140550e0,
      3.64784832476320460504e0, 1.27045825245236838258e0, 2.41780725177450611770e-1,
      2.27238449892691845833e-2, 7.74545014278341407640e-4)  # fmt: skip
_D = (1.0, 2.05319162663775882187e0, 1.67638483018380384940e0, 6.89767334985100004550e-1,
      1.48103976427480074590e-1, 1.51986665636164571966e-2, 5.47593808499534494600e-4,
      1.05075007164441684324e-9)  # fmt: skip
_E = (6.65790464350110377720e0, 5.46378491116411436990e0, 1.78482653991729133580e0,
      2.96560571828504891230e-1, 2.65321895265761230930e-2, 1.24266094738807843860e-3,
      2.71155556874348757815e-5, 2.01033439929228813265e-7)  # fmt: skip
_F = (1.0, 5.99832206555887937690e-1, 1.36929880922735805310e-1, 1.48753612908506148525e-2,
      7.86869131145613259100e-4, 1.84631831751005468180e-5, 1.42151175831644588870e-7,
      2.04426310338993978564e-15)  # fmt: skip
#: V below which AS 241 leaves its central branch (|p − ½| > 0.425 with p = V/2), and the
#: word magnitude the compiled pass compares instead (either branch is accurate at the seam).
_CENTRAL = 0.15
_CENTRAL_WORD = int(0.15 * 2.0**63)
_TWO_M63 = 2.0**-63
_ROUND = 1.5 * 2.0**52
_ROUND_BITS = int(np.float64(_ROUND).view(np.int64))
_MANTISSA = (1 << 52) - 1
_ONE_BITS = 1023 << 52
_SQRT2 = math.sqrt(2.0)
_LN2_HI = 0.6931471803691238  # 33 significant bits: e·_LN2_HI is exact for |e| < 2¹⁹
_LN2_LO = 1.90821492927058770002e-10  # ln 2 − _LN2_HI (fdlibm)
_ATANH = tuple(1.0 / (2 * k + 1) for k in range(11))
#: |x| beyond which the rounding trick is not used (the draw is left in doubt).
_LARGE = 2.0**50


@_jit
def _poly(c: tuple[float, ...], x: float) -> float:
    return (
        (((((c[7] * x + c[6]) * x + c[5]) * x + c[4]) * x + c[3]) * x + c[2]) * x + c[1]
    ) * x + c[0]


@_jit
def _central(v: float) -> float:
    q = 0.5 * v - 0.5  # exact for V ≥ ½, within 2⁻⁵⁴ below
    r = 0.180625 - q * q
    return -q * (_poly(_A, r) / _poly(_B, r))


@_jit
def _tail(log_half_v: float) -> float:
    """AS 241's tail branches from ln(V/2), both computed (branch-free: vectorises)."""
    r = math.sqrt(-log_half_v)
    near = _poly(_C, r - 1.6) / _poly(_D, r - 1.6)
    far = _poly(_E, r - 5.0) / _poly(_F, r - 5.0)
    return near if r <= 5.0 else far


@_jit
def _log_into(x: np.ndarray, scratch: np.ndarray, out: np.ndarray, factor: float) -> None:
    """out = factor·ln x for positive normal float64 x (finite garbage otherwise).

    ``out`` must not overlap ``x``: numba then cannot prove the loop free of aliasing and
    runs it scalar. x = 2ᵉ·m with m moved into [√½, √2); ln m = 2·atanh(f) with
    f = (m − 1)/(m + 1), |f| ≤ 0.172, by its series to f²¹ (remainder < 2⁻⁵⁵); ln 2 is split
    so that e·ln2_hi is exact. Relative error ≲ 2⁻⁵¹ (libm's scalar log costs twice as much).
    """
    bits = x.view(np.int64)
    for i in range(x.shape[0]):
        scratch[i] = (bits[i] & _MANTISSA) | _ONE_BITS
    mantissa = scratch.view(np.float64)
    for i in range(x.shape[0]):
        e = float((bits[i] >> 52) - 1023)
        m = mantissa[i]
        high = m > _SQRT2
        m = 0.5 * m if high else m
        e = e + 1.0 if high else e
        f = (m - 1.0) / (m + 1.0)
        s = f * f
        p = _ATANH[10]
        for k in range(9, -1, -1):
            p = p * s + _ATANH[k]
        out[i] = factor * (e * _LN2_HI + (2.0 * f * p + e * _LN2_LO))


def gaussian_tail_inverse(v: float) -> float:
    """S⁻¹(V) = −Φ⁻¹(V/2) for a float V in (0, 1], by AS 241 (the kernel's arithmetic, with
    libm's log)."""
    return float(_central(v) if v >= _CENTRAL else _tail(math.log(0.5 * v)))


@_jit
def _magnitudes(words: np.ndarray, v: np.ndarray) -> None:
    for i in range(words.shape[0]):
        v[i] = abs(float(words[i])) * _TWO_M63


@_jit
def _logistic_arguments(words: np.ndarray, v: np.ndarray) -> None:
    """2/V − 1, whose log is S⁻¹(V) for the logistic law."""
    for i in range(words.shape[0]):
        v[i] = 2.0 / (abs(float(words[i])) * _TWO_M63) - 1.0


@_jit
def _gaussian_x(
    words: np.ndarray,
    t: float,
    x: np.ndarray,
    ints: np.ndarray,
    index: np.ndarray,
    tail: np.ndarray,
    spare: np.ndarray,
) -> None:
    """x = t·S⁻¹(V): the central branch for every draw, then the tails (V < 0.15, 15% of
    draws) gathered, computed and scattered back. Each loop vectorises, or (the compaction,
    which tests the words as integers) at least never branches."""
    n = words.shape[0]
    _magnitudes(words, spare)
    for i in range(n):
        x[i] = _central(spare[i])
    count = 0
    for i in range(n):
        w = words[i]
        index[count] = i
        count += (w < _CENTRAL_WORD) & (w > -_CENTRAL_WORD)
    for c in range(count):
        tail[c] = 0.5 * spare[index[c]]
    _log_into(tail[:count], ints[:count], spare[:count], 1.0)
    for c in range(count):
        tail[c] = _tail(spare[c])
    for c in range(count):
        x[index[c]] = tail[c]
    for i in range(n):
        x[i] *= t


@_jit
def _accept(
    words: np.ndarray,
    x: np.ndarray,
    small: int,
    threshold: float,
    out: np.ndarray,
    flags: np.ndarray,
    doubt: np.ndarray,
) -> int:
    """K = ±rint(x) where the cell is certain, else 0 and the index in ``doubt``.

    Both loops vectorise: adding 1.5·2⁵² rounds |x| < 2⁵¹ to an integer (ties to even, as
    rint) whose value is then the float's low bits; V ≥ 2⁻ᵏ is |w| ≥ ``small`` = 2⁶³⁻ᵏ (the
    float conversion is monotone and 2⁶³⁻ᵏ is a float).
    """
    n = words.shape[0]
    for i in range(n):
        xi = x[i]
        y = xi + _ROUND
        w = words[i]
        big = (w >= small) | (w <= -small)
        # NaN and ±inf fail every comparison but the last
        flags[i] = big & (abs(xi - (y - _ROUND)) < threshold) & (abs(xi) < _LARGE)
        x[i] = y
    bits = x.view(np.int64)
    for i in range(n):
        sign = words[i] >> 63  # 0 or −1
        k = (bits[i] - _ROUND_BITS) * flags[i]
        out[i] = (k ^ sign) - sign
    count = 0
    for i in range(n):  # a rare, well-predicted branch
        if flags[i] == 0:
            doubt[count] = i
            count += 1
    return count


class _Buffers(threading.local):
    size = 0

    def get(self, n: int) -> tuple[np.ndarray, ...]:
        """This thread's scratch arrays, at least ``n`` long (kept between calls)."""
        if n > self.size:
            self.size = max(n, 1 << 17)
            f64, i64 = np.float64, np.int64
            self.arrays = (
                np.empty(self.size, f64),
                np.empty(self.size, i64),
                np.empty(self.size, np.uint8),
                np.empty(self.size, i64),
                np.empty(self.size, i64),
                np.empty(self.size, f64),
                np.empty(self.size, f64),
            )
        return tuple(a[:n] for a in self.arrays)

    def doubt(self, n: int) -> np.ndarray:
        """This thread's int64 array for the indices of up to ``n`` draws in doubt (one of
        `get`'s arrays, whole: slicing all seven costs more than a small fused pass)."""
        if n > self.size:
            self.get(n)
        return self.arrays[3]


_BUFFERS = _Buffers()
Kernel = Callable[..., np.ndarray]


@_jit
def _x_logistic(
    words: np.ndarray,
    t: float,
    x: np.ndarray,
    ints: np.ndarray,
    index: np.ndarray,
    tail: np.ndarray,
    spare: np.ndarray,
) -> None:
    _logistic_arguments(words, spare)
    _log_into(spare, ints, x, t)


@_jit
def _x_laplace(
    words: np.ndarray,
    t: float,
    x: np.ndarray,
    ints: np.ndarray,
    index: np.ndarray,
    tail: np.ndarray,
    spare: np.ndarray,
) -> None:
    _magnitudes(words, spare)
    _log_into(spare, ints, x, -t)


#: ``fill(words, t, x, ints, index, tail, spare)``: x = t·S⁻¹(V) for each int64 word, within
#: the first pass's error bound (module docstring); the other arrays are scratch of the words'
#: length (int64 ``ints`` and ``index``, float64 ``tail`` and ``spare``).
FirstPassFill = Callable[
    [np.ndarray, float, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray], None
]
#: Each cell law's ``fill`` by its name (`CellLaw.name`), registered with its noise law
#: (`alm_opacus.noise_laws`); a law without one takes the eager first pass.
FIRST_PASS_FILLS: Registry[FirstPassFill] = Registry("first-pass kernel", load=_load_noise_laws)


def inverse_x(name: str, words: np.ndarray, t: float) -> np.ndarray:
    """The kernel's x = t·S⁻¹(V) for each word (a fresh array; for tests and checks)."""
    x, ints, _, _, index, tail, spare = _Buffers().get(len(words))
    FIRST_PASS_FILLS[name](words, t, x, ints, index, tail, spare)
    return x


#: Draws per tile of the fused pass: its scratch arrays (8 bytes a draw each, the flags 1)
#: stay in a 32 KiB L1 cache.
_TILE = 512
#: What the first pass makes of each K (0 for a draw in doubt), given ``base`` cells:
#: ``"store"`` writes K, ``"sum"`` writes base + K (int64), ``"dequantize"`` writes
#: γ·clamp(base + K, ±limit) formed in float64 and rounded once to ``out``'s float dtype.
FINISHES = ("store", "sum", "dequantize")
_NO_BASE = np.zeros(0, np.int64)


@_jit_uncontracted
def _finish_store(
    k: np.ndarray, base: np.ndarray, out: np.ndarray, gamma: float, limit: int
) -> None:
    for i in range(k.shape[0]):
        out[i] = k[i]


@_jit_uncontracted
def _finish_sum(k: np.ndarray, base: np.ndarray, out: np.ndarray, gamma: float, limit: int) -> None:
    for i in range(k.shape[0]):
        out[i] = base[i] + k[i]


@_jit_uncontracted
def _finish_dequantize(
    k: np.ndarray, base: np.ndarray, out: np.ndarray, gamma: float, limit: int
) -> None:
    """γ·clamp(base + k) as `_dequantize` computes it (uncontracted: one rounding)."""
    for i in range(k.shape[0]):
        out[i] = float(min(max(base[i] + k[i], -limit), limit)) * gamma


_FINISH = {"store": _finish_store, "sum": _finish_sum, "dequantize": _finish_dequantize}
_FINISH_CODES = {"store": 0, "sum": 1, "dequantize": 2}
#: The fills `_fused` calls, by its code for them: the built-in laws'.
_FUSED_FILLS = {_x_logistic: 0, _x_laplace: 1, _gaussian_x: 2}


@_jit
def _fused(
    law: int,
    finish: int,
    words: np.ndarray,
    t: float,
    small: int,
    threshold: float,
    base: np.ndarray,
    out: np.ndarray,
    gamma: float,
    limit: int,
    doubt: np.ndarray,
) -> int:
    """The first pass of a built-in law (``law``, `_FUSED_FILLS`) as one compiled loop over
    tiles of `_TILE` draws, each tile's K finished (``finish``, `_FINISH_CODES`) as it is
    made; returns the count of draws in doubt, whose indices go into ``doubt``.

    Each tile runs the law's fill and `_accept`, the very loops the chunked pass runs on a
    whole chunk, only shorter: every draw goes through the same operations, so x, K and the
    draws in doubt are the same bit for bit (``tests/mechanisms/test_mechanism_fused_noise.py``),
    while the scratch arrays stay in the L1 cache and nothing of the chunk's length is
    written but ``out``. Law and finish are arguments, not closure cells: numba keys its disk
    cache of a closure by its cells' pickles, which hold a per-process id for a dispatcher,
    so a closure over the fill was compiled afresh in every process.
    """
    n = words.shape[0]
    x = np.empty(_TILE, np.float64)
    ints = np.empty(_TILE, np.int64)
    flags = np.empty(_TILE, np.uint8)
    local = np.empty(_TILE, np.int64)
    index = np.empty(_TILE, np.int64)
    tail = np.empty(_TILE, np.float64)
    spare = np.empty(_TILE, np.float64)
    cells = np.empty(_TILE, np.int64)
    count = 0
    for start in range(0, n, _TILE):
        m = min(_TILE, n - start)
        w = words[start : start + m]
        if law == 0:
            _x_logistic(w, t, x[:m], ints[:m], index[:m], tail[:m], spare[:m])
        elif law == 1:
            _x_laplace(w, t, x[:m], ints[:m], index[:m], tail[:m], spare[:m])
        else:
            _gaussian_x(w, t, x[:m], ints[:m], index[:m], tail[:m], spare[:m])
        found = _accept(w, x[:m], small, threshold, cells[:m], flags[:m], local[:m])
        held, part = base[start : start + m], out[start : start + m]
        if finish == 0:
            _finish_store(cells[:m], held, part, gamma, limit)
        elif finish == 1:
            _finish_sum(cells[:m], held, part, gamma, limit)
        else:
            _finish_dequantize(cells[:m], held, part, gamma, limit)
        for i in range(found):
            doubt[count + i] = start + local[i]
        count += found
    return count


def first_pass_kernel(name: str, *, fused: bool = True) -> Kernel | None:
    """The compiled first pass of the cell law ``name``, or None (no numba, or no kernel).

    ``kernel(words, t, small, threshold, out, base=None, finish="store", gamma=1.0,
    limit=0) -> doubt``: int64 ``words``; ``t`` cells per scale; ``small`` = 2⁶³⁻ᵏ (words
    with V < 2⁻ᵏ are in doubt); the first pass's ``threshold``; ``out`` (the words' length)
    gets K, or 0 for a draw in doubt, as ``finish`` makes it (`FINISHES`: int64 ``base``
    cells, and the grid step and clamp of ``"dequantize"``); the result lists the indices
    of the draws in doubt (a view of this thread's scratch, valid until its next call).

    A built-in law runs as one fused loop (`_fused`); another law's ``fill`` (a plugin's),
    or ``fused=False`` (the reference the tests compare the fused loop with), runs over the
    whole chunk, then `_accept`, then the finish. Both give the same K and draws in doubt,
    bit for bit.
    """
    fill = FIRST_PASS_FILLS.get(name)
    if _numba is None or fill is None:
        return None
    code = _FUSED_FILLS.get(fill) if fused else None

    def kernel(
        words: np.ndarray,
        t: float,
        small: int,
        threshold: float,
        out: np.ndarray,
        base: np.ndarray | None = None,
        finish: str = "store",
        gamma: float = 1.0,
        limit: int = 0,
    ) -> np.ndarray:
        cells = _NO_BASE if base is None else base
        if code is not None:
            doubt = _BUFFERS.doubt(len(words))
            found = _fused(
                code,
                _FINISH_CODES[finish],
                words,
                t,
                small,
                threshold,
                cells,
                out,
                gamma,
                limit,
                doubt,
            )
            return doubt[:found]
        x, ints, flags, doubt, index, tail, spare = _BUFFERS.get(len(words))
        fill(words, t, x, ints, index, tail, spare)
        found = _accept(words, x, small, threshold, ints, flags, doubt)  # ints is free again
        _FINISH[finish](ints, cells, out, gamma, limit)
        return doubt[:found]

    return kernel


@_jit_uncontracted
def _dequantize(cells: np.ndarray, gamma: float, limit: int, out: np.ndarray) -> None:
    """out = γ·clamp(cells, ±limit), each product formed in float64 and rounded once to
    ``out``'s dtype: what `alm_opacus.mechanisms.grid.dequantize` computes in four tensor
    operations, in one pass."""
    for i in range(cells.shape[0]):
        out[i] = float(min(max(cells[i], -limit), limit)) * gamma


def dequantize_kernel() -> Callable[[np.ndarray, float, int, np.ndarray], None] | None:
    """The compiled `_dequantize`, or None where numba does not import."""
    return None if _numba is None else _dequantize


def finish_kernel(finish: str) -> Callable[..., None] | None:
    """``finish(k, base, out, gamma, limit)``: the compiled finish named ``finish``
    (`FINISHES`) over whole arrays, for the draws the later passes decide; None where numba
    does not import."""
    return None if _numba is None else _FINISH[finish]
