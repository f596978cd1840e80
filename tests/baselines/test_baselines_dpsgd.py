"""DP-SGD through Opacus: the accountant's epsilon, the cache, and the batched re-implementation."""

from __future__ import annotations

import math

import pytest
import torch
from opacus.accountants.utils import get_noise_multiplier

from alm_opacus.heads import HeadConfig
from baselines import dpsgd
from baselines.dpsgd import (
    DPSGDConfig,
    SigmaCache,
    dpsgd_linear_heads,
    run_opacus,
    train_dpsgd_head,
)

HEAD = HeadConfig()
FAST = DPSGDConfig(lr=4.0, max_grad_norm=1.0, epochs=4, batch_size=30)


@pytest.fixture(scope="module")
def small(pixel_features):
    x, y = pixel_features
    return x[:90], y[:90]


def _check_against_opacus(run, *, epsilon: float, delta: float, accountant: str) -> None:
    # Independent check: a fresh Opacus accountant fed the run's (sigma, q, steps).
    again = dpsgd.accountant_epsilon(
        noise_multiplier=run.noise_multiplier,
        sample_rate=run.sample_rate,
        steps=run.steps,
        delta=delta,
        accountant=accountant,
    )
    assert run.epsilon_spent == pytest.approx(again, rel=1e-9)
    assert run.epsilon_spent <= epsilon
    assert run.epsilon_spent > 0.9 * epsilon  # sigma is not wastefully large either


def test_rdp_final_epsilon_within_target_and_equal_to_opacus(small):
    x, y = small
    run = train_dpsgd_head(
        x,
        y,
        num_classes=10,
        head=HEAD,
        config=FAST,
        epsilon=2.0,
        delta=1e-5,
        accountant="rdp",
        seed=0,
        noise_seed=0,
    )
    _check_against_opacus(run, epsilon=2.0, delta=1e-5, accountant="rdp")
    # Poisson sampling at 1/len(loader), every batch of every epoch taken.
    assert run.sample_rate == pytest.approx(1 / math.ceil(90 / 30))
    assert run.steps == FAST.epochs * math.ceil(90 / 30)


def test_opacus_step_undercount_is_corrected(small):
    # Opacus accounts int(epochs / q) steps but its loader runs epochs * int(1 / q): at
    # q = 1/75, 3 epochs, that is 224 accounted against 225 run. The run must still end
    # within the target, accounted at the 225 steps it took.
    x, y = small
    q = 1 / 75
    assert int(3 / q) == 224 and 3 * int(1 / q) == 225
    config = DPSGDConfig(lr=1.0, max_grad_norm=1.0, epochs=3, batch_size=1)
    run = train_dpsgd_head(
        x[:75],
        y[:75],
        num_classes=10,
        head=HEAD,
        config=config,
        epsilon=2.0,
        delta=1e-5,
        accountant="rdp",
        seed=0,
        noise_seed=0,
    )
    assert run.steps == 225
    _check_against_opacus(run, epsilon=2.0, delta=1e-5, accountant="rdp")


@pytest.mark.slow
@pytest.mark.parametrize("accountant", ["prv", "alm_pld"])
def test_other_accountants_final_epsilon(small, accountant):
    x, y = small
    run = train_dpsgd_head(
        x,
        y,
        num_classes=10,
        head=HEAD,
        config=FAST,
        epsilon=1.5,
        delta=1e-5,
        accountant=accountant,
        seed=0,
        noise_seed=0,
    )
    _check_against_opacus(run, epsilon=1.5, delta=1e-5, accountant=accountant)


@pytest.mark.filterwarnings("ignore:Optimal order is the largest alpha")
def test_cached_sigma_is_make_private_with_epsilon_sigma(small):
    x, y = small
    kwargs = dict(
        num_classes=10,
        head=HEAD,
        config=FAST,
        epsilon=3.0,
        delta=1e-5,
        accountant="rdp",
        seed=0,
        sigmas=SigmaCache(),  # the run's cache, shared by the three trainings
    )
    first = train_dpsgd_head(x, y, noise_seed=1, **kwargs)
    second = train_dpsgd_head(x, y, noise_seed=2, **kwargs)
    assert second.from_cache and second.noise_multiplier == first.noise_multiplier
    # the value make_private_with_epsilon computes: Opacus's own search at the same key
    expected = get_noise_multiplier(
        target_epsilon=3.0,
        target_delta=1e-5,
        sample_rate=first.sample_rate,
        epochs=FAST.epochs,
        accountant="rdp",
    )
    assert first.noise_multiplier == expected
    # independent draws differ; the same draw is reproducible
    third = train_dpsgd_head(x, y, noise_seed=2, **kwargs)
    w2, w3 = second.head.fc.weight, third.head.fc.weight
    assert torch.equal(w2, w3) and not torch.equal(first.head.fc.weight, w2)


