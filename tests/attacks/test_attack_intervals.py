"""Intervals of the attack metrics against independent references: the exact variance of the
Mann-Whitney AUC by numerical integration (Bamber 1975; Hanley & McNeil 1982, Eq. 2), a
bootstrap of the AUC, scikit-learn's AUC, the ROC-based TPR at FPR, and coverage."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import integrate, stats
from sklearn import metrics as skm

from alm_opacus.attacks import (
    aggregate_results,
    auc_interval,
    evaluate_attack,
    intervals,
    roc_curve,
    tpr_at_fpr,
    tpr_intervals,
)
from alm_opacus.attacks.intervals import (
    delong_components,
    delong_variance,
    shared_tpr_intervals,
    tpr_at_fprs,
)


def _binormal(rng: np.random.Generator, mu: float, m: int, n: int) -> tuple[np.ndarray, ...]:
    scores = np.r_[rng.normal(mu, 1, m), rng.normal(0, 1, n)]
    return scores, np.r_[np.ones(m, bool), np.zeros(n, bool)]


def _exact_auc_variance(mu: float, m: int, n: int) -> float:
    """Var of the AUC estimate for members ~ N(mu, 1), non-members ~ N(0, 1), m and n of them:
    [A(1-A) + (m-1)(Q1 - A^2) + (n-1)(Q2 - A^2)] / (mn), with Q1 = P(X1 > Y, X2 > Y) and
    Q2 = P(X > Y1, X > Y2), by quadrature."""
    a = stats.norm.cdf(mu / math.sqrt(2))
    q1 = integrate.quad(lambda y: stats.norm.pdf(y) * stats.norm.sf(y - mu) ** 2, -12, 12)[0]
    q2 = integrate.quad(lambda x: stats.norm.pdf(x - mu) * stats.norm.cdf(x) ** 2, -12, 12)[0]
    return (a * (1 - a) + (m - 1) * (q1 - a * a) + (n - 1) * (q2 - a * a)) / (m * n)


@pytest.mark.parametrize("ties", [False, True])
def test_delong_components_give_sklearns_auc(ties: bool) -> None:
    rng = np.random.default_rng(3)
    scores, member = _binormal(rng, 0.7, 80, 120)
    if ties:
        scores = np.round(scores, 1)
    v10, v01 = delong_components(scores, member)
    assert v10.mean() == pytest.approx(skm.roc_auc_score(member, scores), abs=1e-12)
    assert v01.mean() == pytest.approx(skm.roc_auc_score(member, scores), abs=1e-12)


@pytest.mark.parametrize("mu", [0.3, 1.0])
def test_delong_variance_matches_the_exact_variance_and_the_spread_over_samples(
    mu: float,
) -> None:
    m = n = 150  # the default digits evaluation set
    exact = _exact_auc_variance(mu, m, n)
    rng = np.random.default_rng(int(mu * 10))
    aucs, delong = [], []
    for _ in range(600):
        scores, member = _binormal(rng, mu, m, n)
        v10, v01 = delong_components(scores, member)
        aucs.append(v10.mean())
        delong.append(delong_variance(v10, v01))
    # 600 samples: the sample variance has relative sd sqrt(2/599) = 5.8%, so 20% is > 3 sd;
    # DeLong's estimate averages over samples to within a few % (its bias is O(1/m)).
    assert np.var(aucs, ddof=1) == pytest.approx(exact, rel=0.2)
    assert np.mean(delong) == pytest.approx(exact, rel=0.05)


def test_delong_variance_matches_a_bootstrap_of_one_sample() -> None:
    rng = np.random.default_rng(8)
    scores, member = _binormal(rng, 0.8, 150, 150)
    v10, v01 = delong_components(scores, member)
    pos, neg = scores[member], scores[~member]
    # 4,000 stratified resamples (each group within itself), all ranked at once
    resampled = np.c_[rng.choice(pos, (4000, pos.size)), rng.choice(neg, (4000, neg.size))]
    boot = delong_components(resampled, member)[0].mean(-1)
    # 4,000 resamples: relative sd of the bootstrap variance ~ sqrt(2/3999) = 2.2%; the two
    # estimators differ by O(1/m) (the bootstrap's (m-1)/m factors): 10% covers both.
    assert delong_variance(v10, v01) == pytest.approx(np.var(boot, ddof=1), rel=0.1)


def test_auc_interval_covers_the_true_auc_at_its_level() -> None:
    mu, m = 0.6, 150
    truth = stats.norm.cdf(mu / math.sqrt(2))
    rng = np.random.default_rng(21)
    hits = 0
    sims = 400
    for _ in range(sims):
        low, high = auc_interval(*_binormal(rng, mu, m, m), level=0.95)
        hits += low <= truth <= high
    # 400 simulations: binomial sd of the coverage ~1.1%; 0.95 +- 3.5 sd
    assert 0.91 <= hits / sims <= 0.99


def test_auc_interval_over_draws_covers_the_mean_over_noise() -> None:
    # Each draw shifts the members by its own mu_r ~ N(0.6, 0.15^2) (the release's noise) on
    # one shared evaluation sample; the target is the AUC averaged over the noise.
    rng = np.random.default_rng(5)
    m, draws, sims = 150, 5, 300
    grid = rng.normal(0.6, 0.15, 200_000)
    truth = float(np.mean(stats.norm.cdf(grid / math.sqrt(2))))
    hits = 0
    for _ in range(sims):
        base_pos, base_neg = rng.normal(0, 1, m), rng.normal(0, 1, m)
        mus = rng.normal(0.6, 0.15, draws)
        scores = np.stack([np.r_[base_pos + mu, base_neg] for mu in mus])
        member = np.r_[np.ones(m, bool), np.zeros(m, bool)]
        low, high = auc_interval(scores, member)
        hits += low <= truth <= high
    assert 0.91 <= hits / sims <= 1.0  # may err on the wide side, never the narrow side


@pytest.mark.parametrize("seed", range(4))
def test_vectorised_tpr_equals_the_roc_definition(seed: int) -> None:
    rng = np.random.default_rng(seed)
    scores, member = _binormal(rng, 1.0, 150, 250)
    scores = np.round(scores, 1)  # ties across members and non-members
    roc = roc_curve(scores=scores, is_member=member)
    fast = tpr_at_fprs(scores[member][None], scores[~member][None], (0.001, 0.01, 0.1, 0.5))
    for level, value in fast.items():
        assert value[0] == pytest.approx(tpr_at_fpr(roc, fpr=level), abs=1e-12), level


def test_tpr_interval_is_nan_where_the_nonmembers_cannot_resolve_the_fpr() -> None:
    scores, member = _binormal(np.random.default_rng(0), 1.0, 150, 150)
    ci = tpr_intervals(scores, member, levels=(0.001, 0.01), resamples=500, seed=0)
    assert all(math.isnan(v) for v in ci[0.001])  # 150 < 1,000 non-members
    low, high = ci[0.01]
    point = tpr_at_fpr(roc_curve(scores=scores, is_member=member), fpr=0.01)
    assert 0 <= low <= point <= high <= 1


def test_tpr_bootstrap_spread_matches_the_spread_over_samples() -> None:
    # the bootstrap's percentile interval width ~ 2 * 1.96 sd of the TPR over fresh samples
    rng = np.random.default_rng(4)
    m, level = 400, 0.05
    fresh = []
    for _ in range(400):
        scores, member = _binormal(rng, 1.5, m, m)
        fresh.append(tpr_at_fpr(roc_curve(scores=scores, is_member=member), fpr=level))
    scores, member = _binormal(rng, 1.5, m, m)
    low, high = tpr_intervals(scores, member, levels=(level,), resamples=2000, seed=1)[level]
    # the width of one bootstrap interval varies between samples by ~15%; 35% is ~2.3 sd
    assert (high - low) == pytest.approx(2 * 1.96 * np.std(fresh, ddof=1), rel=0.35)


@pytest.mark.parametrize("data_seed", range(3))
def test_bootstrap_endpoints_are_stable_across_seeds_at_the_default_size(data_seed: int) -> None:
    # The default digits evaluation set: 150 + 150, TPR steps of 1/150. With 2,000 resamples
    # the endpoints' Monte Carlo sd (over bootstrap seeds) stays near one step (measured
    # 0.5 to 1.2 steps over 8 data sets), a few % of the interval's width (~27 steps).
    scores, member = _binormal(np.random.default_rng(100 + data_seed), 1.0, 150, 150)
    ends = np.array(
        [
            tpr_intervals(scores, member, levels=(0.01,), resamples=2000, seed=s)[0.01]
            for s in range(10)
        ]
    )
    sd = ends.std(axis=0, ddof=1).max()
    assert sd < 1.6 / 150  # 10 seeds: the sd estimate itself varies by ~25%
    assert sd < 0.1 * np.mean(ends[:, 1] - ends[:, 0])


def test_intervals_over_identical_draws_equal_one_draws() -> None:
    scores, member = _binormal(np.random.default_rng(9), 0.8, 150, 150)
    one = auc_interval(scores, member)
    assert auc_interval(np.stack([scores] * 4), member) == pytest.approx(one, abs=1e-12)
    single = tpr_intervals(scores, member, levels=(0.01,), seed=3)[0.01]
    repeated = tpr_intervals(np.stack([scores] * 4), member, levels=(0.01,), seed=3)[0.01]
    assert repeated == pytest.approx(single, abs=2 / 150)  # Monte Carlo error of 2 resamplings


def test_aggregate_computes_the_intervals_a_caller_skipped() -> None:
    scores, member = _binormal(np.random.default_rng(11), 0.8, 150, 150)
    kw = {
        "attack": "a",
        "scores": scores,
        "decisions": scores > 0.4,
        "is_member": member,
        "delta": 0.0,
        "seed": 0,
    }
    full = evaluate_attack(**kw)
    bare = evaluate_attack(**kw, intervals=False)
    assert all(math.isnan(v) for v in bare.auc_ci) and bare.tpr_ci == {}
    (agg,) = aggregate_results([bare])
    assert agg.auc_ci == pytest.approx(full.auc_ci, abs=1e-12)  # DeLong: deterministic
    # the TPR bootstrap differs only by its seed: Monte Carlo error (about a step each)
    assert agg.tpr_ci[0.01] == pytest.approx(full.tpr_ci[0.01], abs=4 / 150)


@pytest.mark.parametrize(("q", "draws"), [(400, 1), (900, 3), (2000, 5)])
def test_tpr_bootstrap_equals_materialised_resamples(q: int, draws: int) -> None:
    # The counting implementation (a resample as counts per example, the threshold read off
    # each draw's ranked scores) against resamples materialised as in the definition: the
    # same random numbers give the same endpoints, ties included (to the last bits: the
    # averages are summed in another order).
    from alm_opacus.attacks.intervals import bootstrap_chunk, tpr_at_fprs, tpr_intervals

    rng = np.random.default_rng(q)
    scores = np.round(rng.standard_normal((draws, q)), 2)  # many ties
    member = rng.random(q) < 0.5
    levels, resamples = (0.001, 0.01, 0.1), 300
    got = tpr_intervals(scores, member, levels=levels, resamples=resamples, seed=7)
    pos_idx, neg_idx = np.flatnonzero(member), np.flatnonzero(~member)
    supported = tuple(lv for lv in levels if neg_idx.size * lv >= 1)
    chunk = bootstrap_chunk(pos_idx.size, neg_idx.size)
    assert (q == 400) == (chunk >= resamples)  # one chunk, and several, are both covered
    ref = np.random.default_rng(7)  # the random numbers in the function's order, per chunk
    tprs: dict[float, list[np.ndarray]] = {lv: [] for lv in supported}
    for start in range(0, resamples, chunk):
        b = min(chunk, resamples - start)
        which = ref.integers(draws, size=(b, draws)) if draws > 1 else np.zeros((b, 1), int)
        pi = pos_idx[ref.integers(pos_idx.size, size=(b, pos_idx.size))]
        ni = neg_idx[ref.integers(neg_idx.size, size=(b, neg_idx.size))]
        pos = scores[which[:, :, None], pi[:, None, :]]
        neg = scores[which[:, :, None], ni[:, None, :]]
        for lv, tpr in tpr_at_fprs(pos, neg, supported).items():
            tprs[lv].append(tpr.mean(-1))
    for lv in supported:
        low, high = np.quantile(np.concatenate(tprs[lv]), [0.025, 0.975])
        assert got[lv] == pytest.approx((low, high), rel=1e-12, abs=1e-15)
    assert all(math.isnan(v) for lv in levels if lv not in supported for v in got[lv])


def test_shared_resamples_give_each_attack_its_own_intervals() -> None:
    # the attacks of a cell share one set of resamples: each set's intervals are exactly
    # those tpr_intervals gives it alone with the same seed, whatever the other sets
    rng = np.random.default_rng(12)
    member = np.r_[np.ones(400, bool), np.zeros(400, bool)]
    sets = [rng.normal(size=(3, 800)) + mu * member for mu in (0.0, 0.5, 1.5)]
    levels = (0.001, 0.01, 0.1)
    shared = shared_tpr_intervals(sets, member, levels=levels, resamples=700, seed=5)
    for scores, got in zip(sets, shared, strict=True):
        assert got == tpr_intervals(scores, member, levels=levels, resamples=700, seed=5)
    assert shared[2][0.1][0] > shared[0][0.1][1]  # a strong attack's interval above chance's
    # chunks (5 resamples, a partial last one) read one at a time, two at a time, all at
    # once: the same resamples, the same intervals
    grouped = []
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(intervals, "CHUNK_ELEMENTS", 2_000)
        for elements in (1, 4_000, 2**30):
            patch.setattr(intervals, "GROUP_ELEMENTS", elements)
            grouped.append(shared_tpr_intervals(sets, member, levels=levels, resamples=703))
    assert grouped[0] == grouped[1] == grouped[2]
    assert all(not math.isnan(v) for lv in (0.01, 0.1) for v in grouped[0][2][lv])
    # split among threads, each drawing the same resamples: the same intervals, in order
    for threads in (2, 3, 5):
        split = shared_tpr_intervals(
            sets, member, levels=levels, resamples=700, seed=5, threads=threads
        )
        assert split == shared
    with pytest.raises(ValueError, match=r"expected one \(R, q\) shape"):
        shared_tpr_intervals([sets[0], sets[1][:2]], member, levels=levels)
