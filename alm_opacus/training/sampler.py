"""Poisson sampling whose batch membership cannot be replayed.

Opacus's `UniformWithReplacementSampler` draws ``torch.rand(n, generator=g) < q``; with
``g=None`` that is torch's global Mersenne Twister, which anyone who learns (or guesses) its
seed replays, and Opacus's own fix (``secure_mode``) needs ``torchcsprng``, which does not
exist for current PyTorch. Here every inclusion decision is an exact Bernoulli(q)
(`alm_opacus.mechanisms.sampling.bernoulli`: P(in) is q itself, not q rounded), its bits
drawn from a `SecureGenerator` (AES-CTR keyed from ``os.urandom``) unless the caller passes a
seeded ``torch.Generator`` for reproducible research.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import torch
from opacus.data_loader import DPDataLoader, dtype_safe, shape_safe, wrap_collate_with_empty
from opacus.utils.uniform_sampler import (
    DistributedUniformWithReplacementSampler,
    UniformWithReplacementSampler,
)
from torch.utils.data import DataLoader, Dataset, IterableDataset
from torch.utils.data._utils.collate import default_collate

from alm_opacus.accounting.pld import _check_sample_rate
from alm_opacus.mechanisms.sampling import NoiseGenerator, SecureGenerator, bernoulli, is_secure

__all__ = [
    "SecureDPDataLoader",
    "SecureDistributedPoissonSampler",
    "SecurePoissonSampler",
    "poisson_mask",
]


def poisson_mask(
    shape: int | Sequence[int], *, sample_rate: float, generator: NoiseGenerator
) -> torch.Tensor:
    """Independent Bernoulli(``sample_rate``) inclusion decisions, as a bool tensor.

    Each is ``U < q`` for a uniform U whose bits are drawn until the comparison is certain,
    so the inclusion probability is exactly q, as the accountant assumes.

    Args:
        shape: shape of the mask (an int or a sequence of ints).
        sample_rate: inclusion probability q in (0, 1].
        generator: a `SecureGenerator` or a seeded ``torch.Generator``.

    Returns:
        A bool tensor of the given shape on the generator's device.

    Raises:
        ValueError: if ``sample_rate`` is not in (0, 1] or ``shape`` is invalid.
    """
    q = _check_sample_rate(sample_rate)
    return bernoulli(shape, probability=q, generator=generator)


def _check_source(generator: NoiseGenerator | None) -> NoiseGenerator:
    source = SecureGenerator() if generator is None else generator
    if not isinstance(source, SecureGenerator | torch.Generator):
        raise ValueError(
            f"generator={generator!r} is invalid: expected None, a SecureGenerator or a "
            "torch.Generator"
        )
    return source


class SecurePoissonSampler(UniformWithReplacementSampler):
    """Opacus's Poisson batch sampler, drawing from a `SecureGenerator` by default.

    A drop-in `UniformWithReplacementSampler` (Opacus's `BatchMemoryManager` and
    `DPDataLoader` code paths accept it): ``steps`` batches, each holding every index
    independently with probability ``sample_rate``.

    Attributes:
        seeded: whether the draws come from a caller's seeded ``torch.Generator`` (then batch
            membership is private only while that seed is secret).
    """

    def __init__(
        self,
        *,
        num_samples: int,
        sample_rate: float,
        generator: NoiseGenerator | None = None,
        steps: int | None = None,
    ) -> None:
        """Args:
            num_samples: dataset size, ≥ 1.
            sample_rate: inclusion probability q in (0, 1].
            generator: ``None`` (default) for a new `SecureGenerator`; a seeded
                ``torch.Generator`` only for reproducible research.
            steps: batches per iteration; ``int(1 / sample_rate)`` (Opacus's) by default.

        Raises:
            ValueError: on a bad sample rate, dataset size or step count.
        """
        q = _check_sample_rate(sample_rate)
        if isinstance(num_samples, bool) or not isinstance(num_samples, int) or num_samples < 1:
            raise ValueError(f"num_samples={num_samples!r} is invalid: expected an integer ≥ 1")
        if steps is not None and (
            isinstance(steps, bool) or not isinstance(steps, int) or steps < 1
        ):
            raise ValueError(f"steps={steps!r} is invalid: expected None or an integer ≥ 1")
        source = _check_source(generator)
        super().__init__(num_samples=num_samples, sample_rate=q, generator=source, steps=steps)
        self.seeded = not is_secure(source)

    def __iter__(self) -> Iterator[list[int]]:
        for _ in range(self.steps):
            mask = poisson_mask(
                self.num_samples, sample_rate=self.sample_rate, generator=self.generator
            )
            yield mask.nonzero(as_tuple=False).reshape(-1).tolist()


class SecureDistributedPoissonSampler(DistributedUniformWithReplacementSampler):
    """Opacus's distributed Poisson sampler, drawing from a `SecureGenerator` by default.

    As Opacus's `DistributedUniformWithReplacementSampler`: the dataset is split into one
    shard per rank (a permutation fixed by ``shuffle_seed`` and the epoch, then every
    ``world_size``-th index), and each rank includes each index of its shard independently
    with probability ``sample_rate``. Every example of the whole dataset is thus in the
    step's global batch (the union over ranks) independently with probability q: the global
    batch is a Poisson sample at rate q, which is what the accountant records. Which rank
    holds an example is fixed in advance and independent of the data, so it changes nothing
    in the guarantee.

    Two departures from Opacus, both for correctness:

    - An empty local batch is yielded, not skipped. Opacus skips it, so a rank whose shard
      drew no example takes one step fewer than the others: its next all-reduce pairs with
      another step's (or never returns), and the number of accounted steps differs by rank.
      Here every rank takes exactly ``steps`` steps.
    - With a seeded ``torch.Generator`` (reproducible research only) every rank draws the
      mask of the WHOLE dataset from the same stream and keeps its shard's entries: the
      ranks' masks are then those of one process (so a seeded run on W ranks samples the
      batches a one-process `SecurePoissonSampler` with the same seed samples), rather than
      W copies of one stream, which would include the examples at the same shard position
      on every rank together. With a `SecureGenerator` each rank draws only its shard's bits.

    Attributes:
        seeded: whether the draws come from a caller's seeded ``torch.Generator``.
    """

    def __init__(
        self,
        *,
        total_size: int,
        sample_rate: float,
        generator: NoiseGenerator | None = None,
        shuffle: bool = True,
        shuffle_seed: int = 0,
        steps: int | None = None,
    ) -> None:
        """Args:
            total_size: size of the whole dataset, ≥ 1.
            sample_rate: inclusion probability q in (0, 1] of every example.
            generator: ``None`` (default) for a new `SecureGenerator`; a seeded
                ``torch.Generator`` only for reproducible research.
            shuffle: split a fixed permutation of the indices (Opacus's default) rather
                than the indices in order.
            shuffle_seed: seed of that permutation (public: it is not a privacy secret).
            steps: batches per iteration; ``int(1 / sample_rate)`` (Opacus's) by default.

        Raises:
            ValueError: on a bad sample rate, dataset size or step count, or when
                ``torch.distributed`` is not initialised.
        """
        q = _check_sample_rate(sample_rate)
        if isinstance(total_size, bool) or not isinstance(total_size, int) or total_size < 1:
            raise ValueError(f"total_size={total_size!r} is invalid: expected an integer ≥ 1")
        if steps is not None and (
            isinstance(steps, bool) or not isinstance(steps, int) or steps < 1
        ):
            raise ValueError(f"steps={steps!r} is invalid: expected None or an integer ≥ 1")
        if not torch.distributed.is_available() or not torch.distributed.is_initialized():
            raise ValueError(
                "SecureDistributedPoissonSampler needs torch.distributed to be initialised "
                "(torch.distributed.init_process_group) before it is made"
            )
        source = _check_source(generator)
        super().__init__(
            total_size=total_size,
            sample_rate=q,
            shuffle=shuffle,
            shuffle_seed=shuffle_seed,
            steps=steps,
            generator=source,
        )
        self.seeded = not is_secure(source)

    def shard(self) -> torch.Tensor:
        """This rank's indices for the current epoch (Opacus's partition)."""
        if self.shuffle:
            order = torch.Generator().manual_seed(self.shuffle_seed + self.epoch)
            indices = torch.randperm(self.total_size, generator=order)
        else:
            indices = torch.arange(self.total_size)
        return indices[self.rank : self.total_size : self.num_replicas]

    def __iter__(self) -> Iterator[list[int]]:
        shard = self.shard()
        for _ in range(self.num_batches):
            if self.seeded:  # the whole dataset's mask, the same on every rank
                mask = poisson_mask(
                    self.total_size, sample_rate=self.sample_rate, generator=self.generator
                )[shard]
            else:
                mask = poisson_mask(
                    len(shard), sample_rate=self.sample_rate, generator=self.generator
                )
            yield shard[mask].tolist()


class SecureDPDataLoader(DPDataLoader):
    """Opacus's `DPDataLoader` (Poisson batches, empty ones allowed) on `SecurePoissonSampler`.

    The base ``DataLoader`` always receives ``generator=None``: torch would draw each
    iterator's worker base seed from it, interleaving with the membership draws; worker seeds
    come from torch's global generator instead, as for any ``DataLoader`` without one.
    """

    def __init__(
        self,
        dataset: Dataset[Any],
        *,
        sample_rate: float,
        collate_fn: Any = None,
        drop_last: bool = False,
        generator: NoiseGenerator | None = None,
        batch_first: bool = True,
        rand_on_empty: bool = False,
        distributed: bool = False,
        **kwargs: Any,
    ) -> None:
        """Args:
            dataset: a map-style dataset (``len`` and indexing).
            sample_rate: Poisson inclusion probability q in (0, 1].
            collate_fn: the batch collate function (``default_collate`` when ``None``).
            drop_last: ignored, as in Opacus (Poisson batches have random sizes).
            generator: ``None`` for a `SecureGenerator`; a seeded ``torch.Generator`` only for
                reproducible research.
            batch_first: whether the batch dimension is the first one.
            rand_on_empty: Opacus's option for empty batches.
            distributed: one rank of several (``torch.distributed``): sample this rank's
                shard with `SecureDistributedPoissonSampler`, as Opacus's
                ``DPDataLoader(distributed=True)`` does.
            **kwargs: passed to ``torch.utils.data.DataLoader``.

        Raises:
            ValueError: on an iterable dataset or a bad sample rate, or ``distributed``
                without an initialised ``torch.distributed``.
        """
        if isinstance(dataset, IterableDataset):
            raise ValueError("Poisson sampling needs a map-style dataset, not an IterableDataset")
        del drop_last  # Poisson batches have random sizes; Opacus ignores it likewise
        self.sample_rate = _check_sample_rate(sample_rate)
        self.distributed = bool(distributed)
        size = len(dataset)  # type: ignore[arg-type]
        sampler = (
            SecureDistributedPoissonSampler(
                total_size=size, sample_rate=self.sample_rate, generator=generator
            )
            if self.distributed
            else SecurePoissonSampler(
                num_samples=size, sample_rate=self.sample_rate, generator=generator
            )
        )
        first = dataset[0]
        DataLoader.__init__(
            self,
            dataset=dataset,
            batch_sampler=sampler,
            collate_fn=wrap_collate_with_empty(
                collate_fn=default_collate if collate_fn is None else collate_fn,
                batch_first=batch_first,
                rand_on_empty=rand_on_empty,
                sample_empty_shapes=[(0, *shape_safe(x)) for x in first],
                dtypes=[dtype_safe(x) for x in first],
            ),
            generator=None,
            **kwargs,
        )

    @property
    def seeded(self) -> bool:
        """Whether batch membership comes from a seeded ``torch.Generator``."""
        sampler = self.batch_sampler
        return bool(getattr(sampler, "seeded", True))

    @classmethod
    def from_data_loader(
        cls,
        data_loader: DataLoader[Any],
        *,
        generator: NoiseGenerator | None = None,
        batch_first: bool = True,
        rand_on_empty: bool = False,
        distributed: bool = False,
    ) -> SecureDPDataLoader:
        """A Poisson loader equivalent to ``data_loader`` except for its sampling.

        As Opacus's ``DPDataLoader.from_data_loader``: the sample rate is
        ``1 / len(data_loader)`` and the loader's workers, collate function and memory
        settings are kept. Unlike Opacus, ``data_loader.generator`` is NOT used: membership
        comes from ``generator`` (``None``: a `SecureGenerator`). With ``distributed``,
        each rank samples its shard of the whole dataset at that rate (Opacus's
        ``distributed=True``): the global batch is Poisson at rate ``1 / len(data_loader)``.

        Raises:
            ValueError: on a loader over an ``IterableDataset``.
        """
        if isinstance(data_loader.dataset, IterableDataset):
            raise ValueError("Poisson sampling needs a map-style dataset, not an IterableDataset")
        return cls(
            dataset=data_loader.dataset,
            sample_rate=1 / len(data_loader),
            num_workers=data_loader.num_workers,
            collate_fn=data_loader.collate_fn,
            pin_memory=data_loader.pin_memory,
            timeout=data_loader.timeout,
            worker_init_fn=data_loader.worker_init_fn,
            multiprocessing_context=data_loader.multiprocessing_context,
            generator=generator,
            prefetch_factor=data_loader.prefetch_factor,
            persistent_workers=data_loader.persistent_workers,
            batch_first=batch_first,
            rand_on_empty=rand_on_empty,
            distributed=distributed,
        )
