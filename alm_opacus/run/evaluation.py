"""The attacker's side of a cell, and the rows a cell contributes to ``results.csv``."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace

import numpy as np
import torch
from torch import Tensor

from alm_opacus.attacks import (
    CLEAN_SUFFIX,
    Attack,
    AttackConfig,
    AttackerKnowledge,
    AttackResult,
    AttackTarget,
    PreparedAttacks,
    aggregate_results,
    prepare_attacks,
)
from alm_opacus.heads import utility_loss
from alm_opacus.methods import Release, ShadowTrainer
from alm_opacus.report.results import ResultRow
from alm_opacus.unit_map import UnitMap, serial_map

__all__ = [
    "CLEAN_SUFFIX",
    "Evaluation",
    "cell_rows",
    "cell_threads",
    "infeasible_row",
    "torch_threads",
    "with_reference",
]


#: Attacker pools of this many rows or more run a cell's work on every intra-op thread. Below
#: it a cell is many small tensor ops, faster on one thread; from ~10^4 members up its time is
#: large products (the banks' Newton-CG and DP-SGD, boosting on 10^6 shadow pairs) that one
#: thread leaves half a two-core machine idle for.
PARALLEL_POOL_ROWS = 16_384


def cell_threads(pool_rows: int) -> int:
    """Intra-op threads for the cells of a run whose attacker pool has ``pool_rows`` rows: 1,
    or every thread this process has from :data:`PARALLEL_POOL_ROWS` rows up."""
    return torch.get_num_threads() if pool_rows >= PARALLEL_POOL_ROWS else 1


@contextlib.contextmanager
def torch_threads(n: int) -> Iterator[None]:
    """Run a block with ``n`` intra-op threads: the attacks' many tiny matrix products are
    slower with more threads than they have work for."""
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


@dataclass
class Evaluation:
    """The balanced evaluation set (members and as many non-members) and the attacker's pool."""

    features: Tensor
    labels: Tensor
    is_member: np.ndarray
    pool: tuple[Tensor, Tensor]
    attacks: tuple[type[Attack], ...]
    num_classes: int
    config: AttackConfig
    map_units: UnitMap = serial_map
    #: Intra-op threads of the attacks (:func:`cell_threads` of the pool, set by the run).
    threads: int = 1

    def prepare(self, trainer: ShadowTrainer, *, seed: int) -> PreparedAttacks:
        """Fit every attack on the attacker's side, before any release is seen."""
        knowledge = AttackerKnowledge(
            features=self.pool[0],
            labels=self.pool[1],
            trainer=trainer,
            num_classes=self.num_classes,
            train_size=int(self.is_member.sum()),
        )
        with torch_threads(self.threads):
            return prepare_attacks(
                names=self.attacks,
                knowledge=knowledge,
                seed=seed,
                config=self.config,
                candidate_features=self.features,
                candidate_labels=self.labels,
                map_units=self.map_units,
            )

    def attack(
        self,
        prepared: PreparedAttacks,
        release: Release,
        *,
        inputs: Tensor | None = None,
        suffix: str = "",
    ) -> list[AttackResult]:
        """Attack ``release``, querying it with ``inputs`` (the evaluation rows in the
        release's input kind; ``None``: the features); ``suffix`` tags the attack names."""
        target = AttackTarget(
            predict=release.predict_proba,
            features=self.features,
            labels=self.labels,
            is_member=self.is_member,
            num_classes=self.num_classes,
            delta=release.statement.delta,
            inputs=inputs,
        )
        with torch_threads(self.threads):  # intervals: once per cell, from the kept scores
            return prepared.attack(target, suffix=suffix, intervals=False)


def _num(value: float | None) -> float:
    return math.nan if value is None else float(value)


def _replace_one(epsilon: float, delta: float, neighbouring: str) -> tuple[float, float]:
    # Group privacy: add/remove (eps, delta) gives replace-one (2 eps, (1 + e^eps) delta).
    if neighbouring != "add-remove" or not math.isfinite(epsilon):
        return epsilon, delta
    return 2 * epsilon, min(1.0, (1 + math.exp(min(epsilon, 700.0))) * delta)


