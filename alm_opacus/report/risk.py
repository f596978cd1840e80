"""Per-example membership risk: which members leak, release by release.

For every (method, epsilon) cell the harness keeps each evaluation example's attack score
(members and non-members, mean over the cell's noise draws) for two attacks:

* ``lira``: LiRA's per-example statistic (Carlini et al. 2022): online LiRA's log likelihood
  ratio where it ran, else offline LiRA's z-score (``RISK_ATTACKS`` gives the order);
* ``loss``: the loss attack's score, ``log p_y`` (Yeom et al. 2018).

The scores are the noise-aware attacker's (unsuffixed attack names), the one that knows the
mechanism. :func:`write_risk` writes one ``risk/<method>-eps<epsilon>.csv`` per cell: the
dataset row (``split.json``'s indices), membership, label, seed, and per attack the score,
the member's rank among the members (1 = most exposed) and the same member's score under
the unprotected head. :func:`risk_table` reads one back as a :class:`RiskTable` (no pandas).

**These files are computed from the private data** (scores of named members): they are for
the data owner, like the clean head, and never part of what a run shares. Every path goes
through :data:`RISK_FOLDER`, relative to the run folder, so that it can move (e.g. into the
run folder's ``private/``) in one place.
"""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from alm_opacus.io import atomic_write_text, make_private_folder
from alm_opacus.report.results import cell_key

__all__ = [
    "RISK_ATTACKS",
    "RISK_FOLDER",
    "TOP_K",
    "CellScores",
    "RiskTable",
    "cell_scores",
    "class_auc",
    "load_risk",
    "read_risk",
    "risk_path",
    "risk_records",
    "risk_table",
    "top_overlap",
    "top_size",
    "write_risk",
]

#: Where a run keeps its per-example risk files, relative to the run folder. Private: see
#: the module docstring. The one name to change to move them.
RISK_FOLDER = Path("private") / "risk"  # with the run's other private files (run/rundir.py)
#: Per risk kind, the attacks whose scores it takes, in order of preference (the first that
#: ran in the cell).
RISK_ATTACKS: dict[str, tuple[str, ...]] = {
    "lira": ("lira-online", "lira-offline", "lira-offline-pool"),
    "loss": ("loss",),
}
#: The size of the "most vulnerable" set compared across releases (capped by top_size).
TOP_K = 100

IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]
FloatArray = npt.NDArray[np.float64]


@dataclass(frozen=True)
class CellScores:
    """The per-example scores of one (method, epsilon, seed) cell, in evaluation order.

    Attributes:
        method, epsilon, seed: the cell.
        rows: (q,) the examples' row indices in the dataset (members, then non-members).
        labels: (q,) their labels.
        is_member: (q,) membership in the victim's training set.
        scores: risk kind -> (q,) score, the mean over the cell's noise draws (larger = more
            member-like).
        attacks: risk kind -> the attack the scores came from.
        draws: the noise draws averaged.
    """

    method: str
    epsilon: float
    seed: int
    rows: IntArray
    labels: IntArray
    is_member: BoolArray
    scores: dict[str, FloatArray] = field(default_factory=dict)
    attacks: dict[str, str] = field(default_factory=dict)
    draws: int = 1

    def ranks(self, kind: str) -> FloatArray:
        """Each member's rank among the members by ``kind`` (1 = highest score; ties share
        the best rank); NaN for non-members."""
        out = np.full(len(self.rows), np.nan)
        member = np.flatnonzero(self.is_member)
        values = self.scores[kind][member]
        order = np.argsort(-values, kind="stable")  # NaN scores last, in row order
        ranks = np.empty(len(member))
        ranks[order] = np.arange(1, len(member) + 1)
        # ties share the best rank of their group: 1 + the number of strictly higher scores
        # (one sort and one search; a pass per distinct score was quadratic in the members)
        scored = ~np.isnan(values)
        higher = np.sort(-values[scored])
        ranks[scored] = np.searchsorted(higher, -values[scored], side="left") + 1
        out[member] = ranks
        return out


