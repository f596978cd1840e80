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

A field declared with :func:`cli_option` also gets a flag of its own (``--m 500``): the
command line builds one flag per distinct key from every registered method's ``Options``
(:func:`collect_flags`), so the core CLI names no method's options. This module imports
nothing heavy: ``--help`` reads the flags without loading torch.
"""

from __future__ import annotations

import dataclasses
import math
import re
import types
import typing
from collections.abc import Mapping
from typing import Any, Literal, TypeVar, get_args, get_origin

__all__ = [
    "FLAG_METADATA",
    "MethodFlag",
    "MethodOptions",
    "NoOptions",
    "OptionError",
    "build_options",
    "cli_option",
    "coerce",
    "collect_flags",
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


#: The key, in a dataclass field's metadata, of the flag :func:`cli_option` declares.
FLAG_METADATA = "alm_opacus.flag"

_FLAG_NAME = re.compile(r"--[a-z][a-z0-9]*(-[a-z0-9]+)*")


@dataclasses.dataclass(frozen=True)
class _FlagSpec:
    help: str
    flag: str | None
    shared: bool
    metavar: str | None


def cli_option(
    default: Any,
    *,
    help: str,
    flag: str | None = None,
    shared: bool = True,
    metavar: str | None = None,
) -> Any:
    """A field of a method's ``Options`` with a command-line flag of its own, e.g.
    ``m: int = cli_option(200, help="neighbour pairs drawn by the sampler")`` gives ``--m``.

    Args:
        default: the field's default (an immutable value).
        help: what the value means, for ``--help``; the flag adds the default and the
            methods that read it.
        flag: the flag's name (default: ``--<field>``, or ``--<method>-<field>`` when not
            shared; underscores become dashes).
        shared: true: the flag sets the shared key ``<field>``, read by every method whose
            options have a field of that name (as ``--opt m=...`` does); false: the scoped
            key ``<method>.<field>``, read by this method only.
        metavar: the value's name in ``--help`` (default: argparse's; a ``Literal`` field
            lists its choices).

    Returns:
        A :func:`dataclasses.field` whose metadata holds the flag.

    Raises:
        ValueError: for an empty ``help``.
    """
    if not help.strip():
        raise ValueError("cli_option: help is empty: expected what the value means")
    spec = _FlagSpec(help=" ".join(help.split()), flag=flag, shared=shared, metavar=metavar)
    return dataclasses.field(default=default, metadata={FLAG_METADATA: spec})


@dataclasses.dataclass(frozen=True)
class MethodFlag:
    """One command-line flag, built from the method options that declare it
    (:func:`collect_flags`).

    Attributes:
        flag: its name, e.g. ``--m``.
        key: the key its value takes in the run config's options: shared (``"m"``, read
            by every method with that field) or scoped (``"lu.queries"``).
        help: the field's help, its default and the methods that read the key.
        methods: the methods that read the key, sorted.
        choices: the values of a ``Literal`` field (``None``: any value of its type).
        metavar: the value's name in ``--help`` (``None``: argparse's).
        readers: ``(method, Options class)`` of each method that reads the key, the first
            declaring the flag: a value is converted by the first and checked by each.
            Empty in the snapshot ``--help`` prints (it parses nothing).
    """

    flag: str
    key: str
    help: str
    methods: tuple[str, ...]
    choices: tuple[str, ...] | None = None
    metavar: str | None = None
    readers: tuple[tuple[str, type[MethodOptions]], ...] = dataclasses.field(
        default=(), compare=False, repr=False
    )

    @property
    def dest(self) -> str:
        """The parsed namespace's attribute (and the ``--config`` YAML key): ``m``."""
        return self.flag[2:].replace("-", "_")

    def parse(self, text: str) -> Any:
        """``text`` as the value of :attr:`key`: converted to the type of the first reader's
        field and checked by every reader's options (with their other fields at default).

        Raises:
            OptionError: ``--m='x': expected an integer``, naming the flag and the value.
        """
        name = self.key.rsplit(".", 1)[-1]
        value: Any = text
        for i, (method, cls) in enumerate(self.readers):
            try:
                built = build_options(cls, {name: value}, method=method, strict=False)
            except OptionError as exc:
                message = str(exc)
                expected = message[message.find("expected") :] if "expected" in message else message
                by = f" (for {method})" if i else ""  # a later reader refuses what the first took
                raise OptionError(f"{self.flag}={text!r}: {expected}{by}") from None
            if i == 0:
                value = getattr(built, name)
        return value

    def to_dict(self) -> dict[str, Any]:
        """JSON-able, without :attr:`readers` (the snapshot ``--help`` reads)."""
        out = dataclasses.asdict(dataclasses.replace(self, readers=()))
        del out["readers"]
        return {k: list(v) if isinstance(v, tuple) else v for k, v in out.items()}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> MethodFlag:
        """The inverse of :meth:`to_dict` (no readers: for ``--help`` only)."""
        choices = data.get("choices")
        return cls(
            flag=str(data["flag"]),
            key=str(data["key"]),
            help=str(data["help"]),
            methods=tuple(data["methods"]),
            choices=None if choices is None else tuple(choices),
            metavar=data.get("metavar"),
        )


