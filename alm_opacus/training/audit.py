"""White-box canary audit of DP-SGD's noise: an empirical ε lower bound with power.

The auditor sees every noisy gradient sum (white box, as in Nasr et al. 2021 and 2023, "tight
auditing") and plants *gradient canaries*: examples whose per-example gradient is a
Dirac vector ``A·e_j`` (A ≥ the clipping norm C, so it is clipped to ≈ C, the worst case
for every norm). Each coordinate j of one model is one independent trial:

- **in** world: the canary of coordinate j is in the data; the Poisson sampler takes it
  with probability q in each step, and the optimizer clips it and adds it to coordinate j;
- **out** world: in its place an example with zero gradient (removing the canary).

The optimizer under audit is a real `MechanismDPOptimizer` (or any Opacus ``DPOptimizer``
a caller builds): per-example gradients come from Opacus's ``GradSampleModule`` on a
linear layer whose input rows are the canaries, and the observation is ``p.grad`` after
``optimizer.step()`` (``loss_reduction="sum"``: the clipped sum plus noise). Nothing of the
optimizer's clipping or noise is re-implemented here, so a wrong noise scale in it shows.

The test is the likelihood ratio of the two worlds under the *claimed* noise law (Gaussian,
Laplace or logistic, of scale σ·C): per coordinate, with observations x_1 … x_T and the
clipped canary c,

    S = Σ_t log(1 − q + q·f((x_t − c)/σC) / f(x_t/σC)),

which is the most powerful test between the two worlds if the optimizer does what it claims
(Neyman–Pearson). A threshold on S is chosen on one set of trials; the Clopper–Pearson
bound of its error rates on fresh trials (`alm_opacus.attacks.metrics.epsilon_lower_bound`)
is then a lower bound on ε with the stated confidence, whatever the optimizer does. A
wrong σ moves S's laws apart beyond what the claim allows, and the bound above the claim.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import torch
from opacus import GradSampleModule
from opacus.optimizers import DPOptimizer
from scipy import stats
from torch import nn

from alm_opacus._validation import check_delta, check_epsilon, check_positive
from alm_opacus.accounting import PipelineAccountant, find_noise_multiplier
from alm_opacus.attacks.metrics import clopper_pearson, epsilon_from_rates, epsilon_lower_bound
from alm_opacus.mechanisms.sampling import NoiseGenerator, make_generator
from alm_opacus.training.optimizer import MechanismDPOptimizer, clip_factors, training_mechanism
from alm_opacus.training.sampler import poisson_mask

__all__ = [
    "CanaryAuditConfig",
    "CanaryAuditResult",
    "OptimizerFactory",
    "accountant_epsilon",
    "calibrated_noise_multiplier",
    "canary_scores",
    "choose_threshold",
    "mechanism_optimizer",
    "miscalibrated_optimizer",
    "run_canary_audit",
    "run_canary_audits",
]

#: Log-densities of the standard noise laws the likelihood ratio uses (scipy, an
#: implementation independent of the samplers under audit).
_LOG_DENSITY: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "gaussian": stats.norm.logpdf,
    "laplace": stats.laplace.logpdf,
    "alm": stats.logistic.logpdf,
}

#: Scores are rounded to multiples of 1 / _SCORE_GRID (see `canary_scores`).
_SCORE_GRID = 2.0**30

#: Builds the optimizer under audit: ``(params, noise_multiplier, max_grad_norm,
#: noise_mechanism, generator) -> DPOptimizer`` with ``loss_reduction="sum"``.
OptimizerFactory = Callable[..., DPOptimizer]


def mechanism_optimizer(
    params: Sequence[nn.Parameter],
    *,
    noise_multiplier: float,
    max_grad_norm: float,
    noise_mechanism: str,
    generator: NoiseGenerator,
) -> DPOptimizer:
    """The optimizer `alm_opacus.training.PrivacyEngine` builds, summing (not averaging)."""
    return MechanismDPOptimizer(
        torch.optim.SGD(params, lr=0.0),
        noise_multiplier=noise_multiplier,
        max_grad_norm=max_grad_norm,
        expected_batch_size=None,
        loss_reduction="sum",
        noise_mechanism=noise_mechanism,
        generator=generator,
    )


class _MiscalibratedOptimizer(MechanismDPOptimizer):
    """Adds ``noise_factor`` times the noise it claims (``noise_multiplier`` stays the claim)."""

    noise_factor = 1.0

    def add_noise(self) -> None:
        claimed = float(self.noise_multiplier)  # type: ignore[has-type]
        self.noise_multiplier = claimed * self.noise_factor
        try:
            super().add_noise()
        finally:
            self.noise_multiplier = claimed


def miscalibrated_optimizer(noise_factor: float) -> OptimizerFactory:
    """A factory of deliberately broken optimizers: noise ``noise_factor`` × the claimed σ.

    For showing what the audit catches (``noise_factor=0.5``: a σ/2 bug); never for training.

    Raises:
        ValueError: unless ``noise_factor`` is finite and positive.
    """
    factor = check_positive(noise_factor, name="noise_factor")

    def build(params: Sequence[nn.Parameter], **kwargs: Any) -> DPOptimizer:
        optimizer = _MiscalibratedOptimizer(
            torch.optim.SGD(params, lr=0.0),
            expected_batch_size=None,
            loss_reduction="sum",
            **kwargs,
        )
        optimizer.noise_factor = factor
        return optimizer

    return build


@dataclass(frozen=True, kw_only=True)
class CanaryAuditConfig:
    """One audited DP-SGD configuration.

    Attributes:
        noise_mechanism: ``alm``, ``laplace`` or ``gaussian``.
        target_epsilon: ε the noise multiplier is calibrated to (the accountant's search).
        target_delta: δ of the calibration and of the lower bound.
        sample_rate: Poisson rate q of each canary.
        steps: DP-SGD steps T the auditor observes.
        max_grad_norm: clipping bound C, in the mechanism's norm.
        canary_magnitude: A / C, the canary gradient's norm over C (≥ 1: clipped to C).
        trials: canaries (coordinates) per world in EACH of the two phases.
        chunk: coordinates per audited model (memory grows as chunk²: per-example
            gradients of chunk canaries over chunk coordinates).
        confidence: joint confidence of each Clopper–Pearson bound.
    """

    noise_mechanism: str = "alm"
    target_epsilon: float = 4.0
    target_delta: float = 1e-5
    sample_rate: float = 1.0
    steps: int = 1
    max_grad_norm: float = 1.0
    canary_magnitude: float = 2.0
    trials: int = 20_000
    chunk: int = 2048
    confidence: float = 0.95

    def __post_init__(self) -> None:
        object.__setattr__(self, "noise_mechanism", training_mechanism(self.noise_mechanism).name)
        check_epsilon(self.target_epsilon)
        check_delta(self.target_delta)
        if not 0.0 < self.sample_rate <= 1.0:
            raise ValueError(f"sample_rate={self.sample_rate!r} is invalid: expected (0, 1]")
        for name in ("steps", "trials", "chunk"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name}={value!r} is invalid: expected an integer ≥ 1")
        check_positive(self.max_grad_norm, name="max_grad_norm")
        if not self.canary_magnitude >= 1.0:
            raise ValueError(
                f"canary_magnitude={self.canary_magnitude!r} is invalid: expected ≥ 1 (a "
                "canary below the clipping norm is not the worst case)"
            )
        if not 0.0 < self.confidence < 1.0:
            raise ValueError(f"confidence={self.confidence!r} is invalid: expected (0, 1)")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True, kw_only=True)
class CanaryAuditResult:
    """One audit (one seed) of one configuration.

    Attributes:
        config: the audited configuration.
        seed: the audit's seed.
        noise_multiplier: σ the optimizer was given (the claimed one).
        accountant_epsilon: the claim: the ``alm_pld`` accountant's ε at ``target_delta``
            for these steps, valid in every dimension (``dim=None``), as for a model.
        scalar_epsilon: the accountant's ε for one coordinate (``dim=1``): the exact ε of
            what the audit observes (for ``alm``, tighter than the claim).
        epsilon_lower_bound: the Clopper–Pearson lower bound (``confidence``).
        epsilon_ceiling: the largest bound ``trials`` can give (no errors at all).
        threshold: the likelihood-ratio threshold chosen on the selection trials.
        false_positives: evaluation trials without the canary flagged.
        false_negatives: evaluation trials with the canary not flagged.
        fpr_upper: Clopper–Pearson upper bound of the false-positive rate.
        fnr_upper: same for the false-negative rate.
        canary_shift: the clipped canary's contribution to its coordinate, over C.
    """

    config: CanaryAuditConfig
    seed: int
    noise_multiplier: float
    accountant_epsilon: float
    scalar_epsilon: float
    epsilon_lower_bound: float
    epsilon_ceiling: float
    threshold: float
    false_positives: int
    false_negatives: int
    fpr_upper: float
    fnr_upper: float
    canary_shift: float

    @property
    def violation(self) -> bool:
        """Whether the lower bound exceeds the claim (the optimizer is not what it claims)."""
        return self.epsilon_lower_bound > self.accountant_epsilon

    @property
    def tightness(self) -> float:
        """Lower bound over the claim (1 would be a tight accountant and audit)."""
        return self.epsilon_lower_bound / self.accountant_epsilon

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["tightness"] = self.tightness
        out["violation"] = self.violation
        return out


def calibrated_noise_multiplier(config: CanaryAuditConfig) -> float:
    """σ for the configuration: the accountant's search, as `PrivacyEngine` runs it."""
    return float(
        find_noise_multiplier(
            target_epsilon=config.target_epsilon,
            target_delta=config.target_delta,
            sample_rate=config.sample_rate,
            steps=config.steps,
            mechanism=config.noise_mechanism,
        )
    )


def accountant_epsilon(
    config: CanaryAuditConfig, *, noise_multiplier: float, dim: int | None = None
) -> float:
    """The ``alm_pld`` accountant's ε at ``target_delta`` for the configuration's steps.

    Args:
        config: the configuration.
        noise_multiplier: σ.
        dim: noised coordinates: ``None`` (any dimension: the claim for a model) or ``1``
            (one coordinate: what the audit observes).
    """
    accountant = PipelineAccountant()
    accountant.step(
        noise_multiplier=noise_multiplier,
        sample_rate=config.sample_rate,
        mechanism=config.noise_mechanism,
        dim=dim,
        num_steps=config.steps,
    )
    return float(accountant.get_epsilon(config.target_delta))


def canary_shift(config: CanaryAuditConfig) -> float:
    """The clipped canary's contribution to its coordinate, over C (Opacus's factor)."""
    norm = torch.tensor([config.canary_magnitude * config.max_grad_norm], dtype=torch.float64)
    factor = clip_factors(norm, max_grad_norm=config.max_grad_norm)
    return float(factor * norm) / config.max_grad_norm


def _observe(
    config: CanaryAuditConfig,
    *,
    trials: int,
    with_canary: bool,
    noise_multiplier: float,
    make_optimizer: OptimizerFactory,
    generator: NoiseGenerator,
) -> np.ndarray:
    """``(trials, steps)`` noisy gradient sums on the canaries' coordinates, over C."""
    c = config.max_grad_norm
    out = []
    for start in range(0, trials, config.chunk):
        width = min(config.chunk, trials - start)
        layer = nn.Linear(width, 1, bias=False, dtype=torch.float64)
        model = GradSampleModule(layer, loss_reduction="sum")
        optimizer = make_optimizer(
            list(model.parameters()),
            noise_multiplier=noise_multiplier,
            max_grad_norm=c,
            noise_mechanism=config.noise_mechanism,
            generator=generator,
        )
        rows = torch.eye(width, dtype=torch.float64) * (config.canary_magnitude * c)
        seen = np.empty((width, config.steps))
        for t in range(config.steps):
            optimizer.zero_grad()
            if with_canary:  # Poisson sampling of each canary; the loss is linear in w
                batch = rows[
                    poisson_mask(width, sample_rate=config.sample_rate, generator=generator)
                ]
            else:  # the canary removed: a zero-gradient example in its place
                batch = torch.zeros((1, width), dtype=torch.float64)
            with warnings.catch_warnings():  # torch: the input needs no gradient, by design
                warnings.filterwarnings("ignore", message="Full backward hook is firing")
                model(batch).sum().backward()
            optimizer.step()
            grad = layer.weight.grad
            assert grad is not None
            seen[:, t] = grad.detach().reshape(-1).cpu().numpy() / c
        out.append(seen)
        model._close()
    return np.concatenate(out)


def canary_scores(
    observations: np.ndarray, *, config: CanaryAuditConfig, noise_multiplier: float
) -> np.ndarray:
    """The log-likelihood ratio S of "canary in" against "canary out", per trial.

    ``observations`` are ``(trials, steps)`` gradient sums over C; the noise law is the
    configuration's mechanism at scale σ (over C), the canary's shift `canary_shift`.
    """
    log_f = _LOG_DENSITY[config.noise_mechanism]
    x = observations / noise_multiplier
    shift = canary_shift(config) / noise_multiplier
    loss = log_f(x - shift) - log_f(x)  # log f(x − c) / f(x), per step
    q = config.sample_rate
    per_step = np.logaddexp(math.log1p(-q), math.log(q) + loss) if q < 1.0 else loss
    # Rounded to 2^-30: S measures the noise law. Unrounded, its last bits differ between
    # the worlds (fl(c + Z) keeps fewer low bits of Z than Z itself: Mironov 2012), and on
    # the flat parts of the Laplace loss a threshold could select on those bits, auditing
    # float artefacts instead of the scale. (Rounding is post-processing: still sound.)
    return np.asarray(np.round(per_step.sum(axis=1) * _SCORE_GRID) / _SCORE_GRID)


def choose_threshold(
    *, scores_in: np.ndarray, scores_out: np.ndarray, delta: float, confidence: float
) -> float:
    """The threshold whose Clopper–Pearson ε bound is largest on these (selection) trials.

    The rule flags "canary in" when ``score >= threshold``; candidates are the observed
    scores. Use the result only on fresh trials.
    """
    candidates = np.unique(np.concatenate([scores_in, scores_out]))
    ins, outs = np.sort(scores_in), np.sort(scores_out)
    false_pos = outs.size - np.searchsorted(outs, candidates, side="left")
    false_neg = np.searchsorted(ins, candidates, side="left")
    each = 1 - (1 - confidence) / 2  # Bonferroni, as epsilon_lower_bound does
    _, fpr_u = clopper_pearson(successes=false_pos, trials=outs.size, confidence=each, side="upper")
    _, fnr_u = clopper_pearson(successes=false_neg, trials=ins.size, confidence=each, side="upper")
    bounds = epsilon_from_rates(fpr=fpr_u, fnr=fnr_u, delta=delta)
    return float(candidates[int(np.argmax(bounds))])


def run_canary_audit(
    config: CanaryAuditConfig,
    *,
    seed: int,
    noise_multiplier: float | None = None,
    epsilon: float | None = None,
    make_optimizer: OptimizerFactory = mechanism_optimizer,
    threshold: float | None = None,
) -> CanaryAuditResult:
    """Audit one configuration with one seed: choose a threshold, then bound on fresh trials.

    Args:
        config: the configuration.
        seed: seeds the audit's (public) randomness: canary sampling and the optimizer's
            noise generator.
        noise_multiplier: the σ the optimizer is given and claims; calibrated with
            `calibrated_noise_multiplier` when ``None``.
        epsilon: the claim; `accountant_epsilon` (any dimension) when ``None``.
        make_optimizer: builds the optimizer under audit (default: `mechanism_optimizer`).
        threshold: a likelihood-ratio threshold fixed in advance (then no selection trials
            are run); ``None`` chooses it on ``config.trials`` selection trials per world.

    Returns:
        The bound, its ceiling, the claim and the exact one-coordinate ε.

    Raises:
        ValueError: on a bad seed.
    """
    sigma = calibrated_noise_multiplier(config) if noise_multiplier is None else noise_multiplier
    claimed = accountant_epsilon(config, noise_multiplier=sigma) if epsilon is None else epsilon
    generator = make_generator(seed=seed)

    def scores(with_canary: bool) -> np.ndarray:
        seen = _observe(
            config,
            trials=config.trials,
            with_canary=with_canary,
            noise_multiplier=sigma,
            make_optimizer=make_optimizer,
            generator=generator,
        )
        return canary_scores(seen, config=config, noise_multiplier=sigma)

    if threshold is None:
        threshold = choose_threshold(
            scores_in=scores(True),
            scores_out=scores(False),
            delta=config.target_delta,
            confidence=config.confidence,
        )
    ev_in, ev_out = scores(True), scores(False)
    fp, fn = int((ev_out >= threshold).sum()), int((ev_in < threshold).sum())
    n = config.trials
    bound, fpr_u, fnr_u = epsilon_lower_bound(
        false_positives=fp,
        negatives=n,
        false_negatives=fn,
        positives=n,
        delta=config.target_delta,
        confidence=config.confidence,
    )
    ceiling, _, _ = epsilon_lower_bound(
        false_positives=0,
        negatives=n,
        false_negatives=0,
        positives=n,
        delta=config.target_delta,
        confidence=config.confidence,
    )
    return CanaryAuditResult(
        config=config,
        seed=seed,
        noise_multiplier=sigma,
        accountant_epsilon=claimed,
        scalar_epsilon=accountant_epsilon(config, noise_multiplier=sigma, dim=1),
        epsilon_lower_bound=bound,
        epsilon_ceiling=ceiling,
        threshold=float(threshold),
        false_positives=fp,
        false_negatives=fn,
        fpr_upper=fpr_u,
        fnr_upper=fnr_u,
        canary_shift=canary_shift(config),
    )


def run_canary_audits(
    config: CanaryAuditConfig,
    *,
    seeds: Sequence[int],
    noise_multiplier: float | None = None,
    make_optimizer: OptimizerFactory = mechanism_optimizer,
) -> list[CanaryAuditResult]:
    """Audit one configuration once per seed, calibrating σ and the claim once.

    Each seed's bound holds with probability ``config.confidence`` on its own; the maximum
    over many seeds is a check of the claim (it must stay below), not a bound at that level.

    Args:
        config: the configuration.
        seeds: distinct seeds.
        noise_multiplier: the σ the optimizer is given and claims (default: calibrated).
        make_optimizer: builds the optimizer under audit.

    Raises:
        ValueError: if ``seeds`` is empty or repeats a seed.
    """
    if not seeds or len(set(seeds)) != len(seeds):
        raise ValueError(f"seeds={list(seeds)!r} is invalid: expected distinct seeds")
    sigma = calibrated_noise_multiplier(config) if noise_multiplier is None else noise_multiplier
    claimed = accountant_epsilon(config, noise_multiplier=sigma)
    return [
        run_canary_audit(
            config,
            seed=seed,
            noise_multiplier=sigma,
            epsilon=claimed,
            make_optimizer=make_optimizer,
        )
        for seed in seeds
    ]
