"""The Ray executor: every unit of a run a Ray task (the optional extra ``[cluster]``).

Large read-only inputs go into the object store once; seeds come from the units, never from
the order tasks run in, so the table is the same as in-process; tasks have no side effects but
content-keyed cache entries (atomic and idempotent), so Ray may retry a task whose worker died
(``max_retries``) without a duplicate or a missing row. Importing this module does not import
Ray: :func:`import_ray` does, when an executor is created.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import itertools
import os
from collections.abc import Callable, Hashable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar, cast

from alm_opacus.methods import RunMemo
from alm_opacus.run.executor_base import CLUSTER_EXTRA, Executor, ExecutorError
from alm_opacus.run.ray_address import DEFAULT_CONNECT_TIMEOUT_S, cluster_address
from alm_opacus.unit_map import UnitMap, serial_map

__all__ = [
    "CLAIM_WAIT_SECONDS",
    "IN_FLIGHT_PER_CPU",
    "LOCAL_OBJECT_STORE_BYTES",
    "LOOPBACK_ENV",
    "MAX_RETRIES",
    "WORKERS_PER_CPU",
    "RayExecutor",
    "RayMap",
    "SharedMemo",
    "import_ray",
    "loopback_only",
]

S = TypeVar("S")
U = TypeVar("U")
R = TypeVar("R")
T = TypeVar("T")

#: Tasks Ray re-runs when their worker dies (safe: a task has no side effects).
MAX_RETRIES = 3
#: Calls of :meth:`Executor.as_completed` in flight per CPU of a Ray cluster.
IN_FLIGHT_PER_CPU = 2
#: The object store of a cluster this process starts (shared memory; the machine is shared).
LOCAL_OBJECT_STORE_BYTES = 2 * 1024**3
#: Idle workers a cluster this process starts keeps, per CPU. A task waiting for its own units
#: gives its CPU back and Ray starts another worker for them; above Ray's default soft limit
#: (one worker per CPU) it kills idle workers after a second, and the next wait starts new
#: ones, each importing torch again (seconds of CPU): on digits that churn started ~25 workers
#: and doubled a run's CPU time (scripts/bench_ray.py). On a cluster started with ``ray start``,
#: set ``RAY_num_workers_soft_limit`` in its environment (docs/distributed.md).
WORKERS_PER_CPU = 4


def import_ray() -> Any:
    """The ``ray`` module.

    Raises:
        ValueError: naming the extra to install, when Ray is not installed.
    """
    try:
        import ray
    except ImportError:
        raise ValueError(
            f"--executor ray needs Ray, which is not installed: {CLUSTER_EXTRA}"
        ) from None
    return ray


#: Ray (2.60) resolves a node address of 127.0.0.1 to this machine's network address
#: (``services.resolve_ip_for_localhost``) and its servers listen there; in its single-machine
#: mode (the one it uses on macOS and Windows) the node's address is the loopback one, and
#: every endpoint (GCS, raylet, object manager, workers) listens on 127.0.0.1 only.
LOOPBACK_ENV = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}


@contextlib.contextmanager
def loopback_only() -> Iterator[None]:
    """Start Ray nodes inside this block on 127.0.0.1 only (a local cluster, or the simulated
    nodes of ``ray.cluster_utils.Cluster``): nothing listens on another address.

    Raises:
        ValueError: when Ray is not installed (naming the extra).
    """
    ray = import_ray()
    constants = ray._private.ray_constants
    saved_env = {k: os.environ.get(k) for k in LOOPBACK_ENV}
    saved = constants.ENABLE_RAY_CLUSTER
    os.environ.update(LOOPBACK_ENV)  # inherited by the processes the block starts
    constants.ENABLE_RAY_CLUSTER = False  # read once, when Ray was imported
    try:
        yield
    finally:
        constants.ENABLE_RAY_CLUSTER = saved
        for key, value in saved_env.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def _run_unit(fn: Callable[..., R], *args: Any) -> R:
    """The body of every Ray task: ``fn(*args)`` with torch and the BLAS/OpenMP pools pinned
    to the CPUs Ray assigned to the task, so a node's tasks never oversubscribe its cores."""
    import ray
    from threadpoolctl import threadpool_limits

    from alm_opacus.run.evaluation import torch_threads

    cpus = ray.get_runtime_context().get_assigned_resources().get("CPU", 1.0)
    threads = max(1, int(cpus))
    with torch_threads(threads), threadpool_limits(limits=threads):
        return fn(*args)


@functools.cache
def _remote(cpus: float, retries: int) -> Any:
    """The remote version of :func:`_run_unit` (built once per process and options)."""
    ray = import_ray()
    return ray.remote(_run_unit).options(num_cpus=cpus, max_retries=retries, retry_exceptions=False)


