"""Sensitivity of a trained head: sampled (ALM paper, Algorithm 2) or analytic (convex head).

See docs/sensitivity.md for the adjacency each value covers and the derivations.
"""

from __future__ import annotations

from alm_opacus.sensitivity.analytic import (
    ADJACENCIES,
    AnalyticSensitivity,
    analytic_sensitivity,
    softmax_ce_lipschitz,
)
from alm_opacus.sensitivity.convex import (
    DEFAULT_TOL,
    ConvexFit,
    FeatureBasis,
    feature_basis,
    train_convex_heads,
)
from alm_opacus.sensitivity.population import (
    draw_population_pairs,
    population_chunk,
    population_pair_rows,
    sample_population_sensitivity,
)
from alm_opacus.sensitivity.random_dp import (
    gamma_for_confidence,
    marginal_gamma,
    order_for_confidence,
    sampler_confidence,
    sampler_failure_probability,
)
from alm_opacus.sensitivity.sampler import (
    SOLVERS,
    SamplerRecipe,
    SensitivitySample,
    default_chunk_size,
    draw_pairs,
    removal_chunk,
    sample_sensitivity,
    sample_sensitivity_sequential,
)

__all__ = [
    "ADJACENCIES",
    "DEFAULT_TOL",
    "SOLVERS",
    "AnalyticSensitivity",
    "ConvexFit",
    "FeatureBasis",
    "SamplerRecipe",
    "SensitivitySample",
    "analytic_sensitivity",
    "default_chunk_size",
    "draw_pairs",
    "draw_population_pairs",
    "feature_basis",
    "gamma_for_confidence",
    "marginal_gamma",
    "order_for_confidence",
    "population_chunk",
    "population_pair_rows",
    "removal_chunk",
    "sample_population_sensitivity",
    "sample_sensitivity",
    "sample_sensitivity_sequential",
    "sampler_confidence",
    "sampler_failure_probability",
    "softmax_ce_lipschitz",
    "train_convex_heads",
]