def cell_scores(
    *,
    method: str,
    epsilon: float,
    seed: int,
    rows: npt.ArrayLike,
    labels: npt.ArrayLike,
    draws: Sequence[Mapping[str, FloatArray]],
    is_member: npt.ArrayLike,
) -> CellScores | None:
    """The risk scores of one cell from each draw's scores by attack name.

    Args:
        method, epsilon, seed: the cell.
        rows: (q,) dataset row indices of the evaluation examples.
        labels: (q,) their labels.
        draws: per noise draw, attack name -> (q,) scores (names as in ``results.csv``).
        is_member: (q,) membership.

    Returns:
        ``None`` when none of :data:`RISK_ATTACKS` ran.
    """
    scores: dict[str, FloatArray] = {}
    attacks: dict[str, str] = {}
    for kind, names in RISK_ATTACKS.items():
        name = next((n for n in names if draws and all(n in d for d in draws)), None)
        if name is None:
            continue
        scores[kind] = np.mean([np.asarray(d[name], dtype=np.float64) for d in draws], axis=0)
        attacks[kind] = name
    if not scores:
        return None
    return CellScores(
        method=method,
        epsilon=float(epsilon),
        seed=int(seed),
        rows=np.asarray(rows, dtype=np.int64),
        labels=np.asarray(labels, dtype=np.int64),
        is_member=np.asarray(is_member, dtype=bool),
        scores=scores,
        attacks=attacks,
        draws=len(draws),
    )


def risk_path(method: str, epsilon: float) -> Path:
    """``RISK_FOLDER / <method>-eps<epsilon>.csv`` (epsilon written exactly: ``inf``, ``0.1``,
    ``10000``), relative to the run folder."""
    return RISK_FOLDER / f"{method}-eps{cell_key(method, epsilon, 0)[1]}.csv"


def _columns(kinds: Sequence[str]) -> list[str]:
    cols = ["row", "member", "label", "seed", "draws"]
    for kind in kinds:
        cols += [f"{kind}_attack", f"{kind}_score", f"{kind}_rank", f"{kind}_score_unprotected"]
    return cols


def risk_records(
    cells: Sequence[CellScores], unprotected: Mapping[int, CellScores]
) -> list[dict[str, object]]:
    """The rows of one risk file: per seed, the members by LiRA rank, then the non-members.

    Args:
        cells: the seeds of one (method, epsilon).
        unprotected: the baseline's scores per seed (missing seeds leave the column empty).
    """
    out: list[dict[str, object]] = []
    for cell in sorted(cells, key=lambda c: c.seed):
        kinds = list(cell.scores)
        base = unprotected.get(cell.seed)
        lookup = {int(r): i for i, r in enumerate(base.rows)} if base is not None else {}
        ranks = {k: cell.ranks(k) for k in kinds}
        first = kinds[0]
        order = sorted(
            range(len(cell.rows)),
            key=lambda i: (
                not cell.is_member[i],
                ranks[first][i] if cell.is_member[i] else 0,
                int(cell.rows[i]),
            ),
        )
        for i in order:
            record: dict[str, object] = {
                "row": int(cell.rows[i]),
                "member": int(cell.is_member[i]),
                "label": int(cell.labels[i]),
                "seed": cell.seed,
                "draws": cell.draws,
            }
            for kind in kinds:
                j = lookup.get(int(cell.rows[i]))
                clean = base.scores.get(kind) if base is not None else None
                record[f"{kind}_attack"] = cell.attacks[kind]
                record[f"{kind}_score"] = float(cell.scores[kind][i])
                record[f"{kind}_rank"] = ranks[kind][i]
                record[f"{kind}_score_unprotected"] = (
                    float(clean[j]) if clean is not None and j is not None else math.nan
                )
            out.append(record)
    return out


def _text(value: object) -> str:
    if isinstance(value, float):
        if math.isnan(value):
            return ""
        return f"{value:.0f}" if value.is_integer() and abs(value) < 1e15 else repr(value)
    return str(value)


