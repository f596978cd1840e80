"""alm_opacus: post-training and during-training privacy protections, attacked alike.

The package imports lazily, so that ``alm-opacus --help`` and other light uses start without
torch: the names below load their module on first use (PEP 562). ``import alm_opacus`` still
registers the ``alm_pld`` accountant into Opacus's registry, as soon as Opacus is imported
(right away if it already is), so ``opacus.PrivacyEngine(accountant="alm_pld")`` works after
``import alm_opacus``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from alm_opacus._lazy import after_import, lazy_exports
from alm_opacus.registry import declare_builtins

if TYPE_CHECKING:
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

#: public name -> the module that defines it
_EXPORTS = {
    "ACCOUNTANT_NAME": "alm_opacus.accounting",
    "PipelineAccountant": "alm_opacus.accounting",
    "AdditiveNoiseMechanism": "alm_opacus.mechanisms",
    "available_mechanisms": "alm_opacus.mechanisms",
    "create_mechanism": "alm_opacus.mechanisms",
    "make_generator": "alm_opacus.mechanisms",
    "register_mechanism": "alm_opacus.mechanisms",
    "Guarantee": "alm_opacus.protect",
    "PostTrainingPrivacyEngine": "alm_opacus.protect",
    "PrivacyStatement": "alm_opacus.protect",
    "ProtectedModule": "alm_opacus.protect",
    "SensitivityInfo": "alm_opacus.protect",
}

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


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)

# Importing alm_opacus.accounting.accountant registers "alm_pld" in Opacus: once Opacus loads.
after_import("opacus", "alm_opacus.accounting.accountant")
# The built-in noise laws register as plugins do, through their entry point group: a lookup
# in `alm_opacus.mechanisms` or `alm_opacus.accounting` then loads them without naming the
# module above it that assembles them.
declare_builtins("alm_opacus.noise_laws", "alm_opacus.noise_laws")
