"""RMIA (Zarifzadeh, Liu & Shokri, ICML 2024) against an implementation written here straight
from the paper (explicit loops over (x, z) pairs, nothing shared with ``rmia.py``), on the
same reference probabilities; then its behaviour: an overfit head is vulnerable, a head that
never saw a candidate gives chance, bad parameters fail clearly, and both variants run
through the registry and the runner."""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import pytest
import torch
from sklearn.metrics import roc_auc_score
from torch import Tensor

from alm_opacus.attacks import (
    DEFAULT_ATTACKS,
    AttackConfig,
    AttackerKnowledge,
    AttackTarget,
    ShadowContext,
    TargetQuery,
    attack_class,
    available_attacks,
    best_threshold,
    prepare_attacks,
    recipe_trainer,
    run_attacks,
)
from alm_opacus.attacks.rmia import (
    RmiaOfflineAttack,
    RmiaOnlineAttack,
    Signal,
    leave_one_out_scores,
    log_marginal,
)
from alm_opacus.data import load_dataset
from alm_opacus.heads import HeadConfig, train_head
from alm_opacus.run.config import RunConfig

MEMBERS = 100
REFERENCES = 8
RECIPE = HeadConfig(kind="linear", steps=300, lr=0.1)  # no regularisation: overfits 100 rows
CONFIG = AttackConfig(num_reference=REFERENCES, heads_per_seed=REFERENCES)
CLASSES = 10


# --- RMIA from the paper, pair by pair -------------------------------------------------------


def paper_rmia(
    *,
    target_x: np.ndarray,
    refs_x: np.ndarray,
    in_x: np.ndarray,
    target_z: np.ndarray,
    refs_z: np.ndarray,
    in_z: np.ndarray,
    gamma: float,
    offline_a: float | None,
) -> np.ndarray:
    """Score(x; θ) = fraction of z with LR_θ(x, z) >= γ, every pair computed on its own.

    ``target_*`` are Pr(·|θ) of the target, ``refs_*`` (B, ·) those of the reference
    models, ``in_*`` (B, ·) whether each reference trained on the record. Online, Pr(x) is
    the mean over all references; offline, Pr(x) = ½((1 + a)·Pr_OUT(x) + (1 − a)) with
    Pr_OUT the mean over the references that did not train on x. Pr(z) likewise.
    """
    num_refs = refs_x.shape[0]

    def marginal(refs: np.ndarray, inn: np.ndarray, i: int) -> float:
        if offline_a is None:
            return sum(float(refs[h, i]) for h in range(num_refs)) / num_refs
        out = [float(refs[h, i]) for h in range(num_refs) if not inn[h, i]]
        p_out = sum(out) / len(out)
        return 0.5 * ((1 + offline_a) * p_out + (1 - offline_a))

    pr_z = [marginal(refs_z, in_z, k) for k in range(len(target_z))]
    scores = []
    for i in range(len(target_x)):
        pr_x = marginal(refs_x, in_x, i)
        above = 0
        for k in range(len(target_z)):
            lr = (float(target_x[i]) / pr_x) / (float(target_z[k]) / pr_z[k])
            above += lr >= gamma
        scores.append(above / len(target_z))
    return np.array(scores)


