"""``rocs.jsonl``: a run's ROC curves, one JSON line per cell, appended as each cell finishes.

Each line holds one (method, epsilon, seed) cell's curves, one per attack (the first noise
draw's), each bounded by :func:`~alm_opacus.attacks.roc_bounds.bound_roc` inside the cell (every
vertex below FPR 1e-3, then a fixed log-spaced grid): a few thousand numbers per curve
whatever the number of members. The driver appends the line, flushed and fsynced, *before* it
rewrites ``results.csv`` with the cell's rows, so a cell of ``results.csv`` always has its line;
the file is never rewritten whole while cells finish (appending costs the new line only).

A run killed mid-append leaves a torn last line (no newline), and a run killed between the
append and ``results.csv`` a line of a cell ``results.csv`` lacks: :func:`read_rocs` drops
both (the resumed run recomputes the cell and rewrites the file once, atomically, before its
first write); any other malformed line is an error naming the file and the line.

The curves of one (method, epsilon, attack) in several seeds: the last line read wins (the
seed that finished last), as the figures show one curve per method, epsilon and attack.

Older versions kept every full curve in ``rocs.json`` (:data:`LEGACY_ROCS_FILE`), rewritten
after every cell: a finished run of theirs still exports, but ``--resume`` refuses it
(``alm_opacus.run.resume``): its curves carry no seed, so they cannot be matched to the cells
of ``results.csv``.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Collection, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from alm_opacus.report.results import cell_key

__all__ = [
    "LEGACY_ROCS_FILE",
    "ROCS_FILE",
    "RocFile",
    "RocLine",
    "append_rocs",
    "legacy_refusal",
    "read_rocs",
    "roc_map",
]

#: The run folder's ROC file.
ROCS_FILE = "rocs.jsonl"
#: Where older versions kept every full ROC, rewritten after every cell.
LEGACY_ROCS_FILE = "rocs.json"

#: An attack's curve: its FPRs and TPRs, ascending.
Curve = tuple[list[float], list[float]]


@dataclass(frozen=True)
class RocLine:
    """One cell's curves: ``curves[attack] = (fprs, tprs)``."""

    method: str
    epsilon: float
    seed: int
    curves: dict[str, Curve]

    def cell(self) -> tuple[str, str, int]:
        """The (method, epsilon, seed) resume key, as ``results.csv``'s rows give it."""
        return cell_key(self.method, self.epsilon, self.seed)

    def to_bytes(self) -> bytes:
        """The line as appended: compact JSON ending in a newline."""
        payload = {
            "method": self.method,
            "epsilon": "inf" if math.isinf(self.epsilon) else self.epsilon,
            "seed": self.seed,
            "curves": {a: {"fpr": f, "tpr": t} for a, (f, t) in self.curves.items()},
        }
        return (json.dumps(payload, separators=(",", ":")) + "\n").encode()


@dataclass(frozen=True)
class RocFile:
    """What :func:`read_rocs` kept.

    Attributes:
        lines: the kept lines, in file order.
        kept: their bytes, as read (what the file holds once the dropped lines are gone).
        dropped: how many lines were dropped (a torn last line, lines of cells not asked for).
    """

    lines: list[RocLine]
    kept: bytes
    dropped: int


def append_rocs(path: Path, line: RocLine) -> None:
    """Append ``line`` to ``path`` (created with the umask's permissions), flushed and fsynced
    before returning, never following a symlink.

    Raises:
        OSError: if the file cannot be opened or written.
    """
    data = line.to_bytes()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o666)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    finally:
        os.close(fd)


def read_rocs(path: Path, *, cells: Collection[tuple[str, str, int]] | None = None) -> RocFile:
    """The lines of ``path`` (none if it does not exist).

    Args:
        path: the ``rocs.jsonl`` file.
        cells: the cells to keep (``ResultRow.cell()`` keys, those of ``results.csv``); lines
            of other cells are dropped. ``None`` keeps every line.

    Returns:
        The kept lines; a torn last line (no newline: a run killed mid-append) is dropped.

    Raises:
        ValueError: naming ``path`` and the line, for a complete line that is not a cell's
            curves (fields, FPRs and TPRs of one length in [0, 1]), or a second line of a
            kept cell.
    """
    if not path.exists():
        return RocFile(lines=[], kept=b"", dropped=0)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ValueError(f"{path}: not readable ({exc.strerror})") from exc
    raw = data.split(b"\n")
    torn = raw.pop()  # after the last newline: empty, or a line cut mid-append
    lines: list[RocLine] = []
    kept: list[bytes] = []
    seen: dict[tuple[str, str, int], int] = {}
    for number, text in enumerate(raw, start=1):
        line = _parse(text, where=f"{path}: line {number}")
        key = line.cell()
        if cells is not None and key not in cells:
            continue
        if key in seen:
            raise ValueError(
                f"{path}: line {number}: repeats the curves of line {seen[key]} (method "
                f"{key[0]!r}, epsilon {key[1]}, seed {key[2]})"
            )
        seen[key] = number
        lines.append(line)
        kept.append(text + b"\n")
    dropped = len(raw) - len(lines) + (1 if torn else 0)
    return RocFile(lines=lines, kept=b"".join(kept), dropped=dropped)


def legacy_refusal(run: Path) -> str:
    """Why ``--resume`` refuses a run folder an older version wrote (``rocs.json``)."""
    return (
        f"{run / LEGACY_ROCS_FILE} holds ROC curves in the format of an older version "
        f"(rewritten whole after every cell, without seeds); this version appends {ROCS_FILE} "
        "cell by cell and cannot continue it: use --overwrite to start again, or finish the "
        "run with the version that began it"
    )


def roc_map(lines: Iterable[RocLine]) -> dict[tuple[str, float, str], Curve]:
    """``(method, epsilon, attack) -> curve`` over ``lines``, the last line of each key
    winning (what the figures draw)."""
    out: dict[tuple[str, float, str], Curve] = {}
    for line in lines:
        for attack, curve in line.curves.items():
            out[(line.method, line.epsilon, attack)] = curve
    return out


def _parse(text: bytes, *, where: str) -> RocLine:
    try:
        item: Any = json.loads(text)
        method, seed, curves = item["method"], item["seed"], item["curves"]
        epsilon = float(item["epsilon"])
        if not isinstance(method, str) or type(seed) is not int or not isinstance(curves, dict):
            raise TypeError("method, seed or curves of the wrong type")
        parsed: dict[str, Curve] = {}
        for attack, curve in curves.items():
            fpr = [float(v) for v in curve["fpr"]]
            tpr = [float(v) for v in curve["tpr"]]
            if len(fpr) != len(tpr) or not all(0 <= v <= 1 for v in (*fpr, *tpr)):
                raise ValueError(f"attack {attack!r}: expected as many FPRs as TPRs, all in [0, 1]")
            parsed[attack] = (fpr, tpr)
    except (ValueError, KeyError, TypeError) as exc:
        raise ValueError(
            f"{where}: expected one cell's curves (method, epsilon, seed, curves) ({exc})"
        ) from exc
    return RocLine(method=method, epsilon=epsilon, seed=seed, curves=parsed)