def write_risk(
    folder: str | Path, cells: Sequence[CellScores], unprotected: Mapping[int, CellScores]
) -> Path:
    """Write the risk file of one (method, epsilon) under the run folder ``folder``.

    Returns:
        The path written.

    Raises:
        ValueError: if ``cells`` is empty or mixes (method, epsilon) cells.
    """
    if not cells or len({(c.method, c.epsilon) for c in cells}) != 1:
        raise ValueError("write_risk needs the seeds of exactly one (method, epsilon) cell")
    kinds = list(dict.fromkeys(k for c in cells for k in c.scores))
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=_columns(kinds), lineterminator="\n")
    writer.writeheader()
    for record in risk_records(cells, unprotected):
        writer.writerow({k: _text(v) for k, v in record.items()})
    path = Path(folder) / risk_path(cells[0].method, cells[0].epsilon)
    make_private_folder(Path(folder) / RISK_FOLDER)  # owner-only, wherever it is moved
    atomic_write_text(path, buffer.getvalue())
    return path


@dataclass(frozen=True)
class RiskTable:
    """One (method, epsilon)'s risk file as a table: ``columns`` and ``records`` (dicts),
    numbers parsed (empty cells are NaN). ``str()`` prints it."""

    method: str
    epsilon: float
    columns: tuple[str, ...]
    records: tuple[dict[str, Any], ...]

    @property
    def kinds(self) -> list[str]:
        """The risk kinds present (``lira``, ``loss``)."""
        return [c[: -len("_score")] for c in self.columns if c.endswith("_score")]

    @property
    def seeds(self) -> list[int]:
        return sorted({int(r["seed"]) for r in self.records})

    def column(self, name: str) -> list[object]:
        return [r[name] for r in self.records]

    def where(self, *, seed: int | None = None, member: bool | None = None) -> RiskTable:
        """The records of one seed and/or membership."""
        keep = tuple(
            r
            for r in self.records
            if (seed is None or r["seed"] == seed)
            and (member is None or bool(r["member"]) == member)
        )
        return RiskTable(self.method, self.epsilon, self.columns, keep)

    def top(self, k: int, *, kind: str = "lira", seed: int | None = None) -> RiskTable:
        """The ``k`` most exposed members by ``kind`` (one seed: the first by default)."""
        chosen = self.seeds[0] if seed is None else seed
        members = self.where(seed=chosen, member=True).records
        ranked = sorted(members, key=lambda r: float(r[f"{kind}_rank"]))
        return RiskTable(self.method, self.epsilon, self.columns, tuple(ranked[:k]))

    def cell(self, seed: int) -> CellScores:
        """The scores of one seed, back as :class:`CellScores` (evaluation order lost: members
        then non-members by row)."""
        chosen = sorted(
            self.where(seed=seed).records, key=lambda r: (not r["member"], int(r["row"]))
        )
        kinds = self.kinds
        return CellScores(
            method=self.method,
            epsilon=self.epsilon,
            seed=seed,
            rows=np.array([r["row"] for r in chosen], dtype=np.int64),
            labels=np.array([r["label"] for r in chosen], dtype=np.int64),
            is_member=np.array([bool(r["member"]) for r in chosen]),
            scores={
                k: np.array([r[f"{k}_score"] for r in chosen], dtype=np.float64) for k in kinds
            },
            attacks={k: str(chosen[0][f"{k}_attack"]) for k in kinds} if chosen else {},
            draws=int(chosen[0]["draws"]) if chosen else 0,
        )

    def __str__(self) -> str:
        shown = [c for c in self.columns if not c.endswith("_attack")]
        cells = [[_short(r[c]) for c in shown] for r in self.records]
        widths = [
            max(len(c), *(len(row[i]) for row in cells)) if cells else len(c)
            for i, c in enumerate(shown)
        ]
        lines = ["  ".join(c.rjust(w) for c, w in zip(shown, widths, strict=True))]
        lines += ["  ".join(v.rjust(w) for v, w in zip(row, widths, strict=True)) for row in cells]
        return "\n".join(lines)


