"""DP-SGD's arguments resolved and checked without importing Opacus: the noise mechanisms a
step may use and the clipping bounds, so that a run's plan (and a plugin's registration)
validates them before anything heavy loads (`alm_opacus.training.optimizer` uses them).
"""

from __future__ import annotations

from typing import Any

from alm_opacus._validation import check_positive
from alm_opacus.accounting.subsampled import STEP_PROFILES, available_step_mechanisms
from alm_opacus.mechanisms import AdditiveNoiseMechanism, create_mechanism

__all__ = ["TRAINING_MECHANISMS", "training_mechanism"]

#: The built-in mechanisms a DP-SGD step may use (canonical names; aliases such as
#: ``logistic`` resolve). A step may use every noise law with a step profile
#: (`alm_opacus.noise_laws`): these, and the plugins'.
TRAINING_MECHANISMS = ("alm", "laplace", "gaussian")


def training_mechanism(name: str) -> AdditiveNoiseMechanism:
    """The registered mechanism ``name``, if DP-SGD supports it (its law has a step profile).

    Raises:
        ValueError: if ``name`` is unknown or its law has no DP-SGD step profile.
    """
    mechanism = create_mechanism(name)
    if mechanism.name not in STEP_PROFILES:
        raise ValueError(
            f"noise_mechanism={name!r} is invalid for DP-SGD: expected one of "
            f"{tuple(available_step_mechanisms())} (or the alias 'logistic')"
        )
    return mechanism


def _check_max_grad_norm(max_grad_norm: Any) -> float:
    if isinstance(max_grad_norm, bool) or not isinstance(max_grad_norm, int | float):
        raise ValueError(
            f"max_grad_norm={max_grad_norm!r} is invalid: expected one positive number "
            "(a list of per-parameter budgets needs clipping='per_layer')"
        )
    return check_positive(max_grad_norm, name="max_grad_norm")


def _check_budgets(max_grad_norm: Any) -> list[float]:
    """Per-layer budgets: a non-empty list of positive numbers."""
    if not isinstance(max_grad_norm, list | tuple) or not max_grad_norm:
        raise ValueError(
            f"max_grad_norm={max_grad_norm!r} is invalid with clipping='per_layer': expected "
            "a list of positive budgets, one per trainable parameter"
        )
    return [_check_max_grad_norm(c) for c in max_grad_norm]