def collect_flags(options: Mapping[str, type[MethodOptions]]) -> tuple[MethodFlag, ...]:
    """One flag per distinct key that the methods' options declare with :func:`cli_option`.

    Args:
        options: method name -> its ``Options`` class, for every registered method (the
            methods that read a shared key are found here).

    Returns:
        The flags, in the order of ``options`` and then of each class's fields.

    Raises:
        OptionError: for a flag name that is not ``--lowercase-words``, or one flag (or one
            key) declared twice in ways that disagree (key, type or flag name).
    """
    declared: dict[str, tuple[str, _FlagSpec, Any, str]] = {}
    for method, cls in options.items():
        hints = option_fields(cls)
        for f in dataclasses.fields(cls):
            spec = f.metadata.get(FLAG_METADATA)
            if not isinstance(spec, _FlagSpec):
                continue
            key = f.name if spec.shared else f"{method}.{f.name}"
            flag = spec.flag or "--" + key.replace(".", "-").replace("_", "-")
            if not _FLAG_NAME.fullmatch(flag):
                raise OptionError(
                    f"option {method}.{f.name}: flag {flag!r} is invalid: expected "
                    "--lowercase-words"
                )
            seen = declared.setdefault(flag, (key, spec, hints[f.name], method))
            if (seen[0], seen[2]) != (key, hints[f.name]):
                raise OptionError(
                    f"flag {flag} is declared twice: by {seen[3]} for {seen[0]} "
                    f"({_type_name(seen[2])}) and by {method} for {key} "
                    f"({_type_name(hints[f.name])}); expected one key of one type"
                )
            other = next((g for g, d in declared.items() if d[0] == key and g != flag), None)
            if other is not None:
                raise OptionError(
                    f"option {key} has two flags, {other} ({declared[other][3]}) and {flag} "
                    f"({method}): expected one"
                )
    return tuple(
        _method_flag(flag, key=key, spec=spec, tp=tp, first=first, options=options)
        for flag, (key, spec, tp, first) in declared.items()
    )


def _method_flag(
    flag: str,
    *,
    key: str,
    spec: _FlagSpec,
    tp: Any,
    first: str,
    options: Mapping[str, type[MethodOptions]],
) -> MethodFlag:
    name = key.rsplit(".", 1)[-1]
    if "." in key:
        readers = [(first, options[first])]
    else:
        readers = [(m, c) for m, c in options.items() if name in option_fields(c)]
        readers.sort(key=lambda r: (r[0] != first, r[0]))
    defaults: dict[str, list[str]] = {}
    for method, cls in readers:
        default = {f.name: f.default for f in dataclasses.fields(cls)}[name]
        text = "none" if default is None else str(default)
        if default is not dataclasses.MISSING:
            defaults.setdefault(text, []).append(method)
    if len(defaults) == 1:
        said = f"default: {next(iter(defaults))}; "
    else:
        said = "default: " + ", ".join(f"{d} for {', '.join(m)}" for d, m in defaults.items())
        said += "; " if defaults else ""
    methods = tuple(sorted(m for m, _ in readers))
    inner = [a for a in get_args(tp) if a is not type(None)] if _is_union(tp) else [tp]
    literal = len(inner) == 1 and get_origin(inner[0]) is Literal
    return MethodFlag(
        flag=flag,
        key=key,
        help=f"{spec.help} ({said}option {key} of {', '.join(methods)})",
        methods=methods,
        choices=tuple(str(c) for c in get_args(inner[0])) if literal else None,
        metavar=spec.metavar,
        readers=tuple(readers),
    )


def _is_union(tp: Any) -> bool:
    return get_origin(tp) in (typing.Union, types.UnionType)


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
