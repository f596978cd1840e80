"""Executors (issue 20, item 2): the in-process default, which never imports Ray, and the
command line without the cluster extra. The Ray executor: ``test_executors_ray.py``."""

from __future__ import annotations

import contextlib
import socket
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from alm_opacus.run.cli import main
from alm_opacus.run.executors import (
    CLUSTER_EXTRA,
    InProcessExecutor,
    create_executor,
    import_ray,
)
from alm_opacus.run.ray_address import RayAddress, cluster_address, parse_ray_address

ROOT = Path(__file__).resolve().parents[1]


def test_in_process_units_are_lazy_computed_once_and_in_order() -> None:
    calls: list[str] = []

    def unit(name: str, *inputs: int) -> int:
        calls.append(name)
        return len(calls) + sum(inputs)

    executor = InProcessExecutor()
    shared = executor.submit(unit, "shared")
    assert calls == []  # nothing runs before it is asked for
    seen: list[int] = []
    out = executor.as_completed(unit, [(f"cell{i}", shared) for i in range(3)], before=seen.append)
    assert next(out) == (0, 3) and calls == ["shared", "cell0"] and seen == [0]
    assert list(out) == [(1, 4), (2, 5)]  # the shared unit computed once, first
    assert calls == ["shared", "cell0", "cell1", "cell2"] and seen == [0, 1, 2]
    assert executor.map(lambda s, u: s * u, [1, 2, 3], shared=10) == [10, 20, 30]


def test_unknown_executor_is_named() -> None:
    with pytest.raises(
        ValueError, match=r"unknown executor .dask.: expected one of in-process, ray"
    ):
        create_executor("dask")


@pytest.mark.hard_limit(600)
def test_an_in_process_run_imports_no_ray(
    default_pipeline: Any, shared_cache: Path, tmp_path: Path, processes: Any
) -> None:
    # in a fresh interpreter: Ray may already be imported in this one by other tests
    code = (
        "import sys\n"
        "from alm_opacus.run.harness import RunConfig, run\n"
        f"run(RunConfig(methods=('none',), attacks=('loss',), out={str(tmp_path / 'run')!r}, "
        f"cache_dir={str(shared_cache)!r}, progress=False))\n"
        "assert 'ray' not in sys.modules, sorted(m for m in sys.modules if 'ray' in m)\n"
    )
    processes.run([sys.executable, "-c", code], timeout=300, cwd=ROOT)
    assert (tmp_path / "run" / "results.csv").exists()


def test_without_ray_the_cli_names_the_extra_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # what `import ray` meets when it is absent
    with pytest.raises(SystemExit) as stop:
        main(["--executor", "ray", "--out", str(tmp_path / "run")])
    assert stop.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and CLUSTER_EXTRA in err and "--executor ray" in err
    assert not (tmp_path / "run").exists()
    with pytest.raises(ValueError, match=r"\.\[cluster\]"):
        import_ray()


