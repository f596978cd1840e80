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

from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
import torch
from torch import Tensor

from alm_opacus._validation import check_epsilon, check_positive
from alm_opacus.heads import Head, HeadConfig, Params, batched_logits, flat_params
from alm_opacus.methods import (
    Method,
    MethodContext,
    Predict,
    Release,
    ShadowTrainer,
    register_method,
)
from alm_opacus.protect import PrivacyStatement, SensitivityInfo
from alm_opacus.sensitivity import analytic_sensitivity, train_convex_heads
from baselines._common import (
    TUNING_DRAWS,
    PublicSplit,
    TuningResult,
    accuracy_of,
    derive_seed,
    option,
    public_split,
    select_config,
    tensor_digest,
    untuned,
)

__all__ = ["DEFAULT_CLIP", "DEFAULT_L2", "TUNING_GRID", "DPERMMethod", "L2LaplaceNoise"]

#: Defaults equal to ``alm_opacus.posthoc``'s analytic head, so that without tuning dperm
#: perturbs the very head that ``laplace``/``alm`` perturb with ``--sensitivity analytic``.
DEFAULT_L2 = 0.1
DEFAULT_CLIP = 1.0

#: lambda values tuned at each epsilon on public data (the default among them).
TUNING_GRID: tuple[dict[str, float], ...] = ({"l2": 0.01}, {"l2": 0.1}, {"l2": 1.0}, {"l2": 10.0})


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
    def sample(dim: int, *, scale: float, rng: np.random.Generator) -> np.ndarray:
        """One draw of the ``dim``-dimensional noise vector, float64.

        Args:
            dim: dimension >= 1.
            scale: ``Delta_2 / epsilon`` > 0.
            rng: numpy generator (e.g. ``np.random.default_rng(seed)``).

        Returns:
            Array of shape (dim,).

        Raises:
            ValueError: on a bad dim or scale.
        """
        if isinstance(dim, bool) or not isinstance(dim, int) or dim < 1:
            raise ValueError(f"dim={dim!r} is invalid: expected an integer >= 1")
        s = check_positive(scale, name="scale")
        direction = rng.standard_normal(dim)
        while not np.any(direction):  # probability 0; guards the division
            direction = rng.standard_normal(dim)
        direction /= np.linalg.norm(direction)
        return direction * rng.gamma(shape=dim, scale=s)

    @staticmethod
    def mean_norm(*, dim: int, scale: float) -> float:
        """``E ||b|| = dim * scale`` (the Gamma mean)."""
        return dim * check_positive(scale, name="scale")


def convex_config(context: MethodContext, l2: float) -> HeadConfig:
    return context.head.replace(
        kind="linear",
        l2=float(l2),
        dtype="float64",
        clip_radius=option(context, "clip_radius", DEFAULT_CLIP, float),
    )


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


def perturb(params: Params, *, scale: float, seed: int) -> Params:
    """Add one L2-Laplace draw to a batch of heads (one independent vector per head).

    The noise vector covers all parameters of a head, in ``flat_params``'s key order.
    """
    keys = sorted(params)
    n_heads = next(iter(params.values())).shape[0]
    dim = sum(params[k][0].numel() for k in keys)
    rng = np.random.default_rng(seed)
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


_CLEAN_SHADOWS: dict[tuple[Any, ...], Params] = {}


@dataclass
class _Prepared:
    n: int
    seed: int
    features: Tensor
    labels: Tensor
    split: PublicSplit | None
    fits: dict[float, _Fit] = field(default_factory=dict)
    public_fits: dict[float, _Fit] = field(default_factory=dict)
    tuned: dict[float, tuple[float, TuningResult]] = field(default_factory=dict)


def _describe(l2: float) -> dict[str, Any]:
    return {"l2": l2}


