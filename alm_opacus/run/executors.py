"""Executors: where the units of a run are computed.

A run is a graph of pure units (:mod:`alm_opacus.run.harness`): per (method preparation,
seed) a *prepare* unit, per seed the *plain attacks*, per (method, epsilon, seed) a *cell*,
and inside those the chunks that :class:`~alm_opacus.unit_map.UnitMap` maps (sensitivity
sampler draws, shadow and LiRA reference heads). The driver puts the shared inputs once
(:meth:`Executor.put`), submits the prepare and plain-attacks units (:meth:`Executor.submit`),
takes finished cells from :meth:`Executor.as_completed`, and alone writes the run folder.

* ``in-process`` (the default): every unit runs in this process, lazily, in plan order;
  Ray is never imported.
* ``ray``: every unit is a Ray task (an optional extra: ``pip install -e ".[cluster]"``).
  Large read-only inputs go into the object store once; seeds come from the units, never
  from the order tasks run in, so the table is the same as in-process; tasks have no side
  effects but content-keyed cache entries (atomic and idempotent), so Ray may retry a task
  whose worker died (``max_retries``) without a duplicate or a missing row.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from alm_opacus.run.executor_base import (
    CLUSTER_EXTRA,
    Executor,
    ExecutorError,
    InProcessExecutor,
)

# constants of the Ray executor, importable from here as before the split
from alm_opacus.run.ray_executor import CLAIM_WAIT_SECONDS as CLAIM_WAIT_SECONDS
from alm_opacus.run.ray_executor import IN_FLIGHT_PER_CPU as IN_FLIGHT_PER_CPU
from alm_opacus.run.ray_executor import LOCAL_OBJECT_STORE_BYTES as LOCAL_OBJECT_STORE_BYTES
from alm_opacus.run.ray_executor import LOOPBACK_ENV as LOOPBACK_ENV
from alm_opacus.run.ray_executor import MAX_RETRIES as MAX_RETRIES
from alm_opacus.run.ray_executor import WORKERS_PER_CPU as WORKERS_PER_CPU
from alm_opacus.run.ray_executor import (
    RayExecutor,
    RayMap,
    SharedMemo,
    import_ray,
    loopback_only,
)

__all__ = [
    "CLUSTER_EXTRA",
    "EXECUTORS",
    "Executor",
    "ExecutorError",
    "InProcessExecutor",
    "RayExecutor",
    "RayMap",
    "SharedMemo",
    "available_executors",
    "create_executor",
    "import_ray",
    "loopback_only",
]

#: Executors by name (``--executor``).
EXECUTORS: dict[str, Callable[..., Executor]] = {
    InProcessExecutor.name: InProcessExecutor,
    RayExecutor.name: RayExecutor,
}


def available_executors() -> list[str]:
    return list(EXECUTORS)


def create_executor(name: str, **options: Any) -> Executor:
    """The executor ``name`` with its options (``address`` for ``ray``).

    Raises:
        ValueError: for an unknown name, or ``ray`` without Ray installed.
    """
    if name not in EXECUTORS:
        raise ValueError(
            f"unknown executor {name!r}: expected one of {', '.join(available_executors())}"
        )
    return EXECUTORS[name](**options)
