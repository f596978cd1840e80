"""Attacks are registered by name (issue 12, item 6): a toy attack added at runtime and one
loaded from a (fake) ``alm_opacus.attacks`` entry point run through the same pipeline; the
built-in names that ``results.csv`` shows never change."""

from __future__ import annotations

import importlib.metadata
import sys
import types
from collections.abc import Iterator

import numpy as np
import pytest
import torch

from alm_opacus.attacks import (
    DEFAULT_ATTACKS,
    OPT_IN_ATTACKS,
    PLUGIN_GROUP,
    Attack,
    AttackConfig,
    AttackerKnowledge,
    AttackKind,
    AttackPluginError,
    AttackScores,
    AttackTarget,
    ShadowContext,
    TargetQuery,
    attack_class,
    available_attacks,
    best_threshold,
    prepare_attacks,
    register_attack,
)
from alm_opacus.attacks import registry as registry_module
from alm_opacus.registry import Registry

BUILTIN = [
    "shadow",
    "loss",
    "confidence",
    "entropy",
    "modified-entropy",
    "correctness",
    "lira-offline",
    "lira-online",
    "lira-offline-pool",
    "rmia-online",
    "rmia-offline",
]
OPT_IN: list[str] = []  # run when named, not by default (none today)


class MaxProbability(Attack):
    """Member iff the release's top probability reaches a threshold set on shadow heads.

    The example of ``docs/api.md`` ("Adding an attack"), word for word but the decorator."""

    threshold = 0.5

    def fit(self, context: ShadowContext) -> None:
        bank = context.shadow_bank()  # (B, n, C) probabilities of heads trained on n rows
        self.threshold = best_threshold(
            scores=bank.proba.max(-1).reshape(-1), is_member=bank.in_mask.reshape(-1)
        )

    def score(self, query: TargetQuery) -> AttackScores:
        s = query.proba.max(1)
        return AttackScores(scores=s, decisions=s >= self.threshold)


@pytest.fixture
def clean_registry() -> Iterator[None]:
    """The registries restored afterwards, with attack plugins not yet loaded."""
    with Registry.isolated(reload=[registry_module.PLUGIN_GROUP]):
        yield


def _fake_entry_points(*entries: importlib.metadata.EntryPoint):  # type: ignore[no-untyped-def]
    def entry_points(*, group: str) -> list[importlib.metadata.EntryPoint]:
        return [e for e in entries if e.group == group]

    return entry_points


def _setup() -> tuple[AttackerKnowledge, AttackTarget]:
    rng = np.random.default_rng(0)
    x = torch.from_numpy(rng.normal(size=(40, 3)))
    y = torch.from_numpy(rng.integers(0, 2, 40))

    def predict(f: torch.Tensor) -> torch.Tensor:
        return torch.softmax(torch.stack([f[:, 0], -f[:, 0]], 1) * 3, 1)

    def trainer(f: torch.Tensor, lab: torch.Tensor, masks: torch.Tensor, seed: int):  # type: ignore[no-untyped-def]
        return lambda q: predict(q).expand(masks.shape[0], -1, -1)

    k = AttackerKnowledge(features=x[:20], labels=y[:20], trainer=trainer, num_classes=2)
    target = AttackTarget(
        predict=predict,
        features=x[20:],
        labels=y[20:],
        is_member=np.r_[np.ones(10, bool), np.zeros(10, bool)],
        num_classes=2,
    )
    return k, target


def test_builtin_names_are_the_results_csv_names() -> None:
    assert [k.value for k in AttackKind] == BUILTIN
    assert list(DEFAULT_ATTACKS) == [name for name in BUILTIN if name not in OPT_IN]
    assert sorted(k.value for k in OPT_IN_ATTACKS) == sorted(OPT_IN)
    assert available_attacks()[: len(BUILTIN)] == BUILTIN
    for name in BUILTIN:
        assert attack_class(name).name == name
        assert attack_class(AttackKind(name)) is attack_class(name)


def test_a_toy_attack_registered_at_runtime_runs_like_a_builtin(clean_registry: None) -> None:
    register_attack("max-probability")(MaxProbability)
    assert available_attacks()[-1] == "max-probability"
    assert MaxProbability.name == "max-probability"
    k, target = _setup()
    prepared = prepare_attacks(
        names=["loss", "max-probability"],
        knowledge=k,
        seed=0,
        config=AttackConfig(num_shadow=4, num_reference=4),
    )
    results = prepared.attack(target, suffix="-clean")
    assert [r.attack for r in results] == ["loss-clean", "max-probability-clean"]
    assert 0.0 <= results[1].mia_auc <= 1.0
    with pytest.raises(ValueError, match="already registered"):
        register_attack("max-probability")(type("Other", (MaxProbability,), {}))
    with pytest.raises(ValueError, match="attack name 'Bad Name' is invalid"):
        register_attack("Bad Name")
    with pytest.raises(ValueError, match="expects an Attack subclass"):
        register_attack("not-an-attack")(int)  # type: ignore[type-var]


def test_entry_points_register_a_class_or_a_module(
    clean_registry: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    plugin = types.ModuleType("fake_attack_plugin")
    plugin.MaxProbability = MaxProbability  # type: ignore[attr-defined]

    def side_effect_module() -> None:  # a module that registers on import
        register_attack("module-registered")(type("ModuleAttack", (MaxProbability,), {}))

    module = types.ModuleType("fake_attack_module")
    monkeypatch.setitem(sys.modules, "fake_attack_plugin", plugin)
    monkeypatch.setitem(sys.modules, "fake_attack_module", module)
    ep_class = importlib.metadata.EntryPoint(
        name="max-probability", value="fake_attack_plugin:MaxProbability", group=PLUGIN_GROUP
    )
    ep_module = importlib.metadata.EntryPoint(
        name="whatever", value="fake_attack_module", group=PLUGIN_GROUP
    )
    other = importlib.metadata.EntryPoint(name="x", value="os", group="another.group")
    side_effect_module()  # stands in for the module's import-time registration
    monkeypatch.setattr(
        importlib.metadata, "entry_points", _fake_entry_points(ep_class, ep_module, other)
    )
    names = available_attacks()
    assert "max-probability" in names and "module-registered" in names
    assert attack_class("max-probability") is MaxProbability
    assert names[: len(BUILTIN)] == BUILTIN
    assert registry_module.load_attack_plugins() == []  # loaded once per process


def test_a_broken_plugin_is_named_in_the_error(
    clean_registry: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    broken = importlib.metadata.EntryPoint(
        name="broken", value="no_such_module_for_alm_opacus:Attack", group=PLUGIN_GROUP
    )
    wrong = importlib.metadata.EntryPoint(name="wrong", value="math:pi", group=PLUGIN_GROUP)
    monkeypatch.setattr(importlib.metadata, "entry_points", _fake_entry_points(broken))
    with pytest.raises(AttackPluginError, match=r"'broken'.*failed to load"):
        available_attacks()
    monkeypatch.setattr(importlib.metadata, "entry_points", _fake_entry_points(wrong))
    with pytest.raises(AttackPluginError, match=r"'wrong'.*expected a module or an Attack"):
        attack_class("not-registered-anywhere")


def test_unknown_names_list_the_plugins_too(clean_registry: None) -> None:
    register_attack("max-probability")(MaxProbability)
    with pytest.raises(ValueError, match=r"attack='nope' is unknown: .*'max-probability'"):
        attack_class("nope")
