"""`PipelineAccountant` against Opacus's prv accountant and dp_accounting composed by hand."""

from __future__ import annotations

import io
import math

import pytest
import torch
from dp_accounting import dp_event
from dp_accounting.pld import PLDAccountant
from dp_accounting.pld import privacy_loss_distribution as pld_lib
from opacus import PrivacyEngine
from opacus.accountants import PRVAccountant, create_accountant
from opacus.accountants.utils import get_noise_multiplier

import alm_opacus.accounting.accountant as accountant_module
from alm_opacus.accounting import ACCOUNTANT_NAME, PipelineAccountant, release_pld


def dpsgd(accountant, *, sigma, q, steps):
    for _ in range(steps):
        accountant.step(noise_multiplier=sigma, sample_rate=q)


@pytest.mark.parametrize(
    ("sigma", "q", "steps"), [(1.0, 0.01, 1000), (0.8, 0.004, 2000), (2.0, 0.1, 200)]
)
def test_pure_dpsgd_agrees_with_opacus_prv(sigma, q, steps):
    ours = PipelineAccountant()
    dpsgd(ours, sigma=sigma, q=q, steps=steps)
    prv = PRVAccountant()
    dpsgd(prv, sigma=sigma, q=q, steps=steps)
    assert ours.history == prv.history
    delta = 1e-5
    assert ours.get_epsilon(delta) == pytest.approx(prv.get_epsilon(delta), rel=0.01)


def mixed_history():
    acc = PipelineAccountant()
    dpsgd(acc, sigma=1.1, q=0.02, steps=100)
    acc.record_release(mechanism="gaussian", scale=3.0, sensitivity=1.5)
    acc.record_release(mechanism="laplace", scale=2.0, sensitivity=0.5, dim=1)
    # a vector: the scalar profile too, since one coordinate dominates (Theorem 3)
    acc.record_release(mechanism="logistic", scale=4.0, sensitivity=1.0)
    acc.record_release(mechanism="alm", scale=2.0, sensitivity=1.0, dim=1)
    return acc


def test_mixed_history_matches_dp_accounting_composed_by_hand():
    h = 1e-4
    by_hand = (
        pld_lib.from_gaussian_mechanism(1.1, sampling_prob=0.02, value_discretization_interval=h)
        .self_compose(100)
        .compose(pld_lib.from_gaussian_mechanism(3.0, sensitivity=1.5))
        .compose(pld_lib.from_laplace_mechanism(2.0, sensitivity=0.5))
        .compose(release_pld(mechanism="alm", scale=4.0, sensitivity=1.0, dim=1))
        .compose(release_pld(mechanism="alm", scale=2.0, sensitivity=1.0, dim=1))
    )
    acc = mixed_history()
    for delta in [1e-3, 1e-5, 1e-8]:
        ours = acc.get_epsilon(delta, value_discretization_interval=h)
        assert ours == pytest.approx(by_hand.get_epsilon_for_delta(delta), 1e-9)
    ours = acc.get_delta(2.0, value_discretization_interval=h)
    assert ours == pytest.approx(by_hand.get_delta_for_epsilon(2.0), rel=1e-9)


def test_mixed_history_matches_dp_accounting_events():
    # DpEvent accountant: an independent route for DP-SGD, Gaussian and scalar Laplace.
    acc = PipelineAccountant()
    dpsgd(acc, sigma=1.1, q=0.02, steps=100)
    acc.record_release(mechanism="gaussian", scale=3.0, sensitivity=1.5)
    acc.record_release(mechanism="laplace", scale=2.0, sensitivity=0.5, dim=1)
    ref = PLDAccountant()
    ref.compose(
        dp_event.ComposedDpEvent(
            [
                dp_event.SelfComposedDpEvent(
                    dp_event.PoissonSampledDpEvent(0.02, dp_event.GaussianDpEvent(1.1)), 100
                ),
                dp_event.GaussianDpEvent(3.0 / 1.5),
                dp_event.LaplaceDpEvent(2.0 / 0.5),
            ]
        )
    )
    assert acc.get_epsilon(1e-5) == pytest.approx(ref.get_epsilon(1e-5), rel=0.01)


