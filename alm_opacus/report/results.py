"""The ``results.csv`` contract: one row per method x epsilon x seed x attack.

Columns are only ever appended, never renamed (see docs/design.md). Each column's header,
type, range and format live on its :class:`ResultRow` field (a :class:`ColumnSpec`); the
writer, the reader and the resume check (:func:`out_of_range`) are derived from them.
"""

from __future__ import annotations

import csv
import dataclasses
import enum
import io
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Literal, get_type_hints

from alm_opacus.io import atomic_write_text

#: The ``method`` of the unprotected baseline's rows (`alm_opacus.methods.NoProtection`): every
#: utility loss and risk is read against it.
BASELINE = "none"


@dataclass(frozen=True)
class ColumnSpec:
    """What one ``results.csv`` column holds; it lives on its :class:`ResultRow` field.

    The header, the type (the field's annotation), the range and the format of a column are
    read from here by the CSV writer and reader and by the resume check
    (:func:`out_of_range`), so they cannot drift apart.

    Attributes:
        doc: what the column means.
        header: the CSV header, when it is not the field's name (a header with a ``.``).
        low: the smallest number allowed.
        high: the largest number allowed (excluded when ``high_open``).
        high_open: ``high`` itself is refused.
        finite: ``inf`` is refused.
        empty: when the cell may be empty (NaN for a number, ``""`` for a text; an integer
            is never empty): ``"always"``, ``"unless-ok"`` (not in a row whose status is
            ``ok``) or ``"never"``.
        choices: the texts allowed (``None``: any), or a function that gives them (read
            when a row is checked: see :func:`_statement_values`).
        exact: written as the shortest text that reads back as the same float (budget
            columns identify cells and feed conversions; the baseline's accuracy is the
            reference a resumed run measures utility against); other floats get 6
            significant digits.
    """

    doc: str = ""
    header: str = ""
    low: float = -math.inf
    high: float = math.inf
    high_open: bool = False
    finite: bool = False
    empty: Literal["always", "unless-ok", "never"] = "always"
    choices: tuple[str, ...] | Callable[[], tuple[str, ...]] | None = None

    def allowed(self) -> tuple[str, ...] | None:
        """The texts allowed (``None``: any)."""
        return self.choices() if callable(self.choices) else self.choices

    exact: bool = False


def _col(doc: str = "", **spec: Any) -> dict[str, ColumnSpec]:
    """The metadata of a :class:`ResultRow` field: its :class:`ColumnSpec`."""
    return {_SPEC: ColumnSpec(doc=doc, **spec)}


_SPEC = "column"
#: Ranges shared by many columns.
_UNIT: dict[str, Any] = {"low": 0.0, "high": 1.0}
_NON_NEGATIVE: dict[str, Any] = {"low": 0.0}
_MEASURED: dict[str, Any] = {"empty": "unless-ok"}


def _statement_values(name: str, *, empty: bool) -> Callable[[], tuple[str, ...]]:
    """The values of ``alm_opacus.statement.<name>`` (an enum or a tuple), and ``""`` if
    ``empty``: the statement owns them. Read when a row is checked, not at import: importing
    the statement imports torch, which ``export`` and ``--help`` must not."""

    def values() -> tuple[str, ...]:
        from alm_opacus import statement

        found = getattr(statement, name)
        texts = tuple(v.value if isinstance(v, enum.Enum) else str(v) for v in found)
        return ("", *texts) if empty else texts

    return values


