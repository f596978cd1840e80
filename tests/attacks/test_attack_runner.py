"""End-to-end attacks on digits (raw 64-pixel features): an overfit head is vulnerable, a
constant release is not, thresholds never see the evaluation set, and the API fails clearly."""

from __future__ import annotations

import copy
import dataclasses
import math
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import pytest
import torch
from torch import Tensor

from alm_opacus.attacks import (
    CLEAN_SUFFIX,
    DEFAULT_ATTACKS,
    OPT_IN_ATTACKS,
    AttackConfig,
    AttackerKnowledge,
    AttackKind,
    AttackTarget,
    PreparedAttacks,
    ShadowContext,
    ShadowDataSource,
    ShadowModel,
    aggregate_results,
    available_attacks,
    best_attack,
    prepare_attacks,
    recipe_trainer,
    run_attacks,
)
from alm_opacus.attacks.shadow_data import SynthesisConfig, synthesize
from alm_opacus.data import load_dataset
from alm_opacus.heads import HeadConfig, Params, train_head

MEMBERS = 100
RECIPE = HeadConfig(kind="linear", steps=300, lr=0.1)  # no regularisation: overfits 100 rows
SMALL = AttackConfig(num_shadow=4, num_reference=4, attack_steps=50, synth_iter_max=60)


@dataclass
class Setup:
    target: AttackTarget
    knowledge: AttackerKnowledge
    prepared: PreparedAttacks


@pytest.fixture(scope="module")
def single_thread() -> Iterator[None]:
    # the test machine is shared; one thread avoids oversubscription stalls
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def digits(single_thread: None) -> tuple[Tensor, Tensor, np.ndarray]:
    ds = load_dataset("digits")
    x = torch.from_numpy(ds.images.reshape(len(ds.images), -1)).double()
    y = torch.from_numpy(ds.labels)
    return x, y, np.random.default_rng(0).permutation(len(y))


def _target(x: Tensor, y: Tensor, perm: np.ndarray) -> AttackTarget:
    mem, non = perm[:MEMBERS], perm[MEMBERS : 2 * MEMBERS]
    head = train_head(x[mem], y[mem], num_classes=10, config=RECIPE, seed=123)
    ev = np.r_[mem, non]
    return AttackTarget(
        predict=head.predict_proba,
        features=x[ev],
        labels=y[ev],
        is_member=np.r_[np.ones(MEMBERS, bool), np.zeros(MEMBERS, bool)],
        num_classes=10,
    )


def _knowledge(x: Tensor, y: Tensor, perm: np.ndarray) -> AttackerKnowledge:
    pool = perm[2 * MEMBERS : 4 * MEMBERS]  # disjoint from members and non-members
    trainer = recipe_trainer(config=RECIPE, num_classes=10)
    return AttackerKnowledge(features=x[pool], labels=y[pool], trainer=trainer, num_classes=10)


@pytest.fixture(scope="module")
def setup(digits: tuple[Tensor, Tensor, np.ndarray]) -> Setup:
    x, y, perm = digits
    knowledge = _knowledge(x, y, perm)
    candidates = x[perm[: 2 * MEMBERS]], y[perm[: 2 * MEMBERS]]
    # everything is fitted before the target (the release) exists
    prepared = prepare_attacks(
        knowledge=knowledge,
        seed=0,
        candidate_features=candidates[0],
        candidate_labels=candidates[1],
    )
    return Setup(_target(x, y, perm), knowledge, prepared)


@pytest.mark.slow
def test_overfit_head_is_vulnerable_to_every_attack(setup: Setup) -> None:
    results = {r.attack: r for r in setup.prepared.attack(setup.target)}
    assert list(results) == list(DEFAULT_ATTACKS)
    assert list(DEFAULT_ATTACKS) == [k.value for k in AttackKind if k not in OPT_IN_ATTACKS]
    assert set(available_attacks()) >= {k.value for k in AttackKind}
    for name, r in results.items():
        print(
            f"{name:17s} auc={r.mia_auc:.3f} acc={r.mia_accuracy:.3f} eps={r.eps_lower_bound:.2f}"
        )
        floor = 0.52 if name == "correctness" else 0.62
        assert r.mia_auc > floor, name
        assert r.mia_accuracy > 0.52, name
        assert r.num_members == r.num_nonmembers == MEMBERS
    assert max(r.mia_auc for r in results.values()) >= 0.68
    assert results["loss"].mia_accuracy >= 0.6
    assert max(r.eps_lower_bound for r in results.values()) > 0


