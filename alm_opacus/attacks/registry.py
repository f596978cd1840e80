"""The attack interface, the name -> class registry, and the shadow-side context attacks fit on.

An attack is fitted once on a :class:`ShadowContext` (the attacker's pool, its trainer, and
the banks of shadow/reference heads trained lazily from them) and then scores any number of
releases through :class:`TargetQuery`. ``fit`` has no access to a target's membership.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import ClassVar, TypeVar

import numpy as np
import numpy.typing as npt
import torch
from torch import Tensor

from alm_opacus.attacks.base import (
    AttackConfig,
    AttackerKnowledge,
    AttackKind,
    BoolArray,
    FloatArray,
    Predictor,
    ShadowDataSource,
)
from alm_opacus.attacks.shadow_data import (
    HeadBank,
    SynthesisConfig,
    default_k_max,
    reset_features,
    subseed,
    synthesize,
    train_bank,
)


@dataclass(frozen=True)
class TargetQuery:
    """What an attack sees of one release: its probabilities on the evaluation examples.

    Attributes:
        proba: (q, C) the release's output probabilities (queried once).
        labels: (q,) the examples' labels.
        features: (q, d) the examples' features (to query the attacker's own reference heads).
    """

    proba: FloatArray
    labels: npt.NDArray[np.int64]
    features: Tensor


@dataclass(frozen=True)
class AttackScores:
    """An attack's output on one release.

    Attributes:
        scores: (q,) threshold-free scores, larger = more member-like.
        decisions: (q,) guesses at the threshold chosen on shadow data.
    """

    scores: FloatArray
    decisions: BoolArray


class ShadowContext:
    """The attacker's side: pool, trainer, and banks of heads trained on first use.

    Banks are cached, so attacks that share one (all metric attacks and the shadow-model
    attack share the shadow bank) train it once.

    Args:
        knowledge: the attacker's pool and trainer.
        config: the attack configuration.
        seed: the attacker's seed.
        candidates: ``(features, labels)`` of the examples whose membership will be asked,
            without their membership; needed only by online LiRA.
        oracle: the release's predictor; needed only for synthetic shadow data (Shokri's
            Algorithm 1 queries the target).
    """

    def __init__(
        self,
        *,
        knowledge: AttackerKnowledge,
        config: AttackConfig,
        seed: int,
        candidates: tuple[Tensor, Tensor] | None = None,
        oracle: Predictor | None = None,
    ) -> None:
        self.knowledge = knowledge
        self.config = config
        self.seed = int(seed)
        self.candidates = candidates
        self.oracle = oracle
        self.notes: list[str] = []
        self.queried_oracle = False
        self._banks: dict[str, HeadBank] = {}

    @property
    def num_classes(self) -> int:
        return self.knowledge.num_classes

    def _bank(self, key: str, build: Callable[[], HeadBank]) -> HeadBank:
        if key not in self._banks:
            self._banks[key] = build()
        return self._banks[key]

    def _train(self, features: Tensor, labels: Tensor, num_heads: int, tag: str) -> HeadBank:
        return train_bank(
            features=features,
            labels=labels,
            num_heads=num_heads,
            trainer=self.knowledge.trainer,
            heads_per_seed=self.config.heads_per_seed,
            seed=subseed(self.seed, tag),
        )

    def shadow_bank(self) -> HeadBank:
        """``num_shadow`` heads on halves of the shadow data (real, noisy or synthetic)."""
        return self._bank("shadow", self._build_shadow)

    def offline_bank(self) -> HeadBank:
        """``num_reference`` heads on halves of the real pool: all are *out* for candidates."""
        cfg = self.config
        if cfg.shadow_data is ShadowDataSource.REAL and cfg.num_shadow == cfg.num_reference:
            return self.shadow_bank()  # the same heads: same data, count and seed tag
        k = self.knowledge
        return self._bank(
            "offline", lambda: self._train(k.features, k.labels, cfg.num_reference, "real")
        )

    def online_bank(self) -> tuple[HeadBank, int]:
        """``num_reference`` heads on halves of pool + candidates; returns (bank, pool size).

        Raises:
            ValueError: if no candidates were given.
        """
        if self.candidates is None:
            raise ValueError(
                "lira-online needs the candidate examples (features, labels) at preparation: "
                "pass candidate_features and candidate_labels to prepare_attacks"
            )
        k = self.knowledge
        feats = torch.cat([k.features, self.candidates[0].to(k.features)])
        labels = torch.cat([k.labels, self.candidates[1].to(k.labels)])
        bank = self._bank(
            "online", lambda: self._train(feats, labels, self.config.num_reference, "online")
        )
        return bank, int(k.features.shape[0])

    def _build_shadow(self) -> HeadBank:
        cfg, k = self.config, self.knowledge
        source = cfg.shadow_data
        if source is ShadowDataSource.REAL:
            feats, labels = k.features, k.labels
        elif source is ShadowDataSource.NOISY:
            rng = np.random.default_rng(subseed(self.seed, "noisy"))
            feats = reset_features(k.features, fraction=cfg.noise_fraction, rng=rng)
            labels = k.labels
            self.notes.append(
                f"shadow data 'noisy': the pool with {cfg.noise_fraction:.0%} of features reset"
            )
        else:
            feats, labels = self._synthesize()
        tag = "real" if source is ShadowDataSource.REAL else f"shadow-{source.value}"
        return self._train(feats, labels, cfg.num_shadow, tag)

    def _synthesize(self) -> tuple[Tensor, Tensor]:
        cfg, k = self.config, self.knowledge
        if self.oracle is None:
            raise ValueError(
                "shadow_data='synthetic' queries the target (Shokri et al. 2017, Algorithm 1): "
                "pass oracle=<the release's predict> to prepare_attacks"
            )
        d = int(k.features.shape[1])
        synth = SynthesisConfig(
            per_class=cfg.synth_per_class,
            k_max=min(d, cfg.synth_k_max or default_k_max(d)),
            k_min=min(d, cfg.synth_k_min),
            conf_min=cfg.synth_conf_min,
            rej_max=cfg.synth_rej_max,
            iter_max=cfg.synth_iter_max,
        )
        self.queried_oracle = True
        feats, labels, queries = synthesize(
            oracle=self.oracle,
            marginals=k.features,
            num_classes=self.num_classes,
            config=synth,
            rng=np.random.default_rng(subseed(self.seed, "synthesize")),
        )
        wanted = synth.per_class * self.num_classes
        if feats.shape[0] < 4:
            raise ValueError(
                f"hill climbing synthesised {feats.shape[0]} of {wanted} records in "
                f"{synth.iter_max} iterations; lower synth_conf_min or raise synth_iter_max"
            )
        self.notes.append(
            f"shadow data 'synthetic': {feats.shape[0]} of {wanted} records synthesised with "
            f"{queries} target queries"
        )
        return feats.to(k.features), labels.to(k.labels)


class Attack(abc.ABC):
    """A membership-inference attack: fitted on shadow data, then scores releases.

    Args:
        config: the attack configuration.
        seed: the attack's own seed.
    """

    kind: ClassVar[AttackKind]

    def __init__(self, *, config: AttackConfig, seed: int) -> None:
        self.config = config
        self.seed = int(seed)
        self.notes: tuple[str, ...] = ()

    @property
    def name(self) -> str:
        return self.kind.value

    @abc.abstractmethod
    def fit(self, context: ShadowContext) -> None:
        """Train whatever the attack needs on shadow data; never sees a target's membership."""

    @abc.abstractmethod
    def score(self, query: TargetQuery) -> AttackScores:
        """Scores and decisions for one release."""


