"""What `PrivacyEngine.make_private` refuses, checked before anything is modified."""

from __future__ import annotations

import math
import warnings
from typing import Any

from opacus.distributed import DifferentiallyPrivateDistributedDataParallel as DPDDP
from opacus.optimizers.utils import params
from torch import distributed as dist
from torch import nn, optim
from torch.distributed._composable.fsdp import FSDPModule
from torch.nn.parallel import DistributedDataParallel as DDP

from alm_opacus.accounting import PipelineAccountant
from alm_opacus.training.calibration import DEFAULT_ACCOUNTANT
from alm_opacus.training.checkpoint import CheckpointMismatch, TrainingRecord
from alm_opacus.training.distributed import distributed_world
from alm_opacus.training.optimizer import _check_budgets, _check_max_grad_norm, training_mechanism

__all__ = ["MAKE_PRIVATE_ARGUMENTS", "check_request", "warn_small_l1_clip"]

_UNSUPPORTED_GRAD_SAMPLE_MODES = ("ghost", "ghost_fsdp")

#: Keyword arguments of ``opacus.PrivacyEngine.make_private`` that `PrivacyEngine` passes on;
#: any other is refused (Opacus would hand it to the optimizer, which ignores it).
_PASSED_ON = frozenset({"batch_first", "loss_reduction", "wrap_model", "rand_on_empty"})

#: ``make_private_with_epsilon``'s keyword arguments that ``make_private`` takes by name.
MAKE_PRIVATE_ARGUMENTS = frozenset(
    {"criterion", "poisson_sampling", "clipping", "noise_generator", "grad_sample_mode", "exact"}
)

#: Refused modes, with the reason the message gives.
_REFUSED_CLIPPING = {
    "adaptive": (
        "adaptive clipping (Andrew et al. 2021) spends part of the budget on a noisy count "
        "of clipped examples, which Opacus accounts by splitting one Gaussian's budget "
        "between two Gaussian queries; no such split is proven here for logistic or Laplace "
        "noise, and the alm_pld accountant does not record the count query. For Gaussian "
        "noise use opacus.PrivacyEngine, whose accountant knows it"
    ),
}

# An L1 clip C cuts a dense p-coordinate gradient as an L2 clip of C / sqrt(p) does; below
# this, that is smaller than the L2 clips DP-SGD is usually run with (0.1 to a few). Warned
# only from this many parameters on (sqrt(p) >= 10), where the two scales differ much.
_SMALLEST_L2_EQUIVALENT = 0.1
_MANY_PARAMETERS = 100