def _unwrap(refs: Any) -> Any:
    """``ray.get(refs)``, a failed task's own exception raised as itself (its message, not
    Ray's traceback), and a lost worker as :class:`ExecutorError`."""
    ray = import_ray()
    try:
        return ray.get(refs)
    except ray.exceptions.RayTaskError as exc:
        cause = exc.cause
        if isinstance(cause, BaseException):
            raise cause from None
        raise ExecutorError(str(exc).splitlines()[0]) from None
    except ray.exceptions.RayError as exc:
        raise ExecutorError(
            f"a unit could not be computed on the Ray cluster: {str(exc).splitlines()[0]}"
        ) from None


@dataclass(frozen=True)
class RayMap:
    """The :class:`~alm_opacus.unit_map.UnitMap` of units inside Ray tasks: each unit a task,
    ``shared`` put into the object store once. Picklable (it holds only options)."""

    cpus: float = 1.0
    retries: int = MAX_RETRIES

    def __call__(
        self, fn: Callable[[S, U], R], units: Sequence[U], *, shared: S, desc: str | None = None
    ) -> list[R]:
        if len(units) <= 1:  # one unit: a task would only add its overhead
            return serial_map(fn, units, shared=shared)
        ray = import_ray()
        ref = ray.put(shared)
        task = _remote(self.cpus, self.retries)
        return cast(list[R], _unwrap([task.remote(fn, ref, unit) for unit in units]))


#: Seconds a task waits for a value another task claimed before computing it itself (a
#: safety net: a claimant that fails releases its claim, and one whose worker died is re-run
#: by Ray under the same task ID, which gets the claim back).
CLAIM_WAIT_SECONDS = 900.0


class _MemoStore:
    """The values of a :class:`SharedMemo`, held by one asynchronous Ray actor per run.

    A key is computed once: the first task to :meth:`claim` it computes it, and the others
    :meth:`wait` for it (blocked in ``ray.get``, so Ray lends their CPUs to other tasks).
    Without claims, two cells in flight computed the same shadow networks side by side
    (``lu`` on mnist: ~200 CPU-s, a fifth of a Ray run's work; scripts/bench_ray.py).
    """

    def __init__(self) -> None:
        self._values: dict[str, Any] = {}
        self._claims: dict[str, tuple[str, Any]] = {}  # name -> (claimant, asyncio.Event)

    async def claim(self, name: str, claimant: str) -> tuple[str, Any]:
        """``("found", value)``; ``("yours", None)``: compute it and :meth:`put` it (or
        :meth:`release` it); ``("claimed", None)``: another task computes it."""
        if name in self._values:
            return "found", self._values[name]
        held = self._claims.get(name)
        if held is not None and held[0] != claimant:  # the same task again: Ray re-ran it
            return "claimed", None
        import asyncio  # here, not at the top: the default run imports no asyncio

        self._claims[name] = (claimant, asyncio.Event())
        return "yours", None

    async def wait(self, name: str, timeout: float) -> tuple[bool, Any]:
        """``(True, value)`` once the claimant put it; ``(False, None)`` if it released its
        claim or ``timeout`` seconds passed."""
        import asyncio

        held = self._claims.get(name)  # a claim is held only until its value is put
        if held is not None:
            with contextlib.suppress(asyncio.TimeoutError):  # TimeoutError from 3.11
                await asyncio.wait_for(held[1].wait(), timeout)
        return (True, self._values[name]) if name in self._values else (False, None)

    async def put(self, name: str, value: Any) -> None:
        self._values.setdefault(name, value)
        self._end_claim(name)

    async def release(self, name: str) -> None:
        """The claimant could not compute it: the waiters compute it themselves."""
        self._end_claim(name)

    def _end_claim(self, name: str) -> None:
        held = self._claims.pop(name, None)
        if held is not None:
            held[1].set()


def _task_id() -> str:
    """The running Ray task's ID (kept when Ray re-runs the task), or the process's."""
    import ray

    context = ray.get_runtime_context()
    return str(context.get_task_id() or f"pid-{os.getpid()}")


class SharedMemo(RunMemo):
    """A :class:`~alm_opacus.methods.RunMemo` shared by every task of a run: a value is
    computed by the first task that claims its key and read by the others from an actor
    (:class:`_MemoStore`). Keys whose ``repr`` is not stable across processes stay
    task-local."""

    def __init__(self, store: Any) -> None:
        super().__init__()
        self._actor = store

    def get(self, key: Hashable, compute: Callable[[], T]) -> T:
        text = repr(key)
        if key in self or " object at 0x" in text:  # an address is no key across processes
            return super().get(key, compute)
        name = hashlib.sha256(text.encode()).hexdigest()
        state, value = _unwrap(self._actor.claim.remote(name, _task_id()))
        if state == "claimed":
            found, value = _unwrap(self._actor.wait.remote(name, CLAIM_WAIT_SECONDS))
            state = "found" if found else "yours"
        if state == "yours":
            try:
                value = compute()
            except BaseException:
                self._actor.release.remote(name)
                raise
            self._actor.put.remote(name, value)
        return super().get(key, lambda: cast(T, value))

    def __reduce__(self) -> tuple[Any, ...]:
        # a task's local copies stay in the task
        return (SharedMemo, (self._actor,))


