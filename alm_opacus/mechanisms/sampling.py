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
"""

from __future__ import annotations

import math
import secrets
from collections.abc import Sequence

import torch

__all__ = ["make_generator"]

_TWO_52 = 2**52
_TWO_53 = 2**53
_LOG_TWO_53 = 53.0 * math.log(2.0)

Shape = int | Sequence[int] | torch.Size


def make_generator(
    *, seed: int | None = None, secure_mode: bool = False, device: str | torch.device = "cpu"
) -> torch.Generator:
    """Return a ``torch.Generator`` seeded for reproducibility, or from OS entropy.

    Args:
        seed: integer seed; required unless ``secure_mode``.
        secure_mode: draw a 63-bit seed from the operating system's entropy
            (``secrets``, i.e. ``os.urandom``), as Opacus's ``secure_mode`` draws from
            ``/dev/urandom``. The seed is not stored. The stream itself is still torch's
            non-cryptographic generator: this hides the seed, it is not a CSPRNG, and it does
            not remove the floating-point caveat above.
        device: device of the generator.

    Returns:
        A seeded generator.

    Raises:
        ValueError: if both or neither of ``seed`` and ``secure_mode`` are given, or ``seed``
            is not a non-negative integer.
    """
    if secure_mode and seed is not None:
        raise ValueError(f"seed={seed!r} is invalid with secure_mode=True: the seed comes from OS")
    if not secure_mode:
        if seed is None:
            raise ValueError("seed=None is invalid: pass an integer seed or secure_mode=True")
        if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
            raise ValueError(f"seed={seed!r} is invalid: expected a non-negative integer")
    generator = torch.Generator(device=device)
    generator.manual_seed(secrets.randbits(63) if seed is None else seed)
    return generator


def _normalise_shape(shape: Shape) -> tuple[int, ...]:
    dims = (shape,) if isinstance(shape, int) else tuple(shape)
    if any(isinstance(n, bool) or not isinstance(n, int) or n < 0 for n in dims):
        raise ValueError(f"shape={shape!r} is invalid: expected non-negative integers")
    return dims


def _odd_uniform_numerators(
    shape: tuple[int, ...], generator: torch.Generator, *, high: int
) -> torch.Tensor:
    """Odd integers 2k + 1, k uniform in [0, high), as exact float64 values."""
    k = torch.randint(
        0, high, shape, generator=generator, dtype=torch.int64, device=generator.device
    )
    return (2 * k + 1).to(torch.float64)


def standard_logistic(shape: Shape, *, generator: torch.Generator) -> torch.Tensor:
    """Logistic(0, 1) noise in float64 by the inverse CDF logit(U), U = a/2^53 with a odd.

    logit(a/2^53) = ln a − ln(2^53 − a); both integers are exact in float64 and the map
    a ↦ 2^53 − a makes the output exactly symmetric.
    """
    a = _odd_uniform_numerators(_normalise_shape(shape), generator, high=_TWO_52)
    return torch.log(a) - torch.log(_TWO_53 - a)


def standard_laplace(shape: Shape, *, generator: torch.Generator) -> torch.Tensor:
    """Laplace(0, 1) noise in float64: a fair sign times −ln U, U = a/2^53 with a odd."""
    bits = torch.randint(
        0,
        _TWO_53,
        _normalise_shape(shape),
        generator=generator,
        dtype=torch.int64,
        device=generator.device,
    )
    sign = 1.0 - 2.0 * (bits & 1).to(torch.float64)
    a = (2 * (bits >> 1) + 1).to(torch.float64)
    return sign * (_LOG_TWO_53 - torch.log(a))


def standard_normal(shape: Shape, *, generator: torch.Generator) -> torch.Tensor:
    """N(0, 1) noise in float64 from torch's sampler (see the module's floating-point caveat)."""
    return torch.randn(
        _normalise_shape(shape), generator=generator, dtype=torch.float64, device=generator.device
    )
