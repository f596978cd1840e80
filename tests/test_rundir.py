"""Run folders that stay true: bad input, interruptions and corruptions end in exit 2 with
one line, or in an identical table after ``--resume`` (issue 11, item 7)."""

from __future__ import annotations

import errno
import json
import math
import os
from pathlib import Path

import pytest

import alm_opacus.run.harness as harness
import alm_opacus.run.writer as writer
from alm_opacus.report.results import read_results
from alm_opacus.run.cli import main, parse_config
from alm_opacus.run.config import RunConfig
from alm_opacus.run.rundir import RunFolder

TINY = ["--methods", "none,alm", "--epsilons", "1", "--noise-draws", "1", "--attacks", "loss",
        "--m", "4", "--no-progress", "--reproducible-noise"]  # fmt: skip


def _exit(argv: list[str]) -> int:
    """The process exit code of ``alm-opacus argv`` (bad flags exit from the parser)."""
    try:
        return main(argv)
    except SystemExit as exc:
        return int(exc.code or 0)


def _run(out: Path, cache: Path, *extra: str) -> int:
    return _exit([*TINY, "--out", str(out), "--cache-dir", str(cache), *extra])


def _one_line_error(capsys: pytest.CaptureFixture[str], needle: str) -> None:
    err = capsys.readouterr().err.strip()
    assert needle in err, err
    assert len(err.splitlines()) == 1, err


def _table(out: Path) -> list[tuple[object, ...]]:
    return [(r.method, r.epsilon, r.attack, r.test_accuracy, r.mia_auc, r.statement)
            for r in read_results(out / "results.csv")]  # fmt: skip


@pytest.fixture(scope="module")
def finished(tmp_path_factory: pytest.TempPathFactory, shared_cache: Path) -> Path:
    """One finished tiny run, copied by the tests that damage it."""
    out = tmp_path_factory.mktemp("finished") / "run"
    assert _run(out, shared_cache) == 0
    return out


def _copy(src: Path, dst: Path) -> Path:
    import shutil

    shutil.copytree(src, dst, ignore=shutil.ignore_patterns(".lock"))
    return dst


@pytest.mark.slow
def test_a_second_run_into_a_finished_folder_is_refused(finished, tmp_path, shared_cache, capsys):  # type: ignore[no-untyped-def]
    out = _copy(finished, tmp_path / "run")
    before = (out / "results.csv").read_text()
    assert _run(out, shared_cache, "--epsilons", "2") == 2
    _one_line_error(capsys, "holds a previous run")
    assert (out / "results.csv").read_text() == before


@pytest.mark.slow
def test_resume_with_another_config_names_the_keys(finished, tmp_path, shared_cache, capsys):  # type: ignore[no-untyped-def]
    out = _copy(finished, tmp_path / "run")
    before = (out / "config.json").read_text()
    assert _run(out, shared_cache, "--resume", "--l2", "0.001", "--noise-draws", "2") == 2
    _one_line_error(capsys, "head.l2 (0.0001 vs 0.001)")
    assert (out / "config.json").read_text() == before


@pytest.mark.slow
def test_resume_after_an_interruption_gives_the_same_table(finished, tmp_path, shared_cache):  # type: ignore[no-untyped-def]
    out = tmp_path / "run"
    config = parse_config([*TINY, "--epsilons", "1,2", "--out", str(out), "--cache-dir",
                           str(shared_cache)])  # fmt: skip
    seen: list[harness.Cell] = []

    def stop_at_third(cell: harness.Cell) -> None:
        seen.append(cell)
        if len(seen) == 3:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        harness.run(config, on_cell=stop_at_third)
    # Two finished cells, nothing partial (alm's cell has a noise-aware and a clean row).
    partial = read_results(out / "results.csv")
    assert sorted((r.method, r.epsilon, r.attack) for r in partial) == [
        ("alm", 1.0, "loss"), ("alm", 1.0, "loss-clean"), ("none", math.inf, "loss")]  # fmt: skip
    resumed = harness.run(RunConfig(**{**config.__dict__, "resume": True}))
    straight = tmp_path / "straight"
    harness.run(RunConfig(**{**config.__dict__, "out": str(straight)}))
    assert _table(out) == _table(straight)
    assert len(resumed.rows) == 1 + 2 + 2
    settings = json.loads((out / "config.json").read_text())
    assert settings["epsilons"] == [1.0, 2.0]


@pytest.mark.slow
def test_overwrite_replaces_results_and_tensorboard(finished, tmp_path, shared_cache):  # type: ignore[no-untyped-def]
    out = _copy(finished, tmp_path / "run")
    stale = out / "tb" / "stale.tfevents"
    stale.write_text("old")
    assert _run(out, shared_cache, "--overwrite", "--methods", "none") == 0
    assert not stale.exists()
    assert {r.method for r in read_results(out / "results.csv")} == {"none"}


def test_a_locked_folder_is_refused(tmp_path, capsys):  # type: ignore[no-untyped-def]
    out = tmp_path / "run"
    with RunFolder(out, resume=False, overwrite=False):
        assert _exit([*TINY, "--out", str(out)]) == 2
    _one_line_error(capsys, "in use by another run")


