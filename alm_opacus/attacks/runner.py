"""Prepare the attacks once on the attacker's side, then attack many releases.

``prepare_attacks`` trains the shadow/reference banks and fits every attack (thresholds, the
attack MLP, LiRA's Gaussians) without any target; the :class:`PreparedAttacks` it returns
then scores each release with one black-box query of the evaluation examples. Re-prepare
when the attacker's trainer changes (the adaptive attacker's protection, its epsilon).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

# importing the attack modules fills the registry
from alm_opacus.attacks import lira as _lira  # noqa: F401
from alm_opacus.attacks import metric_attacks as _metric_attacks  # noqa: F401
from alm_opacus.attacks import rmia as _rmia  # noqa: F401
from alm_opacus.attacks import shadow as _shadow  # noqa: F401
from alm_opacus.attacks.aggregate import ceiling_note
from alm_opacus.attacks.base import (
    OPT_IN_ATTACKS,
    AttackConfig,
    AttackerKnowledge,
    AttackKind,
    AttackTarget,
    Predictor,
    ShadowDataSource,
)
from alm_opacus.attacks.context import ShadowContext
from alm_opacus.attacks.metrics import evaluate_attack
from alm_opacus.attacks.registry import Attack, TargetQuery, parse_attack_names
from alm_opacus.attacks.results import AttackResult
from alm_opacus.attacks.shadow_data import subseed, to_numpy
from alm_opacus.unit_map import UnitMap, runs_here, serial_map, with_callers_threads

DEFAULT_ATTACKS: tuple[str, ...] = tuple(k.value for k in AttackKind if k not in OPT_IN_ATTACKS)
"""The built-in attacks but the opt-in ones (``base.OPT_IN_ATTACKS``, run when named);
``available_attacks()`` lists those and the registered plugins too."""

CLEAN_SUFFIX = "-clean"
"""Suffix of the rows of the clean-reference attacker (shadow and reference heads trained
without protection), beside the noise-aware attacker's unsuffixed rows."""


@dataclass(frozen=True)
class PreparedAttacks:
    """Fitted attacks, independent of any target release.

    Attributes:
        attacks: the fitted attacks, in the order asked.
        config: the configuration they were fitted with.
        seed: the attacker's seed.
        num_classes: ``C``.
        notes: caveats of the preparation (shadow data source, synthesis counts).
        prepare_seconds: time spent training banks and fitting.
        bound_to_release: true when shadow data was synthesised by querying one release
            (``SYNTHETIC``); then the object belongs to that release only.
    """

    attacks: tuple[Attack, ...]
    config: AttackConfig
    seed: int
    num_classes: int
    notes: tuple[str, ...]
    prepare_seconds: float
    bound_to_release: bool = False

    @property
    def names(self) -> list[str]:
        return [a.name for a in self.attacks]

    def attack(
        self, target: AttackTarget, *, suffix: str = "", intervals: bool = True
    ) -> list[AttackResult]:
        """Attack one release (its noise drawn once) with every prepared attack.

        Args:
            target: the release and its balanced evaluation set.
            suffix: appended to every result's ``attack`` name, to tell attackers apart in
                one table (e.g. :data:`CLEAN_SUFFIX` for attacks prepared against the
                unprotected head, reused on a protected release). The split of the
                split-half bound and the bootstrap depend on the attack, not the suffix, so
                two attackers are compared on the same halves.
            intervals: compute each result's intervals. A caller that passes the results to
                ``aggregate_results`` (the harness) may pass ``False``: the aggregate computes
                them from the results' scores, over all draws at once.

        Returns:
            One :class:`AttackResult` per attack, in order, but for the attacks that query the
            release on their own rows (``Attack.queries_release``) when it is queried with
            other inputs than features (``target.inputs``): those are left out. ``seconds``
            is the attack's own time plus its share of the single query of the release.

        Raises:
            ValueError: if the release's output has the wrong shape or is not a distribution,
                or the number of classes differs from the preparation's.
        """
        if target.num_classes != self.num_classes:
            raise ValueError(
                f"target.num_classes={target.num_classes!r} but the attacks were prepared "
                f"for {self.num_classes} classes"
            )
        start = time.perf_counter()
        with torch.no_grad():
            proba = to_numpy(target.predict(target.queries))
        q = target.features.shape[0]
        if proba.shape != (q, self.num_classes):
            raise ValueError(
                f"target.predict returned shape {proba.shape}; expected ({q}, {self.num_classes})"
            )
        if not np.isfinite(proba).all() or (proba < 0).any():
            raise ValueError("target.predict returned non-finite or negative probabilities")
        if not np.allclose(proba.sum(1), 1.0, atol=1e-4):
            raise ValueError("target.predict returned rows that do not sum to 1")
        query = TargetQuery(
            proba=proba,
            labels=target.labels.cpu().numpy().astype(np.int64),
            features=target.features,
            predict=target.predict if target.inputs is None else None,
        )
        attacks = [a for a in self.attacks if query.predict is not None or not a.queries_release]
        shared = (time.perf_counter() - start) / max(len(attacks), 1)
        results = []
        for attack in attacks:
            t0 = time.perf_counter()
            out = attack.score(query)
            result = evaluate_attack(
                attack=attack.name + suffix,
                scores=out.scores,
                decisions=out.decisions,
                is_member=target.is_member,
                delta=target.delta,
                confidence=self.config.confidence,
                method=self.config.epsilon_bound,
                seed=subseed(self.seed, f"split-{attack.name}"),
                notes=(*self.notes, *attack.notes),
                interval_level=self.config.interval_level,
                interval_resamples=self.config.interval_resamples,
                intervals=intervals,
            )
            note = ceiling_note(result.epsilon_bound, target.claimed_epsilon)
            notes = result.notes if note is None else (*result.notes, note)
            seconds = time.perf_counter() - t0 + shared
            results.append(dataclasses.replace(result, seconds=seconds, notes=notes))
        return results


