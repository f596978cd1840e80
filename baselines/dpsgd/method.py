"""``dpsgd`` as a registered method: tuning on public data, the release and its statement.

Each (epsilon, noise draw) is one independent DP-SGD run on the frozen features (Abadi et
al. 2016, Algorithm 1, through Opacus). The release states (target epsilon, delta)-DP under
add/remove-one neighbours, with the accountant named beside every epsilon.

Tuning scores each candidate on public data; for a linear head all its tuning draws train in
one call of the batched re-implementation of Opacus's algorithm
(:func:`~baselines.dpsgd.batched.dpsgd_linear_heads`: the same recipe, noise mechanism,
clipping, Poisson rate, steps and calibrated noise multiplier), which is many times cheaper
than one Opacus run per draw; the released head always trains through Opacus.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar, cast

import torch
from torch import Tensor, nn

from alm_opacus.mechanisms.exact import inflated_sensitivity, step_grid
from alm_opacus.methods import MethodContext, Predict, Release, ReleaseRequest, register_method
from alm_opacus.plugin import AttackerFactory, Head
from alm_opacus.protect import Guarantee, PrivacyStatement, SensitivityInfo, SensitivitySource
from alm_opacus.training import training_mechanism
from baselines._common import (
    TUNING_DRAWS,
    PreparedData,
    PublicSplit,
    TunedMethod,
    TuningSpace,
    derive_seed,
)
from baselines.dpsgd.accounting import SigmaCache
from baselines.dpsgd.batched import dpsgd_linear_heads, dpsgd_shadow_trainer
from baselines.dpsgd.config import (
    TUNING_GRID,
    DPSGDConfig,
    DPSGDOptions,
    DPSGDRecipeOptions,
    default_schedule,
    sample_rate_for,
)
from baselines.dpsgd.head import head_size, train_dpsgd_head
from baselines.dpsgd.loop import (
    ALM_TRAINING,
    EXACT_NOTE,
    OpacusRun,
    TrainingBackend,
    calibrated_sigma,
)

__all__ = [
    "BATCHED_TUNING_NOTE",
    "GAUSSIAN_FLOAT_NOTE",
    "DPSGDMethod",
    "OpacusFit",
    "dpsgd_statement",
]

#: What the statement says of floating-point Gaussian noise (a run with exact=False).
GAUSSIAN_FLOAT_NOTE = (
    "floating-point Gaussian noise (exact=False; Mironov 2012): the guarantee is for the "
    "ideal mechanism, not for the floats computed"
)
#: The tuning record's note on how candidates were trained when the batched trainer scored them.
BATCHED_TUNING_NOTE = (
    "candidates scored with the batched re-implementation of Opacus's algorithm "
    "(baselines.dpsgd.batched, all tuning draws of a candidate in one run: its recipe, noise "
    "mechanism, clipping norm, Poisson rate, steps and the noise multiplier its Opacus run is "
    "calibrated to, at the exact step's noise scale, in floating-point steps); the released "
    "head trains through Opacus"
)


@dataclass(frozen=True)
class OpacusFit:
    """A DP-SGD-trained model as the method releases it, with its run's accounting."""

    module: nn.Module
    predict_proba: Predict
    run: OpacusRun


@dataclass
class _Prepared(PreparedData):
    schedule: tuple[int, int]


def _describe(config: DPSGDConfig) -> dict[str, Any]:
    return config.to_dict()


