"""Atomic file writes: a reader (or a Ctrl-C) never sees a half-written file."""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any


@contextlib.contextmanager
def atomic_open(path: str | os.PathLike[str], mode: str = "w") -> Iterator[IO[Any]]:
    """Open a temporary file beside ``path`` and rename it over ``path`` on success.

    On any exception (KeyboardInterrupt included) the temporary file is removed and
    ``path`` keeps its previous content.
    """
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    os.fchmod(fd, 0o666 & ~_umask())  # mkstemp's 0600 would hide results from other users
    try:
        with os.fdopen(fd, mode) as handle:
            yield handle
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


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


def atomic_write_text(path: str | os.PathLike[str], text: str) -> None:
    """Write ``text`` to ``path`` atomically."""
    with atomic_open(path, "w") as handle:
        handle.write(text)


def atomic_write_json(path: str | os.PathLike[str], obj: Any) -> None:
    """Write ``obj`` as indented JSON to ``path`` atomically."""
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n")


def atomic_torch_save(obj: Any, path: str | os.PathLike[str]) -> None:
    """``torch.save`` to ``path`` atomically."""
    import torch

    with atomic_open(path, "wb") as handle:
        torch.save(obj, handle)


def cached(path: Path | None, *, kind: str, key: str, compute: Any) -> Any:
    """Return ``compute()``, cached at ``path`` (atomically written, checked on load).

    The payload must load with ``torch.load(weights_only=True)`` (tensors, numbers, strings,
    lists and dicts). ``path=None`` disables caching.

    Raises:
        ValueError: if the file at ``path`` is unreadable, or holds another kind or key.
    """
    import torch

    if path is None:
        return compute()
    if path.exists():
        try:
            state = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as exc:
            raise ValueError(f"{path}: not a readable cache file ({exc}); delete it") from exc
        if not isinstance(state, dict) or state.get("kind") != kind or state.get("key") != key:
            raise ValueError(f"{path}: expected a {kind!r} cache for key {key!r}; delete it")
        return state["payload"]
    payload = compute()
    atomic_torch_save({"kind": kind, "key": key, "payload": payload}, path)
    return payload
