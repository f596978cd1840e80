"""Compiled kernels cache outside the package (issue 36, item 8): numba's ``cache=True``
wrote its index and object files into the ``__pycache__`` next to the source, i.e. into
site-packages or the repository."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import alm_opacus

pytest.importorskip("numba")

PACKAGE = Path(alm_opacus.__file__).resolve().parent
REPO = PACKAGE.parent

# Runs one kernel, then reports where every compiled kernel caches.
SCRIPT = """
import json, numpy as np
from numba.core.dispatcher import Dispatcher
from alm_opacus.mechanisms import kernels
words = np.arange(1, 4097, dtype=np.int64) << 40
kernels.first_pass_kernel("laplace")(words, 3.0, 1 << 50, 0.4, np.empty(4096, np.int64))
paths = {name: str(value.stats.cache_path) for name, value in vars(kernels).items()
         if isinstance(value, Dispatcher)}
print(json.dumps({"dir": kernels.cache_dir(), "paths": paths}))
"""


def _numba_files(root: Path) -> dict[str, int]:
    return {str(p): p.stat().st_mtime_ns for p in root.rglob("*.nb[ic]")}


def _run(env: dict[str, str], script: str = SCRIPT) -> dict:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("NUMBA_", "XDG_"))}
    clean.update(env, PYTHONPATH=str(REPO), PYTHONDONTWRITEBYTECODE="1")
    done = subprocess.run(
        [sys.executable, "-c", script],
        env=clean,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_kernels_cache_under_numba_cache_dir_and_never_in_the_package(tmp_path: Path) -> None:
    before = _numba_files(PACKAGE)
    cache = tmp_path / "numba-cache"
    seen = _run({"NUMBA_CACHE_DIR": str(cache), "HOME": str(tmp_path / "home")})
    assert seen["dir"] == str(cache)
    assert seen["paths"], "no compiled kernel found"
    for name, path in seen["paths"].items():
        assert Path(path).is_relative_to(cache), (name, path)
    assert any(cache.rglob("*.nbi")) and any(cache.rglob("*.nbc"))  # the kernel was cached
    assert _numba_files(PACKAGE) == before  # nothing written into the source tree


def test_kernels_cache_in_the_per_user_cache_by_default(tmp_path: Path) -> None:
    xdg = tmp_path / "xdg"
    script = SCRIPT.replace('kernels.first_pass_kernel("laplace")', "(lambda *a: None)")
    seen = _run({"XDG_CACHE_HOME": str(xdg), "HOME": str(tmp_path / "home")}, script)
    assert seen["dir"] == str(xdg / "alm_opacus" / "numba")
    for name, path in seen["paths"].items():
        assert Path(path).is_relative_to(xdg / "alm_opacus" / "numba"), (name, path)