@pytest.mark.slow
def test_constant_release_gives_chance_and_no_epsilon(setup: Setup) -> None:
    t = setup.target
    const = AttackTarget(
        predict=lambda f: torch.full((f.shape[0], 10), 0.1, dtype=torch.float64),
        features=t.features,
        labels=t.labels,
        is_member=t.is_member,
        num_classes=10,
    )
    for r in setup.prepared.attack(const):
        if r.attack in (
            "shadow",
            "correctness",
            "lira-offline",
            "lira-online",
            "lira-offline-pool",
            "rmia-online",
            "rmia-offline",
        ):
            # scores still vary with the label (shadow, correctness: argmax is class 0) or
            # with the references (LiRA, RMIA), but independently of membership
            assert abs(r.mia_auc - 0.5) < 0.1, r.attack
        else:
            assert r.mia_auc == 0.5, r.attack
            assert r.mia_advantage == 0.0, r.attack
        assert r.eps_lower_bound == 0.0, r.attack


@pytest.mark.slow
def test_decisions_never_depend_on_evaluation_membership(setup: Setup) -> None:
    before = copy.deepcopy([a.__dict__ for a in setup.prepared.attacks if hasattr(a, "threshold")])
    t = setup.target
    flipped = AttackTarget(
        predict=t.predict,
        features=t.features,
        labels=t.labels,
        is_member=~t.is_member,
        num_classes=10,
    )
    a = setup.prepared.attack(t)
    b = setup.prepared.attack(flipped)
    for ra, rb in zip(a, b, strict=True):
        # the same guesses scored against the complementary truth
        assert ra.mia_accuracy == pytest.approx(1 - rb.mia_accuracy)
        assert ra.mia_auc == pytest.approx(1 - rb.mia_auc)
    after = [a.__dict__ for a in setup.prepared.attacks if hasattr(a, "threshold")]
    for x, y in zip(before, after, strict=True):
        assert repr(x.get("threshold")) == repr(y.get("threshold"))


def test_unknown_and_repeated_names_are_rejected(digits: tuple[Tensor, Tensor, np.ndarray]) -> None:
    x, y, perm = digits
    k = _knowledge(x, y, perm)
    with pytest.raises(ValueError, match=r"attack='lira' is unknown: expected one of \['shadow'"):
        prepare_attacks(names=["lira"], knowledge=k, seed=0)
    with pytest.raises(ValueError, match="repeats"):
        prepare_attacks(names=["loss", "loss"], knowledge=k, seed=0)
    with pytest.raises(ValueError, match="non-empty"):
        prepare_attacks(names="loss", knowledge=k, seed=0)


def test_online_lira_needs_and_checks_its_candidates(
    digits: tuple[Tensor, Tensor, np.ndarray],
) -> None:
    x, y, perm = digits
    k = _knowledge(x, y, perm)
    with pytest.raises(ValueError, match="candidate"):
        prepare_attacks(names=["lira-online"], knowledge=k, config=SMALL, seed=0)
    other = x[perm[-50:]], y[perm[-50:]]
    prepared = prepare_attacks(
        names=["lira-online"],
        knowledge=k,
        config=SMALL,
        seed=0,
        candidate_features=other[0],
        candidate_labels=other[1],
    )
    with pytest.raises(ValueError, match="other candidates"):
        prepared.attack(_target(x, y, perm))


def test_target_and_config_validation(digits: tuple[Tensor, Tensor, np.ndarray]) -> None:
    x, y, _ = digits
    with pytest.raises(ValueError, match="balanced: 3 members and 1 non-members"):
        AttackTarget(
            predict=lambda f: f,
            features=x[:4],
            labels=y[:4],
            is_member=np.array([True, True, True, False]),
            num_classes=10,
        )
    with pytest.raises(ValueError, match="num_reference=5"):
        AttackConfig(num_reference=5)
    with pytest.raises(ValueError, match="noise_fraction=0"):
        AttackConfig(noise_fraction=0)
    with pytest.raises(ValueError, match="'bogus'"):
        AttackConfig(shadow_data="bogus")  # type: ignore[arg-type]