def check_request(
    *,
    accountant: Any,
    training: TrainingRecord | None,
    module: nn.Module,
    optimizer: optim.Optimizer,
    noise_mechanism: str,
    max_grad_norm: Any,
    poisson_sampling: bool,
    clipping: str,
    grad_sample_mode: str,
    extra: dict[str, Any],
    warn: bool = True,
) -> str:
    """Validate a ``make_private`` request before anything is modified.

    Args:
        accountant: the engine's accountant.
        training: the record of a checkpoint loaded into the engine, if any.
        module, optimizer, noise_mechanism, max_grad_norm, poisson_sampling, clipping,
            grad_sample_mode: as passed to ``make_private``.
        extra: the other keyword arguments of ``make_private``.
        warn: whether to warn about a lone-rank distributed run and a small L1 clip.

    Returns:
        The canonical mechanism name.

    Raises:
        ValueError: naming the refused argument and why; CheckpointMismatch for a mechanism
            other than the loaded checkpoint's.
    """
    unknown = sorted(set(extra) - _PASSED_ON)
    if unknown:
        raise ValueError(
            f"make_private got unexpected keyword argument(s) {unknown}: Opacus would pass "
            "them to the optimizer, which ignores them; expected only "
            f"{sorted(MAKE_PRIVATE_ARGUMENTS | _PASSED_ON)}"
        )
    mechanism = training_mechanism(noise_mechanism)
    if mechanism.name != "gaussian" and not isinstance(accountant, PipelineAccountant):
        raise ValueError(
            f"accountant={accountant.mechanism()!r} accounts for Gaussian noise only; "
            f"noise_mechanism={noise_mechanism!r} needs accountant={DEFAULT_ACCOUNTANT!r}"
        )
    if poisson_sampling is not True:
        raise ValueError(
            f"poisson_sampling={poisson_sampling!r} is invalid: the accounting assumes "
            "Poisson sampling, so it must be True (shuffled fixed-size batches can be "
            "far less private than a Poisson accountant says: Chua et al. 2024)"
        )
    if clipping in _REFUSED_CLIPPING:
        raise ValueError(f"clipping={clipping!r} is refused: {_REFUSED_CLIPPING[clipping]}")
    if clipping not in ("flat", "per_layer"):
        raise ValueError(f"clipping={clipping!r} is invalid: expected 'flat' or 'per_layer'")
    if clipping == "per_layer":
        _check_budgets(max_grad_norm)
    else:
        _check_max_grad_norm(max_grad_norm)
    if grad_sample_mode in _UNSUPPORTED_GRAD_SAMPLE_MODES:
        raise ValueError(
            f"grad_sample_mode={grad_sample_mode!r} is refused: ghost clipping never forms "
            "per-sample gradients; it computes their L2 norms from activations and "
            "backpropagated gradients and clips inside the loss (Opacus's "
            "DPLossFastGradientClipping), so there is no L1 norm to clip and no step "
            "where this engine's noise is added; expected 'hooks', 'ew' or 'functorch'"
        )
    if isinstance(module, FSDPModule):
        raise ValueError(
            f"module of type {type(module).__name__} is refused: FSDP shards every "
            "parameter over the ranks, so no rank holds a whole per-sample gradient; its "
            "norm needs an all-reduce of per-rank partial norms inside clipping (Opacus's "
            "FSDPOptimizer does it for L2), which is not implemented here. Wrap the model "
            "in DifferentiallyPrivateDistributedDataParallel or DistributedDataParallel"
        )
    if isinstance(module, DPDDP | DDP):
        distributed_world()  # raises if torch.distributed is not initialised
    elif warn and dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        warnings.warn(
            f"torch.distributed runs {dist.get_world_size()} processes but module of type "
            f"{type(module).__name__} is not wrapped for them: each rank will train its "
            "own model on the whole dataset with its own noise and accountant, and "
            "wrapping the returned module in DPDDP afterwards does not synchronise the "
            "steps. To train one model on all ranks, wrap the model in "
            "DifferentiallyPrivateDistributedDataParallel (or DistributedDataParallel) "
            "before make_private",
            stacklevel=3,
        )
    if training is not None and training.noise_mechanism != mechanism.name:
        raise CheckpointMismatch(
            f"this engine holds a checkpoint trained with {training.describe()}, "
            f"but make_private asks for noise_mechanism={mechanism.name!r}: pass "
            f"noise_mechanism={training.noise_mechanism!r}, or start a new engine"
        )
    if warn and mechanism.norm == "l1" and clipping == "flat":
        warn_small_l1_clip(max_grad_norm, optimizer=optimizer)
    return mechanism.name


def warn_small_l1_clip(max_grad_norm: float, *, optimizer: optim.Optimizer) -> None:
    """Warn when an L1 clip is L2-sized for many parameters (p ≥ 100 and C / √p < 0.1)."""
    count = sum(p.numel() for p in params(optimizer))
    if count >= _MANY_PARAMETERS and max_grad_norm / math.sqrt(count) < _SMALLEST_L2_EQUIVALENT:
        warnings.warn(
            f"max_grad_norm={max_grad_norm:g} is an L1 clip over {count} parameters: it cuts a "
            f"dense gradient as an L2 clip of {max_grad_norm / math.sqrt(count):.3g} would, "
            "and training may barely move. An L2 clip c moves to the L1 scale as "
            f"sqrt(p)*c: max_grad_norm=l1_clip(c, params=model) ({math.sqrt(count):.4g}*c "
            "here; docs/dpsgd_noise.md)",
            stacklevel=4,
        )
