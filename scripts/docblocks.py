"""Generated blocks of the docs: every measured number in ``docs/`` is written by a script,
between markers that name the script, and a test fails when a block is stale.

A block, in any ``docs/*.md`` or ``README.md``::

    <!-- generated NAME by SCRIPT ARGS...; deps PATH...; inputs HEX; output HEX -->
    ...written by SCRIPT, never by hand...
    <!-- end generated NAME -->

* ``NAME`` is unique in its file; ``SCRIPT ARGS...`` is the command that wrote it (run from the
  repository root with ``python``), so a reader can re-run it.
* ``deps`` lists the files and folders (every ``*.py`` below a folder) whose code the numbers
  depend on besides the script; ``constraints.txt`` stands for the pinned libraries.
* ``inputs`` is a digest of the script, the deps and the arguments (:func:`inputs_digest`);
  ``output`` is a digest of the block's text.

"Stale" (:func:`staleness`) means the block no longer is what its generator wrote from the
code as it is now: the script, a dependency or the arguments changed since (``inputs``), or
the text was edited by hand (``output``). It is decided without re-running anything, so the
test is cheap; re-running the command is what makes a block fresh again. A placeholder
(``<!-- generated NAME -->``, never run) may say which command fills it (in backticks), but
holds no digit outside code spans: a number there would be hand-typed.

Scripts write blocks with :func:`write_block`. The digests guard against drift and
hand-edits, not against a forger (who could recompute them).

**Pending re-measurement.** Some blocks take hours to measure (the 50,000-member grid). When
a change to their dependencies lands before they are re-measured, :func:`mark_pending` puts a
notice right above the block, visible to every reader::

    <!-- pending NAME: inputs HEX -->
    > **Measured on earlier code; re-measurement pending.** REASON Re-run `COMMAND`.

The marker pins the *current* inputs digest, so the notice covers exactly the change it
names: any later change to the script, a dependency or the arguments makes the block stale
again. The body must still be what its script wrote (the output digest), and
:func:`write_block` removes the notice when it rewrites the block. :func:`staleness` accepts
such a block; :func:`pending` lists them.
"""

from __future__ import annotations

import hashlib
import re
import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from alm_opacus._hashing import source_digest
from alm_opacus.io import atomic_write_text

__all__ = [
    "ROOT",
    "Block",
    "find_blocks",
    "inputs_digest",
    "mark_pending",
    "output_digest",
    "pending",
    "relative",
    "staleness",
    "write_block",
]

#: The repository root (scripts, docs and deps are named relative to it).
ROOT = Path(__file__).resolve().parents[1]

_BEGIN = re.compile(
    r"<!-- generated (?P<name>[^\s;]+)"
    r"(?: by (?P<command>[^;]+); deps (?P<deps>[^;]*); inputs (?P<inputs>[0-9a-f]+); "
    r"output (?P<output>[0-9a-f]+))? -->\n"
)
_END = "<!-- end generated {name} -->"
#: A pending-re-measurement notice: its marker line, then the visible blockquote.
_PENDING = re.compile(
    r"<!-- pending (?P<name>\S+?): inputs (?P<inputs>[0-9a-f]+) -->\n"
    r"(?P<notice>> \*\*Measured on earlier code; re-measurement pending\.\*\*[^\n]*\n"
    r"(?:>[^\n]*\n)*)\n?"
)
#: The old ``<!-- NAME:begin -->`` markers, which named no generator.
LEGACY = re.compile(r"<!-- [\w:.-]+:begin -->")


@dataclass(frozen=True)
class Block:
    """One generated block of a doc.

    Attributes:
        doc: the file.
        name: its name, unique in the file.
        script: the script that writes it (relative to :data:`ROOT`); empty for a placeholder.
        args: the script's arguments.
        deps: files and folders the numbers depend on besides the script.
        inputs: the recorded digest of script, deps and args.
        output: the recorded digest of the body.
        body: the text between the markers.
    """

    doc: Path
    name: str
    script: str
    args: tuple[str, ...]
    deps: tuple[str, ...]
    inputs: str
    output: str
    body: str

    @property
    def command(self) -> str:
        """The command that (re)writes the block, from the repository root."""
        return shlex.join(["python", self.script, *self.args]) if self.script else ""


