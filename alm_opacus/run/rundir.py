"""The run folder: one run at a time, nothing half-written, nothing stale.

* A lock (``<out>/.lock``, ``flock``) keeps a second run out of the folder.
* A non-empty folder is refused unless the run resumes it (its ``config.json`` must agree on
  every key that decides the rows) or overwrites it (results, ROC curves, TensorBoard events
  and plots of the previous run are removed; caches are kept).
* Every file is written atomically; probes never follow symlinks.
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

from alm_opacus.report.draws import DRAWS_FILE
from alm_opacus.report.html import REPORT_FILE
from alm_opacus.report.risk import RISK_FOLDER
from alm_opacus.run.config import config_mismatch

__all__ = ["RUN_FILES", "RunFolder", "check_can_create", "check_writable_dir"]

#: What a run writes in its folder (besides ``cache/``), removed by an overwrite.
RUN_FILES = ("config.json", "split.json", "results.csv", "rocs.json", "tb", "plots",
             DRAWS_FILE, REPORT_FILE, RISK_FOLDER.parts[0])  # fmt: skip
_LOCK = ".lock"


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
    missing = [path, *(p for p in path.parents if not p.exists())]
    created: list[Path] = []
    try:
        for folder in reversed(missing):
            folder.mkdir()
            created.append(folder)
    except OSError as exc:
        raise ValueError(f"{flag}={str(path)!r} cannot be created: {exc.strerror}") from exc
    finally:
        for folder in reversed(created):
            with contextlib.suppress(OSError):
                folder.rmdir()


class RunFolder:
    """A locked run folder. Use as a context manager around the whole run.

    Args:
        out: the folder.
        resume: continue a previous run (its ``config.json`` must agree).
        overwrite: replace a previous run.
    """

    def __init__(self, out: Path, *, resume: bool, overwrite: bool) -> None:
        self.out = Path(out)
        self.resume = resume
        self.overwrite = overwrite
        self._fd: int | None = None

    def previous_config(self) -> dict[str, Any] | None:
        """The previous run's ``config.json``, if any.

        Raises:
            ValueError: if it exists but cannot be read.
        """
        path = self.out / "config.json"
        if not path.exists():
            return None
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            raise ValueError(
                f"{path}: not a readable config.json ({exc}); use --overwrite"
            ) from exc
        if not isinstance(data, dict):
            raise ValueError(f"{path}: expected a JSON object; use --overwrite")
        return data

    def check(self, settings: dict[str, Any]) -> None:
        """Refuse a folder that holds another run, before anything is written.

        Raises:
            ValueError: for a file in place of the folder, a previous run without
                ``resume``/``overwrite``, or a resumed run whose config differs (naming the
                keys that differ).
        """
        if self.out.exists() and not self.out.is_dir():
            raise ValueError(f"--out={str(self.out)!r} is a file: expected a folder")
        present = [n for n in RUN_FILES if (self.out / n).exists()]
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

    def __enter__(self) -> RunFolder:
        check_writable_dir(self.out, flag="--out")
        path = self.out / _LOCK
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        except OSError as exc:
            raise ValueError(f"--out: cannot open the lock file {path}: {exc.strerror}") from exc
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(fd)
            if exc.errno in (errno.EAGAIN, errno.EACCES):
                raise ValueError(
                    f"--out={str(self.out)!r} is in use by another run (lock {path}); wait for "
                    "it or choose another --out"
                ) from exc
            raise
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._fd = fd
        if self.overwrite:
            self._clear()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                fcntl.flock(self._fd, fcntl.LOCK_UN)
                os.close(self._fd)
            self._fd = None

    def _clear(self) -> None:
        for name in RUN_FILES:
            path = self.out / name
            if path.is_symlink() or path.is_file():
                path.unlink()
            elif path.is_dir():
                shutil.rmtree(path)
