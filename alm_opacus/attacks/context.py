"""The attacker's side that attacks are fitted on: pool, trainer, and banks of heads.

Banks are trained on first use and cached, so attacks that share one (the metric attacks, the
shadow-model attack and offline LiRA share the pool bank) train it once. Every head of a bank
trains on as many rows as the victim (``AttackerKnowledge.train_size``), as far as the data
allows (the notes say when it does not).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import numpy.typing as npt
import torch
from torch import Tensor

from alm_opacus.attacks.base import (
    AttackConfig,
    AttackerKnowledge,
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
    sized_masks,
    subseed,
    synthesize,
    train_bank,
)
from alm_opacus.unit_map import UnitMap, serial_map


class ShadowContext:
    """The attacker's side: pool, trainer, and banks of heads trained on first use.

    Args:
        knowledge: the attacker's pool and trainer.
        config: the attack configuration.
        seed: the attacker's seed.
        candidates: ``(features, labels)`` of the examples whose membership will be asked,
            without their membership; needed by the attacks on the online bank (LiRA and
            RMIA, except ``lira-offline-pool``).
        oracle: the release's predictor; needed only for synthetic shadow data (Shokri's
            Algorithm 1 queries the target).
        map_units: runs the chunks of each bank (default: in this process, in order).
    """

    def __init__(
        self,
        *,
        knowledge: AttackerKnowledge,
        config: AttackConfig,
        seed: int,
        candidates: tuple[Tensor, Tensor] | None = None,
        oracle: Predictor | None = None,
        map_units: UnitMap = serial_map,
    ) -> None:
        self.knowledge = knowledge
        self.map_units = map_units
        self.config = config
        self.seed = int(seed)
        self.candidates = candidates
        self.oracle = oracle
        self.notes: list[str] = []
        self.queried_oracle = False
        self._banks: dict[str, HeadBank] = {}
        self._online: tuple[HeadBank, int] | None = None

    @property
    def num_classes(self) -> int:
        return self.knowledge.num_classes

    @property
    def train_size(self) -> int:
        """``n``: rows the victim trained on (default: half the pool)."""
        k = self.knowledge
        return k.train_size if k.train_size is not None else int(k.features.shape[0]) // 2

    def _bank(self, key: str, build: Callable[[], HeadBank]) -> HeadBank:
        if key not in self._banks:
            self._banks[key] = build()
        return self._banks[key]

    def _train(self, features: Tensor, labels: Tensor, masks: BoolArray, tag: str) -> HeadBank:
        return train_bank(
            features=features,
            labels=labels,
            masks=masks,
            trainer=self.knowledge.trainer,
            heads_per_seed=self.config.heads_per_seed,
            seed=subseed(self.seed, tag),
            map_units=self.map_units,
        )

    def _half_masks(self, num_heads: int, num_rows: int, tag: str, what: str) -> BoolArray:
        """Heads of ``min(n, rows // 2)`` rows each, every row in (about) half of them."""
        size = min(self.train_size, num_rows // 2)
        if size < self.train_size:
            self.notes.append(
                f"{what} heads train on {size} rows, fewer than the victim's "
                f"{self.train_size}: the data holds {num_rows} rows"
            )
        rng = np.random.default_rng(subseed(self.seed, f"{tag}-masks"))
        return sized_masks(num_heads, num_rows, size=max(size, 1), rng=rng)

    def bank_key(self, role: str) -> str:
        """The bank an :attr:`Attack.banks <alm_opacus.attacks.registry.Attack.banks>` role
        reads: the offline references are the shadow heads when their data, count and seed
        tag agree (:meth:`offline_bank`)."""
        cfg = self.config
        shared = cfg.shadow_data is ShadowDataSource.REAL and cfg.num_shadow == cfg.num_reference
        return "shadow" if role == "offline" and shared else role

    def release_banks(self, *, keep: set[str]) -> None:
        """Drop the banks (by :meth:`bank_key`) outside ``keep``: each holds its heads'
        (B, n, C) probabilities, 512 MB at 5*10^4 members. Asked again, one is trained again."""
        for key in set(self._banks) - keep:
            del self._banks[key]
        if "online" not in keep:
            self._online = None

    def shadow_bank(self) -> HeadBank:
        """``num_shadow`` heads on halves of the shadow data (real, noisy or synthetic)."""
        return self._bank("shadow", self._build_shadow)

    def offline_bank(self) -> HeadBank:
        """``num_reference`` heads on halves of the real pool: all are *out* for candidates."""
        cfg = self.config
        if self.bank_key("offline") == "shadow":
            return self.shadow_bank()  # the same heads: same data, count and seed tag
        k = self.knowledge

        def build() -> HeadBank:
            masks = self._half_masks(cfg.num_reference, k.features.shape[0], "real", "reference")
            return self._train(k.features, k.labels, masks, "real")

        return self._bank("offline", build)

    def online_bank(self) -> tuple[HeadBank, int]:
        """``num_reference`` heads, each on ``n`` rows of candidates (+ pool when needed).

        Each head takes ``min(n, q // 2)`` of the ``q`` candidates, so that every candidate
        is *in* for (about) half of the heads, as the victim's members are half of the
        balanced evaluation set; the rest of its ``n`` rows, if any, come from the pool.

        Returns:
            ``(bank, pool_rows)``: the bank's rows are ``pool_rows`` pool rows (possibly 0),
            then the candidates.

        Raises:
            ValueError: if no candidates were given, or too few heads to give every
                candidate an *in* and an *out* reference.
        """
        if self.candidates is None:
            raise ValueError(
                "LiRA and RMIA (lira-online, lira-offline, rmia-online, rmia-offline) need the "
                "candidate examples (features, labels) at preparation: "
                "pass candidate_features and candidate_labels to prepare_attacks"
            )
        if self._online is None:
            self._online = self._build_online(self.candidates)
        return self._online

    def candidate_features(self) -> Tensor:
        """The candidates' features: the online bank's rows after its pool rows, the same
        values, but not a view into the bank, whose pool and candidates are one concatenation
        (an attack that kept such a view kept both alive: 800 MB at 5*10^4 members).

        Raises:
            ValueError: as :meth:`online_bank`, without candidates.
        """
        self.online_bank()
        assert self.candidates is not None
        return self.candidates[0].to(self.knowledge.features)

    def _build_online(self, candidates: tuple[Tensor, Tensor]) -> tuple[HeadBank, int]:
        k, heads = self.knowledge, self.config.num_reference
        q, n_pool = int(candidates[0].shape[0]), int(k.features.shape[0])
        n = self.train_size
        from_candidates = min(n, q // 2)
        from_pool = min(n - from_candidates, n_pool // 2)
        if heads * from_candidates < 2 * q:
            raise ValueError(
                f"num_reference={heads} heads of {from_candidates} candidates leave some of "
                f"the {q} candidates without an in-reference: raise num_reference"
            )
        rng = np.random.default_rng(subseed(self.seed, "online-masks"))
        parts = [sized_masks(heads, q, size=from_candidates, rng=rng)]
        feats, labels = candidates[0].to(k.features), candidates[1].to(k.labels)
        if from_pool > 0:
            parts.insert(0, sized_masks(heads, n_pool, size=from_pool, rng=rng))
            feats, labels = torch.cat([k.features, feats]), torch.cat([k.labels, labels])
        if from_candidates + from_pool < n:
            self.notes.append(
                f"online reference heads train on {from_candidates + from_pool} rows, fewer "
                f"than the victim's {n}"
            )
        bank = self._train(feats, labels, np.concatenate(parts, axis=1), "online")
        return bank, (n_pool if from_pool > 0 else 0)

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
        masks = self._half_masks(cfg.num_shadow, feats.shape[0], tag, "shadow")
        return self._train(feats, labels, masks, tag)

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


def concat_pairs(bank: HeadBank) -> tuple[FloatArray, npt.NDArray[np.int64], BoolArray]:
    """A bank as flat shadow pairs: (B*n, C) probabilities, (B*n,) labels, (B*n,) in/out."""
    b, n, c = bank.proba.shape
    labels = np.tile(bank.labels.cpu().numpy().astype(np.int64), b)
    return bank.proba.reshape(b * n, c), labels, bank.in_mask.reshape(-1)