@dataclass
class ResultRow:
    """One cell of the results table. ``nan`` marks a value a method or attack cannot give.

    Each field is one ``results.csv`` column, in file order, and carries its
    :class:`ColumnSpec` (header, range, format). The first 18 are the design page's; the
    rest were appended later (columns are only ever appended, never renamed or repurposed).
    Modelled on TF Privacy's ``AttackResultsDFColumns``.
    """

    dataset: str = field(metadata=_col(empty="never"))
    method: str = field(metadata=_col(empty="never"))
    epsilon: float = field(
        metadata=_col(
            "the target epsilon the cell was asked for (inf for the unprotected baseline)",
            low=0.0,
            empty="never",
            exact=True,
        )
    )
    delta: float = field(
        metadata=_col(low=0.0, high=1.0, high_open=True, empty="never", exact=True)
    )
    guarantee: str = field(
        metadata=_col(
            "the statement's kind",
            choices=_statement_values("Guarantee", empty=False),
            empty="never",
        )
    )
    sensitivity: float = field(
        metadata=_col(
            "the sensitivity the noise is calibrated to; for DP-SGD the per-step clipping norm",
            **_NON_NEGATIVE,
        )
    )
    noise_scale: float = field(
        metadata=_col(
            "the statement's noise scale, absolute (b, s or sigma of the noise; for DP-SGD the "
            "per-step scale sigma * C, with sigma in noise_multiplier)",
            **_NON_NEGATIVE,
        )
    )
    seed: int = field(metadata=_col())
    # exact: the reference a resumed run measures its seed's utility losses against
    test_accuracy: float = field(metadata=_col(exact=True, **_UNIT, **_MEASURED))
    utility_loss: float = field(metadata=_col(high=1.0, **_MEASURED))
    attack: str = field(default="", metadata=_col())
    mia_accuracy: float = field(default=math.nan, metadata=_col(**_UNIT))
    mia_advantage: float = field(default=math.nan, metadata=_col(**_UNIT))
    mia_auc: float = field(default=math.nan, metadata=_col(**_UNIT))
    tpr_at_fpr_0_001: float = field(
        default=math.nan, metadata=_col(header="tpr_at_fpr_0.001", **_UNIT)
    )
    tpr_at_fpr_0_01: float = field(
        default=math.nan, metadata=_col(header="tpr_at_fpr_0.01", **_UNIT)
    )
    eps_lower_bound: float = field(default=math.nan, metadata=_col(**_NON_NEGATIVE))
    seconds: float = field(default=math.nan, metadata=_col(low=0.0, finite=True, empty="never"))
    # -- appended ------------------------------------------------------------------------
    noise_draws: int = field(default=1, metadata=_col(low=0.0))
    test_accuracy_std: float = field(default=math.nan, metadata=_col(**_NON_NEGATIVE))
    mia_auc_std: float = field(default=math.nan, metadata=_col(**_NON_NEGATIVE))
    mia_accuracy_std: float = field(default=math.nan, metadata=_col(**_NON_NEGATIVE))
    statement: str = field(default="", metadata=_col())
    utility_loss_std: float = field(default=math.nan, metadata=_col(**_NON_NEGATIVE))
    noise_multiplier: float = field(
        default=math.nan,
        metadata=_col(
            "DP-SGD's unitless noise multiplier sigma (empty for other methods)", **_NON_NEGATIVE
        ),
    )
    clip_norm: float = field(
        default=math.nan,
        metadata=_col(
            "DP-SGD's per-example clipping norm C (empty for other methods)", **_NON_NEGATIVE
        ),
    )
    noise_std: float = field(
        default=math.nan,
        metadata=_col(
            "standard deviation of one noise coordinate: of the released weights (post-training), "
            "of each step's noise on the summed clipped gradients (DP-SGD: sigma * C)",
            **_NON_NEGATIVE,
        ),
    )
    sensitivity_norm: str = field(
        default="", metadata=_col("the norm of sensitivity", choices=("", "l1", "l2"))
    )
    sensitivity_source: str = field(
        default="",
        metadata=_col(
            "where the sensitivity came from (statement.SensitivitySource)",
            choices=_statement_values("SensitivitySource", empty=True),
        ),
    )
    neighbouring: str = field(
        default="",
        metadata=_col(
            "the neighbouring relation of epsilon/delta",
            choices=_statement_values("NEIGHBOURING", empty=True),
        ),
    )
    epsilon_replace_one: float = field(
        default=math.nan,
        metadata=_col(
            "the guarantee converted to replace-one, the relation the table compares on",
            exact=True,
            **_NON_NEGATIVE,
        ),
    )
    delta_replace_one: float = field(default=math.nan, metadata=_col(exact=True, **_UNIT))
    noise_source: str = field(
        default="",
        metadata=_col(
            "secure (OS CSPRNG, cannot be replayed) | seeded (private only while the seed is "
            "secret)",
            choices=_statement_values("NOISE_SOURCES", empty=True),
        ),
    )
    epsilon_spent: float = field(
        default=math.nan,
        metadata=_col(
            "epsilon spent so far on the same clean model, this release included (the ledger)",
            **_NON_NEGATIVE,
        ),
    )
    accountant: str = field(
        default="", metadata=_col("the accountant behind a DP-SGD epsilon (alm_pld | prv | rdp)")
    )
    mia_auc_ci_low: float = field(
        default=math.nan,
        metadata=_col("95% intervals of the attack metrics over the evaluation set", **_UNIT),
    )
    mia_auc_ci_high: float = field(default=math.nan, metadata=_col(**_UNIT))
    tpr_at_fpr_0_001_ci_low: float = field(
        default=math.nan, metadata=_col(header="tpr_at_fpr_0.001_ci_low", **_UNIT)
    )
    tpr_at_fpr_0_001_ci_high: float = field(
        default=math.nan, metadata=_col(header="tpr_at_fpr_0.001_ci_high", **_UNIT)
    )
    tpr_at_fpr_0_01_ci_low: float = field(
        default=math.nan, metadata=_col(header="tpr_at_fpr_0.01_ci_low", **_UNIT)
    )
    tpr_at_fpr_0_01_ci_high: float = field(
        default=math.nan, metadata=_col(header="tpr_at_fpr_0.01_ci_high", **_UNIT)
    )
    eps_lower_bound_ceiling: float = field(
        default=math.nan,
        metadata=_col(
            "the largest eps_lower_bound the evaluation set can produce at its size and confidence",
            **_NON_NEGATIVE,
        ),
    )
    status: str = field(
        default="ok",
        metadata=_col(
            "ok | infeasible (the cell could not be released at this epsilon; see reason)",
            choices=("ok", "infeasible"),
            empty="never",
        ),
    )
    reason: str = field(default="", metadata=_col())

    def to_record(self) -> dict[str, object]:
        """The row keyed by the CSV column names."""
        return {c.header: getattr(self, c.name) for c in COLUMNS}

    @classmethod
    def from_record(cls, record: dict[str, str]) -> ResultRow:
        """A row from a CSV record keyed by header (a missing column takes its empty value).

        Raises:
            ValueError: if a number column holds text that is not a number.
        """
        kwargs: dict[str, object] = {}
        for c in COLUMNS:
            raw = record.get(c.header, "")
            if c.kind is float:
                kwargs[c.name] = math.nan if raw in ("", "nan") else float(raw)
            elif c.kind is int:
                kwargs[c.name] = int(float(raw)) if raw else 0
            else:
                kwargs[c.name] = raw
        return cls(**kwargs)  # type: ignore[arg-type]

    def cell(self) -> tuple[str, str, int]:
        """The (method, epsilon, seed) cell this row belongs to (the resume key)."""
        return cell_key(self.method, self.epsilon, self.seed)

    def replace(self, **changes: object) -> ResultRow:
        return dataclasses.replace(self, **changes)  # type: ignore[arg-type]


