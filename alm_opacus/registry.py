"""One registry type for every extension point: names → objects of one kind.

Methods, attacks, datasets, dataset families, encoders, augmentations, head solvers, noise
mechanisms and their accounting records are each one :class:`Registry`. Registration is
explicit (``add`` or the ``register`` decorator), a name is resolved to its object once at
the boundary (``registry[name]``), and an unknown name fails with one line that lists what
is registered. A registry may be given a ``load`` hook that makes its built-ins or plugins
known on first lookup (the package imports lazily), a ``check`` run on every registration,
and an ``on_replace`` hook for caches keyed by the old object.

Tests that register toy objects wrap themselves in :meth:`Registry.isolated`, which
restores every registry afterwards.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.metadata
import types
from collections.abc import Callable, Iterable, Iterator
from typing import Any, ClassVar, Generic, TypeVar

__all__ = ["Registry", "UnknownName", "declare_builtins", "load_entry_points"]

T = TypeVar("T")
U = TypeVar("U")


class UnknownName(ValueError):
    """A name that no registration made known (a ValueError: it is bad input)."""


class Registry(Generic[T]):
    """Names → objects of one kind.

    Args:
        kind: what the objects are, as a message names them (``"attack"``).
        check: ``check(name, obj)`` raises for an object or name this registry refuses.
        load: makes built-ins and plugins known; called before the first miss is reported.
        on_replace: ``on_replace(name)`` runs when ``force`` replaces a registration.
    """

    _every: ClassVar[list[Registry[Any]]] = []

    def __init__(
        self,
        kind: str,
        *,
        check: Callable[[str, T], None] | None = None,
        load: Callable[[], object] | None = None,
        on_replace: Callable[[str], None] | None = None,
    ) -> None:
        self.kind = kind
        self._items: dict[str, T] = {}
        self._check = check
        self._load = load
        self._on_replace = on_replace
        Registry._every.append(self)

    def add(self, name: str, obj: T, *, force: bool = False) -> T:
        """Register ``obj`` under ``name`` and return it.

        Raises:
            ValueError: for an empty name, a name taken by another object (without
                ``force``), or whatever ``check`` refuses.
        """
        if not isinstance(name, str) or not name:
            raise ValueError(f"name={name!r} is invalid: expected a non-empty {self.kind} name")
        if self._check is not None:
            self._check(name, obj)
        old = self._items.get(name)
        if old is not None and old is not obj:
            if not force:
                raise ValueError(f"{self.kind} {name!r} is already registered; pass force=True")
            if self._on_replace is not None:
                self._on_replace(name)
        self._items[name] = obj
        return obj

    def register(self, name: str, *, force: bool = False) -> Callable[[U], U]:
        """Decorator form of :meth:`add` (returns the object unchanged)."""

        def decorator(obj: U) -> U:
            self.add(name, obj, force=force)  # type: ignore[arg-type]
            return obj

        return decorator

    def __getitem__(self, name: str) -> T:
        """The object registered as ``name``.

        Raises:
            UnknownName: naming ``name`` and every registered name.
        """
        found = self.get(name)
        if found is None:
            raise UnknownName(
                f"{self.kind}={name!r} is unknown: expected one of {', '.join(self.names())}"
            )
        return found

    def get(self, name: str, *, load: bool = True) -> T | None:
        """The object registered as ``name``, or ``None`` (built-ins loaded first, unless
        ``load`` is false: a registration that checks for conflicts while the built-ins are
        being registered must not start loading them again)."""
        if not isinstance(name, str):
            return None
        if load and name not in self._items and self._load is not None:
            self._load()
        return self._items.get(name)

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and self.get(name) is not None

    def names(self, *, sort: bool = True) -> list[str]:
        """Registered names, sorted or in registration order (built-ins loaded first)."""
        if self._load is not None:
            self._load()
        return sorted(self._items) if sort else list(self._items)

    def values(self) -> list[T]:
        """The registered objects, in registration order (nothing loaded first)."""
        return list(self._items.values())

    def items(self) -> list[tuple[str, T]]:
        """``(name, object)`` pairs, sorted by name."""
        return [(name, self._items[name]) for name in self.names()]

    @classmethod
    @contextlib.contextmanager
    def isolated(cls, *, reload: Iterable[str] = ()) -> Iterator[None]:
        """Restore every registry's contents on exit (for tests that register toys).

        Built-ins and plugins are loaded first (each registry's ``load``), so that what a
        lookup inside the block loads is not lost with it (a module imports only once).

        Args:
            reload: entry point groups to load again on their next lookup inside the block.
        """
        for registry in list(cls._every):
            if registry._load is not None:
                registry._load()
        saved = [(registry, dict(registry._items)) for registry in cls._every]
        loaded = set(_LOADED_GROUPS)
        _LOADED_GROUPS.difference_update(reload)
        try:
            yield
        finally:
            for registry, items in saved:
                registry._items.clear()
                registry._items.update(items)
            _LOADED_GROUPS.clear()
            _LOADED_GROUPS.update(loaded)


_LOADED_GROUPS: set[str] = set()
_BUILTINS: dict[str, tuple[str, ...]] = {}


def declare_builtins(group: str, *modules: str) -> None:
    """Declare modules of this package that extend ``group`` as its plugins do (each
    registers on import): `load_entry_points` imports them before the plugins.

    The package root declares them, so that a lookup in a lower layer loads what a higher
    one registers without naming it, whether or not the installed metadata is current.
    """
    _BUILTINS[group] = (*_BUILTINS.get(group, ()), *modules)


def load_entry_points(
    group: str,
    *,
    what: str,
    error: Callable[[str], Exception],
    accept: Callable[[importlib.metadata.EntryPoint, object], bool] | None = None,
    expected: str = "a module that registers on import",
) -> list[str]:
    """Import the plugins of the entry point ``group``, once per process.

    An entry point names a module that registers its objects when imported, or an object
    that ``accept(entry, obj)`` takes (and registers), returning true.

    Args:
        group: the entry point group (``alm_opacus.methods``).
        what: the plugins' kind, as messages name it (``"attack"``).
        error: the error type raised for a plugin that fails.
        accept: takes an entry's non-module object; false refuses it.
        expected: what an entry should name, for the refusal's message.

    Returns:
        The names of the entry points loaded by this call (empty after the first call).

    Raises:
        Exception: ``error(message)``, naming the entry point that failed to import or that
            names something else than expected; a later call tries again.
    """
    if group in _LOADED_GROUPS:
        return []
    _LOADED_GROUPS.add(group)  # before loading: a plugin's own imports must not recurse here
    loaded = []
    try:
        for module in _BUILTINS.get(group, ()):
            try:
                importlib.import_module(module)
            except Exception as exc:
                raise error(f"{what} module {module!r} failed to load: {exc}") from exc
        for entry in importlib.metadata.entry_points(group=group):
            try:
                obj = entry.load()
            except Exception as exc:
                raise error(
                    f"{what} plugin {entry.name!r} ({entry.value}) failed to load: {exc}"
                ) from exc
            if not isinstance(obj, types.ModuleType) and not (accept and accept(entry, obj)):
                raise error(
                    f"{what} plugin {entry.name!r} ({entry.value}) names {obj!r}: "
                    f"expected {expected}"
                )
            loaded.append(entry.name)
    except Exception:
        _LOADED_GROUPS.discard(group)  # a later call tries again and reports the same error
        raise
    return loaded