def test_batched_reimplementation_matches_opacus_without_noise(small):
    # sigma = 0 and q = 1 (batch_size >= n) make both deterministic: clipping factor,
    # scaling by the expected batch size and the update must agree to rounding.
    x, y = small
    config = DPSGDConfig(lr=2.0, max_grad_norm=0.3, epochs=15, batch_size=200)
    init = dpsgd.init_params(d=x.shape[1], num_classes=10, head=HEAD, seed=3)
    model = run_opacus(
        x,
        y,
        model=dpsgd.HeadNet(init, "linear"),
        config=config,
        accountant="rdp",
        noise_seed=0,
        noise_multiplier=0.0,
        backend=dpsgd.OPACUS,  # Opacus's own float step, which the batched loop re-implements
    ).module
    ones = torch.ones(2, len(y), dtype=torch.bool)
    ours = dpsgd_linear_heads(
        x, y, masks=ones, num_classes=10, head=HEAD, config=config, sigma=0.0, seed=3
    )
    for b in range(2):
        torch.testing.assert_close(
            ours["fc.weight"][b], model.fc.weight.detach(), rtol=0, atol=1e-12
        )
        torch.testing.assert_close(ours["fc.bias"][b], model.fc.bias.detach(), rtol=0, atol=1e-12)


def test_the_attackers_float32_shadows_follow_the_float64_run(small):
    # The shadows train in float32 (SHADOW_DTYPE): without noise and with every row in every
    # batch (q = 1; otherwise the float32 noise draws move the generator differently), the
    # float64 run's heads to float32 rounding, and the trainer predicts float32 probabilities.
    from alm_opacus.plugin import SHADOW_DTYPE
    from baselines.dpsgd.batched import dpsgd_shadow_trainer

    x, y = small
    config = DPSGDConfig(lr=2.0, max_grad_norm=0.3, epochs=5, batch_size=len(y))
    masks = torch.zeros(3, len(y), dtype=torch.bool)
    masks[:, : len(y) // 2] = True
    kwargs = dict(masks=masks, num_classes=10, head=HEAD, config=config, sigma=0.0, seed=3)
    wide = dpsgd_linear_heads(x, y, **kwargs)
    narrow = dpsgd_linear_heads(x, y, dtype=torch.float32, **kwargs)
    assert torch.float32 == SHADOW_DTYPE and narrow["fc.weight"].dtype == torch.float32
    for k in wide:
        torch.testing.assert_close(narrow[k].double(), wide[k], rtol=0, atol=1e-4)
    assert not torch.equal(narrow["fc.weight"].double(), wide["fc.weight"])  # not a no-op
    trainer = dpsgd_shadow_trainer(
        head=HEAD, num_classes=10, config=config, sigma=1.0, sample_rate=0.1
    )
    proba = trainer(x, y, masks, 0)(x[:7])
    assert proba.shape == (3, 7, 10) and proba.dtype == torch.float32
    torch.testing.assert_close(proba.sum(-1), torch.ones(3, 7), rtol=0, atol=1e-5)


@pytest.mark.parametrize("rate", [0.05, 0.3])
def test_shadow_batches_are_poisson_samples(rate: float) -> None:
    # The attacker's DP-SGD takes each row of a head's data with probability q, independently
    # (Opacus's Poisson sampling), drawing only the taken rows (geometric gaps): every row is
    # taken in Binomial(heads, q) of the batches, and a batch has Binomial(rows, q) rows.
    from scipy import stats

    from baselines.dpsgd.batched import _poisson_batches

    heads, rows = 3000, 120
    positions, valid = _poisson_batches(
        heads, rows, rate, generator=torch.Generator().manual_seed(1)
    )
    taken = torch.zeros(heads, rows, dtype=torch.float64).scatter_add_(1, positions, valid)
    assert taken.max() == 1  # no row twice in one batch
    per_row = taken.sum(0).numpy()
    assert stats.chisquare(per_row).pvalue > 1e-4  # every row equally likely
    sizes = taken.sum(1).numpy()
    expected = stats.binom(rows, rate)
    # mean and variance of 3,000 batch sizes: within 5 standard errors of the binomial's
    assert abs(sizes.mean() - expected.mean()) < 5 * expected.std() / math.sqrt(heads)
    assert abs(sizes.var() / expected.var() - 1) < 5 * math.sqrt(2 / (heads - 1))
    everything, ones = _poisson_batches(2, 7, 1.0, generator=torch.Generator())
    assert torch.equal(everything, torch.arange(7).expand(2, 7)) and bool(ones.all())


def test_default_delta_and_schedule(pixel_features, make_context):
    assert dpsgd.default_delta(150) == 1e-5
    assert dpsgd.default_delta(50_000) == pytest.approx(1 / 500_000)
    assert dpsgd.default_schedule(n=150, schedule=(30, 75)) == (30, 75)
    assert dpsgd.default_schedule(n=10_000) == (20, 256)
    assert len(dpsgd.TUNING_GRID) == 4
    # the method takes the dataset's schedule from the context, else one by n
    from alm_opacus.methods import create_method

    x, y = pixel_features
    for schedule, expected in (((20, 256), (20, 256)), (None, (30, 50))):
        prepared = create_method("dpsgd").prepare(
            features=x[:100], labels=y[:100], seed=0, context=make_context(schedule=schedule)
        )
        assert prepared.schedule == expected
    prepared = create_method("dpsgd", {"epochs": 7}).prepare(
        features=x[:100], labels=y[:100], seed=0, context=make_context(schedule=(20, 256))
    )
    assert prepared.schedule == (7, 256)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"accountant": "gdp"}, "accountant='gdp'"),
        ({"delta": 0.0}, "delta=0.0"),
        ({"epsilon": -1.0}, "epsilon=-1.0"),
        ({"epsilon": math.inf}, "epsilon=inf"),
    ],
)
def test_bad_input_is_named(small, kwargs, match):
    x, y = small
    args = dict(
        num_classes=10,
        head=HEAD,
        config=FAST,
        epsilon=1.0,
        delta=1e-5,
        accountant="rdp",
        seed=0,
        noise_seed=0,
    )
    with pytest.raises(ValueError, match=match):
        train_dpsgd_head(x, y, **{**args, **kwargs})


