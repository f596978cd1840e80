"""``dperm``: output perturbation (Chaudhuri, Monteleoni & Sarwate, JMLR 12, 2011, Algorithm 1).

The convex head (L2-regularised multinomial logistic regression on features clipped to R,
trained to a certified gradient tolerance by :func:`alm_opacus.sensitivity.train_convex_heads`)
is released as ``w + b`` with noise density ``nu(b) proportional to exp(-epsilon ||b||_2 /
Delta_2)`` over all ``P = C (d + 1)`` parameters, where ``Delta_2`` is the analytic L2
sensitivity of :func:`alm_opacus.sensitivity.analytic_sensitivity`. For neighbours ``w, w'``
with ``||w - w'|| <= Delta_2`` the density ratio is ``exp(epsilon (||b'|| - ||b||) / Delta_2)
<= exp(epsilon)`` by the triangle inequality: pure epsilon-DP (their Section 3), paying the
*L2* sensitivity where Laplace and ALM pay ``L1 <= sqrt(P) L2``.

Sampling: in polar coordinates the density of ``r = ||b||`` is proportional to
``r^{P-1} exp(-epsilon r / Delta_2)``, i.e. ``Gamma(shape=P, scale=Delta_2 / epsilon)``, and
the direction is uniform on the sphere (a normalised standard Gaussian vector).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
import torch
from torch import Tensor

from alm_opacus._validation import check_epsilon, check_positive
from alm_opacus.heads import Head, HeadConfig, Params, batched_logits, flat_params
from alm_opacus.mechanisms import SecureGenerator
from alm_opacus.mechanisms.sampling import standard_normal, uniform_open
from alm_opacus.methods import (
    Method,
    MethodContext,
    MethodOptions,
    Predict,
    Release,
    ShadowTrainer,
    register_method,
)
from alm_opacus.posthoc import clean_shadow_heads, convex_config
from alm_opacus.protect import Guarantee, PrivacyStatement, SensitivityInfo
from alm_opacus.sensitivity import analytic_sensitivity, train_convex_heads
from baselines._common import (
    TUNING_DRAWS,
    PreparedData,
    TuningResult,
    accuracy_of,
    choose,
    derive_seed,
)

__all__ = [
    "DEFAULT_CLIP",
    "DEFAULT_L2",
    "TUNING_GRID",
    "DPERMMethod",
    "DPERMOptions",
    "L2LaplaceNoise",
    "expected_noise_norm",
    "perturb",
]

#: Defaults equal to ``alm_opacus.posthoc``'s analytic head, so that without tuning dperm
#: perturbs the very head that ``laplace``/``alm`` perturb with ``--sensitivity analytic``.
DEFAULT_L2 = 0.1
DEFAULT_CLIP = 1.0

#: lambda values tuned at each epsilon on public data (the default among them).
TUNING_GRID: tuple[dict[str, float], ...] = ({"l2": 0.01}, {"l2": 0.1}, {"l2": 1.0}, {"l2": 10.0})

#: numpy's seeded generator (reproducible research) or the OS CSPRNG.
NoiseRng = np.random.Generator | SecureGenerator


@dataclass(frozen=True)
class DPERMOptions(MethodOptions):
    """Options of ``dperm``.

    Attributes:
        l2: fixes lambda (skipping tuning); ``None`` tunes it over :data:`TUNING_GRID`.
        clip_radius: features are clipped to this L2 norm in the convex head.
        tune: tune lambda on public data (false: :data:`DEFAULT_L2`).
    """

    l2: float | None = None
    clip_radius: float = DEFAULT_CLIP
    tune: bool = True

    def __post_init__(self) -> None:
        if self.l2 is not None:
            check_positive(self.l2, name="l2")
        check_positive(self.clip_radius, name="clip_radius")


class L2LaplaceNoise:
    """Noise with density proportional to ``exp(-||b||_2 / scale)`` in ``dim`` dimensions.

    Not registered as an :class:`alm_opacus.mechanisms.AdditiveNoiseMechanism`: its
    coordinates are not independent, so the registry's per-coordinate API (``sample(shape)``
    of i.i.d. noise, ``std(scale)`` without a dimension) would not describe it honestly.
    """

    name: ClassVar[str] = "l2-laplace"

    @staticmethod
    def calibrate(*, epsilon: float, sensitivity: float) -> float:
        """``scale = Delta_2 / epsilon`` makes the release pure epsilon-DP.

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


@dataclass(frozen=True)
class _Fit:
    params: Params
    config: HeadConfig
    sensitivity: SensitivityInfo
    num_params: int


