"""The run folder: one run at a time, nothing half-written, nothing stale, nothing private in
what may be shared.

Layout of ``<out>``:

* shareable (:data:`SHARED_FILES`, what ``alm-opacus export RUN DEST`` copies,
  :mod:`alm_opacus.run.export`): ``config.json``, ``results.csv``, ``rocs.jsonl`` (appended
  per cell: :mod:`alm_opacus.report.rocs`; ``rocs.json`` in runs of older versions),
  ``draws.csv``, ``tb/``, ``plots/``, written with the umask's permissions;
* ``report.html``: names the most exposed members, so it is written owner-only (0600); the
  export writes a page without them;
* ``private/`` (:data:`PRIVATE_DIR`, owner-only: 0700): everything computed from the members
  without noise, never to be shared (``private/README.txt`` says why): ``split.json`` (the
  member indices), ``cache/`` (the default cache: the clean head and its sensitivity sample,
  features of every example, shadow heads), ``risk/`` (per-member scores);
* ``.lock``.

Rules:

* A lock (``<out>/.lock``, ``flock``) keeps a second run out of the folder (and an export
  out of a folder that is being written).
* ``private/`` and a cache folder the run creates are created owner-only (0700). A cache
  that exists is left as it is; an existing ``private/`` loses its group and other
  permissions (left by an older version; it holds the member indices, and the run owns
  it), and keeps losing them if the start is rolled back: access is only ever narrowed.
* A non-empty folder is refused unless the run resumes it (its ``config.json`` must agree on
  every key that decides the rows, and every kept row must be valid: :func:`check_rows`) or
  overwrites it (results, ROC curves, TensorBoard events and plots of the previous run are
  removed once the first new cell is written; caches are kept).
* A resume verifies the folder against its ``manifest.json`` (every file the run wrote, with
  its digest: :mod:`alm_opacus.run.manifest`) and refuses a file that does not match, and
  data whose digest differs from the one ``config.json`` recorded (:func:`check_data`).
* Symlinks among the run's own files are refused (an overwrite replaces them, never
  following them).
* A start that fails before its first cell is written leaves the folder as it found it.
* Temporary files left by a killed run are removed when the next run takes the lock.
* Every file is written atomically, except ``rocs.jsonl``: appended (fsynced) before the
  cell's rows reach ``results.csv``; a resume drops its lines without rows, rewriting it
  once, atomically. Probes never follow symlinks.

Whoever can write the run folder is trusted: the checks guard against corruption, stale
versions and mistakes, not against a forger (``docs/threat_model.md``).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import shutil
from pathlib import Path
from typing import Any

from alm_opacus.io import (
    atomic_open,
    atomic_write_text,
    is_inside,
    make_private_folder,
    walk_entries,
)
from alm_opacus.report.draws import DRAWS_FILE
from alm_opacus.report.html import REPORT_FILE
from alm_opacus.report.results import read_results
from alm_opacus.report.risk import RISK_FOLDER
from alm_opacus.report.rocs import LEGACY_ROCS_FILE, ROCS_FILE, legacy_refusal
from alm_opacus.run.config import config_mismatch
from alm_opacus.run.export import export_run
from alm_opacus.run.layout import (
    DEFAULT_CACHE,
    LOCK_FILE,
    PRIVATE_DIR,
    PRIVATE_README,
    RESIDUE,
    SHARED_FILES,
    SPLIT_FILE,
    WITHHELD_KEYS,
)
from alm_opacus.run.manifest import MANIFEST_FILE
from alm_opacus.run.resume import _read_json, check_data, check_manifest, check_rocs, check_rows

__all__ = [
    "DEFAULT_CACHE",
    "PRIVATE_DIR",
    "PRIVATE_README",
    "RUN_FILES",
    "SHARED_FILES",
    "SPLIT_FILE",
    "WITHHELD_KEYS",
    "RunFolder",
    "check_can_create",
    "check_data",
    "check_manifest",
    "check_rocs",
    "check_rows",
    "check_writable_dir",
    "export_run",
    "write_private_readme",
]

#: What a run writes in its folder (besides caches), removed by an overwrite.
#: ``split.json`` at the top is the layout before ``private/`` existed.
RUN_FILES = (
    "config.json",
    SPLIT_FILE,
    "results.csv",
    ROCS_FILE,
    LEGACY_ROCS_FILE,
    "tb",
    "plots",
    "split.json",
    DRAWS_FILE,
    REPORT_FILE,
    str(RISK_FOLDER),
    MANIFEST_FILE,
)
_LOCK = LOCK_FILE
#: Files a run rewrites before its first cell: a rolled-back start restores them.
_REWRITTEN_EARLY = ("config.json", SPLIT_FILE, PRIVATE_README)
_RESIDUE = RESIDUE

_README = """\
This folder holds what the run computed from the members (the private split) without
noise. It is never to be shared:

- split.json: the indices of the members (and of every other part of the split);
- cache/ (unless --cache-dir put the cache elsewhere): the clean, unprotected head and its
  sensitivity sample (posthoc-head-*.pt), the features of every example (features-*.pt),
  shadow heads and the encoder;
- risk/: per-member membership scores (which members the attacks expose most).

The run creates this folder owner-only (0700), and report.html (it names the most exposed
members) owner-only (0600). Sharing any of it can disclose who the members are or undo the
protection of every release. `alm-opacus export RUN DEST` copies only what may be shared
(results, ROC curves, figures, TensorBoard events, config.json without the split seed) and
writes a report without the per-member section. See docs/threat_model.md.
"""

_CACHE_README = """\
This cache holds work computed from private data without noise: clean, unprotected heads
and their sensitivity samples (posthoc-head-*.pt), features of every example
(features-*.pt), shadow heads and encoders. Never share it. Every file carries a digest of
its content and of the code that wrote it, checked on load; a file that fails is recomputed.
See docs/threat_model.md.
"""


def write_private_readme(folder: Path, *, cache: bool = False) -> None:
    """Write ``folder/README.txt``, saying that ``folder`` holds private data and why."""
    path = Path(folder) / "README.txt"
    text = _CACHE_README if cache else _README
    if not (path.is_file() and not path.is_symlink() and path.read_text() == text):
        atomic_write_text(path, text)


def check_writable_dir(path: Path, *, flag: str) -> None:
    """Check that ``path`` is (or can be created as) a writable folder, without following a
    planted symlink and without leaving anything behind.

    Raises:
        ValueError: naming ``flag`` and the folder, when it is not.
    """
    try:
        if path.exists() and not path.is_dir():
            raise ValueError(f"{flag}={str(path)!r} is a file: expected a folder")
        path.mkdir(parents=True, exist_ok=True)
        # O_EXCL refuses an existing name, symlink included, so nothing outside is touched.
        fd = os.open(path / f".probe-{os.getpid()}", os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
        os.close(fd)
        os.unlink(path / f".probe-{os.getpid()}")
    except OSError as exc:
        raise ValueError(f"{flag}={str(path)!r} is not a writable folder: {exc.strerror}") from exc


def check_can_create(path: Path, *, flag: str) -> None:
    """Check that ``path`` is a writable folder or can be created as one, leaving the file
    system as it was (folders created by the check are removed again).

    Raises:
        ValueError: naming ``flag`` when ``path`` is a file or cannot be created.
    """
    path = Path(path)
    if path.exists():
        if not path.is_dir():
            raise ValueError(f"{flag}={str(path)!r} is a file: expected a folder")
        if not os.access(path, os.W_OK | os.X_OK):
            raise ValueError(f"{flag}={str(path)!r} is not writable: expected a writable folder")
        return
    created: list[Path] = []
    try:
        for folder in reversed(_missing(path)):
            folder.mkdir()
            created.append(folder)
    except OSError as exc:
        raise ValueError(f"{flag}={str(path)!r} cannot be created: {exc.strerror}") from exc
    finally:
        for folder in reversed(created):
            with contextlib.suppress(OSError):
                folder.rmdir()


def _missing(path: Path) -> list[Path]:
    """``path`` and its ancestors that do not exist, deepest first."""
    path = Path(os.path.abspath(path))
    return [p for p in (path, *path.parents) if not os.path.lexists(p)]


def _remove(path: Path) -> None:
    if path.is_symlink() or path.is_file():
        path.unlink()
    elif path.is_dir():
        shutil.rmtree(path)


class RunFolder:
    """A locked run folder. Use as a context manager around the whole run, and call
    :meth:`commit` before the first result is written.

    Until :meth:`commit`, the folder is as it was found: an overwrite has removed nothing
    yet, and a start that fails (or is interrupted) is rolled back on exit (what it created
    is removed, the files it rewrote are restored, the lock it created is removed).

    Args:
        out: the folder.
        resume: continue a previous run (its ``config.json`` must agree).
        overwrite: replace a previous run.
        cache: the run's cache folder (given a ``README.txt`` saying it is private).
    """

    def __init__(
        self, out: Path, *, resume: bool, overwrite: bool, cache: Path | None = None
    ) -> None:
        self.out = Path(out)
        self.resume = resume
        self.overwrite = overwrite
        self.cache = None if cache is None else Path(cache)
        self.committed = False
        self._fd: int | None = None
        self._created_dirs: list[Path] = []
        self._present: set[str] = set()
        self._snapshot: dict[str, bytes] = {}
        self._cache_readme = False

    def previous_config(self) -> dict[str, Any] | None:
        """The previous run's ``config.json``, if any.

        Raises:
            ValueError: if it exists but cannot be read.
        """
        path = self.out / "config.json"
        if not os.path.lexists(path):
            return None
        data = _read_json(path, what="config.json", hint="use --overwrite")
        if not isinstance(data, dict):
            raise ValueError(f"{path}: expected a JSON object; use --overwrite")
        return data

    def check(self, settings: dict[str, Any]) -> None:
        """Refuse a folder that holds another run, or anything a resume cannot trust, before
        anything is written.

        Raises:
            ValueError: for a file in place of the folder, a resume of a folder that does not
                exist, a symlink among the run's files, a previous run without
                ``resume``/``overwrite``, a resumed run whose config differs (naming the keys
                that differ), or a kept row or ROC curve that fails :func:`check_rows` /
                :func:`check_rocs`.
        """
        if self.out.exists() and not self.out.is_dir():
            raise ValueError(f"--out={str(self.out)!r} is a file: expected a folder")
        if self.resume and not self.out.exists():
            raise ValueError(
                f"--resume: --out={str(self.out)!r} does not exist, so there is nothing to "
                "resume; check the path, or drop --resume to start a new run"
            )
        self._refuse_symlinks()
        present = [n for n in RUN_FILES if os.path.lexists(self.out / n)]
        if not present or self.overwrite:
            return
        if not self.resume:
            raise ValueError(
                f"--out={str(self.out)!r} holds a previous run ({', '.join(present)}): pass "
                "--resume to continue it, --overwrite to replace it, or another --out"
            )
        previous = self.previous_config()
        if previous is None:
            raise ValueError(
                f"--resume: {self.out / 'config.json'} is missing, so the finished cells cannot "
                "be checked against this run; use --overwrite or another --out"
            )
        current = json.loads(json.dumps(settings, default=str))
        diff = config_mismatch(previous, current)
        if diff:
            raise ValueError(
                f"--resume: this run's config differs from {self.out / 'config.json'} in "
                f"{'; '.join(diff[:6])}; use the same settings, --overwrite, or another --out"
            )
        results = self.out / "results.csv"
        rows = []
        if results.exists():
            try:
                rows = read_results(results)
            except (OSError, ValueError) as exc:
                raise ValueError(f"--resume: {exc}; use --overwrite to start again") from exc
            check_rows(rows, settings=previous, path=results)
        if os.path.lexists(self.out / LEGACY_ROCS_FILE):
            raise ValueError(f"--resume: {legacy_refusal(self.out)}")
        rocs = self.out / ROCS_FILE
        if rocs.exists():
            check_rocs(rocs, settings=previous, cells={row.cell() for row in rows})
        check_manifest(self.out)
        check_data(previous, current, out=self.out)

    def _refuse_symlinks(self) -> None:
        """A symlink among the run's files would make a resume read another run's rows, or
        a write land outside the folder. An overwrite replaces those it removes (never
        following them); inside ``private/`` and the folders, none is accepted."""
        for name in (*RUN_FILES, PRIVATE_DIR):
            path = self.out / name
            if path.is_symlink():
                if self.overwrite and name in RUN_FILES and name != SPLIT_FILE:
                    continue
                raise ValueError(
                    f"--out: {path} is a symlink; a run folder's own files must be real files "
                    "(symlinked results could belong to another run): remove it, or use "
                    "--overwrite" + (" or --cache-dir" if name == PRIVATE_DIR else "")
                )
            if path.is_dir():
                for inner in walk_entries(path):
                    if inner.is_symlink():
                        raise ValueError(
                            f"--out: {inner} is a symlink; a run folder holds real files only "
                            "(pass --cache-dir to keep a cache elsewhere)"
                        )

    def __enter__(self) -> RunFolder:
        self._created_dirs = [*_missing(self.out)]
        if self.cache is not None:
            self._created_dirs += [p for p in _missing(self.cache) if p not in self._created_dirs]
        check_writable_dir(self.out, flag="--out")
        self._present = {
            n for n in (*RUN_FILES, PRIVATE_README, _LOCK) if os.path.lexists(self.out / n)
        }
        path = self.out / _LOCK
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        except OSError as exc:
            self._remove_created_dirs()
            raise ValueError(f"--out: cannot open the lock file {path}: {exc.strerror}") from exc
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(fd)
            if exc.errno in (errno.EAGAIN, errno.EACCES):
                raise ValueError(
                    f"--out={str(self.out)!r} is in use by another run or an export (lock "
                    f"{path}); wait for it or choose another --out"
                ) from exc
            raise
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._fd = fd
        try:
            # what a start may rewrite before its first cell (results are written after it)
            self._snapshot = {
                n: (self.out / n).read_bytes()
                for n in _REWRITTEN_EARLY
                if n in self._present and (self.out / n).is_file()
            }
            self._clean_residues()
            # owner-only before anything private is written into them
            make_private_folder(self.out / PRIVATE_DIR, tighten=True)
            if self.cache is not None:
                make_private_folder(self.cache)
            write_private_readme(self.out / PRIVATE_DIR)
            if self.cache is not None and not is_inside(self.cache, self.out / PRIVATE_DIR):
                self._cache_readme = not os.path.lexists(self.cache / "README.txt")
                write_private_readme(self.cache, cache=True)
        except BaseException:
            self._close(rollback=True)
            raise
        return self

    def commit(self) -> None:
        """Called before the first result is written: from here on the folder holds this run
        (an overwrite removes the previous run's results now, keeping this run's split)."""
        if self.committed:
            return
        if self.overwrite:
            for name in RUN_FILES:
                if name != SPLIT_FILE and os.path.lexists(self.out / name):
                    _remove(self.out / name)
        self.committed = True

    def __exit__(self, exc_type: object, *exc: object) -> None:
        self._close(rollback=exc_type is not None and not self.committed)

    def _close(self, *, rollback: bool) -> None:
        try:
            if rollback:
                self._rollback()
        finally:
            if self._fd is not None:
                with contextlib.suppress(OSError):
                    fcntl.flock(self._fd, fcntl.LOCK_UN)
                    os.close(self._fd)
                self._fd = None
            if rollback:
                self._remove_created_dirs()

    def _rollback(self) -> None:
        """Undo a start that wrote no result: remove what it created, restore what it
        rewrote, and remove the lock it created."""
        for name in RUN_FILES:
            path = self.out / name
            if name not in self._present and os.path.lexists(path):
                _remove(path)
        for name, data in self._snapshot.items():
            path = self.out / name
            if not path.is_file() or path.read_bytes() != data:
                _write_bytes(path, data)
        # A README goes only with a folder left empty: a cache written meanwhile keeps it.
        readmes = [self.out / PRIVATE_README] if PRIVATE_README not in self._present else []
        if self._cache_readme and self.cache is not None:
            readmes.append(self.cache / "README.txt")
        for readme in readmes:
            if readme.is_file() and [p.name for p in readme.parent.iterdir()] == ["README.txt"]:
                readme.unlink()
        if _LOCK not in self._present:
            with contextlib.suppress(FileNotFoundError):
                (self.out / _LOCK).unlink()

    def _remove_created_dirs(self) -> None:
        with contextlib.suppress(OSError):
            if PRIVATE_README not in self._present:
                (self.out / PRIVATE_DIR).rmdir()  # only if empty
        for folder in sorted(self._created_dirs, key=lambda p: len(p.parts), reverse=True):
            with contextlib.suppress(OSError):
                folder.rmdir()  # only if empty: a cache written meanwhile stays

    def _clean_residues(self) -> None:
        """Remove the temporary files and folders a killed run left (the lock is held, so no
        other run of this folder is writing them)."""
        for folder in (self.out, self.out / PRIVATE_DIR, self.out / "tb", self.out / "plots"):
            if not folder.is_dir() or folder.is_symlink():
                continue
            for entry in folder.iterdir():
                if _RESIDUE.match(entry.name) and entry.name != _LOCK:
                    _remove(entry)


def _write_bytes(path: Path, data: bytes) -> None:
    with atomic_open(path, "wb") as handle:
        handle.write(data)
