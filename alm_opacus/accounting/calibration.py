"""Calibrate DP-SGD's noise multiplier to a total (ε, δ), after what is already spent.

`find_noise_multiplier` searches σ in log space. Every candidate is judged by the very
computation the accountant will run after training: a copy of the prior accountant plus the
new steps, asked `PipelineAccountant.get_epsilon`. The PLD grid follows the epsilon
(`alm_opacus.accounting.grid`), so one evaluation takes milliseconds to a second at any
target from 0.01 to 10⁶, and the answer is never looser than what the accountant reports.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from alm_opacus._validation import check_delta, check_epsilon
from alm_opacus.accounting.accountant import PipelineAccountant
from alm_opacus.accounting.pld import _check_sample_rate, _check_steps
from alm_opacus.accounting.subsampled import canonical_step_mechanism
from alm_opacus.mechanisms import create_mechanism
from alm_opacus.mechanisms.base import _check_dim

__all__ = [
    "MAX_NOISE_MULTIPLIER",
    "MAX_TARGET_EPSILON",
    "MIN_NOISE_MULTIPLIER",
    "InfeasibleBudget",
    "find_noise_multiplier",
]

#: Largest target calibrated. Above it (ε, δ) bounds no test (e^ε overflows float64 past
#: ε ≈ 709 already); at 10⁶ the answer is a tiny σ, and beyond we refuse.
MAX_TARGET_EPSILON = 1e6
#: Search range of σ. Below the minimum the PLD of one step cannot be held in memory
#: (its loss spans ~1/(2σ²)); above the maximum the noise is 10¹² clipping norms.
MIN_NOISE_MULTIPLIER = 1e-9
MAX_NOISE_MULTIPLIER = 1e12
_EXPAND = 4.0  # bracketing factor in σ
_MAX_EVALUATIONS = 80


class InfeasibleBudget(ValueError):
    """No noise multiplier makes the new steps, after what is spent, meet the target."""


def _describe(prior: PipelineAccountant) -> str:
    gaussian = sum(int(n) for _, _, n in prior.history)
    other = sum(s["num_steps"] for s in prior.noise_steps)
    return (
        f"{gaussian} Gaussian DP-SGD steps, {other} logistic/Laplace DP-SGD steps and "
        f"{len(prior.releases)} releases"
    )


def _clone(prior: PipelineAccountant | None) -> PipelineAccountant:
    base = PipelineAccountant()
    if prior is not None:
        if not isinstance(prior, PipelineAccountant):
            raise ValueError(f"prior={prior!r} is invalid: expected a PipelineAccountant or None")
        if len(prior) > 0:
            base.load_state_dict(prior.state_dict())
    return base


def _check_tolerance(epsilon_tolerance: float) -> float:
    tol = float(epsilon_tolerance)
    if not 0.0 < tol < 1.0:
        raise ValueError(
            f"epsilon_tolerance={epsilon_tolerance!r} is invalid: expected a number in (0, 1)"
        )
    return tol


def _check_feasible(
    *, target: float, delta: float, mechanism: str, base: PipelineAccountant
) -> None:
    if target > MAX_TARGET_EPSILON:
        raise InfeasibleBudget(
            f"target_epsilon={target:g} is above {MAX_TARGET_EPSILON:g}, the largest target "
            "this calibration supports: at such an epsilon the (epsilon, delta) statement "
            "bounds no attack, so train without noise and report guarantee 'none'"
        )
    if delta == 0.0 and not create_mechanism(mechanism).pure:
        raise InfeasibleBudget(
            f"target_epsilon={target:g} at target_delta=0 cannot be met with {mechanism} "
            "noise: Gaussian steps are never pure DP (epsilon is infinite at delta 0)"
        )
    if len(base) == 0:
        return
    spent = base.get_epsilon(delta)
    if spent >= target:
        raise InfeasibleBudget(
            f"target_epsilon={target:g} at target_delta={delta:g} cannot be met: the prior "
            f"accountant has already spent epsilon={spent:.6g} at that delta "
            f"({_describe(base)}), and further steps only add to it"
        )


def _bracket(
    epsilon_at: Callable[[float], float], target: float, spent: str
) -> tuple[float, float, float, float]:
    """(lo, ε(lo), hi, ε(hi)) with ε(lo) > target ≥ ε(hi), found by steps of ×4 in σ."""
    sigma, eps = 1.0, epsilon_at(1.0)
    if eps <= target:
        hi, eps_hi = sigma, eps
        while True:
            sigma /= _EXPAND
            if sigma < MIN_NOISE_MULTIPLIER:
                # Every σ we can account for meets the target (δ near 1): the least one.
                return hi, eps_hi, hi, eps_hi
            eps = epsilon_at(sigma)
            if eps > target:
                return sigma, eps, hi, eps_hi
            hi, eps_hi = sigma, eps
    lo, eps_lo = sigma, eps
    while True:
        sigma *= _EXPAND
        if sigma > MAX_NOISE_MULTIPLIER:
            raise InfeasibleBudget(
                f"target_epsilon={target:g} cannot be met: even noise_multiplier="
                f"{MAX_NOISE_MULTIPLIER:g} gives epsilon={eps_lo:.6g}{spent}"
            )
        eps = epsilon_at(sigma)
        if eps <= target:
            return lo, eps_lo, sigma, eps
        lo, eps_lo = sigma, eps


def _next_sigma(
    lo: float, eps_lo: float, hi: float, eps_hi: float, target: float, *, bisect: bool
) -> float:
    """Secant step of log ε against log σ (near-linear), or bisection where undefined."""
    x_lo, x_hi = math.log(lo), math.log(hi)
    if not bisect and math.isfinite(eps_lo) and eps_hi > 0.0:
        y_lo, y_hi = math.log(eps_lo / target), math.log(eps_hi / target)
        x = x_hi - y_hi * (x_hi - x_lo) / (y_hi - y_lo)
        # Stay inside the middle 90% of the bracket so that it always shrinks.
        x = min(max(x, x_lo + 0.05 * (x_hi - x_lo)), x_hi - 0.05 * (x_hi - x_lo))
    else:
        x = 0.5 * (x_lo + x_hi)
    return math.exp(x)


def find_noise_multiplier(
    *,
    target_epsilon: float,
    target_delta: float,
    sample_rate: float,
    steps: int,
    mechanism: str = "gaussian",
    prior: PipelineAccountant | None = None,
    epsilon_tolerance: float = 0.01,
    dim: int | None = None,
) -> float:
    """Smallest noise multiplier (to tolerance) for which prior + new steps meet the target.

    The new steps are ``steps`` Poisson-subsampled DP-SGD steps of ``mechanism`` (noise
    scale σ·C for clipping norm C), composed after everything recorded in ``prior``.

    Args:
        target_epsilon: total ε, in (0, `MAX_TARGET_EPSILON`].
        target_delta: δ in [0, 1); 0 only for pure mechanisms (``alm``, ``laplace``).
        sample_rate: Poisson sampling rate q in (0, 1].
        steps: number of new steps ≥ 1.
        mechanism: ``"gaussian"``, ``"alm"``/``"logistic"`` or ``"laplace"``.
        prior: an accountant whose entries the new steps follow (left unchanged).
        epsilon_tolerance: relative slack: the answer's ε lies in
            [(1 − tolerance)·target, target] unless σ is pinned to 1e-9 relative.
        dim: the noised coordinates, as the training hook will record them (``noise_dim``).

    Returns:
        σ whose total ε, as `PipelineAccountant.get_epsilon` computes it, is ≤ target.

    Raises:
        InfeasibleBudget: if the prior already spent the target, δ = 0 with Gaussian noise,
            the target exceeds `MAX_TARGET_EPSILON`, or no σ ≤ 1e12 suffices.
        ValueError: on invalid arguments, or a prior whose relation is not add/remove.
    """
    target = check_epsilon(target_epsilon, name="target_epsilon")
    delta = check_delta(target_delta, name="target_delta")
    q = _check_sample_rate(sample_rate)
    n = _check_steps(steps)
    name = canonical_step_mechanism(mechanism)
    tol = _check_tolerance(epsilon_tolerance)
    d = _check_dim(dim)
    base = _clone(prior)
    _check_feasible(target=target, delta=delta, mechanism=name, base=base)
    state = base.state_dict()
    spent = f" on top of {_describe(base)}" if len(base) else ""

    def epsilon_at(sigma: float) -> float:
        trial = PipelineAccountant()
        trial.load_state_dict(state)
        trial.step(noise_multiplier=sigma, sample_rate=q, mechanism=name, dim=d, num_steps=n)
        return trial.get_epsilon(delta)

    lo, eps_lo, hi, eps_hi = _bracket(epsilon_at, target, spent)
    moved: list[bool] = []  # which end each step replaced (True: hi)
    for _ in range(_MAX_EVALUATIONS):
        if eps_hi >= (1.0 - tol) * target or hi / lo - 1.0 <= 1e-9:
            break
        # A secant that keeps replacing the same end converges slowly: bisect once then.
        stuck = len(moved) >= 2 and moved[-1] == moved[-2]
        sigma = _next_sigma(lo, eps_lo, hi, eps_hi, target, bisect=stuck)
        eps = epsilon_at(sigma)
        moved.append(eps <= target)
        if eps <= target:
            hi, eps_hi = sigma, eps
        else:
            lo, eps_lo = sigma, eps
    return hi
