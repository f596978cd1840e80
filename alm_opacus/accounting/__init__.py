"""Privacy accounting: dp_accounting PLDs of our mechanisms, and one budget for a pipeline.

Importing this package registers `PipelineAccountant` in Opacus's accountant registry under
``"alm_pld"``, so that ``opacus.PrivacyEngine(accountant="alm_pld")`` works.
"""

from __future__ import annotations

from alm_opacus.accounting.accountant import ACCOUNTANT_NAME, PipelineAccountant
from alm_opacus.accounting.pld import (
    DEFAULT_VALUE_DISCRETIZATION_INTERVAL,
    LogisticPrivacyLoss,
    compose,
    dpsgd_pld,
    register_release_pld,
    release_pld,
)

__all__ = [
    "ACCOUNTANT_NAME",
    "DEFAULT_VALUE_DISCRETIZATION_INTERVAL",
    "LogisticPrivacyLoss",
    "PipelineAccountant",
    "compose",
    "dpsgd_pld",
    "register_release_pld",
    "release_pld",
]
