"""The ``results.csv`` contract: one row per method x epsilon x seed x attack.

Columns are only ever appended, never renamed (see docs/design.md).
"""

from __future__ import annotations

import csv
import dataclasses
import enum
import io
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, fields
from pathlib import Path

from alm_opacus.io import atomic_write_text


class Column(str, enum.Enum):
    """Every ``results.csv`` column, in file order; the value is the header.

    The first 18 are the design page's; the rest were appended later (columns are only ever
    appended, never renamed or repurposed). The field of :class:`ResultRow` for a column is
    its value with ``.`` replaced by ``_``. Modelled on TF Privacy's
    ``AttackResultsDFColumns``.
    """

    DATASET = "dataset"
    METHOD = "method"
    #: the target epsilon the cell was asked for (``inf`` for the unprotected baseline)
    EPSILON = "epsilon"
    DELTA = "delta"
    #: pure-dp | approx-dp | random-dp | per-query | none (the statement's kind)
    GUARANTEE = "guarantee"
    #: the sensitivity the noise is calibrated to; for DP-SGD the per-step clipping norm
    SENSITIVITY = "sensitivity"
    #: the statement's noise scale, absolute (b, s or sigma of the noise; for DP-SGD the
    #: per-step scale sigma * C, with sigma in ``noise_multiplier``)
    NOISE_SCALE = "noise_scale"
    SEED = "seed"
    TEST_ACCURACY = "test_accuracy"
    UTILITY_LOSS = "utility_loss"
    ATTACK = "attack"
    MIA_ACCURACY = "mia_accuracy"
    MIA_ADVANTAGE = "mia_advantage"
    MIA_AUC = "mia_auc"
    TPR_AT_FPR_0_001 = "tpr_at_fpr_0.001"
    TPR_AT_FPR_0_01 = "tpr_at_fpr_0.01"
    EPS_LOWER_BOUND = "eps_lower_bound"
    SECONDS = "seconds"
    # -- appended --------------------------------------------------------------------------
    NOISE_DRAWS = "noise_draws"
    TEST_ACCURACY_STD = "test_accuracy_std"
    MIA_AUC_STD = "mia_auc_std"
    MIA_ACCURACY_STD = "mia_accuracy_std"
    STATEMENT = "statement"
    UTILITY_LOSS_STD = "utility_loss_std"
    #: DP-SGD's unitless noise multiplier sigma (empty for other methods)
    NOISE_MULTIPLIER = "noise_multiplier"
    #: DP-SGD's per-example clipping norm C (empty for other methods)
    CLIP_NORM = "clip_norm"
    #: standard deviation of one noise coordinate: of the released weights (post-training),
    #: of each step's noise on the summed clipped gradients (DP-SGD: sigma * C)
    NOISE_STD = "noise_std"
    #: l1 | l2: the norm of ``sensitivity``
    SENSITIVITY_NORM = "sensitivity_norm"
    #: analytic | sampled-public | sampled-members | caller | clipping
    SENSITIVITY_SOURCE = "sensitivity_source"
    #: replace-one | add-remove: the neighbouring relation of ``epsilon``/``delta``
    NEIGHBOURING = "neighbouring"
    #: the guarantee converted to replace-one, the relation the table compares on
    EPSILON_REPLACE_ONE = "epsilon_replace_one"
    DELTA_REPLACE_ONE = "delta_replace_one"
    #: secure (OS CSPRNG, cannot be replayed) | seeded (private only while the seed is secret)
    NOISE_SOURCE = "noise_source"
    #: epsilon spent so far on the same clean model, this release included (the ledger)
    EPSILON_SPENT = "epsilon_spent"
    #: the accountant behind a DP-SGD epsilon (alm_pld | prv | rdp)
    ACCOUNTANT = "accountant"
    #: 95% intervals of the attack metrics over the evaluation set
    MIA_AUC_CI_LOW = "mia_auc_ci_low"
    MIA_AUC_CI_HIGH = "mia_auc_ci_high"
    TPR_AT_FPR_0_001_CI_LOW = "tpr_at_fpr_0.001_ci_low"
    TPR_AT_FPR_0_001_CI_HIGH = "tpr_at_fpr_0.001_ci_high"
    TPR_AT_FPR_0_01_CI_LOW = "tpr_at_fpr_0.01_ci_low"
    TPR_AT_FPR_0_01_CI_HIGH = "tpr_at_fpr_0.01_ci_high"
    #: the largest eps_lower_bound the evaluation set can produce at its size and confidence
    EPS_LOWER_BOUND_CEILING = "eps_lower_bound_ceiling"
    #: ok | infeasible (the cell could not be released at this epsilon; see ``reason``)
    STATUS = "status"
    REASON = "reason"


RESULT_COLUMNS: tuple[str, ...] = tuple(c.value for c in Column)
#: How many columns the design page defines (the rest were appended).
DESIGN_COLUMNS = 18


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
    noise_multiplier: float = math.nan
    clip_norm: float = math.nan
    noise_std: float = math.nan
    sensitivity_norm: str = ""
    sensitivity_source: str = ""
    neighbouring: str = ""
    epsilon_replace_one: float = math.nan
    delta_replace_one: float = math.nan
    noise_source: str = ""
    epsilon_spent: float = math.nan
    accountant: str = ""
    mia_auc_ci_low: float = math.nan
    mia_auc_ci_high: float = math.nan
    tpr_at_fpr_0_001_ci_low: float = math.nan
    tpr_at_fpr_0_001_ci_high: float = math.nan
    tpr_at_fpr_0_01_ci_low: float = math.nan
    tpr_at_fpr_0_01_ci_high: float = math.nan
    eps_lower_bound_ceiling: float = math.nan
    status: str = "ok"
    reason: str = ""

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


assert [f.name for f in fields(ResultRow)] == [c.replace(".", "_") for c in RESULT_COLUMNS]


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


#: Budget columns are written exactly: they identify cells and feed conversions.
_EXACT = frozenset({Column.EPSILON.value, Column.DELTA.value, Column.EPSILON_REPLACE_ONE.value,
                    Column.DELTA_REPLACE_ONE.value})  # fmt: skip


def format_csv(rows: Iterable[ResultRow]) -> str:
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=RESULT_COLUMNS, lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow({
            k: _fmt_exact(v) if k in _EXACT and isinstance(v, float) else _fmt(v)
            for k, v in row.to_record().items()
        })  # fmt: skip
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
                raise ValueError(f"{path}: line {line} has {_count(record)} fields, expected "
                                 f"{len(header)} (a truncated or corrupt table)")  # fmt: skip
            try:
                rows.append(ResultRow.from_record(record))
            except (TypeError, ValueError) as exc:
                raise ValueError(f"{path}: line {line} is not a results row ({exc})") from exc
        return rows


def _count(record: dict[str | None, object]) -> int:
    extra = record.get(None)
    present = sum(1 for k, v in record.items() if k is not None and v is not None)
    return present + (len(extra) if isinstance(extra, list) else 0)
