"""Membership signals, thresholds, LiRA's Gaussian machinery and the shadow masks, each
against a direct formula or scipy."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from alm_opacus.attacks import LiraLocation, ThresholdScope
from alm_opacus.attacks.lira import fit_gaussian, gaussian_logpdf, leave_one_out_fit, pooled_std
from alm_opacus.attacks.scores import (
    BLOCK_ROWS,
    confidence_score,
    correctness_score,
    entropy_score,
    in_blocks,
    logit_confidence,
    loss_score,
    modified_entropy_score,
)
from alm_opacus.attacks.shadow_data import reset_features, sized_masks
from alm_opacus.attacks.thresholds import Threshold


def _proba(seed: int, n: int = 50, c: int = 5, scale: float = 3.0) -> np.ndarray:
    logits = np.random.default_rng(seed).normal(size=(n, c)) * scale
    e = np.exp(logits - logits.max(1, keepdims=True))
    return e / e.sum(1, keepdims=True)


@pytest.mark.parametrize("seed", range(3))
def test_signals_match_their_textbook_formulas(seed: int) -> None:
    p = _proba(seed)
    y = np.random.default_rng(seed + 100).integers(0, p.shape[1], p.shape[0])
    py = p[np.arange(len(y)), y]
    np.testing.assert_allclose(loss_score(p, y), np.log(py), rtol=1e-10)
    np.testing.assert_allclose(entropy_score(p, y), np.sum(p * np.log(p), 1), rtol=1e-9)
    np.testing.assert_array_equal(correctness_score(p, y), p.argmax(1) == y)
    # Song & Mittal's Mentr, written out term by term
    mentr = -(1 - py) * np.log(py)
    for i in range(p.shape[1]):
        mentr -= np.where(y == i, 0.0, p[:, i] * np.log(1 - p[:, i]))
    np.testing.assert_allclose(modified_entropy_score(p, y), -mentr, rtol=1e-9)
    np.testing.assert_allclose(logit_confidence(p, y), np.log(py / (1 - py)), rtol=1e-8)
    # confidence is thresholded on a strictly increasing transform of p_y: same order
    np.testing.assert_array_equal(np.argsort(confidence_score(p, y)), np.argsort(py))


def test_signals_keep_confident_examples_apart() -> None:
    # p_y rounds to 1 in float64 for both rows, but their losses differ by 10 orders
    p = np.array([[1 - 1e-20, 1e-20, 0.0], [1 - 1e-30, 1e-30, 0.0]])
    y = np.array([0, 0])
    for signal in (loss_score, entropy_score, modified_entropy_score, logit_confidence):
        s = signal(p, y)
        assert np.all(np.isfinite(s))
        assert s[1] > s[0], signal.__name__
    assert logit_confidence(p, y)[0] == pytest.approx(20 * math.log(10))


def test_signals_broadcast_over_a_bank_of_heads() -> None:
    p = np.stack([_proba(0), _proba(1)])  # (B, n, C)
    y = np.random.default_rng(0).integers(0, 5, 50)
    for signal in (loss_score, entropy_score, modified_entropy_score, logit_confidence):
        out = signal(p, y)
        assert out.shape == (2, 50)
        np.testing.assert_allclose(out[1], signal(p[1], y))


def test_per_class_threshold_uses_each_class_alone() -> None:
    rng = np.random.default_rng(0)
    labels = np.repeat([0, 1], 2000)
    member = rng.random(4000) < 0.5
    # class 0 separates around 0, class 1 around 10
    scores = rng.normal(size=4000) * 0.1 + member + 10 * labels
    t = Threshold.fit(
        scores=scores,
        labels=labels,
        is_member=member,
        num_classes=3,
        scope=ThresholdScope.PER_CLASS,
    )
    assert t.per_class is not None
    assert t.per_class[0] == pytest.approx(0.5, abs=0.1)
    assert t.per_class[1] == pytest.approx(10.5, abs=0.1)
    assert t.per_class[2] == t.value  # no shadow pairs: the global threshold
    np.testing.assert_array_equal(t.apply(scores, labels), scores >= t.per_class[labels])
    g = Threshold.fit(scores=scores, labels=labels, is_member=member, num_classes=3, scope="global")
    assert g.per_class is None


def test_fit_gaussian_matches_scipy_norm_fit() -> None:
    rng = np.random.default_rng(3)
    x = rng.normal(2.0, 3.0, size=(6, 40))
    mask = rng.random((6, 40)) < 0.6
    mean, std = fit_gaussian(x, mask)
    for i in range(6):
        loc, scale = stats.norm.fit(x[i, mask[i]])
        assert mean[i] == pytest.approx(loc)
        assert std[i] == pytest.approx(scale)
    z = rng.normal(size=6)
    np.testing.assert_allclose(
        gaussian_logpdf(z, mean, std), stats.norm.logpdf(z, loc=mean, scale=std)
    )
    with pytest.raises(ValueError, match="no sample"):
        fit_gaussian(x, np.zeros_like(mask))


def test_leave_one_out_fit_matches_brute_force() -> None:
    rng = np.random.default_rng(5)
    b, n = 8, 30
    phi = rng.normal(50.0, 2.0, size=(b, n))  # a large mean tests the centring
    mask = sized_masks(b, n, size=n // 2, rng=rng)
    mean, std = leave_one_out_fit(phi, mask)
    for j in range(b):
        for i in range(n):
            others = [h for h in range(b) if h != j and mask[h, i]]
            assert mean[j, i] == pytest.approx(np.mean(phi[others, i]), rel=1e-12)
            assert std[j, i] == pytest.approx(np.std(phi[others, i]), abs=1e-9)
    # pooled within-example std: sqrt of the mean squared deviation from each example's mean
    dev = [phi[mask[:, i], i] - phi[mask[:, i], i].mean() for i in range(n)]
    assert pooled_std(phi, mask) == pytest.approx(np.sqrt(np.mean(np.concatenate(dev) ** 2)))


@pytest.mark.parametrize("b", [1, 2, 5, 16, 64])
@pytest.mark.parametrize("n,size", [(101, 50), (300, 150), (600, 150), (40, 30)])
def test_sized_masks_fix_head_sizes_and_balance_examples(b: int, n: int, size: int) -> None:
    masks = sized_masks(b, n, size=size, rng=np.random.default_rng(0))
    assert masks.shape == (b, n) and masks.dtype == np.bool_
    assert (masks.sum(1) == size).all()  # every head exactly `size` rows
    per_example = masks.sum(0)
    assert per_example.max() - per_example.min() <= 1  # examples balanced to one head
    assert per_example.sum() == b * size
    if 2 * size == n and b % 2 == 0:  # Carlini et al.'s design: in exactly half the heads
        assert (per_example == b // 2).all()


def test_sized_masks_reject_sizes_that_leave_no_out_rows() -> None:
    with pytest.raises(ValueError, match="size=10"):
        sized_masks(4, 10, size=10, rng=np.random.default_rng(0))
    with pytest.raises(ValueError, match="size=0"):
        sized_masks(4, 10, size=0, rng=np.random.default_rng(0))


def test_leave_one_out_median_matches_a_direct_loop() -> None:
    rng = np.random.default_rng(6)
    b, n = 9, 12
    phi = rng.normal(size=(b, n))
    mask = rng.random((b, n)) < 0.5
    mask[:2] = True  # every example keeps at least one head after leaving one out
    centre, _ = leave_one_out_fit(phi, mask, location=LiraLocation.MEDIAN)
    for j in range(b):
        for i in range(n):
            others = [h for h in range(b) if h != j and mask[h, i]]
            assert centre[j, i] == pytest.approx(np.median(phi[others, i]), rel=1e-12)


def test_reset_features_resets_the_asked_fraction_from_the_marginals() -> None:
    import torch

    x = torch.arange(200 * 10, dtype=torch.float64).reshape(200, 10)
    out = reset_features(x, fraction=0.2, rng=np.random.default_rng(0))
    changed = (out != x).sum(1)
    assert int(changed.max()) <= 2  # 20% of 10 features (a donor may share the value)
    assert float(changed.double().mean()) > 1.9
    # every value is the same coordinate of some pool row
    for col in range(10):
        assert set(out[:, col].tolist()) <= set(x[:, col].tolist())


@pytest.mark.parametrize(
    "signal",
    [loss_score, confidence_score, entropy_score, modified_entropy_score, correctness_score],
)
def test_a_signal_in_blocks_is_the_signal(signal) -> None:  # type: ignore[no-untyped-def]
    """Blocks of rows give the very same floats (every signal is computed row by row),
    including rows whose probabilities round to 0 and 1."""
    rows = 3 * BLOCK_ROWS + 17
    proba = _proba(3, n=rows, c=10, scale=12.0)
    proba[::7] = np.eye(10)[np.arange(rows)[::7] % 10]  # exact one-hot rows
    labels = np.random.default_rng(4).integers(0, 10, size=rows)
    np.testing.assert_array_equal(in_blocks(signal, proba, labels), signal(proba, labels))
