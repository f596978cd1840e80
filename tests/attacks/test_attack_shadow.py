"""The shadow-model attack: its features, both classifiers, and ``auto``'s choice on held-out
shadow examples (issue 14, item 1), on an overfit digits head (raw 64-pixel features)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
import torch
from torch import Tensor

from alm_opacus.attacks import (
    AttackConfig,
    AttackerKnowledge,
    AttackTarget,
    ShadowContext,
    ShadowModel,
    recipe_trainer,
)
from alm_opacus.attacks.context import concat_pairs
from alm_opacus.attacks.metrics import roc_auc, roc_curve
from alm_opacus.attacks.registry import TargetQuery
from alm_opacus.attacks.shadow import ShadowModelAttack, Standardiser, attack_features
from alm_opacus.heads import HeadConfig

RECIPE = HeadConfig(kind="linear", steps=300, lr=0.1)
#: the ``digits_target`` fixture (tests/attacks/conftest.py)
DigitsTarget = Callable[..., tuple[Tensor, Tensor, np.ndarray, AttackTarget]]
MEMBERS = 100


@pytest.fixture(scope="module")
def setup(digits_target: DigitsTarget) -> tuple[ShadowContext, AttackTarget]:
    torch.set_num_threads(1)
    x, y, perm, target = digits_target(members=MEMBERS, recipe=RECIPE)
    pool = perm[2 * MEMBERS : 4 * MEMBERS]
    k = AttackerKnowledge(
        features=x[pool],
        labels=y[pool],
        num_classes=10,
        train_size=MEMBERS,
        trainer=recipe_trainer(config=RECIPE, num_classes=10),
    )
    context = ShadowContext(knowledge=k, config=AttackConfig(num_shadow=16), seed=0)
    return context, target


def test_features_are_log_scaled_confidence_sorted_probabilities_and_label() -> None:
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(7, 4)) * 5
    p = np.exp(logits) / np.exp(logits).sum(1, keepdims=True)
    y = rng.integers(0, 4, 7)
    f = attack_features(p, y)
    py = p[np.arange(7), y]
    np.testing.assert_allclose(f[:, 0], np.log(py / (1 - py)), rtol=1e-8)
    np.testing.assert_allclose(f[:, 1], np.log(py), rtol=1e-10)
    np.testing.assert_allclose(f[:, 2:6], np.log(np.sort(p, 1)[:, ::-1]), rtol=1e-12)
    np.testing.assert_array_equal(f[:, 6:], np.eye(4)[y])
    # near p_y = 1 the features still tell 1 - 1e-6 from 1 - 1e-3 apart (raw p_y cannot)
    sure = np.array([[1 - 1e-6, 1e-6, 0, 0], [1 - 1e-3, 1e-3, 0, 0]])
    g = attack_features(sure, np.zeros(2, np.int64))
    assert g[0, 0] - g[1, 0] == pytest.approx(np.log(1e3), rel=1e-3)
    z = Standardiser.fit(f)(f)
    np.testing.assert_allclose(z[:, :6].mean(0), 0, atol=1e-12)


def test_features_in_row_blocks_are_the_whole_array_formula_bit_for_bit(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The features are computed in row blocks (bounded temporaries at 10^5 members) and the
    standardisation of the shadow pairs runs in place: both must give the values of the plain
    whole-array expressions exactly, block edges included."""
    from alm_opacus.attacks import shadow
    from alm_opacus.attacks.scores import logit_confidence, loss_score

    monkeypatch.setattr(shadow, "_ROWS_PER_BLOCK", 64)  # 1000 rows: 16 blocks, a partial one
    rng = np.random.default_rng(3)
    logits = rng.normal(size=(1000, 5)) * rng.uniform(0, 40, size=(1000, 1))
    p = np.exp(logits - logits.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    p[::9, 2] = 0.0  # log of a clipped zero
    y = rng.integers(0, 5, 1000)
    whole = np.concatenate(
        [
            logit_confidence(p, y)[:, None],
            loss_score(p, y)[:, None],
            np.log(np.clip(-np.sort(-p, axis=-1), np.finfo(np.float64).tiny, None)),
            np.eye(5)[y],
        ],
        axis=1,
    )
    f = attack_features(p, y)
    assert f.tobytes() == whole.tobytes()
    scaler = Standardiser.fit(f)
    assert scaler.mean.tobytes() == f.mean(0).tobytes()  # one block: numpy's own, exactly
    spread = f.std(0)
    assert scaler.scale.tobytes() == np.where(spread > 0, spread, 1.0).tobytes()
    monkeypatch.setattr(shadow, "_STATS_ROWS", 64)  # blocks: the same up to rounding
    blocked = Standardiser.fit(f)
    np.testing.assert_allclose(blocked.mean, scaler.mean, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(blocked.scale, scaler.scale, rtol=1e-12)
    copy = scaler(f)
    assert scaler(f, in_place=True) is f
    assert f.tobytes() == copy.tobytes()


def test_the_picked_rows_alone_are_the_whole_arrays_rows_bit_for_bit(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Past _WHOLE_BYTES the features of every shadow pair are never held: two passes over
    the blocks of Standardiser.fit give its statistics, and only the picked rows are kept.
    Both must be exactly what the whole array gives (blocks of 64 rows, a partial last one;
    rows in any order, some blocks without a picked row)."""
    from alm_opacus.attacks import shadow

    monkeypatch.setattr(shadow, "_STATS_ROWS", 64)
    rng = np.random.default_rng(7)
    logits = rng.normal(size=(1000, 4)) * rng.uniform(0, 30, size=(1000, 1))
    p = np.exp(logits - logits.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    y = rng.integers(0, 4, 1000)
    rows = rng.permutation(np.r_[0:100, 300:1000])[:500]
    whole = attack_features(p, y)
    scaler = Standardiser.fit(whole)
    expected = scaler(whole)[rows]
    monkeypatch.setattr(shadow, "_WHOLE_BYTES", 0)
    streamed, x = shadow.fitted_rows(p, y, rows)
    assert streamed.mean.tobytes() == scaler.mean.tobytes()
    assert streamed.scale.tobytes() == scaler.scale.tobytes()
    assert x.tobytes() == expected.tobytes()
    monkeypatch.setattr(shadow, "_WHOLE_BYTES", 1 << 40)
    small, x_small = shadow.fitted_rows(p, y, rows)
    assert small.mean.tobytes() == scaler.mean.tobytes()
    assert x_small.tobytes() == expected.tobytes()


def test_boosting_on_the_picked_rows_scores_as_on_the_whole_array(
    setup: tuple[ShadowContext, AttackTarget], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The streamed features train the same classifier: the same scores, bit for bit."""
    from alm_opacus.attacks import shadow

    context, target = setup
    context.config = AttackConfig(num_shadow=16, shadow_model=ShadowModel.GBM)
    monkeypatch.setattr(shadow, "_STATS_ROWS", 512)  # 3,200 pairs: 7 blocks
    query = TargetQuery(
        proba=target.predict(target.features).double().numpy(),
        labels=target.labels.numpy().astype(np.int64),
        features=target.features,
    )
    scores = []
    for limit in (1 << 40, 0):
        monkeypatch.setattr(shadow, "_WHOLE_BYTES", limit)
        attack = ShadowModelAttack(config=context.config, seed=0)
        attack.fit(context)
        scores.append(attack.score(query).scores)
    assert scores[0].tobytes() == scores[1].tobytes()
    assert np.unique(scores[0]).size > 10  # a fitted classifier, not a constant


def _auc(attack: ShadowModelAttack, target: AttackTarget) -> float:
    query = TargetQuery(
        proba=target.predict(target.features).double().numpy(),
        labels=target.labels.numpy().astype(np.int64),
        features=target.features,
    )
    return roc_auc(roc_curve(scores=attack.score(query).scores, is_member=target.is_member))


@pytest.mark.slow
@pytest.mark.parametrize("model", [ShadowModel.MLP, ShadowModel.GBM])
@pytest.mark.parametrize("per_class", [False, True])
def test_both_classifiers_find_an_overfit_head(
    setup: tuple[ShadowContext, AttackTarget], model: ShadowModel, per_class: bool
) -> None:
    context, target = setup
    config = AttackConfig(
        num_shadow=16, shadow_model=model, attack_steps=300, shadow_per_class=per_class
    )
    context.config = config
    attack = ShadowModelAttack(config=config, seed=0)
    attack.fit(context)
    assert attack.chosen is model
    assert _auc(attack, target) > 0.6
    # the standardiser is the shadow pairs' own: z-scores of the shadow features
    proba, labels, _ = concat_pairs(context.shadow_bank())
    assert attack.standardise is not None
    np.testing.assert_allclose(attack.standardise.mean, attack_features(proba, labels).mean(0))


@pytest.mark.slow
def test_auto_keeps_the_classifier_with_the_larger_held_out_auc(
    setup: tuple[ShadowContext, AttackTarget],
) -> None:
    context, _ = setup
    config = AttackConfig(num_shadow=16, shadow_model="auto", attack_steps=300)  # type: ignore[arg-type]
    context.config = config
    attack = ShadowModelAttack(config=config, seed=0)
    attack.fit(context)
    assert attack.held_out_auc is not None and set(attack.held_out_auc) == {"mlp", "gbm"}
    best = max(attack.held_out_auc, key=attack.held_out_auc.__getitem__)
    assert attack.chosen is ShadowModel(best)
    assert any(f"chose {best!r}" in note for note in attack.notes)
    assert all(0.5 < auc < 1.0 for auc in attack.held_out_auc.values())


def test_boosting_takes_every_pair_up_to_its_cap_and_says_when_the_cap_binds(
    setup: tuple[ShadowContext, AttackTarget], monkeypatch: pytest.MonkeyPatch
) -> None:
    """16 heads on 200 pool rows: 3,200 pairs, half in. Under the cap boosting gets them all
    and nothing is said; a cap below that takes that many, balanced, and a note says so."""
    from alm_opacus.attacks import shadow

    context, _ = setup
    context.config = AttackConfig(num_shadow=16, shadow_model=ShadowModel.GBM)
    assert shadow.pair_count(context.config, ShadowModel.GBM) == shadow.GBM_PAIRS == 2**19
    seen: list[list[np.ndarray]] = []

    def record(x, y, picks, *, config, seed):  # type: ignore[no-untyped-def]
        assert len(x) == len(y) == sum(p.size for p in picks)  # the picked pairs only
        seen.append([y[p] for p in picks])
        return [lambda z: np.zeros(len(z))]

    monkeypatch.setitem(shadow._FITTERS, ShadowModel.GBM, record)
    quiet = ShadowModelAttack(config=context.config, seed=0)
    quiet.fit(context)
    _, _, is_member = concat_pairs(context.shadow_bank())
    assert is_member.size == 3200 and is_member.sum() == 1600
    assert [p.size for p in seen[0]] == [3200] and quiet.notes == ()
    monkeypatch.setitem(shadow._DEFAULT_PAIRS, ShadowModel.GBM, 1000)
    capped = ShadowModelAttack(config=context.config, seed=0)
    capped.fit(context)
    (pick,) = seen[1]
    assert pick.size == 1000 and pick.sum() == 500
    assert capped.notes == (
        "attack model trained on 1,000 balanced pairs in total of the 3,200 the shadow heads "
        "give: 'gbm' takes at most 1,000 unless attack_pairs is set",
    )
    # one model per class: the cap is each class's, the note counts totals on both sides
    context.config = AttackConfig(
        num_shadow=16, shadow_model=ShadowModel.GBM, shadow_per_class=True
    )
    monkeypatch.setitem(shadow._DEFAULT_PAIRS, ShadowModel.GBM, 100)
    per_class = ShadowModelAttack(config=context.config, seed=0)
    per_class.fit(context)
    _, labels, _ = concat_pairs(context.shadow_bank())
    held = sum(
        2 * min(is_member[labels == k].sum(), (~is_member[labels == k]).sum()) for k in range(10)
    )
    assert [p.size for p in seen[2]] == [100] * 10
    assert per_class.notes == (
        f"attack model trained on 1,000 balanced pairs over the classes of the {held:,} the "
        "shadow heads give: 'gbm' takes at most 100 per class unless attack_pairs is set",
    )


def test_config_rejects_an_unknown_shadow_model() -> None:
    with pytest.raises(ValueError, match=r"shadow_model='svm' is invalid: expected one of"):
        AttackConfig(shadow_model="svm")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="attack_pairs=1"):
        AttackConfig(attack_pairs=1)