def test_run_attacks_is_deterministic_and_matches_prepare(
    digits: tuple[Tensor, Tensor, np.ndarray],
) -> None:
    x, y, perm = digits
    target, k = _target(x, y, perm), _knowledge(x, y, perm)
    names = ["shadow", "loss", "lira-online"]
    one = run_attacks(names=names, target=target, knowledge=k, config=SMALL, seed=3)
    two = run_attacks(names=names, target=target, knowledge=k, config=SMALL, seed=3)
    assert [r.to_row() for r in one] == [r.to_row() for r in two]
    assert [r.attack for r in one] == names


@pytest.mark.parametrize("source", [ShadowDataSource.NOISY, ShadowDataSource.SYNTHETIC])
def test_noisy_and_synthetic_shadow_data(
    digits: tuple[Tensor, Tensor, np.ndarray], source: ShadowDataSource
) -> None:
    x, y, perm = digits
    target, k = _target(x, y, perm), _knowledge(x, y, perm)
    config = AttackConfig(
        num_shadow=4, attack_steps=50, shadow_data=source, synth_per_class=8, synth_iter_max=80
    )
    prepared = prepare_attacks(
        names=["loss", "shadow"], knowledge=k, config=config, seed=0, oracle=target.predict
    )
    assert prepared.bound_to_release == (source is ShadowDataSource.SYNTHETIC)
    assert any(source.value in note for note in prepared.notes)
    results = prepared.attack(target)
    assert all(0 <= r.mia_auc <= 1 for r in results)
    if source is ShadowDataSource.SYNTHETIC:
        with pytest.raises(ValueError, match="oracle"):
            prepare_attacks(names=["loss"], knowledge=k, config=config, seed=0)


def test_hill_climbing_finds_records_the_target_is_confident_about(
    digits: tuple[Tensor, Tensor, np.ndarray],
) -> None:
    x, y, perm = digits
    target, k = _target(x, y, perm), _knowledge(x, y, perm)
    cfg = SynthesisConfig(per_class=5, k_max=32, k_min=1, conf_min=0.6, rej_max=5, iter_max=150)
    feats, labels, queries = synthesize(
        oracle=target.predict,
        marginals=k.features,
        num_classes=10,
        config=cfg,
        rng=np.random.default_rng(0),
    )
    assert feats.shape[0] >= 25
    assert queries <= 50 * 150
    proba = target.predict(feats)
    conf = proba[torch.arange(len(labels)), labels]
    assert bool((proba.argmax(1) == labels).all())
    assert bool((conf > cfg.conf_min).all())


def test_recipe_trainer_applies_the_protection_to_each_call(
    digits: tuple[Tensor, Tensor, np.ndarray],
) -> None:
    x, y, _ = digits
    seeds: list[int] = []

    def protect(params: Params, seed: int) -> Params:
        seeds.append(seed)
        return {name: torch.zeros_like(v) for name, v in params.items()}

    trainer = recipe_trainer(config=RECIPE.replace(steps=5), num_classes=10, protect=protect)
    masks = torch.ones(3, 40, dtype=torch.bool)
    proba = trainer(x[:40], y[:40], masks, 1)(x[:7])
    assert proba.shape == (3, 7, 10)
    torch.testing.assert_close(proba, torch.full_like(proba, 0.1))
    trainer(x[:40], y[:40], masks, 2)
    assert len(set(seeds)) == 2


@pytest.mark.slow
def test_a_release_queried_with_other_inputs_gets_them_and_the_banks_keep_features(
    setup: Setup,
) -> None:
    # e.g. dpsgd-full: the release reads images; shadow and reference heads read features.
    t = setup.target
    seen: list[Tensor] = []
    images = t.features.reshape(-1, 1, 8, 8) * 2.0  # row-aligned stand-ins for images

    def predict(queries: Tensor) -> Tensor:
        seen.append(queries)
        return t.predict(queries.reshape(len(queries), -1) / 2.0)

    same = AttackTarget(
        predict=predict,
        features=t.features,
        labels=t.labels,
        is_member=t.is_member,
        num_classes=10,
        inputs=images,
    )
    results = setup.prepared.attack(same)
    assert len(seen) == 1 and seen[0] is images
    # the same probabilities, so the same scores as querying with the features; the attacks
    # that query the release on their own feature rows (RMIA) are left out
    by_name = {r.attack: r for r in setup.prepared.attack(t)}
    left_out = {a.name for a in setup.prepared.attacks if a.queries_release}
    assert left_out and set(by_name) - {r.attack for r in results} == left_out
    for a in results:
        assert a.mia_auc == pytest.approx(by_name[a.attack].mia_auc, abs=1e-12), a.attack
    synthetic = AttackConfig(shadow_data=ShadowDataSource.SYNTHETIC)
    with pytest.raises(ValueError, match="synthesises feature vectors"):
        run_attacks(target=same, knowledge=setup.knowledge, config=synthetic, seed=0)
    with pytest.raises(ValueError, match="inputs must have q=200 rows"):
        AttackTarget(
            predict=predict,
            features=t.features,
            labels=t.labels,
            is_member=t.is_member,
            num_classes=10,
            inputs=images[:5],
        )


