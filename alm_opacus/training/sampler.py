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
from opacus.utils.uniform_sampler import UniformWithReplacementSampler
from torch.utils.data import DataLoader, Dataset, IterableDataset
from torch.utils.data._utils.collate import default_collate

from alm_opacus.accounting.pld import _check_sample_rate
from alm_opacus.mechanisms.sampling import NoiseGenerator, SecureGenerator, bernoulli, is_secure

__all__ = ["SecureDPDataLoader", "SecurePoissonSampler", "poisson_mask"]


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
        source = SecureGenerator() if generator is None else generator
        if not isinstance(source, SecureGenerator | torch.Generator):
            raise ValueError(
                f"generator={generator!r} is invalid: expected None, a SecureGenerator "
                "or a torch.Generator"
            )
        super().__init__(num_samples=num_samples, sample_rate=q, generator=source, steps=steps)
        self.seeded = not is_secure(source)

    def __iter__(self) -> Iterator[list[int]]:
        for _ in range(self.steps):
            mask = poisson_mask(
                self.num_samples, sample_rate=self.sample_rate, generator=self.generator
            )
            yield mask.nonzero(as_tuple=False).reshape(-1).tolist()


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
            **kwargs: passed to ``torch.utils.data.DataLoader``.

        Raises:
            ValueError: on an iterable dataset or a bad sample rate.
        """
        if isinstance(dataset, IterableDataset):
            raise ValueError("Poisson sampling needs a map-style dataset, not an IterableDataset")
        del drop_last  # Poisson batches have random sizes; Opacus ignores it likewise
        self.sample_rate = _check_sample_rate(sample_rate)
        self.distributed = False
        sampler = SecurePoissonSampler(
            num_samples=len(dataset),  # type: ignore[arg-type]
            sample_rate=self.sample_rate,
            generator=generator,
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
    ) -> SecureDPDataLoader:
        """A Poisson loader equivalent to ``data_loader`` except for its sampling.

        As Opacus's ``DPDataLoader.from_data_loader``: the sample rate is
        ``1 / len(data_loader)`` and the loader's workers, collate function and memory
        settings are kept. Unlike Opacus, ``data_loader.generator`` is NOT used: membership
        comes from ``generator`` (``None``: a `SecureGenerator`).

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
        )
