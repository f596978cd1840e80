"""Independent units of work and the seam that maps a function over them.

The harness's expensive loops (the sensitivity sampler's chunks of heads, the chunks of an
attacker's shadow and reference banks) are maps of a *pure* function over independent units:
``fn(shared, unit)`` reads only its arguments, writes nothing but content-keyed caches, and
draws every seed from ``unit`` (never from the order units run in). The code that owns a loop
takes a :class:`UnitMap` and calls it; :func:`serial_map` (the default) runs the units in
this process, in order. ``alm_opacus.run.executors`` supplies the same interface on a Ray
cluster, where the units become tasks and ``shared`` goes into the object store once.

This module sits below everything that maps units and imports nothing of the project.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol, TypeVar

__all__ = ["UnitMap", "serial_map"]

S = TypeVar("S")
U = TypeVar("U")
R = TypeVar("R")


class UnitMap(Protocol):
    """``map(fn, units, shared=...) -> [fn(shared, u) for u in units]``, in the order of
    ``units``, however and wherever the calls run.

    ``fn`` must be a pure function of its arguments (importable by name, or a picklable
    closure), ``shared`` a read-only input that every unit reads (sent once), and each unit a
    small picklable value. ``desc`` names the map for a progress bar (``None``: no bar).
    """

    def __call__(
        self,
        fn: Callable[[S, U], R],
        units: Sequence[U],
        *,
        shared: S,
        desc: str | None = None,
    ) -> list[R]: ...


def serial_map(
    fn: Callable[[S, U], R], units: Sequence[U], *, shared: S, desc: str | None = None
) -> list[R]:
    """The in-process :class:`UnitMap`: the units one after another, in order.

    Args:
        fn: the unit function ``fn(shared, unit)``.
        units: the units.
        shared: the input every unit reads.
        desc: show a tqdm bar with this label (``None``: none).

    Returns:
        ``[fn(shared, u) for u in units]``.
    """
    items: Sequence[U] = units
    if desc is not None:
        from tqdm.auto import tqdm

        return [fn(shared, u) for u in tqdm(items, desc=desc, unit="chunk")]
    return [fn(shared, u) for u in items]
