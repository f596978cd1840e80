"""The verdict's decision rule, one test per branch, on constructed rows."""

from __future__ import annotations

import math

import pytest

from alm_opacus.report.results import ResultRow
from alm_opacus.report.series import NO_LEAK
from alm_opacus.report.verdict import (
    USEFUL_FRACTION,
    Outcome,
    decide,
    format_verdict,
    useful_accuracy,
)

MEMBERS = 150
CLASSES = 10


def row(
    method: str,
    epsilon: float,
    *,
    kind: str = "pure-dp",
    acc: float,
    auc: float,
    half: float = 0.04,
    delta: float = 0.0,
    add_remove: bool = False,
    seed: int = 0,
    status: str = "ok",
) -> ResultRow:
    """One cell with one attack row: accuracy ``acc``, AUC ``auc`` ± ``half``."""
    out = ResultRow(
        dataset="digits",
        method=method,
        epsilon=epsilon,
        delta=delta,
        guarantee=kind,
        sensitivity=1.0,
        noise_scale=1.0,
        seed=seed,
        test_accuracy=acc,
        utility_loss=0.0,
        attack="loss",
        mia_auc=auc,
        mia_auc_ci_low=auc - half,
        mia_auc_ci_high=auc + half,
        neighbouring="add-remove" if add_remove else "replace-one",
        status=status,
    )
    if add_remove:
        out = out.replace(
            epsilon_replace_one=2 * epsilon, delta_replace_one=(1 + math.exp(epsilon)) * delta
        )
    return out


def baseline(acc: float = 0.9, auc: float = 0.70) -> ResultRow:
    return row("none", math.inf, kind="none", acc=acc, auc=auc)


def reference(auc: float = 0.53, half: float = 0.05) -> ResultRow:
    return row(NO_LEAK, math.inf, kind="none", acc=0.85, auc=auc, half=half)


def dpsgd(epsilon: float, acc: float, auc: float, half: float = 0.04) -> ResultRow:
    return row(
        "dpsgd", epsilon, kind="approx-dp", acc=acc, auc=auc, half=half, delta=1e-5, add_remove=True
    )


def alm(epsilon: float, acc: float, auc: float) -> ResultRow:
    return row("alm", epsilon, kind="random-dp", acc=acc, auc=auc)


def test_useful_line_keeps_half_the_gain_over_chance() -> None:
    assert USEFUL_FRACTION == 0.5
    assert useful_accuracy(baseline=0.9, chance=0.1) == pytest.approx(0.5)
    assert useful_accuracy(baseline=0.92, chance=0.1) == pytest.approx(0.51)


def test_no_method_useful_at_a_meaningful_guarantee() -> None:
    """The default run's shape: DP-SGD at ε′ = 2 keeps 0.23; at ε′ = 20 it keeps 0.84 but is
    weak (δ′ = 0.22 > 1/150); ALM is random-DP."""
    rows = [
        baseline(0.92),
        dpsgd(1.0, 0.23, 0.54),
        dpsgd(10.0, 0.84, 0.57),
        dpsgd(0.1, 0.10, 0.52),
        alm(10.0, 0.15, 0.52),
        alm(1000.0, 0.92, 0.66),
    ]
    verdict = decide(rows, members=MEMBERS, num_classes=CLASSES)
    assert verdict.outcome is Outcome.NONE_USEFUL
    assert verdict.useful_accuracy == pytest.approx(0.51)
    best = verdict.method("dpsgd").best
    assert best is not None and best.epsilon == 1.0 and best.epsilon_common == 2.0
    assert best.accuracy == pytest.approx(0.23) and best.useful is False
    assert verdict.method("dpsgd").dp and not verdict.method("alm").dp
    assert verdict.method("alm").best is None
    not_dp = verdict.method("alm").best_not_dp
    assert not_dp is not None and not_dp.epsilon == 10.0  # 1000 is weak, so left out
    assert verdict.cited == {("dpsgd", 1.0), ("alm", 10.0)}
    assert verdict.sentence.startswith(
        "At a meaningful guarantee (ε′ ≤ 10, δ′ ≤ 1/150) no method keeps useful accuracy"
    )
    assert "dpsgd at ε′ = 2 (ε = 1) with accuracy 0.23 against 0.92 unprotected" in verdict.sentence
    assert any(c.startswith("alm's rows are random-DP, not DP") for c in verdict.caveats)
    assert "differences within the intervals are not differences" in verdict.text


