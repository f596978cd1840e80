"""alm_opacus: post-training and during-training privacy protections, attacked alike.

Importing the package registers the ``alm_pld`` accountant into Opacus's registry, so
``opacus.PrivacyEngine(accountant="alm_pld")`` works after ``import alm_opacus``.
"""

from __future__ import annotations

from alm_opacus import accounting as _accounting  # noqa: F401  (registers "alm_pld")
from alm_opacus import posthoc as _posthoc  # noqa: F401  (registers alm, laplace, gaussian)
from alm_opacus.accounting import ACCOUNTANT_NAME, PipelineAccountant
from alm_opacus.mechanisms import (
    AdditiveNoiseMechanism,
    available_mechanisms,
    create_mechanism,
    make_generator,
    register_mechanism,
)
from alm_opacus.protect import (
    Guarantee,
    PostTrainingPrivacyEngine,
    PrivacyStatement,
    ProtectedModule,
    SensitivityInfo,
)

__version__ = "0.1.0"

__all__ = [
    "ACCOUNTANT_NAME",
    "AdditiveNoiseMechanism",
    "Guarantee",
    "PipelineAccountant",
    "PostTrainingPrivacyEngine",
    "PrivacyStatement",
    "ProtectedModule",
    "SensitivityInfo",
    "available_mechanisms",
    "create_mechanism",
    "make_generator",
    "register_mechanism",
]
