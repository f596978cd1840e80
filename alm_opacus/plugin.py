"""The public API for plugins: methods, datasets, attacks and noise laws written outside
``alm_opacus``.

A plugin package registers through an entry point group (``alm_opacus.methods``,
``alm_opacus.datasets``, ``alm_opacus.attacks``, ``alm_opacus.noise_laws``; see
``docs/api.md``) and imports from this
module, or from the ``__all__`` of a public module (``alm_opacus.mechanisms``,
``alm_opacus.training``, ``alm_opacus.posttraining.engine``, ...). It never imports a private module
(``alm_opacus._*``) or a name outside an ``__all__``: those may change without notice. The
``baselines`` package is held to this in CI (ruff's banned-api in ``baselines/ruff.toml`` and
``tests/test_plugin_api.py``), so it is an honest example of what a plugin can do.

What is here:

- the base classes and registration of each extension point (``Method``, ``Attack``,
  ``DatasetSpec`` and their ``register_*``), and the generic :class:`Registry`;
- :func:`cli_option`, for a method option with a command-line flag of its own;
- a noise law: the record ``NoiseLaw`` and ``register_noise_law``, with the types of its
  parts (the mechanism's base classes, ``CellLaw``, ``StepProfile``, ``ClaimRule``), and
  ``PostTrainingMethod``, whose subclass with ``mechanism = "<law>"`` is the harness's
  post-training method for it;
- the input checks the core uses, so that a plugin's errors read like the core's;
- seeds and digests: stable seeds from labels, digests of tensors, payloads and code (cache
  keys that change with the code that produced them);
- the head recipe's building blocks a method that releases a head needs, the statement
  types, and atomic writes.
"""

from __future__ import annotations

from alm_opacus._hashing import code_digest, content_digest, derive_seed, tensor_digest
from alm_opacus._validation import (
    check_delta,
    check_epsilon,
    check_features_labels,
    check_positive,
    default_delta,
)
from alm_opacus.accounting.subsampled import StepProfile
from alm_opacus.attacks import SHADOW_DTYPE, Attack, AttackConfig, register_attack
from alm_opacus.claims import ClaimRule
from alm_opacus.data import DatasetSpec, register_dataset, register_dataset_spec
from alm_opacus.heads import (
    Head,
    HeadConfig,
    Params,
    batched_logits,
    clip_features,
    flat_params,
    linear_init,
    uniform_init,
)
from alm_opacus.io import StaleCacheWarning, atomic_write_json
from alm_opacus.mechanisms import AdditiveNoiseMechanism, PureAdditiveNoiseMechanism
from alm_opacus.mechanisms.cell_laws import CellLaw
from alm_opacus.mechanisms.sampling import standard_normal
from alm_opacus.methods import (
    AttackerFactory,
    InfeasibleRelease,
    InputKind,
    Method,
    MethodContext,
    MethodOptions,
    Predict,
    Release,
    ReleaseRequest,
    ShadowTrainer,
    TrainingNoise,
    cli_option,
    register_method,
)
from alm_opacus.noise_laws import NoiseLaw, register_noise_law
from alm_opacus.posttraining.engine import (
    FLOAT_NOTE,
    Guarantee,
    PrivacyStatement,
    SensitivityInfo,
    SensitivitySource,
)
from alm_opacus.posttraining.method import PostTrainingMethod, clean_shadow_heads, convex_config
from alm_opacus.registry import Registry, UnknownName, load_entry_points

__all__ = [
    "FLOAT_NOTE",
    "SHADOW_DTYPE",
    "AdditiveNoiseMechanism",
    "Attack",
    "AttackConfig",
    "AttackerFactory",
    "CellLaw",
    "ClaimRule",
    "DatasetSpec",
    "Guarantee",
    "Head",
    "HeadConfig",
    "InfeasibleRelease",
    "InputKind",
    "Method",
    "MethodContext",
    "MethodOptions",
    "NoiseLaw",
    "Params",
    "PostTrainingMethod",
    "Predict",
    "PrivacyStatement",
    "PureAdditiveNoiseMechanism",
    "Registry",
    "Release",
    "ReleaseRequest",
    "SensitivityInfo",
    "SensitivitySource",
    "ShadowTrainer",
    "StaleCacheWarning",
    "StepProfile",
    "TrainingNoise",
    "UnknownName",
    "atomic_write_json",
    "batched_logits",
    "check_delta",
    "check_epsilon",
    "check_features_labels",
    "check_positive",
    "clean_shadow_heads",
    "cli_option",
    "clip_features",
    "code_digest",
    "content_digest",
    "convex_config",
    "default_delta",
    "derive_seed",
    "flat_params",
    "linear_init",
    "load_entry_points",
    "register_attack",
    "register_dataset",
    "register_dataset_spec",
    "register_method",
    "register_noise_law",
    "standard_normal",
    "tensor_digest",
    "uniform_init",
]