def base_row(
    *, dataset: str, method: str, epsilon: float, seed: int, release: Release
) -> ResultRow:
    """The columns of a cell that do not depend on utility or attacks."""
    st = release.statement
    sens, training = st.sensitivity, release.training
    eps_ro, delta_ro = _replace_one(st.epsilon, st.delta, st.neighbouring)
    return ResultRow(
        dataset=dataset,
        method=method,
        epsilon=epsilon,
        delta=st.delta,
        guarantee=st.guarantee.value,
        sensitivity=sens.value if sens is not None else math.nan,
        noise_scale=_num(st.noise_scale),
        seed=seed,
        test_accuracy=math.nan,
        utility_loss=math.nan,
        statement=str(st),
        noise_multiplier=_num(training.noise_multiplier if training else None),
        clip_norm=_num(training.clip_norm if training else None),
        noise_std=_num(release.noise_std),
        sensitivity_norm=sens.norm if sens is not None else "",
        sensitivity_source=sens.source.value if sens is not None else "",
        neighbouring=st.neighbouring,
        epsilon_replace_one=eps_ro,
        delta_replace_one=delta_ro,
        noise_source=st.noise,
        epsilon_spent=_num(st.epsilon_spent),
        accountant=training.accountant if training else "",
    )


def cell_rows(
    *,
    dataset: str,
    method: str,
    epsilon: float,
    seed: int,
    releases: Sequence[Release],
    accuracies: Sequence[float],
    reference: float | None,
    results: Sequence[AttackResult],
    seconds: float,
) -> list[ResultRow]:
    """The rows of one finished cell: one per attack (or one row without attacks).

    ``reference`` is the unprotected accuracy the utility losses are measured against;
    ``None`` leaves them NaN, for :func:`with_reference` to fill in later (the driver knows the
    reference only once its seed's baseline cell is done).
    """
    mean_acc = float(np.mean(accuracies))
    spread = len(accuracies) > 1
    base = replace(
        base_row(dataset=dataset, method=method, epsilon=epsilon, seed=seed, release=releases[0]),
        test_accuracy=mean_acc,
        seconds=seconds,
        noise_draws=len(releases),
        test_accuracy_std=float(np.std(accuracies)) if spread else math.nan,
    )
    if reference is not None:
        (base,) = with_reference([base], reference)
    if not results:
        return [base]
    out = []
    claimed = base.epsilon_replace_one if math.isfinite(base.epsilon_replace_one) else None
    for agg in aggregate_results(results, claimed_epsilon=claimed, seed=seed):
        values = {k.replace(".", "_"): v for k, v in agg.to_row().items()}
        out.append(replace(base, **{k: values[k] for k in _ATTACK_FIELDS if k in values}))
    return out


def with_reference(rows: Sequence[ResultRow], reference: float) -> list[ResultRow]:
    """``rows`` with their utility losses measured against the unprotected accuracy
    ``reference`` (ALM paper, Definition 6.1; the spread over draws scales by the same
    reference). Rows of infeasible cells keep NaN."""
    return [
        row
        if row.status != "ok"
        else replace(
            row,
            utility_loss=utility_loss(protected=row.test_accuracy, unprotected=reference),
            utility_loss_std=row.test_accuracy_std / reference,
        )
        for row in rows
    ]


#: The row fields an attack aggregate fills (its pooled bound, means, spreads, intervals).
_ATTACK_FIELDS = (
    "attack",
    "mia_accuracy",
    "mia_advantage",
    "mia_auc",
    "tpr_at_fpr_0_001",
    "tpr_at_fpr_0_01",
    "eps_lower_bound",
    "mia_auc_std",
    "mia_accuracy_std",
    "mia_auc_ci_low",
    "mia_auc_ci_high",
    "tpr_at_fpr_0_001_ci_low",
    "tpr_at_fpr_0_001_ci_high",
    "tpr_at_fpr_0_01_ci_low",
    "tpr_at_fpr_0_01_ci_high",
    "eps_lower_bound_ceiling",
)


def infeasible_row(
    *,
    dataset: str,
    method: str,
    epsilon: float,
    seed: int,
    delta: float,
    reason: str,
    seconds: float,
) -> ResultRow:
    """The one row of a cell that no release can meet."""
    return ResultRow(
        dataset=dataset,
        method=method,
        epsilon=epsilon,
        delta=delta,
        guarantee="none",
        sensitivity=math.nan,
        noise_scale=math.nan,
        seed=seed,
        test_accuracy=math.nan,
        utility_loss=math.nan,
        seconds=seconds,
        noise_draws=0,
        status="infeasible",
        reason=reason.splitlines()[0] if reason else "infeasible",
    )
