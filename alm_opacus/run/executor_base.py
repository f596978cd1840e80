"""The executor protocol, and the in-process executor (the default).

:class:`Executor` is what the driver (:mod:`alm_opacus.run.harness`) runs a run's units with;
:class:`InProcessExecutor` computes every unit in this process, lazily and in plan order, and
never imports Ray. The Ray executor is :mod:`alm_opacus.run.ray_executor`; both are named and
created through :mod:`alm_opacus.run.executors`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Sequence
from typing import Any, ClassVar, TypeVar

from alm_opacus.methods import RunMemo
from alm_opacus.unit_map import UnitMap, serial_map

__all__ = ["CLUSTER_EXTRA", "Executor", "ExecutorError", "InProcessExecutor"]

S = TypeVar("S")
U = TypeVar("U")
R = TypeVar("R")

#: The optional extra that installs Ray.
CLUSTER_EXTRA = 'pip install -e ".[cluster]"'


class ExecutorError(RuntimeError):
    """A unit could not be computed (e.g. its worker died more often than Ray retries)."""


class Executor(ABC):
    """Runs the pure units of a run; a context manager that releases what it started.

    ``put(value)`` and ``submit(fn, *args)`` return handles; a handle may be an argument of a
    later ``submit``, and the unit then gets the value. ``map`` is the
    :class:`~alm_opacus.unit_map.UnitMap` handed to the code below the harness.
    """

    name: ClassVar[str] = ""
    #: Whether units run in the driver's process (then they may show progress bars).
    in_driver: ClassVar[bool] = True

    @abstractmethod
    def put(self, value: Any) -> Any:
        """A handle on a read-only ``value`` that many units read (sent once)."""

    @abstractmethod
    def submit(self, fn: Callable[..., Any], *args: Any) -> Any:
        """A handle on ``fn(*args)``, handles among ``args`` replaced by their values."""

    @abstractmethod
    def as_completed(
        self,
        fn: Callable[..., R],
        calls: Sequence[tuple[Any, ...]],
        *,
        before: Callable[[int], None] | None = None,
    ) -> Iterator[tuple[int, R]]:
        """``(index, fn(*calls[index]))`` for every call, as each is done; handles among a
        call's arguments are replaced by their values. In-process: in order, each computed
        when asked for; on Ray: a bounded number in flight, so units that map units of their
        own never pile up. ``before(index)`` is called before each is yielded (and,
        in-process, before it is computed)."""

    @abstractmethod
    def map(
        self, fn: Callable[[S, U], R], units: Sequence[U], *, shared: S, desc: str | None = None
    ) -> list[R]:
        """``[fn(shared, u) for u in units]`` (see :class:`~alm_opacus.unit_map.UnitMap`)."""

    def unit_map(self) -> UnitMap:
        """What units running under this executor map their own units with (picklable)."""
        return serial_map

    def memo(self) -> RunMemo:
        """The memo of work shared by the run's units (a clean head, shadow heads)."""
        return RunMemo()

    def close(self) -> None:  # noqa: B027 (nothing to release by default)
        """Release what the executor started."""

    def __enter__(self) -> Executor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _Lazy:
    """An in-process handle: ``fn(*args)``, computed on first use and kept."""

    __slots__ = ("_args", "_done", "_fn", "_value")

    def __init__(self, fn: Callable[..., Any], args: tuple[Any, ...]) -> None:
        self._fn, self._args = fn, args
        self._done = False
        self._value: Any = None

    def value(self) -> Any:
        if not self._done:
            args = [a.value() if isinstance(a, _Lazy) else a for a in self._args]
            self._value = self._fn(*args)
            self._done = True
            self._fn, self._args = _unset, ()  # let the inputs go
        return self._value


def _unset(*args: Any) -> Any:
    raise AssertionError("a computed handle is never computed again")


class InProcessExecutor(Executor):
    """Every unit in this process, lazily and in plan order (the default; no Ray)."""

    name = "in-process"

    def put(self, value: Any) -> Any:
        return value

    def submit(self, fn: Callable[..., Any], *args: Any) -> _Lazy:
        return _Lazy(fn, args)

    def as_completed(
        self,
        fn: Callable[..., R],
        calls: Sequence[tuple[Any, ...]],
        *,
        before: Callable[[int], None] | None = None,
    ) -> Iterator[tuple[int, R]]:
        for index, args in enumerate(calls):
            if before is not None:
                before(index)
            yield index, _Lazy(fn, args).value()

    def map(
        self, fn: Callable[[S, U], R], units: Sequence[U], *, shared: S, desc: str | None = None
    ) -> list[R]:
        return serial_map(fn, units, shared=shared, desc=desc)