def relative(path: str | Path, *, root: Path = ROOT) -> str:
    """``path`` relative to ``root`` where it lies inside it (a block records paths that hold
    on every checkout), else as given."""
    try:
        return Path(path).resolve().relative_to(root.resolve()).as_posix()
    except ValueError:
        return str(path)


def inputs_digest(
    *, script: str, args: Sequence[str], deps: Sequence[str], root: Path = ROOT
) -> str:
    """Digest of what a block is generated from: the script and the deps (Python files by
    their syntax tree, see :func:`~alm_opacus._hashing.source_digest`), and the arguments.

    Raises:
        FileNotFoundError: naming a script or dep that does not exist.
    """
    code = source_digest([root / script, *(root / d for d in deps)], root=root)
    blob = "\0".join([code, *args, "--deps", *deps]).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def output_digest(body: str) -> str:
    """Digest of a block's text (surrounding blank space ignored)."""
    return hashlib.sha256(body.strip().encode()).hexdigest()[:16]


def find_blocks(path: Path) -> list[Block]:
    """Every generated block of the markdown file ``path``.

    Raises:
        ValueError: naming the file and block for a begin marker without its end marker, or
            a name used twice.
    """
    text = Path(path).read_text()
    blocks: list[Block] = []
    for match in _BEGIN.finditer(text):
        name = match["name"]
        end = _END.format(name=name)
        stop = text.find(end, match.end())
        if stop < 0:
            raise ValueError(f"{path}: generated block {name!r} has no {end!r}")
        if any(b.name == name for b in blocks):
            raise ValueError(f"{path}: two generated blocks are named {name!r}")
        words = shlex.split(match["command"]) if match["command"] else []
        blocks.append(
            Block(
                doc=Path(path),
                name=name,
                script=words[0] if words else "",
                args=tuple(words[1:]),
                deps=tuple((match["deps"] or "").split()),
                inputs=match["inputs"] or "",
                output=match["output"] or "",
                body=text[match.end() : stop],
            )
        )
    return blocks


def staleness(block: Block, *, root: Path = ROOT) -> str | None:
    """Why ``block`` is not what its generator wrote from the current code, or ``None``.

    Returns:
        ``None`` for a fresh block; otherwise one line naming the block, what changed, and
        the command that regenerates it.
    """
    where = f"{block.doc.name}: block {block.name!r}"
    if not block.script:  # a placeholder may say how to fill it, but hold no number
        if re.search(r"\d", re.sub(r"`[^`]*`", "", block.body)):
            return f"{where} holds numbers but was never generated (a placeholder)"
        return None
    redo = f"; re-run `{block.command}`"
    try:
        digest = inputs_digest(script=block.script, args=block.args, deps=block.deps, root=root)
    except FileNotFoundError as exc:
        return f"{where} depends on a file that is gone ({exc}){redo}"
    if output_digest(block.body) != block.output:
        return f"{where} was edited by hand since {block.script} wrote it{redo}"
    if digest != block.inputs and _pending_digest(block) != digest:
        return (
            f"{where} is stale: its script, a dependency ({' '.join(block.deps) or 'none'}) "
            f"or its arguments changed since it was written{redo}"
        )
    return None


def _pending_notices(text: str) -> dict[str, re.Match[str]]:
    return {m["name"]: m for m in _PENDING.finditer(text)}


def _pending_digest(block: Block) -> str | None:
    """The inputs digest a visible pending notice above ``block`` pins, if there is one."""
    text = block.doc.read_text()
    found = _pending_notices(text).get(block.name)
    if found is None or not text[found.end() :].startswith(f"<!-- generated {block.name} "):
        return None
    return found["inputs"]


