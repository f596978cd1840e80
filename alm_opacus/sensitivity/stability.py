"""Proven sensitivity of a linear head trained by full-batch gradient descent (derivation:
docs/sensitivity.md, "Stability of full-batch gradient descent").

The recipe: multinomial logistic regression on features clipped to ``||x|| <= R``, objective
``F_D(w) = (1/n) sum_{z in D} l(w; z) + (lambda/2) ||w||^2`` over ``w = [W, b]``, and ``T``
steps ``w_{t+1} = w_t - eta grad F_D(w_t)`` from an initialisation that does not depend on
the data (``solver="gd"`` of :mod:`alm_opacus.heads`).

* ``L = sqrt(2 (R^2 + 1))`` bounds ``||grad l||`` (:func:`.analytic.softmax_ce_lipschitz`);
  ``beta = (R^2 + 1) / 2`` bounds the Hessian of ``l``: it is ``(diag(p) - p p^T) (x) x~ x~^T``,
  and ``||diag(p) - p p^T|| <= max_k 2 p_k (1 - p_k) <= 1/2`` (Gershgorin).
* The step map ``G_D(w) = w - eta grad F_D(w)`` is ``rho``-Lipschitz with
  ``rho = max(|1 - eta lambda|, |1 - eta (beta + lambda)|)``: its Jacobian ``I - eta H`` has
  ``lambda I <= H <= (beta + lambda) I``, integrated along the segment (mean value theorem).
  This is Hardt, Recht & Singer (ICML 2016), Lemmas 3.6 and 3.7, in the sharper spectral
  form: ``rho <= 1`` iff ``eta <= 2 / (beta + lambda)``, and ``rho = 1 - eta lambda`` iff
  ``eta <= 2 / (beta + 2 lambda)``.
* Neighbours (replace one row, or remove one: both give ``||grad F_D - grad F_D'|| <= 2L/n``
  at every ``w``, ``n`` the larger size) satisfy ``d_{t+1} <= rho d_t + 2 eta L / n`` with
  ``d_0 = 0`` (same initialisation; Hardt et al., Lemma 2.5 and Theorem 3.8, deterministic here
  because the batch is the whole data set), so after ``T`` steps
  ``||w_T - w'_T|| <= (2 eta L / n) sum_{s<T} rho^s`` (``= 2 eta L T / n`` when ``lambda = 0``
  and ``eta <= 2 / beta``; ``< 2 L / (lambda n)``, the converged head's bound, when
  ``lambda > 0`` and ``eta <= 2 / (beta + 2 lambda)``).
* Floating point: the trained weights are the *computed* iterates ``w^_{t+1} = G_D(w^_t) + e_t``.
  ``GradientDescentLoop.step_rounding`` bounds ``||e_t||`` from the standard model of floating-point
  arithmetic (Higham, *Accuracy and Stability of Numerical Algorithms*, 2nd ed., Sec. 2.2 and
  Lemma 3.1 / Eq. (3.5) for inner products, ``gamma_k = k u / (1 - k u)``), so computed
  neighbours satisfy ``d_{t+1} <= rho d_t + 2 eta L / n + 2 e_t``. The one assumption beyond
  IEEE 754 is that ``exp`` is accurate to :data:`EXP_ULPS` units in the last place (SLEEF's
  ``u10`` kernels that PyTorch vectorises on CPU, glibc and CUDA's ``exp`` are within 1 ulp).
* L1: ``||v||_1 <= sqrt(P) ||v||_2`` for ``P = C (d + 1)`` parameters. Gradient descent is not
  non-expansive in L1, so the L2 recursion is the proof; the factor is tight only for a
  difference spread evenly over all ``P`` coordinates (docs/sensitivity.md measures the gap).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from alm_opacus._validation import check_integer, check_positive
from alm_opacus.sensitivity.analytic import ADJACENCIES
from alm_opacus.statement import SensitivityInfo

__all__ = [
    "EXP_ULPS",
    "UNIT_ROUNDOFF",
    "GradientDescentLoop",
    "StabilitySensitivity",
    "softmax_ce_smoothness",
    "stability_sensitivity",
]

#: Unit roundoff ``u`` of each head dtype (round to nearest: half the machine epsilon).
UNIT_ROUNDOFF = {"float64": 2.0**-53, "float32": 2.0**-24}
#: Assumed accuracy of ``exp`` in units in the last place (1 ulp <= 2u relative).
EXP_ULPS = 4
#: The largest ``u * |logit|`` the rounding analysis accepts (it linearises ``exp(u a) - 1``).
_MAX_LOGIT_ROUNDOFF = 1e-2
#: Slack on the bound's own float arithmetic (a few hundred operations, each rounded).
_ARITHMETIC_SLACK = 1.0 + 1e-12


def _gamma(k: int, u: float) -> float:
    """Higham's ``gamma_k = k u / (1 - k u)`` (Lemma 3.1), the relative error of k roundings."""
    if k * u >= 0.5:
        raise ValueError(f"gamma_{k} with u={u:g} is undefined here: expected k u < 1/2")
    return k * u / (1.0 - k * u)


