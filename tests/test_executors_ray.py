"""The harness on Ray (issue 20, item 2): the same table as in-process on two simulated nodes,
a worker killed mid-cell, a killed driver resumed, every endpoint on 127.0.0.1.

The tests share one two-node cluster (``ray.cluster_utils.Cluster``: two simulated nodes on
this machine); the command-line test starts its own local cluster in a child process. No
Ray process outlives the module (checked by its fixture).

Every wait has a deadline scaled for the machine's load (``deadline`` in ``conftest.py``),
and each test phase a hard limit: on a loaded machine a test takes longer, and a failure
ends the test (its child processes killed with their process groups) instead of hanging
the suite.
"""

from __future__ import annotations

import contextlib
import csv
import math
import operator
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from alm_opacus.run import harness
from alm_opacus.run.config import RunConfig
from alm_opacus.run.executors import CLUSTER_EXTRA

ROOT = Path(__file__).resolve().parents[1]
#: A small grid with every kind of unit: baselines (dperm: its statements once depended on
#: which cells ran before them in a process), post-training methods sharing one
#: preparation (sampler chunks), DP-SGD (tuning, its own adaptive attacker), shadow and LiRA
#: reference banks in chunks of 4 heads.
SMALL = {
    "methods": ("alm", "laplace", "dperm", "dpsgd"),
    "epsilons": (1.0, 8.0),
    "noise_draws": 2,
    "attacks": ("loss", "shadow", "lira-offline"),
    "options": {"m": 16},
    "attack_options": {"num_shadow": 8, "num_reference": 8, "heads_per_seed": 4},
    "reproducible_noise": True,
    "progress": False,
}


def _cache(shared_cache: Path, where: Path) -> Path:
    """A cache holding only the shared pipeline's encoder and features (no heads)."""
    where.mkdir(parents=True)
    for pattern in ("encoder-*", "features-*"):
        for file in shared_cache.glob(pattern):
            shutil.copy2(file, where / file.name)
    return where


def _table(path: Path) -> dict[tuple[str, ...], dict[str, str]]:
    with path.open() as handle:
        rows = list(csv.DictReader(handle))
    table = {(r["method"], r["epsilon"], r["seed"], r["attack"]): r for r in rows}
    assert len(table) == len(rows), "a row is duplicated"
    return table


def _same_tables(a: Path, b: Path) -> None:
    """Every column but ``seconds`` of every row agrees exactly."""
    left, right = _table(a), _table(b)
    assert set(left) == set(right)
    for key, row in left.items():
        differing = {c for c in row if c != "seconds" and row[c] != right[key][c]}
        assert not differing, (key, {c: (row[c], right[key][c]) for c in differing})


ray = pytest.importorskip("ray", reason=f"the Ray tests need the cluster extra: {CLUSTER_EXTRA}")
#: Seconds each phase of a test may take on an idle machine (setup may pre-train the encoder
#: and run the small grid in-process), stretched for load by ``conftest.py``.
pytestmark = pytest.mark.hard_limit(900)


def _listening(pids: set[int]) -> list[tuple[int, str]]:
    """``(pid, local address)`` of every TCP socket the processes ``pids`` listen on."""
    inodes: dict[str, int] = {}
    for pid in pids:
        with_fd = Path(f"/proc/{pid}/fd")
        try:
            for fd in with_fd.iterdir():
                target = os.readlink(fd)
                if target.startswith("socket:["):
                    inodes[target[8:-1]] = pid
        except OSError:
            continue
    out = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and fields[9] in inodes:  # 0A: LISTEN
                out.append((inodes[fields[9]], fields[1]))
    return out


#: 127.0.0.1 in /proc/net/tcp (little-endian hex) and in tcp6 (IPv4-mapped or ::1).
LOOPBACK = ("0100007F:", "0000000000000000FFFF00000100007F:", "00000000000000000000000001000000:")


def _until_gone(list_ray_processes: Any, *, of: set[int], seconds: float) -> set[int]:
    """Wait until none of the processes ``of`` is a live Ray process, or ``seconds`` have
    passed; return the ones left."""
    end = time.monotonic() + seconds
    while (left := of & set(list_ray_processes())) and time.monotonic() < end:
        time.sleep(0.5)  # polling /proc: another process's exit raises no event here
    return left


