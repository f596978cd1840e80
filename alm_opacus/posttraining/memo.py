"""Calibrations and exact-release plans, memoised: a repeated release recalibrates nothing.

`PostTrainingPrivacyEngine.make_private` calibrates the scale to the caller's sensitivity and
plans the exact grid (`alm_opacus.mechanisms.exact.plan_release`), which calibrates again at
the grid's inflated sensitivity Δ' and, for a float16 or bfloat16 head (planned in float32's
narrower integer range), once more per widening of the grid. Both are pure functions of
their inputs, so they are kept here in bounded LRUs: a release at inputs seen before takes
the plan, widening included, without calibrating.

Keys hold the exact inputs: every number by its type and exact value (``float.hex``, so
``0.1`` and its neighbouring float never share an entry, nor ``1`` and ``1.0``), the
mechanism by its class and its instance attributes. Inputs that cannot be keyed exactly (a
tensor, an instance attribute that is not a plain number, string or tuple of them) are not
memoised: they are calibrated every time, as before. Invalid inputs raise and are never
stored. A mechanism class modified after it was first used (its methods replaced at run
time) is not detected: the memo assumes calibration is a function of class and inputs.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Hashable
from typing import Any

import torch

from alm_opacus.mechanisms import AdditiveNoiseMechanism
from alm_opacus.mechanisms.exact import INFLATION, ReleasePlan, plan_release

__all__ = ["MAX_ENTRIES", "cached_calibrate", "cached_plan", "clear", "stats"]

#: Entries kept in each memo (least recently used dropped first).
MAX_ENTRIES = 4096

_lock = threading.Lock()
_scales: OrderedDict[Hashable, float] = OrderedDict()
_plans: OrderedDict[Hashable, ReleasePlan] = OrderedDict()
_counts = {"hits": 0, "misses": 0}


def _exact(value: object) -> Hashable | None:
    """``value`` as an exact key part; ``None`` when it cannot be keyed exactly."""
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return (type(value), value)
    if isinstance(value, float):  # numpy floats too, kept apart from float by their type
        return (type(value), float(value).hex())
    if isinstance(value, int):
        return (type(value), int(value))
    if isinstance(value, tuple):
        parts = tuple(_exact(v) for v in value)
        return None if any(p is None for p in parts) else (tuple, parts)
    return None


def _mechanism_key(mechanism: object) -> Hashable | None:
    state = getattr(mechanism, "__dict__", None)
    if state is None:
        return None
    items = []
    for name, value in sorted(state.items()):
        part = _exact(value)
        if part is None:
            return None
        items.append((name, part))
    return (type(mechanism), tuple(items))


def _key(mechanism: object, *values: object) -> Hashable | None:
    parts = [_mechanism_key(mechanism), *(_exact(v) for v in values)]
    return None if any(p is None for p in parts) else tuple(parts)


def _get(memo: OrderedDict[Hashable, Any], key: Hashable | None) -> Any:
    if key is None:
        return None
    with _lock:
        found = memo.get(key)
        if found is not None:
            memo.move_to_end(key)
            _counts["hits"] += 1
        else:
            _counts["misses"] += 1
        return found


def _put(memo: OrderedDict[Hashable, Any], key: Hashable | None, value: Any) -> None:
    if key is None:
        return
    with _lock:
        memo[key] = value
        while len(memo) > MAX_ENTRIES:
            memo.popitem(last=False)


def cached_calibrate(
    mechanism: AdditiveNoiseMechanism, *, epsilon: float, delta: float, sensitivity: float
) -> float:
    """``mechanism.calibrate(...)``, memoised on the exact inputs.

    Raises:
        ValueError: as ``mechanism.calibrate`` (invalid inputs are never stored).
    """
    key = _key(mechanism, "calibrate", epsilon, delta, sensitivity)
    scale = _get(_scales, key)
    if scale is None:
        scale = float(mechanism.calibrate(epsilon=epsilon, delta=delta, sensitivity=sensitivity))
        _put(_scales, key, scale)
    return scale


class _Memoised:
    """What `plan_release` reads of a mechanism (its norm and calibration), memoised."""

    def __init__(self, mechanism: AdditiveNoiseMechanism) -> None:
        self.norm = mechanism.norm
        self._mechanism = mechanism

    def calibrate(self, *, epsilon: float, delta: float, sensitivity: float) -> float:
        return cached_calibrate(
            self._mechanism, epsilon=epsilon, delta=delta, sensitivity=sensitivity
        )


def cached_plan(
    mechanism: AdditiveNoiseMechanism,
    *,
    epsilon: float,
    delta: float,
    sensitivity: float,
    dim: int,
    dtype: torch.dtype,
    inflation: float = INFLATION,
) -> ReleasePlan:
    """`plan_release`, memoised on the exact inputs (the grid widening included).

    Raises:
        ValueError: as `plan_release` (invalid inputs are never stored).
    """
    key = _key(mechanism, "plan", epsilon, delta, sensitivity, dim, str(dtype), inflation)
    plan = _get(_plans, key)
    if plan is None:
        plan = plan_release(
            mechanism=_Memoised(mechanism),
            epsilon=epsilon,
            delta=delta,
            sensitivity=sensitivity,
            dim=dim,
            dtype=dtype,
            inflation=inflation,
        )
        _put(_plans, key, plan)
    return plan


def clear() -> None:
    """Forget every memoised scale and plan (benchmarks time a first release with it)."""
    with _lock:
        _scales.clear()
        _plans.clear()
        _counts.update(hits=0, misses=0)


def stats() -> dict[str, int]:
    """Hits and misses since the last `clear`, and the entries held."""
    with _lock:
        return {**_counts, "scales": len(_scales), "plans": len(_plans)}
