#!/usr/bin/env python
"""Refuse formatter suppressions except on numeric tables: ``ruff format`` owns the style.

A suppression is any comment that switches the formatter off: a ``fmt: skip``, ``fmt: off`` or
``fmt: on`` segment (``#``-separated, as ruff reads them; the space after the colon optional),
or ``yapf: disable`` / ``yapf: enable``. Exactly one kind is allowed: a ``fmt: skip`` trailing
the last line of a **table**, so that golden values and coefficient tables keep the alignment
that lets a reader check them against their source. Everything else is refused.

A table is, precisely:

- an assignment statement (``name = ...``, ``obj.attr = ...``, ``name: type = ...``; not a
  ``return``, an ``assert``, a call or any other statement) whose last line carries the comment;
- whose value is a list, tuple, set or dict display, nested to any depth (no ``*``/``**``
  unpacking, no comprehension), or one such display passed as the only positional argument of
  ``array`` / ``asarray`` / ``tensor`` / ``as_tensor`` (``np.array([...], dtype=np.float64)``),
  whose keyword arguments are names, dotted names or literals;
- whose leaves are numbers: int, float or complex literals (not ``True``/``False``), optionally
  under a unary ``-`` or ``+``, or the constants ``inf``, ``nan``, ``pi``, ``e``, ``tau`` of
  ``math`` / ``np`` / ``numpy`` / ``torch``;
- except for labels: a string literal of at most 32 characters may be a dict key or the first
  element of a tuple or list row (``{"alm": (0.1, 0.2)}``, ``[("laplace", 1.0, 2.0)]``);
- with at least two numeric leaves.

So ``__all__ = ["a", "b"]``, ``{"yes": True}``, ``{"seed": seed}``, ``[f(x), 1.0]``, a call with
keyword arguments, a function signature, an assert and a ``return`` are not tables.

    python scripts/check_fmt_skip.py --check          # list offenders (file:line), exit 1 if any
    python scripts/check_fmt_skip.py --fix            # remove them; then run `ruff format .`
    python scripts/check_fmt_skip.py --check FILE...  # other files or folders

Paths default to ``alm_opacus``, ``baselines``, ``scripts`` and ``tests`` under the repository.
``--fix`` deletes only the suppression (and the spaces before it); other comments on the line
(``# type: ignore[...]``, ``# noqa``) stay, and a line that held nothing but the suppression is
removed. Uses only the standard library (``ast``, ``tokenize``): it is dev tooling, not part of
the runtime package.
"""

from __future__ import annotations

import argparse
import ast
import io
import re
import sys
import tokenize
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_PATHS = ("alm_opacus", "baselines", "scripts", "tests")

# One pragma inside a comment segment, as ruff (and black, yapf) recognise it.
_PRAGMA = re.compile(r"\b(?:fmt:\s*(?:skip|off|on)|yapf:\s*(?:disable|enable))\b")
_SKIP = re.compile(r"^fmt:\s*skip$")
_WRAPPERS = frozenset({"array", "asarray", "tensor", "as_tensor"})
_CONSTANT_MODULES = frozenset({"math", "np", "numpy", "torch"})
_CONSTANT_NAMES = frozenset({"inf", "nan", "pi", "e", "tau"})
MAX_LABEL = 32
_KINDS = {
    ast.Expr: "an expression statement",
    ast.Assert: "an assert",
    ast.Return: "a return",
    ast.Raise: "a raise",
    ast.AugAssign: "an augmented assignment",
}


@dataclass(frozen=True)
class Offence:
    """A refused suppression comment.

    Attributes:
        path: the file.
        line: its 1-based line.
        col: the 0-based column where the comment starts.
        comment: the comment's text.
        reason: why it is refused, one line.
    """

    path: Path
    line: int
    col: int
    comment: str
    reason: str

    def __str__(self) -> str:
        shown = self.path.relative_to(ROOT) if self.path.is_relative_to(ROOT) else self.path
        return f"{shown}:{self.line}: {self.reason}: {self.comment}"


def _segments(comment: str) -> list[str]:
    return [s.strip() for s in comment.split("#")]


def is_suppression(comment: str) -> bool:
    """Whether ``comment`` (a ``#`` comment's text) holds a formatter pragma."""
    return any(_PRAGMA.search(s) for s in _segments(comment))


def _numeric_leaf(node: ast.expr) -> bool:
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
        node = node.operand
    if isinstance(node, ast.Constant):
        return isinstance(node.value, int | float | complex) and not isinstance(node.value, bool)
    return (
        isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Name)
        and node.value.id in _CONSTANT_MODULES
        and node.attr in _CONSTANT_NAMES
    )


def _label(node: ast.expr) -> bool:
    return (
        isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and len(node.value) <= MAX_LABEL
    )


def _count_table(node: ast.expr) -> int | None:
    """The number of numeric leaves of the display ``node``, or None if it is no table."""
    total = 0
    if isinstance(node, ast.Dict):
        for key, value in zip(node.keys, node.values, strict=True):
            if key is None or not (_label(key) or _numeric_leaf(key)):
                return None  # ``**mapping`` or a computed key
            total += _numeric_leaf(key)
            inner = _count_item(value)
            if inner is None:
                return None
            total += inner
        return total
    if isinstance(node, ast.List | ast.Tuple | ast.Set):
        for i, item in enumerate(node.elts):
            if i == 0 and not isinstance(node, ast.Set) and _label(item):
                continue
            inner = _count_item(item)
            if inner is None:
                return None
            total += inner
        return total
    return None


