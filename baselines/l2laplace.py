"""The L2-Laplace noise of ``dperm`` (Chaudhuri, Monteleoni & Sarwate, JMLR 12, 2011,
Algorithm 1): density proportional to ``exp(-||b||_2 / scale)`` over all of a head's
parameters, drawn in floats (polar form) or released exactly on a grid as a scale mixture of
exact Gaussians (``baselines.dperm``'s docstring and ``docs/baselines.md``, "dperm on a
grid", give the argument).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import torch
from torch import Tensor

from alm_opacus.mechanisms import NoiseGenerator, SecureGenerator, create_mechanism
from alm_opacus.mechanisms.exact import ReleasePlan, exact_release, plan_release
from alm_opacus.mechanisms.sampling import uniform_open
from alm_opacus.plugin import Params, check_epsilon, check_positive, standard_normal

__all__ = [
    "FLOOR_DELTA",
    "ExactL2Plan",
    "L2LaplaceNoise",
    "NoiseRng",
    "exact_plan",
    "noise_rng",
    "perturb",
    "perturb_exact",
]

#: numpy's seeded generator (reproducible research) or the OS CSPRNG.
NoiseRng = np.random.Generator | SecureGenerator


class L2LaplaceNoise:
    """Noise with density proportional to ``exp(-||b||_2 / scale)`` in ``dim`` dimensions.

    Not registered as an :class:`alm_opacus.mechanisms.AdditiveNoiseMechanism`: its
    coordinates are not independent, so the registry's per-coordinate API (``sample(shape)``
    of i.i.d. noise, ``std(scale)`` without a dimension) would not describe it honestly.
    """

    name: ClassVar[str] = "l2-laplace"
    norm: ClassVar[str] = "l2"

    @staticmethod
    def calibrate(*, epsilon: float, sensitivity: float, delta: float = 0.0) -> float:
        """``scale = Delta_2 / epsilon`` makes the real-valued release pure epsilon-DP
        (``delta`` is ignored: it lets :func:`~alm_opacus.mechanisms.exact.plan_release`
        calibrate this mechanism like the registered ones).

        Raises:
            ValueError: on a non-positive or non-finite argument.
        """
        return check_positive(sensitivity, name="sensitivity") / check_epsilon(epsilon)

    @staticmethod
    def epsilon(*, scale: float, sensitivity: float) -> float:
        """The pure-DP epsilon ``Delta_2 / scale``."""
        return check_positive(sensitivity, name="sensitivity") / check_positive(scale, name="scale")

    @staticmethod
    def sample(dim: int, *, scale: float, rng: NoiseRng) -> np.ndarray:
        """One draw of the ``dim``-dimensional noise vector, float64.

        In polar coordinates the norm is ``Gamma(dim, scale)`` and the direction uniform on the
        sphere (a normalised standard Gaussian vector). A numpy generator draws both with
        ``standard_normal`` and ``gamma`` (seeded runs repeat earlier ones); a
        :class:`~alm_opacus.mechanisms.SecureGenerator` draws the Gaussian by the inverse CDF
        of uniforms from its AES-CTR keystream (keyed from ``os.urandom``) and the norm as a
        sum of ``dim`` exponentials ``-scale ln U`` (a Gamma of integer shape is exactly that
        sum).

        Args:
            dim: dimension >= 1.
            scale: ``Delta_2 / epsilon`` > 0.
            rng: numpy generator (e.g. ``np.random.default_rng(seed)``) or a secure one.

        Returns:
            Array of shape (dim,).

        Raises:
            ValueError: on a bad dim or scale.
        """
        if isinstance(dim, bool) or not isinstance(dim, int) or dim < 1:
            raise ValueError(f"dim={dim!r} is invalid: expected an integer >= 1")
        s = check_positive(scale, name="scale")
        direction = _normal(dim, rng)
        while not np.any(direction):  # probability 0; guards the division
            direction = _normal(dim, rng)
        direction /= np.linalg.norm(direction)
        if isinstance(rng, SecureGenerator):
            exponentials = -np.log(uniform_open((dim,), generator=rng).cpu().numpy())
            return direction * (s * float(exponentials.sum()))
        return direction * rng.gamma(shape=dim, scale=s)

    @staticmethod
    def mean_norm(*, dim: int, scale: float) -> float:
        """``E ||b|| = dim * scale`` (the Gamma mean)."""
        return dim * check_positive(scale, name="scale")

    @staticmethod
    def coordinate_std(*, dim: int, scale: float) -> float:
        """The standard deviation of one coordinate: ``E ||b||^2 = dim (dim + 1) scale^2``
        (the Gamma's second moment), spread evenly over ``dim`` coordinates by symmetry."""
        return math.sqrt(dim + 1) * check_positive(scale, name="scale")


def _normal(dim: int, rng: NoiseRng) -> np.ndarray:
    if isinstance(rng, SecureGenerator):
        return standard_normal((dim,), generator=rng).cpu().numpy()
    return rng.standard_normal(dim)


def noise_rng(seed: int | None) -> NoiseRng:
    """numpy's PCG64 seeded with ``seed`` (reproducible research), or the OS CSPRNG (None)."""
    return SecureGenerator() if seed is None else np.random.default_rng(seed)


def perturb(params: Params, *, scale: float, rng: NoiseRng) -> Params:
    """Add one L2-Laplace draw to a batch of heads (one independent vector per head).

    The noise vector covers all parameters of a head, in ``flat_params``'s key order.
    """
    keys = sorted(params)
    n_heads = next(iter(params.values())).shape[0]
    dim = sum(params[k][0].numel() for k in keys)
    noise = np.stack([L2LaplaceNoise.sample(dim, scale=scale, rng=rng) for _ in range(n_heads)])
    flat = torch.cat([params[k].reshape(n_heads, -1) for k in keys], dim=1)
    return _unflatten(flat + torch.from_numpy(noise).to(flat), params, keys)


#: The delta of an exact release: the floor sigma_min of the mixture is the analytic Gaussian
#: scale for (epsilon, FLOOR_DELTA) at Delta' (module docstring).
FLOOR_DELTA = 2.0**-40


@dataclass(frozen=True)
class ExactL2Plan:
    """How an exact dperm release is made.

    Attributes:
        release: the grid, Delta' = Delta_2 + sqrt(P) gamma, and s = Delta'/epsilon.
        floor: sigma_min, the smallest Gaussian scale of the mixture.
        delta: what every component, hence the release, is (epsilon, delta)-DP at.
    """

    release: ReleasePlan
    floor: float
    delta: float = FLOOR_DELTA


def exact_plan(*, epsilon: float, sensitivity: float, dim: int) -> ExactL2Plan:
    """The grid, scale and floor of an exact release of ``dim`` parameters (float64).

    Raises:
        ValueError: on a bad budget, sensitivity or dim.
    """
    plan = plan_release(
        mechanism=L2LaplaceNoise(),
        epsilon=epsilon,
        delta=0.0,
        sensitivity=sensitivity,
        dim=dim,
        dtype=torch.float64,
    )
    floor = create_mechanism("gaussian").calibrate(
        epsilon=epsilon, delta=FLOOR_DELTA, sensitivity=plan.sensitivity
    )
    return ExactL2Plan(release=plan, floor=float(floor))


def perturb_exact(params: Params, *, plan: ExactL2Plan, generator: NoiseGenerator) -> Params:
    """Release each head of a batch on ``plan``'s grid with exact noise (module docstring):
    per head, V ~ chi^2_{P+1} (floats), then the exact grid Gaussian at max(s sqrt(V), floor).
    The output is float64 (every value a multiple of gamma)."""
    keys = sorted(params)
    flat = torch.cat([params[k].detach().reshape(len(params[k]), -1) for k in keys], dim=1)
    flat = flat.to(device="cpu", dtype=torch.float64)
    rows = []
    for w in flat:
        v = float(standard_normal((len(w) + 1,), generator=generator).square().sum())
        sigma = max(plan.release.scale * math.sqrt(v), plan.floor)
        rows.append(
            exact_release(
                w, mechanism="gaussian", scale=sigma, grid=plan.release.grid, generator=generator
            )
        )
    return _unflatten(torch.stack(rows), params, keys)


def _unflatten(flat: Tensor, params: Params, keys: list[str]) -> Params:
    out: Params = {}
    start = 0
    for k in keys:
        v = params[k]
        size = v[0].numel()
        out[k] = flat[:, start : start + size].reshape(v.shape).to(v.device)
        start += size
    return out
