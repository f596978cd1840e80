"""Privacy accounting: dp_accounting PLDs of our mechanisms, and one budget for a pipeline.

`PipelineAccountant` is registered in Opacus's accountant registry under ``"alm_pld"`` as soon
as Opacus is imported after ``import alm_opacus`` (at once if it already was), so that
``opacus.PrivacyEngine(accountant="alm_pld")`` works; `register` does the same explicitly
(idempotent). The names that need Opacus (the accountant, its calibration, the comparison)
import on first use (PEP 562), so that a run's start (its plan, a resume's checks) does not pay
Opacus's import. ``docs/accounting.md`` documents the profiles, the
proofs behind them and the measured agreement with Opacus's accountants.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from alm_opacus._lazy import lazy_exports
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

if TYPE_CHECKING:
    from alm_opacus.accounting.accountant import ACCOUNTANT_NAME, PipelineAccountant, register
    from alm_opacus.accounting.calibration import (
        MAX_TARGET_EPSILON,
        InfeasibleBudget,
        find_noise_multiplier,
    )
    from alm_opacus.accounting.comparison import compare_accountants

#: The names whose modules import Opacus -> that module.
_OPACUS_EXPORTS = {
    "ACCOUNTANT_NAME": "alm_opacus.accounting.accountant",
    "PipelineAccountant": "alm_opacus.accounting.accountant",
    "register": "alm_opacus.accounting.accountant",
    "MAX_TARGET_EPSILON": "alm_opacus.accounting.calibration",
    "InfeasibleBudget": "alm_opacus.accounting.calibration",
    "find_noise_multiplier": "alm_opacus.accounting.calibration",
    "compare_accountants": "alm_opacus.accounting.comparison",
}
__getattr__, __dir__ = lazy_exports(__name__, _OPACUS_EXPORTS)

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
