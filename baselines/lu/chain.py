"""Lu et al.'s sensitivity chain, as pure functions: rho -> Delta_omega -> Delta_z_T -> Delta_p.

Lu, Asghar, Kaafar, Webb & Dickinson, "A Differentially Private Framework for Deep Learning
with Convexified Loss Functions" (IEEE TIFS 17, 2022), Section 4:

* Theorem 4 / Eq. 15: ``Delta_2 W <= 2 rho / (lambda n)`` for a rho-Lipschitz convex loss and
  a lambda-strongly convex regulariser;
* Eq. 18: ``Delta_omega = 2 rho / (lambda n sqrt(|W|))``, their per-weight sensitivity;
* Corollary 1 / Eq. 19: ``Delta_z_T <= a_u |V_{T-1}| Delta_omega`` for an output logit;
* Corollary 2 / Eq. 20: ``Delta_p = min(exp(2 Delta_z_T) - 1, 1)`` for a softmax output.

The chain the ``lu`` method calibrates with (:func:`sensitivity_chain`) starts from
:func:`lipschitz_bound`, a Lipschitz constant proven on the weight ball the training
projects onto, keeps Eq. 18 and Eq. 19, and bounds Delta_p by ``tanh(Delta_z / 2)``. The
paper's own chain, from their Eq. 21 (which is not a Lipschitz bound), is in
:mod:`baselines.lu.paper`. The steps after rho (Eq. 18, Eq. 19, Theorem 4 for a hidden-layer
network) are the paper's in both and are not proven here: see ``docs/baselines.md`` and the
``lu`` statement. The per-query budget split (their Section 5.3) closes the module.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Literal

from alm_opacus.plugin import check_delta, check_epsilon, check_positive

__all__ = [
    "NOISES",
    "LuBudget",
    "LuSensitivity",
    "NoiseName",
    "budget_split",
    "default_weight_radius",
    "edge_count",
    "lipschitz_bound",
    "logit_sensitivity",
    "output_range",
    "paper_probability_sensitivity",
    "probability_sensitivity",
    "sensitivity_chain",
    "weight_sensitivity",
]

NoiseName = Literal["laplace", "gaussian"]
NOISES: tuple[NoiseName, ...] = ("laplace", "gaussian")


#: Keras's L2 coefficient 0.001 (their Table 4) is lambda in their regulariser 2 lambda ||W||^2.
def _check_count(value: int, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name}={value!r} is invalid: expected an integer >= 1")
    return value


# --- rho ----------------------------------------------------------------------------------------


def lipschitz_bound(*, hidden: int, weight_radius: float, clip_radius: float) -> float:
    """A proven Lipschitz constant ``rho`` of softmax cross-entropy in all weights of the
    bias-free network ``z = W2 sigmoid(W1 x)``, over weights with ``||(W1, W2)||_2 <= B`` and
    inputs with ``||x|| <= R`` (ours; training projects every iterate onto that ball).

    ``d l / d W2 = (p - e_y) h^T`` with ``||p - e_y|| <= sqrt 2`` and ``h in (0, 1)^H``;
    ``d l / d W1 = (sigmoid' * W2^T (p - e_y)) x^T`` with ``sigmoid' <= 1/4`` and
    ``||W2||_op <= B``; so ``rho^2 = 2 H + B^2 R^2 / 8``. The tilted loss's gradient is a
    convex combination of per-example gradients, so ``rho`` bounds it too.

    Raises:
        ValueError: on a non-positive argument.
    """
    _check_count(hidden, "hidden")
    b = check_positive(weight_radius, name="weight_radius")
    r = check_positive(clip_radius, name="clip_radius")
    return math.sqrt(2.0 * hidden + b * b * r * r / 8.0)


def default_weight_radius(*, l2: float, num_classes: int) -> float:
    """``sqrt(ln C / (2 lambda))``: every ``W`` whose objective is at most the objective at
    ``W = 0`` (which is ``ln C``) lies in this ball, since ``2 lambda ||W||^2 <= ln C``."""
    lam = check_positive(l2, name="l2")
    _check_count(num_classes, "num_classes")
    return math.sqrt(math.log(max(num_classes, 2)) / (2.0 * lam))


def output_range(*, hidden: int, weight_radius: float) -> float:
    """A proven bound on ``|z_i - z_j|`` for any two logits of any network in the ball.

    ``z_i - z_j = (w_i - w_j) . h`` with ``||w_i - w_j|| <= sqrt 2 ||W2||_F <= sqrt 2 B`` and
    ``||h|| <= sqrt H`` (sigmoid units): ``sqrt(2 H) B``. It holds whatever the data, so
    ``2 sqrt(2 H) B`` bounds how much a logit difference moves between ANY two data sets.

    Raises:
        ValueError: on a non-positive argument.
    """
    _check_count(hidden, "hidden")
    return math.sqrt(2.0 * hidden) * check_positive(weight_radius, name="weight_radius")


# --- the steps after rho (the paper's) ----------------------------------------------------------


def weight_sensitivity(*, lipschitz: float, n: int, l2: float, num_weights: int) -> float:
    """Lu et al., Eq. 18: ``Delta_omega = 2 rho / (n lambda sqrt(|W|))``.

    ``2 rho / (n lambda)`` bounds the L2 distance between the minimisers on neighbouring data
    sets of a lambda-strongly convex average of rho-Lipschitz losses (their Theorem 4;
    Chaudhuri et al. 2011, Corollary 8). Dividing by ``sqrt(|W|)`` gives the root-mean-square
    change per weight, not a bound on any one weight: a single weight may move by the whole
    L2 bound.

    Args:
        lipschitz: ``rho`` > 0.
        n: data set size >= 1.
        l2: ``lambda`` > 0, with the regulariser written ``2 lambda ||W||^2``.
        num_weights: ``|W|`` >= 1 (their convention: weights only, no biases).

    Returns:
        ``Delta_omega``.

    Raises:
        ValueError: on a non-positive or non-finite argument.
    """
    rho = check_positive(lipschitz, name="lipschitz")
    lam = check_positive(l2, name="l2")
    _check_count(n, "n")
    _check_count(num_weights, "num_weights")
    return 2.0 * rho / (n * lam * math.sqrt(num_weights))


def logit_sensitivity(
    *, weight_sensitivity: float, fan_in: int, activation_bound: float = 1.0
) -> float:
    """Lu et al., Corollary 1 (Eq. 19): ``Delta_z_T = a_u |V_{T-1}| Delta_omega``: the logit
    ``z_T = sum_k w_kT h_k`` moves by at most this when each of its ``fan_in`` weights moves by
    ``Delta_omega`` and every input satisfies ``|h_k| <= a_u`` (inputs held fixed, as there).

    Raises:
        ValueError: on a non-positive argument.
    """
    dw = check_positive(weight_sensitivity, name="weight_sensitivity")
    xt = check_positive(activation_bound, name="activation_bound")
    _check_count(fan_in, "fan_in")
    return fan_in * xt * dw


def probability_sensitivity(*, logit_sensitivity: float) -> float:
    """``Delta_p = tanh(Delta_z / 2)``: the largest change of a softmax output when every
    logit moves by at most ``Delta_z`` (ours; tighter than their Corollary 2).

    ``p_i = sigmoid(z_i - LSE_{j != i} z_j)``; the argument moves by at most ``2 Delta_z``
    (LSE is 1-Lipschitz in the max norm), and ``sup_t sigmoid(t + 2a) - sigmoid(t) =
    sigmoid(a) - sigmoid(-a) = tanh(a / 2)`` at ``a = Delta_z``.

    Raises:
        ValueError: on a non-positive argument.
    """
    return math.tanh(check_positive(logit_sensitivity, name="logit_sensitivity") / 2.0)


def paper_probability_sensitivity(*, logit_sensitivity: float) -> tuple[float, float]:
    """Lu et al., Corollary 2 (Eq. 20): ``(min(exp(2 Delta_z) - 1, 1), exp(2 Delta_z) - 1)``,
    the capped value and the uncapped one Table 6 prints in parentheses. A valid bound, but
    never below :func:`probability_sensitivity` (``exp(2a) - 1 >= 2a >= tanh(a / 2)``).

    Raises:
        ValueError: on a non-positive argument.
    """
    raw = math.expm1(2.0 * check_positive(logit_sensitivity, name="logit_sensitivity"))
    return min(raw, 1.0), raw


# --- the chains -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class LuSensitivity:
    """The chain the method calibrates with, for one network.

    Attributes:
        rho: the Lipschitz constant used.
        delta_omega: per-weight sensitivity (Eq. 18).
        delta_z: sensitivity of one output logit (Eq. 19).
        delta_p: sensitivity of one softmax output (the selection utility).
        num_weights: ``|W|``.
        n: data set size.
        l2: ``lambda``.
    """

    rho: float
    delta_omega: float
    delta_z: float
    delta_p: float
    num_weights: int
    n: int
    l2: float

    def to_dict(self) -> dict[str, float]:
        return asdict(self)


def edge_count(*, input_dim: int, hidden: int, num_classes: int) -> int:
    # Their |W_X|: the edges of the bias-free network input -> hidden -> C.
    return hidden * input_dim + hidden * num_classes


def sensitivity_chain(
    *,
    lipschitz: float,
    n: int,
    l2: float,
    input_dim: int,
    hidden: int,
    num_classes: int,
    activation_bound: float = 1.0,
) -> LuSensitivity:
    """``rho -> Delta_omega -> Delta_z_T -> Delta_p`` (ours: ``tanh``) for a bias-free
    ``input_dim -> hidden -> num_classes`` network, ``|W| = hidden (input_dim + num_classes)``.

    Raises:
        ValueError: on a non-positive argument.
    """
    weights = edge_count(input_dim=input_dim, hidden=hidden, num_classes=num_classes)
    dw = weight_sensitivity(lipschitz=lipschitz, n=n, l2=l2, num_weights=weights)
    dz = logit_sensitivity(weight_sensitivity=dw, fan_in=hidden, activation_bound=activation_bound)
    return LuSensitivity(
        rho=float(lipschitz),
        delta_omega=dw,
        delta_z=dz,
        delta_p=probability_sensitivity(logit_sensitivity=dz),
        num_weights=weights,
        n=n,
        l2=float(l2),
    )


# --- the per-query budget ---------------------------------------------------------------------


@dataclass(frozen=True)
class LuBudget:
    """A per-query budget split.

    Attributes:
        logit: epsilon of the noise on the selected logit: ``epsilon / (2C + 1)`` (Laplace) or
            ``epsilon / sqrt(4C + 1)`` (Gaussian), as in the paper (Section 5.3).
        selection: epsilon of the exponential mechanism: the rest of the budget under the
            paper's rule, ``2C * logit`` (Laplace; sums to epsilon) or ``2 sqrt(C) * logit``
            (Gaussian; squares sum to epsilon^2). This allocation is our reading.
        per_query: what basic composition gives for one query: ``logit + selection``
            (equal to epsilon for Laplace, larger for Gaussian).
        delta: 0 (Laplace) or the Gaussian's delta.
    """

    logit: float
    selection: float
    per_query: float
    delta: float

    def to_dict(self) -> dict[str, float]:
        return asdict(self)


def _laplace_split(epsilon: float, num_classes: int, delta: float) -> LuBudget:
    unit = epsilon / (2 * num_classes + 1)
    return LuBudget(logit=unit, selection=2 * num_classes * unit, per_query=epsilon, delta=0.0)


def _gaussian_split(epsilon: float, num_classes: int, delta: float) -> LuBudget:
    d = check_delta(delta, allow_zero=False)
    unit = epsilon / math.sqrt(4 * num_classes + 1)
    selection = 2 * math.sqrt(num_classes) * unit
    return LuBudget(logit=unit, selection=selection, per_query=unit + selection, delta=d)


_SPLITS: dict[str, Callable[[float, int, float], LuBudget]] = {
    "laplace": _laplace_split,
    "gaussian": _gaussian_split,
}


def budget_split(*, epsilon: float, num_classes: int, noise: str, delta: float = 0.0) -> LuBudget:
    """The paper's per-query budget split (see :class:`LuBudget`).

    Raises:
        ValueError: on a bad epsilon, class count, noise name, or a Gaussian without delta.
    """
    eps = check_epsilon(epsilon)
    _check_count(num_classes, "num_classes")
    if noise not in _SPLITS:
        raise ValueError(f"noise={noise!r} is invalid: expected one of {NOISES}")
    return _SPLITS[noise](eps, num_classes, delta)
