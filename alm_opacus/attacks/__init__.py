"""Membership-inference attacks on releases, and their metrics (threat model: docs/threat_model.md).

Typical use, once per attacker (trainer, configuration and seed), then once per release::

    prepared = prepare_attacks(names=["loss", "lira-offline"], knowledge=k, seed=0)
    results = prepared.attack(AttackTarget(predict=..., features=..., labels=..., ...))
    rows = [r.to_row() for r in results]
"""

from __future__ import annotations

from alm_opacus.attacks.base import (
    AttackConfig,
    AttackerKnowledge,
    AttackKind,
    AttackTarget,
    EpsilonBoundMethod,
    Predictor,
    ShadowDataSource,
    ShadowTrainer,
    ThresholdScope,
)
from alm_opacus.attacks.metrics import (
    advantage,
    best_threshold,
    clopper_pearson,
    epsilon_from_rates,
    epsilon_lower_bound,
    evaluate_attack,
    roc_auc,
    roc_curve,
    tpr_at_fpr,
)
from alm_opacus.attacks.registry import (
    Attack,
    AttackScores,
    ShadowContext,
    TargetQuery,
    attack_class,
    available_attacks,
    register_attack,
)
from alm_opacus.attacks.results import (
    METRIC_COLUMNS,
    TPR_FPR_LEVELS,
    AggregateResult,
    AttackResult,
    EpsilonBound,
    RocCurve,
    aggregate_results,
)
from alm_opacus.attacks.runner import (
    DEFAULT_ATTACKS,
    PreparedAttacks,
    prepare_attacks,
    run_attacks,
)
from alm_opacus.attacks.shadow_data import HeadBank, recipe_trainer

__all__ = [
    "DEFAULT_ATTACKS",
    "METRIC_COLUMNS",
    "TPR_FPR_LEVELS",
    "AggregateResult",
    "Attack",
    "AttackConfig",
    "AttackKind",
    "AttackResult",
    "AttackScores",
    "AttackTarget",
    "AttackerKnowledge",
    "EpsilonBound",
    "EpsilonBoundMethod",
    "HeadBank",
    "Predictor",
    "PreparedAttacks",
    "RocCurve",
    "ShadowContext",
    "ShadowDataSource",
    "ShadowTrainer",
    "TargetQuery",
    "ThresholdScope",
    "advantage",
    "aggregate_results",
    "attack_class",
    "available_attacks",
    "best_threshold",
    "clopper_pearson",
    "epsilon_from_rates",
    "epsilon_lower_bound",
    "evaluate_attack",
    "prepare_attacks",
    "recipe_trainer",
    "register_attack",
    "roc_auc",
    "roc_curve",
    "run_attacks",
    "tpr_at_fpr",
]