def test_one_method_useful() -> None:
    rows = [
        baseline(),
        dpsgd(4.0, 0.84, 0.55, half=0.05),
        dpsgd(0.5, 0.30, 0.51),
        row("laplace", 10.0, acc=0.40, auc=0.52),
    ]
    verdict = decide(rows, members=MEMBERS, num_classes=CLASSES)
    assert verdict.outcome is Outcome.ONE_USEFUL
    best = verdict.method("dpsgd").best
    assert best is not None and best.useful and best.epsilon_common == 8.0
    laplace = verdict.method("laplace").best
    assert laplace is not None and laplace.useful is False
    assert verdict.cited == {("dpsgd", 4.0), ("laplace", 10.0)}  # each method's best
    assert "only dpsgd keeps useful accuracy: 0.84 at ε′ = 8 (ε = 4)" in verdict.sentence
    assert "AUC 0.55 [0.50, 0.60]" in verdict.sentence


@pytest.mark.parametrize(
    ("laplace_auc", "separated"), [(0.56, False), (0.70, True)], ids=["overlap", "separated"]
)
def test_two_useful_methods_compare_their_intervals(laplace_auc: float, separated: bool) -> None:
    rows = [
        baseline(),
        dpsgd(4.0, 0.84, 0.55),
        row("laplace", 8.0, acc=0.86, auc=laplace_auc),
        row("laplace", 1.0, acc=0.30, auc=0.51),
    ]
    verdict = decide(rows, members=MEMBERS, num_classes=CLASSES)
    assert verdict.outcome is Outcome.SEVERAL_USEFUL
    assert verdict.cited == {("dpsgd", 4.0), ("laplace", 8.0)}
    assert verdict.sentence.startswith("At a meaningful guarantee")
    assert "2 methods keep useful accuracy" in verdict.sentence
    assert "the best is laplace" in verdict.sentence  # 0.86 > 0.84
    if separated:
        assert (
            "dpsgd's AUC interval at ε′ = 8 (ε = 4) (0.55 [0.51, 0.59]) lies below laplace's"
            in (verdict.text)
        )
        assert "differences within the intervals" not in verdict.text
    else:
        assert "The AUC intervals of the points named overlap" in verdict.text
        assert "differences within the intervals are not differences" in verdict.text
    # equal utility: laplace at dpsgd's best accuracy 0.84, interpolated on [0.30, 0.86]
    (found,) = verdict.comparisons
    assert (found.method, found.other) == ("laplace", "dpsgd")
    assert found.accuracy == pytest.approx(0.84)
    expected = 0.51 + (0.84 - 0.30) / (0.86 - 0.30) * (laplace_auc - 0.51)
    assert found.auc.mean == pytest.approx(expected)
    assert found.other_auc.mean == pytest.approx(0.55)
    assert found.separated is separated
    assert found.leaks_less == ("dpsgd" if separated else None)
    assert ("dpsgd leaks less." in verdict.text) is separated


def test_only_random_dp_rows() -> None:
    rows = [baseline(), alm(1.0, 0.2, 0.52), alm(10.0, 0.6, 0.55), alm(100.0, 0.9, 0.68)]
    verdict = decide(rows, members=MEMBERS, num_classes=CLASSES)
    assert verdict.outcome is Outcome.NO_DP
    assert verdict.method("alm").best is None
    pick = verdict.method("alm").best_not_dp
    assert pick is not None and pick.epsilon == 10.0 and pick.useful
    assert verdict.sentence.startswith(
        "No method in this run gives a DP guarantee (alm: random-dp)"
    )
    assert "alm's rows are random-DP, not DP: at ε′ ≤ 10 its best accuracy is 0.60 (useful)" in (
        verdict.text
    )
    assert verdict.cited == {("alm", 10.0)}


def test_every_dp_row_weak() -> None:
    rows = [baseline(), dpsgd(10.0, 0.84, 0.57), row("laplace", 50.0, acc=0.9, auc=0.6)]
    verdict = decide(rows, members=MEMBERS, num_classes=CLASSES)
    assert verdict.outcome is Outcome.NO_MEANINGFUL
    assert all(v.best is None for v in verdict.methods)
    assert "No row of this run has a meaningful guarantee" in verdict.sentence
    assert verdict.cited == frozenset()


def test_no_baseline_leaves_usefulness_undefined() -> None:
    rows = [dpsgd(4.0, 0.84, 0.55), dpsgd(1.0, 0.40, 0.52)]
    verdict = decide(rows, members=MEMBERS, num_classes=CLASSES)
    assert verdict.outcome is Outcome.NO_BASELINE
    assert math.isnan(verdict.baseline_accuracy) and math.isnan(verdict.useful_accuracy)
    best = verdict.method("dpsgd").best
    assert best is not None and best.useful is None and best.epsilon == 4.0
    assert "without the unprotected head (method none)" in verdict.sentence
    assert "unprotected" not in verdict.sentence.split(";")[0]


