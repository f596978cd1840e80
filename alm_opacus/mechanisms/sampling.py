"""Random bits, and the floating-point noise samplers kept as an explicit opt-in.

Where the randomness comes from. A release whose noise can be regenerated from published
values is not private: whoever knows the seed subtracts the noise. :class:`SecureGenerator`
draws every random bit from a cryptographic keystream (AES-256-CTR keyed from ``os.urandom``,
:mod:`alm_opacus.mechanisms.csprng`), keeps no seed and cannot be replayed; it is the default
of every release, DP-SGD step and Poisson batch. A seeded ``torch.Generator`` (Mersenne
Twister, not a CSPRNG) is for reproducible research only, and a release made with it says so
in its statement.

Releases are exact (:mod:`alm_opacus.mechanisms.exact`): integer noise on a power-of-two grid,
sampled exactly from these bits. The ``standard_*`` samplers below map a float uniform
through an inverse CDF; their outputs form a sparse, uneven lattice whose reachable points
depend on the clean value, so a release made with them can be told apart from its neighbour
by its low-order bits (Mironov 2012). They remain only for the float path a caller must ask
for, whose statement is ``none``, and for an attacker's simulations.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from fractions import Fraction

import numpy as np
import torch

from alm_opacus.mechanisms.csprng import KeyStream

__all__ = [
    "NoiseGenerator",
    "SecureGenerator",
    "bernoulli",
    "is_secure",
    "make_generator",
    "uniform_bits",
    "uniform_open",
    "uniform_words",
]

_TWO_52 = 2**52
_TWO_53 = 2**53
_LOG_TWO_53 = 53.0 * math.log(2.0)

Shape = int | Sequence[int] | torch.Size


class SecureGenerator:
    """Random bits from a cryptographic keystream keyed from ``os.urandom``; nothing to replay.

    It stands in for a ``torch.Generator`` wherever this package draws noise or Poisson
    batches: :func:`uniform_words`, :func:`uniform_bits` and :func:`uniform_open` accept
    either. The keystream is AES-256-CTR (:class:`~alm_opacus.mechanisms.csprng.KeyStream`);
    a forked child, a copy and an unpickled copy each rekey, so no two ever share bits.
    Opacus's own ``secure_mode`` needs ``torchcsprng``, which is not maintained for current
    PyTorch.

    Attributes:
        device: where the drawn tensors are placed (the bits are drawn on the CPU).
    """

    secure = True

    def __init__(self, *, device: str | torch.device = "cpu") -> None:
        self.device = torch.device(device)
        self._stream = KeyStream()

    def words(self, count: int) -> torch.Tensor:
        """``count`` independent uniform 64-bit words as int64 (two's complement), on the CPU."""
        if count == 0:
            return torch.empty(0, dtype=torch.int64)
        return torch.frombuffer(self._stream.read(8 * count), dtype=torch.int64, count=count)

    def words_into(self, out: torch.Tensor, count: int) -> torch.Tensor:
        """Overwrite ``out[:count]`` with fresh uniform 64-bit words and return that view.

        ``out`` is a contiguous int64 CPU buffer of at least ``count + 2`` words (the keystream
        needs `~alm_opacus.mechanisms.csprng.SLACK` spare bytes); reusing it across calls keeps
        it in cache, which the exact sampler's chunked first pass relies on.

        Raises:
            ValueError: if ``out`` is not such a buffer.
        """
        if out.dtype != torch.int64 or not out.is_contiguous() or out.device.type != "cpu":
            raise ValueError(
                f"out={out.dtype}/{out.device} is invalid: expected contiguous int64 on the CPU"
            )
        with out.numpy().data.cast("B") as view:
            self._stream.read_into(view, 8 * count)
        return out[:count]

    def bits(self, shape: tuple[int, ...], *, bits: int) -> torch.Tensor:
        """Independent uniform integers in [0, 2**bits), int64, ``bits`` in [1, 63]."""
        if not 1 <= bits <= 63:
            raise ValueError(f"bits={bits!r} is invalid: expected an integer in [1, 63]")
        raw = self._stream.words(math.prod(shape)) >> np.uint64(64 - bits)
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
        secure_mode: draw every bit from a keystream keyed from ``os.urandom``;
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


def uniform_words(count: int, *, generator: NoiseGenerator) -> torch.Tensor:
    """``count`` independent uniform 64-bit words as int64 on the CPU, from either generator.

    A seeded ``torch.Generator`` gives 63 bits from ``random_`` and the sign bit from one more
    draw, so a seeded run is reproducible on any machine.
    """
    if isinstance(generator, SecureGenerator):
        return generator.words(count)
    device = generator.device
    low = torch.empty(count, dtype=torch.int64, device=device).random_(generator=generator)
    top = torch.randint(0, 2, (count,), generator=generator, dtype=torch.int64, device=device)
    return low.bitwise_or_(top << 63).cpu()


def bernoulli(shape: Shape, *, probability: float, generator: NoiseGenerator) -> torch.Tensor:
    """Independent Bernoulli(``probability``) draws, exactly: P(True) equals the float given.

    Each draw compares a uniform U = 0.b₁b₂… (its bits drawn as needed) with the binary
    expansion of ``probability``: the first 63 bits decide unless they tie with the
    expansion's (probability 2⁻⁶³), and a tie draws more bits. No float rounding enters.

    Args:
        shape: output shape.
        probability: p in [0, 1] (a float64, whose binary expansion is finite).
        generator: a seeded ``torch.Generator`` or a `SecureGenerator`.

    Returns:
        A bool tensor of ``shape`` on the generator's device.

    Raises:
        ValueError: if ``probability`` is not in [0, 1] or ``shape`` is invalid.
    """
    dims = _normalise_shape(shape)
    p = float(probability)
    if not 0.0 <= p <= 1.0:  # also rejects NaN
        raise ValueError(f"probability={probability!r} is invalid: expected a number in [0, 1]")
    count = math.prod(dims)
    device = generator.device
    if p == 1.0:
        return torch.ones(dims, dtype=torch.bool, device=device)
    scaled = Fraction(p) * 2**63
    threshold = math.floor(scaled)  # < 2**63: fits int64
    u = uniform_words(count, generator=generator) & (2**63 - 1)
    out = u < threshold
    for i in torch.nonzero(u == threshold).flatten().tolist():  # probability 2**-63 each
        out[i] = _below(scaled - threshold, generator)
    return out.reshape(dims).to(device)


def _below(fraction: Fraction, generator: NoiseGenerator) -> bool:
    """Whether a fresh uniform in [0, 1), its bits drawn 63 at a time, is below ``fraction``."""
    while True:
        fraction *= 2**63
        threshold = math.floor(fraction)
        u = int(uniform_words(1, generator=generator)[0]) & (2**63 - 1)
        if u != threshold:
            return u < threshold
        fraction -= threshold


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