def prepare_attacks(
    *,
    names: Sequence[str | type[Attack]] = DEFAULT_ATTACKS,
    knowledge: AttackerKnowledge,
    config: AttackConfig | None = None,
    seed: int,
    candidate_features: Tensor | None = None,
    candidate_labels: Tensor | None = None,
    oracle: Predictor | None = None,
    map_units: UnitMap = serial_map,
) -> PreparedAttacks:
    """Train the shadow/reference heads and fit the named attacks, before any target exists.

    Args:
        names: attack names (see :func:`available_attacks`) or classes.
        knowledge: the attacker's pool, trainer and the victim's training-set size.
        config: the attack configuration (default :class:`AttackConfig`).
        seed: the attacker's seed.
        candidate_features: (q, d) the examples whose membership will be asked, *without*
            their membership (online LiRA trains half its references on each of them).
        candidate_labels: (q,) their labels.
        oracle: the release's predictor, only for ``shadow_data='synthetic'``.
        map_units: runs the chunks of the shadow and reference banks (independent units;
            default: in this process, in order). The attacks do not depend on it.

    Returns:
        The :class:`PreparedAttacks`.

    Raises:
        ValueError: on an unknown or repeated name (the message lists the registered ones), a
            missing input that an asked attack needs, or inconsistent shapes.
    """
    config = AttackConfig() if config is None else config
    kinds = parse_attack_names(names)
    candidates = None
    if (candidate_features is None) != (candidate_labels is None):
        raise ValueError("pass both candidate_features and candidate_labels, or neither")
    if candidate_features is not None and candidate_labels is not None:
        d = knowledge.features.shape[1]
        if candidate_features.ndim != 2 or candidate_features.shape[1] != d:
            raise ValueError(
                f"candidate_features must be (q, {d}); got {tuple(candidate_features.shape)}"
            )
        if tuple(candidate_labels.shape) != (candidate_features.shape[0],):
            raise ValueError(
                f"candidate_labels must be ({candidate_features.shape[0]},); "
                f"got {tuple(candidate_labels.shape)}"
            )
        candidates = (candidate_features, candidate_labels)
    start = time.perf_counter()
    context = ShadowContext(
        knowledge=knowledge,
        config=config,
        seed=seed,
        candidates=candidates,
        oracle=oracle,
        map_units=map_units,
    )
    attacks = [kind(config=config, seed=subseed(seed, f"attack-{kind.name}")) for kind in kinds]
    readers = [_bank_keys(kind, context) for kind in kinds]
    # The rest of a fit (``Attack.begin_fit``: the shadow attack's boosting, ~40% of a
    # 10^4-member preparation, on ~1.3 of 2 cores) runs beside the next fits when this
    # preparation has several intra-op threads and runs in this process (`runs_here`).
    side = None
    if runs_here(map_units) and torch.get_num_threads() > 1:
        side = ThreadPoolExecutor(max_workers=1, thread_name_prefix="attack-fit")
    rests: list[Future[None]] = []
    try:
        for i in _fit_order(readers):
            rest = attacks[i].begin_fit(context)
            if rest is not None and side is not None:
                rests.append(side.submit(with_callers_threads(rest)))
            elif rest is not None:
                rest()
            readers[i] = set()
            if None not in readers:  # each bank is kept while a reader of it is left
                context.release_banks(keep={key for keys in readers for key in keys or ()})
        for done in rests:
            done.result()
    finally:
        if side is not None:
            side.shutdown(cancel_futures=True)
    return PreparedAttacks(
        attacks=tuple(attacks),
        config=config,
        seed=int(seed),
        num_classes=knowledge.num_classes,
        notes=tuple(context.notes),
        prepare_seconds=time.perf_counter() - start,
        bound_to_release=context.queried_oracle,
    )


