"""What the screenshot scripts share (``render_report.py``, ``render_tensorboard.py``):
headless Chromium (its executable and flags), the PNGs they save, and the marked block of a
doc page that shows them.

Not a script of its own, and not part of the runtime package: the scripts import it from
this folder.
"""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from pathlib import Path

from PIL import Image

__all__ = ["FLAGS", "chromium", "print_written", "save_png", "show_in_doc"]

#: Chromium flags for a headless, offline, throw-away profile.
FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--hide-scrollbars",
)


def chromium() -> str:
    """The Chromium executable.

    Raises:
        SystemExit: when it is not installed (naming the package).
    """
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None:
        raise SystemExit("chromium not found: install it with `apt-get install -y chromium`")
    return found


def save_png(image: Image.Image, path: Path, *, colors: int) -> Path:
    """Save ``image`` to ``path`` palette-quantised to ``colors`` colours (to stay small)."""
    image.convert("RGB").quantize(colors=colors).save(path, optimize=True)
    return path


def print_written(paths: Sequence[Path]) -> None:
    """One ``written: PATH (N KiB)`` line per file."""
    for path in paths:
        print(f"written: {path} ({path.stat().st_size // 1024} KiB)")


def show_in_doc(
    doc: Path,
    *,
    block: str,
    script: str,
    run: str,
    args: Sequence[str],
    intro: str,
    images: Sequence[tuple[Path, str]],
    deps: Sequence[str],
) -> None:
    """Rewrite the marked block ``block`` of ``doc``: ``intro``, then each image with its
    caption, linked relative to ``doc``.

    Args:
        doc: the Markdown page.
        block: the block's name.
        script: the script that renders the images (``__file__``).
        run: the run folder rendered, as given.
        args: the script's other arguments, as the block records them (``--update-docs``
            is added).
        intro: the block's first line.
        images: (PNG file, caption) in the order shown.
        deps: what the images depend on besides the script and the run folder.
    """
    from docblocks import relative, write_block

    lines = [intro, ""]
    for path, caption in images:
        rel = path.resolve().relative_to(doc.parent.resolve()).as_posix()
        lines += [f"![{caption}]({rel})", ""]
    # The images also depend on the run folder, which no digest covers: re-run after
    # re-running the default run.
    shown = [relative(run), *args, "--update-docs"]
    write_block(doc, name=block, script=script, args=shown, deps=deps, body="\n".join(lines))
    print(f"written: {doc}")
