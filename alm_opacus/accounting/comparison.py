"""ε of one Gaussian DP-SGD configuration under several accountants, side by side.

What the numbers mean (measured in ``docs/accounting.md``):

- ``alm_pld``: our pessimistic PLD (an upper bound), grid ≈ 1e-4·ε.
- ``prv``: Opacus's PRV accountant as Opacus calls it, ``eps_error=0.01``: the upper end of
  its error interval, which is up to 0.01 *absolute* above its estimate (10% at ε = 0.1).
- ``prv_estimate`` and ``prv_lower``: the same PRV computation's estimate and lower bound,
  an independent check that ``alm_pld`` is neither below the truth nor far above it.
- ``rdp``: Opacus's RDP accountant, a valid but looser upper bound.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence

from opacus.accountants import PRVAccountant, RDPAccountant

from alm_opacus._validation import check_delta, check_positive
from alm_opacus.accounting.accountant import ACCOUNTANT_NAME, PipelineAccountant
from alm_opacus.accounting.pld import _check_sample_rate, _check_steps

__all__ = ["ACCOUNTANTS", "compare_accountants"]

_LOG = logging.getLogger(__name__)
History = list[tuple[float, float, int]]

PRV_EPS_ERROR = 0.01  # Opacus's default in PRVAccountant.get_epsilon


def _alm_pld(history: History, delta: float) -> dict[str, float]:
    acc = PipelineAccountant()
    acc.history = list(history)
    return {ACCOUNTANT_NAME: acc.get_epsilon(delta)}


def _prv(history: History, delta: float) -> dict[str, float]:
    # The same three numbers PRVAccountant.get_epsilon computes (it returns the upper one).
    acc = PRVAccountant()
    acc.history = list(history)
    delta_error = delta / 1000  # Opacus's default
    dprv = acc._get_dprv(eps_error=PRV_EPS_ERROR, delta_error=delta_error)
    lower, estimate, upper = dprv.compute_epsilon(delta, delta_error, PRV_EPS_ERROR)
    return {"prv": float(upper), "prv_estimate": float(estimate), "prv_lower": float(lower)}


def _rdp(history: History, delta: float) -> dict[str, float]:
    acc = RDPAccountant()
    acc.history = list(history)
    return {"rdp": float(acc.get_epsilon(delta))}


ACCOUNTANTS: dict[str, Callable[[History, float], dict[str, float]]] = {
    ACCOUNTANT_NAME: _alm_pld,
    "prv": _prv,
    "rdp": _rdp,
}


def compare_accountants(
    *,
    noise_multiplier: float,
    sample_rate: float,
    steps: int,
    delta: float,
    accountants: Sequence[str] = tuple(ACCOUNTANTS),
) -> dict[str, float]:
    """ε of ``steps`` Poisson-subsampled Gaussian DP-SGD steps under each accountant.

    Args:
        noise_multiplier: σ > 0.
        sample_rate: q in (0, 1].
        steps: number of steps ≥ 1.
        delta: δ in (0, 1).
        accountants: which of ``ACCOUNTANTS`` to run (``alm_pld``, ``prv``, ``rdp``).

    Returns:
        ``{name: epsilon}``: ``alm_pld``, ``prv`` (Opacus's reported upper bound),
        ``prv_estimate``, ``prv_lower``, ``rdp``. An accountant that fails (Opacus's PRV
        does at some extreme settings) is left out, with a logged warning.

    Raises:
        ValueError: if an argument is out of range or an accountant name is unknown.
    """
    history = [
        (
            check_positive(noise_multiplier, name="noise_multiplier"),
            _check_sample_rate(sample_rate),
            _check_steps(steps),
        )
    ]
    target = check_delta(delta, allow_zero=False)
    unknown = sorted(set(accountants) - set(ACCOUNTANTS))
    if unknown:
        raise ValueError(f"accountants={unknown!r} are unknown: expected {sorted(ACCOUNTANTS)}")
    out: dict[str, float] = {}
    for name in accountants:
        try:
            values = ACCOUNTANTS[name](history, target)
        except (ValueError, ArithmeticError, RuntimeError, MemoryError) as err:
            _LOG.warning("accountant %s failed on %s at delta=%g: %s", name, history, target, err)
            continue
        out.update({k: v for k, v in values.items() if not math.isnan(v)})
    return out
