"""Shared fixtures. The SimCLR pipeline on digits is built once per session and cached."""

from __future__ import annotations

import contextlib
import faulthandler
import math
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from alm_opacus.data import Dataset, load_dataset
from alm_opacus.registry import Registry
from alm_opacus.report.results import ResultRow

#: The required fields of a results row, as the unprotected head's (method ``none``) at seed 0.
ROW_DEFAULTS: dict[str, object] = {
    "dataset": "digits",
    "method": "none",
    "epsilon": math.inf,
    "delta": 0.0,
    "guarantee": "none",
    "sensitivity": math.nan,
    "noise_scale": math.nan,
    "seed": 0,
    "test_accuracy": 0.9,
    "utility_loss": 0.0,
}


def make_row(**fields: object) -> ResultRow:
    """A results row: :data:`ROW_DEFAULTS` with ``fields`` set (any ``ResultRow`` field)."""
    return ResultRow(**(ROW_DEFAULTS | fields))  # type: ignore[arg-type]


@pytest.fixture
def result_row() -> Callable[..., ResultRow]:
    """:func:`make_row`, as a fixture (tests cannot import conftest in importlib mode): the
    one builder of hand-made results rows."""
    return make_row


def _fresh_python(code: str) -> subprocess.CompletedProcess[str]:
    env = {"PYTHONPATH": str(Path(__file__).resolve().parents[1]), "PATH": "/usr/bin:/bin"}
    return subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600
    )


@pytest.fixture
def fresh_python() -> Callable[[str], subprocess.CompletedProcess[str]]:
    """``run(code)``: ``code`` in a new interpreter on this checkout (what it imports is then
    what the code imports), its output captured; a fixture, as conftest is not importable."""
    return _fresh_python


#: The most a deadline is stretched for the machine's load (a hang still ends).
MAX_LOAD_SCALE = 6.0


def load_scale() -> float:
    """How many times slower than on an idle machine work may run now: the last minute's
    load per CPU (at least 1, at most :data:`MAX_LOAD_SCALE`), times
    ``$ALM_OPACUS_TEST_TIME_SCALE`` (default 1) for a machine known to be slow."""
    try:
        per_cpu = os.getloadavg()[0] / (os.cpu_count() or 1)
    except OSError:  # no load average on this platform
        per_cpu = 1.0
    factor = float(os.environ.get("ALM_OPACUS_TEST_TIME_SCALE", "1"))
    return min(MAX_LOAD_SCALE, max(1.0, per_cpu)) * factor


def scaled(seconds: float) -> float:
    """``seconds`` (a generous deadline on an idle machine) stretched for the load now."""
    return seconds * load_scale()


class HardLimitExceeded(BaseException):
    """A test phase ran past its ``hard_limit`` (a BaseException: ``except Exception`` in the
    code under test cannot swallow it; pytest reports it as the test's failure)."""


@contextlib.contextmanager
def _hard_limit(item: pytest.Item, phase: str) -> Iterator[None]:
    """Bound one phase (setup, call, teardown) of a test marked ``hard_limit(seconds)``.

    At the limit (scaled for load) SIGALRM raises :class:`HardLimitExceeded` in the test:
    waits in ``time.sleep``, ``subprocess`` and ``ray.get`` are interrupted, and the test's
    ``finally`` blocks and fixtures end what it started. A test stuck where no signal is
    handled (native code that never returns to Python) gets a grace period, then every
    thread's stack is printed and the session exits: a failed suite, never a hung one.
    """
    marker = item.get_closest_marker("hard_limit")
    if marker is None or threading.current_thread() is not threading.main_thread():
        yield
        return
    limit = scaled(float(marker.args[0]))

    def expire(signum: int, frame: Any) -> None:
        raise HardLimitExceeded(
            f"{item.nodeid}: {phase} ran past its hard limit of {limit:.0f} s "
            f"({marker.args[0]} s scaled for load)"
        )

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, limit)
    faulthandler.dump_traceback_later(limit + max(60.0, limit / 4), exit=True)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        faulthandler.cancel_dump_traceback_later()
        signal.signal(signal.SIGALRM, previous)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Iterator[None]:
    with _hard_limit(item, "setup"):
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    with _hard_limit(item, "call"):
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    with _hard_limit(item, "teardown"):
        return (yield)