@pytest.fixture(scope="module", autouse=True)
def no_stray_ray_processes(list_ray_processes: Any, deadline: Any) -> Iterator[None]:
    """Every test here shuts down the Ray processes it started: none outlives the module
    (only this process's descendants count: other sessions on the machine may run Ray)."""
    yield
    mine = set(list_ray_processes(os.getpid()))
    # a shut-down cluster's processes exit within seconds
    stray = _until_gone(list_ray_processes, of=mine, seconds=deadline(120))
    assert not stray, f"Ray processes left running after the tests: {stray}"


@pytest.fixture(scope="module")
def cluster(list_ray_processes: Any, deadline: Any) -> Iterator[Any]:
    """Two simulated nodes of one CPU each on this machine, on 127.0.0.1 only; shut down
    (and checked gone) at the end of the module."""
    from ray.cluster_utils import Cluster

    from alm_opacus.run.executors import loopback_only

    with loopback_only():
        small = 256 * 1024**2  # object store bytes per node: the tests' objects are small
        nodes = Cluster(
            initialize_head=True, head_node_args={"num_cpus": 1, "object_store_memory": small}
        )
        nodes.add_node(num_cpus=1, object_store_memory=small)
        ray.init(address=nodes.address, include_dashboard=False, configure_logging=False)
    try:
        nodes.wait_for_nodes(timeout=deadline(60))
        yield nodes
    finally:
        # its processes, recorded while they are this process's descendants
        mine = set(list_ray_processes(os.getpid()))
        ray.shutdown()
        nodes.shutdown()
    # (a node's dashboard agent can take over 30 s to notice on a loaded machine)
    left = _until_gone(list_ray_processes, of=mine, seconds=deadline(120))
    assert not left, left


@pytest.fixture(scope="module")
def in_process_small(
    default_pipeline: Any, shared_cache: Path, tmp_path_factory: pytest.TempPathFactory
) -> Path:
    """The small grid run in-process: the table the Ray runs must reproduce."""
    harness.load_plugins()  # dpsgd registers from the baselines plugin
    work = tmp_path_factory.mktemp("in_process")
    cache = _cache(shared_cache, work / "cache")
    harness.run(RunConfig(**SMALL, out=str(work / "run"), cache_dir=str(cache)))
    return work / "run" / "results.csv"


@pytest.mark.slow
def test_two_nodes_give_the_in_process_table(  # type: ignore[no-untyped-def]
    cluster,
    in_process_small: Path,
    default_pipeline: Any,
    shared_cache: Path,
    tmp_path: Path,
    list_ray_processes,
) -> None:
    from alm_opacus.run.executors import RayExecutor

    assert len([n for n in ray.nodes() if n["Alive"]]) == 2
    cache = _cache(shared_cache, tmp_path / "cache")
    config = RunConfig(**SMALL, out=str(tmp_path / "run"), cache_dir=str(cache))
    with RayExecutor() as executor:  # the connected cluster: left running by close()
        result = harness.run(config, executor=executor)
        listening = _listening(set(list_ray_processes(os.getpid())) | {os.getpid()})
    _same_tables(in_process_small, tmp_path / "run" / "results.csv")
    expected = {"none", "alm", "laplace", "dperm", "dpsgd", "no-leak"}  # and the reference
    assert {r.method for r in result.rows} == expected
    assert all(math.isfinite(r.utility_loss) for r in result.rows)  # filled by the driver
    # every Ray endpoint (GCS, raylets, object managers, workers, this driver) on loopback
    assert listening and all(addr.startswith(LOOPBACK) for _, addr in listening), listening
    assert ray.is_initialized()


@pytest.mark.slow
def test_collected_units_are_neither_kept_nor_cancelled(cluster) -> None:  # type: ignore[no-untyped-def]
    """Units collected by `as_completed` leave the executor's list: their results are not
    pinned for the rest of a run, and `close` cancels only units still running (Ray 2.60's
    driver can abort when a finished task is force-cancelled)."""
    from alm_opacus.run.executors import RayExecutor

    with RayExecutor() as executor:  # the connected cluster: left running by close()
        shared = executor.put(list(range(40)))
        got = sorted(executor.as_completed(operator.getitem, [(shared, i) for i in range(40)]))
        assert got == [(i, i) for i in range(40)]
        assert not executor._submitted
    assert ray.is_initialized()


def _dies_once(marker: str, fn: Any, *args: Any) -> Any:
    """The first attempt kills its own worker mid-task (as an OOM kill would); Ray's retry
    then computes ``fn(*args)``."""
    if not os.path.exists(marker):
        Path(marker).write_text(str(os.getpid()))
        os.kill(os.getpid(), signal.SIGKILL)
    return fn(*args)