def dpsgd_statement(
    *,
    run: OpacusRun,
    config: DPSGDConfig,
    epsilon: float,
    delta: float,
    mechanism: str,
    notes: tuple[str, ...] = (),
    float_note: str = GAUSSIAN_FLOAT_NOTE,
) -> PrivacyStatement:
    """The statement of a DP-SGD release: (target epsilon, delta)-DP under add/remove-one
    neighbours, by the named accountant; the clipping norm, in the norm the run clipped in
    (L2 for Gaussian noise, L1 for logistic and Laplace), is the per-step sensitivity.

    Args:
        run: the run's accounting.
        config: its recipe (the clipping norm).
        epsilon: the target epsilon (the accountant's value is at most this).
        delta: the target delta.
        mechanism: e.g. ``"dp-sgd"``.
        notes: extra notes.
        float_note: what is (not) claimed of floating-point noise (runs without a grid).
    """
    acc = run.accountant
    exact = run.grid is not None
    noise_note = (
        f"{EXACT_NOTE} (grid {run.grid:.6g}, sensitivity {run.noise_sensitivity:.6g} for "
        f"the clip {config.max_grad_norm:.6g})"
        if exact
        else float_note
    )
    return PrivacyStatement(
        epsilon=float(epsilon),
        delta=float(delta),
        guarantee=Guarantee.APPROX_DP,
        mechanism=f"{mechanism} (opacus, {acc} accountant)",
        # absolute, as every statement's: sigma * Δ' is the scale of each step's noise
        noise_scale=run.noise_multiplier * (run.noise_sensitivity or config.max_grad_norm),
        sensitivity=SensitivityInfo(
            value=config.max_grad_norm,
            norm=run.clipping_norm,
            source=SensitivitySource.ANALYTIC,
            adjacency="remove-one",
        ),
        notes=(
            f"epsilon={epsilon:g} at delta={delta:g} by the {acc} accountant (the target; the "
            f"{acc} accountant reports epsilon={run.epsilon_spent:.4g} after {run.steps} steps "
            f"at noise multiplier {run.noise_multiplier:.4g}, Poisson rate "
            f"{run.sample_rate:.4g})",
            "add/remove-one neighbours; the sensitivity is the per-example clipping norm of "
            "each step; replace-one neighbours get only the group bound (2 epsilon, "
            "(1 + e^epsilon) delta)",
            run.noise_note,
            noise_note,
            *notes,
        ),
        neighbouring="add-remove",
        noise="seeded" if run.seeded else "secure",
        epsilon_spent=run.epsilon_spent,
        delta_spent=float(delta),
        grid=run.grid,
        grid_sensitivity=run.noise_sensitivity if exact else None,
    )