def softmax_ce_smoothness(*, clip_radius: float) -> float:
    """``beta = (R^2 + 1) / 2``: the largest eigenvalue of softmax cross-entropy's Hessian in
    ``[W, b]`` on features of norm at most ``R`` (module docstring).

    Raises:
        ValueError: if ``clip_radius`` is not a finite number > 0.
    """
    r = check_positive(clip_radius, name="clip_radius")
    return 0.5 * (r * r + 1.0)


@dataclass(frozen=True)
class GradientDescentLoop:
    """The computed training loop the bound covers: :func:`alm_opacus.heads.train_heads` with
    ``solver="gd"`` on a linear head (derivation: docs/sensitivity.md).

    Attributes:
        lr: ``eta``.
        l2: ``lambda``.
        clip_radius: ``R``.
        rows: the number of rows the gradient sums over (mask entries, zero weights too).
        num_features: ``d``.
        num_classes: ``C``.
        unit_roundoff: ``u`` of the training dtype (:data:`UNIT_ROUNDOFF`).
    """

    lr: float
    l2: float
    clip_radius: float
    rows: int
    num_features: int
    num_classes: int
    unit_roundoff: float

    @property
    def radius(self) -> float:
        """A bound on ``||(x^, 1)||`` for computed clipped features ``x^``: clipping divides
        by a computed norm (``gamma_{d+1}``) and rounds twice more."""
        u = self.unit_roundoff
        return math.hypot(self.clip_radius * (1.0 + _gamma(self.num_features + 4, u)), 1.0)

    @property
    def lipschitz(self) -> float:
        return math.sqrt(2.0) * self.radius

    @property
    def contraction(self) -> float:
        """``rho = max(|1 - eta lambda|, |1 - eta (beta + lambda)|)``, ``beta`` from the rounded
        clipping radius (the computed features are the data the proof covers)."""
        beta = 0.5 * self.radius**2
        return max(abs(1.0 - self.lr * self.l2), abs(1.0 - self.lr * (beta + self.l2)))

    def step_rounding(self, weight_norm: float) -> float:
        """A bound on ``||w^_{t+1} - G_D(w^_t)||_2``, the rounding error of one computed step
        from weights of Frobenius norm at most ``weight_norm`` (weights and biases).

        Raises:
            ValueError: when the logits can be so large that the analysis does not apply.
        """
        u, r, c = self.unit_roundoff, self.radius, self.num_classes
        logit = weight_norm * r  # |z_k| <= ||W~_k|| ||x~||: |z_k - max z| <= 2 weight_norm R~
        if 2.0 * logit * u > _MAX_LOGIT_ROUNDOFF:
            raise ValueError(
                f"weights of norm up to {weight_norm:.3g} give logits too large for the "
                f"rounding bound (u |z| = {2 * logit * u:.3g} > {_MAX_LOGIT_ROUNDOFF:g}): "
                "expected a smaller step size, fewer steps or a float64 head"
            )
        # logits z = W~ x~: d + 1 products summed (Higham Eq. (3.5)); softmax is 1/2-Lipschitz
        logits_error = 0.5 * _gamma(self.num_features + 1, u) * weight_norm * r
        # softmax of the computed logits: subtract the max, exp, sum of C, divide; the weights
        # p_k |z_k - max| <= 1/e keep the argument's rounding small (docs/sensitivity.md)
        c_exp = 2 * EXP_ULPS * u
        denominator = 1.02 * (c * u / math.e + c_exp + _gamma(c, u))
        numerator = 1.02 * (c * u / math.e + c_exp + u)
        softmax_error = (numerator + denominator) / (1.0 - denominator)
        proba_error = logits_error + softmax_error  # ||p^ - p||_2 <= ||p^ - p||_1
        residual = math.sqrt(2.0) + proba_error  # ||p^ - e_y||
        # (p^ - e_y) * w_i: two roundings and the weight's division; then the n + 1 term sums
        # of addmm (n products and beta * W~, one more rounding for beta)
        grad_error = (
            proba_error * r
            + _gamma(3, u) * residual * r
            + _gamma(self.rows + 2, u)
            * ((1.0 + _gamma(3, u)) * residual * r + self.l2 * weight_norm)
        )
        grad_norm = self.lipschitz + self.l2 * weight_norm + grad_error
        # w + (-eta) g: a product and a sum, each rounded (or one fused multiply-add)
        update_error = 2.0 * u * (1.0 + u) * (weight_norm + self.lr * grad_norm)
        return (self.lr * grad_error + update_error) * _ARITHMETIC_SLACK

    def rounding(self, *, steps: int) -> float:
        """``sum_t rho^(T-1-t) e_t``: how far the computed weights after ``T`` steps can be
        from the exact-arithmetic iterates on the same data (the float term of the sensitivity
        is twice this, one trajectory per neighbour). The start's entries are in
        ``[-1/sqrt(d), 1/sqrt(d)]`` (:func:`alm_opacus.heads.uniform_init`), and a step maps
        ``||w||`` to at most ``|1 - eta lambda| ||w|| + eta L + e_t``."""
        u, d = self.unit_roundoff, self.num_features
        norm = math.sqrt(self.num_classes * (d + 1) / d) * (1.0 + 4.0 * u)
        rho, total = self.contraction, 0.0
        for _ in range(steps):
            e = self.step_rounding(norm)
            total = rho * total + e
            norm = abs(1.0 - self.lr * self.l2) * norm + self.lr * self.lipschitz + e
            norm *= _ARITHMETIC_SLACK
        return total * _ARITHMETIC_SLACK


