"""Stable hashes for seeds, cache keys and provenance (Python's ``hash`` is salted per run)."""

from __future__ import annotations

import ast
import functools
import hashlib
import importlib.util
import math
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from torch import Tensor


def derive_seed(*parts: object) -> int:
    """A 63-bit seed from any labels, stable across processes."""
    digest = hashlib.sha256(repr(parts).encode()).digest()
    return int.from_bytes(digest[:8], "big") >> 1


def tensor_digest(*tensors: Tensor) -> str:
    """SHA-256 of the tensors' shapes, dtypes and bytes: keys for work that depends on them."""
    h = hashlib.sha256()
    for t in tensors:
        h.update(str((tuple(t.shape), t.dtype)).encode())
        h.update(t.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


def content_digest(obj: Any) -> str:
    """SHA-256 of a cache payload (nested dicts, lists, tuples, tensors, arrays, numbers,
    strings, ``None``), independent of dict order: two payloads share a digest only if
    every key, type, shape, dtype and byte agrees.

    Raises:
        TypeError: for a value of any other type (it would have no stable digest).
    """
    h = hashlib.sha256()
    _feed(h, obj)
    return h.hexdigest()


def _feed(h: Any, obj: Any) -> None:
    if isinstance(obj, dict):
        h.update(b"{%d" % len(obj))
        for key in sorted(obj, key=repr):
            _feed(h, key)
            _feed(h, obj[key])
    elif isinstance(obj, list | tuple):
        h.update(b"[%d" % len(obj) if isinstance(obj, list) else b"(%d" % len(obj))
        for item in obj:
            _feed(h, item)
    elif _is_tensor(obj):
        h.update(f"T{tuple(obj.shape)}{obj.dtype}".encode())
        h.update(obj.detach().cpu().contiguous().view(-1).view(_byte_dtype()).numpy().tobytes())
    elif isinstance(obj, np.ndarray):
        h.update(f"A{obj.shape}{obj.dtype.str}".encode())
        h.update(np.ascontiguousarray(obj).tobytes())
    elif isinstance(obj, bool) or obj is None:
        h.update(f"B{obj!r}".encode())
    elif isinstance(obj, int):
        h.update(f"I{obj}".encode())
    elif isinstance(obj, float):
        # repr is exact for floats; NaN's sign and payload are not data here.
        h.update(f"F{'nan' if math.isnan(obj) else repr(obj)}".encode())
    elif isinstance(obj, str):
        data = obj.encode()
        h.update(b"S%d:" % len(data) + data)
    elif isinstance(obj, bytes):
        h.update(b"Y%d:" % len(obj) + obj)
    else:
        raise TypeError(f"no stable digest for a {type(obj).__name__} in a cache payload")


def _is_tensor(obj: Any) -> bool:
    # torch is looked up, not imported: a payload cannot hold a tensor unless torch is
    # loaded, and the report and export paths (alm_opacus.io) must not pay for importing it
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(obj, torch.Tensor)


def _byte_dtype() -> Any:
    import torch

    return torch.uint8


def source_digest(paths: Iterable[Path], *, root: Path) -> str:
    """SHA-256 of files and folders (every ``*.py`` below a folder), by their path relative to
    ``root`` and their content: a Python file by its syntax tree (:func:`_python_content`),
    any other file by its bytes. It changes whenever what the code does may change, and not
    when only comments or layout do (a reformatting cannot change a measured number).

    Raises:
        FileNotFoundError: naming a path that does not exist.
    """
    h = hashlib.sha256()
    for path in sorted({Path(p) for p in paths}):
        if path.is_dir():
            files = sorted(f for f in path.rglob("*.py") if "__pycache__" not in f.parts)
        elif path.is_file():
            files = [path]
        else:
            raise FileNotFoundError(f"{path}: no such file or folder")
        for file in files:
            name = file.resolve().relative_to(root.resolve()).as_posix().encode()
            data = file.read_bytes()
            if file.suffix == ".py":
                data = _python_content(data)
            h.update(b"%d:%s%d:" % (len(name), name, len(data)) + data)
    return h.hexdigest()


def _python_content(source: bytes) -> bytes:
    """What a Python file computes, without comments and layout: its syntax tree as
    :func:`ast.dump` prints it (no line numbers; docstrings and every name kept). A file
    that does not parse counts by its bytes. The dump's format follows the interpreter's
    ``ast`` module, so a digest holds for one Python minor version."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return source
    return ast.dump(tree).encode()


@functools.cache
def code_digest(*modules: str) -> str:
    """A short digest of the source code of ``modules`` (a package counts with every module
    below it) and of the torch version: the "what produced it" of a cache.

    A cache records it and is recomputed when it differs, so a cache written by other code
    (an older version, an edited module) is never used. Computed once per process.

    Raises:
        ModuleNotFoundError: naming a module that cannot be found.
    """
    import torch

    paths: list[Path] = []
    roots: set[Path] = set()
    for name in modules:
        spec = importlib.util.find_spec(name)
        if spec is None or spec.origin is None:
            raise ModuleNotFoundError(f"code_digest: no module named {name!r}")
        origin = Path(spec.origin)
        paths.append(origin.parent if spec.submodule_search_locations else origin)
        depth = name.count(".") + (1 if spec.submodule_search_locations else 0)
        roots.add(origin.parents[depth])
    root = min(roots, key=lambda p: len(p.parts))
    source = source_digest(paths, root=root)
    return hashlib.sha256(f"{source} torch={torch.__version__}".encode()).hexdigest()[:16]