def _fit(features: Tensor, labels: Tensor, *, num_classes: int, config: HeadConfig) -> _Fit:
    ones = torch.ones(1, len(labels), dtype=torch.bool, device=features.device)
    fit = train_convex_heads(features, labels, masks=ones, num_classes=num_classes, config=config)
    p = int(flat_params(fit.params).shape[1])
    assert config.clip_radius is not None
    bound = analytic_sensitivity(
        n=len(labels), l2=config.l2, clip_radius=config.clip_radius, grad_tol=fit.tol, num_params=p
    )
    return _Fit(params=fit.params, config=config, sensitivity=bound.to_info("l2"), num_params=p)


def perturb(params: Params, *, scale: float, rng: NoiseRng) -> Params:
    """Add one L2-Laplace draw to a batch of heads (one independent vector per head).

    The noise vector covers all parameters of a head, in ``flat_params``'s key order.
    """
    keys = sorted(params)
    n_heads = next(iter(params.values())).shape[0]
    dim = sum(params[k][0].numel() for k in keys)
    noise = np.stack([L2LaplaceNoise.sample(dim, scale=scale, rng=rng) for _ in range(n_heads)])
    flat = torch.from_numpy(noise)
    out: Params = {}
    start = 0
    for k in keys:
        v = params[k]
        size = v[0].numel()
        out[k] = v + flat[:, start : start + size].reshape(v.shape).to(v)
        start += size
    return out


@dataclass
class _Prepared(PreparedData):
    fits: dict[float, _Fit] = field(default_factory=dict)
    public_fits: dict[float, _Fit] = field(default_factory=dict)
    tuned: dict[float, tuple[float, TuningResult]] = field(default_factory=dict)
    #: epsilon released so far per member fit (basic composition of pure-DP releases).
    spent: dict[float, float] = field(default_factory=dict)


def _describe(l2: float) -> dict[str, Any]:
    return {"l2": l2}


def _noise_notes(*, num_params: int, scale: float, seeded: bool) -> tuple[str, ...]:
    source = (
        "numpy PCG64 seeded from public labels (method, seed, draw, epsilon): whoever knows "
        "them can subtract the noise, so the guarantee holds only while they stay secret"
        if seeded
        else "noise from an AES-256-CTR keystream keyed from os.urandom: direction by "
        "inverse-CDF normals, norm as a sum of exponentials"
    )
    return (
        f"noise density proportional to exp(-epsilon ||b||_2 / Delta_2) over all {num_params} "
        "parameters (Chaudhuri et al. 2011, Algorithm 1); expected noise norm "
        f"{L2LaplaceNoise.mean_norm(dim=num_params, scale=scale):.4g}",
        source,
        "floating-point noise (no exact grid version of this mechanism yet; Mironov 2012): "
        "the guarantee is for the ideal real-valued mechanism",
    )


