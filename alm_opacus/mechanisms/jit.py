"""numba, compiled where it imports: the decorators of the exact mechanisms' kernels, with an
on-disk cache under the user's cache directory, never the source tree
(`alm_opacus.mechanisms.kernels`, `alm_opacus.mechanisms.clip_kernels`).
"""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Callable
from typing import Any

__all__ = ["NUMBA", "cache_dir", "jit", "jit_reassociated", "jit_uncontracted"]

#: The numba module, or ``None`` where it does not import (the tensor paths run then).
NUMBA: Any
try:
    import numba as NUMBA
except ImportError:  # pragma: no cover - the tensor path is tested by switching kernels off
    NUMBA = None


def cache_dir() -> str:
    """Where the compiled kernels are cached: ``NUMBA_CACHE_DIR`` if the user set it, else
    the per-user cache (``~/.cache/alm_opacus/numba`` on Linux, ``XDG_CACHE_HOME``
    respected). Never the package directory: numba's own default (``cache=True``) writes
    into the ``__pycache__`` next to the source whenever it is writable, i.e. into
    site-packages or the repository."""
    if NUMBA is None:  # pragma: no cover - nothing is compiled then
        return ""
    from numba.misc.appdirs import AppDirs

    user = str(NUMBA.config.CACHE_DIR or "")
    return user or os.path.join(AppDirs("alm_opacus", appauthor=False).user_cache_dir, "numba")


@functools.cache
def _cache_class() -> Any:
    """numba's function cache with one locator, `cache_dir` (``cache=True`` would try the
    source tree first)."""
    from numba.core import caching

    names = vars(caching)  # the locator lost its underscore in numba 0.6x
    wide: Any = names.get("UserWideCacheLocator") or names["_UserWideCacheLocator"]
    impl: Any = caching.CompileResultCacheImpl

    class Locator(wide):
        def __init__(self, py_func: Any, py_file: str) -> None:
            super().__init__(py_func, py_file)
            self._cache_path = os.path.join(cache_dir(), self.get_suitable_cache_subpath(py_file))

    class Impl(impl):
        _locator_classes = (Locator,)

    class Cache(caching.FunctionCache):
        _impl_class = Impl

    return Cache


def _cached(dispatcher: Any, function: Callable[..., Any]) -> Any:
    """``dispatcher`` with an on-disk cache under `cache_dir`; uncached (compiled once per
    process) if that directory cannot be written."""
    with contextlib.suppress(RuntimeError):  # numba's "no locator available"
        dispatcher._cache = _cache_class()(function)
    return dispatcher


def _jit_with(*, fastmath: frozenset[str]) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """A decorator: compiled on first call (and cached on disk, under `cache_dir`) with the
    LLVM fast-math flags ``fastmath`` where numba imports; else the function as is."""

    def decorate(function: Callable[..., Any]) -> Callable[..., Any]:
        if NUMBA is None:
            return function
        flags = set(fastmath) or False
        # not cache=True, whose locator would pick the source tree first (`cache_dir`)
        options = {"nogil": True, "error_model": "numpy", "fastmath": flags}
        return _cached(NUMBA.njit(**options)(function), function)

    return decorate


jit = _jit_with(fastmath=frozenset({"contract"}))
#: Without contraction: fl(s·g) must be rounded once, as torch rounds it (`_cell_sums`).
jit_uncontracted = _jit_with(fastmath=frozenset())
#: Reassociation only (no nnan/ninf: a NaN or inf must reach the caller): a float32 sum of
#: non-negative terms is within γ_T of the exact sum in any order, so the vectorised order
#: keeps the bound (`_tile_loop`).
jit_reassociated = _jit_with(fastmath=frozenset({"reassoc"}))
