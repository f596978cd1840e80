"""The Opacus training loop: one DP-SGD run of a model on member inputs, and its accounting.

Structure (so that the engine can be swapped, e.g. for ``alm_opacus.training``'s):

* a :class:`TrainingBackend` names the privacy engine factory (``accountant ->`` an engine
  with Opacus's ``make_private(module=, optimizer=, data_loader=, noise_multiplier=,
  max_grad_norm=, poisson_sampling=True, noise_generator=)``), the generators it is given
  (``(noise_seed, device) -> (Poisson generator, noise generator)``, ``None`` letting the
  engine draw its own), and what the statement says of secure runs; :data:`OPACUS` is
  Opacus's engine with generators seeded from OS entropy;
* :func:`run_opacus` trains and returns an :class:`OpacusTraining`;
* :func:`fit_private` calibrates sigma (:class:`~baselines.dpsgd.accounting.SigmaCache`),
  trains, checks the accountant's epsilon and returns an :class:`OpacusRun`.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
from opacus import PrivacyEngine
from torch import Tensor, nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset

from alm_opacus._hashing import derive_seed
from alm_opacus._validation import check_delta, check_epsilon, check_features_labels
from alm_opacus.heads import Head, HeadConfig, Params, clip_features, linear_init
from alm_opacus.methods import TrainingNoise
from baselines._common import single_thread
from baselines.dpsgd.accounting import SigmaCache, checked_epsilon, quiet_opacus
from baselines.dpsgd.config import (
    DEFAULT_ACCOUNTANT,
    DPSGDConfig,
    check_accountant,
    sample_rate_for,
)

__all__ = [
    "OPACUS",
    "SECURE_NOTE",
    "SEEDED_NOTE",
    "DPSGDRun",
    "EngineFactory",
    "GeneratorFactory",
    "HeadNet",
    "OpacusRun",
    "OpacusTraining",
    "TrainingBackend",
    "fit_private",
    "init_params",
    "opacus_engine",
    "opacus_generators",
    "run_opacus",
    "train_dpsgd_head",
]

#: What the statement says of secure runs through Opacus's own engine.
SECURE_NOTE = (
    "Poisson sampling and gradient noise: torch generators seeded from OS entropy and "
    "discarded; the stream is torch's generator, not a CSPRNG"
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


#: ``factory(accountant name) -> engine``.
EngineFactory = Callable[[str], PrivateEngine]
#: ``factory(noise_seed, device) -> (Poisson sampling generator, noise generator)``.
GeneratorFactory = Callable[
    [int | None, torch.device], tuple[torch.Generator | None, torch.Generator | None]
]


def opacus_engine(accountant: str) -> PrivateEngine:
    """Opacus's own engine with ``accountant`` (``secure_mode`` off: it needs torchcsprng)."""
    with quiet_opacus():
        return PrivacyEngine(accountant=accountant)


def opacus_generators(
    noise_seed: int | None, device: torch.device
) -> tuple[torch.Generator | None, torch.Generator | None]:
    """(Poisson sampling generator on the CPU, noise generator on ``device``).

    Args:
        noise_seed: seeds both through ``derive_seed("poisson" | "noise", noise_seed)``
            (reproducible); ``None``: each is seeded from ``secrets.randbits(63)`` and the seed
            is not kept (see :data:`SECURE_NOTE`).
        device: the noise generator's device.
    """
    seeds = (
        (secrets.randbits(63), secrets.randbits(63))
        if noise_seed is None
        else (derive_seed("poisson", noise_seed), derive_seed("noise", noise_seed))
    )
    poisson = torch.Generator().manual_seed(seeds[0])
    return poisson, torch.Generator(device=device).manual_seed(seeds[1])


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


#: Opacus's engine, generators seeded from OS entropy (secure) or from the labels (seeded).
OPACUS = TrainingBackend(
    engine=opacus_engine, generators=opacus_generators, secure_note=SECURE_NOTE
)