@register_method("dperm")
class DPERMMethod(Method[DPERMOptions, _Prepared]):
    """Output perturbation of the convex head with L2-Laplace noise: pure epsilon-DP."""

    name: ClassVar[str] = "dperm"
    Options = DPERMOptions
    tuning_grid: ClassVar[tuple[dict[str, Any], ...]] = TUNING_GRID
    post_training: ClassVar[bool] = True

    def prepare(
        self, *, features: Tensor, labels: Tensor, seed: int, context: MethodContext
    ) -> _Prepared:
        return _Prepared.build(features=features, labels=labels, seed=seed, context=context)

    def _config(self, context: MethodContext, l2: float) -> HeadConfig:
        return convex_config(context.head, l2=l2, clip_radius=self.options.clip_radius)

    def _fit_at(
        self,
        store: dict[float, _Fit],
        features: Tensor,
        labels: Tensor,
        *,
        l2: float,
        context: MethodContext,
    ) -> _Fit:
        """The convex head at ``l2`` on these rows, computed once into ``store``."""
        if l2 not in store:
            store[l2] = _fit(
                features.to(context.device),
                labels.to(context.device),
                num_classes=context.num_classes,
                config=self._config(context, l2),
            )
        return store[l2]

    def choose(
        self, prepared: _Prepared, *, epsilon: float, context: MethodContext
    ) -> tuple[float, TuningResult]:
        """lambda for this epsilon, tuned once on public data (noise included)."""
        opts = self.options
        return choose(
            prepared.tuned,
            float(epsilon),
            [c["l2"] for c in TUNING_GRID],
            default=opts.l2 or DEFAULT_L2,
            describe=_describe,
            fixed="l2" if opts.l2 is not None else None,
            tune=opts.tune,
            split=prepared.split,
            score=lambda l2: self._score(prepared, l2, epsilon=epsilon, context=context),
        )

    def _score(
        self, prepared: _Prepared, l2: float, *, epsilon: float, context: MethodContext
    ) -> float:
        """Public validation accuracy at ``l2`` with noise at ``epsilon`` (public: seeded)."""
        s = prepared.split
        assert s is not None
        fit = self._fit_at(
            prepared.public_fits, s.train_features, s.train_labels, l2=l2, context=context
        )
        scale = L2LaplaceNoise.calibrate(epsilon=epsilon, sensitivity=fit.sensitivity.value)
        accs = []
        for draw in range(TUNING_DRAWS):
            rng = noise_rng(derive_seed("dperm-tune", prepared.seed, epsilon, l2, draw))
            noisy = perturb(fit.params, scale=scale, rng=rng)
            proba = batched_logits(
                noisy, s.validation_features.to(context.device), config=fit.config
            )[0]
            accs.append(accuracy_of(proba, s.validation_labels))
        return sum(accs) / len(accs)

    def release(
        self,
        prepared: _Prepared,
        *,
        features: Tensor,
        labels: Tensor,
        epsilon: float,
        delta: float,
        seed: int,
        draw: int,
        context: MethodContext,
    ) -> Release:
        l2, tuning = self.choose(prepared, epsilon=epsilon, context=context)
        fit = self._fit_at(
            prepared.fits, prepared.features, prepared.labels, l2=l2, context=context
        )
        scale = L2LaplaceNoise.calibrate(epsilon=epsilon, sensitivity=fit.sensitivity.value)
        noise_seed = context.noise.seed(self.name, seed, draw, float(epsilon))
        noisy = perturb(fit.params, scale=scale, rng=noise_rng(noise_seed))
        head = Head.from_params(noisy, num_classes=context.num_classes, config=fit.config)
        prepared.spent[l2] = prepared.spent.get(l2, 0.0) + float(epsilon)
        statement = PrivacyStatement(
            epsilon=float(epsilon),
            delta=0.0,
            guarantee=Guarantee.PURE_DP,
            mechanism=L2LaplaceNoise.name,
            noise_scale=scale,
            sensitivity=fit.sensitivity,
            notes=_noise_notes(
                num_params=fit.num_params, scale=scale, seeded=noise_seed is not None
            ),
            neighbouring=fit.sensitivity.neighbouring,
            noise=context.noise.source,
            epsilon_spent=prepared.spent[l2],
            delta_spent=0.0,
        )
        return Release(
            method=self.name,
            statement=statement,
            predict_proba=lambda x: head.predict_proba(x.to(context.device)).float().cpu(),
            module=head,
            chosen_config={"l2": l2, "clip_radius": fit.config.clip_radius},
            attacker=lambda: self._attacker(l2=l2, scale=scale, context=context),
            attacker_note="adaptive: convex shadow heads with L2-Laplace noise of the released "
            "scale",
            noise_std=L2LaplaceNoise.coordinate_std(dim=fit.num_params, scale=scale),
            info={
                "tuning": tuning.to_info(),
                "num_params": fit.num_params,
                "noise_norm_mean": L2LaplaceNoise.mean_norm(dim=fit.num_params, scale=scale),
            },
        )

    def _attacker(self, *, l2: float, scale: float, context: MethodContext) -> ShadowTrainer:
        """The adaptive attacker: convex heads of the same recipe, noise of the released scale
        (the statement publishes it), one independent vector per head. The noise-free fits
        are shared by every epsilon through the run's memo."""
        config = self._config(context, l2)

        def trainer(features: Tensor, labels: Tensor, masks: Tensor, seed: int) -> Predict:
            clean = clean_shadow_heads(
                features,
                labels,
                masks=masks,
                seed=seed,
                config=config,
                solver="newton",
                num_classes=context.num_classes,
                cache_dir=context.cache_dir,
                memo=context.memo,
            )
            noisy = perturb(
                clean, scale=scale, rng=noise_rng(derive_seed("dperm-shadow", seed, scale))
            )

            def predict(x: Tensor) -> Tensor:
                with torch.no_grad():
                    return torch.softmax(batched_logits(noisy, x, config=config), -1).float()

            return predict

        return trainer


def expected_noise_norm(*, dim: int, epsilon: float, sensitivity: float) -> float:
    """``E ||b|| = dim * Delta_2 / epsilon``, for comparisons with L1 mechanisms."""
    return dim * L2LaplaceNoise.calibrate(epsilon=epsilon, sensitivity=sensitivity)
