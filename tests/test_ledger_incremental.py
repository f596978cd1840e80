"""Releases in milliseconds (issue 38, item 3): the ledger composes one release at a time and
calibrations are memoised, with the same statements as composing everything from scratch."""

from __future__ import annotations

import copy
import math
import random
from typing import ClassVar

import numpy as np
import pytest
import torch

from alm_opacus.accounting import PipelineAccountant, divergence
from alm_opacus.mechanisms import analysis, create_mechanism
from alm_opacus.mechanisms.exact import plan_release
from alm_opacus.mechanisms.gaussian import GaussianMechanism
from alm_opacus.posttraining import memo
from alm_opacus.posttraining.ledger import LedgerRecord, _Running, compose_records
from alm_opacus.protect import PostTrainingPrivacyEngine, SensitivityInfo
from alm_opacus.statement import Guarantee, SensitivitySource

L2 = SensitivityInfo(value=0.5, norm="l2", source=SensitivitySource.ANALYTIC)
L1 = SensitivityInfo(value=0.5, norm="l1", source=SensitivitySource.ANALYTIC)
SIGMA = analysis.analytic_gaussian_scale(epsilon=1.0, delta=1e-5, sensitivity=0.5)


def _gauss(relation: str = "replace-one", scale: float = SIGMA) -> LedgerRecord:
    return LedgerRecord(
        guarantee=Guarantee.APPROX_DP,
        epsilon=1.0,
        delta=1e-5,
        neighbouring=relation,
        mechanism="gaussian",
        scale=scale,
        sensitivity=0.5,
        dim=10,
    )


def _laplace(relation: str = "replace-one") -> LedgerRecord:
    return LedgerRecord(
        guarantee=Guarantee.PURE_DP,
        epsilon=1.0,
        delta=0.0,
        neighbouring=relation,
        mechanism="laplace",
        scale=0.5,
        sensitivity=0.5,
        dim=10,
    )


#: What a release can be: with and without a privacy-loss distribution, both relations,
#: random DP and no guarantee.
KINDS = {
    "gauss": _gauss(),
    "gauss2": _gauss(scale=2 * SIGMA),
    "laplace": _laplace(),
    "gauss-add-remove": _gauss("add-remove"),
    "bare-approx": LedgerRecord(
        guarantee=Guarantee.APPROX_DP, epsilon=0.5, delta=1e-6, neighbouring="replace-one"
    ),
    "bare-pure": LedgerRecord(
        guarantee=Guarantee.PURE_DP, epsilon=0.25, delta=0.0, neighbouring="replace-one"
    ),
    "random": LedgerRecord(
        guarantee=Guarantee.RANDOM_DP,
        epsilon=1.0,
        delta=0.0,
        neighbouring="replace-one",
        gamma=0.01,
        confidence=0.999,
    ),
    "none": LedgerRecord(guarantee=Guarantee.NONE, epsilon=math.inf, delta=0.0, neighbouring=""),
}

SEQUENCES = [
    ["gauss"] * 5,
    ["gauss", "laplace", "gauss2", "laplace", "gauss"],
    ["gauss", "gauss", "gauss-add-remove", "gauss", "laplace"],  # a second relation
    ["gauss", "bare-approx", "gauss"],  # a release without a PLD
    ["laplace", "bare-pure", "laplace"],
    ["gauss", "gauss2", "random", "gauss"],
    ["gauss", "gauss", "none", "gauss"],
    ["gauss-add-remove", "laplace", "gauss-add-remove"],
]


@pytest.mark.parametrize("names", SEQUENCES)
def test_the_kept_composition_equals_composing_every_release_again(names: list[str]) -> None:
    running = _Running()
    records: list[LedgerRecord] = []
    for name in names:
        records.append(KINDS[name])
        # exact equality: the kept PLD is extended by the same left fold
        assert running.add(KINDS[name]) == compose_records(records)
    assert running.total == compose_records(records) and running.total.releases == len(names)


