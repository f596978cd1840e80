"""``alm-opacus export RUN DEST``: the shareable copy of a finished run folder.

The copy holds what the run wrote that may be shared (aggregates over the evaluation set,
with no member index and no clean weight), a report page without the per-member section, a
``README.txt`` saying what was left out, and a ``manifest.json`` of the copy's own files. Only
files the run's ``manifest.json`` records are copied (:mod:`alm_opacus.run.manifest`), after
each is checked against its digest. What is copied:

* ``config.json``, without the split seed (:data:`~alm_opacus.run.layout.WITHHELD_KEYS`), and
  with every path of the owner's machine cut to its last part (:data:`PATH_KEYS`, and the
  file of a ``features:PATH`` dataset);
* ``results.csv`` (its ``dataset`` column cut like ``config.json``'s), ``rocs.jsonl`` (the
  bounded ROC curves, one line per cell; ``rocs.json`` in a run of an older version),
  ``draws.csv``;
* of ``plots/``, the figures the run draws there: its ``*.png`` and ``*.pdf`` files (not in a
  subfolder); of ``tb/``, TensorBoard's event files (``events.out.tfevents.*``, in any
  subfolder). Anything else placed there is not the run's, and is left out and named.

The data are recorded by name and digest (``config.json``'s ``dataset``, cut to its file
name, and ``data_digest``), never by the owner's path.

A file that still holds one of the owner's absolute paths is left out and named. A run folder
that is being written (its lock is held: ``rundir.RunFolder``), that a killed run left
half-written (temporary files), whose ``results.csv`` does not parse, whose results miss a
cell of its grid, that has no manifest or one that does not mark the run complete, or
whose files do not match their recorded digests is refused, naming the file. The export
holds a shared lock on the run folder while it copies, so no run starts writing it meanwhile.

This module imports no torch, matplotlib or TensorBoard (the export takes well under two
seconds): only the layout's names, ``results.csv``'s reader and the report page.
"""

from __future__ import annotations

import contextlib
import csv
import errno
import fcntl
import io
import json
import os
import shutil
import textwrap
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from alm_opacus.io import atomic_write_json, atomic_write_text, is_inside, walk_entries
from alm_opacus.report.html import REPORT_FILE, shareable_report
from alm_opacus.report.results import cell_key, read_results
from alm_opacus.run.catalogue import DEFAULTS
from alm_opacus.run.layout import (
    LOCK_FILE,
    PRIVATE_DIR,
    RESIDUE,
    SHARED_FILES,
    WITHHELD_KEYS,
)
from alm_opacus.run.manifest import (
    MANIFEST_FILE,
    Manifest,
    folder_files,
    read_manifest,
    recorded,
    verify_manifest,
    write_manifest,
)

__all__ = [
    "EXPORT_README",
    "FIGURE_SUFFIXES",
    "PATH_KEYS",
    "Export",
    "default_seed_note",
    "export_run",
    "shareable_dataset",
]

#: ``config.json`` keys that hold a path of the owner's machine: the export keeps only the
#: path's last part (the folder or file name), so the copy still says which data it is.
PATH_KEYS = ("out", "cache_dir", "data_root")
#: The figures of ``plots/`` the export copies (the run draws each figure in both).
FIGURE_SUFFIXES = (".png", ".pdf")
#: TensorBoard's event files: the only files of ``tb/`` the export copies.
_EVENTS_PREFIX = "events.out.tfevents."
#: What the exported folder's ``README.txt`` is called.
EXPORT_README = "README.txt"
#: The split seed a run uses unless ``--split-seed`` says otherwise.
_DEFAULT_SPLIT_SEED = DEFAULTS["RunConfig.split_seed"]


@dataclass(frozen=True)
class Export:
    """What :func:`export_run` did.

    Attributes:
        copied: the run's files copied, relative to the run folder (and to the copy).
        left_out: files under the shared folders that the run did not write there, or that
            name a path of the owner's machine, relative to the run folder, each with why.
        default_split_seed: the run used the default split seed, so withholding it protects
            nothing (:func:`default_seed_note`).
    """

    copied: tuple[str, ...]
    left_out: tuple[str, ...]
    default_split_seed: bool


def default_seed_note() -> str:
    """The one line an export prints (and its README says) when the run used the default
    split seed."""
    return (
        f"the split seed is withheld, but this run used the default seed {_DEFAULT_SPLIT_SEED}: "
        "anyone can recompute the split of a public dataset; use --split-seed <random> for a "
        "split others cannot recompute"
    )


