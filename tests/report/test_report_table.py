"""The printed trade-off table, and the add/remove -> replace-one conversion it relies on."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import pytest
from scipy import stats

from alm_opacus.report.results import ResultRow
from alm_opacus.report.series import Stat, format_stat, is_weak, replace_one, to_replace_one
from alm_opacus.report.table import CITED, MAX_WIDTH, format_tradeoff_table, tradeoff_cells
from alm_opacus.report.verdict import decide

RowsFactory = Callable[..., list[ResultRow]]


def body(table: str) -> list[list[str]]:
    """The default table's data lines (above the footnotes), split into cells, without the
    verdict's mark (:func:`cited` reads it)."""
    lines = table.split("\n\n")[0].splitlines()[2:]
    return [line.replace(CITED, "").split() for line in lines]


def cited(table: str) -> list[list[str]]:
    """The [method, ε] of the lines the verdict's mark starts."""
    lines = table.split("\n\n")[0].splitlines()[2:]
    return [line.split()[1:3] for line in lines if line.startswith(CITED)]


def line(table: str, method: str, epsilon: str) -> list[str]:
    (found,) = [c for c in body(table) if c[:2] == [method, epsilon]]
    return found


def wide_body(table: str) -> list[list[str]]:
    lines = table.split("\n\n")[0].splitlines()[3:]
    return [[c.strip() for c in line.split("|")] for line in lines]


ALL_METHODS = (
    "alm",
    "dperm",
    "dpsgd",
    "dpsgd-alm",
    "dpsgd-laplace",
    "gaussian",
    "gaussian-classic",
    "laplace",
    "lu",
)


def _all_methods(rows: list[ResultRow]) -> list[ResultRow]:
    """The synthetic rows under every name ``--methods all`` prints (the widest table)."""
    out = [r for r in rows if r.method == "none"]
    for k, name in enumerate(ALL_METHODS):
        source = ("alm", "laplace", "dpsgd")[k % 3]
        out += [r.replace(method=name) for r in rows if r.method == source]
    return out


def test_one_line_per_method_and_epsilon(synthetic_rows: RowsFactory) -> None:
    table = format_tradeoff_table(synthetic_rows())
    assert [c[:2] for c in body(table)] == [["none", "inf"]] + [
        [m, e]
        for m in ("alm", "laplace", "dpsgd")
        for e in ("0.1", "1", "10", "100", "1000", "10000")
    ]


@pytest.mark.parametrize("wide", [False, True])
def test_every_header_word_is_defined_under_the_table(
    synthetic_rows: RowsFactory, wide: bool
) -> None:
    table = format_tradeoff_table(synthetic_rows(), wide=wide, members=150, nonmembers=150)
    top, notes = table.split("\n\n", 1)
    header = top.splitlines()[1 if wide else 0]
    words = (
        ["acc", "uloss", "AUC [95% CI]", "guarantee"]
        if wide
        else [
            "method",
            "ε",
            "kind",
            "ε′",
            "δ′",
            "ε_lb",
            "acc",
            "uloss",
            "AUC [95% CI]",
            "TPR@1%",
        ]
    )
    if not wide:  # 150 non-members cannot resolve an FPR of 0.001: the column is left out
        assert "TPR@0.1%" not in header
        assert "TPR@0.1% is not shown: 150 non-members" in notes.replace("\n  ", " ")
    for word in [*words, CITED]:
        assert word in header or word == CITED  # the mark is in the body
        defined = any(
            n.startswith(word) or f" {word}:" in n or f"{word}," in n
            for n in notes.replace("\n  ", " ").splitlines()
        )
        assert defined, word
    for kind in ("random", "pure", "approx", "none"):
        assert f"{kind}{'-dp' if wide and kind != 'none' else ''} = " in notes.replace("\n  ", " ")


def test_default_table_fits_100_columns_with_every_method(synthetic_rows: RowsFactory) -> None:
    table = format_tradeoff_table(
        _all_methods(synthetic_rows()), members=150, nonmembers=150, num_classes=10
    )
    assert max(len(x) for x in table.splitlines()) <= MAX_WIDTH
    assert {c[0] for c in body(table)} == {"none", *ALL_METHODS}
    wide = format_tradeoff_table(_all_methods(synthetic_rows()), wide=True)
    assert max(len(x) for x in wide.splitlines()) > MAX_WIDTH  # the wide form is opt-in
    resolved = format_tradeoff_table(
        _all_methods(synthetic_rows()), members=150, nonmembers=1000, num_classes=10
    )
    assert "TPR@0.1%" in resolved.splitlines()[0]
    assert max(len(x) for x in resolved.splitlines()) <= MAX_WIDTH


