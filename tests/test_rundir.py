"""Run folders that stay true: bad input, interruptions and corruptions end in exit 2 with
one line, or in an identical table after ``--resume`` (issue 11, item 7)."""

from __future__ import annotations

import dataclasses
import errno
import json
import math
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

import alm_opacus.run.harness as harness
import alm_opacus.run.writer as writer
from alm_opacus.report.results import ResultRow, format_csv, read_results, write_results
from alm_opacus.run.cli import main, parse_config
from alm_opacus.run.config import RunConfig
from alm_opacus.run.harness import load_plugins
from alm_opacus.run.row_rules import SCALE_TOLERANCE, row_rule_problem
from alm_opacus.run.rundir import DEFAULT_CACHE, SHARED_FILES, SPLIT_FILE, RunFolder, check_rows

TINY = [
    "--methods",
    "none,alm",
    "--epsilons",
    "1",
    "--noise-draws",
    "1",
    "--attacks",
    "loss",
    "--m",
    "4",
    "--no-progress",
    "--reproducible-noise",
]


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
    return [
        (r.method, r.epsilon, r.attack, r.test_accuracy, r.mia_auc, r.statement)
        for r in read_results(out / "results.csv")
    ]


@pytest.fixture(scope="module")
def finished(tmp_path_factory: pytest.TempPathFactory, shared_cache: Path) -> Path:
    """One finished tiny run with its cache in the default place (``private/cache``), copied
    by the tests that damage it; its encoder and features seed the shared cache."""
    out = tmp_path_factory.mktemp("finished") / "run"
    _share(shared_cache, out / DEFAULT_CACHE)
    assert _exit([*TINY, "--out", str(out)]) == 0
    _share(out / DEFAULT_CACHE, shared_cache)
    return out


def _share(src: Path, dst: Path) -> None:
    """Copy the encoder and features caches from ``src`` to ``dst`` (pre-training is the
    slow part of a tiny run)."""
    import shutil

    dst.mkdir(parents=True, exist_ok=True)
    for path in [*src.glob("encoder-*.pt"), *src.glob("features-*.pt")]:
        if not (dst / path.name).exists():
            shutil.copyfile(path, dst / path.name)


def _copy(src: Path, dst: Path) -> Path:
    import shutil

    shutil.copytree(src, dst, ignore=shutil.ignore_patterns(".lock", "cache"))
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
    config = parse_config(
        [*TINY, "--epsilons", "1,2", "--out", str(out), "--cache-dir", str(shared_cache)]
    )
    seen: list[harness.Cell] = []

    def stop_at_third(cell: harness.Cell) -> None:
        seen.append(cell)
        if len(seen) == 3:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        harness.run(config, on_cell=stop_at_third)
    # Two finished cells, nothing partial (alm's cell has a noise-aware and a clean row;
    # the no-leak reference comes last in the seed).
    partial = read_results(out / "results.csv")
    assert sorted((r.method, r.epsilon, r.attack) for r in partial) == [
        ("alm", 1.0, "loss"),
        ("alm", 1.0, "loss-clean"),
        ("none", math.inf, "loss"),
    ]
    resumed = harness.run(RunConfig(**{**config.__dict__, "resume": True}))
    straight = tmp_path / "straight"
    harness.run(RunConfig(**{**config.__dict__, "out": str(straight)}))
    assert _table(out) == _table(straight)
    # the curves too: the resumed run appended to the interrupted run's lines
    assert (out / "rocs.jsonl").read_bytes() == (straight / "rocs.jsonl").read_bytes()
    assert len(resumed.rows) == 1 + 2 + 2 + 1  # none, alm at 1 and 2, the no-leak reference
    settings = json.loads((out / "config.json").read_text())
    assert settings["epsilons"] == [1.0, 2.0]


@pytest.mark.slow
def test_overwrite_replaces_results_and_tensorboard(finished, tmp_path, shared_cache):  # type: ignore[no-untyped-def]
    out = _copy(finished, tmp_path / "run")
    stale = out / "tb" / "stale.tfevents"
    stale.write_text("old")
    assert _run(out, shared_cache, "--overwrite", "--methods", "none") == 0
    assert not stale.exists()
    assert {r.method for r in read_results(out / "results.csv")} == {"none", "no-leak"}


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
    _one_line_error(capsys, "results.csv: line 5")  # header, none, alm, alm-clean, no-leak (cut)


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
    (out / "rocs.jsonl").unlink()
    (out / "rocs.jsonl").symlink_to(victim)
    (out / ".write-test").symlink_to(victim)
    assert _run(out, shared_cache, "--overwrite") == 0
    assert victim.read_text() == "precious"
    assert not (out / "rocs.jsonl").is_symlink()
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
    config = parse_config(
        [
            "--methods",
            "alm,none,alm",
            "--seeds",
            "1,1,2",
            "--epsilons",
            "0.1,0.1,0.1000001",
            "--out",
            str(tmp_path),
        ]
    )
    assert config.methods == ("alm", "none") and config.seeds == (1, 2)
    assert config.epsilons == (0.1, 0.1000001)
    keys = {cell.key for cell in harness.plan_run(config).cells}
    assert ("alm", "0.1", 1) in keys and ("alm", "0.1000001", 1) in keys


