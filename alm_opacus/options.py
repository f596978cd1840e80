"""Typed method options: one frozen dataclass per method, built once from the run config.

A method declares ``Options``, a frozen dataclass whose fields carry the defaults and whose
``__post_init__`` validates them (solo-learn's ``method_kwargs`` checked by
``add_and_assert_specific_cfg``, made typed). Values arrive as plain data from three places,
all parsed the same way by :func:`build_options`:

* the command line: a shared flag (``--m 200``) sets the field of that name in every method
  that has one; ``--opt dpsgd.lr=1`` sets one method's field;
* a YAML config file (the same keys);
* code: ``create_method("dpsgd", options={"lr": 1.0})``.

Strings are converted to the field's type (``"1"`` -> 1, ``"true"`` -> True); a value that
does not fit, or a key no method declares, is an error naming it.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from collections.abc import Mapping
from typing import Any, Literal, TypeVar, get_args, get_origin

__all__ = [
    "MethodOptions",
    "NoOptions",
    "OptionError",
    "build_options",
    "coerce",
    "describe_options",
    "option_fields",
    "split_scoped",
]


class OptionError(ValueError):
    """An option's key or value is not what its method declares."""


@dataclasses.dataclass(frozen=True)
class MethodOptions:
    """Base class of every method's options (a frozen dataclass with defaults)."""

    def to_dict(self) -> dict[str, Any]:
        """The options as JSON-able plain data (for ``config.json``)."""
        return dataclasses.asdict(self)

    def replace(self: _O, **changes: Any) -> _O:
        """A copy with ``changes`` applied and validated again."""
        return dataclasses.replace(self, **changes)


_O = TypeVar("_O", bound=MethodOptions)


@dataclasses.dataclass(frozen=True)
class NoOptions(MethodOptions):
    """A method without options."""


def option_fields(cls: type[MethodOptions]) -> dict[str, Any]:
    """``{field name: resolved type}`` of an options class."""
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls)}


def split_scoped(values: Mapping[str, Any], *, method: str) -> dict[str, Any]:
    """The keys of ``values`` that concern ``method``: shared keys (no dot) and
    ``"<method>.<field>"`` keys (the scope stripped; a scoped key wins over a shared one)."""
    shared = {k: v for k, v in values.items() if "." not in k}
    scoped = {
        k.split(".", 1)[1]: v for k, v in values.items() if "." in k and k.split(".")[0] == method
    }
    return {**shared, **scoped}


def build_options(cls: type[_O], values: Mapping[str, Any], *, method: str, strict: bool) -> _O:
    """Build ``cls`` from plain values, converting each to its field's type.

    Args:
        cls: the options dataclass.
        values: field name -> value (already scoped to this method: see :func:`split_scoped`).
        method: the method's name, for messages.
        strict: refuse keys ``cls`` does not declare (scoped keys); when false, they are
            ignored (shared keys meant for other methods).

    Returns:
        The validated options.

    Raises:
        OptionError: for an unknown key (``strict``) or a value that does not fit its field.
    """
    fields = option_fields(cls)
    unknown = sorted(set(values) - set(fields))
    if strict and unknown:
        known = ", ".join(sorted(fields)) or "none"
        raise OptionError(f"unknown option {method}.{unknown[0]}: {method} declares {known}")
    kwargs = {
        name: coerce(values[name], fields[name], name=f"{method}.{name}")
        for name in fields
        if name in values
    }
    try:
        return cls(**kwargs)
    except OptionError:
        raise
    except (TypeError, ValueError) as exc:
        raise OptionError(f"option of {method}: {exc}") from exc


def describe_options(cls: type[MethodOptions]) -> dict[str, str]:
    """``{field: "type = default"}``, for ``--help`` and docs."""
    out = {}
    for f in dataclasses.fields(cls):
        default = f.default if f.default is not dataclasses.MISSING else "required"
        out[f.name] = f"{_type_name(option_fields(cls)[f.name])} = {default!r}"
    return out


def coerce(value: Any, tp: Any, *, name: str) -> Any:
    """Convert ``value`` (plain data, or a string from the command line) to type ``tp``.

    Supports ``bool``, ``int``, ``float``, ``str``, ``Literal[...]``, ``X | None`` and
    ``tuple[X, ...]`` (from a list or a comma-separated string).

    Raises:
        OptionError: naming ``name``, the value and the expected type.
    """
    origin, args = get_origin(tp), get_args(tp)
    if origin in (typing.Union, types.UnionType):
        empty = value is None or (isinstance(value, str) and value.strip().lower() in ("none", ""))
        if empty and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        if len(inner) == 1:
            return coerce(value, inner[0], name=name)
        raise OptionError(f"option {name}: unsupported type {tp!r}")
    if origin is Literal:
        for choice in args:
            if value == choice or (isinstance(value, str) and str(choice) == value.strip()):
                return choice
        raise OptionError(
            f"option {name}={value!r} is invalid: expected one of {', '.join(map(str, args))}"
        )
    if origin is tuple:
        items = value.split(",") if isinstance(value, str) else value
        if not isinstance(items, list | tuple):
            raise OptionError(f"option {name}={value!r} is invalid: expected a list")
        return tuple(coerce(v, args[0], name=name) for v in items)
    parse = _SCALARS.get(tp)
    if parse is None:
        raise OptionError(f"option {name}: unsupported type {tp!r}")
    try:
        return parse(value)
    except (TypeError, ValueError):
        raise OptionError(
            f"option {name}={value!r} is invalid: expected {_type_name(tp)}"
        ) from None


def _bool(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in _TRUTH:
        return _TRUTH[value.strip().lower()]
    raise ValueError(value)


_TRUTH = {
    "true": True,
    "yes": True,
    "1": True,
    "on": True,
    "false": False,
    "no": False,
    "0": False,
    "off": False,
}


def _int(value: Any) -> int:
    if isinstance(value, bool):
        raise ValueError(value)
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str):
        return int(value.strip())
    raise ValueError(value)


def _float(value: Any) -> float:
    if isinstance(value, bool):
        raise ValueError(value)
    out = float(value.strip() if isinstance(value, str) else value)
    if math.isnan(out):
        raise ValueError(value)
    return out


def _str(value: Any) -> str:
    if not isinstance(value, str):
        raise ValueError(value)
    return value


_SCALARS: dict[Any, Any] = {bool: _bool, int: _int, float: _float, str: _str}


def _type_name(tp: Any) -> str:
    if get_origin(tp) is Literal:
        return "one of " + ", ".join(map(str, get_args(tp)))
    if get_origin(tp) in (typing.Union, types.UnionType):
        return " or ".join(_type_name(a) for a in get_args(tp))
    return {
        bool: "a boolean",
        int: "an integer",
        float: "a number",
        str: "a string",
        type(None): "none",
    }.get(tp, str(tp))