@register_method("dperm")
class DPERMMethod(Method):
    """Output perturbation of the convex head with L2-Laplace noise: pure epsilon-DP.

    Options: ``dperm_l2`` (fixes lambda, skipping tuning), ``clip_radius``, ``tune``.
    """

    name: ClassVar[str] = "dperm"
    tuning_grid: ClassVar[tuple[dict[str, Any], ...]] = TUNING_GRID
    post_training: ClassVar[bool] = True

    def prepare(
        self, *, features: Tensor, labels: Tensor, seed: int, context: MethodContext
    ) -> Any:
        option(context, "clip_radius", DEFAULT_CLIP, float)
        n = int(features.shape[0])
        return _Prepared(
            n=n,
            seed=seed,
            features=features,
            labels=labels,
            split=public_split(context=context, n=n, seed=seed),
        )

    def _member_fit(self, prepared: _Prepared, l2: float, context: MethodContext) -> _Fit:
        if l2 not in prepared.fits:
            prepared.fits[l2] = _fit(
                prepared.features.to(context.device),
                prepared.labels.to(context.device),
                num_classes=context.num_classes,
                config=convex_config(context, l2),
            )
        return prepared.fits[l2]

    def choose(
        self, prepared: _Prepared, *, epsilon: float, context: MethodContext
    ) -> tuple[float, TuningResult]:
        """lambda for this epsilon, tuned once on public data (noise included)."""
        key = float(epsilon)
        if key in prepared.tuned:
            return prepared.tuned[key]
        if "dperm_l2" in context.options:
            l2 = option(context, "dperm_l2", DEFAULT_L2, float)
            chosen = untuned(l2, describe=_describe, reason="dperm_l2 fixed by options")
        elif not bool(context.options.get("tune", True)) or prepared.split is None:
            chosen = untuned(
                DEFAULT_L2, describe=_describe, reason="tune=false or no public validation data"
            )
        else:
            s = prepared.split

            def score(l2: float) -> float:
                if l2 not in prepared.public_fits:
                    prepared.public_fits[l2] = _fit(
                        s.train_features.to(context.device),
                        s.train_labels.to(context.device),
                        num_classes=context.num_classes,
                        config=convex_config(context, l2),
                    )
                fit = prepared.public_fits[l2]
                scale = L2LaplaceNoise.calibrate(epsilon=epsilon, sensitivity=fit.sensitivity.value)
                accs = []
                for draw in range(TUNING_DRAWS):
                    noisy = perturb(
                        fit.params,
                        scale=scale,
                        seed=derive_seed("dperm-tune", prepared.seed, epsilon, l2, draw),
                    )
                    proba = batched_logits(
                        noisy, s.validation_features.to(context.device), config=fit.config
                    )[0]
                    accs.append(accuracy_of(proba, s.validation_labels))
                return sum(accs) / len(accs)

            chosen = select_config([c["l2"] for c in TUNING_GRID], score=score, describe=_describe)
        prepared.tuned[key] = chosen
        return chosen

    def release(
        self,
        prepared: Any,
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
        fit = self._member_fit(prepared, l2, context)
        scale = L2LaplaceNoise.calibrate(epsilon=epsilon, sensitivity=fit.sensitivity.value)
        noisy = perturb(
            fit.params, scale=scale, seed=derive_seed("dperm", seed, draw, float(epsilon))
        )
        head = Head.from_params(noisy, num_classes=context.num_classes, config=fit.config)
        statement = PrivacyStatement(
            epsilon=float(epsilon),
            delta=0.0,
            guarantee="pure-dp",  # type: ignore[arg-type]
            mechanism=L2LaplaceNoise.name,
            noise_scale=scale,
            sensitivity=fit.sensitivity,
            notes=(
                f"noise density proportional to exp(-epsilon ||b||_2 / Delta_2) over all "
                f"{fit.num_params} parameters (Chaudhuri et al. 2011, Algorithm 1); expected "
                f"noise norm {L2LaplaceNoise.mean_norm(dim=fit.num_params, scale=scale):.4g}",
                "floating-point noise (numpy PCG64 + inverse transforms): the guarantee is for "
                "the ideal real-valued mechanism",
            ),
        )
        return Release(
            method=self.name,
            statement=statement,
            predict_proba=lambda x: head.predict_proba(x.to(context.device)).float().cpu(),
            module=head,
            info={
                "config": {"l2": l2, "clip_radius": fit.config.clip_radius},
                "tuning": tuning.to_info(),
                "num_params": fit.num_params,
                "noise_norm_mean": L2LaplaceNoise.mean_norm(dim=fit.num_params, scale=scale),
                "attacker": "adaptive: convex shadow heads with L2-Laplace noise of the "
                "released scale",
            },
        )

    def shadow_trainer(
        self, *, release: Release, epsilon: float, delta: float, context: MethodContext
    ) -> ShadowTrainer:
        """The adaptive attacker: convex heads of the same recipe, noise of the released scale
        (the statement publishes it), one independent vector per head."""
        scale = release.statement.noise_scale
        assert scale is not None
        config = convex_config(context, float(release.info["config"]["l2"]))

        def trainer(features: Tensor, labels: Tensor, masks: Tensor, seed: int) -> Predict:
            key = (tensor_digest(features, labels, masks), config, context.num_classes)
            if key not in _CLEAN_SHADOWS:  # noise-free fits: shared by every epsilon
                _CLEAN_SHADOWS[key] = train_convex_heads(
                    features, labels, masks=masks, num_classes=context.num_classes, config=config
                ).params
            noisy = perturb(
                _CLEAN_SHADOWS[key], scale=scale, seed=derive_seed("dperm-shadow", seed, scale)
            )

            def predict(x: Tensor) -> Tensor:
                with torch.no_grad():
                    return torch.softmax(batched_logits(noisy, x, config=config), -1).float()

            return predict

        return trainer


def expected_noise_norm(*, dim: int, epsilon: float, sensitivity: float) -> float:
    """``E ||b|| = dim * Delta_2 / epsilon``, for comparisons with L1 mechanisms."""
    return dim * L2LaplaceNoise.calibrate(epsilon=epsilon, sensitivity=sensitivity)
