"""Something to share (issue 35, item 5): ``alm-opacus export RUN DEST`` copies what the run
wrote that may be shared, with a report page, without torch; it refuses a run folder that is
being written or half-written; private parts of a run folder are owner-only."""

from __future__ import annotations

import fcntl
import functools
import json
import os
import stat
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from alm_opacus.io import atomic_write_text, make_private_folder
from alm_opacus.report.folders import replace_folder
from alm_opacus.report.results import ResultRow, read_results, write_results
from alm_opacus.run.export import default_seed_note, export_run, shareable_dataset
from alm_opacus.run.layout import LOCK_FILE, SPLIT_FILE
from alm_opacus.run.manifest import (
    MANIFEST_FILE,
    Manifest,
    read_manifest,
    recorded,
    write_manifest,
)

ROOT = Path(__file__).resolve().parents[1]
#: The owner's absolute paths a run folder records (none may reach the copy).
DATA = "/home/owner/secret-data"
FEATURES = "/home/owner/secret-data/my_features.npz"
MEMBERS = [1234567, 2345678, 3456789]


@pytest.fixture(autouse=True)
def umask_022() -> Iterator[None]:
    old = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(old)


def _mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def _png() -> bytes:
    """A real one-pixel PNG (a page may read the figures it embeds)."""
    import io

    from PIL import Image

    buffer = io.BytesIO()
    Image.new("RGB", (1, 1)).save(buffer, format="PNG")
    return buffer.getvalue()


def _rows(
    row: Callable[..., ResultRow], *, dataset: str, epsilons: tuple[float, ...]
) -> list[ResultRow]:
    base = row(dataset=dataset, attack="loss", mia_auc=0.6)
    alm = base.replace(
        method="alm",
        delta=1e-5,
        guarantee="random-dp",
        test_accuracy=0.5,
        utility_loss=1 - 0.5 / 0.9,
    )
    return [base, *(alm.replace(epsilon=e) for e in epsilons)]


@pytest.fixture
def make_run(result_row: Callable[..., ResultRow]) -> Callable[..., Path]:
    """:func:`_make_run` with the shared row builder."""
    return functools.partial(_make_run, row=result_row)


def _make_run(
    folder: Path,
    *,
    row: Callable[..., ResultRow],
    split_seed: int = 0,
    epsilons: tuple[float, ...] = (1.0, 10.0),
    rows: list[ResultRow] | None = None,
    rocs: str = "rocs.jsonl",
) -> Path:
    """A finished run folder as a run leaves it (``none`` and ``alm`` at ``epsilons``, one
    seed), on a ``features:PATH`` data set, with the owner's paths in ``config.json``, its
    complete ``manifest.json``, and a few files the run did not write under ``plots/`` and
    ``tb/`` (placed after the run: not in the manifest)."""
    folder.mkdir(parents=True)
    config = {
        "dataset": f"features:{FEATURES}",
        "data_root": DATA,
        "out": str(folder),
        "cache_dir": f"{DATA}/cache",
        "methods": ["none", "alm"],
        "epsilons": list(epsilons),
        "seeds": [0],
        "split_seed": split_seed,
    }
    (folder / "config.json").write_text(json.dumps(config))
    write_results(
        folder / "results.csv",
        rows if rows is not None else _rows(row, dataset=str(config["dataset"]), epsilons=epsilons),
    )
    if rocs == "rocs.jsonl":
        curve = {"loss": {"fpr": [0.0, 1.0], "tpr": [0.0, 1.0]}}
        lines = [{"method": "none", "epsilon": "inf", "seed": 0, "curves": curve}] + [
            {"method": "alm", "epsilon": e, "seed": 0, "curves": curve} for e in epsilons
        ]
        (folder / rocs).write_text("".join(json.dumps(line) + "\n" for line in lines))
    else:  # an older version's: every full curve, rewritten after every cell
        (folder / rocs).write_text("[]")
    (folder / "draws.csv").write_text("method,epsilon\n")
    (folder / "plots").mkdir()
    for name in ("fig1_utility_loss.png", "tradeoff.png"):
        (folder / "plots" / name).write_bytes(_png())
    (folder / "plots" / "fig1_utility_loss.pdf").write_bytes(b"%PDF-1.4 figure")
    for run in ("", "alm [random-dp]", "hparams/alm/eps=1/seed=0/draw=0"):
        (folder / "tb" / run).mkdir(parents=True, exist_ok=True)
        (folder / "tb" / run / "events.out.tfevents.1.alm_opacus").write_bytes(b"\x00events")
    (folder / "private").mkdir()
    (folder / SPLIT_FILE).write_text(json.dumps({"members": MEMBERS}))
    (folder / "report.html").write_text(f"<p>most exposed: {MEMBERS}</p>")
    written = [p for p in folder.rglob("*") if p.is_file()]
    write_manifest(folder, recorded(Manifest(complete=True), run=folder, paths=written))
    # placed after the run: not the run's, and not in its manifest
    (folder / "plots" / "notes.txt").write_text(f"members {MEMBERS}")
    (folder / "plots" / "old").mkdir()
    (folder / "plots" / "old" / "draft.png").write_bytes(_png())
    (folder / "plots" / "extra.png").write_bytes(_png())
    (folder / "tb" / "split.json").write_text(json.dumps({"members": MEMBERS}))
    (folder / "tb" / "events.out.tfevents.2.planted").write_bytes(b"\x00planted")
    (folder / LOCK_FILE).write_text("1\n")
    return folder


