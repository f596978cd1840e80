"""``dperm``: output perturbation (Chaudhuri, Monteleoni & Sarwate, JMLR 12, 2011, Algorithm 1).

The convex head (L2-regularised multinomial logistic regression on features clipped to R,
trained to a certified gradient tolerance by :func:`alm_opacus.sensitivity.train_convex_heads`)
is released as ``w + b`` with noise density ``nu(b) proportional to exp(-epsilon ||b||_2 /
Delta_2)`` over all ``P = C (d + 1)`` parameters, where ``Delta_2`` is the analytic L2
sensitivity of :func:`alm_opacus.sensitivity.analytic_sensitivity`. For neighbours ``w, w'``
with ``||w - w'|| <= Delta_2`` the density ratio is ``exp(epsilon (||b'|| - ||b||) / Delta_2)
<= exp(epsilon)`` by the triangle inequality: pure epsilon-DP (their Section 3), paying the
*L2* sensitivity where Laplace and ALM pay ``L1 <= sqrt(P) L2``.

Exact release (the default, ``docs/baselines.md``, "dperm on a grid"): the noise is a scale
mixture of Gaussians, ``b = s sqrt(V) G`` with ``V ~ chi^2_{P+1}`` and ``G ~ N(0, I_P)`` (the
density ``exp(-||b||/s)`` integrates the Gaussian densities against that mixing law), so the
head is released as ``gamma (round(clamp_B(w)/gamma) + K)`` with ``K`` the exact grid-rounded
Gaussian of scale ``sigma = max(s sqrt(V), sigma_min)`` (``alm_opacus.mechanisms.exact``),
``s`` calibrated to ``Delta' = Delta_2 + sqrt(P) gamma``. ``V`` is drawn in floating point, so
its law is not exactly chi-square and pure DP is not proven for the floats; but every component
is an exact Gaussian release with ``sigma >= sigma_min``, calibrated to (epsilon,
:data:`FLOOR_DELTA`) at ``Delta'``, and a data-independent mixture of (epsilon, delta)-DP
mechanisms is (epsilon, delta)-DP: the statement is ``approx-dp`` at that delta. The floor
binds only when ``V`` falls far below its mean ``P + 1``; the noise law is the L2-Laplace's
otherwise. The floating-point sampler (polar form: ``Gamma(P)`` norm, uniform direction) is
kept as an opt-in (``exact=False``) whose statement is ``none`` (Mironov 2012).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar

import torch
from torch import Tensor

from alm_opacus.mechanisms.sampling import make_generator
from alm_opacus.methods import (
    MethodContext,
    MethodOptions,
    Predict,
    Release,
    ReleaseRequest,
    ShadowTrainer,
    register_method,
)
from alm_opacus.plugin import (
    FLOAT_NOTE,
    Head,
    HeadConfig,
    Params,
    batched_logits,
    check_positive,
    clean_shadow_heads,
    convex_config,
    flat_params,
)
from alm_opacus.posttraining.ledger import LedgerRecord, compose_records
from alm_opacus.protect import Guarantee, PrivacyStatement, SensitivityInfo
from alm_opacus.sensitivity import analytic_sensitivity, train_convex_heads
from baselines._common import (
    PreparedData,
    PublicSplit,
    TunedMethod,
    TuningSpace,
    derive_seed,
)
from baselines.l2laplace import (
    FLOOR_DELTA,
    ExactL2Plan,
    L2LaplaceNoise,
    exact_plan,
    noise_rng,
    perturb,
    perturb_exact,
)

__all__ = [
    "DEFAULT_CLIP",
    "DEFAULT_L2",
    "FLOOR_DELTA",
    "TUNING_GRID",
    "DPERMMethod",
    "DPERMOptions",
    "ExactL2Plan",
    "L2LaplaceNoise",
    "dperm_statement",
    "exact_plan",
    "expected_noise_norm",
    "perturb",
    "perturb_exact",
]

#: Defaults equal to ``alm_opacus.posttraining.method``'s analytic head, so that without
#: tuning dperm perturbs the very head that ``laplace``/``alm`` perturb with
#: ``--sensitivity analytic``.
DEFAULT_L2 = 0.1
DEFAULT_CLIP = 1.0

#: lambda values tuned at each epsilon on public data (the default among them).
TUNING_GRID: tuple[dict[str, float], ...] = ({"l2": 0.01}, {"l2": 0.1}, {"l2": 1.0}, {"l2": 10.0})


@dataclass(frozen=True)
class DPERMOptions(MethodOptions):
    """Options of ``dperm``.

    Attributes:
        l2: fixes lambda (skipping tuning); ``None`` tunes it over :data:`TUNING_GRID`.
        clip_radius: features are clipped to this L2 norm in the convex head.
        tune: tune lambda on public data (false: :data:`DEFAULT_L2`).
        exact: release on a grid with exact noise (the default; ``approx-dp``). False draws
            the floating-point L2-Laplace, whose statement is ``none`` (Mironov 2012).
    """

    l2: float | None = None
    clip_radius: float = DEFAULT_CLIP
    tune: bool = True
    exact: bool = True

    def __post_init__(self) -> None:
        if self.l2 is not None:
            check_positive(self.l2, name="l2")
        check_positive(self.clip_radius, name="clip_radius")


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


@dataclass
class _Prepared(PreparedData):
    fits: dict[float, _Fit] = field(default_factory=dict)
    public_fits: dict[float, _Fit] = field(default_factory=dict)


def _describe(l2: float) -> dict[str, Any]:
    return {"l2": l2}


def _noise_notes(
    *, num_params: int, scale: float, seeded: bool, plan: ExactL2Plan | None
) -> tuple[str, ...]:
    source = (
        "noise seeded from public labels (method, seed, draw, epsilon): whoever knows them "
        "can subtract the noise, so the guarantee holds only while they stay secret"
        if seeded
        else "noise from an AES-256-CTR keystream keyed from os.urandom"
    )
    law = (
        f"noise density proportional to exp(-epsilon ||b||_2 / Delta) over all {num_params} "
        "parameters (Chaudhuri et al. 2011, Algorithm 1); expected noise norm "
        f"{L2LaplaceNoise.mean_norm(dim=num_params, scale=scale):.4g}"
    )
    if plan is None:
        return (law, source, FLOAT_NOTE)
    return (
        law,
        source,
        "exact on the released floats: gamma*(round(w/gamma) + K), K the exact grid-rounded "
        "Gaussian of scale max(s sqrt(V), sigma_min), V ~ chi^2_{P+1} (the L2-Laplace as a "
        f"scale mixture of Gaussians); sigma_min={plan.floor:.4g} is the analytic Gaussian "
        f"scale for (epsilon, {plan.delta:.3g}) at Delta', so every component, and the "
        "mixture, is (epsilon, delta)-DP; V is drawn in floating point, so the pure-DP bound "
        "of the real-valued mechanism is not claimed (docs/baselines.md, 'dperm on a grid')",
    )


@register_method("dperm")
class DPERMMethod(TunedMethod[DPERMOptions, _Prepared, float]):
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

    def tuning_space(self, prepared: _Prepared, request: ReleaseRequest) -> TuningSpace[float]:
        """lambda over :data:`TUNING_GRID`, once per epsilon (pure DP: delta plays no part)."""
        opts = self.options
        return TuningSpace(
            key=float(request.epsilon),
            candidates=[c["l2"] for c in TUNING_GRID],
            default=opts.l2 or DEFAULT_L2,
            describe=_describe,
            fixed="l2" if opts.l2 is not None else None,
            tune=opts.tune,
        )

    def tuning_answers(
        self, prepared: _Prepared, candidate: float, *, split: PublicSplit, request: ReleaseRequest
    ) -> Callable[[int], Tensor]:
        """The public fit at lambda ``candidate``, one noise draw per tuning draw."""
        l2, epsilon, context = candidate, request.epsilon, request.context
        fit = self._fit_at(
            prepared.public_fits, split.train_features, split.train_labels, l2=l2, context=context
        )
        noise = self._noise(epsilon=epsilon, fit=fit)

        def answer(draw: int) -> Tensor:
            noisy = noise(fit.params, derive_seed("dperm-tune", prepared.seed, epsilon, l2, draw))
            queries = split.validation_features.to(context.device)
            return batched_logits(noisy, queries, config=fit.config)[0]

        return answer

    def release(self, prepared: _Prepared, request: ReleaseRequest) -> Release:
        epsilon, context = request.epsilon, request.context
        l2, tuning = self.choose(prepared, request)
        fit = self._fit_at(
            prepared.fits, prepared.features, prepared.labels, l2=l2, context=context
        )
        noise = self._noise(epsilon=epsilon, fit=fit)
        noisy = noise(fit.params, request.noise_seed(self.name))
        head = Head.from_params(noisy, num_classes=context.num_classes, config=fit.config)
        statement = dperm_statement(
            epsilon=epsilon, fit=fit, plan=noise.plan, source=context.noise.source
        )
        # Each cell of the grid is an alternative release of the member fit, as every
        # post-training method's fresh engine treats it: what it has spent is its own
        # guarantee, composed as the engine's ledger would compose one release. A sum over the
        # cells run so far in this process would depend on scheduling (issue 20).
        record = LedgerRecord.from_statement(statement, dim=fit.num_params)
        statement = replace(statement, **compose_records([record]).statement_fields())
        scale = noise.scale
        return Release(
            method=self.name,
            statement=statement,
            predict_proba=lambda x: head.predict_proba(x.to(context.device)).float().cpu(),
            module=head,
            chosen_config={"l2": l2, "clip_radius": fit.config.clip_radius},
            attacker=lambda: self._attacker(l2=l2, noise=noise, context=context),
            attacker_note="adaptive: convex shadow heads with L2-Laplace noise of the released "
            "scale",
            noise_std=L2LaplaceNoise.coordinate_std(dim=fit.num_params, scale=scale),
            info={
                "tuning": tuning.to_info(),
                "num_params": fit.num_params,
                "noise_norm_mean": L2LaplaceNoise.mean_norm(dim=fit.num_params, scale=scale),
            },
        )

    def _noise(self, *, epsilon: float, fit: _Fit) -> _Noise:
        """The noise of a release at ``epsilon`` of ``fit``: exact (default) or float."""
        return _Noise.build(epsilon=epsilon, fit=fit, exact=self.options.exact)

    def _attacker(self, *, l2: float, noise: _Noise, context: MethodContext) -> ShadowTrainer:
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
            noisy = noise(clean, derive_seed("dperm-shadow", seed, noise.scale))

            def predict(x: Tensor) -> Tensor:
                with torch.no_grad():
                    return torch.softmax(batched_logits(noisy, x, config=config), -1).float()

            return predict

        return trainer


@dataclass(frozen=True)
class _Noise:
    """The noise of one (fit, epsilon): ``plan`` for the exact path, ``None`` for floats."""

    scale: float
    plan: ExactL2Plan | None

    @classmethod
    def build(cls, *, epsilon: float, fit: _Fit, exact: bool) -> _Noise:
        if not exact:
            scale = L2LaplaceNoise.calibrate(epsilon=epsilon, sensitivity=fit.sensitivity.value)
            return cls(scale=scale, plan=None)
        plan = exact_plan(epsilon=epsilon, sensitivity=fit.sensitivity.value, dim=fit.num_params)
        return cls(scale=plan.release.scale, plan=plan)

    def __call__(self, params: Params, seed: int | None) -> Params:
        """One draw per head: seeded from ``seed``, or from the OS CSPRNG (None)."""
        if self.plan is None:
            return perturb(params, scale=self.scale, rng=noise_rng(seed))
        generator = make_generator(seed=seed, secure_mode=seed is None)
        return perturb_exact(params, plan=self.plan, generator=generator)


def dperm_statement(
    *, epsilon: float, fit: _Fit, plan: ExactL2Plan | None, source: str
) -> PrivacyStatement:
    """What a dperm release may claim: ``approx-dp`` at (epsilon, ``plan.delta``) when exact,
    ``none`` (floating-point noise, the nominal epsilon kept) otherwise."""
    scale = (
        plan.release.scale
        if plan is not None
        else L2LaplaceNoise.calibrate(epsilon=epsilon, sensitivity=fit.sensitivity.value)
    )
    notes = _noise_notes(
        num_params=fit.num_params, scale=scale, seeded=source == "seeded", plan=plan
    )
    common: dict[str, Any] = {
        "mechanism": L2LaplaceNoise.name,
        "noise_scale": scale,
        "sensitivity": fit.sensitivity,
        "noise": source,
    }
    if plan is None:
        return PrivacyStatement.no_guarantee(nominal_epsilon=epsilon, notes=notes, **common)
    grid = plan.release.grid
    return PrivacyStatement(
        epsilon=float(epsilon),
        delta=plan.delta,
        guarantee=Guarantee.APPROX_DP,
        notes=notes,
        neighbouring=fit.sensitivity.neighbouring,
        grid=grid.gamma,
        clamp=grid.clamp,
        grid_sensitivity=plan.release.sensitivity,
        **common,
    )


def expected_noise_norm(*, dim: int, epsilon: float, sensitivity: float) -> float:
    """``E ||b|| = dim * Delta_2 / epsilon``, for comparisons with L1 mechanisms."""
    return dim * L2LaplaceNoise.calibrate(epsilon=epsilon, sensitivity=sensitivity)