_A = TypeVar("_A", bound=type[Attack])
_ATTACKS: dict[AttackKind, type[Attack]] = {}


def register_attack(kind: AttackKind | str, *, force: bool = False) -> Callable[[_A], _A]:
    """Class decorator registering an :class:`Attack` under ``kind``.

    Raises:
        ValueError: if ``kind`` is already registered and ``force`` is false.
    """
    key = AttackKind(kind)

    def decorator(cls: _A) -> _A:
        if key in _ATTACKS and not force:
            raise ValueError(f"attack {key.value!r} is already registered; pass force=True")
        cls.kind = key
        _ATTACKS[key] = cls
        return cls

    return decorator


def available_attacks() -> list[str]:
    """Names of the registered attacks, in :class:`AttackKind` order."""
    return [k.value for k in AttackKind if k in _ATTACKS]


def attack_class(name: str | AttackKind) -> type[Attack]:
    """The class registered under ``name``.

    Raises:
        ValueError: naming the unknown attack and listing the registered ones.
    """
    try:
        return _ATTACKS[AttackKind(name)]
    except (ValueError, KeyError):
        raise ValueError(
            f"attack={name!r} is unknown: expected one of {available_attacks()}"
        ) from None


def parse_attack_names(names: Sequence[str | AttackKind]) -> list[AttackKind]:
    """Validate a list of attack names (non-empty, registered, no repeats).

    Raises:
        ValueError: on an empty list, an unknown name or a repeated one.
    """
    if isinstance(names, str) or not names:
        raise ValueError(f"names={names!r} is invalid: expected a non-empty list of attack names")
    kinds = [attack_class(n).kind for n in names]
    if len(set(kinds)) != len(kinds):
        raise ValueError(f"names={list(names)!r} repeats an attack")
    return kinds


def concat_pairs(bank: HeadBank) -> tuple[FloatArray, npt.NDArray[np.int64], BoolArray]:
    """A bank as flat shadow pairs: (B*n, C) probabilities, (B*n,) labels, (B*n,) in/out."""
    b, n, c = bank.proba.shape
    labels = np.tile(bank.labels.cpu().numpy().astype(np.int64), b)
    return bank.proba.reshape(b * n, c), labels, bank.in_mask.reshape(-1)