def test_the_accountant_uses_the_kept_composition_only_when_it_helps() -> None:
    # The mixes above exercise the tight path: a Gaussian and Laplace mix uses it.
    running = _Running()
    for name in ["gauss", "laplace", "gauss2", "gauss"]:
        running.add(KINDS[name])
    assert running.total.composition == "pld" and running.total.epsilon < 4.0


@pytest.mark.parametrize(
    ("scales", "delta"),
    [([SIGMA] * 4, 4e-5), ([SIGMA, 2 * SIGMA, SIGMA, 3 * SIGMA], 4e-5), ([SIGMA] * 57, 5.7e-4)],
)
def test_gaussian_releases_compose_exactly_as_dp_accounting_bounds_them(
    scales: list[float], delta: float
) -> None:
    """Gaussian releases only are composed exactly (one Gaussian mechanism, μ = sqrt(Σμᵢ²)):
    dp_accounting's pessimistic PLD composition of the same releases, on a fine grid, bounds
    that ε from above and agrees with it to its grid."""
    from dp_accounting.pld import privacy_loss_distribution as pld_lib

    running = _Running()
    for scale in scales:
        running.add(_gauss(scale=scale))
    total = running.total
    assert total.composition == "gaussian" and total.delta == pytest.approx(delta)
    plds = [
        pld_lib.from_gaussian_mechanism(s, sensitivity=0.5, value_discretization_interval=1e-4)
        for s in scales
    ]
    composed = plds[0]
    for other in plds[1:]:
        composed = composed.compose(other)
    reference = composed.get_epsilon_for_delta(total.delta)
    assert total.epsilon <= reference <= total.epsilon + 1e-3 * len(scales)
    # the exact curve itself: δ(ε) of the composed Gaussian at the stated ε is the target
    mu = math.sqrt(sum((0.5 / s) ** 2 for s in scales))
    at = analysis.gaussian_delta(epsilon=total.epsilon, scale=1.0, sensitivity=mu)
    assert at <= total.delta and at == pytest.approx(total.delta, rel=1e-6)


def test_a_random_mix_of_releases_composes_as_from_scratch() -> None:
    rng = random.Random(38)
    names = sorted(KINDS)
    for _ in range(3):
        running = _Running()
        records: list[LedgerRecord] = []
        for _ in range(6):
            record = KINDS[rng.choice(names)]
            records.append(record)
            assert running.add(record) == compose_records(records)


def test_a_rebuilt_composition_equals_the_kept_one() -> None:
    # A merge of two ledgers composes the joined records again: same total as kept ones.
    records = [KINDS[n] for n in ["gauss", "laplace", "gauss2", "gauss"]]
    kept = _Running()
    for r in records:
        kept.add(r)
    assert _Running(records).total == kept.total == compose_records(records)


def test_the_accountant_extends_a_kept_composition_to_the_same_bits() -> None:
    grown = PipelineAccountant()
    grown.step(noise_multiplier=1.1, sample_rate=0.01, num_steps=50)
    for k in range(4):
        grown.record_release(
            mechanism="gaussian", scale=SIGMA * (1 + k), sensitivity=0.5, neighbouring="add-remove"
        )
        fresh = PipelineAccountant()
        fresh.history = list(grown.history)
        fresh.releases = copy.deepcopy(grown.releases)
        assert grown.get_epsilon(1e-5) == fresh.get_epsilon(1e-5)
        a = grown.privacy_loss_distribution(value_discretization_interval=1e-3)
        b = fresh.privacy_loss_distribution(value_discretization_interval=1e-3)
        assert a is not None and b is not None
        assert np.array_equal(
            a._pmf_remove.to_dense_pmf()._probs, b._pmf_remove.to_dense_pmf()._probs
        )


