"""DP-SGD with a choice of noise mechanism (ALM, Laplace, Gaussian) inside Opacus.

``from alm_opacus.training import PrivacyEngine`` and ``make_private(...,
noise_mechanism="alm")`` switch an Opacus training loop to logistic noise, on one process or,
with a ``DifferentiallyPrivateDistributedDataParallel`` / ``DistributedDataParallel`` module,
on several (`alm_opacus.training.distributed`). Importing this
package registers the ``alm_pld`` accountant in Opacus's registry (through
`alm_opacus.accounting`); plain ``opacus.PrivacyEngine(accountant="alm_pld")`` needs
``import alm_opacus.accounting`` first.
"""

from __future__ import annotations

import alm_opacus.accounting  # noqa: F401  (registers the "alm_pld" accountant into Opacus)
from alm_opacus.training.distributed import DistributedMechanismDPOptimizer
from alm_opacus.training.engine import (
    DEFAULT_ACCOUNTANT,
    CheckpointMismatch,
    PrivacyEngine,
    TrainingRecord,
    l1_clip,
    noise_multiplier_for,
)
from alm_opacus.training.optimizer import (
    TRAINING_MECHANISMS,
    MechanismDPOptimizer,
    clip_factors,
    l1_row_norms,
    per_sample_norms,
    training_mechanism,
)
from alm_opacus.training.sampler import (
    SecureDistributedPoissonSampler,
    SecureDPDataLoader,
    SecurePoissonSampler,
    poisson_mask,
)

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
