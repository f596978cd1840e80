"""Privacy accounting: dp_accounting PLDs of our mechanisms, and one budget for a pipeline.

Importing this package registers `PipelineAccountant` in Opacus's accountant registry under
``"alm_pld"``, so that ``opacus.PrivacyEngine(accountant="alm_pld")`` works; `register`
does the same explicitly (idempotent). ``docs/accounting.md`` documents the profiles, the
proofs behind them and the measured agreement with Opacus's accountants.
"""

from __future__ import annotations

from alm_opacus.accounting.accountant import ACCOUNTANT_NAME, PipelineAccountant, register
from alm_opacus.accounting.calibration import (
    MAX_TARGET_EPSILON,
    InfeasibleBudget,
    find_noise_multiplier,
)
from alm_opacus.accounting.comparison import compare_accountants
from alm_opacus.accounting.neighbouring import (
    ADD_REMOVE,
    NEIGHBOURING_RELATIONS,
    REPLACE_ONE,
    epsilon_replace_one,
    to_replace_one,
)
from alm_opacus.accounting.pld import (
    DEFAULT_VALUE_DISCRETIZATION_INTERVAL,
    LogisticPrivacyLoss,
    compose,
    dpsgd_pld,
    register_release_pld,
    release_pld,
)
from alm_opacus.accounting.subsampled import (
    pure_subsampled_delta,
    register_step_profile,
    step_pld,
)

__all__ = [
    "ACCOUNTANT_NAME",
    "ADD_REMOVE",
    "DEFAULT_VALUE_DISCRETIZATION_INTERVAL",
    "MAX_TARGET_EPSILON",
    "NEIGHBOURING_RELATIONS",
    "REPLACE_ONE",
    "InfeasibleBudget",
    "LogisticPrivacyLoss",
    "PipelineAccountant",
    "compare_accountants",
    "compose",
    "dpsgd_pld",
    "epsilon_replace_one",
    "find_noise_multiplier",
    "pure_subsampled_delta",
    "register",
    "register_release_pld",
    "register_step_profile",
    "release_pld",
    "step_pld",
    "to_replace_one",
]