def test_engine_statements_equal_the_from_scratch_composition_of_its_releases() -> None:
    torch.manual_seed(0)
    head = torch.nn.Linear(6, 3)
    engine = PostTrainingPrivacyEngine(mechanism="gaussian")
    records = []
    for k in range(6):
        release = engine.make_private(head, epsilon=1.0 + k / 4, delta=1e-6, sensitivity=L2)
        s = release.statement
        records.append(LedgerRecord.from_statement(s, dim=head.weight.numel() + 3))
        expected = compose_records(records)
        assert (s.epsilon_spent, s.delta_spent, s.guarantee_spent) == (
            expected.epsilon,
            expected.delta,
            expected.guarantee,
        )
    assert engine.spent(head) == compose_records(records)
    assert engine.spent(head).composition == "gaussian"  # Gaussian releases only: exact


def test_merged_ledgers_state_the_composition_of_every_release_of_both() -> None:
    torch.manual_seed(0)
    head = torch.nn.Linear(6, 3)
    twin = copy.deepcopy(head)
    with torch.no_grad():
        twin.weight.add_(1.0)
    engine = PostTrainingPrivacyEngine(mechanism="gaussian")
    dim = head.weight.numel() + 3
    firsts = [
        engine.make_private(m, epsilon=e, delta=1e-6, sensitivity=L2).statement
        for m, e in ((head, 1.0), (head, 0.5), (twin, 2.0), (twin, 1.0))
    ]
    with torch.no_grad():
        twin.weight.sub_(1.0)  # now equal to head: its object and its values name two ledgers
    last = engine.make_private(twin, epsilon=0.25, delta=1e-6, sensitivity=L2).statement
    # the merged ledger keeps head's releases, then twin's, then the new one
    records = [LedgerRecord.from_statement(s, dim=dim) for s in [*firsts, last]]
    expected = compose_records(records)
    assert last.epsilon_spent == expected.epsilon and last.delta_spent == expected.delta
    assert expected.releases == 5 and expected.composition == "gaussian"
    assert engine.spent(head) == engine.spent(twin) == expected


# --- the calibration memo -----------------------------------------------------------------


class _Counting(GaussianMechanism):
    """A Gaussian mechanism that counts its calibrations (and may scale them)."""

    calls: ClassVar[int] = 0

    def __init__(self, factor: float = 1.0) -> None:
        self.factor = factor

    def _calibrate(self, *, epsilon: float, delta: float, sensitivity: float) -> float:
        type(self).calls += 1
        return self.factor * super()._calibrate(
            epsilon=epsilon, delta=delta, sensitivity=sensitivity
        )


def _head(dtype: torch.dtype = torch.float64) -> torch.nn.Linear:
    torch.manual_seed(0)
    return torch.nn.Linear(128, 10).to(dtype)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float16])
def test_a_memo_hit_calibrates_nothing_and_states_the_same(dtype: torch.dtype) -> None:
    memo.clear()
    _Counting.calls = 0
    one = PostTrainingPrivacyEngine(mechanism=_Counting())
    first = one.make_private(_head(dtype), epsilon=0.01, delta=1e-5, sensitivity=L2, seed=3)
    calls = _Counting.calls
    assert calls >= 2  # the caller's sensitivity, then the grid's (and each widening)
    two = PostTrainingPrivacyEngine(mechanism=_Counting())  # another instance, same state
    again = two.make_private(_head(dtype), epsilon=0.01, delta=1e-5, sensitivity=L2, seed=3)
    assert _Counting.calls == calls  # everything from the memo
    assert again.statement == first.statement
    for a, b in zip(again.parameters(), first.parameters(), strict=True):
        assert torch.equal(a, b)
    assert memo.stats()["hits"] >= 2