def rewritten(run: Path, *paths: Path) -> None:
    """Record ``paths`` in ``run``'s manifest as the run would after writing them."""
    manifest = read_manifest(run, prefix="", hint="")
    write_manifest(run, recorded(manifest, run=run, paths=paths))


def _export(run: Path, dest: Path) -> subprocess.CompletedProcess[str]:
    """``alm-opacus export RUN DEST`` in a fresh interpreter, which then prints whether torch,
    matplotlib or TensorBoard were imported."""
    code = (
        "import sys; from alm_opacus.run.cli import main; rc = main(sys.argv[1:]); "
        "print('loaded:', sorted(m for m in ('torch', 'matplotlib', 'tensorboard') "
        "if m in sys.modules)); sys.exit(rc)"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-c", code, "export", str(run), str(dest)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )


@pytest.mark.parametrize("rocs", ["rocs.jsonl", "rocs.json"])
def test_export_copies_what_the_run_shares_without_torch(
    tmp_path: Path, make_run: Callable[..., Path], rocs: str
) -> None:
    run = make_run(tmp_path / "run", rocs=rocs)
    dest = tmp_path / "out" / "shared"
    done = _export(run, dest)
    assert done.returncode == 0, done.stderr
    assert "loaded: []" in done.stdout  # no torch, matplotlib or TensorBoard
    files = sorted(p.relative_to(dest).as_posix() for p in dest.rglob("*") if p.is_file())
    assert files == sorted(
        [
            "README.txt",
            "config.json",
            "manifest.json",
            "draws.csv",
            "report.html",
            "results.csv",
            rocs,
            "plots/fig1_utility_loss.pdf",
            "plots/fig1_utility_loss.png",
            "plots/tradeoff.png",
            "tb/events.out.tfevents.1.alm_opacus",
            "tb/alm [random-dp]/events.out.tfevents.1.alm_opacus",
            "tb/hparams/alm/eps=1/seed=0/draw=0/events.out.tfevents.1.alm_opacus",
        ]
    )
    assert (dest / "report.html").read_text().strip()
    # the files the run did not write are named, in the README and the printed line
    readme = (dest / "README.txt").read_text()
    strays = (
        "plots/notes.txt",
        "plots/old/draft.png",
        "plots/extra.png",
        "tb/split.json",
        "tb/events.out.tfevents.2.planted",
    )
    for stray in strays:
        assert stray in readme
    assert "5 other files" in done.stdout
    assert (dest / rocs).read_bytes() == (run / rocs).read_bytes()  # copied as the run wrote it
    # no member index and no path of the owner's machine anywhere in the copy
    for path in dest.rglob("*"):
        if path.is_file():
            data = path.read_bytes()
            assert b"/home/owner" not in data and str(MEMBERS[0]).encode() not in data, path
    config = json.loads((dest / "config.json").read_text())
    assert "split_seed" not in config and config["exported"]["withheld"] == ["split_seed"]
    assert (config["out"], config["data_root"], config["cache_dir"], config["dataset"]) == (
        "run",
        "secret-data",
        "cache",
        "features:my_features.npz",
    )
    assert {r.dataset for r in read_results(dest / "results.csv")} == {"features:my_features.npz"}
    assert [r.mia_auc for r in read_results(dest / "results.csv")] == [
        r.mia_auc for r in read_results(run / "results.csv")
    ]
    # the copy follows the umask (022 here): it is meant to be shared
    assert _mode(dest) == _mode(dest / "tb" / "alm [random-dp]") == 0o755
    assert _mode(dest / "report.html") == _mode(dest / "results.csv") == 0o644
    assert not list(dest.parent.glob(".shared.new-*"))


def test_the_default_split_seed_is_said_plainly(
    tmp_path: Path, make_run: Callable[..., Path]
) -> None:
    done = _export(make_run(tmp_path / "run"), tmp_path / "shared")
    assert done.returncode == 0, done.stderr
    note = [line for line in done.stderr.splitlines() if "split seed" in line]
    assert note == [f"alm-opacus export: note: {default_seed_note()}"]
    assert "default seed 0: anyone can recompute the split" in note[0]
    readme = " ".join((tmp_path / "shared" / "README.txt").read_text().split())
    assert "default seed 0: anyone can recompute the split" in readme
    # a seed of the owner's choosing: withheld, and nothing to say
    done = _export(make_run(tmp_path / "run2", split_seed=918273), tmp_path / "shared2")
    assert done.returncode == 0 and "split seed" not in done.stderr, done.stderr
    assert "default seed" not in (tmp_path / "shared2" / "README.txt").read_text()
    assert "918273" not in (tmp_path / "shared2" / "config.json").read_text()


def test_an_export_while_the_run_writes_is_refused(
    tmp_path: Path, make_run: Callable[..., Path]
) -> None:
    run = make_run(tmp_path / "run")
    fd = os.open(run / LOCK_FILE, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # as RunFolder holds it
        done = _export(run, tmp_path / "shared")
    finally:
        os.close(fd)
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and f"{run / LOCK_FILE} is held" in done.stderr
    assert not (tmp_path / "shared").exists()
    assert _export(run, tmp_path / "shared").returncode == 0  # once the run let go


def _residue(run: Path) -> Path:
    (run / ".results.csv.k2l1x.tmp").write_text("dataset,meth")
    return run / ".results.csv.k2l1x.tmp"


def _new_tb(run: Path) -> Path:
    (run / ".tb.new-3f2a").mkdir()
    return run / ".tb.new-3f2a"


def _truncated(run: Path) -> Path:
    text = (run / "results.csv").read_text()
    (run / "results.csv").write_text(text[: len(text) - 40])
    return run / "results.csv"


def _missing_cell(run: Path) -> Path:
    rows = read_results(run / "results.csv")
    write_results(run / "results.csv", [r for r in rows if r.epsilon != 10.0])
    return run / "results.csv"


def _no_results(run: Path) -> Path:
    (run / "results.csv").unlink()
    return run / "results.csv"


@pytest.mark.parametrize(
    ("damage", "needle"),
    [
        (_residue, "left by a run that stopped"),
        (_new_tb, "left by a run that stopped"),
        (_truncated, "truncated or corrupt"),
        (_no_results, "wrote no result yet"),
        (_missing_cell, "no row for method 'alm', epsilon 10, seed 0"),
    ],
)
def test_a_half_written_run_folder_is_refused(
    tmp_path: Path,
    make_run: Callable[..., Path],
    damage: Callable[[Path], Path],
    needle: str,
) -> None:
    run = make_run(tmp_path / "run")
    named = damage(run)
    done = _export(run, tmp_path / "shared")
    assert done.returncode == 2, done.stdout
    assert done.stderr.count("\n") == 1 and str(named) in done.stderr and needle in done.stderr
    assert not (tmp_path / "shared").exists()
    assert not list(tmp_path.glob(".shared.new-*"))


def test_a_shared_file_naming_an_owner_path_is_left_out(
    tmp_path: Path, make_run: Callable[..., Path]
) -> None:
    run = make_run(tmp_path / "run")
    events = run / "tb" / "alm [random-dp]" / "events.out.tfevents.1.alm_opacus"
    events.write_bytes(b"\x00hparams dataset features:" + FEATURES.encode())
    rewritten(run, events)  # as if the run had written it so
    done = export_run(run, tmp_path / "shared")
    assert "tb/alm [random-dp]/events.out.tfevents.1.alm_opacus" not in done.copied
    assert any(
        item.startswith("tb/alm [random-dp]/") and "names the path" in item
        for item in done.left_out
    )
    assert not (tmp_path / "shared" / "tb" / "alm [random-dp]").exists()


def test_a_dataset_name_loses_the_owners_path() -> None:
    assert shareable_dataset("digits") == "digits"
    assert shareable_dataset(f"features:{FEATURES}") == "features:my_features.npz"
    assert shareable_dataset("features:my_features.npz") == "features:my_features.npz"


# -- permissions ---------------------------------------------------------------------------


def test_replaced_folders_follow_the_umask(tmp_path: Path) -> None:
    # plots/ and tb/ are shared: mkdtemp's 0700 hid them from everyone the umask allows
    def build(folder: Path) -> None:
        (folder / "a.png").write_bytes(b"png")

    replace_folder(tmp_path / "plots", build)
    assert _mode(tmp_path / "plots") == 0o755
    os.umask(0o027)
    replace_folder(tmp_path / "plots", build)
    assert _mode(tmp_path / "plots") == 0o750


def test_private_files_and_folders_are_owner_only(tmp_path: Path) -> None:
    atomic_write_text(tmp_path / "report.html", "members", private=True)
    atomic_write_text(tmp_path / "results.csv", "aggregates")
    assert (_mode(tmp_path / "report.html"), _mode(tmp_path / "results.csv")) == (0o600, 0o644)
    atomic_write_text(tmp_path / "report.html", "members again", private=True)  # a rewrite too
    assert _mode(tmp_path / "report.html") == 0o600
    make_private_folder(tmp_path / "runs" / "cache")
    assert (_mode(tmp_path / "runs"), _mode(tmp_path / "runs" / "cache")) == (0o755, 0o700)
    (tmp_path / "mine").mkdir(mode=0o755)
    make_private_folder(tmp_path / "mine")  # an existing folder is left as it is
    assert _mode(tmp_path / "mine") == 0o755
    make_private_folder(tmp_path / "mine", tighten=True)  # unless told to tighten it
    assert _mode(tmp_path / "mine") == 0o700


def test_a_run_folder_keeps_its_private_parts_owner_only(tmp_path: Path) -> None:
    from alm_opacus.run.rundir import RunFolder

    fresh, cache = tmp_path / "fresh", tmp_path / "runs" / "cache"
    with RunFolder(fresh, resume=False, overwrite=False, cache=cache) as folder:
        folder.commit()
    assert (_mode(fresh / "private"), _mode(cache), _mode(tmp_path / "runs")) == (
        0o700,
        0o700,
        0o755,
    )
    assert _mode(fresh) == 0o755
    # the default cache, inside private/
    with RunFolder(
        tmp_path / "other",
        resume=False,
        overwrite=False,
        cache=tmp_path / "other" / "private" / "cache",
    ) as folder:
        folder.commit()
    assert _mode(tmp_path / "other" / "private" / "cache") == 0o700
    # an older version's private/ is tightened; an existing cache is left as it is
    old = tmp_path / "old"
    (old / "private").mkdir(parents=True, mode=0o755)
    (tmp_path / "shared-cache").mkdir(mode=0o755)
    with RunFolder(old, resume=False, overwrite=False, cache=tmp_path / "shared-cache") as f:
        f.commit()
    assert (_mode(old / "private"), _mode(tmp_path / "shared-cache")) == (0o700, 0o755)


# -- issue 36, item 5: only what the manifest proves ---------------------------------------


def _claims_pure_dp(run: Path) -> Path:
    rows = read_results(run / "results.csv")
    write_results(
        run / "results.csv",
        [r.replace(guarantee="pure-dp") if r.method == "alm" else r for r in rows],
    )
    return run / "results.csv"


def _flipped_bit(run: Path) -> Path:
    path = run / "results.csv"
    data = bytearray(path.read_bytes())
    data[data.index(b"random-dp")] ^= 0x01  # 'r' -> 's': same size
    path.write_bytes(bytes(data))
    return path


def _truncated_draws(run: Path) -> Path:
    path = run / "draws.csv"
    path.write_bytes(path.read_bytes()[:5])
    return path


def _planted_manifest_entry(run: Path) -> Path:
    (run / "plots" / "fig1_utility_loss.png").write_bytes(_png() + b"\0")
    return run / "plots" / "fig1_utility_loss.png"


@pytest.mark.parametrize(
    ("damage", "needle"),
    [
        (_claims_pure_dp, "where the manifest recorded"),
        (_flipped_bit, "(edited or corrupt)"),
        (_truncated_draws, "has 5 bytes where the manifest recorded 15 (truncated or edited)"),
        (_planted_manifest_entry, "(truncated or edited)"),
    ],
    ids=["random-dp-as-pure-dp", "flipped-bit", "truncated-draws", "replaced-figure"],
)
def test_a_file_that_does_not_match_the_manifest_is_refused(
    tmp_path: Path, make_run: Callable[..., Path], damage: Callable[[Path], Path], needle: str
) -> None:
    run = make_run(tmp_path / "run")
    named = damage(run)
    done = _export(run, tmp_path / "shared")
    assert done.returncode == 2, done.stdout
    assert done.stderr.count("\n") == 1, done.stderr
    assert f"export: {named} " in done.stderr and needle in done.stderr, done.stderr
    assert not (tmp_path / "shared").exists()


def test_a_run_without_a_complete_manifest_is_refused(
    tmp_path: Path, make_run: Callable[..., Path]
) -> None:
    run = make_run(tmp_path / "run")
    manifest = read_manifest(run, prefix="", hint="")
    write_manifest(run, Manifest(files=manifest.files, complete=False))
    done = _export(run, tmp_path / "shared")
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert f"{run / MANIFEST_FILE} does not mark the run complete" in done.stderr
    (run / MANIFEST_FILE).unlink()
    done = _export(run, tmp_path / "shared")
    assert done.returncode == 2 and f"{run / MANIFEST_FILE} is missing" in done.stderr
    assert not (tmp_path / "shared").exists()


def test_the_copy_holds_manifest_entries_only_and_its_own_manifest(
    tmp_path: Path, make_run: Callable[..., Path]
) -> None:
    run = make_run(tmp_path / "run")
    # a clean head's cache planted under plots/ with a figure's name is not the run's
    (run / "plots" / "posthoc-head.png").write_bytes(b"clean weights")
    done = export_run(run, tmp_path / "shared")
    recorded_files = set(read_manifest(run, prefix="", hint="").files)
    assert set(done.copied) <= recorded_files
    assert "plots/posthoc-head.png (not written by the run)" in done.left_out
    copy = read_manifest(tmp_path / "shared", prefix="", hint="")
    files = {
        p.relative_to(tmp_path / "shared").as_posix()
        for p in (tmp_path / "shared").rglob("*")
        if p.is_file()
    } - {MANIFEST_FILE}
    assert copy.complete and set(copy.files) == files


def test_the_owners_data_path_in_a_statement_is_cut_to_its_name(
    tmp_path: Path, make_run: Callable[..., Path], result_row: Callable[..., ResultRow]
) -> None:
    dataset = f"features:{FEATURES}"
    rows = [
        r.replace(statement=f"random-dp; population: 120 rows of {dataset}")
        for r in _rows(result_row, dataset=dataset, epsilons=(1.0, 10.0))
    ]
    run = make_run(tmp_path / "run", rows=rows)
    events = run / "tb" / "alm [random-dp]" / "events.out.tfevents.1.alm_opacus"
    events.write_bytes(b"\x00statement " + FEATURES.encode())
    rewritten(run, events)
    done = export_run(run, tmp_path / "shared")
    shared = read_results(tmp_path / "shared" / "results.csv")
    assert {r.statement for r in shared if r.method == "alm"} == {
        "random-dp; population: 120 rows of features:my_features.npz"
    }
    # the left-out events are named without the path (the README is shared too)
    readme = (tmp_path / "shared" / "README.txt").read_text()
    assert "tb/alm [random-dp]/events.out.tfevents.1.alm_opacus" in readme
    assert "…/my_features.npz" in readme and "/home/owner" not in readme
    assert any("events.out.tfevents.1.alm_opacus" in item for item in done.left_out)
