"""The per-model ledger (issue 23, item 1): releases keep their kind, totals are stated as the
weakest kind with every parameter, and a dtype cast or device move keeps the ledger."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from dp_accounting import dp_event
from dp_accounting.pld import pld_privacy_accountant

from alm_opacus.mechanisms import analysis
from alm_opacus.posttraining.ledger import LedgerRecord, compose_records, weight_keys
from alm_opacus.protect import PostTrainingPrivacyEngine, SensitivityInfo
from alm_opacus.statement import Guarantee

L1 = SensitivityInfo(value=0.5, norm="l1", source="analytic")
L2 = SensitivityInfo(value=0.5, norm="l2", source="analytic")
SAMPLED = SensitivityInfo(
    value=0.5,
    norm="l1",
    source="sampled",
    m=200,
    gamma=0.05,
    confidence=0.999,
    population="a public sample",
)


def _pure(epsilon: float, relation: str = "replace-one") -> LedgerRecord:
    return LedgerRecord(
        guarantee=Guarantee.PURE_DP, epsilon=epsilon, delta=0.0, neighbouring=relation
    )


def _approx(epsilon: float, delta: float, relation: str = "replace-one") -> LedgerRecord:
    return LedgerRecord(
        guarantee=Guarantee.APPROX_DP, epsilon=epsilon, delta=delta, neighbouring=relation
    )


def _random(epsilon: float, gamma: float, confidence: float, delta: float = 0.0) -> LedgerRecord:
    return LedgerRecord(
        guarantee=Guarantee.RANDOM_DP,
        epsilon=epsilon,
        delta=delta,
        neighbouring="replace-one",
        gamma=gamma,
        confidence=confidence,
    )


@pytest.fixture
def head() -> torch.nn.Linear:
    torch.manual_seed(0)
    return torch.nn.Linear(6, 3)


def test_nothing_released_spends_nothing() -> None:
    total = compose_records([])
    assert (total.epsilon, total.delta, total.releases) == (0.0, 0.0, 0)


@pytest.mark.parametrize(
    ("records", "kind", "epsilon", "delta"),
    [
        ([_pure(1.0), _pure(0.5)], Guarantee.PURE_DP, 1.5, 0.0),
        # records without a noise description: basic composition only
        ([_pure(1.0), _approx(2.0, 1e-6)], Guarantee.APPROX_DP, 3.0, 1e-6),
        ([_approx(1.0, 1e-6), _approx(2.0, 2e-6)], Guarantee.APPROX_DP, 3.0, 3e-6),
    ],
)
def test_pure_and_approximate_dp_compose_by_basic_composition(
    records: list[LedgerRecord], kind: Guarantee, epsilon: float, delta: float
) -> None:
    total = compose_records(records)
    assert total.guarantee is kind and total.releases == len(records)
    assert total.epsilon == pytest.approx(epsilon, rel=1e-15)
    assert total.delta == pytest.approx(delta, rel=1e-15)
    assert total.gamma is None and total.composition == "basic"


def test_random_dp_composes_its_gammas_and_stays_random_dp() -> None:
    total = compose_records([_random(1.0, 0.05, 0.999), _random(0.5, 0.02, 0.99, delta=1e-6)])
    assert total.guarantee is Guarantee.RANDOM_DP
    assert total.epsilon == 1.5 and total.delta == 1e-6
    # union bounds: over neighbouring pairs (gamma) and over the two samplers (confidence)
    assert total.gamma == pytest.approx(0.07) and total.confidence == pytest.approx(0.989)


@pytest.mark.parametrize("strong", [_pure(2.0), _approx(2.0, 1e-5)])
def test_random_dp_mixed_with_dp_is_random_dp_with_every_parameter(strong: LedgerRecord) -> None:
    # Issue 23: the ledger used to add a random-DP epsilon into a total labelled pure.
    total = compose_records([strong, _random(1.0, 0.05, 0.999)])
    assert total.guarantee is Guarantee.RANDOM_DP
    assert total.epsilon == 3.0 and total.delta == strong.delta
    assert total.gamma == 0.05 and total.confidence == 0.999


@pytest.mark.parametrize(
    "records",
    [
        [
            _pure(1.0),
            LedgerRecord(guarantee=Guarantee.NONE, epsilon=math.inf, delta=0.0, neighbouring=""),
        ],
        [_random(1.0, 0.5, 0.9), _random(1.0, 0.6, 0.9)],  # gammas past 1: nothing left
        [_approx(1.0, 0.6), _approx(1.0, 0.6)],  # deltas past 1
        [
            _pure(1.0),
            LedgerRecord(
                guarantee=Guarantee.RANDOM_DP,
                epsilon=1.0,
                delta=0.0,
                neighbouring="add-remove",
                gamma=0.1,
                confidence=0.9,
            ),
        ],
    ],
)
def test_what_bounds_nothing_leaves_no_guarantee(records: list[LedgerRecord]) -> None:
    total = compose_records(records)
    assert total.guarantee is Guarantee.NONE and total.epsilon == math.inf and total.notes


def test_mixed_relations_are_stated_under_replace_one_by_group_privacy() -> None:
    total = compose_records([_pure(1.0), _approx(0.5, 1e-6, relation="add-remove")])
    assert total.neighbouring == "replace-one" and total.guarantee is Guarantee.APPROX_DP
    assert total.epsilon == pytest.approx(1.0 + 2 * 0.5)
    assert total.delta == pytest.approx((1 + math.exp(0.5)) * 1e-6)


def test_laplace_and_gaussian_releases_compose_through_the_accountant() -> None:
    # Independent reference: dp_accounting's PLD accountant on the same two mechanisms.
    laplace = LedgerRecord(
        guarantee=Guarantee.PURE_DP,
        epsilon=1.0,
        delta=0.0,
        neighbouring="replace-one",
        mechanism="laplace",
        scale=0.5,
        sensitivity=0.5,
        dim=10,
    )
    sigma = analysis.analytic_gaussian_scale(epsilon=1.0, delta=1e-5, sensitivity=0.5)
    gauss = LedgerRecord(
        guarantee=Guarantee.APPROX_DP,
        epsilon=1.0,
        delta=1e-5,
        neighbouring="replace-one",
        mechanism="gaussian",
        scale=sigma,
        sensitivity=0.5,
        dim=10,
    )
    total = compose_records([laplace, gauss])
    reference = pld_privacy_accountant.PLDAccountant(value_discretization_interval=1e-5)
    reference.compose(dp_event.LaplaceDpEvent(noise_multiplier=1.0))  # b / sensitivity
    reference.compose(dp_event.GaussianDpEvent(noise_multiplier=sigma / 0.5))
    expected = reference.get_epsilon(1e-5)
    assert total.composition == "pld" and total.guarantee is Guarantee.APPROX_DP
    assert total.epsilon < 2.0 and total.delta == 1e-5
    # both pessimistic, on grids 1e-4 (ours) and 1e-5: they agree to about two grid steps
    assert total.epsilon == pytest.approx(expected, abs=3e-4)


def test_the_engine_states_each_total_in_its_statement(head: torch.nn.Linear) -> None:
    alm = PostTrainingPrivacyEngine(mechanism="alm")
    alm.make_private(head, epsilon=1.0, sensitivity=L1)
    mixed = alm.make_private(head, epsilon=2.0, sensitivity=SAMPLED).statement
    assert mixed.guarantee_spent is Guarantee.RANDOM_DP and mixed.epsilon_spent == 3.0
    assert mixed.gamma_spent == 0.05 and mixed.confidence_spent == 0.999
    assert "epsilon=3, delta=0, gamma=0.05 with confidence 0.999 (random-DP, not DP" in str(mixed)
    assert alm.spent(head).guarantee is Guarantee.RANDOM_DP and alm.spent(head).releases == 2


def test_two_gaussian_releases_compose_as_one_gaussian(head: torch.nn.Linear) -> None:
    gauss = PostTrainingPrivacyEngine(mechanism="gaussian")
    first = gauss.make_private(head, epsilon=1.0, delta=1e-6, sensitivity=L2).statement
    last = gauss.make_private(head, epsilon=1.0, delta=2e-6, sensitivity=L2).statement
    assert first.noise_scale is not None and last.noise_scale is not None
    # Two Gaussian releases are one Gaussian with mu^2 = mu_1^2 + mu_2^2: exact reference.
    # Each exact release's noise is calibrated to its grid's sensitivity (0.5 plus rounding).
    assert first.grid_sensitivity is not None and last.grid_sensitivity is not None
    assert 0.5 < first.grid_sensitivity <= 0.5 * (1 + 2**-7)
    mu = math.hypot(
        first.grid_sensitivity / first.noise_scale, last.grid_sensitivity / last.noise_scale
    )
    exact = analysis.gaussian_epsilon(delta=3e-6, scale=1.0, sensitivity=mu)
    assert last.delta_spent == pytest.approx(3e-6) and last.guarantee_spent is Guarantee.APPROX_DP
    # the ledger composes Gaussian releases exactly (no grid), rounded up by a hair
    assert exact <= last.epsilon_spent <= exact * (1 + 1e-9) < 2.0
    assert gauss.spent(head).composition == "gaussian"


@pytest.mark.parametrize(
    "change",
    [
        lambda m: m.double(),  # in place: the same object
        lambda m: copy.deepcopy(m).double(),  # a float64 copy
        lambda m: copy.deepcopy(m).half(),  # a float16 copy
        lambda m: copy.deepcopy(m).to(torch.bfloat16),
        lambda m: copy.deepcopy(m).to("cpu"),  # a device move (CPU here; digests use the CPU)
    ],
)
def test_a_cast_or_moved_head_keeps_its_ledger(head: torch.nn.Linear, change) -> None:  # type: ignore[no-untyped-def]
    # Issue 23: casting the head to float64 started a fresh ledger at full budget.
    engine = PostTrainingPrivacyEngine(mechanism="laplace")
    engine.make_private(head, epsilon=1.0, sensitivity=L1)
    again = engine.make_private(change(head), epsilon=1.0, sensitivity=L1).statement
    assert again.epsilon_spent == 2.0


def test_a_head_trained_on_in_place_keeps_its_ledger_and_another_does_not(
    head: torch.nn.Linear,
) -> None:
    engine = PostTrainingPrivacyEngine(mechanism="laplace")
    engine.make_private(head, epsilon=1.0, sensitivity=L1)
    with torch.no_grad():
        head.weight.add_(1.0)  # trained further on the same members: same object, same ledger
    assert engine.make_private(head, epsilon=1.0, sensitivity=L1).statement.epsilon_spent == 2.0
    other = torch.nn.Linear(6, 3)
    assert engine.make_private(other, epsilon=1.0, sensitivity=L1).statement.epsilon_spent == 1.0


def test_one_model_seen_as_two_ledgers_merges_them(head: torch.nn.Linear) -> None:
    engine = PostTrainingPrivacyEngine(mechanism="laplace")
    twin = copy.deepcopy(head)
    with torch.no_grad():
        twin.weight.add_(1.0)
    engine.make_private(head, epsilon=1.0, sensitivity=L1)
    engine.make_private(twin, epsilon=0.5, sensitivity=L1)
    with torch.no_grad():
        twin.weight.sub_(1.0)  # now equal to head: its object and its values name two ledgers
    assert engine.make_private(twin, epsilon=0.25, sensitivity=L1).statement.epsilon_spent == 1.75


def test_weight_keys_differ_for_different_weights_and_match_across_casts() -> None:
    torch.manual_seed(1)
    a, b = torch.nn.Linear(4, 2), torch.nn.Linear(4, 2)
    keys = set(weight_keys(a))
    assert len(keys) == 3 and not keys & set(weight_keys(b))
    assert weight_keys(copy.deepcopy(a).double()) == weight_keys(a)
    assert weight_keys(a.half())[1] in keys  # its float16 key is one a had
