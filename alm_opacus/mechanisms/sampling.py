"""Noise sampling from a seeded ``torch.Generator``.

Floating-point caveat (Mironov 2012, "On significance of the least significant bits for
differential privacy"): textbook samplers map a floating-point uniform through an inverse
CDF. The set of reachable outputs is then a sparse, uneven lattice, and which lattice points
``f(D) + noise`` can land on depends on ``f(D)``; an observer can sometimes tell neighbouring
datasets apart from the low-order bits alone. The proofs cover the ideal real-valued
mechanism, not this lattice. See `docs/mechanisms.md` for what we do and do not claim.

What this module does about it:

- Draws in float64 whatever the output dtype, from a uniform on the odd multiples of 2^-53.
  The inverse CDF is then exactly symmetric and never returns ±inf; |noise| ≤ 53·ln 2 ≈ 36.7
  scales (a tail mass below 2^-52 is cut).
- It does **not** implement Mironov's snapping mechanism, which must round ``f(D) + noise``
  itself, not the noise alone. Our guarantee statements are for the ideal mechanism.

Where the randomness comes from. A release whose noise can be regenerated from published
values is not private: whoever knows the seed subtracts the noise. :class:`SecureGenerator`
draws every random bit from the operating system's CSPRNG (``os.urandom``), keeps no seed
and cannot be replayed; it is the default of every release. A seeded ``torch.Generator``
(Mersenne Twister, not a CSPRNG) is for reproducible research only, and a release made with
it says so in its statement.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence

import numpy as np
import torch

__all__ = [
    "NoiseGenerator",
    "SecureGenerator",
    "is_secure",
    "make_generator",
    "uniform_bits",
    "uniform_open",
]

_TWO_52 = 2**52
_TWO_53 = 2**53
_LOG_TWO_53 = 53.0 * math.log(2.0)

Shape = int | Sequence[int] | torch.Size


class SecureGenerator:
    """Random bits from the operating system's CSPRNG (``os.urandom``); nothing to replay.

    It stands in for a ``torch.Generator`` wherever this package draws noise or Poisson
    batches: :func:`uniform_bits` and :func:`uniform_open` accept either. Opacus's own
    ``secure_mode`` needs ``torchcsprng``, which is not maintained for current PyTorch.

    Attributes:
        device: where the drawn tensors are placed (the bits are drawn on the CPU).
    """

    secure = True

    def __init__(self, *, device: str | torch.device = "cpu") -> None:
        self.device = torch.device(device)

    def bits(self, shape: tuple[int, ...], *, bits: int) -> torch.Tensor:
        """Independent uniform integers in [0, 2**bits), int64, ``bits`` in [1, 63]."""
        if not 1 <= bits <= 63:
            raise ValueError(f"bits={bits!r} is invalid: expected an integer in [1, 63]")
        count = math.prod(shape)
        raw = np.frombuffer(os.urandom(8 * count), dtype=np.uint64) >> np.uint64(64 - bits)
        out = torch.from_numpy(raw.astype(np.int64)).reshape(shape)
        return out.to(self.device)

    def __repr__(self) -> str:
        return f"SecureGenerator(device={str(self.device)!r})"


#: Either source of randomness: a seeded ``torch.Generator`` or a :class:`SecureGenerator`.
NoiseGenerator = torch.Generator | SecureGenerator


def is_secure(generator: NoiseGenerator) -> bool:
    """Whether ``generator`` draws from the OS CSPRNG (a release from it cannot be replayed)."""
    return isinstance(generator, SecureGenerator)


def make_generator(
    *, seed: int | None = None, secure_mode: bool = False, device: str | torch.device = "cpu"
) -> NoiseGenerator:
    """Return a seeded ``torch.Generator`` (reproducible) or a :class:`SecureGenerator`.

    Args:
        seed: integer seed; required unless ``secure_mode``.
        secure_mode: draw every bit from the operating system's CSPRNG (``os.urandom``);
            no seed exists, so the noise cannot be regenerated.
        device: device of the generator (of the drawn tensors, for a secure one).

    Returns:
        The generator.

    Raises:
        ValueError: if both or neither of ``seed`` and ``secure_mode`` are given, or ``seed``
            is not a non-negative integer.
    """
    if secure_mode and seed is not None:
        raise ValueError(f"seed={seed!r} is invalid with secure_mode=True: the seed comes from OS")
    if secure_mode:
        return SecureGenerator(device=device)
    if seed is None:
        raise ValueError("seed=None is invalid: pass an integer seed or secure_mode=True")
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ValueError(f"seed={seed!r} is invalid: expected a non-negative integer")
    generator = torch.Generator(device=device)
    generator.manual_seed(seed)
    return generator


def uniform_bits(shape: Shape, *, bits: int, generator: NoiseGenerator) -> torch.Tensor:
    """Uniform integers in [0, 2**bits) as int64, from either kind of generator."""
    dims = _normalise_shape(shape)
    if isinstance(generator, SecureGenerator):
        return generator.bits(dims, bits=bits)
    return torch.randint(
        0, 2**bits, dims, generator=generator, dtype=torch.int64, device=generator.device
    )


def uniform_open(shape: Shape, *, generator: NoiseGenerator) -> torch.Tensor:
    """Uniform on the odd multiples of 2^-53 in (0, 1), float64: never 0 or 1, and
    ``1 - u`` is exact, so inverse CDFs stay finite and symmetric (Poisson sampling too)."""
    return _odd_uniform_numerators(_normalise_shape(shape), generator, bits=52) / _TWO_53


def _normalise_shape(shape: Shape) -> tuple[int, ...]:
    dims = (shape,) if isinstance(shape, int) else tuple(shape)
    if any(isinstance(n, bool) or not isinstance(n, int) or n < 0 for n in dims):
        raise ValueError(f"shape={shape!r} is invalid: expected non-negative integers")
    return dims


def _odd_uniform_numerators(
    shape: tuple[int, ...], generator: NoiseGenerator, *, bits: int
) -> torch.Tensor:
    """Odd integers 2k + 1, k uniform in [0, 2**bits), as exact float64 values."""
    k = uniform_bits(shape, bits=bits, generator=generator)
    return (2 * k + 1).to(torch.float64)


def standard_logistic(shape: Shape, *, generator: NoiseGenerator) -> torch.Tensor:
    """Logistic(0, 1) noise in float64 by the inverse CDF logit(U), U = a/2^53 with a odd.

    logit(a/2^53) = ln a − ln(2^53 − a); both integers are exact in float64 and the map
    a ↦ 2^53 − a makes the output exactly symmetric.
    """
    a = _odd_uniform_numerators(_normalise_shape(shape), generator, bits=52)
    return torch.log(a) - torch.log(_TWO_53 - a)


def standard_laplace(shape: Shape, *, generator: NoiseGenerator) -> torch.Tensor:
    """Laplace(0, 1) noise in float64: a fair sign times −ln U, U = a/2^53 with a odd."""
    bits = uniform_bits(shape, bits=53, generator=generator)
    sign = 1.0 - 2.0 * (bits & 1).to(torch.float64)
    a = (2 * (bits >> 1) + 1).to(torch.float64)
    return sign * (_LOG_TWO_53 - torch.log(a))


def standard_normal(shape: Shape, *, generator: NoiseGenerator) -> torch.Tensor:
    """N(0, 1) noise in float64.

    A seeded generator uses torch's sampler (kept so that seeded runs reproduce earlier ones).
    A secure one uses the inverse CDF of U = a/2^53, a odd, folded at 1/2 so the output is
    exactly symmetric: ``sign * ndtri(min(a, 2^53 - a) / 2^53)``, |noise| ≤ 8.2 (tail mass
    below 2^-52 cut, as for the other samplers).
    """
    dims = _normalise_shape(shape)
    if not isinstance(generator, SecureGenerator):
        return torch.randn(dims, generator=generator, dtype=torch.float64, device=generator.device)
    a = _odd_uniform_numerators(dims, generator, bits=52)
    lower = torch.minimum(a, _TWO_53 - a)
    z = torch.special.ndtri(lower / _TWO_53)  # <= 0
    return torch.where(a < _TWO_52, z, -z)
