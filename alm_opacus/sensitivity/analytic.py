"""Analytic sensitivity of the convex head (derivation: docs/sensitivity.md).

The head: multinomial logistic regression, features clipped to ``||x|| <= R``, objective
``F_D(w) = (1/n) sum_{z in D} l(w; z) + (lambda/2) ||w||^2`` over weights *and* biases,
trained until ``||grad F_D(w)|| <= tol`` (:func:`.convex.train_convex_heads`).

* Lipschitz constant of softmax cross-entropy in ``w = [W, b]``: ``grad l = (p - e_y) x~^T``
  with ``x~ = (x, 1)``, ``||p - e_y||_2 <= sqrt(2)``, ``||x~|| <= sqrt(R^2 + 1)``, so
  ``L = sqrt(2 (R^2 + 1))``.
* Exact minimisers (Chaudhuri, Monteleoni & Sarwate, JMLR 12, 2011, Sec. 3: Theorem 6 via
  Corollary 8, with their ``Lambda N(f)`` our ``lambda``-strongly convex penalty; the proof
  is repeated in docs/sensitivity.md with our constants): neighbours move the
  minimiser by at most ``2L / (n lambda)``, for replace-one at size ``n`` and for
  remove-one between sizes ``n`` and ``n - 1`` alike.
* Trained weights: strong convexity gives ``||w - w*|| <= ||grad F(w)|| / lambda``; both
  heads of a pair are within ``tol / lambda`` of their minimisers, adding ``2 tol / lambda``.
* L1: ``||v||_1 <= sqrt(P) ||v||_2`` for ``P`` parameters.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from alm_opacus._validation import check_integer, check_positive
from alm_opacus.statement import SensitivityInfo

__all__ = ["ADJACENCIES", "AnalyticSensitivity", "analytic_sensitivity", "softmax_ce_lipschitz"]

ADJACENCIES = ("replace-one", "remove-one")


def softmax_ce_lipschitz(*, clip_radius: float) -> float:
    """``sqrt(2 (R^2 + 1))``: Lipschitz constant in ``[W, b]`` of softmax cross-entropy on
    features of norm at most ``R`` (the 1 is the bias's constant feature).

    Raises:
        ValueError: if ``clip_radius`` is not a finite number > 0.
    """
    r = check_positive(clip_radius, name="clip_radius")
    return math.sqrt(2.0 * (r * r + 1.0))


@dataclass(frozen=True)
class AnalyticSensitivity:
    """An analytic sensitivity bound for the convex head.

    Attributes:
        value_l2: the L2 bound ``2L/(n l2) + 2 grad_tol / l2``.
        value_l1: ``sqrt(num_params) * value_l2``, or None when ``num_params`` is unknown.
        lipschitz: ``L``.
        optimisation_error: ``2 grad_tol / l2``, the part covering inexact training.
        n: data set size (replace-one: both sets; remove-one: the larger one).
        l2: the regularisation coefficient ``lambda``.
        clip_radius: ``R``.
        grad_tol: the gradient-norm bound the trainer guarantees on every data set.
        num_params: number of parameters ``C (d + 1)``, or None.
        adjacency: ``"replace-one"`` or ``"remove-one"``.
    """

    value_l2: float
    value_l1: float | None
    lipschitz: float
    optimisation_error: float
    n: int
    l2: float
    clip_radius: float
    grad_tol: float
    num_params: int | None
    adjacency: str

    def to_info(self, norm: str = "l2") -> SensitivityInfo:
        """The :class:`~alm_opacus.posttraining.engine.SensitivityInfo` (``source="analytic"``).

        Raises:
            ValueError: on an unknown norm, or ``"l1"`` without ``num_params``.
        """
        if norm not in ("l1", "l2"):
            raise ValueError(f"norm={norm!r} is invalid: expected 'l1' or 'l2'")
        value = self.value_l2 if norm == "l2" else self.value_l1
        if value is None:
            raise ValueError("norm='l1' needs num_params; pass it to analytic_sensitivity")
        return SensitivityInfo(
            value=value,
            norm=norm,
            source="analytic",  # type: ignore[arg-type]  # coerced to the enum in __post_init__
            adjacency=self.adjacency,
        )


def analytic_sensitivity(
    *,
    n: int,
    l2: float,
    clip_radius: float,
    grad_tol: float,
    num_params: int | None = None,
    adjacency: str = "replace-one",
) -> AnalyticSensitivity:
    """The sensitivity bound of the convex head (module docstring).

    Args:
        n: data set size; for the sampler's ``d \\ d_i`` pairs that is ``len(d) - 1``.
        l2: ``lambda`` > 0, the L2 coefficient over all parameters (``HeadConfig.l2``).
        clip_radius: ``R``, the feature clipping radius (``HeadConfig.clip_radius``).
        grad_tol: a bound on ``||grad F_D(w)||_2`` at the trained weights that holds for
            *every* data set, neighbours included: the trainer's stopping tolerance
            (``ConvexFit.tol``), not one head's measured norm. 0 for exact minimisers.
        num_params: ``C (d + 1)``, for the L1 bound.
        adjacency: ``"replace-one"`` or ``"remove-one"``; the constant is the same.

    Returns:
        An :class:`AnalyticSensitivity`.

    Raises:
        ValueError: on ``n < 1``, non-positive ``l2`` or ``clip_radius``, negative or NaN
            ``grad_tol``, ``num_params < 1``, or an unknown adjacency.
    """
    check_integer(n, name="n")
    lam = check_positive(l2, name="l2")
    lip = softmax_ce_lipschitz(clip_radius=clip_radius)
    if not (math.isfinite(grad_tol) and grad_tol >= 0):
        raise ValueError(f"grad_tol={grad_tol!r} is invalid: expected a finite number >= 0")
    if num_params is not None:
        check_integer(num_params, name="num_params")
    if adjacency not in ADJACENCIES:
        raise ValueError(f"adjacency={adjacency!r} is invalid: expected one of {ADJACENCIES}")
    opt = 2.0 * float(grad_tol) / lam
    value = 2.0 * lip / (n * lam) + opt
    return AnalyticSensitivity(
        value_l2=value,
        value_l1=None if num_params is None else math.sqrt(num_params) * value,
        lipschitz=lip,
        optimisation_error=opt,
        n=n,
        l2=lam,
        clip_radius=float(clip_radius),
        grad_tol=float(grad_tol),
        num_params=num_params,
        adjacency=adjacency,
    )
