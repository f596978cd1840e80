"""``lu``: the framework of Lu, Asghar, Kaafar, Webb & Dickinson, "A Differentially Private
Framework for Deep Learning with Convexified Loss Functions" (IEEE TIFS 17, 2022).

A one-hidden-layer network is trained on the convexified loss
``(1/alpha) ln((1/n) sum_i exp(alpha l_i)) + 2 lambda ||W||^2`` (:mod:`baselines.lu.net`). At
each query the exponential mechanism samples one output neuron T, and Laplace (or Gaussian)
noise is added to that one logit only (their Algorithm 1). The noise is calibrated with the
sensitivity chain of :mod:`baselines.lu.chain` (pure functions, starting from a proven
Lipschitz constant); :mod:`baselines.lu.paper` derives their Table 6 from their Eq. 21; and
:mod:`baselines.lu.method` states what is proven: nothing for ``C >= 3``
(``guarantee="none"``), a per-query epsilon for ``C = 2``.
"""

from __future__ import annotations

from baselines.lu.chain import (
    NOISES,
    LuBudget,
    LuSensitivity,
    budget_split,
    default_weight_radius,
    edge_count,
    lipschitz_bound,
    logit_sensitivity,
    output_range,
    paper_probability_sensitivity,
    probability_sensitivity,
    sensitivity_chain,
    weight_sensitivity,
)
from baselines.lu.method import TUNING_GRID, LuMethod, LuOptions, lu_statement
from baselines.lu.net import (
    LuConfig,
    LuMechanism,
    convexified_loss,
    lu_logits,
    lu_query,
    network_chain,
    noise_scale,
    sample_categorical,
    train_lu_net,
    train_lu_nets,
)
from baselines.lu.paper import (
    TABLE6,
    TABLE6_MNIST,
    ChainComparison,
    PaperChain,
    Table6Row,
    compare_chains,
    eq21_counterexample_norm,
    eq21_lipschitz,
    paper_chain,
)

__all__ = [
    "NOISES",
    "TABLE6",
    "TABLE6_MNIST",
    "TUNING_GRID",
    "ChainComparison",
    "LuBudget",
    "LuConfig",
    "LuMechanism",
    "LuMethod",
    "LuOptions",
    "LuSensitivity",
    "PaperChain",
    "Table6Row",
    "budget_split",
    "compare_chains",
    "convexified_loss",
    "default_weight_radius",
    "edge_count",
    "eq21_counterexample_norm",
    "eq21_lipschitz",
    "lipschitz_bound",
    "logit_sensitivity",
    "lu_logits",
    "lu_query",
    "lu_statement",
    "network_chain",
    "noise_scale",
    "output_range",
    "paper_chain",
    "paper_probability_sensitivity",
    "probability_sensitivity",
    "sample_categorical",
    "sensitivity_chain",
    "train_lu_net",
    "train_lu_nets",
    "weight_sensitivity",
]
