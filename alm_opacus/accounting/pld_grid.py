"""How fine a PLD grid must be: relative to the epsilon it resolves, bounded in memory.

A pessimistic PLD on a grid of step h overstates ε by at most about h per composed
mechanism, and in practice much less (connect-the-dots; Doroshenko et al. 2022). A fixed h
(dp_accounting's 1e-4) is needlessly fine at ε = 10⁴, where one DP-SGD step's loss spans
hundreds of nats and the grid grows to millions of points per step (the 8.8 GB seen at
ε = 10⁴), and too coarse at ε = 0.01. So the grid follows the epsilon: h ≈ 1e-4·ε, a
power-of-two multiple of 1e-4 so that the same history always lands on the same grid (and
caches hit), with a cap on the points one mechanism may occupy.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from alm_opacus.accounting.divergence import pld_delta, pld_epsilon
from alm_opacus.accounting.pld import (
    DEFAULT_VALUE_DISCRETIZATION_INTERVAL,
    PrivacyLossDistribution,
)

__all__ = [
    "COARSE_POINTS",
    "MAX_INTERVAL",
    "MAX_POINTS",
    "MIN_INTERVAL",
    "answer_interval",
    "auto_delta",
    "auto_epsilon",
    "coarse_interval",
    "interval_for_epsilon",
    "interval_for_span",
]

_BASE = DEFAULT_VALUE_DISCRETIZATION_INTERVAL
_K_MIN, _K_MAX = -7, 21
#: finest grid: 1e-4·2⁻⁷ ≈ 7.8e-7, full 1e-4 relative resolution down to ε ≈ 0.008.
#: Finer is not more accurate: connect-the-dots builds the PMF from second differences of
#: δ(ε) divided by expm1(h), so float64 round-off grows like 1e-16/h per grid point
#: (measured: at h = 1e-4·2⁻¹⁰ δ(0) of a 60-step history drifts by 2%).
MIN_INTERVAL = _BASE * 2.0**_K_MIN
#: coarsest grid, ≈ 210: dp_accounting's connect-the-dots evaluates expm1(h), which
#: overflows past h ≈ 709.
MAX_INTERVAL = _BASE * 2.0**_K_MAX
#: most grid points one mechanism's single-step PLD may take (2²² float64 ≈ 32 MiB).
MAX_POINTS = 2**22
#: grid points of the widest mechanism in the first, scale-finding pass.
COARSE_POINTS = 2**11


def _clip_k(k: int) -> int:
    return min(_K_MAX, max(_K_MIN, k))


def interval_for_epsilon(epsilon: float) -> float:
    """Largest grid 1e-4·2^k that is at most 1e-4·ε (clipped to [MIN, MAX_INTERVAL]).

    Args:
        epsilon: the ε the grid must resolve, ≥ 0 (0 gives the finest grid).

    Returns:
        The grid step h.
    """
    if not epsilon > 0.0:
        return MIN_INTERVAL
    if math.isinf(epsilon):
        return MAX_INTERVAL
    return _BASE * 2.0 ** _clip_k(math.floor(math.log2(epsilon)))


def interval_for_span(span: float, points: int) -> float:
    """Smallest grid 1e-4·2^k that covers a loss support of width ``span`` in ``points``.

    Args:
        span: width of one mechanism's finite privacy-loss support, ≥ 0.
        points: most grid points allowed.

    Returns:
        The grid step h (``inf`` when even MAX_INTERVAL needs more than ``points``).
    """
    if span <= 0.0:
        return MIN_INTERVAL
    k = math.ceil(math.log2(span / (points * _BASE)))
    if k > _K_MAX:
        return math.inf
    return _BASE * 2.0 ** _clip_k(k)


def coarse_interval(widest_span: float) -> float:
    """Grid of the first, scale-finding pass: `COARSE_POINTS` on the widest mechanism.

    Returns:
        The grid step, at least the `MAX_POINTS` floor; ``inf`` when no grid can hold it.
    """
    floor = interval_for_span(widest_span, MAX_POINTS)
    if math.isinf(floor):
        return math.inf
    return max(floor, min(interval_for_span(widest_span, COARSE_POINTS), MAX_INTERVAL))


def auto_epsilon(
    *, pld_at: Callable[[float], PrivacyLossDistribution], widest_span: float, delta: float
) -> float:
    """ε(δ) of a composition on a grid chosen from the answer itself.

    The first pass puts the widest mechanism on `COARSE_POINTS` points and gives an upper
    bound ε_c; the next runs on `answer_interval` (ε_c), unless that is no finer, and so on
    until the grid is `answer_interval` of the answer (usually two passes). No grid puts
    one mechanism on more than `MAX_POINTS` points. Every pass is pessimistic, so each
    answer bounds ε from above; the result is a deterministic function of the composition
    and δ.

    Args:
        pld_at: builds the composed pessimistic PLD on a given grid step.
        widest_span: the widest single-mechanism loss support (see `interval_for_span`).
        delta: δ in [0, 1).

    Returns:
        ε ≥ 0; ``inf`` when the losses are too wide for any grid (a noise scale so small
        that ε is astronomically large), or when the PLD says so.
    """
    coarse = coarse_interval(widest_span)
    if math.isinf(coarse):
        return math.inf
    interval, epsilon = coarse, pld_epsilon(pld_at(coarse), delta)
    # Refine until the grid is `answer_interval` of the answer itself (twice at most in
    # practice: a finer grid lowers ε a little), so that `auto_delta` at that ε reads the
    # very same PLD and the two functions invert each other.
    for _ in range(4):
        if epsilon == 0.0 or not math.isfinite(epsilon):
            return epsilon
        fine = answer_interval(widest_span, epsilon)
        if fine >= interval:
            return epsilon
        interval, epsilon = fine, pld_epsilon(pld_at(fine), delta)
    return epsilon


def answer_interval(widest_span: float, epsilon: float) -> float:
    """The grid an answer ε is read on: `interval_for_epsilon` (ε), capped by the coarse grid.

    Never finer than the `MAX_POINTS` floor.
    """
    floor = interval_for_span(widest_span, MAX_POINTS)
    return max(floor, min(coarse_interval(widest_span), interval_for_epsilon(epsilon)))


def auto_delta(
    *, pld_at: Callable[[float], PrivacyLossDistribution], widest_span: float, epsilon: float
) -> float:
    """δ(ε) of a composition on the grid `answer_interval` (ε), as `auto_epsilon` reads it.

    Returns:
        δ in [0, 1]; 1 when the losses are too wide for any grid.
    """
    if math.isinf(coarse_interval(widest_span)):
        return 1.0
    return pld_delta(pld_at(answer_interval(widest_span, epsilon)), epsilon)
