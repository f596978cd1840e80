"""The random-DP confidence of a sampled sensitivity: exact, distribution-free order statistics.

Setting (Rubinstein & Aldà, ICML 2017, "Pain-free random differential privacy with sensitivity
sampling", their sensitivity sampler): ``G_1..G_m`` are i.i.d. distances between the outputs
on random neighbouring pairs, and the sampled sensitivity is their ``k``-th smallest value
``G_(k)``. Let ``q`` be the (1 - gamma)-quantile of one distance, i.e. the smallest ``t`` with
``P(G > t) <= gamma``. The estimate is good when ``G_(k) >= q``; then a fresh pair exceeds it
with probability at most ``gamma``, which is what (epsilon, gamma)-random-DP asks.

``G_(k) < q`` needs at least ``k`` samples below ``q``, and ``P(G < q) <= 1 - gamma``, so

    P(bad) <= P(Binomial(m, 1 - gamma) >= k) = I_{1-gamma}(k, m - k + 1)          (1)

(``I`` the regularised incomplete beta function; equality for continuous distances). This is
the classical distribution-free confidence bound for a quantile (David & Nagaraja, *Order
Statistics*, 3rd ed., 2003, ch. 7). Rubinstein & Aldà bound the same event with the DKW
inequality; (1) is exact and never looser.

Integrating over the sampler too: by exchangeability of ``G_1..G_m`` and a fresh ``G``,

    P(G > G_(k)) <= (m - k + 1) / (m + 1)                                          (2)

unconditionally (ties only lower it), a single-number gamma for sampler and pair together.
"""

from __future__ import annotations

import math

import numpy as np
from scipy import special

from alm_opacus._validation import check_integer

__all__ = [
    "gamma_for_confidence",
    "marginal_gamma",
    "order_for_confidence",
    "sampler_confidence",
    "sampler_failure_probability",
]


def _check_m_order(m: int, order: int) -> None:
    check_integer(m, name="m", numpy=True)
    if isinstance(order, bool) or not isinstance(order, (int, np.integer)) or not 1 <= order <= m:
        raise ValueError(f"order={order!r} is invalid: expected an integer in [1, m={m}]")


def _check_unit(value: float, *, name: str) -> float:
    out = float(value)
    if not 0 < out < 1:  # also rejects NaN
        raise ValueError(f"{name}={value!r} is invalid: expected a number in (0, 1)")
    return out


def sampler_failure_probability(*, m: int, order: int, gamma: float) -> float:
    """Probability, over the sampler, that the ``order``-th smallest of ``m`` distances is
    below the (1 - gamma)-quantile: the right side of (1) in the module docstring.

    Args:
        m: number of sampled pairs.
        order: ``k``, 1-based rank of the returned distance (``m`` = the maximum).
        gamma: the tail probability allowed for a fresh pair, in (0, 1).

    Returns:
        ``P(Binomial(m, 1 - gamma) >= order)``, computed without cancellation.

    Raises:
        ValueError: if ``m < 1``, ``order`` is outside [1, m] or ``gamma`` outside (0, 1).
    """
    _check_m_order(m, order)
    g = _check_unit(gamma, name="gamma")
    return float(special.betainc(order, m - order + 1, 1.0 - g))


def sampler_confidence(*, m: int, order: int, gamma: float) -> float:
    """``1 - sampler_failure_probability``: ``P(Binomial(m, 1 - gamma) <= order - 1)``.

    Same arguments and errors as :func:`sampler_failure_probability`.
    """
    _check_m_order(m, order)
    g = _check_unit(gamma, name="gamma")
    # I_gamma(m - k + 1, k) is the complement of (1); evaluating it directly keeps precision
    # when the confidence is tiny.
    return float(special.betainc(m - order + 1, order, g))


def gamma_for_confidence(*, m: int, order: int, confidence: float) -> float:
    """The smallest gamma whose sampler confidence is at least ``confidence``.

    Inverts (1) with the inverse regularised incomplete beta function.

    Raises:
        ValueError: on invalid ``m`` or ``order``, or ``confidence`` outside (0, 1).
    """
    _check_m_order(m, order)
    c = _check_unit(confidence, name="confidence")
    gamma = max(float(special.betaincinv(m - order + 1, order, c)), float(np.finfo(float).tiny))
    # betaincinv is accurate to a few ulps; nudge up until the forward check passes.
    while gamma < 1 and sampler_confidence(m=m, order=order, gamma=gamma) < c:
        gamma = float(np.nextafter(gamma, 1.0))
    if not gamma < 1:
        raise ValueError(f"confidence={confidence!r} is not reachable with m={m}, order={order}")
    return gamma


def order_for_confidence(*, m: int, gamma: float, confidence: float) -> int:
    """The smallest order statistic ``k`` (least noise) whose confidence reaches ``confidence``.

    Raises:
        ValueError: on invalid arguments, or when even the maximum (``k = m``) falls short;
            the message gives the smallest ``m`` that would do.
    """
    check_integer(m, name="m", numpy=True)
    g = _check_unit(gamma, name="gamma")
    c = _check_unit(confidence, name="confidence")
    if sampler_confidence(m=m, order=m, gamma=g) < c:
        # order = m: confidence = 1 - (1 - gamma)^m
        need = math.ceil(math.log1p(-c) / math.log1p(-g))
        raise ValueError(
            f"m={m} is too small for gamma={g!r} and confidence={c!r} even with the maximum; "
            f"need m >= {need}"
        )
    lo, hi = 1, m  # the confidence increases with the order: bisect for the first that passes
    while lo < hi:
        mid = (lo + hi) // 2
        if sampler_confidence(m=m, order=mid, gamma=g) >= c:
            hi = mid
        else:
            lo = mid + 1
    return lo


def marginal_gamma(*, m: int, order: int) -> float:
    """``(m - order + 1) / (m + 1)``: bound (2) on ``P(fresh distance > sampled value)``,
    over the sampler and the fresh pair together.

    Raises:
        ValueError: on invalid ``m`` or ``order``.
    """
    _check_m_order(m, order)
    return (m - order + 1) / (m + 1)