def true_class(proba: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """Pr(x|θ): the probability of each row's label, (..., m, C) -> (..., m)."""
    return proba[..., np.arange(len(labels)), labels]


# --- the digits setting ----------------------------------------------------------------------


@dataclass
class Setup:
    x: Tensor
    y: Tensor
    perm: np.ndarray
    knowledge: AttackerKnowledge
    candidates: np.ndarray
    is_member: np.ndarray

    def target(self, train_rows: np.ndarray, *, seed: int = 123) -> AttackTarget:
        head = train_head(
            self.x[train_rows], self.y[train_rows], num_classes=CLASSES, config=RECIPE, seed=seed
        )
        ev = self.candidates
        return AttackTarget(
            predict=head.predict_proba,
            features=self.x[ev],
            labels=self.y[ev],
            is_member=self.is_member,
            num_classes=CLASSES,
        )

    def context(self, seed: int = 0) -> ShadowContext:
        ev = self.candidates
        return ShadowContext(
            knowledge=self.knowledge,
            config=CONFIG,
            seed=seed,
            candidates=(self.x[ev], self.y[ev]),
        )


@pytest.fixture(scope="module")
def single_thread() -> Iterator[None]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def setup(single_thread: None) -> Setup:
    ds = load_dataset("digits")
    assert ds.images is not None
    x = torch.from_numpy(ds.images.reshape(len(ds.images), -1)).double()
    y = torch.from_numpy(ds.labels)
    perm = np.random.default_rng(0).permutation(len(y))
    pool = perm[2 * MEMBERS : 4 * MEMBERS]  # disjoint from members and non-members
    knowledge = AttackerKnowledge(
        features=x[pool],
        labels=y[pool],
        trainer=recipe_trainer(config=RECIPE, num_classes=CLASSES),
        num_classes=CLASSES,
    )
    return Setup(
        x=x,
        y=y,
        perm=perm,
        knowledge=knowledge,
        candidates=perm[: 2 * MEMBERS],
        is_member=np.r_[np.ones(MEMBERS, bool), np.zeros(MEMBERS, bool)],
    )


def _query(target: AttackTarget) -> TargetQuery:
    with torch.no_grad():
        proba = target.predict(target.features).double().numpy()
    return TargetQuery(
        proba=proba,
        labels=target.labels.numpy().astype(np.int64),
        features=target.features,
        predict=target.predict,
    )


@pytest.mark.parametrize(
    ("kind", "gamma", "offline_a"),
    [
        (RmiaOnlineAttack, 1.0, None),
        (RmiaOnlineAttack, 2.0, None),
        (RmiaOfflineAttack, 1.0, 0.3),
        (RmiaOfflineAttack, 0.5, 1.0),
    ],
)
def test_scores_match_the_papers_definition_pair_by_pair(
    setup: Setup, kind: type[RmiaOnlineAttack], gamma: float, offline_a: float | None
) -> None:
    config = AttackConfig(
        num_reference=REFERENCES,
        heads_per_seed=REFERENCES,
        rmia_gamma=gamma,
        rmia_offline_a=0.3 if offline_a is None else offline_a,
    )
    context = setup.context()
    attack = kind(config=config, seed=5)
    attack.fit(context)
    target = setup.target(setup.perm[:MEMBERS])
    query = _query(target)
    ours = attack.score(query).scores

    # the same reference probabilities, read from the bank as data
    bank, n_pool = context.online_bank()
    assert n_pool == 0  # q / 2 = n candidates per head: no pool rows in this bank
    assert attack.fitted is not None
    rows = attack.fitted.population_rows
    assert len(set(rows.tolist())) == len(rows) == setup.knowledge.features.shape[0]
    z_x, z_y = setup.knowledge.features[rows], setup.knowledge.labels[rows].numpy()
    with torch.no_grad():
        target_z = true_class(target.predict(z_x).double().numpy(), z_y)
    paper = paper_rmia(
        target_x=true_class(query.proba, query.labels),
        refs_x=true_class(bank.proba, query.labels),
        in_x=bank.in_mask,
        target_z=target_z,
        refs_z=true_class(bank.predict(z_x), z_y),
        in_z=np.zeros((REFERENCES, len(rows)), bool),  # no reference trained on the pool
        gamma=gamma,
        offline_a=offline_a,
    )
    # logs and complements instead of quotients: the counts may differ only at exact ties
    differ = ours != paper
    assert differ.mean() <= 0.01, (differ.sum(), np.abs(ours - paper).max())
    assert np.abs(ours - paper).max() <= 1 / len(rows) + 1e-12
    auc_ours = roc_auc_score(setup.is_member, ours)
    auc_paper = roc_auc_score(setup.is_member, paper)
    assert abs(auc_ours - auc_paper) <= 0.01
    assert auc_ours > 0.6  # the overfit head leaks


def test_leave_one_head_out_scores_are_the_papers_with_a_reference_as_target(
    setup: Setup,
) -> None:
    """The threshold's scores: head j is the target, the other heads its references."""
    bank, _ = setup.context().online_bank()
    labels = setup.y[setup.candidates].numpy()
    z_x, z_y = setup.knowledge.features[:40], setup.knowledge.labels[:40].numpy()
    z_proba = bank.predict(z_x)
    z_in = np.zeros((REFERENCES, 40), bool)
    for offline_a in (None, 0.3):
        loo = leave_one_out_scores(
            Signal.of(bank.proba, labels),
            bank.in_mask,
            Signal.of(z_proba, z_y),
            z_in,
            offline_a=offline_a,
            gamma=1.0,
        )
        for j in (0, REFERENCES - 1):
            others = np.arange(REFERENCES) != j
            paper = paper_rmia(
                target_x=true_class(bank.proba[j], labels),
                refs_x=true_class(bank.proba[others], labels),
                in_x=bank.in_mask[others],
                target_z=true_class(z_proba[j], z_y),
                refs_z=true_class(z_proba[others], z_y),
                in_z=z_in[others],
                gamma=1.0,
                offline_a=offline_a,
            )
            assert np.abs(loo[j] - paper).max() <= 1 / 40 + 1e-12
            assert (loo[j] != paper).mean() <= 0.02


def test_offline_marginal_is_the_linear_approximation_and_exact_near_one() -> None:
    p = np.array([0.01, 0.2, 0.5, 0.9, 0.999])
    for a in (0.0, 0.3, 1.0):
        got = log_marginal(p, 1 - p, offline_a=a)
        np.testing.assert_allclose(got, np.log(0.5 * ((1 + a) * p + (1 - a))), rtol=1e-12)
    np.testing.assert_allclose(log_marginal(p, 1 - p, offline_a=None), np.log(p), rtol=1e-12)
    # where p rounds to 1, the complement still tells two marginals apart
    rest = np.array([1e-18, 2e-18])
    got = log_marginal(np.ones(2), rest, offline_a=0.3)
    np.testing.assert_allclose(got, -0.65 * rest, rtol=1e-12)
    assert got[0] > got[1]


def test_overfit_head_is_vulnerable_and_decisions_use_the_shadow_threshold(setup: Setup) -> None:
    target = setup.target(setup.perm[:MEMBERS])
    ev = setup.candidates
    prepared = prepare_attacks(
        names=["rmia-online", "rmia-offline"],
        knowledge=setup.knowledge,
        config=CONFIG,
        seed=0,
        candidate_features=setup.x[ev],
        candidate_labels=setup.y[ev],
    )
    results = prepared.attack(target)
    assert [r.attack for r in results] == ["rmia-online", "rmia-offline"]
    for r in results:
        assert r.mia_auc > 0.62, r.attack
        assert r.mia_accuracy > 0.55, r.attack
    # decisions are the scores at a threshold fitted without the evaluation's membership
    flipped = AttackTarget(
        predict=target.predict,
        features=target.features,
        labels=target.labels,
        is_member=~target.is_member,
        num_classes=CLASSES,
    )
    again = prepared.attack(flipped)
    for a, b in zip(results, again, strict=True):
        assert a.scores is not None and b.scores is not None
        np.testing.assert_array_equal(a.scores, b.scores)
        assert math.isclose(a.mia_accuracy + b.mia_accuracy, 1.0)


def test_a_head_that_never_saw_a_candidate_gives_chance(setup: Setup) -> None:
    """Members and non-members are alike to a head trained on other rows: the AUC is a draw
    from its null distribution (Mann-Whitney: sd = sqrt((m + n + 1) / (12 m n)))."""
    fresh = setup.perm[4 * MEMBERS : 5 * MEMBERS]  # neither candidates nor the pool
    target = setup.target(fresh, seed=7)
    results = run_attacks(
        names=["rmia-online", "rmia-offline"],
        target=target,
        knowledge=setup.knowledge,
        config=CONFIG,
        seed=0,
    )
    sd_auc = math.sqrt((2 * MEMBERS + 1) / (12 * MEMBERS * MEMBERS))
    sd_acc = math.sqrt(0.25 / (2 * MEMBERS))
    for r in results:
        assert abs(r.mia_auc - 0.5) <= 4 * sd_auc, (r.attack, r.mia_auc)
        assert abs(r.mia_accuracy - 0.5) <= 4 * sd_acc, (r.attack, r.mia_accuracy)


@pytest.mark.parametrize(
    ("field", "value", "expected"),
    [
        ("rmia_gamma", 0, "rmia_gamma=0 is invalid: expected a finite number > 0"),
        ("rmia_gamma", -1.0, "rmia_gamma=-1.0 is invalid: expected a finite number > 0"),
        ("rmia_gamma", math.inf, "rmia_gamma=inf is invalid: expected a finite number > 0"),
        ("rmia_gamma", math.nan, "rmia_gamma=nan is invalid: expected a finite number > 0"),
        ("rmia_gamma", "2", "rmia_gamma='2' is invalid: expected a finite number > 0"),
        ("rmia_gamma", True, "rmia_gamma=True is invalid: expected a finite number > 0"),
        (
            "rmia_offline_a",
            -0.1,
            r"rmia_offline_a=-0.1 is invalid: expected None \(tuned\) or a number in \[0, 1\]",
        ),
        (
            "rmia_offline_a",
            1.5,
            r"rmia_offline_a=1.5 is invalid: expected None \(tuned\) or a number in \[0, 1\]",
        ),
        (
            "rmia_offline_a",
            math.nan,
            r"rmia_offline_a=nan is invalid: expected None or a number in",
        ),
        ("rmia_population", 0, "rmia_population=0 is invalid: expected an integer >= 1"),
        ("rmia_population", 2.5, "rmia_population=2.5 is invalid: expected an integer >= 1"),
        ("rmia_population", True, "rmia_population=True is invalid: expected an integer >= 1"),
    ],
)
def test_bad_parameters_fail_with_the_value_and_what_was_expected(
    field: str, value: object, expected: str
) -> None:
    with pytest.raises(ValueError, match=f"^{expected}"):
        AttackConfig(**{field: value})  # type: ignore[arg-type]


def test_defaults_and_a_smaller_population(setup: Setup) -> None:
    config = AttackConfig()
    assert (config.rmia_gamma, config.rmia_offline_a, config.rmia_population) == (1.0, None, 10_000)
    small = AttackConfig(num_reference=REFERENCES, heads_per_seed=REFERENCES, rmia_population=25)
    attack = RmiaOnlineAttack(config=small, seed=0)
    attack.fit(setup.context())
    assert attack.fitted is not None
    rows = attack.fitted.population_rows
    assert rows.size == 25 and np.unique(rows).size == 25
    scores = attack.score(_query(setup.target(setup.perm[:MEMBERS]))).scores
    assert set(np.round(scores * 25, 9)) <= set(range(26))  # a fraction of the 25 samples


def test_registered_and_refused_where_the_pool_cannot_be_queried(setup: Setup) -> None:
    assert {"rmia-online", "rmia-offline"} <= set(available_attacks())
    assert attack_class("rmia-online") is RmiaOnlineAttack
    assert attack_class("rmia-offline") is RmiaOfflineAttack
    target = setup.target(setup.perm[:MEMBERS])
    ev = setup.candidates
    prepared = prepare_attacks(
        names=["rmia-offline"],
        knowledge=setup.knowledge,
        config=CONFIG,
        seed=0,
        candidate_features=setup.x[ev],
        candidate_labels=setup.y[ev],
    )
    # a release queried with other inputs (images) cannot be queried on the pool's features:
    # the runner leaves RMIA out of it, and scoring it directly is refused
    by_inputs = AttackTarget(
        predict=target.predict,
        features=target.features,
        labels=target.labels,
        is_member=target.is_member,
        num_classes=CLASSES,
        inputs=target.features.clone(),
    )
    assert prepared.attack(by_inputs) == []
    blind = TargetQuery(
        proba=target.predict(target.features).numpy(),
        labels=target.labels.numpy().astype(np.int64),
        features=target.features,
    )
    with pytest.raises(ValueError, match="rmia-offline queries the release on 200 rows"):
        prepared.attacks[0].score(blind)
    other = AttackTarget(
        predict=target.predict,
        features=target.features.flip(0),
        labels=target.labels.flip(0),
        is_member=target.is_member,
        num_classes=CLASSES,
    )
    with pytest.raises(ValueError, match="rmia-offline was prepared for other candidates"):
        prepared.attack(other)
    with pytest.raises(ValueError, match=r"LiRA and RMIA \(.*\) need the candidate examples"):
        prepare_attacks(names=["rmia-online"], knowledge=setup.knowledge, config=CONFIG, seed=0)


def test_threshold_maximises_balanced_accuracy_on_the_leave_one_out_scores(
    setup: Setup,
) -> None:
    context = setup.context()
    attack = RmiaOnlineAttack(config=CONFIG, seed=0)
    attack.fit(context)
    assert attack.threshold is not None and attack.fitted is not None
    bank, _ = context.online_bank()
    rows = attack.fitted.population_rows
    z_x, z_y = setup.knowledge.features[rows], setup.knowledge.labels[rows].numpy()
    labels = setup.y[setup.candidates].numpy()
    loo = leave_one_out_scores(
        Signal.of(bank.proba, labels),
        bank.in_mask,
        Signal.of(bank.predict(z_x), z_y),
        np.zeros((REFERENCES, rows.size), bool),
        offline_a=None,
        gamma=1.0,
    )
    expected = best_threshold(scores=loo.reshape(-1), is_member=bank.in_mask.reshape(-1))
    assert attack.threshold.value == expected


def test_both_rmia_attacks_are_in_the_default_set() -> None:
    """Each is the strongest of its kind on one embedded dataset (docs/threat_model.md)."""
    assert {"rmia-online", "rmia-offline"} <= set(DEFAULT_ATTACKS)
    assert RunConfig().attack_names == DEFAULT_ATTACKS
    assert RunConfig(attacks=("rmia-offline", "loss")).attack_names == ("rmia-offline", "loss")
    with pytest.raises(ValueError, match="unknown attack 'rmia'"):
        RunConfig(attacks=("all", "rmia"))


@pytest.mark.parametrize("kind", [RmiaOnlineAttack, RmiaOfflineAttack])
def test_population_inside_the_bank_when_candidates_are_few(
    setup: Setup, kind: type[RmiaOnlineAttack]
) -> None:
    """With fewer candidates than the victim's n, the references also train on pool rows:
    some reference trained on each z, and offline ``Pr(z)`` keeps the others only."""
    few = 20
    candidates = setup.perm[: 2 * few]
    knowledge = AttackerKnowledge(
        features=setup.knowledge.features,
        labels=setup.knowledge.labels,
        trainer=setup.knowledge.trainer,
        num_classes=CLASSES,
        train_size=3 * few,  # q / 2 = 20 candidates and 40 pool rows per head
    )
    context = ShadowContext(
        knowledge=knowledge,
        config=CONFIG,
        seed=0,
        candidates=(setup.x[candidates], setup.y[candidates]),
    )
    attack = kind(config=CONFIG, seed=1)
    attack.fit(context)
    bank, n_pool = context.online_bank()
    assert n_pool == setup.knowledge.features.shape[0]
    assert attack.fitted is not None
    rows = attack.fitted.population_rows
    assert bank.in_mask[:, rows].any(0).all()  # every z is in some reference
    head = train_head(
        setup.x[candidates[:few]],
        setup.y[candidates[:few]],
        num_classes=CLASSES,
        config=RECIPE,
        seed=3,
    )
    labels = setup.y[candidates].numpy()
    query = TargetQuery(
        proba=head.predict_proba(setup.x[candidates]).double().numpy(),
        labels=labels,
        features=setup.x[candidates],
        predict=head.predict_proba,
    )
    ours = attack.score(query).scores
    z_y = setup.knowledge.labels[rows].numpy()
    with torch.no_grad():
        target_z = true_class(head.predict_proba(setup.knowledge.features[rows]).numpy(), z_y)
    paper = paper_rmia(
        target_x=true_class(query.proba, labels),
        refs_x=true_class(bank.proba[:, n_pool:], labels),
        in_x=bank.in_mask[:, n_pool:],
        target_z=target_z,
        refs_z=true_class(bank.proba[:, rows], z_y),
        in_z=bank.in_mask[:, rows],
        gamma=1.0,
        offline_a=attack.offline_a,  # offline: the a the attack tuned on its references
    )
    assert np.abs(ours - paper).max() <= 1 / len(rows) + 1e-12
    assert (ours != paper).mean() <= 0.05


def test_offline_a_is_tuned_on_the_attackers_references(setup: Setup) -> None:
    """``rmia_offline_a=None``: the attacker picks the grid's ``a`` whose leave-one-reference-
    out scores have the largest AUC (checked with scikit-learn), and scores with it."""
    from alm_opacus.attacks.rmia import A_GRID, Signal, leave_one_out_scores

    config = AttackConfig(num_reference=REFERENCES, heads_per_seed=REFERENCES)
    context = setup.context()
    attack = RmiaOfflineAttack(config=config, seed=5)
    attack.fit(context)
    assert attack.tuned_a in A_GRID and attack.offline_a == attack.tuned_a
    assert any(f"a = {attack.tuned_a:g}, tuned" in note for note in attack.notes)
    bank, n_pool = context.online_bank()
    assert attack.fitted is not None
    rows = attack.fitted.population_rows
    labels = bank.labels.numpy().astype(np.int64)
    x_sig = Signal.of(bank.proba[:, n_pool:], labels[n_pool:])
    x_in = bank.in_mask[:, n_pool:]
    if n_pool > 0:
        z_sig, z_in = Signal.of(bank.proba[:, rows], labels[rows]), bank.in_mask[:, rows]
    else:
        pool_labels = setup.knowledge.labels[rows].numpy().astype(np.int64)
        z_sig = Signal.of(bank.predict(setup.knowledge.features[rows]), pool_labels)
        z_in = np.zeros((bank.num_heads, rows.size), dtype=bool)
    aucs = []
    for a in A_GRID:
        loo = leave_one_out_scores(x_sig, x_in, z_sig, z_in, offline_a=a, gamma=1.0).reshape(-1)
        ok = np.isfinite(loo)
        aucs.append(roc_auc_score(x_in.reshape(-1)[ok], loo[ok]))
    assert aucs[A_GRID.index(attack.tuned_a)] == pytest.approx(max(aucs), abs=1e-12)


def test_the_exact_auc_is_scikit_learns_with_ties() -> None:
    # scores on a coarse lattice (many ties, as RMIA's k/Z scores have): the Mann-Whitney
    # count over 2mn equals scikit-learn's trapezoidal AUC, and is an exact fraction
    from fractions import Fraction

    from alm_opacus.attacks.rmia import exact_auc

    rng = np.random.default_rng(3)
    member = rng.random(3001) < 0.4
    scores = np.round(rng.normal(size=3001) + 0.3 * member, 1)
    auc = exact_auc(scores, member)
    assert isinstance(auc, Fraction)
    assert float(auc) == pytest.approx(roc_auc_score(member, scores), abs=1e-12)
    assert exact_auc(np.r_[0.0, 1.0, 1.0], np.r_[False, True, False]) == Fraction(3, 4)
    with pytest.raises(ValueError, match="at least one member and one non-member"):
        exact_auc(scores[:3], np.ones(3, bool))
