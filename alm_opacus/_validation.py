"""Argument checks shared by every public API: one message format, one place."""

from __future__ import annotations

import math
from typing import Any, TypeVar

import numpy as np

_Int = TypeVar("_Int", bound=int | np.integer[Any])


def check_epsilon(epsilon: float, *, name: str = "epsilon", allow_inf: bool = False) -> float:
    """Return ``epsilon`` as a float after checking that it is a positive number.

    Raises:
        ValueError: if ``epsilon`` is NaN, non-positive, or infinite (unless ``allow_inf``).
    """
    value = float(epsilon)
    if math.isnan(value) or value <= 0 or (math.isinf(value) and not allow_inf):
        expected = "a positive number" + ("" if allow_inf else " (finite)")
        raise ValueError(f"{name}={epsilon!r} is invalid: expected {expected}")
    return value


def check_delta(delta: float, *, name: str = "delta", allow_zero: bool = True) -> float:
    """Return ``delta`` as a float after checking that it lies in [0, 1) (or (0, 1)).

    Raises:
        ValueError: if ``delta`` is NaN or outside the allowed interval.
    """
    value = float(delta)
    low_ok = value >= 0 if allow_zero else value > 0
    if math.isnan(value) or not low_ok or value >= 1:
        interval = "[0, 1)" if allow_zero else "(0, 1)"
        raise ValueError(f"{name}={delta!r} is invalid: expected a number in {interval}")
    return value


def check_positive(value: float, *, name: str) -> float:
    """Return ``value`` as a float after checking that it is finite and > 0.

    Raises:
        ValueError: if ``value`` is NaN, infinite or non-positive.
    """
    out = float(value)
    if not math.isfinite(out) or out <= 0:
        raise ValueError(f"{name}={value!r} is invalid: expected a finite number > 0")
    return out


def check_sensitivity(sensitivity: float, *, name: str = "sensitivity") -> float:
    """Return ``sensitivity`` as a float after checking that it is finite and > 0."""
    return check_positive(sensitivity, name=name)


def check_integer(value: _Int, *, name: str, minimum: int = 1, numpy: bool = False) -> _Int:
    """Return ``value`` unchanged after checking that it is an integer >= ``minimum``.

    Args:
        value: the argument.
        name: its name, for the message.
        minimum: the least value allowed.
        numpy: accept numpy integers too (counts that may come out of an array).

    Raises:
        ValueError: on a bool, a non-integer or a value below ``minimum``.
    """
    kinds = (int, np.integer) if numpy else (int,)
    if isinstance(value, bool) or not isinstance(value, kinds) or value < minimum:
        raise ValueError(f"{name}={value!r} is invalid: expected an integer >= {minimum}")
    return value


def check_features_labels(features: object, labels: object) -> None:
    """Check that ``features`` is (n, d) and ``labels`` is (n,).

    Raises:
        ValueError: naming both shapes otherwise.
    """
    f_shape = tuple(getattr(features, "shape", ()))
    l_shape = tuple(getattr(labels, "shape", ()))
    if len(f_shape) != 2 or l_shape != f_shape[:1]:
        raise ValueError(f"features (n, d) and labels (n,) expected; got {f_shape} and {l_shape}")


def default_delta(n: int) -> float:
    """The default delta for ``n`` members: ``min(1e-5, 1 / (10 n))``, below ``1 / n``.

    Raises:
        ValueError: unless ``n`` is an integer >= 1.
    """
    check_integer(n, name="n")
    return min(1e-5, 1.0 / (10 * n))
