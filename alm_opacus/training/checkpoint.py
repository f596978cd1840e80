"""What a DP-SGD checkpoint records about its noise, and the check that refuses a mismatch.

`PrivacyEngine.save_checkpoint` stores a `TrainingRecord` beside Opacus's entries;
`load_checkpoint` refuses a checkpoint whose mechanism differs from the engine's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from alm_opacus.training.distributed import DistributedMechanismDPOptimizer
from alm_opacus.training.optimizer import MechanismDPOptimizer, training_mechanism

__all__ = ["CheckpointMismatch", "TrainingRecord", "check_same_mechanism", "saved_training"]


class CheckpointMismatch(ValueError):
    """A checkpoint's noise mechanism differs from the engine's; the message names both."""


@dataclass(frozen=True)
class TrainingRecord:
    """What a DP-SGD checkpoint records about how its steps were noised.

    Attributes:
        noise_mechanism: ``"alm"``, ``"laplace"`` or ``"gaussian"``.
        clipping_norm: ``"l1"`` or ``"l2"``, the mechanism's sensitivity norm.
        max_grad_norm: the clipping bound C of one example in that norm.
        max_grad_norms: per-layer budgets, or ``None`` for flat clipping.
        noise_multiplier: σ (the noise scale is σC).
        distributed: whether the steps ran on several processes (noise once per step).
        exact: whether the steps were exact on a grid (absent from older checkpoints, whose
            steps were floating-point).
    """

    noise_mechanism: str
    clipping_norm: str
    max_grad_norm: float
    max_grad_norms: list[float] | None
    noise_multiplier: float
    distributed: bool = False
    exact: bool = False

    @classmethod
    def of(cls, optimizer: MechanismDPOptimizer) -> TrainingRecord:
        """The record of ``optimizer``'s current settings."""
        budgets = optimizer.max_grad_norms
        return cls(
            noise_mechanism=optimizer.noise_mechanism,
            clipping_norm=optimizer.clipping_norm,
            max_grad_norm=float(optimizer.max_grad_norm),
            max_grad_norms=None if budgets is None else [float(c) for c in budgets],
            noise_multiplier=float(optimizer.noise_multiplier),
            distributed=isinstance(optimizer, DistributedMechanismDPOptimizer),
            exact=bool(optimizer.exact),
        )

    def describe(self) -> str:
        """``noise_mechanism='alm' (L1 clipping at C=18, sigma=1)``; a record inferred from
        accountant entries knows no C or σ (NaN) and names the clipping norm only."""
        settings = (
            ""
            if math.isnan(self.max_grad_norm)
            else f" at C={self.max_grad_norm:g}, sigma={self.noise_multiplier:g}"
        )
        return (
            f"noise_mechanism={self.noise_mechanism!r} "
            f"({self.clipping_norm.upper()} clipping{settings})"
        )


def saved_training(checkpoint: dict[str, Any]) -> TrainingRecord | None:
    """The checkpoint's `TrainingRecord`; for one saved without it (older versions, Opacus's
    engine), the only DP-SGD mechanism its accountant entries hold, else ``None``."""
    record = checkpoint.get("training")
    if record is not None:
        try:
            return TrainingRecord(**record)
        except TypeError:
            raise ValueError(f"checkpoint's 'training' record {record!r} is invalid") from None
    state = checkpoint.get("privacy_accountant_state_dict") or {}
    kinds = {s.get("mechanism") for s in state.get("noise_steps", [])}
    if state.get("history"):
        kinds.add("gaussian")
    if len(kinds) != 1:
        return None
    (name,) = kinds
    mechanism = training_mechanism(str(name))
    return TrainingRecord(
        noise_mechanism=mechanism.name,
        clipping_norm=mechanism.norm,
        max_grad_norm=math.nan,
        max_grad_norms=None,
        noise_multiplier=math.nan,
    )


def check_same_mechanism(*, saved: TrainingRecord, current: TrainingRecord, what: str) -> None:
    """Refuse ``saved`` (of ``what``) when its mechanism is not ``current``'s.

    Raises:
        CheckpointMismatch: naming both mechanisms and how to load it.
    """
    if saved.noise_mechanism != current.noise_mechanism:
        raise CheckpointMismatch(
            f"{what} was trained with {saved.describe()}, but this engine's optimizer uses "
            f"{current.describe()}: pass noise_mechanism={saved.noise_mechanism!r} to "
            "make_private before loading it, or start a new engine"
        )
