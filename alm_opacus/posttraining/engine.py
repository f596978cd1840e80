"""The post-training privacy engine (ALM paper, Algorithm 1) and released modules.

The statements themselves live in :mod:`alm_opacus.statement`, the released module and its
file in :mod:`alm_opacus.posttraining.module` (both re-exported here).
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from alm_opacus._validation import check_sensitivity
from alm_opacus.errors import InfeasibleRelease
from alm_opacus.mechanisms import (
    AdditiveNoiseMechanism,
    NoiseGenerator,
    create_mechanism,
    is_secure,
    make_generator,
)
from alm_opacus.mechanisms.exact import (
    ReleasePlan,
    exact_release,
    is_narrow,
    release_dtype,
)
from alm_opacus.mechanisms.gaussian import ClassicGaussianMechanism
from alm_opacus.posttraining.ledger import Ledger, LedgerRecord, LedgerTotal
from alm_opacus.posttraining.memo import cached_calibrate, cached_plan
from alm_opacus.posttraining.module import RELEASE_KIND, ProtectedModule
from alm_opacus.statement import (
    NEIGHBOURING,
    NOISE_SOURCES,
    Guarantee,
    PrivacyStatement,
    SensitivityInfo,
    SensitivitySource,
)

if TYPE_CHECKING:
    from alm_opacus.accounting import PipelineAccountant

__all__ = [
    "NEIGHBOURING",
    "NOISE_SOURCES",
    "RELEASE_KIND",
    "Guarantee",
    "LedgerRecord",
    "LedgerTotal",
    "PostTrainingPrivacyEngine",
    "PrivacyStatement",
    "ProtectedModule",
    "SensitivityInfo",
    "SensitivitySource",
    "statement_for",
]


# --- the post-training privacy engine (ALM paper, Algorithm 1) -------------------------------


def _as_sensitivity(sensitivity: float | SensitivityInfo, *, norm: str) -> SensitivityInfo:
    if isinstance(sensitivity, SensitivityInfo):
        if sensitivity.norm != norm:
            raise ValueError(
                f"sensitivity norm {sensitivity.norm!r} does not fit this mechanism, which is "
                f"calibrated to the {norm!r} sensitivity"
            )
        return sensitivity
    value = check_sensitivity(sensitivity)
    return SensitivityInfo(value=value, norm=norm, source=SensitivitySource.CALLER)


class PostTrainingPrivacyEngine:
    """Protect a trained module once, with noise calibrated to its sensitivity.

    The owner keeps the clean module and may call :meth:`make_private` again at a new
    epsilon without retraining; each call returns an independent release, and the engine's
    ledger (`alm_opacus.posttraining.ledger`) composes what every release of the same clean
    model has spent, by kind: each statement states that total (``epsilon_spent``, ``delta_spent``,
    ``guarantee_spent`` and, for random DP, ``gamma_spent``). The same model stays the same
    through a dtype cast or a device move.

    Noise comes from the operating system's CSPRNG unless a ``seed`` is given (reproducible
    research only; the statement then says so and :meth:`ProtectedModule.save` refuses it).

    Example:
        >>> engine = PostTrainingPrivacyEngine(mechanism="alm")
        >>> release = engine.make_private(head, epsilon=1.0, sensitivity=info)  # doctest: +SKIP
        >>> release.statement.guarantee  # doctest: +SKIP
    """

    def __init__(self, *, mechanism: str | AdditiveNoiseMechanism = "alm") -> None:
        self.mechanism = create_mechanism(mechanism) if isinstance(mechanism, str) else mechanism
        self.ledger = Ledger()

    def spent(self, module: nn.Module) -> LedgerTotal:
        """What this engine's releases of ``module`` have spent so far, composed by kind."""
        return self.ledger.total(module)

    def make_private(
        self,
        module: nn.Module,
        *,
        epsilon: float,
        delta: float = 0.0,
        sensitivity: float | SensitivityInfo,
        parameters: Sequence[str] | None = None,
        public: Sequence[str] = (),
        seed: int | None = None,
        generator: NoiseGenerator | None = None,
        accountant: PipelineAccountant | None = None,
        exact: bool = True,
    ) -> ProtectedModule:
        """Release a noisy copy of ``module`` with its :class:`PrivacyStatement`.

        Args:
            module: the trained module; it is not modified.
            epsilon: the privacy budget of this release.
            delta: 0 for ALM and Laplace; > 0 for the Gaussian mechanisms.
            sensitivity: the sensitivity of the vector of ``parameters`` (all of them
                concatenated) in the mechanism's norm. A :class:`SensitivityInfo` says where
                it came from; a bare number is recorded as caller-supplied (the guarantee then
                holds only if the caller's bound does).
            parameters: names of the parameters to protect (default: all).
            public: every parameter and buffer *not* in ``parameters``, declared public by
                the caller (not computed from private data); the statement names them.
            seed: seed the noise (reproducible research only: anyone who learns the seed can
                subtract the noise). Default: the operating system's CSPRNG.
            generator: draw from this generator instead (a seeded ``torch.Generator`` or a
                :class:`~alm_opacus.mechanisms.SecureGenerator`); exclusive with ``seed``.
            accountant: an Opacus-registered :class:`~alm_opacus.accounting.PipelineAccountant`
                (e.g. ``engine.accountant`` of a DP-SGD run) that records this release, so one
                budget covers training and release; only a release that carries a DP
                guarantee (pure or approximate, not a sampled sensitivity) can be recorded.

        Returns:
            The release, noise drawn once.

        Raises:
            ValueError: on invalid budgets, a sensitivity in the wrong norm, unknown parameter
                names, parameters or buffers left clean without being declared public, both
                ``seed`` and ``generator``, or a release the ``accountant`` cannot record (no
                DP guarantee, or another neighbouring relation than what it holds).
        """
        mech = self.mechanism
        info = _as_sensitivity(sensitivity, norm=mech.norm)
        scale = cached_calibrate(mech, epsilon=epsilon, delta=delta, sensitivity=info.value)
        release = copy.deepcopy(module)
        names, clean = _split_parameters(release, parameters=parameters, public=public)
        if seed is not None and generator is not None:
            raise ValueError("pass seed or generator, not both")
        if generator is None:
            generator = make_generator(seed=seed, secure_mode=seed is None)
        named = dict(release.named_parameters())
        plan = None
        if exact:
            plan = cached_plan(
                mech,
                epsilon=epsilon,
                delta=delta,
                sensitivity=info.value,
                dim=sum(named[n].numel() for n in names),
                dtype=release_dtype([named[n].dtype for n in names]),
            )
            scale = plan.scale
            _check_clamp(named, names, plan=plan)
        statement = statement_for(
            mechanism=mech,
            epsilon=epsilon,
            delta=delta,
            scale=scale,
            sensitivity=info,
            noise="secure" if is_secure(generator) else "seeded",
            plan=plan,
        )
        narrow = ", ".join(
            sorted({str(named[n].dtype) for n in names if is_narrow(named[n].dtype)})
        )
        if plan is not None and narrow:
            statement = replace(statement, notes=(*statement.notes, _NARROW_NOTE.format(narrow)))
        if accountant is not None:
            _record(accountant, statement, dim=sum(named[n].numel() for n in names))
        with torch.no_grad():
            for name in names:
                p = named[name]
                if plan is not None:
                    p.copy_(
                        exact_release(
                            p, mechanism=mech, scale=scale, grid=plan.grid, generator=generator
                        )
                    )
                else:
                    noise = mech.sample(tuple(p.shape), scale=scale, generator=generator)
                    p.add_(noise.to(device=p.device, dtype=p.dtype))
        record = LedgerRecord.from_statement(statement, dim=sum(named[n].numel() for n in names))
        total = self.ledger.record(module, record)
        statement = replace(statement, **total.statement_fields(), unprotected_parameters=clean)
        return ProtectedModule(release, statement=statement, protected=names)