def test_cells_show_means_and_the_auc_interval(synthetic_rows: RowsFactory) -> None:
    rows = synthetic_rows()
    table = format_tradeoff_table(rows)
    alm = line(table, "alm", "1")
    this = [r for r in rows if r.method == "alm" and r.epsilon == 1.0]
    accuracy = np.mean([r.test_accuracy for r in this if r.attack == "loss"])
    best = [max((r for r in this if r.seed == s), key=lambda r: r.mia_auc) for s in (0, 1)]
    auc = np.mean([r.mia_auc for r in best])
    low, high = min(r.mia_auc_ci_low for r in best), max(r.mia_auc_ci_high for r in best)
    assert alm[2] == "random" and alm[6] == f"{accuracy:.3f}"
    assert " ".join(alm[8:10]) == f"{auc:.3f} [{low:.2f},{high:.2f}]"
    lower_bound = max(r.eps_lower_bound for r in this)  # over attacks and seeds
    assert alm[5] == f"{lower_bound:.2f}"


def test_rows_the_verdict_cites_are_marked(synthetic_rows: RowsFactory) -> None:
    """The verdict reports per method its best accuracy at a meaningful guarantee: laplace at
    ε = 10 (pure DP), dpsgd at ε = 1 (ε′ = 2; at ε = 10 ε′ = 20 is weak); alm is random DP, so
    its best at ε′ ≤ 10 (ε = 10). The table marks exactly those."""
    rows = synthetic_rows()
    verdict = decide(rows, members=150, num_classes=10)
    assert verdict.cited == {("laplace", 10.0), ("alm", 10.0), ("dpsgd", 1.0)}
    table = format_tradeoff_table(rows, members=150, nonmembers=150, num_classes=10)
    assert sorted(cited(table)) == [["alm", "10"], ["dpsgd", "1"], ["laplace", "10"]]
    assert f"{CITED}: the row the verdict (under the table) reports" in table
    header, body_, _ = tradeoff_cells(rows, members=150, nonmembers=150, num_classes=10)
    marked = sorted(tuple(c[:2]) for c in body_ if c[0].startswith(CITED))
    assert marked == [(f"{CITED} alm", "10"), (f"{CITED} dpsgd", "1"), (f"{CITED} laplace", "10")]
    assert header[5] == "ε_lb" and "TPR@0.1%" not in header
    wide = format_tradeoff_table(rows, wide=True, members=150, num_classes=10)
    assert sum(line.count(CITED) for line in wide.split("\n\n")[0].splitlines()) == 3


def test_add_remove_rows_show_the_replace_one_guarantee(synthetic_rows: RowsFactory) -> None:
    table = format_tradeoff_table(synthetic_rows(), members=150)
    assert line(table, "dpsgd", "1")[2:5] == ["approx", "2†", "3.7e-05"]  # (1 + e) 1e-5
    assert line(table, "dpsgd", "100")[2:5] == ["none", "200†", "≥1*"]  # nothing proven
    assert "† dpsgd: an add/remove guarantee" in table.replace("\n  ", " ")


def test_star_is_decided_on_the_replace_one_guarantee_shown(synthetic_rows: RowsFactory) -> None:
    """dpsgd asked for epsilon 10 shows ε′ = 20, δ′ = 0.22: weak, though 10 is not above 10."""
    table = format_tradeoff_table(synthetic_rows(), members=150)
    assert line(table, "dpsgd", "10")[3:5] == ["20†", "0.22*"]
    assert line(table, "alm", "10")[3:5] == ["10", "1e-05"]  # ε′ = 10 is not above 10
    assert line(table, "alm", "100")[4] == "1e-05*"
    wide = format_tradeoff_table(synthetic_rows(), wide=True, members=150)
    row10 = next(c for c in wide_body(wide) if c[0] == "10")
    header = [c.strip() for c in wide.splitlines()[0].split("|")]
    assert row10[header.index("dpsgd")].endswith("δ'=0.22*")
    assert not row10[header.index("alm")].endswith("*")