@pytest.mark.parametrize(
    "argv,needle",
    [
        (["--dataset", "cifar10"], "cifar"),
        (["--device", "cuda"], "CUDA is not available"),
    ],
)
def test_errors_before_the_run_write_nothing(tmp_path, capsys, argv, needle, monkeypatch):  # type: ignore[no-untyped-def]
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    out = tmp_path / "fresh"
    assert _exit([*TINY, "--out", str(out), "--cache-dir", str(tmp_path / "c"), *argv]) == 2
    _one_line_error(capsys, needle)
    assert not out.exists()


@pytest.mark.slow
def test_a_failed_run_leaves_the_previous_folder_untouched(finished, tmp_path, capsys):  # type: ignore[no-untyped-def]
    out = _copy(finished, tmp_path / "run")
    stamp = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}
    assert _exit([*TINY, "--out", str(out), "--overwrite", "--dataset", "cifar10"]) == 2
    _one_line_error(capsys, "cifar")
    assert {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()} == stamp


def test_cache_dir_naming_a_file_exits_2(tmp_path, capsys):  # type: ignore[no-untyped-def]
    cache = tmp_path / "cache"
    cache.write_text("not a folder")
    assert _exit([*TINY, "--out", str(tmp_path / "run"), "--cache-dir", str(cache)]) == 2
    _one_line_error(capsys, "--cache-dir")


@pytest.mark.slow
def test_a_truncated_results_table_is_named_on_resume(finished, tmp_path, shared_cache, capsys):  # type: ignore[no-untyped-def]
    out = _copy(finished, tmp_path / "run")
    text = (out / "results.csv").read_text()
    (out / "results.csv").write_text(text[: len(text) - 40])  # cut mid-row
    assert _run(out, shared_cache, "--resume") == 2
    _one_line_error(capsys, "results.csv: line 4")  # header, none, alm, alm-clean (cut)


@pytest.mark.slow
def test_a_full_disk_is_one_line(tmp_path, shared_cache, capsys, monkeypatch):  # type: ignore[no-untyped-def]
    def full(path: object, rows: object) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))

    monkeypatch.setattr(writer, "write_results", full)
    assert _run(tmp_path / "run", shared_cache) == 2
    _one_line_error(capsys, "No space left on device")


@pytest.mark.slow
def test_planted_symlinks_are_never_written_through(finished, tmp_path, shared_cache, capsys):  # type: ignore[no-untyped-def]
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    out = _copy(finished, tmp_path / "run")
    (out / "rocs.json").unlink()
    (out / "rocs.json").symlink_to(victim)
    (out / ".write-test").symlink_to(victim)
    assert _run(out, shared_cache, "--overwrite") == 0
    assert victim.read_text() == "precious"
    assert not (out / "rocs.json").is_symlink()
    fresh = tmp_path / "locked"
    fresh.mkdir()
    (fresh / ".lock").symlink_to(victim)
    assert _run(fresh, shared_cache) == 2
    _one_line_error(capsys, "lock file")
    assert victim.read_text() == "precious"


@pytest.mark.parametrize(
    "yaml_text,needle",
    [
        ("noise-draws: true\n", "--noise-draws"),
        ("resume: 'yes'\n", "--resume: expected true or false"),
        ("sensitivity: bogus\n", "--sensitivity='bogus'"),
        ("opt: [nokey]\n", "KEY=VALUE"),
    ],
)
def test_yaml_values_go_through_the_flag_parsers(tmp_path, capsys, yaml_text, needle):  # type: ignore[no-untyped-def]
    cfg = tmp_path / "run.yaml"
    cfg.write_text(yaml_text)
    with pytest.raises(SystemExit) as info:
        parse_config(["--config", str(cfg), "--out", str(tmp_path / "o")])
    assert info.value.code == 2
    _one_line_error(capsys, needle)


def test_duplicates_merge_and_close_epsilons_keep_their_own_labels(tmp_path) -> None:  # type: ignore[no-untyped-def]
    config = parse_config(["--methods", "alm,none,alm", "--seeds", "1,1,2", "--epsilons",
                           "0.1,0.1,0.1000001", "--out", str(tmp_path)])  # fmt: skip
    assert config.methods == ("alm", "none") and config.seeds == (1, 2)
    assert config.epsilons == (0.1, 0.1000001)
    keys = {cell.key for cell in harness.plan_cells(config)}
    assert ("alm", "0.1", 1) in keys and ("alm", "0.1000001", 1) in keys


def test_options_are_typed_and_named(tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    config = parse_config(["--opt", "alm.m=7", "--opt", "gamma=0.1", "--out", str(tmp_path)])
    from alm_opacus.methods import method_options

    alm = method_options("alm", config.options)
    laplace = method_options("laplace", config.options)
    assert (alm.m, alm.gamma) == (7, 0.1) and (laplace.m, laplace.gamma) == (200, 0.1)  # type: ignore[attr-defined]
    for bad, needle in ((["--opt", "alm.m=many"], "alm.m='many'"),
                        (["--opt", "alm.nosuch=1"], "unknown option alm.nosuch"),
                        (["--opt", "nosuch.m=1"], "unknown method 'nosuch'")):  # fmt: skip
        with pytest.raises(SystemExit):
            parse_config([*bad, "--out", str(tmp_path)])
        _one_line_error(capsys, needle)