def test_options_are_typed_and_named(tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    config = parse_config(["--opt", "alm.m=7", "--opt", "gamma=0.1", "--out", str(tmp_path)])
    from alm_opacus.methods import method_options

    alm = method_options("alm", config.options)
    laplace = method_options("laplace", config.options)
    assert (alm.m, alm.gamma) == (7, 0.1) and (laplace.m, laplace.gamma) == (200, 0.1)  # type: ignore[attr-defined]
    for bad, needle in (
        (["--opt", "alm.m=many"], "alm.m='many'"),
        (["--opt", "alm.nosuch=1"], "unknown option alm.nosuch"),
        (["--opt", "nosuch.m=1"], "unknown method 'nosuch'"),
    ):
        with pytest.raises(SystemExit):
            parse_config([*bad, "--out", str(tmp_path)])
        _one_line_error(capsys, needle)


# -- issue 23: a shareable run folder -----------------------------------------------------


def _weight_windows(clean: dict[str, torch.Tensor]) -> list[bytes]:
    """Byte windows of the clean weights, as float32 and float64, from three places in each
    tensor: any copy of a weight tensor contains them."""
    out = []
    for tensor in clean.values():
        flat = tensor.detach().flatten()
        for dtype in (torch.float32, torch.float64):
            raw = flat.to(dtype).numpy().tobytes()
            width = 4 * flat.to(dtype).element_size()
            for start in (0, len(raw) // 2, len(raw) - width):
                start -= start % flat.to(dtype).element_size()
                out.append(raw[start : start + width])
    return out


def _leaks(folder: Path, clean: dict[str, torch.Tensor], members: list[int]) -> set[str]:
    """Files under ``folder`` holding a clean weight's bytes, or (JSON, CSV, text) the member
    indices: in their order, or half of them or more anywhere."""
    windows = _weight_windows(clean)
    found = set()
    for path in (p for p in folder.rglob("*") if p.is_file()):
        data = path.read_bytes()
        if any(w in data for w in windows):
            found.add(path.relative_to(folder).as_posix())
        if path.suffix in (".json", ".csv", ".txt"):
            numbers = [int(t) for t in re.findall(rb"\d+", data)]
            text = ",".join(map(str, numbers))
            ordered = ",".join(map(str, members[:8])) in text
            if ordered or len(set(numbers) & set(members)) >= len(members) / 2:
                found.add(path.relative_to(folder).as_posix())
    return found


@pytest.mark.slow
def test_export_shares_no_clean_weight_and_no_member_index(finished, tmp_path, capsys):  # type: ignore[no-untyped-def]
    (head_file,) = (finished / DEFAULT_CACHE).glob("posthoc-head-*.pt")
    clean = torch.load(head_file, weights_only=True)["payload"]["state_dict"]
    members = json.loads((finished / SPLIT_FILE).read_text())["members"]
    assert len(members) == 150
    # The detector has power: in the run folder it finds both, and only under private/.
    leaks = _leaks(finished, clean, members)
    assert {SPLIT_FILE, head_file.relative_to(finished).as_posix()} <= leaks
    assert all(name.startswith("private/") for name in leaks), leaks
    readme = (finished / "private" / "README.txt").read_text()
    assert "split.json" in readme and "posthoc-head" in readme and "never to be shared" in readme
    dest = tmp_path / "shared"
    assert _exit(["export", str(finished), str(dest)]) == 0
    assert "exported" in capsys.readouterr().out
    assert _leaks(dest, clean, members) == set()
    shared = [n for n in SHARED_FILES if (finished / n).exists()]
    assert sorted(p.name for p in dest.iterdir()) == sorted(
        [*shared, "README.txt", "report.html", "manifest.json"]
    )
    assert (dest / "results.csv").read_bytes() == (finished / "results.csv").read_bytes()
    config = json.loads((dest / "config.json").read_text())
    assert "split_seed" not in config and "split_seed" in config["exported"]["withheld"]
    # A second export into the same place is refused, and leaves it as it was.
    stamp = sorted(p.relative_to(dest) for p in dest.rglob("*"))
    assert _exit(["export", str(finished), str(dest)]) == 2
    _one_line_error(capsys, "expected a new (or empty) folder")
    assert sorted(p.relative_to(dest) for p in dest.rglob("*")) == stamp


@pytest.mark.slow
def test_a_run_writes_its_private_parts_owner_only(finished: Path) -> None:
    # Issue 35: private/, its cache and risk scores, and report.html (it names the most
    # exposed members) were world-readable, while the shared plots/ and tb/ were 0700.
    import stat

    def mode(path: Path) -> int:
        return stat.S_IMODE(os.lstat(path).st_mode)

    umask = os.umask(0)
    os.umask(umask)
    # (the fixture made private/ and its cache 0755 before the run, to seed the cache: the
    # run tightened private/ and left the cache it found as it was; test_export.py covers a
    # cache the run creates)
    assert mode(finished / "private") == mode(finished / "private" / "risk") == 0o700
    assert mode(finished / "report.html") == 0o600
    assert mode(finished / "plots") == mode(finished / "tb") == 0o777 & ~umask
    assert mode(finished / "results.csv") == 0o666 & ~umask


@pytest.mark.slow
def test_export_refuses_a_symlinked_shared_file(finished, tmp_path, capsys):  # type: ignore[no-untyped-def]
    out = _copy(finished, tmp_path / "run")
    (out / "plots" / "fig1_utility_loss.png").unlink()
    (out / "plots" / "fig1_utility_loss.png").symlink_to(out / SPLIT_FILE)
    assert _exit(["export", str(out), str(tmp_path / "shared")]) == 2
    _one_line_error(capsys, "is a symlink")
    assert not (tmp_path / "shared").exists()
    assert not list(tmp_path.glob(".shared.new-*"))


# -- issue 23: a run folder that cannot lie -----------------------------------------------


def _rows_edit(edit):  # type: ignore[no-untyped-def]
    def apply(out: Path) -> None:
        rows = read_results(out / "results.csv")
        write_results(out / "results.csv", edit(rows))

    return apply


def _set(index: int, **changes: object):  # type: ignore[no-untyped-def]
    return _rows_edit(
        lambda rows: [r.replace(**changes) if i == index else r for i, r in enumerate(rows)]
    )


def _symlink_results(out: Path) -> None:
    other = _copy(out, out.parent / "other-run")
    (out / "results.csv").unlink()
    (out / "results.csv").symlink_to(other / "results.csv")


def _json_edit(name: str, edit):  # type: ignore[no-untyped-def]
    def apply(out: Path) -> None:
        data = json.loads((out / name).read_text())
        (out / name).write_text(json.dumps(edit(data)))

    return apply


def _rocs_edit(edit):  # type: ignore[no-untyped-def]
    """Rewrite rocs.jsonl's complete lines (without their newlines) with ``edit``."""

    def apply(out: Path) -> None:
        lines = (out / "rocs.jsonl").read_bytes().splitlines()
        (out / "rocs.jsonl").write_bytes(b"".join(line + b"\n" for line in edit(lines)))

    return apply


def _tpr_2(line: bytes) -> bytes:
    item = json.loads(line)
    for curve in item["curves"].values():
        curve["tpr"] = [2.0] * len(curve["tpr"])
    return json.dumps(item).encode()


def _legacy_rocs(out: Path) -> None:
    """What an older version left: every full curve in rocs.json."""
    (out / "rocs.json").write_text("[]")


# rows of the finished run: 0 = none (the baseline), 1 = alm (loss), 2 = alm (loss-clean),
# 3 = no-leak (the reference)
@pytest.mark.slow
@pytest.mark.parametrize(
    ("damage", "needle"),
    [
        (_set(0, test_accuracy=5.0), "line 2: test_accuracy=5.0 is invalid"),
        (_rows_edit(lambda rows: [*rows, rows[1]]), "line 6: repeats the row of line 3"),
        (_symlink_results, "results.csv is a symlink"),
        (_set(1, epsilon=3.0), "line 3: epsilon=3.0 is invalid: expected one of config.json's"),
        (_set(1, method="laplace"), "line 3: method='laplace' is invalid"),
        (_set(1, seed=7), "line 3: seed=7 is invalid"),
        (_set(0, epsilon=1.0), "line 2: epsilon=1.0 is invalid: expected inf for the baseline"),
        (_set(1, mia_auc=1.5), "line 3: mia_auc=1.5 is invalid"),
        (_set(2, tpr_at_fpr_0_01=-0.1), "line 4: tpr_at_fpr_0.01=-0.1 is invalid"),
        (_set(1, noise_scale=-1.0), "line 3: noise_scale=-1.0 is invalid"),
        (_set(1, delta=1.0), "line 3: delta=1.0 is invalid"),
        (_set(1, guarantee="pure-ish"), "line 3: guarantee='pure-ish' is invalid"),
        (_set(1, utility_loss=0.0), "line 3: utility_loss=0.0 is not 1 - test_accuracy"),
        (_set(1, dataset="mnist"), "line 3: dataset='mnist' is invalid"),
        (
            _set(1, guarantee="pure-dp"),
            "line 3: guarantee='pure-dp' with sensitivity_source='sampled' and delta=0.0 breaks "
            "the statement rule",
        ),
        (_set(1, epsilon_spent=0.5), "line 3: epsilon_spent=0.5 is below epsilon=1.0"),
        (_rocs_edit(lambda lines: [*lines, lines[0]]), "line 4: repeats the curves of line 1"),
        (_rocs_edit(lambda lines: [_tpr_2(lines[0]), *lines[1:]]), "line 1: expected one"),
        (_rocs_edit(lambda lines: [lines[0], b"{", *lines[1:]]), "line 2: expected one"),
        (_legacy_rocs, "rocs.json holds ROC curves in the format of an older version"),
        (
            _json_edit("config.json", lambda c: {**c, "epsilons": [-1]}),
            "'epsilons' is [-1]: expected a list of positive numbers",
        ),
    ],
    ids=[
        "accuracy-5",
        "duplicate-row",
        "symlinked-results",
        "epsilon-off-grid",
        "method-not-run",
        "seed-not-run",
        "baseline-epsilon",
        "auc-1.5",
        "tpr-negative",
        "negative-scale",
        "delta-1",
        "unknown-guarantee",
        "utility-loss-mismatch",
        "other-dataset",
        "random-dp-made-pure",
        "spent-below-epsilon",
        "duplicate-roc",
        "roc-out-of-range",
        "roc-not-json",
        "legacy-rocs-json",
        "config-epsilons",
    ],
)
def test_resume_refuses_rows_it_cannot_trust(
    finished, tmp_path, shared_cache, capsys, damage, needle
):  # type: ignore[no-untyped-def]
    out = _copy(finished, tmp_path / "run")
    damage(out)
    stamp = {p: p.read_bytes() for p in out.rglob("*") if p.is_file() and not p.is_symlink()}
    assert _run(out, shared_cache, "--resume") == 2
    _one_line_error(capsys, needle)
    assert {
        p: p.read_bytes() for p in out.rglob("*") if p.is_file() and not p.is_symlink()
    } == stamp


@pytest.mark.slow
def test_resume_removes_what_a_killed_run_left_behind(finished, tmp_path, shared_cache):  # type: ignore[no-untyped-def]
    out = _copy(finished, tmp_path / "run")
    before = (out / "results.csv").read_text()
    residues = [
        out / ".results.csv.k2l1x.tmp",
        out / ".rocs.jsonl.9a7b.tmp",
        out / "private" / ".split.json.x0.tmp",
        out / ".plots.new-3f2a" / "a.png",
        out / ".tb.old-77" / "events",
        out / ".probe-4242",
    ]
    for path in residues:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("left by SIGKILL")
    assert _run(out, shared_cache, "--resume") == 0
    assert not [p for p in residues if p.exists()]
    assert not [p for p in out.iterdir() if p.name.startswith(".") and p.name != ".lock"]
    assert (out / "results.csv").read_text() == before


def _boom(*args: object, **kwargs: object) -> None:
    raise ValueError("boom: a refusal after the folder was taken")


def _interrupt(*args: object, **kwargs: object) -> None:
    raise KeyboardInterrupt


@pytest.mark.parametrize("failure", [_boom, _interrupt])
@pytest.mark.parametrize("exists", [False, True])
def test_a_refused_start_leaves_the_folder_as_it_found_it(tmp_path, monkeypatch, failure, exists):  # type: ignore[no-untyped-def]
    # Issue 23: .lock and config.json left by a refused start made the folder look like a
    # previous run. The failure comes after the lock is taken, before any cell.
    out = tmp_path / "runs" / "fresh"
    if exists:
        out.mkdir(parents=True)
    monkeypatch.setattr(harness, "prepare", failure)
    code = _exit([*TINY, "--out", str(out), "--cache-dir", str(tmp_path / "cache")])
    assert code == (2 if failure is _boom else 130)
    assert sorted(p.name for p in out.iterdir()) == [] if exists else not out.exists()
    assert not (tmp_path / "cache").exists()
    # And the same command can start there again (nothing looks like a previous run).
    monkeypatch.setattr(harness, "prepare", _boom)
    assert _exit([*TINY, "--out", str(out), "--cache-dir", str(tmp_path / "cache")]) == 2


@pytest.mark.slow
def test_a_refused_overwrite_keeps_the_previous_run(
    finished, tmp_path, shared_cache, capsys, monkeypatch
):  # type: ignore[no-untyped-def]
    from types import SimpleNamespace

    from alm_opacus.data import dataset_spec, load_dataset
    from alm_opacus.data.split import make_split

    out = _copy(finished, tmp_path / "run")
    stamp = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    other = make_split(load_dataset("digits"), sizes=dataset_spec("digits").split, seed=5)
    monkeypatch.setattr(
        harness, "prepare", lambda config: SimpleNamespace(split=other, num_classes=10, images=None)
    )
    monkeypatch.setattr(harness.RunInputs, "build", _boom)  # after private/split.json is rewritten
    assert _run(out, shared_cache, "--overwrite") == 2
    _one_line_error(capsys, "boom")
    assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file()} == stamp


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--delta", "0", "--methods", "none,alm,gaussian"], "--delta=0 cannot be met by gaussian"),
        (["--delta", "0", "--methods", "dpsgd-alm"], "--delta=0 cannot be met by dpsgd-alm"),
        (["--split", "members=1"], "--split: members=1 is too small"),
        (["--split", "nonmembers=1"], "--split: nonmembers=1 is too small"),
        (["--split", "attacker=0"], "--split: attacker=0 is too small"),
        (["--split", "public=1"], "--split: public=1 is too small: alm's sensitivity sampler"),
        (["--split", "members=1500"], "--split: digits: split sizes"),
        (["--num-reference", "6", "--attacks", "lira-online"], None),
        (["--num-reference", "5"], "num_reference=5 is invalid"),
        (["--resume"], "does not exist, so there is nothing to resume"),
    ],
)
def test_what_can_be_checked_before_the_first_cell_is(tmp_path, capsys, monkeypatch, argv, needle):  # type: ignore[no-untyped-def]
    # Issue 23: --delta 0 was refused after the baseline cell was written, --split members=1
    # after 97 s of pre-training, without naming --split.
    started = []
    monkeypatch.setattr(harness, "prepare", lambda config: started.append(1) or _boom())
    out = tmp_path / "fresh"
    code = _exit([*TINY, "--out", str(out), "--cache-dir", str(tmp_path / "c"), *argv])
    assert code == 2
    if needle is None:  # valid: it got as far as preparing the data
        assert started
        return
    _one_line_error(capsys, needle)
    assert not started and not out.exists() and not (tmp_path / "c").exists()