@pytest.mark.slow
def test_a_worker_killed_mid_cell_leaves_no_duplicate_or_missing_row(  # type: ignore[no-untyped-def]
    cluster, in_process_small: Path, default_pipeline: Any, shared_cache: Path, tmp_path: Path
) -> None:
    from ray import cloudpickle

    from alm_opacus.run.executors import RayExecutor

    module = sys.modules[__name__]
    cloudpickle.register_pickle_by_value(module)  # workers cannot import the tests
    marker = tmp_path / "killed"

    class KillsOneCell(RayExecutor):
        def submit(self, fn: Any, *args: Any) -> Any:
            if fn is harness.cell_unit and args[1].method == "alm" and args[1].epsilon == 8.0:
                return super().submit(_dies_once, str(marker), fn, *args)
            return super().submit(fn, *args)

    cache = _cache(shared_cache, tmp_path / "cache")
    config = RunConfig(**SMALL, out=str(tmp_path / "run"), cache_dir=str(cache))
    try:
        with KillsOneCell() as executor:
            harness.run(config, executor=executor)
    finally:
        cloudpickle.unregister_pickle_by_value(module)
    killed = int(marker.read_text())
    assert killed != os.getpid() and not Path(f"/proc/{killed}").exists()  # a worker died
    _same_tables(in_process_small, tmp_path / "run" / "results.csv")


def _cli(*args: str) -> list[str]:
    return [sys.executable, str(ROOT / "scripts" / "compare.py"), "--no-progress", *args]


@pytest.mark.slow
def test_a_killed_driver_resumes_to_the_same_table(
    default_pipeline: Any,
    shared_cache: Path,
    tmp_path: Path,
    list_ray_processes: Any,
    processes: Any,
    deadline: Any,
) -> None:
    """The command line on its own local cluster: the driver is killed (SIGKILL) right after
    it has written its second cell, its cluster goes with it, and ``--resume`` finishes the
    table. The driver kills itself (``tests/_killed_driver.py``): polling ``results.csv``
    from outside raced the driver, which can write several cells at once.

    The killed cluster is the driver's descendants among Ray's processes, not every Ray
    process that appeared while it ran (the module's two-node cluster, or another session on
    this shared machine, may start some then: counted as the driver's, they outlived it and
    failed the test). Whatever of it is left at the end is killed, pass or fail; every wait
    has a deadline scaled for the machine's load."""
    flags = [
        "--methods",
        "alm",
        "--epsilons",
        "1,2,4,8",
        "--attacks",
        "loss",
        "--noise-draws",
        "1",
        "--m",
        "8",
        "--num-reference",
        "4",
        "--reproducible-noise",
    ]
    straight = tmp_path / "straight"
    cache = _cache(shared_cache, tmp_path / "cache")
    run_seconds = 600  # for one small run on an idle machine: generous
    straight_run = _cli(*flags, "--out", str(straight), "--cache-dir", str(cache))
    processes.run(straight_run, timeout=run_seconds, stdout=subprocess.DEVNULL, cwd=ROOT)
    out = tmp_path / "run"
    ray_cache = _cache(shared_cache, tmp_path / "ray-cache")
    flags = [*flags, "--out", str(out), "--cache-dir", str(ray_cache), "--executor", "ray"]
    log = tmp_path / "driver.log"
    killer = [
        sys.executable,
        str(ROOT / "tests" / "_killed_driver.py"),
        "2",
        "--no-progress",
        *flags,
    ]
    with log.open("w") as err:
        driver = processes.popen(killer, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=err)
    killed_cluster: set[int] = set()
    try:
        end = time.monotonic() + deadline(run_seconds)
        while True:  # the cluster it started, seen while it runs
            killed_cluster |= set(list_ray_processes(driver.pid))
            try:
                driver.wait(timeout=0.2)
                break
            except subprocess.TimeoutExpired:
                assert time.monotonic() < end, f"the driver still runs: {log.read_text()}"
        assert driver.returncode == -signal.SIGKILL, log.read_text()[-3000:]
        results = out / "results.csv"
        cells = {key[:2] for key in _table(results)}  # (method, epsilon)
        assert len(cells) == 2 and killed_cluster, cells  # two cells of five
        resume = [*_cli(*flags), "--resume"]
        processes.run(resume, timeout=run_seconds, stdout=subprocess.DEVNULL, cwd=ROOT)
        _same_tables(straight / "results.csv", results)
        # the killed driver's cluster shares its fate (its agents notice within about a minute)
        left = _until_gone(list_ray_processes, of=killed_cluster, seconds=deadline(120))
        assert not left, {p: list_ray_processes().get(p) for p in left}
    finally:  # what is left of the killed cluster, pass or fail
        for pid in killed_cluster & set(list_ray_processes()):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def _memo_unit(memo: Any, key: str, marker: str | None, seconds: float, fail: bool) -> Any:
    """A task reading ``key`` from the run's memo; computing it writes ``marker``, takes
    ``seconds`` and fails if ``fail``. Returns the value (unique to the computation that made
    it) or the error's message."""

    def compute() -> tuple[int, int]:
        if marker is not None:
            Path(marker).write_text("claimed")
        time.sleep(seconds)
        if fail:
            raise RuntimeError("the claimant failed")
        return os.getpid(), time.monotonic_ns()

    try:
        return memo.get(key, compute)
    except RuntimeError as exc:
        return str(exc)


