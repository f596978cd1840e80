"""DP-SGD with a choice of noise mechanism (ALM, Laplace, Gaussian) inside Opacus.

``from alm_opacus.training import PrivacyEngine`` and ``make_private(...,
noise_mechanism="alm")`` switch an Opacus training loop to logistic noise, on one process or,
with a ``DifferentiallyPrivateDistributedDataParallel`` / ``DistributedDataParallel`` module,
on several (`alm_opacus.training.distributed`). The ``alm_pld`` accountant is in Opacus's
registry whenever Opacus is imported after ``import alm_opacus`` (or before it), so plain
``opacus.PrivacyEngine(accountant="alm_pld")`` works once ``alm_opacus`` is imported.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from alm_opacus._lazy import lazy_exports

if TYPE_CHECKING:
    from alm_opacus.training.arguments import TRAINING_MECHANISMS, training_mechanism
    from alm_opacus.training.calibration import DEFAULT_ACCOUNTANT, l1_clip, noise_multiplier_for
    from alm_opacus.training.checkpoint import CheckpointMismatch, TrainingRecord
    from alm_opacus.training.clipping import clip_factors, l1_row_norms, per_sample_norms
    from alm_opacus.training.distributed import DistributedMechanismDPOptimizer
    from alm_opacus.training.engine import PrivacyEngine
    from alm_opacus.training.optimizer import MechanismDPOptimizer
    from alm_opacus.training.sampler import (
        SecureDistributedPoissonSampler,
        SecureDPDataLoader,
        SecurePoissonSampler,
        poisson_mask,
    )

# Each name imports its module on first use (PEP 562): the engine, the optimizer and the
# samplers import Opacus; the mechanism and calibration checks a plan makes do not.
_EXPORTS = {
    "TRAINING_MECHANISMS": "alm_opacus.training.arguments",
    "training_mechanism": "alm_opacus.training.arguments",
    "DEFAULT_ACCOUNTANT": "alm_opacus.training.calibration",
    "l1_clip": "alm_opacus.training.calibration",
    "noise_multiplier_for": "alm_opacus.training.calibration",
    "CheckpointMismatch": "alm_opacus.training.checkpoint",
    "TrainingRecord": "alm_opacus.training.checkpoint",
    "clip_factors": "alm_opacus.training.clipping",
    "l1_row_norms": "alm_opacus.training.clipping",
    "per_sample_norms": "alm_opacus.training.clipping",
    "DistributedMechanismDPOptimizer": "alm_opacus.training.distributed",
    "PrivacyEngine": "alm_opacus.training.engine",
    "MechanismDPOptimizer": "alm_opacus.training.optimizer",
    "SecureDPDataLoader": "alm_opacus.training.sampler",
    "SecureDistributedPoissonSampler": "alm_opacus.training.sampler",
    "SecurePoissonSampler": "alm_opacus.training.sampler",
    "poisson_mask": "alm_opacus.training.sampler",
}
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)

__all__ = [
    "DEFAULT_ACCOUNTANT",
    "TRAINING_MECHANISMS",
    "CheckpointMismatch",
    "DistributedMechanismDPOptimizer",
    "MechanismDPOptimizer",
    "PrivacyEngine",
    "SecureDPDataLoader",
    "SecureDistributedPoissonSampler",
    "SecurePoissonSampler",
    "TrainingRecord",
    "clip_factors",
    "l1_clip",
    "l1_row_norms",
    "noise_multiplier_for",
    "per_sample_norms",
    "poisson_mask",
    "training_mechanism",
]