@pytest.mark.parametrize("train_size", [None, 60, 150])
def test_every_bank_trains_heads_on_the_victims_number_of_rows(
    digits: tuple[Tensor, Tensor, np.ndarray], train_size: int | None
) -> None:
    x, y, perm = digits
    k = _knowledge(x, y, perm)  # a pool of 200 rows
    k = AttackerKnowledge(
        features=k.features,
        labels=k.labels,
        trainer=k.trainer,
        num_classes=10,
        train_size=train_size,
    )
    cand = x[perm[: 2 * MEMBERS]], y[perm[: 2 * MEMBERS]]  # 200 candidates
    context = ShadowContext(
        knowledge=k,
        config=AttackConfig(num_shadow=4, num_reference=8, heads_per_seed=8),
        seed=0,
        candidates=cand,
    )
    n = 100 if train_size is None else train_size  # None: half the pool
    shadow, (online, pool_rows) = context.shadow_bank(), context.online_bank()
    assert (shadow.in_mask.sum(1) == min(n, 100)).all()
    # online: min(n, q/2) candidates per head, the rest from the pool (up to half of it)
    from_candidates = online.in_mask[:, pool_rows:].sum(1)
    assert (from_candidates == min(n, 100)).all()
    assert (online.in_mask.sum(1) == min(n, 200)).all()
    assert pool_rows == (200 if n > 100 else 0)
    # every candidate is in as many references as the others, up to one: half of them (4 of
    # 8) when heads hold half the candidates, 8 * 60 / 200 = 2.4 when they hold 60
    share = online.in_mask[:, pool_rows:].sum(0)
    assert share.max() - share.min() <= 1
    assert share.mean() == pytest.approx(8 * min(n, 100) / 200)
    capped = [note for note in context.notes if "fewer than the victim's" in note]
    assert bool(capped) == (n > 100)


def test_clean_attacker_rows_get_a_suffix_and_the_best_row_is_over_all(
    digits: tuple[Tensor, Tensor, np.ndarray],
) -> None:
    x, y, perm = digits
    target, k = _target(x, y, perm), _knowledge(x, y, perm)
    cand = target.features, target.labels
    prepared = prepare_attacks(
        names=["loss", "lira-online"],
        knowledge=k,
        config=SMALL,
        seed=0,
        candidate_features=cand[0],
        candidate_labels=cand[1],
    )
    plain = prepared.attack(target)
    clean = prepared.attack(target, suffix=CLEAN_SUFFIX)
    assert [r.attack for r in clean] == ["loss-clean", "lira-online-clean"]
    for a, b in zip(plain, clean, strict=True):  # same attacker, same split: same numbers
        assert a.to_row() | {"attack": b.attack} == b.to_row()
    both = plain + clean
    assert best_attack(both) is max(both, key=lambda r: r.mia_auc)
    aggregated = aggregate_results(both)
    assert best_attack(aggregated).attack == best_attack(both).attack
    with pytest.raises(ValueError, match="finite AUC"):
        best_attack([])


