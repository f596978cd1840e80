"""The printed trade-off table, and the add/remove -> replace-one conversion it relies on."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import pytest
from scipy import stats

from alm_opacus.report.results import ResultRow
from alm_opacus.report.series import replace_one, to_replace_one
from alm_opacus.report.table import format_tradeoff_table

RowsFactory = Callable[..., list[ResultRow]]


def body(table: str) -> list[list[str]]:
    """The table's data lines (above the footnotes), split into cells."""
    lines = table.split("\n\n")[0].splitlines()[3:]
    return [[c.strip() for c in line.split("|")] for line in lines]


def test_one_line_per_epsilon_with_the_weak_ones_marked(synthetic_rows: RowsFactory) -> None:
    table = format_tradeoff_table(synthetic_rows())
    assert [r[0] for r in body(table)] == ["0.1", "1", "10", "100*", "1000*", "10000*", "inf"]
    assert "* epsilon > 10: a weak guarantee" in table


def test_cells_show_means_and_the_auc_interval(synthetic_rows: RowsFactory) -> None:
    rows = synthetic_rows()
    table = format_tradeoff_table(rows)
    header = [c.strip() for c in table.splitlines()[0].split("|")]
    alm = body(table)[1][header.index("alm")]  # epsilon 1
    this = [r for r in rows if r.method == "alm" and r.epsilon == 1.0]
    accuracy = np.mean([r.test_accuracy for r in this if r.attack == "loss"])
    best = [max((r for r in this if r.seed == s), key=lambda r: r.mia_auc) for s in (0, 1)]
    auc = np.mean([r.mia_auc for r in best])
    low, high = min(r.mia_auc_ci_low for r in best), max(r.mia_auc_ci_high for r in best)
    assert alm.startswith(f"{accuracy:.3f}")
    assert f"{auc:.3f} [{low:.2f},{high:.2f}]  random-dp" in alm


def test_add_remove_rows_show_the_replace_one_guarantee(synthetic_rows: RowsFactory) -> None:
    table = format_tradeoff_table(synthetic_rows())
    header = [c.strip() for c in table.splitlines()[0].split("|")]
    dpsgd = [line[header.index("dpsgd")] for line in body(table)]
    assert dpsgd[1].endswith("approx-dp† ε'=2 δ'=3.7e-05")  # (1 + e) 1e-5 = 3.718e-5
    assert dpsgd[3].endswith("δ'≥1: none")  # (1 + e^100) 1e-5 >= 1: nothing proven
    assert "† dpsgd: an add/remove guarantee, shown under replace-one" in table


def test_no_conversion_note_without_add_remove_rows(synthetic_rows: RowsFactory) -> None:
    table = format_tradeoff_table(synthetic_rows(methods=("alm", "laplace")))
    assert "†" not in table


def test_infeasible_cells_print_as_infeasible(synthetic_rows: RowsFactory) -> None:
    rows = synthetic_rows(methods=("laplace",), infeasible=[("laplace", 10000.0)])
    table = format_tradeoff_table(rows)
    header = [c.strip() for c in table.splitlines()[0].split("|")]
    assert body(table)[5][header.index("laplace")] == "infeasible"
    assert "infeasible: laplace at epsilon 10000 (seeds 0, 1): no noise scale" in table


def _gaussian_delta(epsilon: float, *, sensitivity: float, sigma: float) -> float:
    """The exact delta(epsilon) of the Gaussian mechanism (Balle & Wang 2018, Theorem 8)."""
    a, b = sensitivity / (2 * sigma), epsilon * sigma / sensitivity
    return float(stats.norm.cdf(a - b) - math.exp(epsilon) * stats.norm.cdf(-a - b))


@pytest.mark.parametrize("sigma", [0.5, 1.0, 3.0])
@pytest.mark.parametrize("epsilon", [0.1, 0.5, 1.0, 2.0])
def test_conversion_bounds_the_exact_replace_one_delta(sigma: float, epsilon: float) -> None:
    """A sum query changes by at most 1 when a row is added or removed and by at most 2 when
    one is replaced: the Gaussian mechanism's exact replace-one delta at 2 epsilon must not
    exceed the converted add/remove delta (group privacy is an upper bound)."""
    delta = _gaussian_delta(epsilon, sensitivity=1.0, sigma=sigma)
    converted_epsilon, converted_delta = to_replace_one(epsilon=epsilon, delta=delta)
    assert converted_epsilon == 2 * epsilon
    exact = _gaussian_delta(converted_epsilon, sensitivity=2.0, sigma=sigma)
    assert exact <= converted_delta * (1 + 1e-9)


def test_replace_one_reads_the_rows_own_columns() -> None:
    row = ResultRow(dataset="digits", method="dpsgd", epsilon=1.0, delta=1e-5,
                    guarantee="approx-dp", sensitivity=1.0, noise_scale=1.0, seed=0,
                    test_accuracy=0.9, utility_loss=0.0, neighbouring="add-remove")  # fmt: skip
    assert replace_one(row) == pytest.approx((2.0, (1 + math.e) * 1e-5))
    assert replace_one(row.replace(epsilon_replace_one=1.7, delta_replace_one=2e-5)) == (1.7, 2e-5)
    assert replace_one(row.replace(neighbouring="replace-one")) == (1.0, 1e-5)
    with pytest.raises(ValueError, match="epsilon=-1"):
        to_replace_one(epsilon=-1.0, delta=0.0)