#: What a statement adds for float16 or bfloat16 parameters (`release_dtype`).
_NARROW_NOTE = (
    "released in {}: the exact float32 release rounded to the nearest value of that dtype "
    "(and clamped to its largest finite value), which is post-processing: the guarantee "
    "holds, but shipped values need not be multiples of the grid"
)


def _check_clamp(
    named: dict[str, nn.Parameter], names: Sequence[str], *, plan: ReleasePlan
) -> None:
    """Refuse clean values beyond the grid's clamp B = 2ᵖ⁻¹·γ: never clamp them silently."""
    for name in (n for n in names if named[n].numel()):
        top = float(named[name].detach().abs().max())
        if top > plan.grid.clamp:
            raise ValueError(
                f"parameter {name!r} holds |value|={top:g} beyond the clamp "
                f"B={plan.grid.clamp:g} of the exact grid 2^{plan.grid.exponent}: expected "
                "|values| ≤ B (a float64 module, module.double(), has a range 2^29 times "
                "that of float32)"
            )


def _record(accountant: PipelineAccountant, statement: PrivacyStatement, *, dim: int) -> None:
    """Record a release in ``accountant`` (before any noise is drawn, so a refusal leaves
    nothing behind)."""
    if statement.guarantee not in (Guarantee.PURE_DP, Guarantee.APPROX_DP):
        raise ValueError(
            f"a {statement.guarantee.value} release cannot be recorded in a DP accountant: "
            "only pure or approximate DP composes; use an analytic sensitivity"
        )
    assert statement.sensitivity is not None and statement.noise_scale is not None
    accountant.record_release(
        mechanism=statement.mechanism,
        scale=statement.noise_scale,
        sensitivity=statement.grid_sensitivity or statement.sensitivity.value,
        dim=dim,
        neighbouring=statement.neighbouring,
    )