@pytest.fixture
def by_value() -> Iterator[None]:
    """Workers cannot import the tests: this module's functions travel by value."""
    from ray import cloudpickle

    module = sys.modules[__name__]
    cloudpickle.register_pickle_by_value(module)
    try:
        yield
    finally:
        cloudpickle.unregister_pickle_by_value(module)


def _sleep(shared: None, seconds: float) -> None:
    time.sleep(seconds)


def _second_asks_while_first_computes(
    key: str, marker: Path, *, fail: bool, seconds: float
) -> tuple[Any, Any]:
    """Two tasks ask for ``key``; the second is submitted once the first has claimed it and is
    computing it (3 s). Half a CPU each: both run at once wherever Ray places them. On a
    loaded machine the second may come after the first is done: it then finds the value (or,
    after a failure, computes it), which the tests accept too. Each wait ends after
    ``seconds``."""
    from alm_opacus.run.executors import RayExecutor

    with RayExecutor(cpus_per_task=0.5) as executor:
        executor.map(_sleep, [1.0] * 4, shared=None)  # workers started: both tasks start now
        memo = executor.memo()
        first = executor.submit(_memo_unit, memo, key, str(marker), 3.0, fail)
        end = time.monotonic() + seconds
        while not marker.exists() and time.monotonic() < end:
            time.sleep(0.05)  # polling: the marker is written by another process
        second = executor.submit(_memo_unit, memo, key, None, 0.0, False)
        return ray.get(first, timeout=seconds), ray.get(second, timeout=seconds)


@pytest.mark.slow
def test_tasks_side_by_side_compute_a_shared_value_once(
    cluster: Any, by_value: None, tmp_path: Path, deadline: Any
) -> None:
    """The second task waits for the first's value instead of computing it again (two
    computations would give two different values)."""
    first, second = _second_asks_while_first_computes(
        "once", tmp_path / "m", fail=False, seconds=deadline(120)
    )
    assert isinstance(first, tuple) and second == first


@pytest.mark.slow
def test_a_failed_claimant_lets_a_waiter_compute(cluster, by_value, tmp_path, deadline) -> None:  # type: ignore[no-untyped-def]
    first, second = _second_asks_while_first_computes(
        "fails", tmp_path / "m", fail=True, seconds=deadline(120)
    )
    assert first == "the claimant failed"
    assert isinstance(second, tuple)  # computed by the task that waited


@pytest.mark.slow
def test_the_memo_store_gives_a_rerun_task_its_claim_back(cluster, deadline) -> None:  # type: ignore[no-untyped-def]
    """Ray re-runs a task whose worker died under the same task ID: it gets its claim back
    instead of waiting for itself; any other task waits until the value is put."""
    from alm_opacus.run.executors import RayExecutor

    with RayExecutor() as executor:
        store = executor.memo()._actor  # type: ignore[attr-defined]
        assert ray.get(store.claim.remote("n", "task-1")) == ("yours", None)
        assert ray.get(store.claim.remote("n", "task-1")) == ("yours", None)  # re-run
        assert ray.get(store.claim.remote("n", "task-2")) == ("claimed", None)
        assert ray.get(store.wait.remote("n", 0.2)) == (False, None)  # timed out
        waiting = store.wait.remote("n", 60.0)
        ray.get(store.put.remote("n", 7))
        assert ray.get(waiting, timeout=deadline(120)) == (True, 7)
        assert ray.get(store.claim.remote("n", "task-3")) == ("found", 7)
        assert ray.get(store.claim.remote("m", "task-1")) == ("yours", None)
        ray.get(store.release.remote("m"))  # a failed claimant: the next one computes
        assert ray.get(store.claim.remote("m", "task-2")) == ("yours", None)
