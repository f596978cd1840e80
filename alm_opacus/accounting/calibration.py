"""Calibrate DP-SGD's noise multiplier to a total (ε, δ), after what is already spent.

`find_noise_multiplier` searches σ in log space. Every candidate is judged by the very
computation the accountant will run after training: a copy of the prior accountant plus the
new steps, asked `PipelineAccountant.get_epsilon`. The PLD grid follows the epsilon
(`alm_opacus.accounting.pld_grid`), so one evaluation takes milliseconds to a second at any
target from 0.01 to 10⁶, and the answer is never looser than what the accountant reports.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from alm_opacus._validation import check_delta, check_epsilon
from alm_opacus.accounting.accountant import PipelineAccountant
from alm_opacus.accounting.pld import _check_sample_rate, _check_steps
from alm_opacus.accounting.subsampled import canonical_step_mechanism
from alm_opacus.errors import InfeasibleRelease
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
_EXPAND = 4.0  # largest factor one extrapolation step moves σ by
_MAX_EVALUATIONS = 80


class InfeasibleBudget(InfeasibleRelease):
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


class _Search:
    """Smallest σ with ε(σ) ≤ target, to a relative tolerance in ε, in log-log space.

    ε(σ) is close to a power law (slope −1 where ε is small, −2 where it is large), so a
    secant step on (ln σ, ln ε) lands in the window [(1 − tol)·target, target] in one or
    two evaluations once two points are known; it aims at the window's middle so that it
    lands on the safe side. Where one end is missing it extrapolates along the last slope.
    """

    def __init__(self, epsilon_at: Callable[[float], float], target: float, tol: float) -> None:
        self.epsilon_at, self.target, self.tol = epsilon_at, target, tol
        self.lo: tuple[float, float] | None = None  # largest σ seen that fails
        self.hi: tuple[float, float] | None = None  # smallest σ seen that meets the target
        self.slope = -1.0
        self.last: tuple[float, float] | None = None
        self.moved: list[bool] = []

    def done(self) -> bool:
        if self.hi is None:
            return False
        close = self.hi[1] >= (1.0 - self.tol) * self.target
        return close or (self.lo is not None and self.hi[0] / self.lo[0] - 1.0 <= 1e-9)

    def evaluate(self, sigma: float) -> None:
        eps = self.epsilon_at(sigma)
        last = self.last
        finite = last is not None and 0.0 < eps < math.inf and 0.0 < last[1] < math.inf
        if finite and last is not None and sigma != last[0]:
            fitted = math.log(eps / last[1]) / math.log(sigma / last[0])
            self.slope = min(-0.25, max(-4.0, fitted))
        self.last = (sigma, eps)
        self.moved.append(eps <= self.target)
        if eps <= self.target and (self.hi is None or sigma < self.hi[0]):
            self.hi = (sigma, eps)
        elif eps > self.target and (self.lo is None or sigma > self.lo[0]):
            self.lo = (sigma, eps)

    def propose(self) -> float:
        assert self.last is not None
        goal = (1.0 - self.tol / 2.0) * self.target
        if self.lo is not None and self.hi is not None:
            x_lo, x_hi = math.log(self.lo[0]), math.log(self.hi[0])
            stuck = len(self.moved) >= 3 and self.moved[-1] == self.moved[-2] == self.moved[-3]
            if stuck or not math.isfinite(self.lo[1]) or self.hi[1] == 0.0:
                return math.exp(0.5 * (x_lo + x_hi))
            y_lo = math.log(self.lo[1] / goal)
            y_hi = math.log(self.hi[1] / goal)
            x = x_hi - y_hi * (x_hi - x_lo) / (y_hi - y_lo)
            return math.exp(min(max(x, x_lo + 0.02 * (x_hi - x_lo)), x_hi - 0.02 * (x_hi - x_lo)))
        sigma, eps = self.last
        if not math.isfinite(eps):
            return sigma * _EXPAND
        if eps == 0.0:
            return sigma / _EXPAND
        step = math.log(goal / eps) / self.slope
        return sigma * math.exp(min(math.log(_EXPAND), max(-math.log(_EXPAND), step)))

    def run(self, start: float, spent: str) -> tuple[float, float]:
        sigma = start
        for _ in range(_MAX_EVALUATIONS):
            if sigma > MAX_NOISE_MULTIPLIER:
                eps = self.lo[1] if self.lo is not None else math.inf
                raise InfeasibleBudget(
                    f"target_epsilon={self.target:g} cannot be met: even noise_multiplier="
                    f"{MAX_NOISE_MULTIPLIER:g} gives epsilon={eps:.6g}{spent}"
                )
            if sigma < MIN_NOISE_MULTIPLIER:
                break  # every σ we can account for meets the target (δ near 1)
            self.evaluate(sigma)
            if self.done():
                break
            sigma = self.propose()
        assert self.hi is not None, "no noise multiplier met the target"
        return self.hi


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

    def trial(sigma: float) -> PipelineAccountant:
        acc = PipelineAccountant()
        acc.load_state_dict(state)
        acc.step(noise_multiplier=sigma, sample_rate=q, mechanism=name, dim=d, num_steps=n)
        return acc

    start = 1.0
    if delta > 0.0:
        # First on the coarse grid alone (cheap, and an upper bound), to get near.
        rough = _Search(lambda s: trial(s)._rough_epsilon(delta), target, tol)
        start = rough.run(start, spent)[0]
    # Then with the accountant's own answer, which is what training will report.
    search = _Search(lambda s: trial(s).get_epsilon(delta), target, tol)
    return search.run(start, spent)[0]