@dataclass(frozen=True)
class ResultColumn:
    """One column as the CSV code uses it: its field, header, type and spec."""

    name: str
    header: str
    kind: type
    spec: ColumnSpec

    def format(self, value: object) -> str:
        """The CSV text of ``value`` in this column."""
        if self.spec.exact and isinstance(value, float):
            return _fmt_exact(value)
        return _fmt(value)

    def problem(self, value: object, *, ok: bool) -> str | None:
        """What ``value`` should have been, or ``None`` if it is in range.

        Args:
            value: the row's value in this column.
            ok: whether the row's status is ``ok`` (``empty="unless-ok"`` columns need a
                value then).
        """
        spec = self.spec
        if self.kind is str:
            value = str(value)
            choices = spec.allowed()
            if choices is not None and value not in choices:
                listed = [c for c in choices if c]
                return f"one of {listed}" + (" (or empty)" if "" in choices else "")
            if not value and (spec.empty == "never" or (spec.empty == "unless-ok" and ok)):
                return "a non-empty text"
            return None
        number = float(value)  # type: ignore[arg-type]
        if math.isnan(number):
            if spec.empty == "never":
                return f"{self._range()} (never empty)"
            if spec.empty == "unless-ok" and ok:
                return f"{self._range()} (the row's status is 'ok')"
            return None
        above = number >= spec.high if spec.high_open else number > spec.high
        if number < spec.low or above or (spec.finite and math.isinf(number)):
            empty = spec.empty == "always" and self.kind is float
            return self._range() + (" (or empty)" if empty else "")
        return None

    def _range(self) -> str:
        spec = self.spec
        what = (
            "an integer" if self.kind is int else "a finite number" if spec.finite else "a number"
        )
        if math.isfinite(spec.low) and math.isfinite(spec.high):
            return f"{what} in [{spec.low:g}, {spec.high:g}{')' if spec.high_open else ']'}"
        if math.isfinite(spec.low):
            return f"{what} >= {spec.low:g}"
        if math.isfinite(spec.high):
            return f"{what} <= {spec.high:g}"
        return what


