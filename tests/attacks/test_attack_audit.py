"""The audit's ceiling and the pooled bound over noise draws (issue 11, item 4): the ceiling is
the bound of perfect decisions, worked out by hand from the Beta quantile; pooling keeps 95%
coverage when draws differ; and a ceiling below the claim is said, never passed over."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from alm_opacus.attacks import (
    EpsilonBound,
    aggregate_results,
    epsilon_bound_ceiling,
    epsilon_lower_bound,
    evaluate_attack,
    pool_epsilon_bounds,
)
from alm_opacus.attacks.aggregate import ceiling_note


def _ceiling_by_hand(trials: int, confidence: float = 0.95) -> float:
    # 0 of n errors: the one-sided Clopper-Pearson upper bound at level 1 - a is
    # 1 - a^(1/n) (Beta(1 - a; 1, n) in closed form), a = (1 - confidence) / 2 (Bonferroni)
    upper = 1 - ((1 - confidence) / 2) ** (1 / trials)
    return math.log((1 - upper) / upper)


@pytest.mark.parametrize("trials", [75, 375, 1000])
def test_ceiling_is_the_bound_of_perfect_decisions(trials: int) -> None:
    ceiling = epsilon_bound_ceiling(negatives=trials, positives=trials, delta=0.0, confidence=0.95)
    assert ceiling == pytest.approx(_ceiling_by_hand(trials), rel=1e-9)
    # no error counts on these trials give more
    worst = max(
        epsilon_lower_bound(
            false_positives=fp,
            negatives=trials,
            false_negatives=fn,
            positives=trials,
            delta=0.0,
        )[0]
        for fp in range(3)
        for fn in range(3)
    )
    assert worst == pytest.approx(ceiling)


def test_the_default_evaluation_set_cannot_see_past_2_987() -> None:
    # 150 + 150 examples, split-half: 75 + 75 held-out trials (issue 11: "caps at 2.987")
    member = np.r_[np.ones(150, bool), np.zeros(150, bool)]
    perfect = evaluate_attack(
        attack="oracle",
        scores=member.astype(float),
        decisions=member,
        is_member=member,
        delta=0.0,
        seed=0,
    )
    assert perfect.eps_lower_bound == pytest.approx(2.987, abs=5e-4)
    assert perfect.eps_lower_bound_ceiling == pytest.approx(perfect.eps_lower_bound)
    assert perfect.to_row()["eps_lower_bound_ceiling"] == perfect.eps_lower_bound_ceiling


def _bound(fp: int, fn: int, trials: int, delta: float = 0.0) -> EpsilonBound:
    eps, fpr_u, fnr_u = epsilon_lower_bound(
        false_positives=fp, negatives=trials, false_negatives=fn, positives=trials, delta=delta
    )
    return EpsilonBound(
        epsilon=eps,
        fpr_upper=fpr_u,
        fnr_upper=fnr_u,
        false_positives=fp,
        negatives=trials,
        false_negatives=fn,
        positives=trials,
        delta=delta,
        confidence=0.95,
        threshold=0.0,
        method="split-half",
        ceiling=epsilon_bound_ceiling(
            negatives=trials, positives=trials, delta=delta, confidence=0.95
        ),
    )


def test_pooled_bound_sums_the_counts_and_raises_the_ceiling() -> None:
    draws = [_bound(fp, fn, 75) for fp, fn in [(0, 20), (1, 18), (0, 25), (2, 19), (0, 22)]]
    pooled = pool_epsilon_bounds(draws)
    assert (pooled.false_positives, pooled.negatives) == (3, 375)
    assert (pooled.false_negatives, pooled.positives) == (104, 375)
    expected = epsilon_lower_bound(
        false_positives=3, negatives=375, false_negatives=104, positives=375, delta=0.0
    )[0]
    assert pooled.epsilon == pytest.approx(expected)
    assert pooled.ceiling == pytest.approx(_ceiling_by_hand(375))
    assert pooled.ceiling > max(d.ceiling for d in draws)
    assert "pooled over 5 draws" in pooled.method
    # the conservative alternative: max of per-draw bounds at 1 - 0.05 / 5 each
    bonf = pool_epsilon_bounds(draws, how="bonferroni-max")
    assert bonf.epsilon <= max(d.epsilon for d in draws)
    assert bonf.ceiling == pytest.approx(_ceiling_by_hand(75, confidence=1 - 0.05 / 5))
    with pytest.raises(ValueError, match="how='mean'"):
        pool_epsilon_bounds(draws, how="mean")
    with pytest.raises(ValueError, match="differ in delta"):
        pool_epsilon_bounds([draws[0], _bound(0, 20, 75, delta=1e-5)])


@pytest.mark.parametrize("epsilon", [1.0, 2.0])
def test_pooled_bound_keeps_its_coverage_when_draws_differ(epsilon: float) -> None:
    # Each draw is its own epsilon-DP test on the tight edge FPR + e^eps FNR = 1 (where the
    # other constraint, FNR + e^eps FPR >= 1, holds: FPR >= 1 / (1 + e^eps)), at a different
    # operating point per draw; counts are binomial. A valid 95% bound exceeds epsilon in at
    # most 5% of repetitions.
    rng = np.random.default_rng(12)
    trials, reps = 75, 1500
    corner = 1 / (1 + math.exp(epsilon))
    fprs = corner + np.array([0.0, 0.1, 0.3, 0.5, 0.8]) * (1 - corner)
    fnrs = (1 - fprs) / math.exp(epsilon)
    assert np.allclose(fprs + math.exp(epsilon) * fnrs, 1)
    assert (fnrs + math.exp(epsilon) * fprs >= 1 - 1e-12).all()
    fp = rng.binomial(trials, fprs, size=(reps, fprs.size)).sum(1)
    fn = rng.binomial(trials, fnrs, size=(reps, fnrs.size)).sum(1)
    # pool_epsilon_bounds bounds the summed counts (tested above): bound them directly
    pooled = [
        epsilon_lower_bound(
            false_positives=int(a),
            negatives=5 * trials,
            false_negatives=int(b),
            positives=5 * trials,
            delta=0.0,
        )[0]
        for a, b in zip(fp, fn, strict=True)
    ]
    assert np.mean(np.asarray(pooled) > epsilon) <= 0.05
    assert np.mean(pooled) > 0.3 * epsilon  # informative, not vacuous


def test_aggregate_reports_the_pooled_bound_and_notes_a_low_ceiling() -> None:
    member = np.r_[np.ones(150, bool), np.zeros(150, bool)]
    rng = np.random.default_rng(0)
    results = []
    for _ in range(5):
        scores = rng.normal(size=300) + 1.5 * member
        results.append(
            evaluate_attack(
                attack="a",
                scores=scores,
                decisions=scores > 0.75,
                is_member=member,
                delta=0.0,
                seed=7,
            )
        )
    (agg,) = aggregate_results(results, claimed_epsilon=5.0)
    expected = pool_epsilon_bounds([r.epsilon_bound for r in results])
    assert agg.eps_lower_bound == expected.epsilon
    assert agg.to_row()["eps_lower_bound"] == expected.epsilon  # not a mean of draws
    assert agg.eps_lower_bound != pytest.approx(np.mean([r.eps_lower_bound for r in results]))
    assert agg.eps_lower_bound_ceiling == pytest.approx(_ceiling_by_hand(375))  # 4.617 < 5
    assert any("cannot see a violation" in note and "5" in note for note in agg.notes)
    (fine,) = aggregate_results(results, claimed_epsilon=1.0)
    assert not any("cannot see a violation" in note for note in fine.notes)
    (unclaimed,) = aggregate_results(results, claimed_epsilon=math.inf)
    assert not any("cannot see a violation" in note for note in unclaimed.notes)


def test_aggregate_replaces_the_draws_ceiling_notes_by_the_pooled_one() -> None:
    member = np.r_[np.ones(150, bool), np.zeros(150, bool)]
    rng = np.random.default_rng(3)
    results = [
        evaluate_attack(
            attack="a",
            scores=rng.normal(size=300) + member,
            decisions=np.zeros(300, bool),
            is_member=member,
            delta=0.0,
            seed=1,
        )
        for _ in range(5)
    ]
    noted = [
        dataclasses.replace(r, notes=(*r.notes, ceiling_note(r.epsilon_bound, 4.0)))
        for r in results
    ]
    (agg,) = aggregate_results(noted, claimed_epsilon=4.0)  # pooled ceiling 4.617 >= 4
    assert not any("cannot see a violation" in n for n in agg.notes)
    (agg,) = aggregate_results(noted, claimed_epsilon=5.0)
    assert [n for n in agg.notes if "cannot see" in n] == [ceiling_note(agg.epsilon_bound, 5.0)]