def test_the_memo_never_answers_for_other_inputs() -> None:
    memo.clear()
    gauss, classic = create_mechanism("gaussian"), create_mechanism("gaussian-classic")
    epsilons: list[float] = [0.5, math.nextafter(0.5, 1.0), 1, 1.0, float(np.float64(0.3)), 0.3]
    cases = [
        (mech, eps, delta, sens)
        for mech in (gauss, classic, _Counting(1.0), _Counting(2.0))
        for eps in epsilons
        for delta in (1e-5, math.nextafter(1e-5, 1.0))
        for sens in (0.5, math.nextafter(0.5, 0.0))
    ]
    cases.append((gauss, np.float64(0.5), 1e-5, 0.5))  # a numpy float has its own entry
    for _ in range(2):  # the second round answers from the memo
        for mech, eps, delta, sens in cases:
            direct = mech.calibrate(epsilon=eps, delta=delta, sensitivity=sens)
            assert memo.cached_calibrate(mech, epsilon=eps, delta=delta, sensitivity=sens) == direct
    # the neighbouring floats do calibrate differently: the test can tell a confusion
    scales = {
        memo.cached_calibrate(gauss, epsilon=e, delta=1e-5, sensitivity=0.5) for e in epsilons
    }
    assert len(scales) >= 3


def test_the_memo_does_not_store_what_raises_and_stays_bounded(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    memo.clear()
    gauss = create_mechanism("gaussian")
    for _ in range(2):
        with pytest.raises(ValueError, match="epsilon"):
            memo.cached_calibrate(gauss, epsilon=-1.0, delta=1e-5, sensitivity=0.5)
    assert memo.stats()["scales"] == 0
    monkeypatch.setattr(memo, "MAX_ENTRIES", 3)
    for k in range(1, 6):
        memo.cached_calibrate(gauss, epsilon=float(k), delta=1e-5, sensitivity=0.5)
    assert memo.stats()["scales"] == 3
    # a tensor argument is not keyed: calibrated every time, as before
    scale = memo.cached_calibrate(gauss, epsilon=torch.tensor(1.0), delta=1e-5, sensitivity=0.5)  # type: ignore[arg-type]
    assert scale == gauss.calibrate(epsilon=1.0, delta=1e-5, sensitivity=0.5)


@pytest.mark.parametrize("epsilon", [1.0, 0.01, 0.001])
def test_the_widened_grid_of_a_narrow_head_is_unchanged(epsilon: float) -> None:
    memo.clear()
    gauss = create_mechanism("gaussian")
    kwargs = {"epsilon": epsilon, "delta": 1e-5, "sensitivity": 0.1, "dim": 1290}
    for dtype in (torch.float32, torch.float64):  # float16 and bfloat16 heads plan in float32
        direct = plan_release(mechanism=gauss, dtype=dtype, **kwargs)  # type: ignore[arg-type]
        assert memo.cached_plan(gauss, dtype=dtype, **kwargs) == direct  # type: ignore[arg-type]
        assert memo.cached_plan(gauss, dtype=dtype, **kwargs) == direct  # type: ignore[arg-type]
    wide = memo.cached_plan(gauss, dtype=torch.float32, **kwargs)  # type: ignore[arg-type]
    fine = memo.cached_plan(gauss, dtype=torch.float64, **kwargs)  # type: ignore[arg-type]
    if epsilon == 0.001:  # 40 scales exceed float32's 2^24 cells: the grid widens
        assert wide.grid.exponent > fine.grid.exponent and wide.scale > fine.scale


# --- epsilon of a PLD, scanned in chunks --------------------------------------------------


def test_scanning_a_pld_in_chunks_gives_the_same_epsilon() -> None:
    rng = np.random.default_rng(0)
    for n in (1, 6, 100, 5000):
        losses = np.sort(rng.normal(0.0, 5.0, n))
        probs = rng.dirichlet(np.ones(n))
        probs[rng.random(n) < 0.05] = -1e-17  # FFT round-off, dropped
        for inf_mass in (0.0, 1e-9):
            for delta in (1e-12, 1e-6, 1e-3, 0.3, 0.99):
                whole = divergence._epsilon(losses, probs, inf_mass, delta, chunk=n + 1)
                for chunk in (1, 7, 64):
                    assert divergence._epsilon(losses, probs, inf_mass, delta, chunk=chunk) == whole