@pytest.mark.parametrize(
    ("field", "value"), [("lr", 0.0), ("max_grad_norm", -1.0), ("epochs", 0), ("batch_size", 1.5)]
)
def test_bad_config_is_named(field, value):
    with pytest.raises(ValueError, match=field):
        DPSGDConfig(**{field: value})


@pytest.mark.parametrize("backend", ["opacus", "alm"])
def test_the_batched_rows_train_exactly_as_a_tensor_dataset(small, monkeypatch, backend):
    # run_opacus's loader indexes each Poisson batch's rows at once (_Rows): the same
    # batches, rows and order as a TensorDataset collated row by row, so the same weights
    # bit for bit; a batch of 2 at q = 1/45 leaves empty batches, which keep their shapes
    from baselines.dpsgd import loop

    x, y = small
    config = DPSGDConfig(lr=2.0, max_grad_norm=0.3, epochs=3, batch_size=2)
    engine = {"opacus": dpsgd.OPACUS, "alm": loop.ALM_TRAINING}[backend]

    def train() -> torch.Tensor:
        init = dpsgd.init_params(d=x.shape[1], num_classes=10, head=HEAD, seed=3)
        model = dpsgd.HeadNet(init, "linear")
        run = run_opacus(
            x,
            y,
            model=model,
            config=config,
            accountant="rdp",
            noise_seed=4,
            noise_multiplier=0.7,
            backend=engine,
        )
        return torch.cat([p.detach().reshape(-1) for p in run.module.parameters()])

    batched = train()
    sizes: list[int] = []
    original = loop._Rows.__getitems__

    def counted(self, indices):
        sizes.append(len(indices))
        return original(self, indices)

    monkeypatch.setattr(loop._Rows, "__getitems__", counted)
    assert torch.equal(train(), batched)
    assert 0 in sizes  # empty Poisson batches were drawn and trained through
    monkeypatch.setattr(loop, "_Rows", torch.utils.data.TensorDataset)
    monkeypatch.setattr(loop, "_as_batch", torch.utils.data.default_collate)
    assert torch.equal(train(), batched)
