"""The Opacus training loop: one DP-SGD run of a model on member inputs, and its accounting.

Structure (so that the engine can be swapped, e.g. for ``alm_opacus.training``'s):

* a :class:`TrainingBackend` names the privacy engine factory (``(accountant, *, seeded) ->``
  an engine with Opacus's ``make_private(module=, optimizer=, data_loader=, noise_multiplier=,
  max_grad_norm=, poisson_sampling=True, noise_generator=)``), the generators it is given
  (``(noise_seed, device) -> (Poisson generator, noise generator)``, ``None`` letting the
  engine draw its own), and what the statement says of secure runs. :data:`ALM_TRAINING`
  (the default of every method) is ``alm_opacus.training``'s engine: Opacus's algorithm with
  exact grid noise and batches drawn from the AES-CTR keystream. :data:`OPACUS` is Opacus's
  own engine, kept for comparisons with seeded runs only: it draws its noise from a
  ``torch.Generator``, so it has no secure mode;
* :func:`run_opacus` trains and returns an :class:`OpacusTraining`;
* :func:`fit_private` calibrates sigma (:class:`~baselines.dpsgd.accounting.SigmaCache`),
  trains, checks the accountant's epsilon and returns an :class:`OpacusRun` (a head's run:
  :mod:`baselines.dpsgd.head`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
from torch import Tensor, nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset

from alm_opacus import training
from alm_opacus.methods import TrainingNoise
from alm_opacus.plugin import check_delta, check_epsilon, derive_seed
from alm_opacus.training import training_mechanism
from baselines._common import single_thread
from baselines.dpsgd.accounting import (
    GAUSSIAN,
    NoiseStep,
    SigmaCache,
    calibrated_sigma,
    checked_epsilon,
    quiet_opacus,
)
from baselines.dpsgd.config import (
    DPSGDConfig,
    check_accountant,
)

__all__ = [
    "ALM_TRAINING",
    "EXACT_NOTE",
    "OPACUS",
    "SECURE_NOTE",
    "SEEDED_NOTE",
    "EngineFactory",
    "GeneratorFactory",
    "OpacusRun",
    "OpacusTraining",
    "TrainingBackend",
    "alm_engine",
    "alm_generators",
    "calibrated_sigma",
    "fit_private",
    "opacus_engine",
    "opacus_generators",
    "run_opacus",
]

#: What the statement says of secure runs (``alm_opacus.training``'s engine).
SECURE_NOTE = (
    "Poisson sampling and gradient noise: AES-256-CTR keystream keyed from os.urandom "
    "(alm_opacus.training's SecureGenerator); no seed exists to replay"
)
#: What the statement says of an exact run's noise (docs/mechanisms.md, "Exact DP-SGD").
EXACT_NOTE = (
    "exact steps: each example's clipped gradient rounded to a power-of-two grid in int64 "
    "(its cell norm checked exactly), integer noise sampled exactly from the mechanism's law "
    "rounded to the grid, so the noisy sum is post-processing of the continuous mechanism; "
    "the noise scale is the noise multiplier times the rounded sensitivity"
)
SEEDED_NOTE = (
    "Poisson sampling and gradient noise: torch generators seeded from public labels (method, "
    "seed, draw, epsilon); whoever knows them can replay the run, so the guarantee holds only "
    "while they stay secret (reproducible research only)"
)


class PrivateEngine(Protocol):
    """What the loop needs of a privacy engine (Opacus's ``PrivacyEngine`` has it)."""

    accountant: Any

    def make_private(self, **kwargs: Any) -> Any: ...


class EngineFactory(Protocol):
    """``factory(accountant name, *, seeded) -> engine``; ``seeded``: the run passes seeded
    generators (an engine with a secure mode must then be made without it)."""

    def __call__(self, accountant: str, *, seeded: bool) -> PrivateEngine: ...


#: ``factory(noise_seed, device) -> (Poisson sampling generator, noise generator)``.
GeneratorFactory = Callable[
    [int | None, torch.device], tuple[torch.Generator | None, torch.Generator | None]
]


def opacus_engine(accountant: str, *, seeded: bool = False) -> PrivateEngine:
    """Opacus's own engine with ``accountant`` (``secure_mode`` off: it needs torchcsprng;
    ``seeded`` therefore changes nothing)."""
    from opacus import PrivacyEngine  # here: registering the methods needs no Opacus

    with quiet_opacus():
        return PrivacyEngine(accountant=accountant)


def opacus_generators(
    noise_seed: int | None, device: torch.device
) -> tuple[torch.Generator | None, torch.Generator | None]:
    """(Poisson sampling generator on the CPU, noise generator on ``device``), seeded
    through ``derive_seed("poisson" | "noise", noise_seed)`` (reproducible research).

    Raises:
        ValueError: for ``noise_seed=None``: Opacus's engine draws noise from a
            ``torch.Generator`` (Mersenne Twister), never from a CSPRNG, so a run through it
            cannot be secure; use :data:`ALM_TRAINING`.
    """
    if noise_seed is None:
        raise ValueError(
            "noise_seed=None is invalid with Opacus's own engine: its noise comes from a "
            "torch.Generator, not a CSPRNG; train through ALM_TRAINING for secure noise"
        )
    poisson = torch.Generator().manual_seed(derive_seed("poisson", noise_seed))
    return poisson, torch.Generator(device=device).manual_seed(derive_seed("noise", noise_seed))


def alm_engine(accountant: str, *, seeded: bool) -> PrivateEngine:
    """``alm_opacus.training.PrivacyEngine`` with ``accountant``; in secure mode unless the run
    is seeded (secure mode refuses seeded generators, as Opacus's does)."""
    return training.PrivacyEngine(accountant=accountant, secure_mode=not seeded)


def alm_generators(
    noise_seed: int | None, device: torch.device
) -> tuple[torch.Generator | None, torch.Generator | None]:
    """Seeded: :func:`opacus_generators`' (reproducible research); secure: none, so that the
    engine draws batches and noise from its ``SecureGenerator``."""
    if noise_seed is None:
        return None, None
    return opacus_generators(noise_seed, device)


@dataclass(frozen=True)
class TrainingBackend:
    """Which privacy engine trains, and where its randomness comes from.

    Attributes:
        engine: makes the engine for an accountant.
        generators: the generators given to the loader and ``make_private``.
        secure_note: what the statement says of a run without a noise seed.
    """

    engine: EngineFactory
    generators: GeneratorFactory
    secure_note: str

    def noise_note(self, *, seeded: bool) -> str:
        """The statement's note on where a run's randomness came from."""
        return SEEDED_NOTE if seeded else self.secure_note


#: Opacus's own engine, seeded runs only (comparisons with Opacus).
OPACUS = TrainingBackend(
    engine=opacus_engine, generators=opacus_generators, secure_note=SECURE_NOTE
)

#: ``alm_opacus.training``'s engine: exact steps, secure by default, seeded on request.
ALM_TRAINING = TrainingBackend(
    engine=alm_engine, generators=alm_generators, secure_note=SECURE_NOTE
)


@dataclass(frozen=True)
class OpacusTraining:
    """What :func:`run_opacus` returns.

    Attributes:
        module: the model, trained in place (not Opacus's wrapper).
        history: the engine accountant's Gaussian ``(noise_multiplier, sample_rate, steps)``
            entries.
        noise_multiplier: sigma as the optimizer used it.
        seconds: wall time of the training.
        noise_steps: the ``alm_pld`` accountant's logistic or Laplace steps.
        mechanism: the noise the optimizer drew (its ``noise_mechanism``; Opacus's own
            optimizer has none and draws Gaussian noise).
        clipping_norm: the norm it clipped in (``"l1"`` or ``"l2"``).
        noise_dim: the coordinates it noised per step.
        optimizer: its class name.
        grid: γ of its exact steps (``None``: floating-point steps).
        noise_sensitivity: Δ' its noise scale was the noise multiplier times (the clip for
            floating-point steps).
    """

    module: nn.Module
    history: tuple[tuple[float, float, int], ...]
    noise_multiplier: float
    seconds: float
    noise_steps: tuple[NoiseStep, ...] = ()
    mechanism: str = GAUSSIAN
    clipping_norm: str = "l2"
    noise_dim: int | None = None
    optimizer: str = ""
    grid: float | None = None
    noise_sensitivity: float | None = None


def run_opacus(
    x: Tensor,
    y: Tensor,
    *,
    model: nn.Module,
    config: DPSGDConfig,
    noise_multiplier: float,
    accountant: str,
    noise_seed: int | None,
    backend: TrainingBackend = ALM_TRAINING,
    private_kwargs: Mapping[str, Any] | None = None,
) -> OpacusTraining:
    """The Opacus training loop: ``model`` (trained in place) on inputs ``x``, labels ``y``.

    Poisson sampling at ``1 / ceil(n / batch_size)``, flat clipping to ``max_grad_norm``,
    noise of scale ``sigma C`` on the clipped sum (Opacus's engine: Gaussian; the noise
    mechanism and its clipping norm are the engine's, e.g. ``alm_opacus.training``'s with
    ``private_kwargs={"noise_mechanism": "alm"}``), plain SGD, ``epochs`` passes of the
    loader. ``noise_multiplier`` is used as given (see :func:`fit_private` for the
    calibration; tests pass 0 to compare with the batched re-implementation).

    Args:
        x, y: inputs and labels.
        model: the module to train.
        config: the recipe.
        noise_multiplier: sigma.
        accountant: the engine's accountant.
        noise_seed: seeds the randomness (reproducible); ``None``: the backend's secure source.
        backend: the engine and its generators.
        private_kwargs: extra arguments of ``make_private`` (e.g. a noise mechanism).
    """
    poisson, noise = backend.generators(noise_seed, x.device)
    loader = DataLoader(
        _Rows(x, y), batch_size=config.batch_size, generator=poisson, collate_fn=_as_batch
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=config.lr)
    private_engine = backend.engine(accountant, seeded=noise_seed is not None)
    start = time.perf_counter()
    with quiet_opacus(), single_thread():
        private, dp_opt, dp_loader = private_engine.make_private(
            module=model,
            optimizer=optimizer,
            data_loader=loader,
            noise_multiplier=noise_multiplier,
            max_grad_norm=config.max_grad_norm,
            poisson_sampling=True,
            noise_generator=noise,
            **dict(private_kwargs or {}),
        )
        private.train()
        for _ in range(config.epochs):
            for xb, yb in dp_loader:
                dp_opt.zero_grad(set_to_none=True)
                F.cross_entropy(private(xb), yb).backward()
                dp_opt.step()
    seconds = time.perf_counter() - start
    acc = private_engine.accountant
    history = tuple((float(s), float(q), int(t)) for s, q, t in acc.history)
    noise_steps = tuple(
        (
            str(e["mechanism"]),
            float(e["noise_multiplier"]),
            float(e["sample_rate"]),
            int(e["num_steps"]),
            e["dim"],
        )
        for e in getattr(acc, "noise_steps", ())
    )
    return OpacusTraining(
        module=model,
        history=history,
        noise_multiplier=float(dp_opt.noise_multiplier),
        seconds=seconds,
        noise_steps=noise_steps,
        # Opacus's DPOptimizer has none of these attributes: it clips in L2, adds Gaussian noise
        mechanism=str(getattr(dp_opt, "noise_mechanism", GAUSSIAN)),
        clipping_norm=str(getattr(dp_opt, "clipping_norm", "l2")),
        noise_dim=getattr(dp_opt, "noise_dim", None),
        optimizer=type(dp_opt).__name__,
        grid=None if getattr(dp_opt, "noise_grid", None) is None else dp_opt.noise_grid.gamma,
        noise_sensitivity=getattr(dp_opt, "noise_sensitivity", None),
    )


class _Rows(TensorDataset):
    """A `TensorDataset` that hands a batch's rows over in one indexing (``__getitems__``,
    which torch's fetcher calls with the sampler's list of indices) instead of one
    ``__getitem__`` and a stack per row: the same rows in the same order, and at a Poisson
    batch of 256 the per-row calls had cost more than the step itself. An empty batch is
    ``(0, ...)`` tensors of the right shapes. Paired with `_as_batch`."""

    def __getitems__(self, indices: list[int]) -> list[Tensor]:
        index = torch.as_tensor(indices, dtype=torch.long)
        return [t[index] for t in self.tensors]


def _as_batch(batch: list[Tensor]) -> list[Tensor]:
    """The collate function of `_Rows`: its batch is collated already."""
    return batch


@dataclass(kw_only=True)
class OpacusRun:
    """The accounting of one DP-SGD training run through Opacus.

    Attributes:
        noise_multiplier: sigma.
        sample_rate: Poisson sampling probability q.
        steps: optimizer steps taken (= accountant steps).
        epsilon_spent: the accountant's epsilon at ``delta`` after training (<= target).
        accountant: the accountant's name.
        from_cache: whether sigma was known already (the run's or the folder's cache).
        seeded: whether the run's randomness came from a seed (reproducible research).
        noise_note: what the statement says of where the randomness came from.
        seconds: wall time, split into ``calibration`` (sigma), ``training`` and
            ``accounting``.
        mechanism: the per-step noise (``gaussian``, ``alm``, ``laplace``).
        clipping_norm: the norm of the per-example clipping (``l2``; ``l1`` for ``alm`` and
            ``laplace``).
        noise_dim: noised coordinates per step (``None``: not recorded, Opacus's optimizer).
        optimizer: the class of the optimizer that ran.
        grid: γ of exact steps (``None``: floating-point steps).
        noise_sensitivity: Δ', the sensitivity the step noise was scaled to (``None``: the
            clip, as for floating-point steps).
    """

    noise_multiplier: float
    sample_rate: float
    steps: int
    epsilon_spent: float
    accountant: str
    from_cache: bool
    seeded: bool
    noise_note: str
    seconds: dict[str, float] = field(default_factory=dict)
    mechanism: str = GAUSSIAN
    clipping_norm: str = "l2"
    noise_dim: int | None = None
    optimizer: str = ""
    grid: float | None = None
    noise_sensitivity: float | None = None

    def training(self, *, clip_norm: float) -> TrainingNoise:
        """The release's ``training`` record (the run's noise, clipping to ``clip_norm``)."""
        return TrainingNoise(
            noise_multiplier=self.noise_multiplier,
            clip_norm=clip_norm,
            sample_rate=self.sample_rate,
            steps=self.steps,
            accountant=self.accountant,
            epsilon_spent=self.epsilon_spent,
            clip_norm_kind=self.clipping_norm,
            mechanism=self.mechanism,
        )

    def noise_std(self, *, clip_norm: float) -> float:
        """Standard deviation of one noise coordinate per step, the mechanism's at scale
        ``sigma * Δ'`` (Δ' the rounded sensitivity of exact steps, else ``clip_norm``;
        Gaussian: sigma Δ'; logistic: sigma Δ' pi / sqrt(3); Laplace: sigma Δ' sqrt(2))."""
        scale = self.noise_multiplier * (self.noise_sensitivity or clip_norm)
        return training_mechanism(self.mechanism).std(scale) if scale > 0 else 0.0

    def to_info(self) -> dict[str, Any]:
        """JSON-able diagnostics (for ``Release.info``)."""
        return {
            "noise_multiplier": self.noise_multiplier,
            "sample_rate": self.sample_rate,
            "steps": self.steps,
            "accountant": self.accountant,
            "epsilon_spent": self.epsilon_spent,
            "sigma_cached": self.from_cache,
            "noise_mechanism": self.mechanism,
            "clipping_norm": self.clipping_norm,
            "noise_dim": self.noise_dim,
            "optimizer": self.optimizer,
            "grid": self.grid,
            "noise_sensitivity": self.noise_sensitivity,
            "seconds": dict(self.seconds),
        }


def fit_private(
    x: Tensor,
    y: Tensor,
    *,
    model: nn.Module,
    config: DPSGDConfig,
    epsilon: float,
    delta: float,
    accountant: str,
    noise_seed: int | None,
    sigmas: SigmaCache | None = None,
    backend: TrainingBackend = ALM_TRAINING,
    mechanism: str = GAUSSIAN,
) -> OpacusRun:
    """Calibrate sigma for (epsilon, delta), train ``model`` in place, check the accountant.

    sigma is the accountant's search for the loader's sample rate and the steps it runs
    (Gaussian: Opacus's, the value ``make_private_with_epsilon`` finds; logistic and Laplace:
    ``alm_pld``'s for the model's trainable coordinates), taken from ``sigmas`` when known.

    Args:
        mechanism: the per-step noise; other than ``"gaussian"`` it goes to ``make_private``
            as ``noise_mechanism`` (the backend's engine must take it, e.g.
            ``alm_opacus.training``'s) and needs ``accountant="alm_pld"``.

    Raises:
        ValueError: on bad budgets, an unknown accountant or mechanism.
        RuntimeError: if the accountant reports more than ``epsilon``, or the optimizer drew
            other noise than ``mechanism`` (never released).
    """
    epsilon = check_epsilon(epsilon)
    delta = check_delta(delta, allow_zero=False)
    accountant = check_accountant(accountant)
    cache = sigmas if sigmas is not None else SigmaCache()
    start = time.perf_counter()
    mechanism = training_mechanism(mechanism).name
    sigma, known = calibrated_sigma(
        n=len(y),
        config=config,
        epsilon=epsilon,
        delta=delta,
        accountant=accountant,
        mechanism=mechanism,
        # The noised coordinates, as the optimizer's hook records them (its noise_dim).
        dim=sum(p.numel() for p in model.parameters() if p.requires_grad),
        sigmas=cache,
    )
    calibration = time.perf_counter() - start
    run = run_opacus(
        x,
        y,
        model=model,
        config=config,
        noise_multiplier=sigma,
        accountant=accountant,
        noise_seed=noise_seed,
        backend=backend,
        # Opacus's make_private swallows unknown keywords: the mechanism is checked below.
        private_kwargs=None if mechanism == GAUSSIAN else {"noise_mechanism": mechanism},
    )
    if run.mechanism != mechanism:
        raise RuntimeError(
            f"the optimizer {run.optimizer} drew {run.mechanism!r} noise, expected "
            f"{mechanism!r}: the backend's engine does not take noise_mechanism; refusing to "
            "release"
        )
    start = time.perf_counter()
    spent, steps = checked_epsilon(
        run.history,
        epsilon=epsilon,
        delta=delta,
        accountant=accountant,
        cache=cache,
        noise_steps=run.noise_steps,
    )
    rates = [h[1] for h in run.history] + [s[2] for s in run.noise_steps]
    return OpacusRun(
        noise_multiplier=run.noise_multiplier,
        sample_rate=float(rates[0]),
        steps=steps,
        epsilon_spent=spent,
        accountant=accountant,
        from_cache=known,
        seeded=noise_seed is not None,
        noise_note=backend.noise_note(seeded=noise_seed is not None),
        seconds={
            "calibration": calibration,
            "training": run.seconds,
            "accounting": time.perf_counter() - start,
        },
        mechanism=run.mechanism,
        clipping_norm=run.clipping_norm,
        noise_dim=run.noise_dim,
        optimizer=run.optimizer,
        grid=run.grid,
        noise_sensitivity=run.noise_sensitivity,
    )