@dataclass(frozen=True)
class OpacusTraining:
    """What :func:`run_opacus` returns.

    Attributes:
        module: the model, trained in place (not Opacus's wrapper).
        history: the engine accountant's ``(noise_multiplier, sample_rate, steps)`` entries.
        noise_multiplier: sigma as the optimizer used it.
        seconds: wall time of the training.
    """

    module: nn.Module
    history: tuple[tuple[float, float, int], ...]
    noise_multiplier: float
    seconds: float


def run_opacus(
    x: Tensor,
    y: Tensor,
    *,
    model: nn.Module,
    config: DPSGDConfig,
    noise_multiplier: float,
    accountant: str,
    noise_seed: int | None,
    backend: TrainingBackend = OPACUS,
    private_kwargs: Mapping[str, Any] | None = None,
) -> OpacusTraining:
    """The Opacus training loop: ``model`` (trained in place) on inputs ``x``, labels ``y``.

    Poisson sampling at ``1 / ceil(n / batch_size)``, flat clipping to ``max_grad_norm``,
    Gaussian noise ``N(0, (sigma C)^2)`` on the clipped sum, plain SGD, ``epochs`` passes of
    the loader. ``noise_multiplier`` is used as given (see :func:`fit_private` for the
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
    loader = DataLoader(TensorDataset(x, y), batch_size=config.batch_size, generator=poisson)
    optimizer = torch.optim.SGD(model.parameters(), lr=config.lr)
    private_engine = backend.engine(accountant)
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
    history = tuple((float(s), float(q), int(t)) for s, q, t in private_engine.accountant.history)
    return OpacusTraining(
        module=model,
        history=history,
        noise_multiplier=float(dp_opt.noise_multiplier),
        seconds=time.perf_counter() - start,
    )


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

    def training(self, *, clip_norm: float) -> TrainingNoise:
        """The release's ``training`` record (Gaussian noise, L2 clipping to ``clip_norm``)."""
        return TrainingNoise(
            noise_multiplier=self.noise_multiplier,
            clip_norm=clip_norm,
            sample_rate=self.sample_rate,
            steps=self.steps,
            accountant=self.accountant,
            epsilon_spent=self.epsilon_spent,
        )

    def to_info(self) -> dict[str, Any]:
        """JSON-able diagnostics (for ``Release.info``)."""
        return {
            "noise_multiplier": self.noise_multiplier,
            "sample_rate": self.sample_rate,
            "steps": self.steps,
            "accountant": self.accountant,
            "epsilon_spent": self.epsilon_spent,
            "sigma_cached": self.from_cache,
            "seconds": dict(self.seconds),
        }


@dataclass(kw_only=True)
class DPSGDRun(OpacusRun):
    """One DP-SGD head training run: the trained head (``alm_opacus.heads.Head``)."""

    head: Head


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
    backend: TrainingBackend = OPACUS,
) -> OpacusRun:
    """Calibrate sigma for (epsilon, delta), train ``model`` in place, check the accountant.

    sigma is Opacus's own search for the loader's sample rate and the steps it runs (the
    value ``make_private_with_epsilon`` finds), taken from ``sigmas`` when known.

    Raises:
        ValueError: on bad budgets or an unknown accountant.
        RuntimeError: if the accountant reports more than ``epsilon`` (never released).
    """
    epsilon = check_epsilon(epsilon)
    delta = check_delta(delta, allow_zero=False)
    accountant = check_accountant(accountant)
    cache = sigmas if sigmas is not None else SigmaCache()
    start = time.perf_counter()
    q = sample_rate_for(n=len(y), batch_size=config.batch_size)
    sigma, known = cache.noise_multiplier(
        epsilon=epsilon, delta=delta, sample_rate=q, epochs=config.epochs, accountant=accountant
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
    )
    start = time.perf_counter()
    spent, steps = checked_epsilon(
        run.history, epsilon=epsilon, delta=delta, accountant=accountant, cache=cache
    )
    return OpacusRun(
        noise_multiplier=run.noise_multiplier,
        sample_rate=float(run.history[0][1]),
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
    )