def _split_parameters(
    module: nn.Module, *, parameters: Sequence[str] | None, public: Sequence[str]
) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(names to noise, names left clean); every clean name must be declared public."""
    named = dict(module.named_parameters())
    everything = [*named, *(n for n, _ in module.named_buffers())]
    if isinstance(parameters, str):
        raise ValueError(f"parameters={parameters!r} is invalid: expected a list of names")
    names = tuple(named) if parameters is None else tuple(parameters)
    if not names:
        what = "the module has no parameters" if parameters is None else "parameters=[]"
        raise ValueError(f"{what}: expected at least one parameter to protect")
    unknown = [n for n in [*names, *public] if n not in everything]
    if unknown:
        raise ValueError(f"parameters {unknown} are not in the module; it has {everything}")
    not_parameters = [n for n in names if n not in named]
    if not_parameters:
        raise ValueError(f"{not_parameters} are buffers, not parameters: noise goes on parameters")
    not_float = [f"{n} ({named[n].dtype})" for n in names if not named[n].dtype.is_floating_point]
    if not_float:
        raise ValueError(
            f"parameters {not_float} are not floating-point: expected float16, bfloat16, "
            "float32 or float64 (noise is added to floats); declare integer ones public=[...] "
            "if they were not computed from private data"
        )
    clean = tuple(n for n in everything if n not in names)
    undeclared = [n for n in clean if n not in public]
    if undeclared:
        raise ValueError(
            f"{undeclared} would be released without noise: protect them too, or declare "
            "them public=[...] if they were not computed from private data"
        )
    return names, clean


#: Why a floating-point release states no guarantee.
FLOAT_NOTE = (
    "no guarantee: floating-point noise (exact=False). A float function of a float uniform "
    "reaches a sparse, uneven set of floats that depends on the clean value, so an attacker "
    "who knows the sampler can tell neighbouring heads apart from the released bits "
    "(Mironov 2012; docs/threat_model.md, 'A floating-point adversary'); the nominal "
    "epsilon is that of the ideal real-valued mechanism"
)


def statement_for(
    *,
    mechanism: AdditiveNoiseMechanism,
    epsilon: float,
    delta: float,
    scale: float,
    sensitivity: SensitivityInfo,
    noise: str = "secure",
    plan: ReleasePlan | None = None,
) -> PrivacyStatement:
    """What a one-shot release of ``mechanism`` at ``scale`` may claim.

    ``plan`` is the grid of an exact release (its statement names γ, B and the calibrated
    sensitivity Δ'); without one the noise is floating-point and no guarantee is stated.

    * sensitivity sampled from the population (Rubinstein & Aldà): random-DP with the
      sampler's gamma and confidence;
    * sensitivity sampled on the private members (the ALM paper's Algorithm 2 as written): no
      guarantee; the nominal epsilon is kept for reference;
    * analytic sensitivity: pure-DP (ALM, Laplace) or approximate DP (Gaussian);
    * caller-supplied sensitivity: the same, conditional on the caller's bound (noted);
    * the classic Gaussian outside its theorem (epsilon >= 1) states the delta its sigma
      actually achieves, from the exact Gaussian profile, and says so.
    """
    notes: list[str] = []
    claimed_delta = float(delta)
    if noise == "seeded":
        notes.append(
            "seeded noise: private only while the seed stays secret (whoever knows it can "
            "regenerate and subtract the noise); for reproducible research only"
        )
    if isinstance(mechanism, ClassicGaussianMechanism) and not mechanism.theorem_applies(
        epsilon=epsilon
    ):
        actual = mechanism.achieved_delta(
            epsilon=epsilon,
            scale=scale,
            sensitivity=sensitivity.value if plan is None else plan.sensitivity,
        )
        if not actual < 1:
            raise InfeasibleRelease(
                f"epsilon={epsilon:g}: the textbook Gaussian sigma achieves no delta < 1 here "
                "(exact Gaussian profile); it is proven only for epsilon < 1; use 'gaussian'"
            )
        claimed_delta = max(claimed_delta, actual)
        stated = "the delta stated" if actual >= delta else f"within the requested {delta:g}"
        notes.append(
            f"textbook Gaussian sigma is proven only for epsilon < 1; at epsilon={epsilon:g} "
            f"it achieves delta={actual:.3g} (exact Gaussian profile), {stated}"
        )
    common: dict[str, Any] = {
        "mechanism": mechanism.name,
        "noise_scale": float(scale),
        "sensitivity": sensitivity,
        "noise": noise,
    }

    def no_guarantee(reason: str) -> PrivacyStatement:
        """Nothing claimed, for ``reason``; the nominal epsilon kept for reference."""
        return PrivacyStatement.no_guarantee(
            nominal_epsilon=epsilon, notes=(*notes, reason), **common
        )

    if plan is None:
        return no_guarantee(FLOAT_NOTE)
    common.update(grid=plan.grid.gamma, clamp=plan.grid.clamp, grid_sensitivity=plan.sensitivity)
    source = sensitivity.source
    if source is SensitivitySource.SAMPLED_MEMBERS:
        return no_guarantee(
            "no guarantee: the sensitivity was sampled on the private members (the ALM paper's "
            "Algorithm 2 as written), so the estimate itself depends on them and neighbouring "
            "data sets can be told apart from it; Rubinstein & Aldà's random-DP needs "
            "neighbouring sets drawn from the population, not from the members"
        )
    if source is SensitivitySource.SAMPLED:
        guarantee = Guarantee.RANDOM_DP
        notes.append(
            "sensitivity sampled (ALM Algorithm 2) on neighbouring data sets drawn from "
            f"{sensitivity.population or 'non-private data'}: the bound may be exceeded by a "
            f"fraction gamma={sensitivity.gamma:g} of neighbouring data sets from that "
            f"population, and that holds with confidence {sensitivity.confidence:g} "
            "(Rubinstein & Aldà 2017); this is not DP"
        )
        notes.append(
            "assumption: the members are exchangeable with that population (drawn from the "
            "same distribution); the bound covers neighbouring pairs that contain the real "
            "members only under that assumption, which nothing here checks"
        )
    else:
        guarantee = Guarantee.PURE_DP if mechanism.pure else Guarantee.APPROX_DP
        if source is SensitivitySource.CALLER:
            notes.append(
                "sensitivity supplied by the caller: the guarantee holds only if that bound "
                "does for every pair of neighbouring data sets"
            )
    return PrivacyStatement(
        epsilon=float(epsilon),
        delta=claimed_delta,
        guarantee=guarantee,
        neighbouring=sensitivity.neighbouring,
        notes=tuple(notes),
        **common,
    )
