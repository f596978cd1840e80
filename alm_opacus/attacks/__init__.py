"""Membership-inference attacks on releases, and their metrics (threat model: docs/threat_model.md).

Typical use, once per attacker (trainer, configuration and seed), then once per release::

    prepared = prepare_attacks(names=["loss", "lira-offline"], knowledge=k, seed=0)
    results = prepared.attack(AttackTarget(predict=..., features=..., labels=..., ...))
    rows = [r.to_row() for r in results]

Over the noise draws of one cell: ``aggregate_results(results_of_all_draws,
claimed_epsilon=...)``; the strongest row: ``best_attack(...)``.
"""

from __future__ import annotations

from alm_opacus.attacks.aggregate import aggregate_results, best_attack, pool_epsilon_bounds
from alm_opacus.attacks.base import (
    OPT_IN_ATTACKS,
    SHADOW_DTYPE,
    AttackConfig,
    AttackerKnowledge,
    AttackKind,
    AttackTarget,
    EpsilonBoundMethod,
    LiraLocation,
    Predictor,
    ShadowDataSource,
    ShadowModel,
    ShadowTrainer,
    ThresholdScope,
)
from alm_opacus.attacks.context import ShadowContext
from alm_opacus.attacks.intervals import auc_interval, tpr_intervals
from alm_opacus.attacks.metrics import (
    advantage,
    best_threshold,
    clopper_pearson,
    epsilon_bound_ceiling,
    epsilon_from_rates,
    epsilon_lower_bound,
    evaluate_attack,
    roc_auc,
    roc_curve,
    tpr_at_fpr,
)
from alm_opacus.attacks.registry import (
    PLUGIN_GROUP,
    Attack,
    AttackPluginError,
    AttackScores,
    TargetQuery,
    attack_class,
    available_attacks,
    load_attack_plugins,
    register_attack,
)
from alm_opacus.attacks.results import (
    INTERVAL_COLUMNS,
    METRIC_COLUMNS,
    TPR_FPR_LEVELS,
    AggregateResult,
    AttackResult,
    EpsilonBound,
    RocCurve,
)
from alm_opacus.attacks.runner import (
    CLEAN_SUFFIX,
    DEFAULT_ATTACKS,
    PreparedAttacks,
    prepare_attacks,
    run_attacks,
)
from alm_opacus.attacks.shadow_data import HeadBank, recipe_trainer

__all__ = [
    "CLEAN_SUFFIX",
    "DEFAULT_ATTACKS",
    "INTERVAL_COLUMNS",
    "METRIC_COLUMNS",
    "OPT_IN_ATTACKS",
    "PLUGIN_GROUP",
    "SHADOW_DTYPE",
    "TPR_FPR_LEVELS",
    "AggregateResult",
    "Attack",
    "AttackConfig",
    "AttackKind",
    "AttackPluginError",
    "AttackResult",
    "AttackScores",
    "AttackTarget",
    "AttackerKnowledge",
    "EpsilonBound",
    "EpsilonBoundMethod",
    "HeadBank",
    "LiraLocation",
    "Predictor",
    "PreparedAttacks",
    "RocCurve",
    "ShadowContext",
    "ShadowDataSource",
    "ShadowModel",
    "ShadowTrainer",
    "TargetQuery",
    "ThresholdScope",
    "advantage",
    "aggregate_results",
    "attack_class",
    "auc_interval",
    "available_attacks",
    "best_attack",
    "best_threshold",
    "clopper_pearson",
    "epsilon_bound_ceiling",
    "epsilon_from_rates",
    "epsilon_lower_bound",
    "evaluate_attack",
    "load_attack_plugins",
    "pool_epsilon_bounds",
    "prepare_attacks",
    "recipe_trainer",
    "register_attack",
    "roc_auc",
    "roc_curve",
    "run_attacks",
    "tpr_at_fpr",
    "tpr_intervals",
]
