"""Helpers shared by the baselines: seeds, the tuning budget, and public-data splits.

Tuning protocol (docs/baselines.md, "Fair tuning"): every baseline tries at most
:data:`TUNING_BUDGET` configurations at each epsilon. Each is trained on a subset of the
*public* split of the members' size, with the privacy mechanism at the target epsilon, and
scored by its accuracy on the rest of the public split. Members, non-members and the
attacker's pool are never looked at, so the choice costs no privacy budget.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import torch
from torch import Tensor

from alm_opacus._hashing import derive_seed, tensor_digest
from alm_opacus.methods import MethodContext

__all__ = [
    "TUNING_BUDGET",
    "TUNING_DRAWS",
    "PublicSplit",
    "TuningResult",
    "derive_seed",
    "public_split",
    "select_config",
    "tensor_digest",
]

#: Configurations every baseline may try per epsilon (the equal tuning budget).
TUNING_BUDGET = 4
#: Independent noise draws averaged per configuration when scoring it.
TUNING_DRAWS = 2
#: The validation part must hold at least this many rows, else tuning is skipped.
MIN_VALIDATION = 20

T = TypeVar("T")


@dataclass(frozen=True)
class PublicSplit:
    """Public rows for tuning: ``train`` has the members' size, ``validation`` the rest."""

    train_features: Tensor
    train_labels: Tensor
    validation_features: Tensor
    validation_labels: Tensor


def public_split(
    *, context: MethodContext, n: int, seed: int, inputs: Tensor | None = None
) -> PublicSplit | None:
    """Split the public data into a training part of ``n`` rows and a validation part.

    Args:
        context: holds ``public_features`` and ``public_labels``.
        n: the members' size; training on as many rows makes the noise level match.
        seed: seeds the permutation.
        inputs: rows to split instead of the public features, aligned with them (e.g.
            ``context.public_images``); the split is the same either way.

    Returns:
        The split, or None when there is no public data or fewer than ``n + 20`` rows.
    """
    x = context.public_features if inputs is None else inputs
    y = context.public_labels
    if inputs is not None and y is not None and len(inputs) != len(y):
        raise ValueError(f"inputs has {len(inputs)} rows but the public labels {len(y)}")
    if x is None or y is None or len(x) < n + MIN_VALIDATION:
        return None
    g = torch.Generator().manual_seed(derive_seed("public-split", seed, n) % 2**63)
    perm = torch.randperm(len(x), generator=g)
    tr, va = perm[:n], perm[n:]
    return PublicSplit(x[tr], y[tr], x[va], y[va])


@dataclass(frozen=True)
class TuningResult:
    """What the tuning tried and what it chose (goes to ``Release.info``)."""

    chosen: dict[str, Any]
    tried: tuple[dict[str, Any], ...]
    note: str

    def to_info(self) -> dict[str, Any]:
        return {
            "chosen": dict(self.chosen),
            "tried": [dict(t) for t in self.tried],
            "note": self.note,
        }


def select_config(
    candidates: Sequence[T],
    *,
    score: Callable[[T], float],
    describe: Callable[[T], dict[str, Any]],
) -> tuple[T, TuningResult]:
    """Pick the candidate with the highest public validation score (first one on ties).

    Args:
        candidates: at most :data:`TUNING_BUDGET` configurations.
        score: public validation accuracy of a configuration (higher is better).
        describe: a JSON-able description of a configuration.

    Returns:
        The chosen configuration and the record of what was tried.

    Raises:
        ValueError: if there are no candidates or more than the budget.
    """
    if not candidates or len(candidates) > TUNING_BUDGET:
        raise ValueError(
            f"{len(candidates)} candidates: expected between 1 and TUNING_BUDGET={TUNING_BUDGET}"
        )
    scores = [float(score(c)) for c in candidates]
    best = max(range(len(candidates)), key=lambda i: (scores[i], -i))
    tried = tuple(
        {**describe(c), "validation_accuracy": s} for c, s in zip(candidates, scores, strict=True)
    )
    return candidates[best], TuningResult(
        chosen=describe(candidates[best]),
        tried=tried,
        note="chosen on public validation data at the target epsilon; costs no privacy",
    )


def untuned(
    candidate: T, *, describe: Callable[[T], dict[str, Any]], reason: str
) -> tuple[T, TuningResult]:
    """The default configuration, when tuning is off or impossible."""
    return candidate, TuningResult(
        chosen=describe(candidate), tried=(describe(candidate),), note=f"not tuned: {reason}"
    )


def accuracy_of(proba: Tensor, labels: Tensor) -> float:
    return float((proba.argmax(-1).cpu() == labels.cpu()).double().mean())


def option(context: MethodContext, name: str, default: T, cast: Callable[[Any], T]) -> T:
    """``context.options[name]`` cast to the default's type, with a clear error."""
    raw = context.options.get(name, default)
    try:
        return cast(raw)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"option {name}={raw!r} is invalid: {exc}") from exc
