"""The banks of shadow and reference heads live only while an attack still has to read them:
the preparation fits the attacks grouped by bank, drops each bank after its last reader, and
no prepared attack keeps a bank's probabilities. None of it changes a value."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest
import torch
from torch import Tensor

from alm_opacus.attacks import (
    DEFAULT_ATTACKS,
    AttackConfig,
    AttackerKnowledge,
    AttackTarget,
    ShadowContext,
    ShadowDataSource,
    prepare_attacks,
    recipe_trainer,
    shadow_data,
)
from alm_opacus.attacks import runner as runner_module
from alm_opacus.attacks.registry import TargetQuery, parse_attack_names
from alm_opacus.attacks.shadow_data import HeadBank
from alm_opacus.heads import HeadConfig

#: the ``digits_target`` fixture (tests/attacks/conftest.py)
DigitsTarget = Callable[..., tuple[Tensor, Tensor, np.ndarray, AttackTarget]]
MEMBERS = 60
RECIPE = HeadConfig(kind="linear", steps=150, lr=0.1)
SMALL = AttackConfig(num_shadow=4, num_reference=4, attack_steps=30)


@pytest.fixture(scope="module")
def victim(digits_target: DigitsTarget) -> Iterator[tuple[AttackerKnowledge, AttackTarget]]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    x, y, perm, target = digits_target(members=MEMBERS, recipe=RECIPE)
    pool = perm[2 * MEMBERS : 4 * MEMBERS]
    trainer = recipe_trainer(config=RECIPE, num_classes=10)
    yield (
        AttackerKnowledge(features=x[pool], labels=y[pool], trainer=trainer, num_classes=10),
        target,
    )
    torch.set_num_threads(threads)


def _inputs(
    victim: tuple[AttackerKnowledge, AttackTarget],
) -> tuple[AttackerKnowledge, AttackTarget, dict[str, Any]]:
    knowledge, target = victim
    candidates = {"candidate_features": target.features, "candidate_labels": target.labels}
    return knowledge, target, candidates


ONLINE_READERS = ["lira-offline", "lira-online", "rmia-online", "rmia-offline"]


def _readers(config: AttackConfig) -> list[set[str] | None]:
    trainer = recipe_trainer(config=RECIPE, num_classes=2)
    pool = AttackerKnowledge(
        features=torch.zeros(4, 2),
        labels=torch.tensor([0, 1, 0, 1]),
        trainer=trainer,
        num_classes=2,
    )
    context = ShadowContext(knowledge=pool, config=config, seed=0)
    return [runner_module._bank_keys(k, context) for k in parse_attack_names(DEFAULT_ATTACKS)]


def test_fit_order_groups_the_readers_of_each_bank() -> None:
    names = list(DEFAULT_ATTACKS)
    # real shadow data, as many shadow heads as references: lira-offline-pool reads the shadow
    # heads, so it is fitted with them, before the online bank is trained
    order = [names[i] for i in runner_module._fit_order(_readers(SMALL))]
    assert order == [*(n for n in names if n not in ONLINE_READERS), *ONLINE_READERS]
    assert order.index("lira-offline-pool") < order.index("lira-offline")
    # other shadow data: the offline references are a bank of their own, trained after the
    # online one as in the given order
    noisy = AttackConfig(num_shadow=4, num_reference=4, shadow_data=ShadowDataSource.NOISY)
    order = [names[i] for i in runner_module._fit_order(_readers(noisy))]
    assert order[-1] == "lira-offline-pool"
    assert order[:-1] == [n for n in names if n != "lira-offline-pool"]
    # an attack whose banks are unknown (a plugin's): the given order
    assert runner_module._fit_order([{"shadow"}, None, {"online"}, {"shadow"}]) == [0, 1, 2, 3]


def test_a_bank_is_let_go_after_its_last_reader_and_no_attack_keeps_one(
    victim: tuple[AttackerKnowledge, AttackTarget], monkeypatch: pytest.MonkeyPatch
) -> None:
    knowledge, _, candidates = _inputs(victim)
    built: list[weakref.ref[HeadBank]] = []
    held_at_online: list[set[str]] = []
    train_bank = shadow_data.train_bank

    def spy(**kwargs: Any) -> HeadBank:
        bank = train_bank(**kwargs)
        built.append(weakref.ref(bank))
        return bank

    build_online = ShadowContext._build_online

    def online_spy(self: ShadowContext, c: tuple[Tensor, Tensor]) -> Any:
        held_at_online.append(set(self._banks))
        return build_online(self, c)

    monkeypatch.setattr("alm_opacus.attacks.context.train_bank", spy)
    monkeypatch.setattr(ShadowContext, "_build_online", online_spy)
    prepared = prepare_attacks(knowledge=knowledge, config=SMALL, seed=0, **candidates)
    assert len(built) == 2  # the shadow heads (offline references too) and the online ones
    assert held_at_online == [set()]  # the shadow heads were let go before
    gc.collect()
    assert all(ref() is None for ref in built)  # the prepared attacks keep no bank
    assert len(prepared.attacks) == len(DEFAULT_ATTACKS)


def test_the_fitting_order_changes_no_value(
    victim: tuple[AttackerKnowledge, AttackTarget], monkeypatch: pytest.MonkeyPatch
) -> None:
    knowledge, target, candidates = _inputs(victim)
    grouped = prepare_attacks(knowledge=knowledge, config=SMALL, seed=0, **candidates)
    monkeypatch.setattr(runner_module, "_fit_order", lambda readers: list(range(len(readers))))
    given = prepare_attacks(knowledge=knowledge, config=SMALL, seed=0, **candidates)
    assert grouped.notes == given.notes
    a, b = grouped.attack(target), given.attack(target)
    assert [r.attack for r in a] == list(DEFAULT_ATTACKS)
    for x, y in zip(a, b, strict=True):
        assert x.to_row() == y.to_row(), x.attack
        np.testing.assert_array_equal(x.scores, y.scores)


def test_offline_pool_lira_recomputes_its_references_after_an_in_place_write(
    victim: tuple[AttackerKnowledge, AttackTarget],
) -> None:
    knowledge, target, candidates = _inputs(victim)
    prepared = prepare_attacks(
        names=["lira-offline-pool"], knowledge=knowledge, config=SMALL, seed=0, **candidates
    )
    (attack,) = prepared.attacks
    features = target.features.clone()
    labels = target.labels.numpy().astype(np.int64)
    proba = target.predict(features).numpy()

    def scores(f: Tensor) -> np.ndarray:
        return attack.score(TargetQuery(proba=proba, labels=labels, features=f)).scores

    first = scores(features)
    np.testing.assert_array_equal(scores(features), first)  # memoised: the same rows
    features[:, :8] += 1.0  # an in-place write: the memo must not answer for the old rows
    moved = scores(features)
    assert not np.array_equal(moved, first)
    np.testing.assert_array_equal(moved, scores(features.clone()))