def pending(block: Block, *, root: Path = ROOT) -> str | None:
    """The notice of a block whose re-measurement is pending (see the module docstring):
    its text, where a visible notice above it covers the current code; else ``None``."""
    if not block.script or _pending_digest(block) is None:
        return None
    try:
        digest = inputs_digest(script=block.script, args=block.args, deps=block.deps, root=root)
    except FileNotFoundError:
        return None
    if digest == block.inputs or _pending_digest(block) != digest:
        return None
    found = _pending_notices(block.doc.read_text())[block.name]
    return " ".join(line.lstrip("> ").strip() for line in found["notice"].splitlines())


def mark_pending(doc: Path, *, name: str, reason: str, root: Path = ROOT) -> None:
    """Put (or renew) a visible notice above the generated block ``name`` of ``doc``: its
    numbers were measured on earlier code, ``reason`` says what changed, and the command
    re-measures them. The notice pins the current inputs digest.

    Raises:
        ValueError: if ``doc`` has no generated block ``name``, or it is a placeholder.
    """
    doc = Path(doc)
    found = [b for b in find_blocks(doc) if b.name == name]
    if not found or not found[0].script:
        raise ValueError(f"{doc}: no generated block {name!r} (a placeholder needs no notice)")
    block = found[0]
    digest = inputs_digest(script=block.script, args=block.args, deps=block.deps, root=root)
    text = _drop_pending(doc.read_text(), name)
    notice = (
        f"<!-- pending {name}: inputs {digest} -->\n> **Measured on earlier code; "
        f"re-measurement pending.** {' '.join(reason.split())} Re-run `{block.command}`.\n\n"
    )
    start = next(m for m in _BEGIN.finditer(text) if m["name"] == name).start()
    atomic_write_text(doc, text[:start] + notice + text[start:])


def _drop_pending(text: str, name: str) -> str:
    found = _pending_notices(text).get(name)
    return text if found is None else text[: found.start()] + text[found.end() :]


def write_block(
    doc: Path,
    *,
    name: str,
    script: str,
    args: Sequence[str],
    deps: Sequence[str],
    body: str,
    root: Path = ROOT,
) -> None:
    """Replace the generated block ``name`` of ``doc`` with ``body`` (atomically), stamping
    its begin marker with the command, the deps and both digests.

    Args:
        doc: the markdown file; it must hold the block's markers already (a placeholder
            ``<!-- generated NAME -->`` ... ``<!-- end generated NAME -->`` will do).
        name: the block's name.
        script: the generator, relative to ``root`` (usually the caller's own file).
        args: the arguments that decide the numbers (not paths of caches or outputs).
        deps: files and folders, relative to ``root``, the numbers depend on.
        body: the block's new text.
        root: the repository root.

    Raises:
        ValueError: if ``doc`` has no block ``name``, or a dep or the script is missing.
    """
    doc = Path(doc)
    if Path(script).is_absolute():  # a script passes its own __file__
        script = Path(script).resolve().relative_to(root.resolve()).as_posix()
    text = doc.read_text()
    found = [b for b in find_blocks(doc) if b.name == name]
    if not found:
        raise ValueError(
            f"{doc}: no generated block {name!r}: add the markers "
            f"'<!-- generated {name} -->' and '{_END.format(name=name)}'"
        )
    try:
        inputs = inputs_digest(script=script, args=args, deps=deps, root=root)
    except FileNotFoundError as exc:
        raise ValueError(f"{doc}: block {name!r}: {exc}") from exc
    body = "\n" + body.strip() + "\n"
    command = shlex.join([script, *args])
    begin = (
        f"<!-- generated {name} by {command}; deps {' '.join(deps)}; inputs {inputs}; "
        f"output {output_digest(body)} -->\n"
    )
    text = _drop_pending(text, name)  # re-measured: the notice is void
    match = next(m for m in _BEGIN.finditer(text) if m["name"] == name)
    stop = text.index(_END.format(name=name), match.end())
    atomic_write_text(doc, text[: match.start()] + begin + body + text[stop:])