def test_empty_and_infeasible() -> None:
    empty = decide([], members=MEMBERS, num_classes=CLASSES)
    assert empty.outcome is Outcome.NO_RESULTS and empty.methods == ()
    assert "nothing to recommend" in empty.sentence
    blocked = [baseline(), row("laplace", 0.1, acc=math.nan, auc=math.nan, status="infeasible")]
    verdict = decide(blocked, members=MEMBERS, num_classes=CLASSES)
    assert verdict.outcome is Outcome.NO_RESULTS
    assert verdict.method("laplace").infeasible
    assert "laplace: every cell infeasible" in verdict.text
    # an infeasible cell beside feasible ones is left out, not cited
    mixed = [*blocked, row("laplace", 8.0, acc=0.8, auc=0.55)]
    verdict = decide(mixed, members=MEMBERS, num_classes=CLASSES)
    assert verdict.outcome is Outcome.ONE_USEFUL and verdict.cited == {("laplace", 8.0)}
    assert not verdict.method("laplace").infeasible


@pytest.mark.parametrize("present", [True, False], ids=["no-leak", "no-reference"])
def test_no_leak_band(present: bool) -> None:
    rows = [baseline(), dpsgd(4.0, 0.84, 0.55), row("laplace", 8.0, acc=0.86, auc=0.66)]
    if present:
        rows.append(reference(0.53, 0.05))  # the band [0.48, 0.58]
    verdict = decide(rows, members=MEMBERS, num_classes=CLASSES)
    assert all(v.method != NO_LEAK for v in verdict.methods)  # a reference, not a method
    dp, laplace = verdict.method("dpsgd").best, verdict.method("laplace").best
    assert dp is not None and laplace is not None
    if present:
        assert verdict.no_leak is not None
        assert (verdict.no_leak.low, verdict.no_leak.high) == pytest.approx((0.48, 0.58))
        assert dp.inside_no_leak is True and laplace.inside_no_leak is False
        assert (
            "dpsgd at ε′ = 8 (ε = 4) (AUC 0.55) lies inside the no-leak band [0.48, 0.58]: "
            "indistinguishable from a release that never saw the members" in verdict.text
        )
        assert "laplace at ε′ = 8 (AUC 0.66) lies outside the no-leak band" in verdict.text
    else:
        assert verdict.no_leak is None
        assert dp.inside_no_leak is None and laplace.inside_no_leak is None
        assert "no no-leak reference" in verdict.text
        assert "indistinguishable" not in verdict.text


def test_weak_delta_line_follows_the_member_count() -> None:
    """δ′ = (1 + e^4) 1e-5 ≈ 5.6e-4: meaningful for 150 members, weak for 10,000."""
    rows = [baseline(), dpsgd(4.0, 0.84, 0.55)]
    assert decide(rows, members=150, num_classes=CLASSES).outcome is Outcome.ONE_USEFUL
    assert decide(rows, members=10_000, num_classes=CLASSES).outcome is Outcome.NO_MEANINGFUL


def test_seeds_are_averaged_before_the_choice() -> None:
    rows = [
        baseline(),
        row("laplace", 8.0, acc=0.2, auc=0.5, seed=0),
        row("laplace", 8.0, acc=0.9, auc=0.6, seed=1),
        row("laplace", 4.0, acc=0.5, auc=0.5),
    ]
    best = decide(rows, members=MEMBERS, num_classes=CLASSES).method("laplace").best
    assert best is not None and best.epsilon == 8.0 and best.accuracy == pytest.approx(0.55)


def test_unknown_class_count_is_said() -> None:
    rows = [baseline(), row("laplace", 8.0, acc=0.5, auc=0.55)]
    verdict = decide(rows, members=MEMBERS, num_classes=None)
    assert verdict.chance == 0.0 and verdict.useful_accuracy == pytest.approx(0.45)
    assert "chance accuracy is taken as 0" in verdict.text


def test_printed_verdict_wraps_at_the_width() -> None:
    rows = [baseline(0.92), dpsgd(1.0, 0.23, 0.54), alm(10.0, 0.15, 0.52)]
    text = format_verdict(decide(rows, members=MEMBERS, num_classes=CLASSES), width=100)
    assert text.startswith("Verdict: At a meaningful guarantee")
    assert max(len(line) for line in text.splitlines()) <= 100
    assert sum(line.startswith("- ") for line in text.splitlines()) >= 2
