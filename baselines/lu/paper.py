"""Lu et al.'s own chain, from their Proposition 1 (Eq. 21), and their Table 6.

Eq. 21: ``rho <= (C - 1) prod_{t=0}^{T-1} sqrt(|V_t|) x_t / (C |V_{T-1}|)``, with ``x_t`` the
largest absolute neuron value at layer ``t`` (measured on the training set, Section 5.2).
Their Table 6 follows from it through Eq. 18, Eq. 19 and Corollary 2
(:mod:`baselines.lu.chain`); :func:`paper_chain` derives it from the architecture and their
hyper-parameters alone. Eq. 21 is not a Lipschitz bound (:func:`eq21_counterexample_norm`),
so the ``lu`` method does not calibrate with it; :func:`compare_chains` shows both chains.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from alm_opacus.plugin import check_positive
from baselines.lu.chain import (
    LuSensitivity,
    _check_count,
    default_weight_radius,
    edge_count,
    lipschitz_bound,
    logit_sensitivity,
    output_range,
    paper_probability_sensitivity,
    sensitivity_chain,
    weight_sensitivity,
)

__all__ = [
    "PAPER_HIDDEN",
    "PAPER_L2",
    "TABLE6",
    "TABLE6_MNIST",
    "ChainComparison",
    "PaperChain",
    "Table6Row",
    "compare_chains",
    "eq21_counterexample_norm",
    "eq21_lipschitz",
    "paper_chain",
]

#: Keras's L2 coefficient 0.001 (their Table 4) is lambda in their regulariser 2 lambda ||W||^2.
PAPER_L2 = 0.0005
#: Hidden units of their network (Table 4): one tanh layer of 128.
PAPER_HIDDEN = 128


@dataclass(frozen=True)
class Table6Row:
    """One row of Lu et al.'s Table 6 with the inputs it is derived from.

    Attributes:
        dataset: their name.
        n: training records (Table 3; the test set has the same size, Section 5.3).
        input_dim: ``|V_0|``, features (Table 3).
        num_classes: ``C`` (Table 3).
        rho, delta_omega, delta_z, delta_p, delta_p_uncapped: the printed values (four
            decimals; ``delta_p_uncapped`` is their parenthesised ``exp(2 Delta_z_T) - 1``).
    """

    dataset: str
    n: int
    input_dim: int
    num_classes: int
    rho: float
    delta_omega: float
    delta_z: float
    delta_p: float
    delta_p_uncapped: float


#: Lu et al. (2022), Table 6, with their Table 3's n, features and classes. Hidden width 128
#: and lambda 0.0005 (Table 4) are shared by every row. The Purchase rows are left out: with
#: |V_0| = 600 features Eq. 21 gives rho = 1.0825 for Purchase-2 where they print 1.0771 (their
#: rho fits |V_0| x_0^2 = 594), and neither 600 nor 594 gives their Delta_z_T = 0.2000 (0.1997).
TABLE6: dict[str, Table6Row] = {
    row.dataset: row
    for row in (
        Table6Row("US Adult", 10_000, 14, 2, 0.1654, 0.0015, 0.1871, 0.4538, 0.4538),
        Table6Row("MNIST", 10_000, 784, 10, 2.2274, 0.0028, 0.3577, 1.0, 1.0450),
        Table6Row("Location", 1_200, 446, 30, 1.8044, 0.0244, 3.1190, 1.0, 510.8338),
        Table6Row("CIFAR-10", 10_000, 3_072, 10, 4.4091, 0.0028, 0.3594, 1.0, 1.0520),
        Table6Row("CIFAR-100", 10_000, 3_072, 100, 4.8500, 0.0030, 0.3897, 1.0, 1.1802),
        Table6Row("Texas Hospital", 10_000, 6_169, 100, 6.8729, 0.0031, 0.3928, 1.0, 1.1937),
    )
}
#: The MNIST row as plain data (kept for callers of the earlier module).
TABLE6_MNIST: dict[str, float] = {
    "l2": PAPER_L2,
    "n": 10_000,
    "input_dim": 784,
    "hidden": PAPER_HIDDEN,
    "num_classes": 10,
    "x_t": 1.0,
    "rho": 2.2274,
    "delta_omega": 0.0028,
    "delta_z": 0.3577,
    "delta_p": 1.0,
}


def eq21_lipschitz(
    *, layer_sizes: Sequence[int], activation_bounds: Sequence[float], num_classes: int
) -> float:
    """Lu et al.'s Proposition 1 (Eq. 21): ``(C - 1) prod_t sqrt(|V_t|) x_t / (C |V_{T-1}|)``.

    Their network has layers ``V_0`` (the input) to ``V_T`` (the C logits); the product runs
    over ``t = 0 .. T-1``, the input and hidden layers, and ``|V_{T-1}|`` is the last hidden
    layer's width. ``x_t`` is the largest absolute neuron value at layer ``t``, which the
    paper measures on the training set (Section 5.2), so this rho is empirical. It is also
    not a Lipschitz bound (see :func:`eq21_counterexample_norm`); it is implemented to
    reproduce their Table 6, not to calibrate noise.

    Args:
        layer_sizes: ``(|V_0|, ..., |V_{T-1}|)``: input width, then each hidden width.
        activation_bounds: ``(x_0, ..., x_{T-1})``, same length.
        num_classes: ``C`` = ``|V_T|``.

    Returns:
        Their rho.

    Raises:
        ValueError: on empty or mismatched sequences or non-positive values.
    """
    if not layer_sizes or len(layer_sizes) != len(activation_bounds):
        raise ValueError(
            f"layer_sizes={tuple(layer_sizes)!r} and activation_bounds="
            f"{tuple(activation_bounds)!r}: expected equal, non-empty lengths"
        )
    sizes = [_check_count(v, "layer size") for v in layer_sizes]
    bounds = [check_positive(x, name="activation bound") for x in activation_bounds]
    c = _check_count(num_classes, "num_classes")
    product = math.prod(math.sqrt(v) * x for v, x in zip(sizes, bounds, strict=True))
    return (c - 1) * product / (c * sizes[-1])


def eq21_counterexample_norm(*, hidden: int, num_classes: int) -> float:
    """A per-example gradient norm that Eq. 21 must bound and does not.

    Their network with the output weights at zero answers ``p = 1/C`` for every class, and the
    gradient of the cross-entropy in the output weights is ``(p - e_y) h^T``. With tanh units
    saturated at ``|h_k| = 1`` (their ``x_1 = 1``), its norm is ``sqrt((C - 1) / C) sqrt(H)``:
    10.73 for MNIST's H = 128, C = 10, against their rho = 2.2274. (The gradient in the first
    layer only adds to it.) Lemma 5's ``1/|V|`` factor, inherited by Eq. 21, is the error:
    the one-layer gradient ``(p - e_y) x^T`` has norm up to ``sqrt 2 ||x||``.

    Raises:
        ValueError: on non-positive arguments.
    """
    h = _check_count(hidden, "hidden")
    c = _check_count(num_classes, "num_classes")
    return math.sqrt((c - 1) / c) * math.sqrt(h)


@dataclass(frozen=True)
class PaperChain:
    """Lu et al.'s own chain (the columns of their Table 6).

    Attributes:
        rho: Eq. 21 with the given (empirical) ``x_t``.
        delta_omega: Eq. 18.
        delta_z: Eq. 19.
        delta_p: Corollary 2, capped at 1.
        delta_p_uncapped: ``exp(2 Delta_z_T) - 1``.
    """

    rho: float
    delta_omega: float
    delta_z: float
    delta_p: float
    delta_p_uncapped: float

    def to_dict(self) -> dict[str, float]:
        return asdict(self)


def paper_chain(
    *,
    n: int,
    input_dim: int,
    num_classes: int,
    hidden: int = PAPER_HIDDEN,
    l2: float = PAPER_L2,
    activation_bounds: tuple[float, float] = (1.0, 1.0),
) -> PaperChain:
    """Their Table 6 for a one-hidden-layer network: Eq. 21, Eq. 18, Eq. 19, Corollary 2.

    Args:
        n: training records.
        input_dim: ``|V_0|``.
        num_classes: ``C``.
        hidden: ``|V_1| = |V_{T-1}|`` (T = 2: input, hidden, output).
        l2: ``lambda`` of ``2 lambda ||W||^2``.
        activation_bounds: ``(x_0, x_1)``: the largest absolute input value and hidden value
            (1 and 1 for their [0, 1] inputs and tanh units; measured in the paper).

    Raises:
        ValueError: on a non-positive argument.
    """
    rho = eq21_lipschitz(
        layer_sizes=(input_dim, hidden),
        activation_bounds=activation_bounds,
        num_classes=num_classes,
    )
    num_weights = edge_count(input_dim=input_dim, hidden=hidden, num_classes=num_classes)
    dw = weight_sensitivity(lipschitz=rho, n=n, l2=l2, num_weights=num_weights)
    # a_u = the bound of the hidden activation, their x_{T-1}.
    dz = logit_sensitivity(
        weight_sensitivity=dw, fan_in=hidden, activation_bound=activation_bounds[-1]
    )
    capped, raw = paper_probability_sensitivity(logit_sensitivity=dz)
    return PaperChain(rho=rho, delta_omega=dw, delta_z=dz, delta_p=capped, delta_p_uncapped=raw)


@dataclass(frozen=True)
class ChainComparison:
    """Both chains for one setting (for ``mnist`` and the docs).

    Attributes:
        paper: Lu et al.'s chain from Eq. 21.
        ours: the chain the ``lu`` method calibrates with (proven rho on the weight ball).
        weight_radius: ``B`` of the ball.
        eq21_counterexample: a gradient norm Eq. 21's rho fails to bound.
        output_range: :func:`output_range`, the proven bound on a logit difference.
    """

    paper: PaperChain
    ours: LuSensitivity
    weight_radius: float
    eq21_counterexample: float
    output_range: float

    def to_dict(self) -> dict[str, Any]:
        return {
            "paper": self.paper.to_dict(),
            "ours": self.ours.to_dict(),
            "weight_radius": self.weight_radius,
            "eq21_counterexample": self.eq21_counterexample,
            "output_range": self.output_range,
        }


def compare_chains(
    *,
    n: int,
    input_dim: int,
    hidden: int,
    num_classes: int,
    l2: float,
    clip_radius: float = 1.0,
    weight_radius: float | None = None,
) -> ChainComparison:
    """The paper's chain and ours for the same ``(n, d, H, C, lambda)``.

    Args:
        n: members.
        input_dim: ``d`` (features).
        hidden: ``H``.
        num_classes: ``C``.
        l2: ``lambda``.
        clip_radius: ``R``, the features' L2 bound (ours; the paper's inputs lie in [0, 1]).
        weight_radius: ``B``; default :func:`default_weight_radius`.

    Raises:
        ValueError: on a non-positive argument.
    """
    radius = (
        default_weight_radius(l2=l2, num_classes=num_classes)
        if weight_radius is None
        else check_positive(weight_radius, name="weight_radius")
    )
    rho = lipschitz_bound(hidden=hidden, weight_radius=radius, clip_radius=clip_radius)
    return ChainComparison(
        paper=paper_chain(n=n, input_dim=input_dim, num_classes=num_classes, hidden=hidden, l2=l2),
        ours=sensitivity_chain(
            lipschitz=rho, n=n, l2=l2, input_dim=input_dim, hidden=hidden, num_classes=num_classes
        ),
        weight_radius=radius,
        eq21_counterexample=eq21_counterexample_norm(hidden=hidden, num_classes=num_classes),
        output_range=output_range(hidden=hidden, weight_radius=radius),
    )