class HeadNet(nn.Module):
    """The head as plain ``nn.Linear`` calls (Opacus hooks them), with ``Head``'s names."""

    fc: nn.Linear
    fc1: nn.Linear
    fc2: nn.Linear

    def __init__(self, params: Params, kind: str) -> None:
        super().__init__()
        self.kind = kind
        for name in sorted({k.split(".")[0] for k in params}):
            weight = params[f"{name}.weight"]
            layer = nn.Linear(weight.shape[1], weight.shape[0], dtype=weight.dtype)
            with torch.no_grad():
                layer.weight.copy_(weight)
                layer.bias.copy_(params[f"{name}.bias"])
            setattr(self, name, layer)

    def forward(self, x: Tensor) -> Tensor:
        if self.kind == "linear":
            out: Tensor = self.fc(x)
            return out
        out = self.fc2(torch.relu(self.fc1(x)))
        return out


def init_params(*, d: int, num_classes: int, head: HeadConfig, seed: int) -> Params:
    """The head's initialisation (``alm_opacus.heads.linear_init``), from a seeded generator."""
    sizes = (
        {"fc": (num_classes, d)}
        if head.kind == "linear"
        else {"fc1": (head.hidden, d), "fc2": (num_classes, head.hidden)}
    )
    return linear_init(sizes, generator=torch.Generator().manual_seed(seed), dtype=head.torch_dtype)


def train_dpsgd_head(
    features: Tensor,
    labels: Tensor,
    *,
    num_classes: int,
    head: HeadConfig,
    config: DPSGDConfig,
    epsilon: float,
    delta: float,
    accountant: str = DEFAULT_ACCOUNTANT,
    seed: int,
    noise_seed: int | None,
    device: str = "cpu",
    sigmas: SigmaCache | None = None,
    backend: TrainingBackend = OPACUS,
) -> DPSGDRun:
    """Train one head with DP-SGD through Opacus, at (epsilon, delta).

    Args:
        features: (n, d) features; clipped to ``head.clip_radius`` first (per example).
        labels: (n,) labels.
        num_classes: ``C``.
        head: the architecture (``kind``, ``hidden``, ``dtype``, ``clip_radius``); its
            ``steps``, ``lr`` and ``l2`` are not used.
        config: the DP-SGD recipe.
        epsilon: target epsilon > 0.
        delta: target delta in (0, 1).
        accountant: ``"alm_pld"``, ``"prv"`` or ``"rdp"``.
        seed: seeds the initialisation.
        noise_seed: seeds Poisson sampling and the gradient noise; ``None``: the backend's
            secure source (Opacus's: generators seeded from OS entropy, not kept).
        device: torch device.
        sigmas: the run's noise multipliers (default: a fresh cache).
        backend: the engine and its generators (default: Opacus's).

    Returns:
        The run; ``epsilon_spent <= epsilon``.

    Raises:
        ValueError: on bad budgets, an unknown accountant or mismatched shapes.
        RuntimeError: if the accountant reports more than ``epsilon`` after training
            (never released).
    """
    check_epsilon(epsilon)
    check_delta(delta, allow_zero=False)
    check_accountant(accountant)
    check_features_labels(features, labels)
    d = int(features.shape[1])
    x = clip_features(features.to(device=device, dtype=head.torch_dtype), head.clip_radius)
    model = HeadNet(init_params(d=d, num_classes=num_classes, head=head, seed=seed), head.kind)
    run = fit_private(
        x,
        labels.to(device=device, dtype=torch.long),
        model=model,
        config=config,
        epsilon=epsilon,
        delta=delta,
        accountant=accountant,
        noise_seed=noise_seed,
        sigmas=sigmas,
        backend=backend,
    )
    released = Head(in_features=d, num_classes=num_classes, config=head).to(device)
    released.load_state_dict({k: v.detach().clone() for k, v in model.state_dict().items()})
    return DPSGDRun(head=released, **vars(run))
