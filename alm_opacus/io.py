"""Atomic file writes (a reader, or a Ctrl-C, never sees a half-written file) and caches
that are never used unless they are exactly what their producer wrote.

Caches guard against corruption and stale versions, not against a forger: whoever can write
the cache folder can also write a matching digest (``docs/threat_model.md``).
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
import tempfile
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any, TypeVar

T = TypeVar("T")

#: Bumped when the layout of a cache record changes; older records are recomputed.
CACHE_FORMAT = 2


@contextlib.contextmanager
def atomic_open(
    path: str | os.PathLike[str], mode: str = "w", *, private: bool = False
) -> Iterator[IO[Any]]:
    """Open a temporary file beside ``path`` and rename it over ``path`` on success.

    On any exception (KeyboardInterrupt included) the temporary file is removed and
    ``path`` keeps its previous content.

    Args:
        path: the file to write.
        mode: ``"w"`` or ``"wb"``.
        private: write it owner-only (0600) instead of with the umask's permissions (files
            that name members, e.g. ``report.html``); the mode is set before the rename, so
            the file is never readable by others, not even for a moment.

    Raises:
        OSError: from the file system, naming ``path`` (a full disk's error from ``write``
            names no file by itself).
    """
    target = Path(path)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    except OSError as exc:
        raise _naming(exc, target) from exc
    # mkstemp's 0600 would hide results from other users; private files keep it
    os.fchmod(fd, 0o600 if private else 0o666 & ~_umask())
    try:
        with os.fdopen(fd, mode) as handle:
            yield handle
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, target)
    except BaseException as exc:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        if isinstance(exc, OSError) and exc.filename is None:
            raise _naming(exc, target) from exc
        raise


def _naming(exc: OSError, target: Path) -> OSError:
    """``exc`` with ``target`` as its file name where it names none."""
    if exc.filename is not None:
        return exc
    return type(exc)(exc.errno, exc.strerror or str(exc), str(target))


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def replace_marked(text: str, *, begin: str, end: str, block: str) -> str:
    """``text`` with everything between the markers ``begin`` and ``end`` replaced by
    ``block`` (generated sections of the docs).

    Raises:
        ValueError: unless each marker occurs exactly once, ``begin`` first.
    """
    if text.count(begin) != 1 or text.count(end) != 1 or text.index(begin) > text.index(end):
        raise ValueError(f"expected one {begin} followed by one {end}")
    head, rest = text.split(begin)
    _, tail = rest.split(end)
    return f"{head}{begin}\n{block.strip()}\n{end}{tail}"


def atomic_write_text(path: str | os.PathLike[str], text: str, *, private: bool = False) -> None:
    """Write ``text`` to ``path`` atomically (owner-only with ``private``: :func:`atomic_open`)."""
    with atomic_open(path, "w", private=private) as handle:
        handle.write(text)


def make_private_folder(path: Path, *, tighten: bool = False) -> None:
    """Create the folder ``path`` owner-only (0700), for data computed from the members.

    Missing parents are created with the umask's permissions (they are not private
    themselves). A folder that already exists is left as it is, unless ``tighten``: then
    its group and other permissions are removed (it only ever narrows access). A symlink is
    never followed or changed.

    Raises:
        OSError: from the file system (e.g. ``path`` is a file).
    """
    path = Path(path)
    if not os.path.lexists(path):
        path.parent.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileExistsError):  # created meanwhile: treated as existing
            os.mkdir(path, 0o700)
            os.chmod(path, 0o700)  # mkdir's mode goes through the umask
            return
    info = os.lstat(path)
    if tighten and stat.S_ISDIR(info.st_mode) and stat.S_IMODE(info.st_mode) & 0o077:
        os.chmod(path, stat.S_IMODE(info.st_mode) & ~0o077)


def is_inside(path: str | os.PathLike[str], folder: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is ``folder`` or lies below it, compared as absolute paths (``..``
    collapsed, symlinks not resolved)."""
    try:
        Path(os.path.abspath(path)).relative_to(os.path.abspath(folder))
    except ValueError:
        return False
    return True