@dataclass(frozen=True)
class StabilitySensitivity:
    """The proven sensitivity of ``T`` full-batch gradient-descent steps (module docstring).

    Attributes:
        value_l2: ``(2 eta L / n) sum_{s<T} rho^s + 2 sum_t rho^(T-1-t) e_t``.
        value_l1: ``sqrt(P) * value_l2``.
        exact_l2: the exact-arithmetic part, ``(2 eta L / n) sum_{s<T} rho^s``.
        rounding_l2: the floating-point part, ``2 sum_t rho^(T-1-t) e_t``.
        lipschitz: ``L`` (with the clipping's rounding).
        smoothness: ``beta`` of the loss (with the clipping's rounding).
        contraction: ``rho``.
        steps: ``T``.
        lr: ``eta``.
        l2: ``lambda``.
        clip_radius: ``R``.
        n: data set size (replace-one: both sets; remove-one: the larger one).
        num_params: ``P = C (d + 1)``.
        dtype: the training dtype the rounding term covers.
        adjacency: ``"replace-one"`` or ``"remove-one"``.
    """

    value_l2: float
    value_l1: float
    exact_l2: float
    rounding_l2: float
    lipschitz: float
    smoothness: float
    contraction: float
    steps: int
    lr: float
    l2: float
    clip_radius: float
    n: int
    num_params: int
    dtype: str
    adjacency: str

    def to_info(self, norm: str = "l2") -> SensitivityInfo:
        """The :class:`~alm_opacus.statement.SensitivityInfo` (``source="analytic"``: proven).

        Raises:
            ValueError: on an unknown norm.
        """
        if norm not in ("l1", "l2"):
            raise ValueError(f"norm={norm!r} is invalid: expected 'l1' or 'l2'")
        return SensitivityInfo(
            value=self.value_l2 if norm == "l2" else self.value_l1,
            norm=norm,
            source="analytic",  # type: ignore[arg-type]  # coerced to the enum in __post_init__
            adjacency=self.adjacency,
            derivation=(
                f"proven for T={self.steps} full-batch gradient-descent steps of eta={self.lr:g}"
                f" from a data-independent start, lambda={self.l2:g}, features clipped to "
                f"R={self.clip_radius:g}: uniform stability (Hardt, Recht & Singer 2016), "
                f"{self.dtype} rounding included (docs/sensitivity.md)"
                + ("" if norm == "l2" else "; L1 = sqrt(P) x L2")
            ),
        )