def test_adding_a_release_costs_privacy():
    acc = PipelineAccountant()
    dpsgd(acc, sigma=1.0, q=0.01, steps=200)
    before = acc.get_epsilon(1e-5)
    acc.record_release(mechanism="alm", scale=2.0, sensitivity=1.0)
    assert acc.get_epsilon(1e-5) > before


def test_delta_zero_and_degenerate_histories():
    acc = PipelineAccountant()
    assert acc.get_epsilon(1e-5) == 0.0 and len(acc) == 0
    acc.record_release(mechanism="alm", scale=2.0, sensitivity=1.0)
    acc.record_release(mechanism="laplace", scale=1.0, sensitivity=0.3, dim=1)
    assert acc.get_epsilon(0.0) == pytest.approx(0.8)  # pure DP adds up
    acc.record_release(mechanism="gaussian", scale=1.0, sensitivity=1.0)
    assert acc.get_epsilon(0.0) == math.inf
    acc.step(noise_multiplier=0.0, sample_rate=0.1)
    assert acc.get_epsilon(1e-5) == math.inf and acc.get_delta(10.0) == 1.0


def test_len_counts_steps_and_releases_and_steps_merge():
    acc = PipelineAccountant()
    dpsgd(acc, sigma=1.0, q=0.1, steps=3)
    acc.step(noise_multiplier=2.0, sample_rate=0.1)
    acc.record_release(mechanism="alm", scale=1.0, sensitivity=1.0)
    assert acc.history == [(1.0, 0.1, 3), (2.0, 0.1, 1)]
    assert len(acc) == 5


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"noise_multiplier": -1.0, "sample_rate": 0.1}, "noise_multiplier=-1.0"),
        ({"noise_multiplier": math.nan, "sample_rate": 0.1}, "noise_multiplier=nan"),
        ({"noise_multiplier": 1.0, "sample_rate": 0.0}, "sample_rate=0.0"),
    ],
)
def test_step_errors(kwargs, match):
    with pytest.raises(ValueError, match=match):
        PipelineAccountant().step(**kwargs)


def test_get_epsilon_errors():
    acc = mixed_history()
    with pytest.raises(ValueError, match=r"delta=1\.0"):
        acc.get_epsilon(1.0)
    with pytest.raises(ValueError, match="epsilon=-1"):
        acc.get_delta(-1)


def test_state_dict_round_trip_through_torch_save():
    acc = mixed_history()
    buffer = io.BytesIO()
    torch.save(acc.state_dict(), buffer)
    buffer.seek(0)
    state = torch.load(buffer, weights_only=True)
    fresh = PipelineAccountant()
    fresh.load_state_dict(state)
    assert fresh.history == acc.history and fresh.releases == acc.releases
    assert fresh.get_epsilon(1e-5) == acc.get_epsilon(1e-5)


def test_refuses_another_accountants_state():
    prv = PRVAccountant()
    prv.step(noise_multiplier=1.0, sample_rate=0.1)
    acc = mixed_history()
    with pytest.raises(ValueError, match=r"mechanism='prv' cannot be loaded"):
        acc.load_state_dict(prv.state_dict())
    with pytest.raises(ValueError, match="empty"):
        acc.load_state_dict({})


@pytest.mark.parametrize(
    "corrupt",
    [
        {"history": [(1.0, 2.0, 1)]},
        {"history": [(1.0, 0.1)]},
        {"releases": [{"mechanism": "nope", "scale": 1.0, "sensitivity": 1.0, "dim": None}]},
        {"releases": [{"mechanism": "alm", "scale": -1.0, "sensitivity": 1.0, "dim": None}]},
        {"releases": [{"mechanism": "alm"}]},
    ],
)
def test_invalid_state_is_refused_and_leaves_state_unchanged(corrupt):
    acc = mixed_history()
    state = {**acc.state_dict(), **corrupt}
    before = (list(acc.history), list(acc.releases))
    with pytest.raises(ValueError):
        acc.load_state_dict(state)
    assert (acc.history, acc.releases) == before


