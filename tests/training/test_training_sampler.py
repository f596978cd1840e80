"""Secure Poisson sampling: exact Bernoulli(q) membership from the keystream, as Opacus wants."""

from __future__ import annotations

import pytest
import torch
from opacus.data_loader import DPDataLoader
from opacus.utils.batch_memory_manager import BatchMemoryManager
from opacus.utils.uniform_sampler import UniformWithReplacementSampler
from scipy import stats
from torch.utils.data import DataLoader, TensorDataset

from alm_opacus.mechanisms import SecureGenerator, make_generator
from alm_opacus.training import (
    MechanismDPOptimizer,
    SecureDPDataLoader,
    SecurePoissonSampler,
    poisson_mask,
)

pytestmark = pytest.mark.filterwarnings("ignore:Full backward hook is firing")


@pytest.mark.parametrize("q", [0.001, 0.3, 0.9])
@pytest.mark.parametrize("secure", [True, False])
def test_inclusion_frequency_is_binomial_q(q: float, secure: bool) -> None:
    generator = make_generator(secure_mode=True) if secure else make_generator(seed=3)
    n = 400_000
    hits = int(poisson_mask(n, sample_rate=q, generator=generator).sum())
    # exact two-sided binomial test; under H0 p < 1e-6 has probability <= 1e-6
    assert stats.binomtest(hits, n, q).pvalue > 1e-6


def test_rate_one_includes_everyone() -> None:
    assert bool(poisson_mask((3, 50), sample_rate=1.0, generator=SecureGenerator()).all())


def test_sampler_defaults_to_the_csprng_and_is_an_opacus_sampler() -> None:
    sampler = SecurePoissonSampler(num_samples=1000, sample_rate=0.5)
    assert isinstance(sampler, UniformWithReplacementSampler)
    assert isinstance(sampler.generator, SecureGenerator) and sampler.seeded is False
    batches = list(sampler)
    assert len(batches) == len(sampler) == 2
    assert all(all(0 <= i < 1000 for i in b) for b in batches)
    # two secure draws of 1000 fair coins coincide with probability 2^-1000
    assert batches[0] != batches[1]


def test_a_seeded_sampler_replays_and_says_so() -> None:
    runs = [
        list(
            SecurePoissonSampler(
                num_samples=200, sample_rate=0.1, generator=torch.Generator().manual_seed(5)
            )
        )
        for _ in range(2)
    ]
    assert runs[0] == runs[1]
    assert (
        SecurePoissonSampler(num_samples=2, sample_rate=0.5, generator=torch.Generator()).seeded
        is True
    )


def _loader(
    n: int = 40, batch_size: int = 10, **kw: object
) -> DataLoader[tuple[torch.Tensor, ...]]:
    x = torch.arange(n * 2, dtype=torch.float64).reshape(n, 2)
    return DataLoader(TensorDataset(x, torch.arange(n)), batch_size=batch_size, **kw)  # type: ignore[arg-type]


def test_loader_matches_opacus_rate_and_step_count() -> None:
    original = _loader(n=40, batch_size=10)
    ours = SecureDPDataLoader.from_data_loader(original)
    theirs = DPDataLoader.from_data_loader(original)
    assert isinstance(ours, DPDataLoader)
    assert ours.sample_rate == theirs.sample_rate == 0.25
    assert len(ours) == len(theirs) == 4
    assert ours.seeded is False and isinstance(ours.batch_sampler, SecurePoissonSampler)
    batches = list(ours)
    assert len(batches) == 4 and all(b[0].shape[1] == 2 for b in batches)


def test_loader_ignores_the_original_generator_unless_given_one() -> None:
    original = _loader(generator=torch.Generator().manual_seed(1))
    assert SecureDPDataLoader.from_data_loader(original).seeded is False
    seeded = SecureDPDataLoader.from_data_loader(
        original, generator=torch.Generator().manual_seed(1)
    )
    assert seeded.seeded is True


def test_empty_batches_keep_their_structure() -> None:
    loader = SecureDPDataLoader(TensorDataset(torch.zeros(3, 4), torch.zeros(3)), sample_rate=1e-9)
    x, y = next(iter(loader))  # every batch is empty with probability 1 - 3e-9
    assert x.shape == (0, 4) and y.shape == (0,)


def test_batch_memory_manager_splits_our_batches() -> None:
    model = torch.nn.Linear(2, 1).double()
    from opacus import GradSampleModule

    module = GradSampleModule(model)
    opt = MechanismDPOptimizer(
        torch.optim.SGD(module.parameters(), lr=0.1),
        noise_multiplier=1.0,
        max_grad_norm=1.0,
        expected_batch_size=20,
        noise_mechanism="alm",
    )
    loader = SecureDPDataLoader.from_data_loader(_loader(n=40, batch_size=20))
    steps = 0
    opt.attach_step_hook(lambda o: None)
    with BatchMemoryManager(data_loader=loader, max_physical_batch_size=4, optimizer=opt) as split:
        for x, _ in split:
            assert len(x) <= 4
            module(x).sum().backward()
            before = model.weight.detach().clone()
            opt.step()
            steps += int(not torch.equal(before, model.weight.detach()))
            opt.zero_grad()
    assert steps == len(loader) == 2  # one real step per logical (Poisson) batch


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"sample_rate": 0.0}, "sample_rate=0.0"),
        ({"sample_rate": float("nan")}, "sample_rate=nan"),
        ({"num_samples": 0}, "num_samples=0"),
        ({"steps": 0}, "steps=0"),
        ({"generator": 3}, "generator=3"),
    ],
)
def test_sampler_refuses_bad_input(kwargs: dict[str, object], match: str) -> None:
    args: dict[str, object] = {"num_samples": 10, "sample_rate": 0.5}
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        SecurePoissonSampler(**args)  # type: ignore[arg-type]