def _count_item(node: ast.expr) -> int | None:
    if _numeric_leaf(node):
        return 1
    return _count_table(node)


def _simple_argument(node: ast.expr) -> bool:
    while isinstance(node, ast.Attribute):
        node = node.value
    return isinstance(node, ast.Name | ast.Constant)


def table_leaves(value: ast.expr) -> int | None:
    """The numeric leaves of an assigned ``value`` that is a table (module docstring), else None."""
    if isinstance(value, ast.Call):
        func = value.func
        name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
        if (
            name not in _WRAPPERS
            or len(value.args) != 1
            or any(k.arg is None or not _simple_argument(k.value) for k in value.keywords)
        ):
            return None
        value = value.args[0]
    return _count_table(value)


def _statements_by_last_line(tree: ast.AST) -> dict[int, ast.stmt]:
    """The innermost (last-starting) statement ending on each line."""
    last: dict[int, ast.stmt] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.stmt) and node.end_lineno is not None:
            held = last.get(node.end_lineno)
            if held is None or (node.lineno, node.col_offset) > (held.lineno, held.col_offset):
                last[node.end_lineno] = node
    return last


def _reason(comment: str, *, line: int, code_before: bool, last: dict[int, ast.stmt]) -> str | None:
    """Why the suppression ``comment`` on ``line`` is refused; None when it marks a table."""
    pragmas = [s for s in _segments(comment) if _PRAGMA.search(s)]
    if any(not _SKIP.match(s) for s in pragmas):
        return "only a trailing `fmt: skip` on a numeric table is allowed"
    stmt = last.get(line)
    if not code_before or stmt is None:
        return "not on the last line of a statement (a header, or inside brackets)"
    if not isinstance(stmt, ast.Assign | ast.AnnAssign) or stmt.value is None:
        kind = _KINDS.get(type(stmt), type(stmt).__name__.lower())
        return f"on {kind}, not a table assignment"
    leaves = table_leaves(stmt.value)
    if leaves is None:
        return "the value is not a table of numbers"
    if leaves < 2:
        return "a table needs at least two numbers"
    return None


def _comments(source: str) -> Iterator[tokenize.TokenInfo]:
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT and is_suppression(token.string):
            yield token


def check_source(source: str, *, path: Path = Path("<string>")) -> list[Offence]:
    """The refused suppressions of one module's ``source``.

    Raises:
        SyntaxError: when ``source`` does not parse.
    """
    last = _statements_by_last_line(ast.parse(source, filename=str(path)))
    lines = source.splitlines()
    found = []
    for token in _comments(source):
        line, col = token.start
        code_before = bool(lines[line - 1][:col].strip())
        reason = _reason(token.string, line=line, code_before=code_before, last=last)
        if reason is not None:
            found.append(Offence(path, line, col, token.string, reason))
    return found


def _stripped(comment: str) -> str:
    """``comment`` without its pragma segments ("" when nothing else is left)."""
    kept = []
    for segment in _segments(comment)[1:]:
        segment = _PRAGMA.sub("", segment).strip(" \t;,")
        if segment:
            kept.append(segment)
    return "  ".join(f"# {s}" for s in kept)


def fix_source(source: str, offences: Iterable[Offence]) -> str:
    """``source`` with the comments of ``offences`` removed (other comments kept)."""
    lines = source.splitlines(keepends=True)
    dropped: set[int] = set()
    for o in offences:
        text = lines[o.line - 1]
        body = text.rstrip("\r\n")
        ending = text[len(body) :]
        rest = _stripped(body[o.col :])
        head = body[: o.col].rstrip()
        if not head and not rest:
            dropped.add(o.line - 1)
            continue
        lines[o.line - 1] = (f"{head}  {rest}" if head and rest else head or rest) + ending
    return "".join(line for i, line in enumerate(lines) if i not in dropped)


def python_files(paths: Iterable[Path]) -> list[Path]:
    """The ``*.py`` files of ``paths`` (files as given, folders searched), sorted."""
    found: set[Path] = set()
    for path in paths:
        if path.is_dir():
            found.update(p for p in path.rglob("*.py") if ".venv" not in p.parts)
        elif path.suffix == ".py":
            found.add(path)
        else:
            raise FileNotFoundError(f"{path}: not a Python file or a folder")
    return sorted(found)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--check", action="store_true", help="list offenders; exit 1 if any")
    mode.add_argument("--fix", action="store_true", help="remove the offending comments")
    parser.add_argument("paths", nargs="*", type=Path, help="files or folders (default: the code)")
    args = parser.parse_args(argv)
    paths = args.paths or [ROOT / p for p in DEFAULT_PATHS]
    try:
        files = python_files(paths)
    except FileNotFoundError as exc:
        print(f"check_fmt_skip: {exc}", file=sys.stderr)
        return 2
    total = 0
    for path in files:
        source = path.read_text(encoding="utf-8")
        try:
            offences = check_source(source, path=path)
        except SyntaxError as exc:
            print(
                f"check_fmt_skip: {path}:{exc.lineno}: does not parse: {exc.msg}", file=sys.stderr
            )
            return 2
        total += len(offences)
        if args.fix and offences:
            path.write_text(fix_source(source, offences), encoding="utf-8")
        for offence in offences:
            print(offence)
    verb = "removed" if args.fix else "refused"
    print(f"{total} formatter suppression(s) {verb} in {len(files)} files", file=sys.stderr)
    return 1 if total and args.check else 0


if __name__ == "__main__":
    sys.exit(main())