def stability_sensitivity(
    *,
    n: int,
    steps: int,
    lr: float,
    l2: float,
    clip_radius: float,
    num_features: int,
    num_classes: int,
    dtype: str = "float64",
    adjacency: str = "replace-one",
) -> StabilitySensitivity:
    """The sensitivity of the linear head after ``steps`` full-batch gradient-descent steps
    (module docstring), floating-point rounding of the training loop included.

    Args:
        n: data set size; for remove-one pairs, the larger set's.
        steps: ``T`` >= 1.
        lr: ``eta`` > 0 (any; ``rho > 1`` when ``eta > 2 / (beta + 2 lambda)`` makes the bound
            grow geometrically, which is proven but useless).
        l2: ``lambda`` >= 0.
        clip_radius: ``R`` > 0, the feature clipping radius.
        num_features: ``d``.
        num_classes: ``C``.
        dtype: the training dtype, ``"float64"`` or ``"float32"``.
        adjacency: ``"replace-one"`` or ``"remove-one"``; the constant is the same.

    Returns:
        A :class:`StabilitySensitivity`.

    Raises:
        ValueError: on a value outside its range, or weights that can grow beyond the range the
            rounding analysis covers.
    """
    for number, name in ((n, "n"), (steps, "steps"), (num_features, "num_features")):
        check_integer(number, name=name)
    check_integer(num_classes, name="num_classes")
    if num_classes < 2:
        raise ValueError(f"num_classes={num_classes!r} is invalid: expected an integer >= 2")
    eta = check_positive(lr, name="lr")
    if not (math.isfinite(l2) and l2 >= 0):
        raise ValueError(f"l2={l2!r} is invalid: expected a finite number >= 0")
    check_positive(clip_radius, name="clip_radius")
    if dtype not in UNIT_ROUNDOFF:
        raise ValueError(f"dtype={dtype!r} is invalid: expected one of {sorted(UNIT_ROUNDOFF)}")
    if adjacency not in ADJACENCIES:
        raise ValueError(f"adjacency={adjacency!r} is invalid: expected one of {ADJACENCIES}")
    loop = GradientDescentLoop(
        lr=eta,
        l2=float(l2),
        clip_radius=float(clip_radius),
        rows=n + 1,  # a remove-one pair trained with masks over the larger set's n rows, or a
        num_features=num_features,  # replace-one pair with masks over the n + 1 rows
        num_classes=num_classes,
        unit_roundoff=UNIT_ROUNDOFF[dtype],
    )
    rho, lip = loop.contraction, loop.lipschitz
    # sum_{s<T} rho^s, without cancellation near rho = 1
    geometric = float(steps) if rho == 1.0 else -math.expm1(steps * math.log(rho)) / (1.0 - rho)
    exact = 2.0 * eta * lip / n * geometric * _ARITHMETIC_SLACK
    rounding = 2.0 * loop.rounding(steps=steps)
    value = (exact + rounding) * _ARITHMETIC_SLACK
    num_params = num_classes * (num_features + 1)
    return StabilitySensitivity(
        value_l2=value,
        value_l1=math.sqrt(num_params) * value * _ARITHMETIC_SLACK,
        exact_l2=exact,
        rounding_l2=rounding,
        lipschitz=lip,
        smoothness=0.5 * loop.radius**2,
        contraction=rho,
        steps=int(steps),
        lr=eta,
        l2=float(l2),
        clip_radius=float(clip_radius),
        n=int(n),
        num_params=num_params,
        dtype=dtype,
        adjacency=adjacency,
    )