def walk_entries(folder: str | os.PathLike[str]) -> Iterator[Path]:
    """Every entry below ``folder``, folders and files, in sorted order (symlinks reported,
    never followed)."""
    for root, dirs, files in os.walk(folder, followlinks=False):
        dirs.sort()
        for name in sorted([*dirs, *files]):
            yield Path(root) / name


def atomic_write_json(path: str | os.PathLike[str], obj: Any) -> None:
    """Write ``obj`` as indented JSON to ``path`` atomically."""
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n")


def atomic_torch_save(obj: Any, path: str | os.PathLike[str]) -> None:
    """``torch.save`` to ``path`` atomically."""
    import torch

    with atomic_open(path, "wb") as handle:
        torch.save(obj, handle)


class StaleCacheWarning(UserWarning):
    """A cache file was not used (unreadable, another kind or key, written by other code, or
    altered since it was written) and is being recomputed."""


#: What :func:`read_cache` returns when there is no usable cache.
MISSING: Any = object()


def write_cache(path: Path, *, kind: str, key: str, code: str, payload: Any) -> None:
    """Write ``payload`` atomically as a cache record: its kind, key, the digest of the code
    that produced it (``code``, e.g. :func:`~alm_opacus._hashing.code_digest`) and the
    digest of its own content, all checked by :func:`read_cache`."""
    from alm_opacus._hashing import content_digest  # imports torch: only where caches are

    record = {
        "kind": kind,
        "key": key,
        "format": CACHE_FORMAT,
        "code": code,
        "digest": content_digest(payload),
        "payload": payload,
    }
    atomic_torch_save(record, path)


def read_cache(path: Path, *, kind: str, key: str, code: str) -> Any:
    """The payload cached at ``path``, or :data:`MISSING`.

    A record is used only if it loads as plain data (``torch.load(weights_only=True)``: a
    file never runs code), has this ``kind``, ``key``, format and ``code`` digest, and its
    content matches its digest. Otherwise a :class:`StaleCacheWarning` names the file and the
    reason, and the caller recomputes (and overwrites) it.
    """
    import torch

    from alm_opacus._hashing import content_digest

    if not path.exists():
        return MISSING
    try:
        record = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # truncated files, foreign pickles and refused globals alike
        # torch's refusals run to a dozen lines; the first sentence says what was refused
        first = (str(exc).strip().splitlines() or [""])[0].split(". ")[0]
        return _stale(path, f"not a readable cache file ({type(exc).__name__}: {first})")
    if not isinstance(record, dict) or record.get("kind") != kind:
        found = record.get("kind") if isinstance(record, dict) else type(record).__name__
        return _stale(path, f"holds {found!r}, expected a {kind!r} cache")
    if record.get("key") != key:
        return _stale(path, "is a cache for other inputs (its key differs)")
    if record.get("format") != CACHE_FORMAT or record.get("code") != code:
        return _stale(
            path,
            "was written by other code (an older format or version, or an "
            f"edited module: code {record.get('code')!r}, expected {code!r})",
        )
    payload = record.get("payload")
    try:
        digest = content_digest(payload)
    except TypeError as exc:
        return _stale(path, f"holds a payload without a stable digest ({exc})")
    if record.get("digest") != digest:
        return _stale(path, "does not match its content digest (altered or corrupt)")
    return payload


def _stale(path: Path, reason: str) -> Any:
    warnings.warn(f"{path}: {reason}; recomputing it", StaleCacheWarning, stacklevel=3)
    return MISSING


def cached(path: Path | None, *, kind: str, key: str, code: str, compute: Callable[[], T]) -> T:
    """Return ``compute()``, cached at ``path`` (atomically written, checked on load by
    :func:`read_cache`; a cache that fails a check is recomputed, never used).

    The payload must load with ``torch.load(weights_only=True)`` (tensors, numbers, strings,
    lists and dicts). ``path=None`` disables caching.

    Args:
        path: the cache file (``None``: no caching).
        kind: what the file holds.
        key: everything that determines the payload besides the code (the inputs).
        code: digest of the code that computes it (:func:`~alm_opacus._hashing.code_digest`).
        compute: computes the payload.
    """
    if path is None:
        return compute()
    payload = read_cache(path, kind=kind, key=key, code=code)
    if payload is not MISSING:
        return payload
    payload = compute()
    write_cache(path, kind=kind, key=key, code=code, payload=payload)
    return payload
