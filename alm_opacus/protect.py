"""The public entry point of post-training protection: ``from alm_opacus.protect import ...``.

The code lives in :mod:`alm_opacus.posttraining` (the engine, the released module and its
file, the ledger, and the harness's post-training method); this module names what a user
imports, so that the path quoted in the README and the docs stays the same.
"""

from __future__ import annotations

from alm_opacus.posttraining.engine import (
    FLOAT_NOTE,
    NEIGHBOURING,
    NOISE_SOURCES,
    RELEASE_KIND,
    Guarantee,
    LedgerRecord,
    LedgerTotal,
    PostTrainingPrivacyEngine,
    PrivacyStatement,
    ProtectedModule,
    SensitivityInfo,
    SensitivitySource,
    statement_for,
)

__all__ = [
    "FLOAT_NOTE",
    "NEIGHBOURING",
    "NOISE_SOURCES",
    "RELEASE_KIND",
    "Guarantee",
    "LedgerRecord",
    "LedgerTotal",
    "PostTrainingPrivacyEngine",
    "PrivacyStatement",
    "ProtectedModule",
    "SensitivityInfo",
    "SensitivitySource",
    "statement_for",
]