def shareable_dataset(name: str) -> str:
    """A dataset name without the owner's path: ``features:/home/me/f.npz`` -> ``features:f.npz``
    (a family's argument cut to its last part); other names are returned as they are."""
    family, sep, argument = str(name).partition(":")
    if not sep:
        return str(name)
    return f"{family}:{_last_part(argument)}"


def export_run(run: Path, dest: Path) -> Export:
    """Copy what may be shared of the finished run folder ``run`` into the new folder
    ``dest``, with the report page without its per-member section and a ``README.txt``.

    The copy is built beside ``dest`` and renamed into place: ``dest`` is complete or
    absent. It gets the umask's permissions (it is meant to be shared).

    Args:
        run: a finished run folder.
        dest: a folder that does not exist yet (or is empty), outside ``run``.

    Returns:
        What was copied and left out, and whether the run used the default split seed.

    Raises:
        ValueError: one line naming the file, if ``run`` is not a run folder, is being
            written, was left half-written or misses a cell of its grid, if ``dest`` is not
            new or lies inside ``run``, or if a shared file is a symlink or not a plain file.
    """
    run, dest = Path(run), Path(dest)
    if not (run / "config.json").is_file():
        raise ValueError(f"export: {str(run)!r} is not a run folder (no config.json)")
    if dest.exists() and (not dest.is_dir() or any(dest.iterdir())):
        raise ValueError(f"export: {str(dest)!r} exists: expected a new (or empty) folder")
    if is_inside(dest, run):
        raise ValueError(
            f"export: {str(dest)!r} lies inside the run folder: expected a folder outside it"
        )
    with _shared_lock(run):
        config = _read_config(run / "config.json")
        _check_finished(run, config)
        manifest = _check_manifest(run)
        return _copy(run, dest, config, manifest)


def _check_manifest(run: Path) -> Manifest:
    """The run's manifest, once it marks the run complete and every file matches it."""
    hint = f"finish or re-run it (alm-opacus --out {run} --resume, with its other flags)"
    manifest = read_manifest(run, prefix="export: ", hint="re-run it with --overwrite")
    if not manifest.complete:
        raise ValueError(
            f"export: {run / MANIFEST_FILE} does not mark the run complete: it is still running, "
            f"or stopped before writing its report; {hint}"
        )
    verify_manifest(
        run,
        manifest,
        prefix="export: ",
        hint="re-run it with --overwrite, or export an intact copy",
    )
    return manifest


@contextlib.contextmanager
def _shared_lock(run: Path) -> Iterator[None]:
    """Hold a shared lock on ``run``'s lock file while exporting: refused while a run holds
    it (a run takes it exclusively), and a run cannot start meanwhile. A folder without a
    lock file (copied without it), or one whose lock file this user cannot read, is exported
    without the lock."""
    path = run / LOCK_FILE
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError as exc:
        if exc.errno in (errno.ENOENT, errno.EACCES):
            yield
            return
        raise ValueError(f"export: cannot open the lock file {path}: {exc.strerror}") from exc
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno in (errno.EAGAIN, errno.EACCES):
                raise ValueError(
                    f"export: {path} is held: a run is writing {str(run)!r}; wait for it to "
                    "finish, then export"
                ) from exc
            raise
        yield
    finally:
        os.close(fd)  # releases the lock


def _read_config(path: Path) -> dict[str, Any]:
    try:
        config = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ValueError(f"export: {path}: not a readable config.json ({exc})") from exc
    if not isinstance(config, dict):
        raise ValueError(f"export: {path}: expected a JSON object")
    return config


def _check_finished(run: Path, config: dict[str, Any]) -> None:
    """Refuse a run folder a killed run left half-written, or whose results miss a cell."""
    for folder in (run, run / "tb", run / "plots"):
        if not folder.is_dir() or folder.is_symlink():
            continue
        for entry in sorted(folder.iterdir()):
            if RESIDUE.match(entry.name):
                raise ValueError(
                    f"export: {entry} was left by a run that stopped while writing: finish the "
                    f"run first (alm-opacus --out {run} --resume, with its other flags)"
                )
    path = run / "results.csv"
    if not path.is_file():
        raise ValueError(f"export: {path} is missing: the run wrote no result yet")
    try:
        rows = read_results(path)
    except (OSError, ValueError) as exc:
        raise ValueError(f"export: {exc}") from exc
    missing = _missing_cells(rows, config)
    if missing:
        more = f" and {len(missing) - 1} more" if len(missing) > 1 else ""
        raise ValueError(
            f"export: {path} has no row for {missing[0]}{more}: the run did not finish; finish "
            f"it first (alm-opacus --out {run} --resume, with its other flags)"
        )