class ProcessGroups:
    """Child processes of a test, each leading its own process group (``start_new_session``),
    so that the test can end a child with everything it started (a Ray driver's cluster, the
    workers of a launcher). :meth:`close` (the fixture's teardown) kills every group still
    alive, whether the test passed, failed or ran out of time."""

    def __init__(self) -> None:
        self.started: list[subprocess.Popen[Any]] = []

    def popen(self, command: Sequence[str], **kwargs: Any) -> subprocess.Popen[Any]:
        process = subprocess.Popen(command, start_new_session=True, **kwargs)
        self.started.append(process)
        return process

    def run(
        self, command: Sequence[str], *, timeout: float, check: bool = True, **kwargs: Any
    ) -> subprocess.CompletedProcess[Any]:
        """``subprocess.run`` in its own process group, killed with its group after
        ``timeout`` seconds (scaled for load): a failure, never a hang.

        Raises:
            AssertionError: the command ran past its deadline, or (``check``) failed; the
                message holds the end of its output when it was captured.
        """
        limit = scaled(timeout)
        process = self.popen(command, **kwargs)
        try:
            out, err = process.communicate(timeout=limit)
        except subprocess.TimeoutExpired:
            self.kill(process)
            out, err = process.communicate()
            raise AssertionError(
                f"{_short(command)} did not finish in {limit:.0f} s; it was killed with its "
                f"process group{_tail(out, err)}"
            ) from None
        done = subprocess.CompletedProcess(process.args, process.returncode, out, err)
        if check and done.returncode != 0:
            raise AssertionError(
                f"{_short(command)} exited with {done.returncode}{_tail(out, err)}"
            )
        return done

    def wait(self, process: subprocess.Popen[Any], *, timeout: float) -> int:
        """The exit status of ``process``, which must end within ``timeout`` seconds (scaled
        for load); else it is killed with its group and the test fails."""
        limit = scaled(timeout)
        try:
            return process.wait(timeout=limit)
        except subprocess.TimeoutExpired:
            self.kill(process)
            process.wait()
            raise AssertionError(
                f"{_short(process.args)} did not end in {limit:.0f} s; it was killed with its "
                "process group"
            ) from None

    @staticmethod
    def kill(process: subprocess.Popen[Any]) -> None:
        """SIGKILL the process's group (the group outlives its leader while members live)."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, signal.SIGKILL)

    def close(self) -> None:
        for process in self.started:
            self.kill(process)
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=scaled(30))
        self.started.clear()


def _short(command: Any) -> str:
    words = [str(w) for w in (command if isinstance(command, (list, tuple)) else [command])]
    words = [Path(w).name if w == sys.executable or w.endswith(".py") else w for w in words]
    text = " ".join(words)
    return text if len(text) <= 120 else text[:117] + "..."


def _tail(out: Any, err: Any) -> str:
    parts = [x.decode(errors="replace") if isinstance(x, bytes) else x for x in (out, err) if x]
    text = "".join(parts)
    return f"; its output ends:\n{text[-3000:]}" if text else ""


@pytest.fixture
def processes() -> Iterator[ProcessGroups]:
    """:class:`ProcessGroups`: start children whose groups end with the test."""
    groups = ProcessGroups()
    try:
        yield groups
    finally:
        groups.close()


@pytest.fixture(scope="session")
def deadline() -> Any:
    """:func:`scaled`, for tests (``tests`` is not a package to import from)."""
    return scaled


@pytest.fixture(scope="session", autouse=True)
def _encoder_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Runs without ``--cache-dir`` cache their public encoder in the user's cache: point it
    at a folder of this session, so tests never write into the home folder."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("ALM_OPACUS_ENCODER_CACHE", str(tmp_path_factory.mktemp("encoders")))
        yield


@pytest.fixture(scope="session")
def digits() -> Dataset:
    return load_dataset("digits")


@pytest.fixture(scope="session")
def pixel_features(digits: Dataset) -> tuple[torch.Tensor, torch.Tensor]:
    """Raw digits pixels as unit-norm 64-d features: a fast stand-in for SimCLR features."""
    x = torch.from_numpy(digits.images.reshape(len(digits.images), -1).astype(np.float64))
    return torch.nn.functional.normalize(x, dim=1), torch.from_numpy(digits.labels)


@pytest.fixture(scope="session")
def shared_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One encoder/feature cache for every test that runs the default digits pipeline."""
    return tmp_path_factory.mktemp("alm_cache")


@pytest.fixture(scope="session")
def default_pipeline(shared_cache: Path, tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    """The default digits pipeline (split, SimCLR encoder, features), built once."""
    from alm_opacus.run.harness import RunConfig, plan_run, prepare

    out = tmp_path_factory.mktemp("pipeline_run")
    config = RunConfig(out=str(out), cache_dir=str(shared_cache), progress=False)
    return prepare(plan_run(config))


@pytest.fixture
def make_context(pixel_features):  # type: ignore[no-untyped-def]
    """A MethodContext on digits pixels with public rows 200:500, for method tests.

    Keyword arguments set other ``MethodContext`` fields (``schedule``, ``noise``,
    ``cache_dir``, ...); method options go to ``create_method`` instead.
    """
    from alm_opacus.heads import HeadConfig
    from alm_opacus.methods import MethodContext

    x, y = pixel_features

    def make(**fields: object) -> MethodContext:
        defaults = {
            "num_classes": 10,
            "head": HeadConfig(),
            "public_features": x[200:500],
            "public_labels": y[200:500],
        }
        return MethodContext(**{**defaults, **fields})  # type: ignore[arg-type]

    return make


def _parent(pid: int) -> int | None:
    """The parent of process ``pid``; ``None`` once it has exited."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[1])  # the field after the state


def ray_processes(descended_from: int | None = None) -> dict[int, str]:
    """Ray's processes on this machine (GCS, raylet, agents, workers): pid -> command line.

    ``descended_from``: only the descendants of that process (a driver's GCS and raylet are
    its children, the raylet's workers and agents theirs). The machine is shared: Ray
    processes of other sessions come and go, and a test must count only its own. A process
    whose parent died is adopted by init and is nobody's descendant any more: record a
    cluster's processes while it runs.
    """
    found = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as handle:
                cmd = handle.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if cmd.startswith("ray::") or "/site-packages/ray/" in cmd:
            found[int(entry)] = cmd[:160]
    if descended_from is None:
        return found
    mine = {}
    for pid, cmd in found.items():
        ancestor = pid
        while ancestor not in (0, 1, descended_from):
            parent = _parent(ancestor)
            if parent is None:  # it or an ancestor has just exited
                break
            ancestor = parent
        if ancestor == descended_from:
            mine[pid] = cmd
    return mine


@pytest.fixture(scope="session")
def list_ray_processes():  # type: ignore[no-untyped-def]
    """:func:`ray_processes`, for tests (``tests`` is not a package to import from)."""
    return ray_processes


@pytest.fixture
def isolated_registries() -> Iterator[None]:
    """Every registration a test makes (methods, datasets, attacks, ...) vanishes after it."""
    with Registry.isolated():
        yield
