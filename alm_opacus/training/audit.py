"""Canary audit of DP-SGD with a noise mechanism: an empirical epsilon lower bound.

The audited configuration trains a logistic regression (two real features, one canary
feature, a bias) by DP-SGD on ``num_examples`` public synthetic points, with and without one
crafted canary, many times; the privacy loss of the canary is then bounded from below with
Clopper–Pearson intervals (Jagielski et al. 2020; Nasr et al. 2021), using the project's
`alm_opacus.attacks.metrics`.

The canary is the worst case the clipping allows, built in input space:

- it lies on a feature no real example uses (``x = A e₂``), so its gradient is aligned with
  one coordinate, which is the worst case for the L1 mechanisms, and nothing but the canary
  and the noise moves that coordinate's weight;
- its weight starts at ``canary_init`` (large negative) and its label is 1, so the canary is
  misclassified in every step and its gradient, of norm ≈ ``A``, is clipped to the full
  ``max_grad_norm`` whenever it is sampled (each run records that this held).

The score of a trained model is the change of the canary coordinate's weight; the threshold
is chosen on one set of runs and the bound computed on a fresh set, so the selection cannot
inflate it. The many models are trained at once by `train_batched`, a hand-vectorised loop
that uses the SAME per-sample norms and clip factors (`per_sample_norms`, `clip_factors`),
Poisson masks (`poisson_mask`) and noise as `MechanismDPOptimizer` and
`SecureDPDataLoader`; the tests check that it replays Opacus from the same seeds. By default
(``exact=True``) that is the shipped exact step: each clipped example rounded to the step's
grid with its cell norm enforced, the int64 sum, exact grid noise at σΔ', γ·(sum + K)
(`alm_opacus.mechanisms.exact`); ``exact=False`` audits the floating-point step.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import torch

from alm_opacus._validation import check_delta, check_epsilon, check_positive
from alm_opacus.accounting import PipelineAccountant
from alm_opacus.attacks.metrics import clopper_pearson, epsilon_from_rates, epsilon_lower_bound
from alm_opacus.mechanisms.exact import (
    Grid,
    cell_radius,
    dequantize,
    discrete_noise,
    enforce_radius,
    inflated_sensitivity,
    scaled_cells,
    step_grid,
)
from alm_opacus.mechanisms.sampling import NoiseGenerator, make_generator
from alm_opacus.training.engine import noise_multiplier_for
from alm_opacus.training.optimizer import clip_factors, per_sample_norms, training_mechanism
from alm_opacus.training.sampler import poisson_mask

__all__ = [
    "NUM_FEATURES",
    "NUM_PARAMETERS",
    "BatchedRuns",
    "CanaryAuditConfig",
    "CanaryAuditResult",
    "accountant_epsilon",
    "audit_data",
    "calibrated_noise_multiplier",
    "choose_threshold",
    "run_canary_audit",
    "run_canary_audits",
    "train_batched",
]

#: Two real features and the canary's own feature (index 2); plus a bias.
NUM_FEATURES = 3
NUM_PARAMETERS = NUM_FEATURES + 1
CANARY_FEATURE = 2
_CHUNK = 4096  # models trained at once: ~4096 x 33 x 3 float64 per-sample gradients


@dataclass(frozen=True, kw_only=True)
class CanaryAuditConfig:
    """One audited DP-SGD configuration.

    Attributes:
        noise_mechanism: ``alm``, ``laplace`` or ``gaussian``.
        target_epsilon: ε the noise multiplier is calibrated to (by the engine's search).
        target_delta: δ of the calibration and of the lower bound.
        sample_rate: Poisson rate q.
        steps: DP-SGD steps T.
        num_examples: real (non-canary) examples.
        expected_batch_size: divisor of the noisy sum (Opacus's ``int(n q)``).
        max_grad_norm: clipping bound C, in the mechanism's norm.
        learning_rate: SGD step size.
        canary_magnitude: A, the canary's feature value (its raw gradient norm is ≈ A).
        canary_init: initial weight of the canary feature (keeps the canary misclassified).
        runs: models per world (with / without the canary) in EACH of the two phases.
        confidence: joint confidence of the Clopper–Pearson bound.
        data_seed: seed of the public synthetic data.
        exact: audit the exact step (the default, as `MechanismDPOptimizer` ships it);
            False audits the floating-point step (``exact=False``).
    """

    noise_mechanism: str = "alm"
    target_epsilon: float = 4.0
    target_delta: float = 1e-5
    sample_rate: float = 0.25
    steps: int = 4
    num_examples: int = 32
    expected_batch_size: int = 8
    max_grad_norm: float = 1.0
    learning_rate: float = 0.5
    canary_magnitude: float = 1000.0
    canary_init: float = -1000.0
    runs: int = 1000
    confidence: float = 0.95
    data_seed: int = 0
    exact: bool = True

    def __post_init__(self) -> None:
        training_mechanism(self.noise_mechanism)
        check_epsilon(self.target_epsilon)
        check_delta(self.target_delta)
        if not 0.0 < self.sample_rate <= 1.0:
            raise ValueError(f"sample_rate={self.sample_rate!r} is invalid: expected (0, 1]")
        for name in ("steps", "num_examples", "expected_batch_size", "runs"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name}={value!r} is invalid: expected an integer ≥ 1")
        for name in ("max_grad_norm", "learning_rate", "canary_magnitude"):
            check_positive(getattr(self, name), name=name)
        if not 0.0 < self.confidence < 1.0:
            raise ValueError(f"confidence={self.confidence!r} is invalid: expected (0, 1)")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True, kw_only=True)
class BatchedRuns:
    """Final parameters of many DP-SGD runs.

    Attributes:
        weight: ``(R, NUM_FEATURES)`` final weights.
        bias: ``(R,)`` final biases.
        canary_steps: (run, step) pairs in which the canary was sampled.
        canary_full_norm_steps: of those, the pairs in which its gradient was clipped
            (raw norm ≥ ``max_grad_norm``), i.e. it contributed the full bound.
    """

    weight: torch.Tensor
    bias: torch.Tensor
    canary_steps: int
    canary_full_norm_steps: int


@dataclass(frozen=True, kw_only=True)
class CanaryAuditResult:
    """One audit (one seed) of one configuration.

    Attributes:
        config: the audited configuration.
        seed: the audit's seed (selection and evaluation runs draw from it).
        noise_multiplier: σ from the engine's calibration.
        accountant_epsilon: the ``alm_pld`` accountant's ε at ``target_delta`` for the run.
        epsilon_lower_bound: the Clopper–Pearson lower bound (``confidence``).
        epsilon_ceiling: the largest bound ``runs`` evaluation runs can give (no errors).
        threshold: score threshold chosen on the selection runs.
        false_positives: evaluation runs without the canary flagged.
        false_negatives: evaluation runs with the canary not flagged.
        fpr_upper: Clopper–Pearson upper bound of the false-positive rate.
        fnr_upper: same for the false-negative rate.
        canary_full_norm: fraction of the canary's sampled steps at full clipping norm.
    """

    config: CanaryAuditConfig
    seed: int
    noise_multiplier: float
    accountant_epsilon: float
    epsilon_lower_bound: float
    epsilon_ceiling: float
    threshold: float
    false_positives: int
    false_negatives: int
    fpr_upper: float
    fnr_upper: float
    canary_full_norm: float

    @property
    def tightness(self) -> float:
        """Lower bound over the accountant's ε (1 would be a tight accountant)."""
        return self.epsilon_lower_bound / self.accountant_epsilon

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["tightness"] = self.tightness
        return out


def audit_data(config: CanaryAuditConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """Features ``(n + 1, 3)`` and labels ``(n + 1,)`` in float64; the canary is the last row.

    Real examples: two Gaussian blobs at ±(1, 1)/√2 (std 0.5) with labels 1 / 0 alternating,
    canary feature 0. Canary: ``(0, 0, canary_magnitude)`` with label 1.
    """
    g = torch.Generator().manual_seed(config.data_seed)
    n = config.num_examples
    labels = (torch.arange(n) % 2).to(torch.float64)
    centre = (2 * labels - 1)[:, None] * torch.full((1, 2), 1 / math.sqrt(2.0), dtype=torch.float64)
    real = centre + 0.5 * torch.randn(n, 2, generator=g, dtype=torch.float64)
    x = torch.zeros(n + 1, NUM_FEATURES, dtype=torch.float64)
    x[:n, :2] = real
    x[n, CANARY_FEATURE] = config.canary_magnitude
    return x, torch.cat([labels, torch.ones(1, dtype=torch.float64)])


def initial_parameters(config: CanaryAuditConfig) -> tuple[torch.Tensor, float]:
    """Initial weight ``(3,)`` (zero except the canary feature's) and bias (0)."""
    weight = torch.zeros(NUM_FEATURES, dtype=torch.float64)
    weight[CANARY_FEATURE] = config.canary_init
    return weight, 0.0


def train_batched(
    *,
    config: CanaryAuditConfig,
    noise_multiplier: float,
    with_canary: torch.Tensor,
    generator: NoiseGenerator,
    sampling_generator: NoiseGenerator | None = None,
) -> BatchedRuns:
    """Train ``len(with_canary)`` independent DP-SGD runs at once (Opacus's step, vectorised).

    Each step: Poisson mask (rate q; the canary row only in runs with ``with_canary``),
    per-example gradients of the logistic loss, clipping in the mechanism's norm over
    [weight, bias], the sum plus mechanism noise of scale σC on all 4 coordinates, divided by
    ``expected_batch_size``, then an SGD step, exactly as `MechanismDPOptimizer` does. With
    ``config.exact`` (default) the sum and noise are its exact step's: cells on the step grid
    (norm enforced), their int64 sum plus exact grid noise of scale σΔ', times γ.

    Args:
        config: the configuration.
        noise_multiplier: σ ≥ 0.
        with_canary: ``(R,)`` bool, which runs hold the canary.
        generator: source of the noise, and of the masks unless ``sampling_generator``.
        sampling_generator: source of the Poisson masks. With one run (R = 1) and seeded
            generators, the draws are those of `PrivacyEngine` given the same seeds (as
            ``noise_generator`` and as the data loader's ``generator``).

    Returns:
        The final parameters and the canary's clipping record.
    """
    mechanism = training_mechanism(config.noise_mechanism)
    x, y = audit_data(config)
    rows = x.shape[0]
    runs = with_canary.shape[0]
    w0, b0 = initial_parameters(config)
    weight = w0.repeat(runs, 1)
    bias = torch.full((runs,), b0, dtype=torch.float64)
    norm = mechanism.norm
    grid = step_grid(max_grad_norm=config.max_grad_norm, norm=norm, dim=NUM_PARAMETERS)
    sensitivity = config.max_grad_norm
    if config.exact:  # Δ' = C + w(d)γ/2, as MechanismDPOptimizer.noise_sensitivity
        sensitivity = inflated_sensitivity(sensitivity=sensitivity, norm=norm,
                                           dim=NUM_PARAMETERS, grid=grid, rounding=0.5)  # fmt: skip
    radius = cell_radius(max_grad_norm=config.max_grad_norm, norm=norm, dim=NUM_PARAMETERS,
                         grid=grid)  # fmt: skip
    scale = noise_multiplier * sensitivity
    sampled = full = 0
    masks = generator if sampling_generator is None else sampling_generator
    for _ in range(config.steps):
        mask = poisson_mask((runs, rows), sample_rate=config.sample_rate, generator=masks)
        mask[:, -1] &= with_canary
        residual = torch.sigmoid(weight @ x.T + bias[:, None]) - y  # (R, n + 1)
        grad_w = residual[:, :, None] * x  # (R, n + 1, 3)
        norms = per_sample_norms(
            [grad_w.reshape(-1, NUM_FEATURES), residual.reshape(-1, 1)], norm=mechanism.norm
        ).reshape(runs, rows)
        factors = clip_factors(norms, max_grad_norm=config.max_grad_norm) * mask
        sampled += int(mask[:, -1].sum())
        full += int((mask[:, -1] & (norms[:, -1] >= config.max_grad_norm)).sum())
        if config.exact:
            summed = _exact_noisy_sum(factors, grad_w, residual, grid=grid, radius=radius,
                                      norm=norm, scale=scale, mechanism=mechanism,
                                      generator=generator)  # fmt: skip
        else:
            summed = torch.cat([torch.einsum("rn,rnf->rf", factors, grad_w),
                                (factors * residual).sum(1, keepdim=True)], dim=1)  # fmt: skip
        if scale > 0 and not config.exact:
            summed = summed + mechanism.sample(
                (runs, NUM_PARAMETERS), scale=scale, generator=generator
            ).to(summed.device)
        step = config.learning_rate * (summed / config.expected_batch_size)
        weight = weight - step[:, :NUM_FEATURES]
        bias = bias - step[:, NUM_FEATURES]
    return BatchedRuns(weight=weight, bias=bias, canary_steps=sampled, canary_full_norm_steps=full)


def _exact_noisy_sum(
    factors: torch.Tensor, grad_w: torch.Tensor, residual: torch.Tensor, *, grid: Grid,
    radius: float, norm: str, scale: float, mechanism: object, generator: NoiseGenerator,
) -> torch.Tensor:  # fmt: skip
    """``(R, 4)`` γ·(Σ cells + K): `MechanismDPOptimizer`'s exact step for every run at once
    (cells per example, norm enforced; noise drawn per parameter, weight then bias, as the
    optimizer draws it, so one seeded run replays it)."""
    runs, rows = factors.shape
    flat = factors.reshape(-1)
    cells = [scaled_cells(grad_w.reshape(-1, NUM_FEATURES), flat, grid=grid),
             scaled_cells(residual.reshape(-1, 1), flat, grid=grid)]  # fmt: skip
    enforce_radius(cells, norm=norm, radius=radius)
    total = [c.view(runs, rows, -1).sum(1).to(torch.int64) for c in cells]  # exact: < 2^53
    if scale > 0:
        total = [t + discrete_noise(tuple(t.shape), mechanism=mechanism, scale=scale, grid=grid,
                                    generator=generator) for t in total]  # fmt: skip
    return dequantize(torch.cat(total, dim=1), grid=grid, dtype=torch.float64)


def canary_scores(runs: BatchedRuns, config: CanaryAuditConfig) -> np.ndarray:
    """How far each run moved the canary feature's weight (larger = canary more likely in)."""
    w0, _ = initial_parameters(config)
    return (runs.weight[:, CANARY_FEATURE] - w0[CANARY_FEATURE]).numpy()


def _train_scores(
    config: CanaryAuditConfig, *, noise_multiplier: float, generator: NoiseGenerator
) -> tuple[np.ndarray, np.ndarray, int, int]:
    """Scores of ``runs`` models with and ``runs`` without the canary, trained in chunks."""
    flags = torch.cat([torch.ones(config.runs, dtype=torch.bool),
                       torch.zeros(config.runs, dtype=torch.bool)])  # fmt: skip
    scores, sampled, full = [], 0, 0
    for chunk in flags.split(_CHUNK):
        runs = train_batched(
            config=config, noise_multiplier=noise_multiplier, with_canary=chunk, generator=generator
        )
        scores.append(canary_scores(runs, config))
        sampled, full = sampled + runs.canary_steps, full + runs.canary_full_norm_steps
    s = np.concatenate(scores)
    return s[: config.runs], s[config.runs :], sampled, full


def choose_threshold(
    *, scores_in: np.ndarray, scores_out: np.ndarray, delta: float, confidence: float
) -> float:
    """The threshold whose Clopper–Pearson epsilon bound is largest on these (selection) runs.

    The rule flags "canary in" when ``score >= threshold``; candidates are the observed
    scores. Use the result only on fresh runs.
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


def calibrated_noise_multiplier(config: CanaryAuditConfig) -> float:
    """σ for the configuration, from the same search `PrivacyEngine` uses (empty prior)."""
    return noise_multiplier_for(
        accountant=PipelineAccountant(),
        target_epsilon=config.target_epsilon,
        target_delta=config.target_delta,
        sample_rate=config.sample_rate,
        steps=config.steps,
        noise_mechanism=config.noise_mechanism,
        dim=NUM_PARAMETERS,
    )


def accountant_epsilon(config: CanaryAuditConfig, *, noise_multiplier: float) -> float:
    """The ``alm_pld`` accountant's ε at ``target_delta`` after the configuration's steps,
    recorded as `MechanismDPOptimizer`'s hook records them (mechanism and dimension 4)."""
    accountant = PipelineAccountant()
    accountant.step(
        noise_multiplier=noise_multiplier,
        sample_rate=config.sample_rate,
        mechanism=training_mechanism(config.noise_mechanism).name,
        dim=NUM_PARAMETERS,
        num_steps=config.steps,
    )
    return float(accountant.get_epsilon(config.target_delta))


def run_canary_audit(
    config: CanaryAuditConfig,
    *,
    seed: int,
    noise_multiplier: float | None = None,
    epsilon: float | None = None,
) -> CanaryAuditResult:
    """Audit one configuration with one seed: select a threshold, then bound on fresh runs.

    Args:
        config: the configuration.
        seed: seeds the (public, reproducible) randomness of the audit's training runs.
        noise_multiplier: σ; calibrated with `calibrated_noise_multiplier` when ``None``.
        epsilon: the accountant's ε; computed with `accountant_epsilon` when ``None``.

    Returns:
        The result, with the bound, its ceiling and the accountant's ε.

    Raises:
        ValueError: on a bad seed.
    """
    sigma = calibrated_noise_multiplier(config) if noise_multiplier is None else noise_multiplier
    claimed = accountant_epsilon(config, noise_multiplier=sigma) if epsilon is None else epsilon
    generator = make_generator(seed=seed)
    sel_in, sel_out, s1, f1 = _train_scores(config, noise_multiplier=sigma, generator=generator)
    threshold = choose_threshold(
        scores_in=sel_in, scores_out=sel_out, delta=config.target_delta,
        confidence=config.confidence,
    )  # fmt: skip
    ev_in, ev_out, s2, f2 = _train_scores(config, noise_multiplier=sigma, generator=generator)
    fp, fn = int((ev_out >= threshold).sum()), int((ev_in < threshold).sum())
    bound, fpr_u, fnr_u = epsilon_lower_bound(
        false_positives=fp, negatives=config.runs, false_negatives=fn, positives=config.runs,
        delta=config.target_delta, confidence=config.confidence,
    )  # fmt: skip
    ceiling, _, _ = epsilon_lower_bound(
        false_positives=0, negatives=config.runs, false_negatives=0, positives=config.runs,
        delta=config.target_delta, confidence=config.confidence,
    )  # fmt: skip
    return CanaryAuditResult(
        config=config, seed=seed, noise_multiplier=sigma, accountant_epsilon=claimed,
        epsilon_lower_bound=bound, epsilon_ceiling=ceiling, threshold=threshold,
        false_positives=fp, false_negatives=fn, fpr_upper=fpr_u, fnr_upper=fnr_u,
        canary_full_norm=(f1 + f2) / max(1, s1 + s2),
    )  # fmt: skip


def run_canary_audits(
    config: CanaryAuditConfig, *, seeds: Sequence[int]
) -> list[CanaryAuditResult]:
    """Audit one configuration once per seed, calibrating σ and the accountant's ε once.

    Each seed's bound holds with probability ``config.confidence`` on its own; the maximum
    over many seeds is a check of the accountant (it must stay below), not a 95% bound.

    Raises:
        ValueError: if ``seeds`` is empty or repeats a seed.
    """
    if not seeds or len(set(seeds)) != len(seeds):
        raise ValueError(f"seeds={list(seeds)!r} is invalid: expected distinct seeds")
    sigma = calibrated_noise_multiplier(config)
    claimed = accountant_epsilon(config, noise_multiplier=sigma)
    return [
        run_canary_audit(config, seed=seed, noise_multiplier=sigma, epsilon=claimed)
        for seed in seeds
    ]
