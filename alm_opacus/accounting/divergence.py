"""ε(δ) and δ(ε) of a discrete PLD, without underflow at large epsilon.

For a discrete PLD with losses Lᵢ, masses pᵢ and mass m∞ at +∞, the hockey-stick divergence
is δ(ε) = m∞ + Σ_{Lᵢ > ε} pᵢ·(1 − e^{ε − Lᵢ}) (Sommer, Meiser & Mohammadi 2019; the
formula of dp_accounting's ``PLDPmf``). dp_accounting sums pᵢ·e^{−Lᵢ}, which underflows to 0
once the losses pass ~745: its ε(δ) then snaps to a grid point (at ε = 10⁴ it moves in steps
of the grid, so a search for σ cannot meet a tolerance finer than the grid). Here the same
sums are kept in log space, so both functions are exact for the discrete PLD at any scale.
For ε(δ) on the interval between two consecutive losses, δ(ε) = U − e^ε·W with U and W the
sums over the losses above it, so ε = ln(U − δ) − ln W there.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import numpy as np
from numpy.typing import NDArray

from alm_opacus.accounting.pld import PrivacyLossDistribution

__all__ = ["pld_delta", "pld_epsilon"]

Part = tuple[NDArray[np.float64], NDArray[np.float64], float]


def _parts(pld: PrivacyLossDistribution) -> Iterator[Part]:
    """(losses ascending, masses, mass at +∞) of the REMOVE and (if distinct) ADD PMFs."""
    # dp_accounting 0.6 keeps both PMFs in these attributes (pinned in constraints.txt).
    pmfs = [pld._pmf_remove] if pld._symmetric else [pld._pmf_remove, pld._pmf_add]
    for pmf in pmfs:
        dense = pmf.to_dense_pmf()
        losses = (np.arange(dense.size) + dense._lower_loss) * dense._discretization
        yield losses, np.asarray(dense._probs, dtype=np.float64), float(dense._infinity_mass)


#: Losses scanned at once by `_epsilon`, from the largest down (the answer usually lies in
#: the upper tail, so most of a long PLD is never read).
_CHUNK = 4096


def _epsilon(
    losses: NDArray[np.float64],
    probs: NDArray[np.float64],
    inf_mass: float,
    delta: float,
    *,
    chunk: int = _CHUNK,
) -> float:
    if inf_mass > delta:
        return math.inf
    # FFT convolution leaves round-off masses of ±1e-17; dropping the negative ones adds
    # tail mass, so the answer can only move up (pessimistic), and ln W stays defined.
    keep = probs > 0
    desc_l, desc_p = losses[keep][::-1], probs[keep][::-1]
    if desc_l.size == 0:
        return 0.0
    # The first hit in descending order decides; the scan stops at the chunk that holds it.
    # Each accumulate restarts from the previous chunk's last value (prepended), so every
    # U_k and ln W_k is the same float as one accumulate over the whole array.
    mass, log_w_end = None, None
    for start in range(0, desc_l.size, chunk):
        stop = min(start + chunk, desc_l.size)
        part_l, part_p = desc_l[start:stop], desc_p[start:stop]
        terms = np.log(part_p) - part_l
        if mass is None or log_w_end is None:
            cum = np.cumsum(part_p)
            log_w = np.logaddexp.accumulate(terms)
        else:
            cum = np.cumsum(np.concatenate(([mass], part_p)))[1:]
            log_w = np.logaddexp.accumulate(np.concatenate(([log_w_end], terms)))[1:]
        mass, log_w_end = cum[-1], log_w[-1]
        upper = inf_mass + cum  # U_k: mass at losses ≥ L_k (descending order)
        valid = upper > delta  # ln W_k = ln Σ p·e^{−L} above: log_w
        with np.errstate(divide="ignore", invalid="ignore"):
            candidate = np.where(
                valid, np.log(np.where(valid, upper - delta, 1.0)) - log_w, -np.inf
            )
        below = desc_l[start + 1 : stop + 1]  # the next lower loss
        if below.size < part_l.size:
            below = np.append(below, -np.inf)
        hits = np.flatnonzero(valid & (candidate >= below))
        if hits.size:
            return max(0.0, float(candidate[hits[0]]))
    return 0.0


def pld_epsilon(pld: PrivacyLossDistribution, delta: float) -> float:
    """Smallest ε ≥ 0 with δ(ε) ≤ delta for both directions of ``pld``.

    Equals ``pld.get_epsilon_for_delta(delta)`` where that does not underflow (losses
    below ~700), and stays exact beyond.

    Returns:
        ε ≥ 0, or ``inf`` if the mass at +∞ exceeds ``delta``.
    """
    return max(_epsilon(losses, probs, inf, delta) for losses, probs, inf in _parts(pld))


def pld_delta(pld: PrivacyLossDistribution, epsilon: float) -> float:
    """δ(ε) = max over both directions of m∞ + Σ_{L > ε} p·(1 − e^{ε − L}), in [0, 1]."""
    out = 0.0
    for losses, probs, inf in _parts(pld):
        above = losses > epsilon
        tail = -np.expm1(epsilon - losses[above])
        out = max(out, inf + math.fsum((probs[above] * tail).tolist()))
    return min(1.0, out)
