"""Executors (issue 20, item 2): the in-process default, which never imports Ray, and the
command line without the cluster extra. The Ray executor: ``test_executors_ray.py``."""

from __future__ import annotations

import subprocess
import sys
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


def test_an_in_process_run_imports_no_ray(default_pipeline: Any, tmp_path: Path) -> None:
    # in a fresh interpreter: Ray may already be imported in this one by other tests
    code = (
        "import sys\n"
        "from alm_opacus.run.harness import RunConfig, run\n"
        f"run(RunConfig(methods=('none',), attacks=('loss',), out={str(tmp_path / 'run')!r}, "
        f"cache_dir={str(default_pipeline.config.cache_path)!r}, progress=False))\n"
        "assert 'ray' not in sys.modules, sorted(m for m in sys.modules if 'ray' in m)\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)
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
