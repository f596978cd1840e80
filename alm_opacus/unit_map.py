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

import functools
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from typing import Protocol, TypeVar

__all__ = ["ThreadMap", "UnitMap", "runs_here", "serial_map"]

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


@dataclass(frozen=True)
class ThreadMap:
    """The in-process :class:`UnitMap` on ``workers`` threads; :func:`serial_map` for fewer
    than two workers or units.

    A bank's or the sampler's chunk is a loop of batched products that the intra-op threads
    keep only partly busy, so two chunks side by side finish sooner than one after the other
    (the grids of ``scripts/bench_scale.py``). Each unit runs with the caller's intra-op
    thread count, not one: the units are pure and seeded from their own values, but their
    floats depend on that count (Newton-CG heads differ in the last bits between one and two
    threads, ``tests/test_unit_map.py``), and with it kept the result is :func:`serial_map`'s
    bit for bit.
    """

    workers: int

    def __call__(
        self,
        fn: Callable[[S, U], R],
        units: Sequence[U],
        *,
        shared: S,
        desc: str | None = None,
    ) -> list[R]:
        if self.workers < 2 or len(units) < 2:
            return serial_map(fn, units, shared=shared, desc=desc)
        from tqdm.auto import tqdm

        bar = tqdm(total=len(units), desc=desc, unit="chunk", disable=desc is None)
        pool = ThreadPoolExecutor(max_workers=self.workers, thread_name_prefix="units")
        futures = [
            pool.submit(with_callers_threads(functools.partial(fn, shared, unit))) for unit in units
        ]
        try:
            for future in as_completed(futures):
                future.result()  # the first error stops the map
                bar.update()
            return [future.result() for future in futures]
        finally:  # on an error or an interrupt, the units not yet started never start
            pool.shutdown(wait=True, cancel_futures=True)
            bar.close()


def with_callers_threads(fn: Callable[[], R]) -> Callable[[], R]:
    """``fn``, to run on another thread with the calling thread's intra-op thread count: a new
    thread starts from the last count set anywhere, and a unit's floats may depend on the
    count (:class:`ThreadMap`)."""
    import torch  # this module imports nothing heavy at import time

    threads = torch.get_num_threads()  # per thread: the caller's

    def run() -> R:
        torch.set_num_threads(threads)
        return fn()

    return run


def runs_here(map_units: UnitMap) -> bool:
    """Whether ``map_units`` runs its units in this process (:func:`serial_map`,
    :class:`ThreadMap`): then a unit may wait on work of its own on a side thread. A cluster's
    unit that did so kept its CPU while its nested units queued for one (a run hung)."""
    return map_units is serial_map or isinstance(map_units, ThreadMap)
