"""DP-SGD calibration: the noise multiplier for a budget, and an L2 clip on the L1 scale.

Opacus and the accountant are imported by the search that needs them, so that importing this
module (a plugin's registration, a run's plan) does not pay Opacus's import.
"""

from __future__ import annotations

import math
from typing import Any

from torch import nn

from alm_opacus import accounting
from alm_opacus._validation import check_delta, check_epsilon
from alm_opacus.training.arguments import _check_max_grad_norm, training_mechanism

__all__ = ["DEFAULT_ACCOUNTANT", "check_epochs", "l1_clip", "noise_multiplier_for"]

DEFAULT_ACCOUNTANT = "alm_pld"


def l1_clip(clip: float, *, params: int | nn.Module) -> float:
    """An L2 clipping bound moved to the L1 scale of a ``params``-coordinate gradient.

    A dense gradient of L2 norm c has L1 norm up to √p·c (Cauchy–Schwarz, equality when all
    p coordinates have equal magnitude), so an L1 clip of √p·c cuts about as much of a
    gradient as the L2 clip c does. Kept at c, an L1 clip shrinks every clipped example by
    about √p more, as if the learning rate were divided by √p (`docs/dpsgd_noise.md`).

    Args:
        clip: the L2 clip c > 0 (e.g. the ``max_grad_norm`` of a Gaussian DP-SGD script).
        params: p, or a module whose trainable parameters are counted.

    Returns:
        √p·c.

    Raises:
        ValueError: on a non-positive clip or a count below 1.
    """
    count = (
        sum(p.numel() for p in params.parameters() if p.requires_grad)
        if isinstance(params, nn.Module)
        else params
    )
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise ValueError(f"params={params!r} is invalid: expected a module or an integer ≥ 1")
    return _check_max_grad_norm(clip) * math.sqrt(count)


def check_epochs(epochs: Any) -> int:
    """``epochs`` if it is an integer ≥ 1.

    Raises:
        ValueError: naming the value otherwise.
    """
    if isinstance(epochs, bool) or not isinstance(epochs, int) or epochs < 1:
        raise ValueError(f"epochs={epochs!r} is invalid: expected an integer ≥ 1")
    return epochs


def noise_multiplier_for(
    *,
    accountant: Any,
    target_epsilon: float,
    target_delta: float,
    sample_rate: float,
    steps: int,
    noise_mechanism: str = "gaussian",
    dim: int | None = None,
    epsilon_tolerance: float = 0.01,
) -> float:
    """The noise multiplier for ``steps`` more steps, given what ``accountant`` holds.

    With a `PipelineAccountant` the search composes the new steps with everything already
    recorded (DP-SGD steps and releases), via `find_noise_multiplier(prior=accountant)`.
    Opacus's own accountants account for Gaussian noise only and cannot add a prior to
    Opacus's search, so they are accepted only empty and only for ``gaussian``.

    Args:
        accountant: the engine's accountant.
        target_epsilon: total ε after the new steps, > 0.
        target_delta: δ in (0, 1).
        sample_rate: Poisson rate the accountant will record.
        steps: number of new steps ≥ 1.
        noise_mechanism: the mechanism of the new steps.
        dim: noised coordinates per step (the optimizer's ``noise_dim``), as the hook
            records them.
        epsilon_tolerance: how far below the target the search may stop.

    Returns:
        σ (noise scale over ``max_grad_norm``).

    Raises:
        InfeasibleBudget: if the recorded budget leaves no σ that meets the target.
        ValueError: on an accountant that cannot account for the request, or bad input.
    """
    from opacus.accountants.utils import get_noise_multiplier

    mechanism = training_mechanism(noise_mechanism).name
    epsilon, delta = check_epsilon(target_epsilon), check_delta(target_delta)
    if isinstance(accountant, accounting.PipelineAccountant):
        return float(
            accounting.find_noise_multiplier(
                target_epsilon=epsilon,
                target_delta=delta,
                sample_rate=sample_rate,
                steps=steps,
                mechanism=mechanism,
                prior=accountant,
                epsilon_tolerance=epsilon_tolerance,
                dim=dim,
            )
        )
    name = accountant.mechanism()
    if mechanism != "gaussian":
        raise ValueError(
            f"accountant={name!r} accounts for Gaussian noise only; noise_mechanism="
            f"{noise_mechanism!r} needs accountant={DEFAULT_ACCOUNTANT!r}"
        )
    if len(accountant) > 0:
        raise ValueError(
            f"accountant={name!r} already holds {len(accountant)} steps, and Opacus's search "
            f"cannot count them; use accountant={DEFAULT_ACCOUNTANT!r} to calibrate the total"
        )
    return float(
        get_noise_multiplier(
            target_epsilon=epsilon,
            target_delta=delta,
            sample_rate=sample_rate,
            steps=steps,
            accountant=name,
            epsilon_tolerance=epsilon_tolerance,
        )
    )
