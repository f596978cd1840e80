"""A restricted unpickler for data files: numpy arrays and plain types, never code.

``pickle.load`` calls whatever callable a file names, so a crafted CIFAR batch can run any
code. ``safe_load`` resolves only the globals that genuine CIFAR batches use:

- ``numpy.core.multiarray._reconstruct`` (numpy 1.x; the official files) or
  ``numpy._core.multiarray._reconstruct`` (numpy 2.x), ``numpy.ndarray`` and ``numpy.dtype``:
  how numpy pickles an array;
- ``_codecs.encode`` with the ``latin1`` codec only: how protocol-2 pickles written by
  Python 3 store ``bytes``.

Every other global is refused before anything is called, and the result must be a tree of
dicts, lists, tuples, str, bytes, int, float, bool, None and non-object numpy arrays.
"""

from __future__ import annotations

import codecs
import pickle
from typing import IO, Any

import numpy as np


class UnsafePickleError(pickle.UnpicklingError):
    """The pickle names a global (a callable) that data files never need."""


def _latin1_encode(text: str, encoding: str = "utf-8") -> bytes:
    if codecs.lookup(encoding).name != "iso8859-1":
        raise UnsafePickleError(f"refused _codecs.encode with codec {encoding!r}: only latin1")
    return text.encode("latin1")


def _dtype(*args: Any) -> np.dtype[Any]:
    dtype = np.dtype(*args)
    if dtype.hasobject:
        raise UnsafePickleError(f"refused numpy dtype {dtype!r}: object arrays hold code")
    return dtype


def _allowed() -> dict[tuple[str, str], Any]:
    allowed: dict[tuple[str, str], Any] = {
        ("numpy", "ndarray"): np.ndarray,
        ("numpy", "dtype"): _dtype,
        ("_codecs", "encode"): _latin1_encode,
    }
    reconstruct = np.ndarray.__reduce__(np.zeros(1))[0]  # numpy's own array rebuild function
    for module in ("numpy.core.multiarray", "numpy._core.multiarray"):
        allowed[(module, "_reconstruct")] = reconstruct
    return allowed


_ALLOWED = _allowed()
_PLAIN = (str, bytes, int, float, bool, type(None))


class _RestrictedUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if (module, name) not in _ALLOWED:
            raise UnsafePickleError(
                f"refused global {module}.{name}: data files hold only numpy arrays and plain "
                "types (dict, list, str, bytes, int, float)"
            )
        return _ALLOWED[(module, name)]


def _check_tree(obj: object, depth: int = 0) -> None:
    if depth > 100:
        raise UnsafePickleError("refused: nesting deeper than 100 levels")
    if isinstance(obj, np.ndarray):
        if obj.dtype.hasobject:
            raise UnsafePickleError(f"refused numpy array of dtype {obj.dtype}")
    elif isinstance(obj, dict):
        for key, value in obj.items():
            _check_tree(key, depth + 1)
            _check_tree(value, depth + 1)
    elif isinstance(obj, list | tuple):
        for value in obj:
            _check_tree(value, depth + 1)
    elif not isinstance(obj, _PLAIN):
        raise UnsafePickleError(f"refused object of type {type(obj).__name__}")


def safe_load(handle: IO[bytes], *, encoding: str = "ASCII") -> object:
    """Unpickle ``handle`` admitting only numpy arrays and plain types.

    Args:
        handle: a binary file opened for reading.
        encoding: how Python 2 ``str`` objects decode (``"bytes"`` keeps them as bytes, as
            CIFAR's files need).

    Returns:
        The unpickled object.

    Raises:
        UnsafePickleError: for a global other than numpy's array rebuild functions, or a
            result holding anything but arrays and plain types.
        pickle.UnpicklingError, EOFError, ValueError, ...: for a corrupt stream.
    """
    obj = _RestrictedUnpickler(handle, encoding=encoding).load()
    _check_tree(obj)
    return obj