def test_registered_in_opacus():
    assert isinstance(create_accountant(ACCOUNTANT_NAME), PipelineAccountant)
    accountant_module._register()  # registering our own class again is allowed
    assert type(create_accountant(ACCOUNTANT_NAME)) is PipelineAccountant


def test_privacy_engine_runs_with_our_accountant():
    torch.manual_seed(0)
    data = torch.utils.data.TensorDataset(torch.randn(64, 5), torch.randint(0, 2, (64,)))
    loader = torch.utils.data.DataLoader(data, batch_size=16)
    model = torch.nn.Linear(5, 2)
    engine = PrivacyEngine(accountant=ACCOUNTANT_NAME)
    model, optimizer, loader = engine.make_private(
        module=model,
        optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
        data_loader=loader,
        noise_multiplier=1.0,
        max_grad_norm=1.0,
    )
    for x, y in loader:
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()
    assert isinstance(engine.accountant, PipelineAccountant)
    assert engine.accountant.history == [(1.0, 0.25, 4)]
    prv = PRVAccountant()
    prv.history = list(engine.accountant.history)
    assert engine.get_epsilon(1e-5) == pytest.approx(prv.get_epsilon(1e-5), rel=0.01)


def test_opacus_get_noise_multiplier_drives_our_accountant():
    kw = {"target_epsilon": 2.0, "target_delta": 1e-5, "sample_rate": 0.1, "epochs": 1}
    # Opacus forwards extra keyword arguments to get_epsilon: a coarser grid, still pessimistic.
    ours = get_noise_multiplier(
        accountant=ACCOUNTANT_NAME, value_discretization_interval=1e-3, **kw
    )
    theirs = get_noise_multiplier(accountant="prv", **kw)
    assert ours == pytest.approx(theirs, rel=0.02)


def test_noise_steps_merge_and_count_and_gaussian_dim_is_ignored():
    acc = PipelineAccountant()
    acc.step(noise_multiplier=1.0, sample_rate=0.1, mechanism="gaussian", dim=5)
    acc.step(noise_multiplier=2.0, sample_rate=0.1, mechanism="logistic", dim=7)
    acc.step(noise_multiplier=2.0, sample_rate=0.1, mechanism="alm", dim=7, num_steps=3)
    acc.step(noise_multiplier=2.0, sample_rate=0.1, mechanism="laplace", dim=7)
    assert acc.history == [(1.0, 0.1, 1)]
    assert [(s["mechanism"], s["num_steps"]) for s in acc.noise_steps] == [
        ("alm", 4),
        ("laplace", 1),
    ]
    assert len(acc) == 6


def test_logistic_steps_compose_with_gaussian_steps_and_releases_by_hand():
    from alm_opacus.accounting import step_pld

    h = 1e-4
    acc = PipelineAccountant()
    dpsgd(acc, sigma=1.1, q=0.02, steps=100)
    acc.step(noise_multiplier=3.0, sample_rate=0.02, mechanism="alm", num_steps=100)
    acc.record_release(mechanism="laplace", scale=2.0, sensitivity=0.5)
    by_hand = (
        pld_lib.from_gaussian_mechanism(1.1, sampling_prob=0.02, value_discretization_interval=h)
        .self_compose(100)
        .compose(
            step_pld(
                mechanism="alm",
                noise_multiplier=3.0,
                sample_rate=0.02,
                steps=100,
                value_discretization_interval=h,
            )
        )
        .compose(pld_lib.from_laplace_mechanism(2.0, sensitivity=0.5))
    )
    for delta in [1e-4, 1e-7]:
        ours = acc.get_epsilon(delta, value_discretization_interval=h)
        assert ours == pytest.approx(by_hand.get_epsilon_for_delta(delta), rel=1e-9)


class FakeOptimizer:
    """What the hook reads from an Opacus DPOptimizer (and the training helper's subclass)."""

    def __init__(self, **attributes):
        self.noise_multiplier = 1.5
        self.accumulated_iterations = 1
        self.__dict__.update(attributes)


