"""``dpsgd``: DP-SGD (Abadi et al. 2016, Algorithm 1) on the head, through Opacus; its
logistic and Laplace variants ``dpsgd-alm`` and ``dpsgd-laplace``; and the opt-in
``dpsgd-full`` (encoder and head together).

Modules:

* :mod:`~baselines.dpsgd.config`: the recipe (:class:`DPSGDConfig`), the method options
  (:class:`DPSGDOptions`), the schedule and Opacus's sampling arithmetic;
* :mod:`~baselines.dpsgd.accounting`: sigma for a target (Opacus's search), memoised per run
  and on disk (:class:`SigmaCache`), and the accountant's check after training;
* :mod:`~baselines.dpsgd.loop`: the Opacus loop (:func:`run_opacus`, with a swappable
  :class:`TrainingBackend`) and :func:`fit_private`;
* :mod:`~baselines.dpsgd.head`: the head as Opacus trains it and :func:`train_dpsgd_head`;
* :mod:`~baselines.dpsgd.batched`: the batched re-implementation for the adaptive attacker;
* :mod:`~baselines.dpsgd.method`: the ``dpsgd`` method (tuning, release, statement);
* :mod:`~baselines.dpsgd.mechanisms`: ``dpsgd-alm`` and ``dpsgd-laplace``;
* :mod:`~baselines.dpsgd.full`: ``dpsgd-full``.
"""

from __future__ import annotations

from alm_opacus.plugin import default_delta
from baselines._common import single_thread
from baselines.dpsgd.accounting import (
    SIGMA_CACHE_FILE,
    SigmaCache,
    accountant_epsilon,
    checked_epsilon,
    epochs_match_steps,
)
from baselines.dpsgd.batched import dpsgd_linear_heads, dpsgd_shadow_trainer
from baselines.dpsgd.config import (
    ACCOUNTANTS,
    DEFAULT_ACCOUNTANT,
    TUNING_GRID,
    DPSGDConfig,
    DPSGDOptions,
    DPSGDRecipeOptions,
    check_accountant,
    default_schedule,
    sample_rate_for,
    steps_per_epoch,
)
from baselines.dpsgd.full import (
    FULL_TUNING_GRID,
    DPSGDFullMethod,
    DPSGDFullRun,
    dpsgd_full_finetune,
    private_model,
)
from baselines.dpsgd.head import DPSGDRun, HeadNet, head_size, init_params, train_dpsgd_head
from baselines.dpsgd.loop import (
    ALM_TRAINING,
    OPACUS,
    EngineFactory,
    GeneratorFactory,
    OpacusRun,
    OpacusTraining,
    TrainingBackend,
    fit_private,
    opacus_engine,
    opacus_generators,
    run_opacus,
)
from baselines.dpsgd.mechanisms import (
    DPSGDALMMethod,
    DPSGDLaplaceMethod,
    DPSGDMechanismMethod,
)
from baselines.dpsgd.method import DPSGDMethod, OpacusFit, dpsgd_statement

__all__ = [
    "ACCOUNTANTS",
    "ALM_TRAINING",
    "DEFAULT_ACCOUNTANT",
    "FULL_TUNING_GRID",
    "OPACUS",
    "SIGMA_CACHE_FILE",
    "TUNING_GRID",
    "DPSGDALMMethod",
    "DPSGDConfig",
    "DPSGDFullMethod",
    "DPSGDFullRun",
    "DPSGDLaplaceMethod",
    "DPSGDMechanismMethod",
    "DPSGDMethod",
    "DPSGDOptions",
    "DPSGDRecipeOptions",
    "DPSGDRun",
    "EngineFactory",
    "GeneratorFactory",
    "HeadNet",
    "OpacusFit",
    "OpacusRun",
    "OpacusTraining",
    "SigmaCache",
    "TrainingBackend",
    "accountant_epsilon",
    "check_accountant",
    "checked_epsilon",
    "default_delta",
    "default_schedule",
    "dpsgd_full_finetune",
    "dpsgd_linear_heads",
    "dpsgd_shadow_trainer",
    "dpsgd_statement",
    "epochs_match_steps",
    "fit_private",
    "head_size",
    "init_params",
    "opacus_engine",
    "opacus_generators",
    "private_model",
    "run_opacus",
    "sample_rate_for",
    "single_thread",
    "steps_per_epoch",
    "train_dpsgd_head",
]
