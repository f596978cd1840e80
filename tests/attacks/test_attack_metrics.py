"""Attack metrics against independent references: scikit-learn's ROC/AUC, scipy's exact
binomial intervals, a planted Gaussian signal with a known AUC, and the coverage of the
empirical epsilon lower bound under mechanisms whose epsilon is known exactly."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats
from sklearn import metrics as skm

from alm_opacus.attacks import (
    INTERVAL_COLUMNS,
    METRIC_COLUMNS,
    AttackResult,
    EpsilonBoundMethod,
    advantage,
    aggregate_results,
    best_threshold,
    clopper_pearson,
    epsilon_from_rates,
    epsilon_lower_bound,
    evaluate_attack,
    roc_auc,
    roc_curve,
    tpr_at_fpr,
)


def _data(seed: int, n: int = 300, ties: bool = True) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    member = rng.random(n) < 0.5
    member[:2] = [True, False]
    scores = rng.normal(size=n) + 0.7 * member
    if ties:  # rounding creates tied scores across members and non-members
        scores = np.round(scores, 1)
    return scores, member


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("ties", [True, False])
def test_roc_and_auc_match_sklearn(seed: int, ties: bool) -> None:
    scores, member = _data(seed, ties=ties)
    roc = roc_curve(scores=scores, is_member=member)
    fpr, tpr, thr = skm.roc_curve(member, scores, drop_intermediate=False)
    np.testing.assert_allclose(roc.fpr, fpr)
    np.testing.assert_allclose(roc.tpr, tpr)
    np.testing.assert_array_equal(roc.thresholds[1:], thr[1:])
    assert roc.thresholds[0] == math.inf
    assert roc_auc(roc) == pytest.approx(skm.roc_auc_score(member, scores), abs=1e-12)
    assert advantage(roc) == pytest.approx(np.max(np.abs(tpr - fpr)))
    for level in (0.001, 0.01, 0.1):
        assert tpr_at_fpr(roc, fpr=level) == pytest.approx(tpr[fpr <= level].max())


@settings(max_examples=50, deadline=None)
@given(
    st.lists(st.tuples(st.integers(-3, 3), st.booleans()), min_size=2, max_size=40).filter(
        lambda xs: len({m for _, m in xs}) == 2
    )
)
def test_auc_matches_sklearn_on_arbitrary_ties(pairs: list[tuple[int, bool]]) -> None:
    scores = np.array([float(s) for s, _ in pairs])
    member = np.array([m for _, m in pairs])
    roc = roc_curve(scores=scores, is_member=member)
    assert roc_auc(roc) == pytest.approx(skm.roc_auc_score(member, scores), abs=1e-12)


@settings(max_examples=80, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from([-1e308, -1.5, -0.0, 0.0, 0.25, 2.0, 1e308]), st.booleans()),
        min_size=2,
        max_size=60,
    ).filter(lambda xs: len({m for _, m in xs}) == 2)
)
def test_roc_and_best_threshold_on_arbitrary_ties_and_extremes(
    pairs: list[tuple[float, bool]],
) -> None:
    """The whole curve against scikit-learn, and the threshold against its definition: the
    midpoint between the score maximising TPR - FPR and the next lower score in the data."""
    scores = np.array([s for s, _ in pairs])
    member = np.array([m for _, m in pairs])
    roc = roc_curve(scores=scores, is_member=member)
    sk_fpr, sk_tpr, thr = skm.roc_curve(member, scores, drop_intermediate=False)
    np.testing.assert_array_equal(roc.fpr, sk_fpr)
    np.testing.assert_array_equal(roc.tpr, sk_tpr)
    np.testing.assert_array_equal(roc.thresholds[1:], thr[1:])
    tpr = [(member & (scores >= t)).sum() / member.sum() for t in roc.thresholds]
    fpr = [(~member & (scores >= t)).sum() / (~member).sum() for t in roc.thresholds]
    flagged = np.subtract(tpr, fpr)
    i = int(np.argmax(flagged))
    below = scores[scores < roc.thresholds[i]]
    expected = (
        math.inf if i == 0 else (roc.thresholds[i] + below.max()) / 2 if below.size else -math.inf
    )
    got = best_threshold(scores=scores, is_member=member)
    assert got == expected


@pytest.mark.parametrize("mu", [0.0, 0.5, 1.0, 2.0])
def test_planted_gaussian_signal_has_known_auc(mu: float) -> None:
    # members ~ N(mu, 1), non-members ~ N(0, 1): AUC = P(X > Y) = Phi(mu / sqrt(2))
    rng = np.random.default_rng(7)
    n = 20_000
    scores = np.r_[rng.normal(mu, 1, n), rng.normal(0, 1, n)]
    member = np.r_[np.ones(n, bool), np.zeros(n, bool)]
    roc = roc_curve(scores=scores, is_member=member)
    assert roc_auc(roc) == pytest.approx(stats.norm.cdf(mu / math.sqrt(2)), abs=0.01)
    # advantage = max_t Phi(t) - Phi(t - mu) = 2 Phi(mu / 2) - 1, at t = mu / 2
    assert advantage(roc) == pytest.approx(2 * stats.norm.cdf(mu / 2) - 1, abs=0.015)
    if mu > 0:
        assert best_threshold(scores=scores, is_member=member) == pytest.approx(mu / 2, abs=0.15)


@pytest.mark.parametrize(("k", "n"), [(0, 10), (3, 10), (10, 10), (17, 500), (250, 500)])
@pytest.mark.parametrize("confidence", [0.9, 0.95, 0.99])
def test_clopper_pearson_matches_scipy_binomtest(k: int, n: int, confidence: float) -> None:
    lo, hi = clopper_pearson(successes=k, trials=n, confidence=confidence)
    ref = stats.binomtest(k, n).proportion_ci(confidence_level=confidence, method="exact")
    assert float(lo) == pytest.approx(ref.low, abs=1e-10)
    assert float(hi) == pytest.approx(ref.high, abs=1e-10)
    # a one-sided bound at level c is the two-sided interval's end at level 2c - 1
    _, up = clopper_pearson(successes=k, trials=n, confidence=confidence, side="upper")
    two = stats.binomtest(k, n).proportion_ci(confidence_level=2 * confidence - 1, method="exact")
    assert float(up) == pytest.approx(two.high, abs=1e-10)
    if k < n:
        assert float(up) == pytest.approx(stats.beta.ppf(confidence, k + 1, n - k), abs=1e-12)


def test_epsilon_lower_bound_formula() -> None:
    fp, neg, fn, pos, delta = 12, 400, 150, 400, 1e-5
    eps, fpr_u, fnr_u = epsilon_lower_bound(
        false_positives=fp, negatives=neg, false_negatives=fn, positives=pos, delta=delta
    )
    # Bonferroni: each one-sided bound at 97.5% so both hold jointly with 95%
    assert fpr_u == pytest.approx(stats.beta.ppf(0.975, fp + 1, neg - fp))
    assert fnr_u == pytest.approx(stats.beta.ppf(0.975, fn + 1, pos - fn))
    expected = max(math.log((1 - delta - fpr_u) / fnr_u), math.log((1 - delta - fnr_u) / fpr_u))
    assert eps == pytest.approx(expected)
    assert epsilon_from_rates(fpr=0.5, fnr=0.5, delta=0.0) == 0.0
    # an e^eps-tight test recovers eps exactly from its true rates
    e = 1.3
    r = 1 / (1 + math.exp(e))
    assert float(epsilon_from_rates(fpr=r, fnr=r, delta=0.0)) == pytest.approx(e)


@pytest.mark.parametrize(("epsilon", "delta"), [(0.5, 0.0), (1.0, 0.0), (2.0, 1e-3), (4.0, 0.0)])
def test_epsilon_lower_bound_covers_a_tight_mechanism(epsilon: float, delta: float) -> None:
    # the tight (epsilon, delta) test: FPR = FNR = (1 - delta) / (1 + e^eps). A valid 95% bound
    # exceeds epsilon in at most 5% of repetitions.
    rng = np.random.default_rng(11)
    n, trials = 500, 1500
    rate = (1 - delta) / (1 + math.exp(epsilon))
    fp = rng.binomial(n, rate, trials)
    fn = rng.binomial(n, rate, trials)
    bounds = np.array(
        [
            epsilon_lower_bound(
                false_positives=int(a),
                negatives=n,
                false_negatives=int(b),
                positives=n,
                delta=delta,
            )[0]
            for a, b in zip(fp, fn, strict=True)
        ]
    )
    assert np.mean(bounds > epsilon) <= 0.05
    assert np.mean(bounds) > 0.5 * epsilon  # and the bound is informative, not vacuous


@pytest.mark.parametrize("method", list(EpsilonBoundMethod))
def test_evaluate_attack_bound_is_sound_for_randomized_response(
    method: EpsilonBoundMethod,
) -> None:
    # Each example's output is its membership bit through epsilon-randomized response: an
    # epsilon-DP per-example mechanism. The split-half selection must not inflate the bound.
    epsilon, n = 1.0, 400
    keep = math.exp(epsilon) / (1 + math.exp(epsilon))
    member = np.r_[np.ones(n, bool), np.zeros(n, bool)]
    bounds = []
    for seed in range(200):
        rng = np.random.default_rng(seed)
        bit = np.where(rng.random(2 * n) < keep, member, ~member)
        scores = bit + rng.normal(0, 0.01, 2 * n)  # a continuous score, ties broken
        result = evaluate_attack(
            attack="rr",
            scores=scores,
            decisions=bit,
            is_member=member,
            delta=0.0,
            method=method,
            seed=seed,
            interval_resamples=100,  # intervals are not under test here
        )
        bounds.append(result.eps_lower_bound)
    b = np.asarray(bounds)
    assert np.mean(b > epsilon) <= 0.05
    assert b.mean() > 0.3


def test_split_half_bound_has_few_false_alarms_without_signal() -> None:
    member = np.r_[np.ones(300, bool), np.zeros(300, bool)]
    bounds = [
        evaluate_attack(
            attack="null",
            scores=np.random.default_rng(s).normal(size=600),
            decisions=np.zeros(600, bool),
            is_member=member,
            delta=0.0,
            seed=s,
            interval_resamples=100,
        ).eps_lower_bound
        for s in range(200)
    ]
    assert np.mean(np.asarray(bounds) > 0) <= 0.05


def test_constant_scores_give_chance_and_no_epsilon() -> None:
    member = np.r_[np.ones(50, bool), np.zeros(50, bool)]
    for method in EpsilonBoundMethod:
        for decided in (True, False):
            r = evaluate_attack(
                attack="const",
                scores=np.zeros(100),
                decisions=np.full(100, decided),
                is_member=member,
                delta=1e-5,
                method=method,
            )
            assert r.mia_auc == 0.5
            assert r.mia_advantage == 0.0
            assert r.mia_accuracy == 0.5
            assert r.eps_lower_bound == 0.0


def test_result_rows_round_trip_and_aggregate() -> None:
    member = np.r_[np.ones(60, bool), np.zeros(60, bool)]
    results = []
    for s in range(3):
        scores, _ = np.random.default_rng(s).normal(size=120) + member, None
        results.append(
            evaluate_attack(
                attack="a",
                scores=scores,
                decisions=scores > 0.5,
                is_member=member,
                delta=0.0,
                seed=s,
            )
        )
    row = results[0].to_row()
    assert list(row) == ["attack", *METRIC_COLUMNS, *INTERVAL_COLUMNS]
    assert list(METRIC_COLUMNS) == [
        "mia_accuracy",
        "mia_advantage",
        "mia_auc",
        "tpr_at_fpr_0.001",
        "tpr_at_fpr_0.01",
        "eps_lower_bound",
    ]
    # 60 non-members cannot resolve an FPR of 0.1%: NaN, and a note says why
    assert math.isnan(row["tpr_at_fpr_0.001"]) and math.isnan(row["tpr_at_fpr_0.001_ci_low"])
    assert any("60 non-members" in note and "1,000" in note for note in results[0].notes)
    assert row["mia_auc_ci_low"] < row["mia_auc"] < row["mia_auc_ci_high"]
    back = AttackResult.from_dict(json.loads(json.dumps(results[0].to_dict())))
    np.testing.assert_equal(back.to_row(), row)  # assert_equal treats NaN as equal to NaN
    np.testing.assert_array_equal(back.roc.tpr, results[0].roc.tpr)
    np.testing.assert_array_equal(back.scores, results[0].scores)
    assert back.tpr_ci == results[0].tpr_ci or np.isnan(back.tpr_ci[0.001]).all()
    (agg,) = aggregate_results(results)
    aucs = np.array([r.mia_auc for r in results])
    assert agg.num_draws == 3
    assert agg.mean["mia_auc"] == pytest.approx(aucs.mean())
    assert agg.std["mia_auc"] == pytest.approx(aucs.std(ddof=1))
    agg_row = agg.to_row()
    assert agg_row["mia_auc_std"] == pytest.approx(aucs.std(ddof=1))
    assert set(INTERVAL_COLUMNS) <= set(agg_row) and set(METRIC_COLUMNS) <= set(agg_row)
    assert math.isnan(aggregate_results(results[:1])[0].std["mia_auc"])


def test_bad_inputs_name_the_value() -> None:
    member = np.array([True, False])
    with pytest.raises(ValueError, match="both members and non-members"):
        roc_curve(scores=np.zeros(2), is_member=np.array([True, True]))
    with pytest.raises(ValueError, match="NaN"):
        roc_curve(scores=np.array([0.0, np.nan]), is_member=member)
    with pytest.raises(ValueError, match="bool"):
        roc_curve(scores=np.zeros(2), is_member=np.array([1, 0]))
    with pytest.raises(ValueError, match="side='left'"):
        clopper_pearson(successes=1, trials=2, side="left")
    with pytest.raises(ValueError, match="successes=3"):
        clopper_pearson(successes=3, trials=2)
    with pytest.raises(ValueError, match=r"delta=1\.5"):
        epsilon_lower_bound(
            false_positives=0, negatives=1, false_negatives=0, positives=1, delta=1.5
        )
    with pytest.raises(ValueError, match="aggregate"):
        aggregate_results([])


def test_upper_bounds_of_repeated_counts_are_the_pointwise_bounds() -> None:
    """The split-half bound computes each distinct count's Clopper–Pearson bound once; the
    values are those of the pointwise call, bit for bit."""
    from alm_opacus.attacks.metrics import _upper_bounds

    counts = np.rint(np.sort(np.random.default_rng(0).uniform(0, 300, size=2000)))
    _, pointwise = clopper_pearson(successes=counts, trials=300, confidence=0.975, side="upper")
    np.testing.assert_array_equal(_upper_bounds(counts, 300, confidence=0.975), pointwise)
    assert _upper_bounds(np.float64(7), 300, confidence=0.975).shape == ()
    # read from a table of every count 0..n: the same values at the ends and for tiny n
    for n in (1, 2, 75, 1001):
        every = np.arange(n + 1)
        _, direct = clopper_pearson(successes=every, trials=n, confidence=0.9, side="upper")
        np.testing.assert_array_equal(_upper_bounds(every[::-1], n, confidence=0.9), direct[::-1])
    with pytest.raises(ValueError, match="expected 0 <= k <= n"):
        _upper_bounds(np.array([301.0]), 300, confidence=0.975)
    with pytest.raises(ValueError, match="expected 0 <= k <= n"):
        _upper_bounds(np.array([2.5]), 300, confidence=0.975)
