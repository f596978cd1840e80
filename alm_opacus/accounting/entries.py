"""The records a `PipelineAccountant` keeps, their validation, and their cached PLDs."""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping
from typing import Any, NamedTuple

from alm_opacus._validation import check_positive, check_sensitivity
from alm_opacus.accounting.neighbouring import ADD_REMOVE, check_neighbouring
from alm_opacus.accounting.pld import (
    RELEASE_PLDS,
    PrivacyLossDistribution,
    _check_sample_rate,
    _check_steps,
    release_loss_span,
    release_pld,
)
from alm_opacus.accounting.subsampled import (
    STEP_PROFILES,
    StepProfile,
    canonical_step_mechanism,
    step_loss_span,
    step_pld,
)
from alm_opacus.mechanisms import create_mechanism
from alm_opacus.mechanisms.base import _check_dim

__all__ = [
    "GAUSSIAN",
    "Entry",
    "check_noise_multiplier",
    "check_noise_step",
    "check_release",
    "clear_entry_cache",
    "entry_pld",
    "entry_span",
]

GAUSSIAN = "gaussian"


def check_noise_multiplier(noise_multiplier: float) -> float:
    """Return σ as a float after checking that it is finite and ≥ 0 (0: no noise).

    Raises:
        ValueError: if it is NaN, infinite or negative.
    """
    sigma = float(noise_multiplier)
    if not math.isfinite(sigma) or sigma < 0:
        raise ValueError(
            f"noise_multiplier={noise_multiplier!r} is invalid: expected a finite number ≥ 0"
        )
    return sigma


def check_release(record: Mapping[str, Any]) -> dict[str, Any]:
    """Validate a release record; a missing ``neighbouring`` (version-1 state) is add/remove.

    Raises:
        ValueError: if a field is missing or out of range.
    """
    missing = {"mechanism", "scale", "sensitivity", "dim"} - set(record)
    if missing:
        raise ValueError(f"release record {dict(record)!r} is missing {sorted(missing)}")
    name = create_mechanism(record["mechanism"]).name
    if name not in RELEASE_PLDS:
        raise ValueError(f"mechanism={record['mechanism']!r} has no registered PLD")
    return {
        "mechanism": name,
        "scale": check_positive(record["scale"], name="scale"),
        "sensitivity": check_sensitivity(record["sensitivity"]),
        "dim": _check_dim(record["dim"]),
        # Version-1 states predate the field; their releases were add/remove by contract.
        "neighbouring": check_neighbouring(record.get("neighbouring", ADD_REMOVE)),
    }


def check_noise_step(record: Mapping[str, Any]) -> dict[str, Any]:
    """Validate a logistic/Laplace DP-SGD step record (Gaussian steps live in ``history``).

    Raises:
        ValueError: if a field is missing or out of range.
    """
    missing = {"mechanism", "noise_multiplier", "sample_rate", "num_steps", "dim"} - set(record)
    if missing:
        raise ValueError(f"noise step record {dict(record)!r} is missing {sorted(missing)}")
    name = canonical_step_mechanism(record["mechanism"])
    if name == GAUSSIAN:
        raise ValueError(f"noise step record {dict(record)!r}: Gaussian steps belong in history")
    return {
        "mechanism": name,
        "noise_multiplier": check_noise_multiplier(record["noise_multiplier"]),
        "sample_rate": _check_sample_rate(record["sample_rate"]),
        "num_steps": _check_steps(record["num_steps"]),
        "dim": _check_dim(record["dim"]),
    }


class Entry(NamedTuple):
    """One composed entry, hashable so that its PLD can be cached."""

    kind: str  # "step" (``repeats`` identical DP-SGD steps) or "release"
    mechanism: str
    scale: float  # noise multiplier of a step, noise scale of a release
    sensitivity: float  # 1 for a step (the noise multiplier is relative to the clip)
    sample_rate: float
    repeats: int
    dim: int | None


def entry_pld(entry: Entry, interval: float) -> PrivacyLossDistribution:
    """PLD of one entry (cached: calibration re-composes the same prior many times).

    A step's cache key holds its mechanism's registered step profile, so a profile replaced
    by ``register_step_profile(..., force=True)`` is never answered from the cache.
    """
    profile = STEP_PROFILES.get(entry.mechanism) if entry.kind == "step" else None
    return _entry_pld(entry, interval, profile)


@functools.lru_cache(maxsize=8)
def _entry_pld(
    entry: Entry, interval: float, profile: StepProfile | None
) -> PrivacyLossDistribution:
    """:func:`entry_pld`, cached; ``profile`` is part of the key only (``step_pld`` looks
    the same profile up)."""
    if entry.kind == "step":
        return step_pld(
            mechanism=entry.mechanism,
            noise_multiplier=entry.scale,
            sample_rate=entry.sample_rate,
            steps=entry.repeats,
            dim=entry.dim,
            value_discretization_interval=interval,
        )
    return release_pld(
        mechanism=entry.mechanism,
        scale=entry.scale,
        sensitivity=entry.sensitivity,
        dim=entry.dim,
        value_discretization_interval=interval,
    )


def clear_entry_cache() -> None:
    """Forget every cached entry PLD and loss span (benchmarks time the uncached composition)."""
    _entry_pld.cache_clear()
    _release_span.cache_clear()


def entry_span(entry: Entry) -> float:
    """Width of one step's (or the release's) finite privacy-loss support."""
    if entry.kind == "step":
        return step_loss_span(
            mechanism=entry.mechanism,
            noise_multiplier=entry.scale,
            sample_rate=entry.sample_rate,
            dim=entry.dim,
        )
    return _release_span(entry.mechanism, entry.scale, entry.sensitivity)


@functools.lru_cache(maxsize=4096)
def _release_span(mechanism: str, scale: float, sensitivity: float) -> float:
    """`release_loss_span`, cached: a ledger asks for every release's span at each release
    (a Gaussian's costs a millisecond), and the span is a function of these three alone."""
    return release_loss_span(mechanism=mechanism, scale=scale, sensitivity=sensitivity)
