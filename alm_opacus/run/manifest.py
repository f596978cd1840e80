"""``manifest.json``: every file a run wrote in its folder, with its SHA-256 digest and size,
and whether the run finished.

The driver (:class:`~alm_opacus.run.writer.RunWriter`) records each file right after writing
it (only the files it wrote: a cell costs the digests of the few files the cell rewrote) and
rewrites the manifest atomically. ``--resume`` (:mod:`alm_opacus.run.rundir`) and ``export``
(:mod:`alm_opacus.run.export`) verify it and refuse a file that does not match, naming it: an
edited row, a flipped bit, a truncated file. ``export`` copies manifest entries only, and
refuses a run the manifest does not mark complete.

Before each batch of writes the manifest names the files about to be rewritten
(:attr:`Manifest.writing`): a run killed between a write and the manifest's update leaves
them named there, and a resume accepts them as they are (the rows still pass
``rundir.check_rows``) instead of refusing a folder that only a kill changed. A finished run
has none.

Like the caches (``alm_opacus/io.py``), the manifest guards against corruption, stale files
and mistakes, not against a forger: whoever can write the folder can write a matching
manifest (``docs/threat_model.md``). This module imports neither torch nor numpy (the export
uses it).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from alm_opacus.io import atomic_write_json

__all__ = [
    "MANIFEST_FILE",
    "MANIFEST_FORMAT",
    "FileDigest",
    "Manifest",
    "file_digest",
    "folder_files",
    "mismatch",
    "read_manifest",
    "recorded",
    "verify_manifest",
    "write_manifest",
]

#: The manifest's name in the run folder.
MANIFEST_FILE = "manifest.json"
#: Bumped when the manifest's layout changes.
MANIFEST_FORMAT = 1
_CHUNK = 1 << 20


@dataclass(frozen=True)
class FileDigest:
    """One file's SHA-256 (hex) and size in bytes."""

    sha256: str
    size: int


@dataclass(frozen=True)
class Manifest:
    """The files a run wrote (paths relative to the run folder, POSIX separators).

    Attributes:
        files: every file the run wrote, with its digest.
        complete: the run finished (its report, plots and TensorBoard were written last).
        writing: files (or folders) being rewritten when the manifest was last written (none
            in a run that was not killed while writing).
    """

    files: Mapping[str, FileDigest] = field(default_factory=dict)
    complete: bool = False
    writing: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {
            "format": MANIFEST_FORMAT,
            "complete": self.complete,
            "writing": list(self.writing),
            "files": {
                k: {"sha256": v.sha256, "size": v.size} for k, v in sorted(self.files.items())
            },
        }


def file_digest(path: Path) -> FileDigest:
    """The SHA-256 and size of the file at ``path`` (read in chunks)."""
    sha = hashlib.sha256()
    size = 0
    with open(path, "rb") as handle:
        while chunk := handle.read(_CHUNK):
            sha.update(chunk)
            size += len(chunk)
    return FileDigest(sha256=sha.hexdigest(), size=size)


def recorded(
    manifest: Manifest, *, run: Path, paths: Iterable[Path], replace_under: str | None = None
) -> Manifest:
    """``manifest`` with the files ``paths`` (inside ``run``) digested as they are now.

    Args:
        manifest: the manifest so far.
        run: the run folder.
        paths: the files just written.
        replace_under: a folder (relative, e.g. ``"tb"``) rewritten whole: its previous
            entries are dropped first.

    Returns:
        A new manifest (the same ``complete`` flag and ``writing``).
    """
    files = dict(manifest.files)
    if replace_under is not None:
        prefix = replace_under.rstrip("/") + "/"
        files = {k: v for k, v in files.items() if not k.startswith(prefix)}
    for path in paths:
        files[Path(path).relative_to(run).as_posix()] = file_digest(Path(path))
    return replace(manifest, files=files)


def folder_files(folder: Path) -> list[Path]:
    """Every plain file below ``folder`` (what a folder rewritten whole now holds)."""
    out = []
    for root, _dirs, names in os.walk(folder, followlinks=False):
        out += [Path(root) / n for n in sorted(names) if (Path(root) / n).is_file()]
    return sorted(out)


def write_manifest(run: Path, manifest: Manifest) -> None:
    """Write ``run/manifest.json`` atomically."""
    atomic_write_json(run / MANIFEST_FILE, manifest.to_json())


def read_manifest(run: Path, *, prefix: str, hint: str) -> Manifest:
    """``run/manifest.json``.

    Args:
        run: the run folder.
        prefix: what starts each error (``"--resume: "``, ``"export: "``).
        hint: what to do, ending each error.

    Raises:
        ValueError: one line naming the manifest, when it is missing or not a manifest.
    """
    path = run / MANIFEST_FILE
    if not path.is_file() or path.is_symlink():
        raise ValueError(
            f"{prefix}{path} is missing: the folder cannot prove what it holds (written by an "
            f"older version, or edited); {hint}"
        )
    try:
        data = json.loads(path.read_text())
        if data.get("format") != MANIFEST_FORMAT:
            raise ValueError(f"format {data.get('format')!r}, expected {MANIFEST_FORMAT}")
        files = {
            str(k): FileDigest(sha256=str(v["sha256"]), size=int(v["size"]))
            for k, v in data["files"].items()
        }
        writing = tuple(str(w) for w in data.get("writing", []))
        complete = data["complete"]
        if not isinstance(complete, bool):
            raise ValueError(f"complete={complete!r}, expected true or false")
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ValueError(f"{prefix}{path}: not a readable manifest ({exc}); {hint}") from exc
    for name in files:
        if name.startswith("/") or ".." in Path(name).parts:
            raise ValueError(f"{prefix}{path}: names {name!r}, outside the run folder; {hint}")
    return Manifest(files=files, complete=complete, writing=writing)


def mismatch(run: Path, name: str, expected: FileDigest) -> str | None:
    """Why ``run/name`` does not match ``expected`` (missing, a symlink, another size, another
    digest), or ``None`` when it does."""
    path = run / name
    if not os.path.lexists(path):
        return "is missing"
    if path.is_symlink():
        return "is a symlink (the run writes plain files)"
    if not path.is_file():
        return "is not a plain file"
    size = path.stat().st_size
    if size != expected.size:
        return f"has {size} bytes where the manifest recorded {expected.size} (truncated or edited)"
    found = file_digest(path)
    if found.sha256 != expected.sha256:
        return (
            f"has SHA-256 {found.sha256[:16]}… where the manifest recorded "
            f"{expected.sha256[:16]}… (edited or corrupt)"
        )
    return None


def verify_manifest(
    run: Path, manifest: Manifest, *, prefix: str, hint: str, tolerate_writing: bool = False
) -> None:
    """Check every file of ``manifest`` against the folder ``run``.

    Args:
        run: the run folder.
        manifest: its manifest.
        prefix: what starts the error.
        hint: what to do, ending the error.
        tolerate_writing: accept the files the manifest names as being written (a resume
            of a run killed mid-write).

    Raises:
        ValueError: one line naming the first file that does not match, and how.
    """
    writing = manifest.writing if tolerate_writing else ()
    for name, expected in sorted(manifest.files.items()):
        if any(name == w or name.startswith(f"{w}/") for w in writing):
            continue
        why = mismatch(run, name, expected)
        if why is not None:
            raise ValueError(f"{prefix}{run / name} {why}: it is not what the run wrote; {hint}")