def test_optimizer_hook_reads_the_noise_mechanism_and_dim():
    acc = PipelineAccountant()
    hook = acc.get_optimizer_hook_fn(sample_rate=0.05)
    hook(FakeOptimizer())  # plain Opacus optimizer: Gaussian
    hook(FakeOptimizer(noise_mechanism="alm", noise_dim=10, accumulated_iterations=2))
    hook(FakeOptimizer(noise_mechanism="alm", noise_dim=10, accumulated_iterations=2))
    assert acc.history == [(1.5, 0.05, 1)]
    assert acc.noise_steps == [
        {"mechanism": "alm", "noise_multiplier": 1.5, "sample_rate": 0.1, "num_steps": 2, "dim": 10}
    ]


def test_relations_must_not_mix():
    acc = PipelineAccountant()
    acc.record_release(mechanism="alm", scale=1.0, sensitivity=1.0, neighbouring="replace-one")
    acc.record_release(mechanism="alm", scale=1.0, sensitivity=1.0, neighbouring="replace-one")
    assert acc.neighbouring == "replace-one"
    assert acc.get_epsilon(0.0) == pytest.approx(2.0)
    with pytest.raises(ValueError, match=r"'add-remove' \(a DP-SGD step\) and 'replace-one'"):
        acc.step(noise_multiplier=1.0, sample_rate=0.1)
    with pytest.raises(ValueError, match=r"'add-remove' .* and 'replace-one'"):
        acc.record_release(mechanism="alm", scale=1.0, sensitivity=1.0)
    assert len(acc) == 2  # nothing recorded by the refused calls
    acc.history = [(1.0, 0.1, 10)]  # as Opacus's get_noise_multiplier assigns it
    with pytest.raises(ValueError, match="different neighbouring relations"):
        acc.get_epsilon(1e-5)
    with pytest.raises(ValueError, match="neighbouring='both'"):
        PipelineAccountant().record_release(
            mechanism="alm", scale=1.0, sensitivity=1.0, neighbouring="both"
        )


def test_state_dict_round_trip_with_noise_steps_and_relations():
    acc = mixed_history()
    acc.step(noise_multiplier=2.0, sample_rate=0.02, mechanism="laplace", dim=4, num_steps=9)
    buffer = io.BytesIO()
    torch.save(acc.state_dict(), buffer)
    buffer.seek(0)
    state = torch.load(buffer, weights_only=True)
    assert state["version"] == 2
    fresh = PipelineAccountant()
    fresh.load_state_dict(state)
    assert (fresh.history, fresh.noise_steps, fresh.releases) == (
        acc.history,
        acc.noise_steps,
        acc.releases,
    )
    assert fresh.get_epsilon(1e-5) == acc.get_epsilon(1e-5)


def test_version_one_state_still_loads_as_add_remove():
    old = {
        "history": [(1.0, 0.1, 5)],
        "mechanism": ACCOUNTANT_NAME,
        "releases": [{"mechanism": "alm", "scale": 2.0, "sensitivity": 1.0, "dim": None}],
        "version": 1,
    }
    acc = PipelineAccountant()
    acc.load_state_dict(old)
    assert acc.releases[0]["neighbouring"] == "add-remove" and acc.noise_steps == []
    with pytest.raises(ValueError, match="version=3"):
        acc.load_state_dict({**old, "version": 3})


def test_get_epsilon_is_fast_path_safe_at_tiny_noise():
    # A noise multiplier so small that no grid holds one step: ε is reported as inf
    # (a true, if useless, bound) instead of exhausting memory.
    acc = PipelineAccountant()
    acc.step(noise_multiplier=1e-7, sample_rate=0.5)
    assert acc.get_epsilon(1e-5) == math.inf
    assert acc.get_delta(10.0) == 1.0


def test_register_is_idempotent():
    from alm_opacus.accounting import register

    register()
    register()
    assert type(create_accountant(ACCOUNTANT_NAME)) is PipelineAccountant