def test_a_ray_address_needs_the_ray_executor(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(SystemExit) as stop:
        main(["--ray-address", "127.0.0.1:6379", "--out", str(tmp_path / "run")])
    assert stop.value.code == 2 and "needs --executor ray" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("address", "why"),
    [
        ("256.1.1.1:6379", "256.1.1.1 is not an IPv4 address"),
        ("127.0.0.1:0", "port '0' is not a number in 1..65535"),
        ("127.0.0.1:65536", "port '65536' is not a number in 1..65535"),
        ("127.0.0.1", "no port"),
        (":6379", "no host"),
        ("0.0.0.0:6379", "0.0.0.0 is not the address of a machine"),
        ("head_node:6379", "'head_node' is not a host name"),
        ("http://10.0.0.1:6379", "unknown scheme"),
    ],
)
def test_a_malformed_ray_address_is_refused_in_one_line_before_anything_is_written(
    address: str, why: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Checked for form only: nothing connects anywhere (256.1.1.1 is never tried)."""
    with pytest.raises(SystemExit) as stop:
        main(["--executor", "ray", "--ray-address", address, "--out", str(tmp_path / "run")])
    assert stop.value.code == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert f"--ray-address={address!r}: {why}" in line
    assert not (tmp_path / "run").exists()


def test_a_malformed_ray_address_in_the_environment_is_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.1:99999")
    with pytest.raises(SystemExit) as stop:
        main(["--executor", "ray", "--out", str(tmp_path / "run")])
    assert stop.value.code == 2
    assert "RAY_ADDRESS='10.0.0.1:99999': port '99999'" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()
    with pytest.raises(ValueError, match=r"RAY_ADDRESS='10\.0\.0\.1:99999': port"):
        cluster_address(None)  # the Python API's check


@pytest.mark.parametrize("seconds", ["0", "-1", "nan", "inf"])
def test_a_ray_connect_timeout_must_be_a_positive_number_of_seconds(
    seconds: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["--executor", "ray", "--ray-connect-timeout", seconds, "--out", str(tmp_path / "r")]
    with pytest.raises(SystemExit) as stop:
        main(argv)
    assert stop.value.code == 2
    assert "expected a positive number of seconds" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["--ray-connect-timeout", "5", "--out", str(tmp_path / "r")])
    assert "--ray-connect-timeout=5.0 needs --executor ray" in capsys.readouterr().err
    assert not (tmp_path / "r").exists()


def test_well_formed_ray_addresses_are_kept_as_written() -> None:
    assert str(parse_ray_address("head-1.example.org:6379")) == "head-1.example.org:6379"
    assert parse_ray_address("[::1]:6379") == RayAddress(host="::1", port=6379)
    assert str(parse_ray_address("[::1]:6379")) == "[::1]:6379"
    client = parse_ray_address("ray://10.0.0.1:10001")
    assert client == RayAddress(host="10.0.0.1", port=10001, client=True)
    assert str(client) == "ray://10.0.0.1:10001"
    assert parse_ray_address("auto") == "auto"  # Ray finds the cluster `ray start` started
    assert parse_ray_address("local") is None and parse_ray_address("") is None


@pytest.fixture
def closed_port() -> int:
    """A port on 127.0.0.1 that nothing listens on (bound, then released)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_a_ray_address_nothing_listens_on_is_refused_naming_it(
    closed_port: int, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    address = f"127.0.0.1:{closed_port}"
    with pytest.raises(SystemExit) as stop:
        main(["--executor", "ray", "--ray-address", address, "--out", str(tmp_path / "run")])
    assert stop.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"--ray-address={address!r}: cannot reach" in err
    assert not (tmp_path / "run").exists()
    with pytest.raises(ValueError, match=f"address={address!r}: cannot reach"):
        cluster_address(address)  # the Python API's check, before ray.init


@pytest.fixture
def silent_port() -> Iterator[int]:
    """A port on 127.0.0.1 that never answers: its listener's backlog is full and nothing
    accepts, so the kernel drops further connection requests (no traffic leaves the host)."""
    with contextlib.ExitStack() as stack:
        listener = stack.enter_context(socket.socket())
        listener.bind(("127.0.0.1", 0))
        listener.listen(0)
        port = int(listener.getsockname()[1])
        for _ in range(3):  # more than the backlog holds
            client = stack.enter_context(socket.socket())
            client.setblocking(False)
            client.connect_ex(("127.0.0.1", port))
        yield port


def test_a_ray_address_that_never_answers_is_given_up_after_the_connect_timeout(
    silent_port: int, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    address = f"127.0.0.1:{silent_port}"
    timeout = ["--ray-connect-timeout", "0.5"]
    argv = ["--executor", "ray", "--ray-address", address, *timeout, "--out", str(tmp_path / "r")]
    with pytest.raises(SystemExit) as stop:
        main(argv)
    assert stop.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert f"--ray-address={address!r}: no answer from a Ray cluster within 0.5 s" in err
    assert not (tmp_path / "r").exists()