def test_delta_zero_is_fine_for_pure_methods(tmp_path) -> None:  # type: ignore[no-untyped-def]
    config = parse_config(
        ["--delta", "0", "--methods", "none,alm,laplace,dperm", "--out", str(tmp_path / "o")]
    )
    assert config.delta == 0.0


def test_a_config_file_that_is_not_utf8_is_one_line(tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    cfg = tmp_path / "run.yaml"
    cfg.write_bytes(b"methods: alm\nout: \xff\xfe\x00bad\n")
    assert _exit(["--config", str(cfg)]) == 2
    _one_line_error(capsys, "not UTF-8 text (byte 18)")


def test_a_symlink_inside_private_is_refused(tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    out = tmp_path / "run"
    (out / "private").mkdir(parents=True)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (out / "private" / "cache").symlink_to(elsewhere)
    assert _exit([*TINY, "--out", str(out)]) == 2
    _one_line_error(capsys, "private/cache is a symlink")
    assert not list(elsewhere.iterdir())
    assert sorted(p.name for p in out.iterdir()) == ["private"]


# -- issue 36, item 5: a run folder that proves what it holds -----------------------------


def _guarantee_claimed(out: Path) -> Path:
    """A plausible edit the row checks accept: alm's random-dp row claims pure-dp."""
    rows = read_results(out / "results.csv")
    assert rows[1].guarantee == "random-dp"
    write_results(
        out / "results.csv",
        [r.replace(guarantee="pure-dp") if i == 1 else r for i, r in enumerate(rows)],
    )
    return out / "results.csv"


def _bit_flipped_statement(out: Path) -> Path:
    """One bit of a digit in alm's statement flipped (the file keeps its size)."""
    path = out / "results.csv"
    data = bytearray(path.read_bytes())
    statement = read_results(path)[1].statement
    start = data.index(statement.encode())
    digit = next(i for i in range(start, start + len(statement)) if chr(data[i]).isdigit())
    data[digit] ^= 0x01
    path.write_bytes(bytes(data))
    return path


def _truncated_draws(out: Path) -> Path:
    path = out / "draws.csv"
    text = path.read_text()
    path.write_text(text[: len(text) // 2])
    return path


@pytest.mark.slow
@pytest.mark.parametrize(
    ("damage", "needle"),
    [
        (_guarantee_claimed, "(truncated or edited)"),
        (_bit_flipped_statement, "(edited or corrupt)"),
        (_truncated_draws, "(truncated or edited)"),
    ],
    ids=["random-dp-as-pure-dp", "flipped-bit", "truncated-draws"],
)
def test_resume_and_export_refuse_a_file_the_run_did_not_write(  # type: ignore[no-untyped-def]
    drawn, tmp_path, shared_cache, capsys, damage, needle
):
    out = _copy(drawn, tmp_path / "run")
    named = damage(out)
    stamp = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    assert _run(out, shared_cache, "--resume", "--noise-draws", "2") == 2
    # the row checks (a guarantee its source cannot give) or the manifest: either names it
    _one_line_error(capsys, f"--resume: {named}")
    err_needle = "it is not what the run wrote"
    assert _exit(["export", str(out), str(tmp_path / "shared")]) == 2
    err = capsys.readouterr().err
    assert f"export: {named} " in err and needle in err and err_needle in err, err
    assert not (tmp_path / "shared").exists()
    assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file()} == stamp


@pytest.fixture(scope="module")
def drawn(finished: Path, tmp_path_factory: pytest.TempPathFactory, shared_cache: Path) -> Path:
    """A finished tiny run with two noise draws (it writes draws.csv)."""
    out = tmp_path_factory.mktemp("drawn") / "run"
    assert _run(out, shared_cache, "--noise-draws", "2") == 0
    assert (out / "draws.csv").is_file()
    return out


@pytest.mark.slow
def test_the_manifest_records_every_file_the_run_wrote(drawn: Path) -> None:
    from alm_opacus.run.manifest import file_digest, read_manifest

    manifest = read_manifest(drawn, prefix="", hint="")
    assert manifest.complete and manifest.writing == ()
    written = {
        p.relative_to(drawn).as_posix()
        for p in drawn.rglob("*")
        if p.is_file() and p.name not in (".lock", "manifest.json", "README.txt")
    }
    assert set(manifest.files) == written
    for name in ("results.csv", "draws.csv", "tb", "plots", "private/risk", "report.html"):
        assert any(f == name or f.startswith(f"{name}/") for f in manifest.files), name
    assert manifest.files["results.csv"] == file_digest(drawn / "results.csv")


@pytest.mark.slow
def test_export_refuses_an_unfinished_run_and_copies_manifest_entries_only(  # type: ignore[no-untyped-def]
    drawn, tmp_path, capsys
):
    from alm_opacus.run.manifest import read_manifest, write_manifest

    out = _copy(drawn, tmp_path / "run")
    (out / "tb" / "events.out.tfevents.9.planted").write_bytes(b"planted")
    (out / "plots" / "planted.png").write_bytes(b"planted")
    dest = tmp_path / "shared"
    assert _exit(["export", str(out), str(dest)]) == 0
    copied = {p.relative_to(dest).as_posix() for p in dest.rglob("*") if p.is_file()}
    manifest = read_manifest(out, prefix="", hint="")
    assert copied - {"README.txt", "report.html", "manifest.json"} <= set(manifest.files)
    assert "tb/events.out.tfevents.9.planted" not in copied
    assert "plots/planted.png" not in copied
    assert not [c for c in copied if c.startswith("private/")]
    # the copy's own manifest matches it
    assert read_manifest(dest, prefix="", hint="").complete
    capsys.readouterr()
    # a run that stopped (or still runs) before writing its report
    write_manifest(out, dataclasses.replace(manifest, complete=False))
    assert _exit(["export", str(out), str(tmp_path / "shared2")]) == 2
    _one_line_error(capsys, "manifest.json does not mark the run complete")
    (out / "manifest.json").unlink()
    assert _exit(["export", str(out), str(tmp_path / "shared3")]) == 2
    _one_line_error(capsys, "manifest.json is missing")
    assert not (tmp_path / "shared2").exists() and not (tmp_path / "shared3").exists()


def _features(path: Path, *, shift: float) -> None:
    import numpy as np
    from sklearn.datasets import load_digits

    x, y = load_digits(return_X_y=True)
    np.savez(path, x=(x[:600] / 16 + shift).astype(np.float32), y=y[:600])


@pytest.mark.slow
def test_resume_refuses_features_that_changed_under_the_same_path(tmp_path, capsys):  # type: ignore[no-untyped-def]
    from alm_opacus.run.manifest import file_digest

    data = tmp_path / "my_features.npz"
    _features(data, shift=0.0)
    out = tmp_path / "run"
    argv = [
        "--dataset",
        f"features:{data}",
        "--methods",
        "none,alm",
        "--epsilons",
        "1",
        "--noise-draws",
        "1",
        "--attacks",
        "loss",
        "--m",
        "4",
        "--no-progress",
        "--reproducible-noise",
        "--out",
        str(out),
    ]
    assert _exit(argv) == 0
    before = file_digest(data).sha256
    config = json.loads((out / "config.json").read_text())
    assert config["data_digest"] == before
    _features(data, shift=0.01)
    after = file_digest(data).sha256
    assert _exit([*argv, "--resume"]) == 2
    _one_line_error(
        capsys,
        f"the data {data} changed since the run began: SHA-256 {after} now, "
        f"{before} in {out / 'config.json'}",
    )
    # the export names the data by file name and digest, never by the owner's path
    dest = tmp_path / "shared"
    assert _exit(["export", str(out), str(dest)]) == 0
    shared = json.loads((dest / "config.json").read_text())
    assert (shared["dataset"], shared["data_digest"]) == ("features:my_features.npz", before)
    for path in dest.rglob("*"):
        if path.is_file():
            assert str(tmp_path).encode() not in path.read_bytes(), path


@pytest.mark.slow
def test_a_resume_with_fewer_methods_reports_only_its_own(finished, tmp_path, shared_cache):  # type: ignore[no-untyped-def]
    out = _copy(finished, tmp_path / "run")
    assert _run(out, shared_cache, "--resume", "--methods", "none", "--seeds", "0,1") == 0
    config = json.loads((out / "config.json").read_text())
    assert config["methods_kept"] == ["alm"] and "alm" in config["methods"]
    page = (out / "report.html").read_text()
    settings = page[page.index("kept from an earlier run") - 400 :]
    assert re.search(r"methods</t[hd]>\s*<td>none, no-leak<", settings), settings[:600]


# -- issue 36: one results schema, and rules across a row's columns ------------------------

#: The shadow and loss rows of a real default run (``alm-opacus --out /tmp/run0``: methods
#: none, alm, dpsgd, six epsilons) and its config.json, as that run wrote them.
DEFAULT_RUN = Path(__file__).parent / "fixtures" / "default_run"
Rows = tuple[list[ResultRow], dict[str, Any]]


@pytest.fixture
def default_rows() -> Rows:
    load_plugins()  # dpsgd registers from the baselines plugin
    rows = read_results(DEFAULT_RUN / "results.csv")
    return rows, json.loads((DEFAULT_RUN / "config.json").read_text())


def _first(rows: list[ResultRow], method: str) -> int:
    return next(i for i, r in enumerate(rows) if r.method == method)


def test_the_rows_of_a_real_default_run_are_kept_and_rewritten_unchanged(
    default_rows: Rows,
) -> None:
    rows, settings = default_rows
    assert {r.method for r in rows} == {"none", "alm", "dpsgd"}
    check_rows(rows, settings=settings, path=DEFAULT_RUN / "results.csv")
    assert format_csv(rows) == (DEFAULT_RUN / "results.csv").read_text()
    # DP-SGD's epsilon_spent is its accountant's epsilon, below the target: not a refusal
    sgd = rows[_first(rows, "dpsgd")]
    assert sgd.epsilon_spent < sgd.epsilon


def _scale(row: ResultRow, factor: float) -> dict[str, object]:
    return {"noise_scale": row.noise_scale * factor}


@pytest.mark.parametrize(
    ("method", "edit", "needle"),
    [
        (
            "alm",
            {"guarantee": "pure-dp"},
            "guarantee='pure-dp' with sensitivity_source='sampled' and delta=0.0 breaks the "
            "statement rule: a sampled sensitivity only supports 'random-dp'",
        ),
        ("alm", {"sensitivity_source": "analytic"}, "'random-dp' is for sampled sensitivities"),
        (
            "alm",
            {"sensitivity_source": "sampled-members"},
            "a sensitivity sampled on the private members supports no guarantee",
        ),
        ("dpsgd", {"guarantee": "pure-dp"}, "'pure-dp' needs delta=0, got 1e-05"),
        ("dpsgd", {"delta": 0.0}, "'approx-dp' needs delta > 0"),
        (
            "alm",
            {"epsilon_spent": 0.05},
            "epsilon_spent=0.05 is below epsilon=0.1: a post-training release is its head's first",
        ),
        (
            "alm",
            lambda r: _scale(r, 0.99),
            "does not fit the alm mechanism's calibration for sensitivity 147.223 at epsilon=0.1, "
            "delta=0.0: expected at least 1472.23 and, with grid rounding, below 4416.69",
        ),
        ("alm", lambda r: _scale(r, 3.5), "does not fit the alm mechanism's calibration"),
        (
            "alm",
            lambda r: {"noise_std": r.noise_std * 1.01},
            "is not the alm mechanism's standard deviation at noise_scale=1478.53: expected "
            "2681.76",
        ),
        ("alm", {"sensitivity": 2 * 147.223}, "does not fit the alm mechanism's calibration"),
        (
            "alm",
            {"noise_scale": math.nan},
            "a random-dp release of the alm mechanism states its noise scale",
        ),
        (
            "alm",
            {"sensitivity_source": "public"},
            "sensitivity_source='public' is invalid: expected one of ['analytic', 'sampled', "
            "'sampled-members', 'caller'] (or empty)",
        ),
        ("alm", {"noise_source": "os"}, "noise_source='os' is invalid"),
        ("alm", {"neighbouring": "swap"}, "neighbouring='swap' is invalid"),
        ("alm", {"sensitivity_norm": "l3"}, "sensitivity_norm='l3' is invalid"),
        ("alm", {"seconds": math.inf}, "seconds=inf is invalid: expected a finite number >= 0"),
        ("alm", {"status": "done"}, "status='done' is invalid: expected one of ['ok', "),
        ("alm", {"tpr_at_fpr_0_001_ci_high": 1.5}, "tpr_at_fpr_0.001_ci_high=1.5 is invalid"),
        ("alm", {"epsilon_spent": -1.0}, "epsilon_spent=-1.0 is invalid"),
        ("none", {"delta": math.nan}, "delta=nan is invalid: expected a number in [0, 1)"),
        (
            "alm",
            {"test_accuracy": math.nan},
            "test_accuracy=nan is invalid: expected a number in [0, 1] (the row's status is 'ok')",
        ),
    ],
    ids=[
        "sampled-claims-pure",
        "analytic-random-dp",
        "members-random-dp",
        "pure-with-delta",
        "approx-without-delta",
        "spent-below-epsilon",
        "scale-too-small",
        "scale-too-large",
        "std-not-the-scales",
        "sensitivity-doubled",
        "scale-missing",
        "unknown-source",
        "unknown-noise-source",
        "unknown-relation",
        "unknown-norm",
        "seconds-inf",
        "unknown-status",
        "ci-above-1",
        "negative-spent",
        "delta-missing",
        "accuracy-missing",
    ],
)
def test_resume_refuses_a_hand_edited_row_naming_file_line_and_rule(
    default_rows: Rows,
    method: str,
    edit: dict[str, object] | Callable[[ResultRow], dict[str, object]],
    needle: str,
) -> None:
    rows, settings = default_rows
    index = _first(rows, method)
    changes = edit(rows[index]) if callable(edit) else edit
    rows[index] = rows[index].replace(**changes)
    path = DEFAULT_RUN / "results.csv"
    with pytest.raises(ValueError) as info:
        check_rows(rows, settings=settings, path=path)
    message = str(info.value)
    assert message.startswith(f"--resume: {path}: line {index + 2}: "), message
    assert needle in message, message
    assert message.endswith("use --overwrite to start again"), message
    assert "\n" not in message


@pytest.mark.parametrize("mechanism", ["alm", "laplace", "gaussian", "gaussian-classic"])
def test_the_scale_rule_forgives_exactly_what_the_csv_rounds(mechanism: str) -> None:
    """A release at its calibration (no grid inflation: the rule's tight end), written with
    6 significant digits and read back, passes (its noise_std too); twice SCALE_TOLERANCE
    below it does not."""
    from alm_opacus.mechanisms import create_mechanism

    mech = create_mechanism(mechanism)
    delta = 0.0 if mech.pure else 1e-5
    generator = torch.Generator().manual_seed(36)
    kept = 0
    for _ in range(200):
        sensitivity, epsilon = (10 ** (6 * torch.rand(2, generator=generator) - 3)).tolist()
        epsilon = min(epsilon, 0.99) if mechanism == "gaussian-classic" else epsilon
        scale = mech.calibrate(epsilon=epsilon, delta=delta, sensitivity=sensitivity)
        row = _release_row(
            mechanism, epsilon=epsilon, delta=delta, sensitivity=sensitivity, scale=scale
        )
        (read,) = _round_trip([row])
        assert row_rule_problem(read) is None, (sensitivity, epsilon, scale)
        kept += 1
        low = mech.calibrate(epsilon=epsilon, delta=delta, sensitivity=read.sensitivity)
        below = read.replace(noise_scale=low * (1 - 2 * SCALE_TOLERANCE))
        assert row_rule_problem(below) is not None
    assert kept == 200


def test_the_textbook_gaussian_beyond_its_theorem_keeps_its_larger_delta() -> None:
    """At epsilon >= 1 the classic Gaussian states the delta its sigma achieves (larger than
    the one it was calibrated to): its scale is only bounded below."""
    from alm_opacus.mechanisms import ClassicGaussianMechanism, create_mechanism

    mech = create_mechanism("gaussian-classic")
    assert isinstance(mech, ClassicGaussianMechanism)
    scale = mech.calibrate(epsilon=10.0, delta=1e-3, sensitivity=1.0)
    achieved = mech.achieved_delta(epsilon=10.0, scale=scale, sensitivity=1.0)
    assert achieved > 1e-3
    row = _release_row(
        "gaussian-classic", epsilon=10.0, delta=achieved, sensitivity=1.0, scale=scale
    )
    assert row_rule_problem(row) is None
    assert "expected at least" in str(row_rule_problem(row.replace(noise_scale=scale / 10)))


def _release_row(
    method: str, *, epsilon: float, delta: float, sensitivity: float, scale: float
) -> ResultRow:
    from alm_opacus.mechanisms import create_mechanism

    mech = create_mechanism(method)
    return ResultRow(
        dataset="digits",
        method=method,
        epsilon=epsilon,
        delta=delta,
        guarantee="pure-dp" if delta == 0 else "approx-dp",
        sensitivity=sensitivity,
        noise_scale=scale,
        noise_std=mech.std(scale),
        seed=0,
        test_accuracy=0.9,
        utility_loss=0.0,
        seconds=1.0,
        sensitivity_norm=mech.norm,
        sensitivity_source="analytic",
        neighbouring="replace-one",
        noise_source="secure",
        epsilon_spent=epsilon,
    )


def _round_trip(rows: list[ResultRow]) -> list[ResultRow]:
    import csv
    import io

    return [ResultRow.from_record(r) for r in csv.DictReader(io.StringIO(format_csv(rows)))]


def test_an_infeasible_row_is_only_checked_for_its_ranges(default_rows: Rows) -> None:
    from alm_opacus.run.evaluation import infeasible_row

    rows, settings = default_rows
    row = infeasible_row(
        dataset="digits",
        method="alm",
        epsilon=0.1,
        seed=0,
        delta=0.0,
        reason="no release meets it",
        seconds=0.5,
    )
    index = _first(rows, "alm")
    kept = [r for r in rows if r.cell() != rows[index].cell()] + [row]
    check_rows(kept, settings=settings, path=DEFAULT_RUN / "results.csv")


@pytest.mark.parametrize("mechanism", ["alm", "laplace", "gaussian", "gaussian-classic"])
def test_real_post_training_releases_keep_every_cross_column_rule(mechanism: str) -> None:
    """Rows built from real releases (analytic and sampled sensitivities, float64 to float16
    heads, grids widened up to ~2.6x the sensitivity at small epsilon) pass after a CSV round
    trip; the widest grid stays inside the rule's calibrate(3 sensitivity) bound."""
    from alm_opacus.mechanisms import create_mechanism
    from alm_opacus.methods import Release
    from alm_opacus.protect import PostTrainingPrivacyEngine
    from alm_opacus.run.evaluation import base_row
    from alm_opacus.statement import SensitivityInfo, SensitivitySource

    mech = create_mechanism(mechanism)
    delta = 0.0 if mech.pure else 1e-5
    widest = 0.0
    for dtype in (torch.float64, torch.float32, torch.float16):
        for epsilon in (1e-3, 0.1, 1.0, 5.0):
            for source in ("analytic", "sampled"):
                sampled = source == "sampled"
                info = SensitivityInfo(
                    value=0.37,
                    norm=mech.norm,
                    source=SensitivitySource(source),
                    m=50 if sampled else None,
                    gamma=0.05 if sampled else None,
                    confidence=0.99 if sampled else None,
                )
                head = torch.nn.Linear(30, 10).to(dtype)
                try:
                    protected = PostTrainingPrivacyEngine(mechanism=mech).make_private(
                        head, epsilon=epsilon, delta=delta, sensitivity=info, seed=1
                    )
                except ValueError:  # a grid float16 cannot hold, or InfeasibleRelease
                    continue
                st = protected.statement
                assert st.noise_scale is not None
                release = Release(
                    method=mechanism,
                    statement=st,
                    predict_proba=lambda x: x,
                    noise_std=mech.std(st.noise_scale),
                )
                row = base_row(
                    dataset="digits", method=mechanism, epsilon=epsilon, seed=0, release=release
                ).replace(test_accuracy=0.5, utility_loss=0.1, seconds=1.0)
                (read,) = _round_trip([row])
                assert row_rule_problem(read) is None, (dtype, epsilon, source)
                low = mech.calibrate(epsilon=epsilon, delta=delta, sensitivity=0.37)
                widest = max(widest, st.noise_scale / low)
    # Δ ≤ Δ′ < 3Δ (plan_release); float16 heads are released on float32's grid, so the
    # widest inflation seen stays below 2 here
    assert 1.0 <= widest < 3.0