def _bank_keys(kind: type[Attack], context: ShadowContext) -> set[str] | None:
    return None if kind.banks is None else {context.bank_key(role) for role in kind.banks}


def _fit_order(readers: list[set[str] | None]) -> list[int]:
    """The attacks' fitting order: grouped by the first reader of their bank, so that a bank
    is let go before the next one is trained (the shadow heads before LiRA's online ones: two
    banks held at once were the peak of a 5*10^4-member run). Each attack's values do not
    depend on the order (each has its own seed, each bank its own tag), and the banks are built
    in the same order as in the given one. With an attack whose banks are unknown
    (``readers[i] is None``): the given order."""
    if any(keys is None for keys in readers):
        return list(range(len(readers)))
    first: dict[str, int] = {}
    for i, keys in enumerate(readers):
        for key in keys or ():
            first.setdefault(key, i)
    return sorted(
        range(len(readers)), key=lambda i: min((first[k] for k in readers[i] or ()), default=i)
    )


def run_attacks(
    *,
    names: Sequence[str] = DEFAULT_ATTACKS,
    target: AttackTarget,
    knowledge: AttackerKnowledge,
    config: AttackConfig | None = None,
    seed: int,
) -> list[AttackResult]:
    """Prepare the attacks and attack one release (no caching across releases).

    The target's evaluation features and labels are passed as LiRA's candidates and its
    ``predict`` as the synthesis oracle (only when it is queried with features: synthesis
    works in feature space); its membership is used only to score the attacks.

    Args:
        names: attack names.
        target: the release and its evaluation set.
        knowledge: the attacker's pool and trainer.
        config: the attack configuration.
        seed: the attacker's seed.

    Returns:
        One :class:`AttackResult` per attack.

    Raises:
        ValueError: for synthetic shadow data against a release queried with other inputs
            than features (``target.inputs``): synthesis makes feature vectors.
    """
    config = AttackConfig() if config is None else config
    if target.inputs is not None and config.shadow_data is ShadowDataSource.SYNTHETIC:
        raise ValueError(
            "shadow_data='synthetic' synthesises feature vectors, but this release is queried "
            "with target.inputs (e.g. images); use shadow_data='real' or 'noisy'"
        )
    prepared = prepare_attacks(
        names=names,
        knowledge=knowledge,
        config=config,
        seed=seed,
        candidate_features=target.features,
        candidate_labels=target.labels,
        oracle=target.predict if target.inputs is None else None,
    )
    return prepared.attack(target)