def _short(value: object) -> str:
    if isinstance(value, float):
        if math.isnan(value):
            return "-"
        return f"{value:.0f}" if value.is_integer() else f"{value:.3f}"
    return str(value)


_INT_COLUMNS = {"row", "member", "label", "seed", "draws"}


def _parse(column: str, raw: str) -> object:
    if column.endswith("_attack"):
        return raw
    if column in _INT_COLUMNS:
        return int(raw)
    return math.nan if raw == "" else float(raw)


def read_risk(path: str | Path, *, method: str, epsilon: float) -> RiskTable:
    """Read a file written by :func:`write_risk`.

    Raises:
        ValueError: if it is not a risk file (naming the path).
    """
    try:
        with open(path, newline="") as handle:
            reader = csv.DictReader(handle)
            columns = tuple(reader.fieldnames or ())
            if columns[:5] != tuple(_columns([])):
                raise ValueError(f"unexpected columns {columns}")
            records = tuple({c: _parse(c, r[c]) for c in columns} for r in reader)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"{path}: not a readable risk file ({exc})") from exc
    return RiskTable(method, float(epsilon), columns, records)


def load_risk(
    run: str | Path, cells: Iterable[tuple[str, float]]
) -> dict[tuple[str, float], RiskTable]:
    """The risk tables of ``cells`` ((method, epsilon)) that exist under the run folder."""
    out = {}
    for method, epsilon in cells:
        path = Path(run) / risk_path(method, epsilon)
        if path.exists():
            out[(method, epsilon)] = read_risk(path, method=method, epsilon=epsilon)
    return out


def risk_table(run: str | Path, *, method: str, epsilon: float) -> RiskTable:
    """The per-example risk of one release of a finished run (the Python API).

    Example::

        table = risk_table("runs/latest", method="alm", epsilon=1000)
        print(table.top(10))  # the ten most exposed members, with their dataset rows

    Raises:
        ValueError: if the run has no risk file for that (method, epsilon).
    """
    path = Path(run) / risk_path(method, epsilon)
    if not path.exists():
        raise ValueError(
            f"no risk file {path}: expected a run folder whose cells ran a LiRA or loss attack, "
            f"and method={method!r}, epsilon={epsilon!r} of its grid"
        )
    return read_risk(path, method=method, epsilon=epsilon)


def top_size(members: int) -> int:
    """The size of the most-vulnerable set: :data:`TOP_K`, but at most a quarter of the
    members, so that the overlap a random choice gives (k / n) stays at or below 25%."""
    return max(1, min(TOP_K, members // 4))


def top_overlap(cell: CellScores, baseline: CellScores, *, kind: str = "lira") -> float:
    """The fraction of ``cell``'s ``k`` most exposed members that are among the baseline's
    ``k`` (``k`` = :func:`top_size`); a random choice gives about ``k / n``."""
    k = top_size(int(cell.is_member.sum()))
    mine = {int(r) for r, rank in zip(cell.rows, cell.ranks(kind), strict=True) if rank <= k}
    theirs = {
        int(r) for r, rank in zip(baseline.rows, baseline.ranks(kind), strict=True) if rank <= k
    }
    return len(mine & theirs) / max(len(mine), 1)


def class_auc(
    cell: CellScores, *, kind: str = "lira", level: float = 0.95
) -> list[tuple[int, float, float, float]]:
    """Per class: (label, AUC of ``kind``'s scores, DeLong interval low, high), for the
    classes with at least two members and two non-members."""
    from alm_opacus.attacks.intervals import auc_interval, delong_components

    out = []
    for label in sorted({int(v) for v in cell.labels}):
        mask = cell.labels == label
        member = cell.is_member[mask]
        if member.sum() < 2 or (~member).sum() < 2:
            continue
        scores = cell.scores[kind][mask]
        v10, _ = delong_components(scores, member)
        low, high = auc_interval(scores, member, level=level)
        out.append((label, float(v10.mean()), low, high))
    return out