def test_weak_delta_line_follows_the_member_count() -> None:
    assert is_weak(epsilon=1.0, delta=0.01, members=150)  # δ′ above 1/150
    assert not is_weak(epsilon=1.0, delta=0.005, members=150)
    assert is_weak(epsilon=1.0, delta=0.005)  # n unknown: above 1e-3
    assert not is_weak(epsilon=math.inf, delta=0.0)  # the baseline: no guarantee, not weak


def test_below_chance_accuracy_is_flagged(synthetic_rows: RowsFactory) -> None:
    rows = [
        r.replace(test_accuracy=0.08) if (r.method, r.epsilon) == ("alm", 0.1) else r
        for r in synthetic_rows()
    ]
    table = format_tradeoff_table(rows, num_classes=10)
    assert line(table, "alm", "0.1")[6] == "0.080!"
    assert line(table, "alm", "1")[6].endswith("!") is False
    assert "!: below chance (1/C = 0.1)" in table.replace("\n  ", " ")
    assert "below chance" not in format_tradeoff_table(synthetic_rows(), num_classes=10)


def test_tpr_is_shown_only_where_the_non_members_resolve_it(synthetic_rows: RowsFactory) -> None:
    rows = synthetic_rows()
    few = format_tradeoff_table(rows, nonmembers=150)
    assert few.splitlines()[0].split()[-1] == "TPR@1%"  # TPR@0.1% is left out
    assert line(few, "alm", "1")[-1] != "—" and "—" not in few.split("\n\n")[0]
    assert "150 non-members cannot resolve an FPR of 0.001; it needs at least 1000" in (
        few.replace("\n  ", " ")
    )
    many = format_tradeoff_table(rows, nonmembers=1000)
    assert many.splitlines()[0].split()[-2:] == ["TPR@1%", "TPR@0.1%"]
    assert line(many, "alm", "1")[-1] != "—" and "cannot resolve" not in many
    assert max(len(x) for x in many.splitlines()) <= MAX_WIDTH


def test_no_conversion_note_without_add_remove_rows(synthetic_rows: RowsFactory) -> None:
    table = format_tradeoff_table(synthetic_rows(methods=("alm", "laplace")))
    assert "†" not in table


def test_infeasible_cells_print_as_infeasible(synthetic_rows: RowsFactory) -> None:
    rows = synthetic_rows(methods=("laplace",), infeasible=[("laplace", 10000.0)])
    table = format_tradeoff_table(rows)
    assert line(table, "laplace", "10000")[2] == "infeasible"
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
    row = ResultRow(
        dataset="digits",
        method="dpsgd",
        epsilon=1.0,
        delta=1e-5,
        guarantee="approx-dp",
        sensitivity=1.0,
        noise_scale=1.0,
        seed=0,
        test_accuracy=0.9,
        utility_loss=0.0,
        neighbouring="add-remove",
    )
    assert replace_one(row) == pytest.approx((2.0, (1 + math.e) * 1e-5))
    assert replace_one(row.replace(epsilon_replace_one=1.7, delta_replace_one=2e-5)) == (1.7, 2e-5)
    assert replace_one(row.replace(neighbouring="replace-one")) == (1.0, 1e-5)
    with pytest.raises(ValueError, match="epsilon=-1"):
        to_replace_one(epsilon=-1.0, delta=0.0)


def test_every_view_prints_a_mean_with_its_bar_one_way() -> None:
    """The table, report.html and the verdict print an AUC with :func:`format_stat`: the
    interval's bounds at two decimals, the mean and a ± spread at ``digits``."""
    interval = Stat(0.6123, 0.5512, 0.6749, "ci95")
    assert format_stat(interval) == "0.612 [0.55, 0.67]"  # report.html
    assert format_stat(interval, sep=",") == "0.612 [0.55,0.67]"  # the narrow table
    assert format_stat(interval, digits=2) == "0.61 [0.55, 0.67]"  # the verdict's words
    spread = Stat(0.6, 0.5, 0.7, "std")
    assert format_stat(spread) == "0.600 ±0.100"
    assert format_stat(spread, digits=2) == "0.60 ±0.10"
    assert format_stat(Stat(0.6, 0.6, 0.6, "")) == "0.600"
    assert format_stat(Stat.of([])) == "-"  # no value: a dash, never "nan"
