"""``scripts/bench_dpsgd.py``'s step benchmark is fair: Opacus is timed as shipped and in its
candidate configurations with glibc's malloc tuned (an environment each worker process is
created with), our ratio is taken against the fastest Opacus with ours in that one's
environment, and the block shows both baselines. No timings are asserted: only what the
benchmark computes from them and how it starts its processes."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

import bench_dpsgd  # noqa: E402
import bench_dpsgd_step as step  # noqa: E402

#: ms per part (forward_backward, clip, noise, rest) of each engine in the fake timings.
FAKE: dict[str, tuple[float, ...]] = {
    "opacus-hooks@shipped": (200.0, 20.0, 5.0, 1.0),
    "opacus-hooks@tuned": (70.0, 20.0, 5.0, 1.0),
    "opacus-ew@tuned": (50.0, 20.0, 5.0, 1.0),  # the best: 76 ms
    "opacus-functorch@tuned": (90.0, 20.0, 5.0, 1.0),
    "alm@shipped": (40.0, 25.0, 15.0, 1.0),
    "laplace@shipped": (40.0, 25.0, 14.0, 1.0),
    "gaussian@shipped": (40.0, 24.0, 10.0, 1.0),
    "alm@tuned": (35.0, 25.0, 15.0, 1.0),  # 76 ms: 1.0x the best
    "laplace@tuned": (35.0, 25.0, 14.0, 1.0),
    "gaussian@tuned": (35.0, 24.0, 10.0, 1.0),
}
META = {
    "model": "mlp",
    "parameters": 1_068_810,
    "batch": 64,
    "threads": 1,
    "rounds": 3,
    "block": 1,
    "device": "cpu",
    "processes": "one per engine",
    "tuned_environment": step.TUNED,
}


def _samples(parts: Mapping[str, tuple[float, ...]]) -> dict[str, list[list[float]]]:
    """Three steps per engine, in seconds, whose medians are ``parts``: the middle one."""
    out = {}
    for name, ms in parts.items():
        seconds = [m / 1e3 for m in ms]
        out[name] = [[2 * s for s in seconds], seconds, [s / 2 for s in seconds]]
    return out


def _report(parts: Mapping[str, tuple[float, ...]] = FAKE, **meta: Any) -> dict[str, Any]:
    device = meta.get("device", "cpu")
    engines = step.engines_for(device=device)
    return step.summarize(_samples(parts), engines=engines, meta=META | meta)


def test_on_a_cpu_opacus_is_timed_as_shipped_and_tuned_and_ours_in_both_environments() -> None:
    names = [e.name for e in step.engines_for(device="cpu")]
    assert names == list(FAKE)
    only_ew = [e.name for e in step.engines_for(device="cpu", modes=("ew",))]
    assert only_ew == ["opacus-hooks@shipped", "opacus-ew@tuned"] + [
        f"{k}@{a}" for a in ("shipped", "tuned") for k in step.OURS
    ]


def test_on_cuda_the_tuned_allocator_is_skipped() -> None:
    names = [e.name for e in step.engines_for(device="cuda")]
    assert names == [
        "opacus-hooks@shipped",
        "opacus-ew@shipped",
        "opacus-functorch@shipped",
        "alm@shipped",
        "laplace@shipped",
        "gaussian@shipped",
    ]


def test_the_tuned_environment_sets_both_variables_and_shipped_clears_any_tuning() -> None:
    base = {"HOME": "/h", "MALLOC_ARENA_MAX": "2", "GLIBC_TUNABLES": "glibc.malloc.x=1"}
    before = dict(os.environ)
    tuned = step.child_env("tuned", base=base)
    shipped = step.child_env("shipped", base=base)
    assert os.environ == before  # the parent's environment is left alone
    assert tuned["MALLOC_MMAP_MAX_"] == "0"
    assert tuned["MALLOC_TRIM_THRESHOLD_"] == "1099511627776"
    assert not {"MALLOC_ARENA_MAX", "GLIBC_TUNABLES"} & (set(tuned) | set(shipped))
    assert not any(k.startswith("MALLOC_") for k in shipped)
    assert tuned["HOME"] == shipped["HOME"] == "/h"
    # the child imports the alm_opacus this process imported
    import alm_opacus

    root = str(Path(alm_opacus.__file__).resolve().parents[1])
    assert shipped["PYTHONPATH"].split(os.pathsep)[0] == root
    with pytest.raises(ValueError, match="allocator='jemalloc' is invalid"):
        step.child_env("jemalloc")


def test_a_worker_starts_with_the_environment_of_its_allocator_and_times_a_step() -> None:
    # one real worker (the head: 5,770 weights): glibc reads the variables before Python
    # starts, so they must reach the process at its creation; the worker reports the ones
    # it started with and `hello` checks them
    engine = step.Engine("opacus", "tuned")
    worker = step.Worker(engine, model="head", width=64, threads=1, device="cpu")
    try:
        assert worker.hello() == 5770
        steps = worker.steps(1)
    finally:
        worker.close()
    assert worker.process.returncode == 0
    assert len(steps) == 1 and len(steps[0]) == len(step.PARTS)
    assert all(s >= 0 for s in steps[0])


def test_a_worker_in_another_environment_than_intended_is_refused() -> None:
    worker = object.__new__(step.Worker)
    worker.engine = step.Engine("alm", "tuned")
    worker.env = step.child_env("tuned")
    seen = {k: None for k in step.TUNED}
    worker.receive = lambda: {"parameters": 10, "environment": seen}  # type: ignore[method-assign]
    with pytest.raises(RuntimeError, match="alm@tuned started with malloc environment"):
        worker.hello()


def test_ours_is_compared_with_the_fastest_opacus_in_its_environment() -> None:
    report = _report()
    assert report["best"] == "opacus-ew@tuned"
    assert report["shipped"] == "opacus-hooks@shipped"
    assert report["engines"]["opacus-ew@tuned"]["total"] == pytest.approx(76.0)
    assert report["engines"]["opacus-ew@tuned"]["mode"] == "ew"
    alm = report["ratios"]["alm"]
    assert alm["total"] == pytest.approx(76.0 / 76.0)
    assert alm["without_noise"] == pytest.approx(61.0 / 71.0)
    assert alm["optimizer"] == pytest.approx(41.0 / 26.0)
    assert alm["clip"] == pytest.approx(25.0 / 20.0)
    assert report["ratios"]["gaussian"]["total"] == pytest.approx(70.0 / 76.0)
    # against Opacus as shipped: ours as shipped
    assert report["ratios_shipped"]["alm"]["total"] == pytest.approx(81.0 / 226.0)
    assert report["noise_share"]["alm@tuned"] == pytest.approx(15.0 / 76.0)


def test_when_opacus_as_shipped_is_fastest_ours_is_compared_as_shipped() -> None:
    parts = FAKE | {"opacus-hooks@shipped": (30.0, 20.0, 5.0, 1.0)}  # 56 ms
    report = _report(parts)
    assert report["best"] == report["shipped"] == "opacus-hooks@shipped"
    assert report["ratios"]["alm"]["total"] == pytest.approx(81.0 / 56.0)
    assert report["ratios"] == report["ratios_shipped"]


def test_the_block_shows_both_baselines_and_the_fair_ratio_first() -> None:
    text = bench_dpsgd.markdown([_report(), _report(model="head", parameters=5770, batch=256)])
    header, _, first, second = text.splitlines()[:4]
    assert header.index("best Opacus") < header.index("Opacus as shipped")
    cells = [c.strip() for c in first.strip("|").split("|")]
    assert cells == [
        "mlp, 1,068,810 weights, batch 64",
        "1.00x",
        f"{75 / 76:.2f}x",
        f"{70 / 76:.2f}x",
        f"{41 / 26:.2f}x / {40 / 26:.2f}x / {35 / 26:.2f}x",
        "76.0 (Opacus ew, tuned malloc)",
        "226.0",
        f"{81 / 226:.2f}x / {80 / 226:.2f}x / {75 / 226:.2f}x",
    ]
    assert second.startswith("| head, 5,770 weights, batch 256 | 1.00x")
    # every engine's row names its environment; the best is marked
    assert "| mlp | Opacus ew (best Opacus) | tuned | 76.0 (50.0 / 20.0 / 5.0 / 1.0) |" in text
    assert "| mlp | alm | shipped | 81.0 (40.0 / 25.0 / 15.0 / 1.0) |" in text
    assert "| mlp | Opacus hooks | shipped | 226.0 (200.0 / 20.0 / 5.0 / 1.0) |" in text
    assert "`MALLOC_MMAP_MAX_=0 MALLOC_TRIM_THRESHOLD_=1099511627776`" in text
    assert "over 3 rounds of 1 consecutive steps" in text


def test_the_cuda_block_says_why_the_allocator_was_not_tuned() -> None:
    cuda = {k: v for k, v in FAKE.items() if "@tuned" not in k} | {
        "opacus-ew@shipped": (50.0, 20.0, 5.0, 1.0),
        "opacus-functorch@shipped": (90.0, 20.0, 5.0, 1.0),
    }
    report = _report(cuda, device="cuda", tuned_environment=step.CUDA_SKIP)
    assert report["best"] == "opacus-ew@shipped"
    text = bench_dpsgd.markdown([report])
    assert "caching allocator" in text and "on cuda" in text
    assert "MALLOC_MMAP_MAX_" not in text


def test_the_bench_rows_quote_the_fair_ratio_first() -> None:
    rows = bench_dpsgd.format_rows({"steps": [_report()]})
    labels = [r[0] for r in rows]
    assert "best Opacus (Opacus ew, tuned malloc)" in labels[0]
    assert rows[1] == ("  alm: total (without noise)", f"1.00x ({61 / 71:.2f}x)", "<= 1.0x")
    assert rows[2][2] == "<= 1.2x"
    assert rows[3] == ("  alm: total against Opacus as shipped", f"{81 / 226:.2f}x", "")
    assert ("  Opacus as shipped / best Opacus, step (ms)", "226.0 / 76.0", "") in rows
    assert sum("malloc: backward / clip / noise / step" in label for label in labels) == 10


@pytest.fixture
def no_run(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    def refuse(**_: Any) -> None:
        raise AssertionError("the benchmark ran despite invalid arguments")

    monkeypatch.setattr(bench_dpsgd, "bench_dpsgd", refuse)
    return bench_dpsgd


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--rounds", "0"], "rounds=0 is invalid: expected an integer >= 1"),
        (["--block", "-1"], "block=-1 is invalid"),
        (["--width", "0"], "width=0 is invalid"),
        (["--device", "tpu"], "device='tpu' is invalid: expected one of ['cpu', 'cuda']"),
        (["--modes", "ew,ghost"], "modes=['ew', 'ghost'] is invalid"),
        (["--modes", ","], "modes=[] is invalid"),
        (["--modes", "ew", "--write", "docs/dpsgd_noise.md"], "--write with --modes ew"),
    ],
)
def test_invalid_arguments_exit_with_code_2_before_anything_runs(
    no_run: ModuleType, capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    with pytest.raises(SystemExit) as exit_:
        no_run.main(argv)
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_cuda_without_a_device_exits_with_code_2(
    no_run: ModuleType, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(step.torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit) as exit_:
        no_run.main(["--device", "cuda"])
    assert exit_.value.code == 2
    assert "torch.cuda.is_available() is False" in capsys.readouterr().err
    with pytest.raises(ValueError, match="device='cuda' is invalid"):
        step.bench_step(model="head", device="cuda")


def test_the_docs_block_is_written_from_the_cpu_only(
    no_run: ModuleType, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(step.torch.cuda, "is_available", lambda: True)
    with pytest.raises(SystemExit) as exit_:
        no_run.main(["--device", "cuda", "--write", "docs/dpsgd_noise.md"])
    assert exit_.value.code == 2
    assert "the docs hold the CPU step block only" in capsys.readouterr().err