def _columns() -> tuple[ResultColumn, ...]:
    kinds = get_type_hints(ResultRow)
    return tuple(
        ResultColumn(
            name=f.name,
            header=f.metadata[_SPEC].header or f.name,
            kind=kinds[f.name],
            spec=f.metadata[_SPEC],
        )
        for f in fields(ResultRow)
    )


#: Every ``results.csv`` column, in file order (derived from :class:`ResultRow`'s fields).
COLUMNS: tuple[ResultColumn, ...] = _columns()
RESULT_COLUMNS: tuple[str, ...] = tuple(c.header for c in COLUMNS)
#: How many columns the design page defines (the rest were appended).
DESIGN_COLUMNS = 18


def out_of_range(row: ResultRow) -> tuple[str, object, str] | None:
    """The first column of ``row`` whose value its :class:`ColumnSpec` refuses.

    Returns:
        ``(header, value, what was expected)``, or ``None`` when every value is in range.
    """
    ok = row.status == "ok"
    for column in COLUMNS:
        value = getattr(row, column.name)
        expected = column.problem(value, ok=ok)
        if expected is not None:
            return column.header, value, expected
    return None


def cell_key(method: str, epsilon: float, seed: int) -> tuple[str, str, int]:
    """The resume key of a cell; epsilon as written in the CSV (exactly), so read rows match
    and two distinct epsilons never share a label."""
    return (method, _fmt_exact(epsilon), seed)


def _fmt(value: object) -> str:
    if isinstance(value, float):
        if math.isnan(value):
            return ""
        if math.isinf(value):
            return "inf"
        return f"{value:.6g}"
    return str(value)


def _fmt_exact(value: float) -> str:
    """The shortest text that reads back as the same float (``1.0`` written ``1``)."""
    if math.isnan(value) or math.isinf(value):
        return _fmt(value)
    text = repr(float(value))
    return text[:-2] if text.endswith(".0") else text


def format_csv(rows: Iterable[ResultRow]) -> str:
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(RESULT_COLUMNS)
    for row in rows:
        writer.writerow([c.format(getattr(row, c.name)) for c in COLUMNS])
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
        rows = []
        for record in reader:
            line = reader.line_num
            if None in record or None in record.values():
                raise ValueError(
                    f"{path}: line {line} has {_count(record)} fields, expected "
                    f"{len(header)} (a truncated or corrupt table)"
                )
            try:
                rows.append(ResultRow.from_record(record))
            except (TypeError, ValueError) as exc:
                raise ValueError(f"{path}: line {line} is not a results row ({exc})") from exc
        return rows


def _count(record: dict[str | None, object]) -> int:
    extra = record.get(None)
    present = sum(1 for k, v in record.items() if k is not None and v is not None)
    return present + (len(extra) if isinstance(extra, list) else 0)