def test_a_claim_above_the_ceiling_is_noted_on_every_release(
    digits: tuple[Tensor, Tensor, np.ndarray],
) -> None:
    x, y, perm = digits
    target, k = _target(x, y, perm), _knowledge(x, y, perm)
    prepared = prepare_attacks(names=["correctness"], knowledge=k, config=SMALL, seed=0)
    for claim, noted in [(4.0, True), (1.0, False), (math.inf, False)]:
        (result,) = prepared.attack(dataclasses.replace(target, claimed_epsilon=claim))
        # 100 + 100 examples, split-half: 50 + 50 trials cap the bound at
        # ln((1 - u) / u) with u = 1 - 0.025^(1/50), i.e. 2.570 < 4
        u = 1 - 0.025 ** (1 / 50)
        assert result.eps_lower_bound_ceiling == pytest.approx(math.log((1 - u) / u))
        assert any("cannot see a violation" in n for n in result.notes) == noted, claim
    with pytest.raises(ValueError, match="claimed_epsilon=0"):
        dataclasses.replace(target, claimed_epsilon=0.0)


def test_candidate_attacks_keep_the_candidates_not_the_reference_bank(
    digits: tuple[Tensor, Tensor, np.ndarray],
) -> None:
    """Online and offline LiRA and RMIA keep the candidates' features to check a query
    against: the tensor they were given, not a view into the reference bank's pool and
    candidates (one concatenation, 800 MB at 5*10^4 members, that a view kept alive)."""
    x, y, perm = digits
    # 150 training rows: 100 candidates and 50 pool rows each, so the bank is pool + candidates
    k = dataclasses.replace(_knowledge(x, y, perm), train_size=150)
    candidates = x[perm[: 2 * MEMBERS]], y[perm[: 2 * MEMBERS]]
    context = ShadowContext(knowledge=k, config=SMALL, seed=0, candidates=candidates)
    bank, n_pool = context.online_bank()
    assert n_pool == 2 * MEMBERS and bank.features.shape[0] == n_pool + len(candidates[0])
    assert torch.equal(bank.features[n_pool:], candidates[0])
    names = ["lira-online", "lira-offline", "rmia-online", "rmia-offline"]
    prepared = prepare_attacks(
        names=names,
        knowledge=k,
        config=SMALL,
        seed=0,
        candidate_features=candidates[0],
        candidate_labels=candidates[1],
    )
    for attack in prepared.attacks:
        assert attack.fitted.features is candidates[0], attack.name  # type: ignore[attr-defined]
    results = prepared.attack(_target(x, y, perm))  # the same candidates: accepted
    assert [r.attack for r in results] == names


@pytest.mark.parametrize("model", [ShadowModel.GBM, ShadowModel.MLP])
def test_the_shadow_classifier_trains_beside_the_next_fits_with_the_same_values(
    digits: tuple[Tensor, Tensor, np.ndarray], monkeypatch: pytest.MonkeyPatch, model: ShadowModel
) -> None:
    """With two intra-op threads in this process, the shadow attack's classifier trains on a
    side thread (``Attack.begin_fit``'s rest) with the caller's thread count, while the next
    attacks fit: every score equals that of the fits one after the other. An error in the rest
    reaches the caller."""
    import threading

    from alm_opacus.attacks import runner, shadow

    x, y, perm = digits
    target, k = _target(x, y, perm), _knowledge(x, y, perm)
    config = dataclasses.replace(SMALL, shadow_model=model)
    names = ["shadow", "loss", "lira-offline", "rmia-offline"]
    fitter = shadow._FITTERS[model]
    seen: list[tuple[str, int]] = []

    def watched(*args, **kwargs):  # type: ignore[no-untyped-def]
        seen.append((threading.current_thread().name, torch.get_num_threads()))
        return fitter(*args, **kwargs)

    monkeypatch.setitem(shadow._FITTERS, model, watched)
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        side = run_attacks(names=names, target=target, knowledge=k, config=config, seed=3)
        with monkeypatch.context() as m:
            m.setattr(runner, "runs_here", lambda map_units: False)
            serial = run_attacks(names=names, target=target, knowledge=k, config=config, seed=3)

        def failing(*args, **kwargs):  # type: ignore[no-untyped-def]
            raise RuntimeError("boosting failed")

        monkeypatch.setitem(shadow._FITTERS, model, failing)
        with pytest.raises(RuntimeError, match="boosting failed"):
            run_attacks(names=names, target=target, knowledge=k, config=config, seed=3)
    finally:
        torch.set_num_threads(before)
    assert seen[0][0].startswith("attack-fit") and seen[1][0] == "MainThread"
    assert seen[0][1] == seen[1][1] == 2
    for a, b in zip(side, serial, strict=True):
        assert a.attack == b.attack
        np.testing.assert_array_equal(a.scores, b.scores)