@register_method("dpsgd")
class DPSGDMethod(TunedMethod[DPSGDRecipeOptions, _Prepared, DPSGDConfig]):
    """DP-SGD head training through Opacus, one independent run per (epsilon, draw).

    Subclasses change the noise through the class attributes ``noise_mechanism`` (and the
    ``backend`` whose engine draws it), the statement's ``mechanism``, ``notes`` and
    ``float_note``, and the accountant through :attr:`accountant`.
    """

    name: ClassVar[str] = "dpsgd"
    Options: ClassVar[type[DPSGDRecipeOptions]] = DPSGDOptions
    tuning_grid: ClassVar[tuple[dict[str, Any], ...]] = TUNING_GRID
    post_training: ClassVar[bool] = False
    mechanism: ClassVar[str] = "dp-sgd"
    #: Extra notes for the statement.
    notes: ClassVar[tuple[str, ...]] = ()
    #: The per-step noise (``alm_opacus.training.TRAINING_MECHANISMS``).
    noise_mechanism: ClassVar[str] = "gaussian"
    #: The engine that trains (it must draw ``noise_mechanism``) and its generators: Opacus's
    #: algorithm through ``alm_opacus.training`` (exact steps, AES-CTR noise and batches).
    backend: ClassVar[TrainingBackend] = ALM_TRAINING
    #: What the statement says of the floating-point noise.
    float_note: ClassVar[str] = GAUSSIAN_FLOAT_NOTE

    @property
    def needs_delta(self) -> bool:
        return True  # every DP-SGD statement is (epsilon, delta) from an accountant

    @property
    def accountant(self) -> str:
        """The accountant of this method's runs: ``dpsgd``'s ``accountant`` option."""
        return cast(DPSGDOptions, self.options).accountant

    def prepare(
        self, *, features: Tensor, labels: Tensor, seed: int, context: MethodContext
    ) -> _Prepared:
        epochs, batch = default_schedule(n=int(features.shape[0]), schedule=context.schedule)
        opts = self.options
        return _Prepared.build(
            features=features,
            labels=labels,
            seed=seed,
            context=context,
            inputs=self._public(context),
            schedule=(opts.epochs or epochs, opts.batch_size or batch),
        )

    def _public(self, context: MethodContext) -> Tensor | None:
        """The public rows in this method's input kind (``None``: the public features)."""
        return None

    def tuning_space(
        self, prepared: _Prepared, request: ReleaseRequest
    ) -> TuningSpace[DPSGDConfig]:
        """lr x clip over :meth:`grid`, once per (epsilon, delta, accountant)."""
        opts = self.options
        grid = self.grid(prepared, context=request.context)
        candidates = opts.candidates(grid, schedule=prepared.schedule)
        return TuningSpace(
            key=(float(request.epsilon), float(request.delta), self.accountant),
            candidates=candidates,
            default=candidates[-1],
            describe=_describe,
            fixed="lr and clip" if len(candidates) == 1 else None,
            tune=opts.tune,
            scoring=BATCHED_TUNING_NOTE if self._batched_tuning(request.context) else None,
        )

    def grid(self, prepared: _Prepared, *, context: MethodContext) -> tuple[dict[str, Any], ...]:
        """The configurations this method tries (``tuning_grid``; subclasses may rescale)."""
        return self.tuning_grid

    def tuning_answers(
        self,
        prepared: _Prepared,
        candidate: DPSGDConfig,
        *,
        split: PublicSplit,
        request: ReleaseRequest,
    ) -> Callable[[int], Tensor]:
        """DP-SGD on the public training rows, once per tuning draw (seeded noise): all draws
        in one batched run where :meth:`_batched_tuning` allows, else one :meth:`_fit` each."""
        if self._batched_tuning(request.context):
            return self._batched_answers(prepared, candidate, split=split, request=request)

        def answer(draw: int) -> Tensor:
            fit = self._fit(
                split.train_features,
                split.train_labels,
                config=candidate,
                seed=derive_seed("tune-init", prepared.seed),
                noise_seed=derive_seed("tune", prepared.seed, draw, request.epsilon),
                request=request,
            )
            return fit.predict_proba(split.validation_features)

        return answer

    def _batched_tuning(self, context: MethodContext) -> bool:
        """Whether tuning trains through :func:`dpsgd_linear_heads`, the batched
        re-implementation of what :meth:`_fit` runs: a linear head on the public features,
        through :data:`ALM_TRAINING`'s engine. Anything else (MLP heads, ``dpsgd-full``,
        another engine, a subclass that fits otherwise) tunes through :meth:`_fit`."""
        cls = type(self)
        return (
            context.head.kind == "linear"
            and self.backend is ALM_TRAINING
            and cls._fit is DPSGDMethod._fit
            and cls._public is DPSGDMethod._public
        )

    def _batched_answers(
        self,
        prepared: _Prepared,
        candidate: DPSGDConfig,
        *,
        split: PublicSplit,
        request: ReleaseRequest,
    ) -> Callable[[int], Tensor]:
        """The :data:`TUNING_DRAWS` tuning draws of ``candidate`` as one batched DP-SGD run.

        Each draw is a head trained on all public training rows with its own Poisson batches
        and noise; the initialisation is :meth:`_fit`'s, sigma is the one
        :func:`~baselines.dpsgd.loop.fit_private` calibrates for the same rows, recipe,
        accountant, mechanism and noised dimension, and the noise scale is sigma times the
        exact step's grid-rounded clip Δ' (what ``alm_opacus.training``'s optimizer draws at).
        """
        context = request.context
        head, classes = context.head, context.num_classes
        x = split.train_features.to(context.device)
        y = split.train_labels.to(context.device)
        law = training_mechanism(self.noise_mechanism)
        dim = head_size(d=int(x.shape[1]), num_classes=classes, head=head)
        sigma, _ = calibrated_sigma(
            n=len(y),
            config=candidate,
            epsilon=request.epsilon,
            delta=request.delta,
            accountant=self.accountant,
            mechanism=law.name,
            dim=dim,
            sigmas=SigmaCache.of(context),
        )
        clip = candidate.max_grad_norm
        grid = step_grid(max_grad_norm=clip, norm=law.norm, dim=dim)
        # the caller's threads (see dpsgd_shadow_trainer)
        params = dpsgd_linear_heads(
            x,
            y,
            masks=torch.ones(TUNING_DRAWS, len(y), dtype=torch.bool),
            num_classes=classes,
            head=head,
            config=candidate,
            sigma=sigma,
            seed=derive_seed("tune-init", prepared.seed),
            noise_seed=derive_seed("tune-batched", prepared.seed, request.epsilon),
            mechanism=law.name,
            noise_sensitivity=inflated_sensitivity(
                sensitivity=clip, norm=law.norm, dim=dim, grid=grid, rounding=0.5
            ),
        )
        heads = [
            Head.from_params(params, index=b, num_classes=classes, config=head)
            for b in range(TUNING_DRAWS)
        ]
        rows = split.validation_features.to(context.device)

        def answer(draw: int) -> Tensor:
            return heads[draw].predict_proba(rows).float().cpu()

        return answer

    def release(self, prepared: _Prepared, request: ReleaseRequest) -> Release:
        config, tuning = self.choose(prepared, request)
        fit = self._fit(
            request.features,
            request.labels,
            config=config,
            seed=request.seed,
            noise_seed=request.noise_seed(self.name),
            request=request,
        )
        run = fit.run
        attacker, note = self._attacker(config=config, run=run, context=request.context)
        return Release(
            method=self.name,
            statement=dpsgd_statement(
                run=run,
                config=config,
                epsilon=request.epsilon,
                delta=request.delta,
                mechanism=self.mechanism,
                notes=self.notes,
                float_note=self.float_note,
            ),
            predict_proba=fit.predict_proba,
            module=fit.module,
            chosen_config=config.to_dict(),
            attacker=attacker,
            attacker_note=note,
            training=run.training(clip_norm=config.max_grad_norm),
            noise_std=run.noise_std(clip_norm=config.max_grad_norm),
            info={"tuning": tuning.to_info(), **run.to_info()},
        )

    def _fit(
        self,
        x: Tensor,
        y: Tensor,
        *,
        config: DPSGDConfig,
        seed: int,
        noise_seed: int | None,
        request: ReleaseRequest,
    ) -> OpacusFit:
        """One DP-SGD run on inputs ``x`` at the request's budget, in its context (tuning, on
        public rows, and the release share it)."""
        context = request.context
        run = train_dpsgd_head(
            x,
            y,
            num_classes=context.num_classes,
            head=context.head,
            config=config,
            epsilon=request.epsilon,
            delta=request.delta,
            accountant=self.accountant,
            seed=seed,
            noise_seed=noise_seed,
            device=context.device,
            sigmas=SigmaCache.of(context),
            backend=self.backend,
            mechanism=self.noise_mechanism,
        )
        head = run.head
        return OpacusFit(
            module=head,
            predict_proba=lambda q: head.predict_proba(q.to(context.device)).float().cpu(),
            run=run,
        )

    def attacker_before_release(
        self, prepared: _Prepared, request: ReleaseRequest
    ) -> AttackerFactory | None:
        """The adaptive attacker from the chosen recipe and the noise multiplier, rate and
        mechanism :func:`~baselines.dpsgd.loop.fit_private` will train with (the same
        calibration, from the run's sigma cache), before the victim trains."""
        context = request.context
        if context.head.kind != "linear":
            return None  # plain (`_attacker`): nothing to calibrate
        config, _ = self.choose(prepared, request)
        n, d = int(request.labels.shape[0]), int(request.features.shape[1])
        mechanism = training_mechanism(self.noise_mechanism).name
        sigma, _ = calibrated_sigma(
            n=n,
            config=config,
            epsilon=request.epsilon,
            delta=request.delta,
            accountant=self.accountant,
            mechanism=mechanism,
            dim=head_size(d=d, num_classes=context.num_classes, head=context.head),
            sigmas=SigmaCache.of(context),
        )
        rate = sample_rate_for(n=n, batch_size=config.batch_size)
        return _adaptive_attacker(config=config, noise=(sigma, rate, mechanism), context=context)

    def _attacker(
        self, *, config: DPSGDConfig, run: OpacusRun, context: MethodContext
    ) -> tuple[AttackerFactory | None, str]:
        """The adaptive attacker (linear heads) or the plain one, and the note saying which."""
        noise = (run.noise_multiplier, run.sample_rate, run.mechanism)
        factory = _adaptive_attacker(config=config, noise=noise, context=context)
        if factory is None:
            return None, (
                "plain: shadow heads trained without DP (DP-SGD shadows of MLP heads are too slow)"
            )
        return (
            factory,
            "adaptive: shadow heads trained with the victim's DP-SGD recipe, "
            f"{run.mechanism} noise ({run.clipping_norm.upper()} clipping), noise multiplier, "
            "Poisson rate and steps "
            "(batched re-implementation of Opacus's algorithm)",
        )


def _adaptive_attacker(
    *, config: DPSGDConfig, noise: tuple[float, float, str], context: MethodContext
) -> AttackerFactory | None:
    """Shadow heads trained with the victim's recipe and ``noise`` (noise multiplier, Poisson
    rate, mechanism), for linear heads only; a partial, so that equal ones compare equal
    (``same_factory``)."""
    if context.head.kind != "linear":
        return None
    sigma, rate, mechanism = noise
    return functools.partial(
        dpsgd_shadow_trainer,
        head=context.head,
        num_classes=context.num_classes,
        config=config,
        sigma=sigma,
        sample_rate=rate,
        mechanism=mechanism,
    )
