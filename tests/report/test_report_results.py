"""The ``results.csv`` schema: one field of ``ResultRow`` per column, carrying its header,
type and range; the writer, the reader and the range check are derived from it (issue 36)."""

from __future__ import annotations

import csv
import io
import math

import pytest

from alm_opacus.report.results import (
    COLUMNS,
    DESIGN_COLUMNS,
    RESULT_COLUMNS,
    ColumnSpec,
    ResultRow,
    format_csv,
    out_of_range,
)

#: The file's header, as every version so far wrote it: columns are only appended.
HEADER = (
    "dataset,method,epsilon,delta,guarantee,sensitivity,noise_scale,seed,test_accuracy,"
    "utility_loss,attack,mia_accuracy,mia_advantage,mia_auc,tpr_at_fpr_0.001,tpr_at_fpr_0.01,"
    "eps_lower_bound,seconds,noise_draws,test_accuracy_std,mia_auc_std,mia_accuracy_std,"
    "statement,utility_loss_std,noise_multiplier,clip_norm,noise_std,sensitivity_norm,"
    "sensitivity_source,neighbouring,epsilon_replace_one,delta_replace_one,noise_source,"
    "epsilon_spent,accountant,mia_auc_ci_low,mia_auc_ci_high,tpr_at_fpr_0.001_ci_low,"
    "tpr_at_fpr_0.001_ci_high,tpr_at_fpr_0.01_ci_low,tpr_at_fpr_0.01_ci_high,"
    "eps_lower_bound_ceiling,status,reason"
)


def _row(**changes: object) -> ResultRow:
    row = ResultRow(
        dataset="digits",
        method="alm",
        epsilon=0.1 + 0.2,
        delta=0.0,
        guarantee="random-dp",
        sensitivity=147.2234567,
        noise_scale=1478.5312345,
        seed=3,
        test_accuracy=0.9,
        utility_loss=0.02,
        seconds=1.5,
    )
    return row.replace(**changes)


def test_the_header_is_the_contracts() -> None:
    assert ",".join(RESULT_COLUMNS) == HEADER
    assert RESULT_COLUMNS[:DESIGN_COLUMNS][-1] == "seconds"
    assert format_csv([]) == HEADER + "\n"


def test_every_column_is_one_typed_field_with_its_spec() -> None:
    assert [c.header for c in COLUMNS] == list(RESULT_COLUMNS)
    assert {c.kind for c in COLUMNS} == {str, float, int}
    assert all(isinstance(c.spec, ColumnSpec) for c in COLUMNS)
    assert [c.name for c in COLUMNS if c.header != c.name] == [
        "tpr_at_fpr_0_001",
        "tpr_at_fpr_0_01",
        "tpr_at_fpr_0_001_ci_low",
        "tpr_at_fpr_0_001_ci_high",
        "tpr_at_fpr_0_01_ci_low",
        "tpr_at_fpr_0_01_ci_high",
    ]


def test_budget_columns_are_exact_and_the_rest_six_digits() -> None:
    # test_accuracy too: a resumed run measures utility against the baseline's as read back
    text = format_csv([_row(delta_replace_one=1e-5 / 3, test_accuracy=350 / 359)])
    record = next(csv.DictReader(io.StringIO(text)))
    assert record["epsilon"] == "0.30000000000000004"
    assert record["delta_replace_one"] == repr(1e-5 / 3)
    assert record["sensitivity"] == "147.223"
    assert record["noise_scale"] == "1478.53"
    assert record["seed"] == "3"
    assert record["mia_auc"] == ""
    back = ResultRow.from_record(record)
    assert back.epsilon == 0.1 + 0.2
    assert back.test_accuracy == 350 / 359 and record["test_accuracy"] == repr(350 / 359)
    assert back.seed == 3 and math.isnan(back.mia_auc) and back.status == "ok"


@pytest.mark.parametrize(
    ("changes", "expected"),
    [
        ({}, None),
        ({"delta": 1.0}, ("delta", 1.0, "a number in [0, 1)")),
        ({"delta": math.nan}, ("delta", math.nan, "a number in [0, 1) (never empty)")),
        ({"mia_auc": 1.01}, ("mia_auc", 1.01, "a number in [0, 1] (or empty)")),
        ({"mia_auc": math.nan}, None),
        ({"noise_scale": math.inf}, None),
        ({"noise_scale": -0.5}, ("noise_scale", -0.5, "a number >= 0 (or empty)")),
        ({"utility_loss": -3.0}, None),
        ({"utility_loss": 1.5}, ("utility_loss", 1.5, "a number <= 1")),
        (
            {"test_accuracy": math.nan},
            ("test_accuracy", math.nan, "a number in [0, 1] (the row's status is 'ok')"),
        ),
        ({"test_accuracy": math.nan, "status": "infeasible"}, None),
        ({"seconds": math.inf}, ("seconds", math.inf, "a finite number >= 0")),
        ({"noise_draws": -1}, ("noise_draws", -1, "an integer >= 0")),
        ({"tpr_at_fpr_0_01": 2.0}, ("tpr_at_fpr_0.01", 2.0, "a number in [0, 1] (or empty)")),
        (
            {"guarantee": ""},
            ("guarantee", "", "one of ['pure-dp', 'approx-dp', 'random-dp', 'per-query', 'none']"),
        ),
        ({"noise_source": "seeded"}, None),
        ({"noise_source": "os"}, ("noise_source", "os", "one of ['secure', 'seeded'] (or empty)")),
        ({"dataset": ""}, ("dataset", "", "a non-empty text")),
    ],
)
def test_out_of_range_reads_each_columns_spec(
    changes: dict[str, object], expected: tuple[str, object, str] | None
) -> None:
    found = out_of_range(_row(**changes))
    if expected is None or found is None:
        assert found == expected
        return
    header, value, what = found
    assert header == expected[0]
    assert value == expected[1] or (math.isnan(value) and math.isnan(expected[1]))  # type: ignore[arg-type]
    assert what == expected[2]