def _missing_cells(rows: Sequence[Any], config: dict[str, Any]) -> list[str]:
    """The cells of ``config.json``'s grid that ``rows`` lack, as words. A method is a
    baseline (one cell per seed, at epsilon inf) when its rows say so; every other method has
    a cell at every epsilon of the grid."""
    methods, epsilons, seeds = (config.get(k) for k in ("methods", "epsilons", "seeds"))
    try:
        grid = [cell_key("", float(e), 0)[1] for e in epsilons]  # type: ignore[union-attr]
        methods = [str(m) for m in methods]  # type: ignore[union-attr]
        seeds = [int(s) for s in seeds]  # type: ignore[union-attr]
    except (TypeError, ValueError) as exc:
        raise ValueError(
            f"export: config.json: methods, epsilons and seeds: expected lists "
            f"({exc}); is it a run folder?"
        ) from exc
    found: dict[tuple[str, int], set[str]] = {}
    for row in rows:
        found.setdefault((row.method, row.seed), set()).add(cell_key("", row.epsilon, 0)[1])
    missing = []
    for seed in seeds:
        for method in methods:
            labels = found.get((method, seed))
            if labels is None:
                missing.append(f"method {method!r}, seed {seed}")
            elif labels != {"inf"}:
                missing += [
                    f"method {method!r}, epsilon {e}, seed {seed}" for e in grid if e not in labels
                ]
    return missing


