"""Neighbouring relations: ``"add-remove"`` (DP-SGD's) and ``"replace-one"`` (the analytic
post-training bounds'), and how to state an add/remove guarantee under replace-one.

Under add/remove, D ~ D' when one is the other plus one record; under replace-one, when they
have the same size and differ in one record. The same (ε, δ) means different things under
the two, so a comparison must first bring both to one relation. Only one direction is
available in general: see `to_replace_one`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable

from dp_accounting import privacy_accountant
from dp_accounting.pld import privacy_loss_distribution as pld_lib

from alm_opacus._validation import check_delta, check_positive
from alm_opacus.accounting.divergence import pld_epsilon
from alm_opacus.accounting.pld import (
    PrivacyLossDistribution,
    _check_interval,
    _check_sample_rate,
    _check_steps,
    compose,
)
from alm_opacus.accounting.pld_grid import auto_epsilon
from alm_opacus.accounting.subsampled import step_loss_span

__all__ = [
    "ADD_REMOVE",
    "NEIGHBOURING_RELATIONS",
    "REPLACE_ONE",
    "check_neighbouring",
    "epsilon_replace_one",
    "to_replace_one",
]

ADD_REMOVE = "add-remove"
REPLACE_ONE = "replace-one"
NEIGHBOURING_RELATIONS = (ADD_REMOVE, REPLACE_ONE)


def check_neighbouring(neighbouring: str, *, name: str = "neighbouring") -> str:
    """Return ``neighbouring`` after checking that it names a relation.

    Raises:
        ValueError: if it is not ``"add-remove"`` or ``"replace-one"``.
    """
    if neighbouring not in NEIGHBOURING_RELATIONS:
        raise ValueError(
            f"{name}={neighbouring!r} is invalid: expected one of {list(NEIGHBOURING_RELATIONS)}"
        )
    return neighbouring


def _group_of_two(epsilon: float, delta: float) -> tuple[float, float]:
    # Replacing x by x' is removing x, then adding x': two add/remove steps, so group
    # privacy gives (2ε, δ + e^ε·δ). Computed in log space; δ ≥ 1 says nothing, so clip.
    if delta == 0.0:
        return 2.0 * epsilon, 0.0
    log_delta = math.log(delta) + float(math.log1p(math.exp(-epsilon)) + epsilon)
    return 2.0 * epsilon, 1.0 if log_delta >= 0.0 else math.exp(log_delta)


def _same(epsilon: float, delta: float) -> tuple[float, float]:
    return epsilon, delta


_TO_REPLACE_ONE: dict[str, Callable[[float, float], tuple[float, float]]] = {
    ADD_REMOVE: _group_of_two,
    REPLACE_ONE: _same,
}


def to_replace_one(*, epsilon: float, delta: float, neighbouring: str) -> tuple[float, float]:
    """State an (ε, δ) guarantee under the replace-one relation.

    Add/remove (ε, δ)-DP gives replace-one (2ε, (1 + e^ε)·δ)-DP: D and D' that differ in
    one record are joined by D'' = D minus that record, and each of the two steps is an
    add/remove neighbour, so for every event S,
    P[M(D) ∈ S] ≤ e^ε·P[M(D'') ∈ S] + δ ≤ e^{2ε}·P[M(D') ∈ S] + e^ε·δ + δ
    (group privacy; Dwork & Roth 2014, Theorem 2.2 for δ = 0, the same chain for δ > 0).
    A replace-one guarantee is returned unchanged.

    The converse is not available in general: replace-one DP says nothing about adding a
    record. A mechanism that publishes |D| is replace-one (0, 0)-DP and yet tells add/remove
    neighbours apart with certainty.

    Args:
        epsilon: ε ≥ 0 (``inf`` allowed).
        delta: δ in [0, 1).
        neighbouring: the relation the guarantee holds under.

    Returns:
        ``(epsilon, delta)`` under replace-one; δ is clipped to 1.

    Raises:
        ValueError: if an argument is out of range or the relation is unknown.
    """
    eps = float(epsilon)
    if math.isnan(eps) or eps < 0:
        raise ValueError(f"epsilon={epsilon!r} is invalid: expected a number ≥ 0")
    d = check_delta(delta)
    return _TO_REPLACE_ONE[check_neighbouring(neighbouring)](eps, d)


def _replace_one_group(sigma: float, q: float, n: int, interval: float) -> PrivacyLossDistribution:
    single = pld_lib.from_gaussian_mechanism(
        sigma,
        sensitivity=1.0,
        sampling_prob=q,
        value_discretization_interval=interval,
        neighboring_relation=privacy_accountant.NeighboringRelation.REPLACE_ONE,
    )
    return single.self_compose(n) if n > 1 else single


def epsilon_replace_one(
    *,
    history: Iterable[tuple[float, float, int]],
    delta: float,
    value_discretization_interval: float | None = None,
) -> float:
    """ε(δ) of a Gaussian DP-SGD history under replace-one, composed directly.

    dp_accounting 0.6 builds the Poisson-subsampled Gaussian PLD under
    ``NeighboringRelation.REPLACE_ONE``: upper law q·N(−1, σ²) + (1 − q)·N(0, σ²) against
    q·N(1, σ²) + (1 − q)·N(0, σ²) (one clipped gradient replaced by another, each of norm
    ≤ 1). This is tighter than `to_replace_one` of the add/remove ε, which pays for group
    privacy. Only Gaussian steps: dp_accounting has no replace-one PLD for Laplace or the
    logistic mechanism.

    Args:
        history: ``(noise_multiplier, sample_rate, num_steps)`` triples, as Opacus records.
        delta: δ in (0, 1).
        value_discretization_interval: PLD grid step; ``None`` chooses it from ε
            (`alm_opacus.accounting.pld_grid.auto_epsilon`).

    Returns:
        ε ≥ 0 (0 for an empty history, ``inf`` if a step had noise_multiplier 0).

    Raises:
        ValueError: if an entry or ``delta`` is out of range.
    """
    target = check_delta(delta, allow_zero=False)
    groups = []
    for entry in history:
        sigma, q, n = entry
        if float(sigma) == 0.0:
            return math.inf
        groups.append(
            (check_positive(sigma, name="noise_multiplier"), _check_sample_rate(q), _check_steps(n))
        )
    if not groups:
        return 0.0

    def pld_at(interval: float) -> PrivacyLossDistribution:
        composed = compose(_replace_one_group(s, q, n, interval) for s, q, n in groups)
        assert composed is not None
        return composed

    if value_discretization_interval is not None:
        return pld_epsilon(pld_at(_check_interval(value_discretization_interval)), target)
    # Replace-one losses span at most twice the add/remove ones (both shifts at once).
    span = max(
        2.0 * step_loss_span(mechanism="gaussian", noise_multiplier=s, sample_rate=q)
        for s, q, _ in groups
    )
    return auto_epsilon(pld_at=pld_at, widest_span=span, delta=target)
