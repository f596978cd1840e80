"""Output folders that are replaced whole, so that they hold exactly the current run."""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Callable
from pathlib import Path


def replace_folder(target: Path, build: Callable[[Path], None]) -> None:
    """Build a folder with ``build(tmp)`` beside ``target``, then swap it in for ``target``.

    On any error the temporary folder is removed and ``target`` is left as it was. The old
    folder is renamed away before it is removed, so a symlink at ``target`` is unlinked,
    never followed. The new folder gets the umask's permissions, like the files
    :func:`~alm_opacus.io.atomic_open` writes (``plots/`` and ``tb/`` are shared; a private
    folder is private by where it lies, e.g. under the run's ``private/``).

    Raises:
        ValueError: if ``target`` exists and is not a folder.
    """
    if target.exists() and not target.is_dir() and not target.is_symlink():
        raise ValueError(f"{target} exists and is not a folder: expected a TensorBoard folder")
    target.parent.mkdir(parents=True, exist_ok=True)
    # not mkdtemp: its 0700 would hide shared results from the other users the umask allows
    tmp = target.parent / f".{target.name}.new-{uuid.uuid4().hex}"
    os.mkdir(tmp)
    try:
        build(tmp)
        old = target.parent / f".{target.name}.old-{uuid.uuid4().hex}"
        moved = target.is_symlink() or target.exists()
        if moved:
            os.rename(target, old)
        try:
            os.rename(tmp, target)
        except BaseException:
            if moved:
                os.rename(old, target)
            raise
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if moved:
        if old.is_symlink():
            old.unlink()
        else:
            shutil.rmtree(old, ignore_errors=True)