def _copy(run: Path, dest: Path, config: dict[str, Any], manifest: Manifest) -> Export:
    parent = Path(os.path.abspath(dest)).parent
    parent.mkdir(parents=True, exist_ok=True)
    # not mkdtemp: its 0700 would keep the shareable copy from the users the umask allows
    tmp = parent / f".{dest.name}.new-{uuid.uuid4().hex}"
    os.mkdir(tmp)
    owner_paths = _owner_paths(run, config)
    copied: list[str] = []
    left_out: list[str] = []
    try:
        for rel, keep in _shared_entries(run):
            if not keep or rel not in manifest.files:
                left_out.append(f"{rel} (not written by the run)")
                continue
            target = tmp / rel
            if rel == "config.json":
                atomic_write_json(target, _shareable_config(config))
                copied.append(rel)
                continue
            data = (run / rel).read_bytes()
            if rel == "results.csv":
                data = _shareable_results(data, str(config.get("dataset", "")))
            named = [p for p in owner_paths if p.encode() in data]
            if named and rel == "results.csv":  # the copy means nothing without it
                raise ValueError(
                    f"export: {run / rel} names the path {named[0]} of the owner's machine: "
                    "cannot share it"
                )
            if named:
                # the README is shared: it names the path by its last part only
                left_out.append(
                    f"{rel} (names the path …/{Path(named[0]).name} of the owner's machine)"
                )
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
            copied.append(rel)
        split_seed = config.get("split_seed")
        default_seed = split_seed == _DEFAULT_SPLIT_SEED and not isinstance(split_seed, bool)
        atomic_write_text(tmp / EXPORT_README, _readme(left_out, default_seed=default_seed))
        # rendered from the copy alone: the page can show nothing the copy does not hold
        atomic_write_text(tmp / REPORT_FILE, shareable_report(tmp))
        # the copy proves what it holds too
        write_manifest(tmp, recorded(Manifest(complete=True), run=tmp, paths=folder_files(tmp)))
        if dest.exists():
            dest.rmdir()
        os.rename(tmp, dest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return Export(copied=tuple(copied), left_out=tuple(left_out), default_split_seed=default_seed)


def _shared_entries(run: Path) -> Iterator[tuple[str, bool]]:
    """Every file under :data:`SHARED_FILES` (relative path, whether the run wrote it there);
    symlinks and special files are refused."""
    for name in SHARED_FILES:
        source = run / name
        if not os.path.lexists(source):
            continue
        entries = [source, *walk_entries(source)] if source.is_dir() else [source]
        for entry in entries:
            if entry.is_symlink() or not (entry.is_file() or entry.is_dir()):
                raise ValueError(
                    f"export: {entry} is a symlink or a special file: expected plain files only"
                )
            if entry.is_dir():
                continue
            rel = entry.relative_to(run)
            yield rel.as_posix(), _written_by_run(rel)


def _written_by_run(rel: Path) -> bool:
    """Whether the run writes a file at ``rel``: figures at the top of ``plots/``, event
    files anywhere in ``tb/``, and the shared files themselves."""
    top = rel.parts[0]
    if top == "plots":
        return len(rel.parts) == 2 and rel.suffix in FIGURE_SUFFIXES and rel.name[0] != "."
    if top == "tb":
        return rel.name.startswith(_EVENTS_PREFIX)
    return len(rel.parts) == 1


def _owner_paths(run: Path, config: dict[str, Any]) -> list[str]:
    """The owner's absolute paths the copy must not hold (relative ones say little, and
    short strings would match the bytes of any figure)."""
    values = [config.get(k) for k in PATH_KEYS]
    _family, sep, argument = str(config.get("dataset", "")).partition(":")
    if sep:
        values.append(argument)
    values += [os.path.abspath(run), os.path.realpath(run)]
    paths = {str(v).rstrip("/") for v in values if isinstance(v, str) and os.path.isabs(v)}
    return sorted((p for p in paths if len(p) > 1), key=len, reverse=True)


def _last_part(path: object) -> object:
    """``path`` cut to its last part (``None`` and non-strings are kept)."""
    if not isinstance(path, str):
        return path
    return Path(path).name or path


def _shareable_config(config: dict[str, Any]) -> dict[str, Any]:
    out = {k: v for k, v in config.items() if k not in WITHHELD_KEYS}
    cut = [k for k in PATH_KEYS if isinstance(out.get(k), str)]
    for key in cut:
        out[key] = _last_part(out[key])
    if "dataset" in out and shareable_dataset(out["dataset"]) != out["dataset"]:
        out["dataset"] = shareable_dataset(out["dataset"])
        cut.append("dataset")
    out["exported"] = {
        "withheld": [k for k in WITHHELD_KEYS if k in config],
        "paths_cut_to_names": cut,
        "why": "the split seed re-draws the member indices; paths describe the owner's machine",
    }
    return out


def _shareable_results(data: bytes, dataset: str) -> bytes:
    """``results.csv`` with its ``dataset`` column cut like ``config.json``'s (the bytes as
    they are when there is nothing to cut)."""
    label = shareable_dataset(dataset)
    if label == dataset:
        return data
    text = data.decode()
    reader = csv.reader(io.StringIO(text, newline=""))
    rows = list(reader)
    if not rows or "dataset" not in rows[0]:
        return data
    column = rows[0].index("dataset")
    for row in rows[1:]:
        if len(row) > column and row[column] == dataset:
            row[column] = label
        # the name may recur in a cell's words (a statement's population)
        row[:] = [cell.replace(dataset, label) for cell in row]
    out = io.StringIO(newline="")
    csv.writer(out, lineterminator="\n").writerows(rows)
    return out.getvalue().encode()


def _readme(left_out: Sequence[str], *, default_seed: bool) -> str:
    lines = [
        "The shareable part of an alm_opacus run, made by `alm-opacus export RUN DEST`.",
        "",
        f"{REPORT_FILE} is the run's report without its per-member section; results.csv, "
        "rocs.jsonl (the ROC curves: every point below FPR 1e-3, then a log-spaced grid; one "
        "line per cell), draws.csv and config.json hold the numbers, plots/ the figures, tb/ "
        "the TensorBoard events (tensorboard --logdir tb).",
        "",
        "Left out:",
        f"- {PRIVATE_DIR}/: the member indices (split.json), the clean, unprotected head, the "
        "caches and the per-member membership scores;",
        f"- the owner's {REPORT_FILE}, which names the members the attacks expose most;",
        "- config.json's split_seed (with the data set and the split sizes it re-draws the "
        "member indices); paths of the owner's machine are cut to their last part;",
        "- any file the run did not write (of plots/ only the figures, of tb/ only the event "
        "files are copied)" + (":" if left_out else "."),
        *[f"  {item}" for item in left_out],
    ]
    if default_seed:
        lines += [
            "",
            f"Caveat: {default_seed_note()}. For this run, anyone who has the data "
            "set can recompute who its members are: withholding seed "
            f"{_DEFAULT_SPLIT_SEED} protects nothing.",
        ]
    return "\n".join(_wrap(line) for line in lines) + "\n"


def _wrap(line: str, width: int = 88) -> str:
    indent = "  " if line.startswith("- ") else ""
    return (
        textwrap.fill(
            line,
            width=width,
            subsequent_indent=indent,
            break_long_words=False,
            break_on_hyphens=False,
        )
        or line
    )