class RayExecutor(Executor):
    """Every unit a Ray task, on the cluster at ``address`` or on a local one it starts.

    Args:
        address: a running cluster (``ray start --head`` prints it); ``None``: the
            ``RAY_ADDRESS`` environment variable, else a local cluster on this machine, bound
            to 127.0.0.1 and shut down by :meth:`close`.
        num_cpus: CPUs of a local cluster (default: all of this machine's).
        cpus_per_task: CPUs each task holds (and pins torch's threads to).
        max_retries: re-runs of a task whose worker died.
        connect_timeout: seconds the cluster at ``address`` has to accept a connection
            before ``ray.init`` is asked to join it (which would otherwise retry for minutes).

    Raises:
        ValueError: when Ray is not installed (naming the extra); for a malformed address,
            or one that does not answer within ``connect_timeout`` (naming it).
    """

    name = "ray"
    in_driver = False

    def __init__(
        self,
        *,
        address: str | None = None,
        num_cpus: int | None = None,
        cpus_per_task: float = 1.0,
        max_retries: int = MAX_RETRIES,
        connect_timeout: float = DEFAULT_CONNECT_TIMEOUT_S,
    ) -> None:
        ray = import_ray()
        self._ray = ray
        self._owns = False
        if not ray.is_initialized():
            address = cluster_address(address, connect_timeout=connect_timeout)
            common: dict[str, Any] = {
                "include_dashboard": False,
                "configure_logging": False,
                "log_to_driver": True,
            }
            if address is not None:
                ray.init(address=address, **common)
            else:
                cpus = num_cpus or os.cpu_count() or 1
                with loopback_only():  # "local": a new instance, never another one found here
                    ray.init(
                        address="local",
                        num_cpus=num_cpus,
                        _node_ip_address="127.0.0.1",
                        object_store_memory=LOCAL_OBJECT_STORE_BYTES,
                        _system_config={"num_workers_soft_limit": WORKERS_PER_CPU * cpus},
                        **common,
                    )
            self._owns = True
        self._map = RayMap(cpus=cpus_per_task, retries=max_retries)
        self._task = _remote(cpus_per_task, max_retries)
        #: Refs of units submitted and not yet collected (what `close` may have to cancel).
        self._submitted: set[Any] = set()
        self._store: Any = None

    def put(self, value: Any) -> Any:
        return self._ray.put(value)

    def submit(self, fn: Callable[..., Any], *args: Any) -> Any:
        ref = self._task.remote(fn, *args)
        self._submitted.add(ref)
        return ref

    def as_completed(
        self,
        fn: Callable[..., R],
        calls: Sequence[tuple[Any, ...]],
        *,
        before: Callable[[int], None] | None = None,
    ) -> Iterator[tuple[int, R]]:
        # A task that waits for its own units gives its CPU back, and Ray would start the
        # next call in its place: with every call in flight, all of them would be open at
        # once (a worker process each). A window of a few per CPU keeps every CPU busy.
        window = max(2, IN_FLIGHT_PER_CPU * int(self._ray.cluster_resources().get("CPU", 1)))
        index: dict[Any, int] = {}
        pending: list[Any] = []
        waiting = iter(enumerate(calls))
        while True:
            for i, args in itertools.islice(waiting, window - len(pending)):
                ref = self.submit(fn, *args)
                index[ref] = i
                pending.append(ref)
            if not pending:
                return
            done, pending = self._ray.wait(pending, num_returns=1)
            for ref in done:
                if before is not None:
                    before(index[ref])
                result = _unwrap(ref)
                self._submitted.discard(ref)  # collected: nothing left to cancel, or to pin
                yield index.pop(ref), result

    def map(
        self, fn: Callable[[S, U], R], units: Sequence[U], *, shared: S, desc: str | None = None
    ) -> list[R]:
        return self._map(fn, units, shared=shared, desc=desc)

    def unit_map(self) -> UnitMap:
        return self._map

    def memo(self) -> RunMemo:
        if self._store is None:
            self._store = self._ray.remote(_MemoStore).options(num_cpus=0).remote()
        return SharedMemo(self._store)

    def close(self) -> None:
        """Cancel the units still running, and shut down a cluster this executor started."""
        # Only units not finished: force-cancelling finished ones can abort Ray 2.60's
        # driver ("Tried to complete task that was not pending", seen in scripts/bench_ray.py).
        refs = list(self._submitted)
        with contextlib.suppress(Exception):
            _, refs = self._ray.wait(refs, num_returns=len(refs), timeout=0)
        for ref in refs:
            with contextlib.suppress(Exception):
                self._ray.cancel(ref, force=True)
        self._submitted.clear()
        if self._store is not None:
            with contextlib.suppress(Exception):
                self._ray.kill(self._store)
            self._store = None
        if self._owns and self._ray.is_initialized():
            self._ray.shutdown()
        self._owns = False
