"""The ``results.csv`` contract: one row per method x epsilon x seed x attack.

Columns are only ever appended, never renamed (see ../shared/DESIGN.md).
"""

from __future__ import annotations

import csv
import dataclasses
import io
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, fields
from pathlib import Path

from alm_opacus.io import atomic_write_text

RESULT_COLUMNS = (
    "dataset", "method", "epsilon", "delta", "guarantee", "sensitivity", "noise_scale", "seed",
    "test_accuracy", "utility_loss", "attack", "mia_accuracy", "mia_advantage", "mia_auc",
    "tpr_at_fpr_0.001", "tpr_at_fpr_0.01", "eps_lower_bound", "seconds",
    # appended after the design page's columns:
    "noise_draws", "test_accuracy_std", "mia_auc_std", "mia_accuracy_std", "statement",
    "utility_loss_std",
)  # fmt: skip


@dataclass
class ResultRow:
    """One cell of the results table. ``nan`` marks a value a method or attack cannot give."""

    dataset: str
    method: str
    epsilon: float
    delta: float
    guarantee: str
    sensitivity: float
    noise_scale: float
    seed: int
    test_accuracy: float
    utility_loss: float
    attack: str = ""
    mia_accuracy: float = math.nan
    mia_advantage: float = math.nan
    mia_auc: float = math.nan
    tpr_at_fpr_0_001: float = math.nan
    tpr_at_fpr_0_01: float = math.nan
    eps_lower_bound: float = math.nan
    seconds: float = math.nan
    noise_draws: int = 1
    test_accuracy_std: float = math.nan
    mia_auc_std: float = math.nan
    mia_accuracy_std: float = math.nan
    statement: str = ""
    utility_loss_std: float = math.nan

    def to_record(self) -> dict[str, object]:
        """The row keyed by the CSV column names."""
        values = [getattr(self, f.name) for f in fields(self)]
        return dict(zip(RESULT_COLUMNS, values, strict=True))

    @classmethod
    def from_record(cls, record: dict[str, str]) -> ResultRow:
        kwargs: dict[str, object] = {}
        for f, column in zip(fields(cls), RESULT_COLUMNS, strict=True):
            raw = record.get(column, "")
            if f.type in ("float", float):
                kwargs[f.name] = math.nan if raw in ("", "nan") else float(raw)
            elif f.type in ("int", int):
                kwargs[f.name] = int(float(raw)) if raw else 0
            else:
                kwargs[f.name] = raw
        return cls(**kwargs)  # type: ignore[arg-type]

    def cell(self) -> tuple[str, str, int]:
        """The (method, epsilon, seed) cell this row belongs to (the resume key)."""
        return cell_key(self.method, self.epsilon, self.seed)

    def replace(self, **changes: object) -> ResultRow:
        return dataclasses.replace(self, **changes)  # type: ignore[arg-type]


assert len(fields(ResultRow)) == len(RESULT_COLUMNS)


def cell_key(method: str, epsilon: float, seed: int) -> tuple[str, str, int]:
    """The resume key of a cell; epsilon as written in the CSV, so read rows match."""
    return (method, _fmt(epsilon), seed)


def _fmt(value: object) -> str:
    if isinstance(value, float):
        if math.isnan(value):
            return ""
        if math.isinf(value):
            return "inf"
        return f"{value:.6g}"
    return str(value)


def format_csv(rows: Iterable[ResultRow]) -> str:
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=RESULT_COLUMNS, lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow({k: _fmt(v) for k, v in row.to_record().items()})
    return buffer.getvalue()


def write_results(path: str | Path, rows: Sequence[ResultRow]) -> None:
    """Write ``rows`` to ``path`` atomically (a reader never sees a partial table)."""
    atomic_write_text(path, format_csv(rows))


def read_results(path: str | Path) -> list[ResultRow]:
    """Read a ``results.csv`` written by :func:`write_results`.

    Raises:
        ValueError: if the header is not this version's columns (or a prefix of them).
    """
    with open(path, newline="") as handle:
        reader = csv.DictReader(handle)
        header = tuple(reader.fieldnames or ())
        if header != RESULT_COLUMNS[: len(header)] or not header:
            raise ValueError(f"{path}: unexpected columns {header}; expected {RESULT_COLUMNS}")
        return [ResultRow.from_record(record) for record in reader]
