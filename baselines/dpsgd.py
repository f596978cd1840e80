"""``dpsgd``: DP-SGD (Abadi et al. 2016, Algorithm 1) on the head, through Opacus.

Each (epsilon, noise draw) is one independent DP-SGD run on the frozen features, seeded by
(seed, draw, epsilon): Poisson sampling, per-example clipping to ``max_grad_norm``, Gaussian
noise of standard deviation ``noise_multiplier * max_grad_norm``. The noise multiplier comes
from ``PrivacyEngine.make_private_with_epsilon`` with the chosen accountant (``alm_pld`` by
default, ``prv`` or ``rdp``); it depends only on (epsilon, delta, sample rate, epochs,
accountant), so it is computed once per key in this process (and saved under the run's
cache folder) and reused.

After training, the accountant's epsilon at delta is checked to be at most the target;
the release states (target epsilon, delta)-DP under add/remove-one adjacency.
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import opacus
import torch
from opacus import PrivacyEngine
from opacus.accountants import create_accountant
from opacus.accountants.utils import get_noise_multiplier
from torch import Tensor, nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset

import alm_opacus  # noqa: F401  (registers the "alm_pld" accountant into Opacus)
from alm_opacus._validation import check_delta, check_epsilon, check_positive
from alm_opacus.heads import Head, HeadConfig, Params, clip_features
from alm_opacus.io import atomic_write_json
from alm_opacus.methods import (
    Method,
    MethodContext,
    Predict,
    Release,
    ShadowTrainer,
    plain_shadow_trainer,
    register_method,
)
from alm_opacus.protect import PrivacyStatement, SensitivityInfo
from baselines._common import (
    TUNING_DRAWS,
    PublicSplit,
    TuningResult,
    accuracy_of,
    derive_seed,
    option,
    public_split,
    select_config,
    untuned,
)

__all__ = [
    "ACCOUNTANTS",
    "DATASET_SCHEDULES",
    "TUNING_GRID",
    "DPSGDConfig",
    "DPSGDMethod",
    "DPSGDRun",
    "OpacusFit",
    "OpacusRun",
    "accountant_epsilon",
    "cached_noise_multiplier",
    "checked_epsilon",
    "default_delta",
    "default_schedule",
    "dpsgd_linear_heads",
    "run_opacus",
    "single_thread",
    "train_dpsgd_head",
]

#: Accountants selectable with ``options["accountant"]``.
ACCOUNTANTS = ("prv", "rdp", "alm_pld")
# alm_pld (dp_accounting PLD, pessimistic) agrees with Opacus's prv within 1% and finds a
# noise multiplier ~10x faster, which keeps the default digits run inside its time budget.
DEFAULT_ACCOUNTANT = "alm_pld"


@dataclass(frozen=True)
class DPSGDConfig:
    """One DP-SGD recipe.

    Attributes:
        lr: SGD learning rate (no momentum).
        max_grad_norm: per-example clipping norm ``C``.
        epochs: passes over the data; steps = epochs / sample rate.
        batch_size: expected batch size; the sample rate is ``1 / ceil(n / batch_size)``,
            as Opacus derives it from the data loader's length.
    """

    lr: float = 4.0
    max_grad_norm: float = 1.0
    epochs: int = 30
    batch_size: int = 75

    def __post_init__(self) -> None:
        check_positive(self.lr, name="lr")
        check_positive(self.max_grad_norm, name="max_grad_norm")
        for name in ("epochs", "batch_size"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name}={value!r} is invalid: expected an integer >= 1")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


#: Schedules (epochs, expected batch size) per dataset; ``default_schedule`` covers others.
#: Few steps keep the noise multiplier low at small n: digits runs 60 steps at q = 1/2.
DATASET_SCHEDULES: dict[str, tuple[int, int]] = {
    "digits": (30, 75),
    "cifar10": (20, 256),
    "cifar100": (20, 256),
    "stl10": (20, 256),
}

#: The configurations tuned at each epsilon (lr x clip), on public data only. Linear heads on
#: unit-norm features have per-example gradient norms <= 2, so clips of 0.5 and 1 bracket it.
TUNING_GRID: tuple[dict[str, float], ...] = (
    {"lr": 1.0, "max_grad_norm": 0.5},
    {"lr": 1.0, "max_grad_norm": 1.0},
    {"lr": 4.0, "max_grad_norm": 0.5},
    {"lr": 4.0, "max_grad_norm": 1.0},
)


def default_schedule(*, n: int, dataset: str | None = None) -> tuple[int, int]:
    """(epochs, expected batch size): the dataset's entry, else by member count ``n``."""
    if dataset is not None and dataset in DATASET_SCHEDULES:
        return DATASET_SCHEDULES[dataset]
    return (30 if n < 1000 else 20), max(1, min(256, n // 2))


def default_delta(n: int) -> float:
    """The harness's default delta: ``min(1e-5, 1 / (10 n))`` for ``n`` members."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"n={n!r} is invalid: expected an integer >= 1")
    return min(1e-5, 1.0 / (10 * n))


def check_accountant(name: str) -> str:
    if name not in ACCOUNTANTS:
        raise ValueError(f"accountant={name!r} is invalid: expected one of {ACCOUNTANTS}")
    return name


def sample_rate_for(*, n: int, batch_size: int) -> float:
    """Opacus's sample rate, ``1 / len(data_loader)`` for a loader without ``drop_last``."""
    return 1.0 / math.ceil(n / batch_size)


def steps_per_epoch(sample_rate: float) -> int:
    """Batches per epoch of Opacus's Poisson loader (``UniformWithReplacementSampler``)."""
    return int(1 / sample_rate)


_SIGMAS: dict[tuple[float, float, float, int, str], float] = {}
_SPENT: dict[tuple[Any, ...], float] = {}
SIGMA_CACHE_FILE = "dpsgd_noise_multipliers.json"


def load_sigma_cache(cache_dir: str | Path | None) -> int:
    """Load noise multipliers saved by earlier runs with this Opacus version.

    Sigma is a deterministic function of (epsilon, delta, sample rate, epochs, accountant)
    and the Opacus version, so reuse changes nothing; each run still checks the
    accountant's epsilon after training. Returns the number of entries loaded.
    """
    if cache_dir is None:
        return 0
    path = Path(cache_dir) / SIGMA_CACHE_FILE
    try:
        entries = json.loads(path.read_text())
    except (OSError, ValueError):
        return 0
    loaded = 0
    for e in entries if isinstance(entries, list) else []:
        if isinstance(e, dict) and e.get("opacus") == opacus.__version__:
            try:
                key = (
                    float(e["epsilon"]),
                    float(e["delta"]),
                    float(e["sample_rate"]),
                    int(e["epochs"]),
                    str(e["accountant"]),
                )
                _SIGMAS.setdefault(key, float(e["noise_multiplier"]))
                loaded += 1
            except (KeyError, TypeError, ValueError):
                continue
    return loaded


def save_sigma_cache(cache_dir: str | Path | None) -> None:
    """Write this process's noise multipliers (merged with the file's) atomically."""
    if cache_dir is None:
        return
    load_sigma_cache(cache_dir)
    entries = [
        {
            "opacus": opacus.__version__,
            "epsilon": k[0],
            "delta": k[1],
            "sample_rate": k[2],
            "epochs": k[3],
            "accountant": k[4],
            "noise_multiplier": v,
        }
        for k, v in sorted(_SIGMAS.items())
    ]
    try:
        Path(cache_dir).mkdir(parents=True, exist_ok=True)
        atomic_write_json(Path(cache_dir) / SIGMA_CACHE_FILE, entries)
    except OSError:  # a read-only cache only costs time
        pass


@contextmanager
def _quiet_opacus() -> Iterator[None]:
    # secure_mode=False is deliberate (seeded draws), and stated in the release's notes.
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*[Ss]ecure RNG turned off.*")
        warnings.filterwarnings(
            "ignore", message=".*[Oo]ptimal order is the (largest|smallest) alpha.*"
        )
        warnings.filterwarnings("ignore", message=".*Using a non-full backward hook.*")
        warnings.filterwarnings("ignore", message=".*Full backward hook is firing.*")
        yield


@contextmanager
def single_thread() -> Iterator[None]:
    """Run tiny-tensor loops on one intra-op thread, then restore the setting.

    A linear head's DP-SGD step is microseconds of arithmetic; with two threads on a shared
    two-core machine, thread hand-offs made 60 steps take 3-6 s instead of 0.15 s.
    """
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(old)


def cached_noise_multiplier(
    *, epsilon: float, delta: float, sample_rate: float, epochs: int, accountant: str
) -> float | None:
    """The cached noise multiplier for this key, or None if not yet computed here."""
    return _SIGMAS.get((float(epsilon), float(delta), float(sample_rate), int(epochs), accountant))


class _Net(nn.Module):
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


def _init_params(*, d: int, num_classes: int, head: HeadConfig, seed: int) -> Params:
    # nn.Linear's default law, U(-1/sqrt(fan_in), 1/sqrt(fan_in)), from a seeded generator.
    g = torch.Generator().manual_seed(seed)
    dt = head.torch_dtype
    shapes = (
        {"fc": (num_classes, d)}
        if head.kind == "linear"
        else {"fc1": (head.hidden, d), "fc2": (num_classes, head.hidden)}
    )
    out: Params = {}
    for name, (rows, cols) in shapes.items():
        bound = 1.0 / math.sqrt(cols)
        out[f"{name}.weight"] = (torch.rand(rows, cols, generator=g, dtype=dt) * 2 - 1) * bound
        out[f"{name}.bias"] = (torch.rand(rows, generator=g, dtype=dt) * 2 - 1) * bound
    return out


@dataclass(kw_only=True)
class OpacusRun:
    """The accounting of one DP-SGD training run through Opacus.

    Attributes:
        noise_multiplier: sigma.
        sample_rate: Poisson sampling probability q.
        steps: optimizer steps taken (= accountant steps).
        epsilon_spent: the accountant's epsilon at ``delta`` after training (<= target).
        accountant: the accountant's name.
        from_cache: whether sigma came from this process's cache.
        seconds: wall time, split into ``calibration`` (sigma), ``training`` and
            ``accounting``.
    """

    noise_multiplier: float
    sample_rate: float
    steps: int
    epsilon_spent: float
    accountant: str
    from_cache: bool
    seconds: dict[str, float] = field(default_factory=dict)


@dataclass(kw_only=True)
class DPSGDRun(OpacusRun):
    """One DP-SGD head training run: the trained head (``alm_opacus.heads.Head``)."""

    head: Head


def run_opacus(
    x: Tensor,
    y: Tensor,
    *,
    model: nn.Module,
    config: DPSGDConfig,
    epsilon: float,
    delta: float,
    accountant: str,
    noise_seed: int,
    noise_multiplier: float | None = None,
) -> tuple[nn.Module, PrivacyEngine, float, bool, dict[str, float]]:
    """The Opacus training loop: ``model`` (trained in place) on inputs ``x``, labels ``y``.

    The noise multiplier comes from ``make_private_with_epsilon`` the first time a key
    (epsilon, delta, sample rate, epochs, accountant) is seen in this process, and from the
    cache afterwards (then through ``make_private``, with the same value). Where Opacus's
    ``int(epochs / q)`` undercounts the ``epochs * int(1 / q)`` steps its loader runs (float
    rounding, e.g. 3 epochs at q = 1/75 account 224 of 225 steps), sigma is searched with
    Opacus's ``get_noise_multiplier`` at the true step count instead. Passing
    ``noise_multiplier`` bypasses all of it (tests compare with the batched re-implementation).

    Returns:
        (trained module, engine, sigma, whether sigma was cached, seconds by phase).
    """
    loader = DataLoader(
        TensorDataset(x, y),
        batch_size=config.batch_size,
        generator=torch.Generator().manual_seed(derive_seed("poisson", noise_seed)),
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=config.lr)
    with _quiet_opacus():
        engine = PrivacyEngine(accountant=accountant)
    noise_gen = torch.Generator(device=x.device).manual_seed(derive_seed("noise", noise_seed))
    key = (float(epsilon), float(delta), 1.0 / len(loader), config.epochs, accountant)
    common: dict[str, Any] = {
        "module": model,
        "optimizer": optimizer,
        "data_loader": loader,
        "max_grad_norm": config.max_grad_norm,
        "poisson_sampling": True,
        "noise_generator": noise_gen,
    }
    start = time.perf_counter()
    q = 1.0 / len(loader)
    cached = noise_multiplier is not None or key in _SIGMAS
    with _quiet_opacus(), single_thread():
        if noise_multiplier is not None:
            private, dp_opt, dp_loader = engine.make_private(
                noise_multiplier=noise_multiplier, **common
            )
        elif cached or not _epochs_match_steps(q, config.epochs):
            sigma = _sigma(
                epsilon=epsilon,
                delta=delta,
                sample_rate=q,
                epochs=config.epochs,
                accountant=accountant,
            )
            private, dp_opt, dp_loader = engine.make_private(noise_multiplier=sigma, **common)
        else:
            private, dp_opt, dp_loader = engine.make_private_with_epsilon(
                target_epsilon=epsilon, target_delta=delta, epochs=config.epochs, **common
            )
            _SIGMAS[key] = float(dp_opt.noise_multiplier)
        calibrated = time.perf_counter()
        private.train()
        for _ in range(config.epochs):
            for xb, yb in dp_loader:
                dp_opt.zero_grad(set_to_none=True)
                F.cross_entropy(private(xb), yb).backward()
                dp_opt.step()
    seconds = {"calibration": calibrated - start, "training": time.perf_counter() - calibrated}
    return model, engine, float(dp_opt.noise_multiplier), cached, seconds


def checked_epsilon(
    engine: PrivacyEngine, *, epsilon: float, delta: float, accountant: str
) -> tuple[float, int]:
    """The accountant's epsilon at ``delta`` after training, and the steps it counted.

    Raises:
        RuntimeError: if it exceeds the target ``epsilon`` (the model is never released).
    """
    history = tuple(tuple(h) for h in engine.accountant.history)
    key = (history, float(delta), accountant)
    if key not in _SPENT:  # deterministic in (history, delta): computed once
        with _quiet_opacus():
            _SPENT[key] = float(engine.get_epsilon(delta))
    spent = _SPENT[key]
    steps = sum(int(h[2]) for h in history)
    if not spent <= epsilon:
        raise RuntimeError(
            f"the {accountant} accountant reports epsilon={spent:.6g} > target {epsilon:g} "
            f"after {steps} steps; refusing to release"
        )
    return spent, steps


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
    noise_seed: int,
    device: str = "cpu",
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
        accountant: ``"prv"``, ``"rdp"`` or ``"alm_pld"``.
        seed: seeds the initialisation.
        noise_seed: seeds Poisson sampling and the gradient noise.
        device: torch device.

    Returns:
        The run; ``epsilon_spent <= epsilon``.

    Raises:
        ValueError: on bad budgets, an unknown accountant or mismatched shapes.
        RuntimeError: if the accountant reports more than ``epsilon`` after training
            (never released).
    """
    epsilon = check_epsilon(epsilon)
    delta = check_delta(delta, allow_zero=False)
    accountant = check_accountant(accountant)
    if features.ndim != 2 or labels.shape != (features.shape[0],):
        raise ValueError(
            f"features (n, d) and labels (n,) expected; got {tuple(features.shape)} "
            f"and {tuple(labels.shape)}"
        )
    d = int(features.shape[1])
    x = clip_features(features.to(device=device, dtype=head.torch_dtype), head.clip_radius)
    init = _init_params(d=d, num_classes=num_classes, head=head, seed=seed)
    model, engine, sigma, cached, seconds = run_opacus(
        x,
        labels.to(device=device, dtype=torch.long),
        model=_Net(init, head.kind),
        config=config,
        epsilon=epsilon,
        delta=delta,
        accountant=accountant,
        noise_seed=noise_seed,
    )
    start = time.perf_counter()
    spent, steps = checked_epsilon(engine, epsilon=epsilon, delta=delta, accountant=accountant)
    seconds["accounting"] = time.perf_counter() - start
    params = {k: v.detach().clone() for k, v in model.state_dict().items()}
    released = Head(in_features=d, num_classes=num_classes, config=head).to(device)
    released.load_state_dict(params)
    return DPSGDRun(
        head=released,
        noise_multiplier=sigma,
        sample_rate=float(engine.accountant.history[0][1]),
        steps=steps,
        epsilon_spent=spent,
        accountant=accountant,
        from_cache=cached,
        seconds=seconds,
    )


def dpsgd_linear_heads(
    features: Tensor,
    labels: Tensor,
    *,
    masks: Tensor,
    num_classes: int,
    head: HeadConfig,
    config: DPSGDConfig,
    sigma: float,
    seed: int,
    sample_rate: float | None = None,
) -> Params:
    """DP-SGD on ``B = len(masks)`` linear heads at once: Opacus's algorithm, batched.

    Head ``b`` trains on the rows where ``masks[b]`` holds, exactly as
    :func:`train_dpsgd_head` would: the same initialisation law, Poisson sampling at
    ``1 / ceil(n_b / batch_size)``, flat clipping with Opacus's factor
    ``min(1, C / (||g_i|| + 1e-6))``, noise ``N(0, (sigma C)^2)`` on the clipped sum, and
    division by Opacus's expected batch size ``int(n_b q)``. For a linear head the
    per-example gradient is the rank-one ``(p_i - e_{y_i}) x~_i^T``, so its norm is
    ``||p_i - e_{y_i}|| ||x~_i||`` and no per-example tensor is formed. Used for the
    adaptive attacker's shadow heads (cheap), not for the victim (which runs Opacus).

    Args:
        features: (n, d).
        labels: (n,).
        masks: (B, n) boolean; all rows must select the same number ``n_b`` of examples.
        num_classes: ``C``.
        head: must have ``kind="linear"``.
        config: the recipe.
        sigma: the noise multiplier.
        seed: seeds initialisation (shared), Poisson sampling and noise.
        sample_rate: Poisson rate q; default ``1 / ceil(n_b / batch_size)`` as Opacus derives
            it. Steps are ``epochs * int(1 / q)``.

    Returns:
        ``{"fc.weight": (B, C, d), "fc.bias": (B, C)}``.

    Raises:
        ValueError: for a non-linear head or masks of unequal sizes.
    """
    if head.kind != "linear":
        raise ValueError(f"head.kind={head.kind!r}: the batched DP-SGD supports 'linear' only")
    sizes = masks.sum(1)
    if (
        masks.ndim != 2
        or masks.shape[1] != features.shape[0]
        or not bool((sizes == sizes[0]).all())
    ):
        raise ValueError("masks must be (B, n) with the same number of rows selected in each")
    n_b = int(sizes[0])
    n_heads, (n, d) = masks.shape[0], features.shape
    dt = torch.float64
    x = clip_features(features.to(dt), head.clip_radius)
    xt = torch.cat([x, x.new_ones(n, 1)], dim=1)  # (n, d+1)
    xnorm = xt.norm(dim=1)  # (n,)
    onehot = F.one_hot(labels.long(), num_classes).to(dt).t()  # (C, n)
    init = _init_params(d=d, num_classes=num_classes, head=head.replace(dtype="float64"), seed=seed)
    w = torch.cat([init["fc.weight"], init["fc.bias"].unsqueeze(1)], dim=1)
    w = w.unsqueeze(0).repeat(n_heads, 1, 1).to(features.device)  # (B, C, d+1)
    q = sample_rate_for(n=n_b, batch_size=config.batch_size) if sample_rate is None else sample_rate
    expected = max(1, int(n_b * q))
    g = torch.Generator(device=features.device).manual_seed(derive_seed("shadow-dpsgd", seed))
    member = masks.to(device=features.device, dtype=torch.bool)
    clip = config.max_grad_norm
    for _ in range(config.epochs * steps_per_epoch(q)):
        batch = (torch.rand(n_heads, n, generator=g, device=features.device, dtype=dt) < q) & member
        z = torch.matmul(w, xt.t())  # (B, C, n)
        r = torch.softmax(z, dim=1) - onehot
        norms = r.norm(dim=1) * xnorm  # (B, n)
        factor = (clip / (norms + 1e-6)).clamp(max=1.0) * batch
        grad = torch.matmul(r * factor.unsqueeze(1), xt)  # (B, C, d+1)
        noise = torch.randn(w.shape, generator=g, device=features.device, dtype=dt)
        w = w - config.lr * (grad + sigma * clip * noise) / expected
    return {"fc.weight": w[..., :d].contiguous(), "fc.bias": w[..., d].contiguous()}


@dataclass(frozen=True)
class OpacusFit:
    """A DP-SGD-trained model as the method releases it, with its run's accounting."""

    module: nn.Module
    predict_proba: Predict
    run: OpacusRun


@dataclass
class _Prepared:
    n: int
    seed: int
    schedule: tuple[int, int]
    split: PublicSplit | None
    tuned: dict[tuple[float, float, str], tuple[DPSGDConfig, TuningResult]] = field(
        default_factory=dict
    )


def _describe(config: DPSGDConfig) -> dict[str, Any]:
    return config.to_dict()


@register_method("dpsgd")
class DPSGDMethod(Method):
    """DP-SGD head training through Opacus, one independent run per (epsilon, draw).

    Options (``context.options``): ``accountant`` (``prv`` | ``rdp`` | ``alm_pld``),
    ``dataset`` (picks the schedule), ``dpsgd_epochs``, ``dpsgd_batch_size``,
    ``dpsgd_lr`` and ``dpsgd_clip`` (fixing both skips tuning), ``tune`` (default true).
    """

    name: ClassVar[str] = "dpsgd"
    tuning_grid: ClassVar[tuple[dict[str, Any], ...]] = TUNING_GRID
    post_training: ClassVar[bool] = False
    #: Options are read as ``<prefix>_lr``, ``<prefix>_clip``, ``<prefix>_epochs``, ...
    option_prefix: ClassVar[str] = "dpsgd"
    mechanism: ClassVar[str] = "dp-sgd"
    #: Extra notes for the statement.
    notes: ClassVar[tuple[str, ...]] = ()

    def prepare(
        self, *, features: Tensor, labels: Tensor, seed: int, context: MethodContext
    ) -> Any:
        n = int(features.shape[0])
        prefix = self.option_prefix
        epochs, batch = default_schedule(n=n, dataset=context.options.get("dataset"))
        epochs = option(context, f"{prefix}_epochs", epochs, int)
        batch = option(context, f"{prefix}_batch_size", batch, int)
        check_accountant(str(context.options.get("accountant", DEFAULT_ACCOUNTANT)))
        load_sigma_cache(context.cache_dir)
        return _Prepared(
            n=n,
            seed=seed,
            schedule=(epochs, batch),
            split=public_split(context=context, n=n, seed=seed, inputs=self._public(context)),
        )

    def _public(self, context: MethodContext) -> Tensor | None:
        """The public rows in this method's input kind (``None``: the public features)."""
        return None

    def _candidates(self, prepared: _Prepared, context: MethodContext) -> list[DPSGDConfig]:
        epochs, batch = prepared.schedule
        prefix = self.option_prefix
        grid = [dict(c) for c in self.tuning_grid]
        if f"{prefix}_lr" in context.options and f"{prefix}_clip" in context.options:
            grid = [
                {
                    "lr": option(context, f"{prefix}_lr", 1.0, float),
                    "max_grad_norm": option(context, f"{prefix}_clip", 1.0, float),
                }
            ]
        return [
            DPSGDConfig(
                lr=c["lr"], max_grad_norm=c["max_grad_norm"], epochs=epochs, batch_size=batch
            )
            for c in grid
        ]

    def choose(
        self, prepared: _Prepared, *, epsilon: float, delta: float, context: MethodContext
    ) -> tuple[DPSGDConfig, TuningResult]:
        """The configuration for this epsilon, tuned on public data once and cached."""
        accountant = str(context.options.get("accountant", DEFAULT_ACCOUNTANT))
        key = (float(epsilon), float(delta), accountant)
        if key in prepared.tuned:
            return prepared.tuned[key]
        candidates = self._candidates(prepared, context)
        split = prepared.split
        if len(candidates) == 1:
            chosen = untuned(
                candidates[0], describe=_describe, reason="lr and clip fixed by options"
            )
        elif not bool(context.options.get("tune", True)):
            chosen = untuned(candidates[-1], describe=_describe, reason="tune=false")
        elif split is None:
            chosen = untuned(
                candidates[-1],
                describe=_describe,
                reason="no public data large enough for a validation split",
            )
        else:
            s = split

            def score(config: DPSGDConfig) -> float:
                accs = []
                for draw in range(TUNING_DRAWS):
                    fit = self._fit(
                        s.train_features,
                        s.train_labels,
                        config=config,
                        epsilon=epsilon,
                        delta=delta,
                        accountant=accountant,
                        seed=derive_seed("tune-init", prepared.seed),
                        noise_seed=derive_seed("tune", prepared.seed, draw, epsilon),
                        context=context,
                    )
                    proba = fit.predict_proba(s.validation_features)
                    accs.append(accuracy_of(proba, s.validation_labels))
                return sum(accs) / len(accs)

            chosen = select_config(candidates, score=score, describe=_describe)
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
        accountant = check_accountant(str(context.options.get("accountant", DEFAULT_ACCOUNTANT)))
        known = len(_SIGMAS)
        config, tuning = self.choose(prepared, epsilon=epsilon, delta=delta, context=context)
        fit = self._fit(
            features,
            labels,
            config=config,
            epsilon=epsilon,
            delta=delta,
            accountant=accountant,
            seed=seed,
            noise_seed=derive_seed(self.name, seed, draw, float(epsilon)),
            context=context,
        )
        if len(_SIGMAS) > known:
            save_sigma_cache(context.cache_dir)
        run = fit.run
        statement = PrivacyStatement(
            epsilon=float(epsilon),
            delta=float(delta),
            guarantee="approx-dp",  # type: ignore[arg-type]
            mechanism=f"{self.mechanism} (opacus, {accountant} accountant)",
            noise_scale=run.noise_multiplier,
            sensitivity=SensitivityInfo(
                value=config.max_grad_norm,
                norm="l2",
                source="analytic",  # type: ignore[arg-type]
                adjacency="remove-one",
            ),
            notes=(
                f"{accountant} accountant: epsilon={run.epsilon_spent:.4g} at delta={delta:g} "
                f"after {run.steps} steps (noise multiplier {run.noise_multiplier:.4g}, "
                f"Poisson rate {run.sample_rate:.4g}); the target epsilon is stated",
                "add/remove-one adjacency; sensitivity is the per-example clipping norm of "
                "each step",
                "secure_mode off: seeded torch PRNG, floating-point noise (not a CSPRNG)",
                *self.notes,
            ),
        )
        return Release(
            method=self.name,
            statement=statement,
            predict_proba=fit.predict_proba,
            module=fit.module,
            info={
                "config": config.to_dict(),
                "tuning": tuning.to_info(),
                "noise_multiplier": run.noise_multiplier,
                "sample_rate": run.sample_rate,
                "steps": run.steps,
                "accountant": accountant,
                "epsilon_spent": run.epsilon_spent,
                "sigma_cached": run.from_cache,
                "seconds": run.seconds,
                "attacker": self._attacker_note(context),
            },
        )

    def _fit(
        self,
        x: Tensor,
        y: Tensor,
        *,
        config: DPSGDConfig,
        epsilon: float,
        delta: float,
        accountant: str,
        seed: int,
        noise_seed: int,
        context: MethodContext,
    ) -> OpacusFit:
        """One DP-SGD run on inputs ``x`` (tuning and release share it)."""
        run = train_dpsgd_head(
            x,
            y,
            num_classes=context.num_classes,
            head=context.head,
            config=config,
            epsilon=epsilon,
            delta=delta,
            accountant=accountant,
            seed=seed,
            noise_seed=noise_seed,
            device=context.device,
        )
        head = run.head
        return OpacusFit(
            module=head,
            predict_proba=lambda q: head.predict_proba(q.to(context.device)).float().cpu(),
            run=run,
        )

    def _attacker_note(self, context: MethodContext) -> str:
        return _attacker_note(context.head)

    def shadow_trainer(
        self, *, release: Release, epsilon: float, delta: float, context: MethodContext
    ) -> ShadowTrainer:
        """The adaptive attacker: shadow heads trained with the victim's DP-SGD recipe, its
        noise multiplier, Poisson rate and step count (batched, :func:`dpsgd_linear_heads`);
        plain heads for non-linear kinds. A shadow set of the members' size is then trained
        exactly like the victim; other sizes keep the victim's per-step noise and rate."""
        if context.head.kind != "linear":
            return plain_shadow_trainer(context)
        config = DPSGDConfig(**release.info["config"])
        sigma = float(release.info["noise_multiplier"])
        rate = float(release.info["sample_rate"])

        def trainer(features: Tensor, labels: Tensor, masks: Tensor, seed: int) -> Predict:
            params = _shadow_params(
                features,
                labels,
                masks=masks,
                seed=seed,
                config=config,
                sigma=sigma,
                sample_rate=rate,
                context=context,
            )

            def predict(x: Tensor) -> Tensor:
                xc = clip_features(x.to(features.device, torch.float64), context.head.clip_radius)
                z = torch.matmul(xc, params["fc.weight"].transpose(-1, -2))
                return torch.softmax(z + params["fc.bias"].unsqueeze(-2), -1).float()

            return predict

        return trainer


def _shadow_params(
    features: Tensor,
    labels: Tensor,
    *,
    masks: Tensor,
    seed: int,
    config: DPSGDConfig,
    sigma: float,
    sample_rate: float,
    context: MethodContext,
) -> Params:
    # Heads are grouped by size only because the batched trainer needs equal sizes.
    sizes = masks.sum(1)
    parts: list[tuple[Tensor, Params]] = []
    for size in sorted({int(s) for s in sizes}):
        rows = (sizes == size).nonzero().flatten()
        with single_thread():
            params = dpsgd_linear_heads(
                features,
                labels,
                masks=masks[rows],
                num_classes=context.num_classes,
                head=context.head,
                config=config,
                sigma=sigma,
                seed=seed,
                sample_rate=sample_rate,
            )
        parts.append((rows, params))
    out = {
        k: torch.empty((len(masks), *v.shape[1:]), dtype=v.dtype, device=v.device)
        for k, v in parts[0][1].items()
    }
    for rows, params in parts:
        for k, v in params.items():
            out[k][rows.to(v.device)] = v
    return out


def _sigma(
    *, epsilon: float, delta: float, sample_rate: float, epochs: int, accountant: str
) -> float:
    """The noise multiplier for ``epochs`` of Opacus's Poisson loader at ``sample_rate`` (cached).

    Opacus's own search (``get_noise_multiplier``, which ``make_private_with_epsilon`` calls),
    given ``epochs`` when Opacus counts the steps right, else the true step count.
    """
    key = (float(epsilon), float(delta), float(sample_rate), int(epochs), accountant)
    if key not in _SIGMAS:
        by: dict[str, int] = (
            {"epochs": epochs}
            if _epochs_match_steps(sample_rate, epochs)
            else {"steps": epochs * steps_per_epoch(sample_rate)}
        )
        with _quiet_opacus():
            _SIGMAS[key] = float(
                get_noise_multiplier(
                    target_epsilon=epsilon,
                    target_delta=delta,
                    sample_rate=sample_rate,
                    accountant=accountant,
                    **by,
                )
            )
    return _SIGMAS[key]


def _epochs_match_steps(sample_rate: float, epochs: int) -> bool:
    """Whether Opacus's step count for ``epochs`` equals what its loader runs."""
    return int(epochs / sample_rate) == epochs * steps_per_epoch(sample_rate)


def accountant_epsilon(
    *, noise_multiplier: float, sample_rate: float, steps: int, delta: float, accountant: str
) -> float:
    """Epsilon of ``steps`` DP-SGD steps from a fresh Opacus accountant (an independent check)."""
    acc = create_accountant(check_accountant(accountant))
    acc.history = [(noise_multiplier, sample_rate, steps)]
    with _quiet_opacus():
        return float(acc.get_epsilon(delta=delta))


def _attacker_note(head: HeadConfig) -> str:
    if head.kind == "linear":
        return (
            "adaptive: shadow heads trained with the victim's DP-SGD recipe, noise multiplier, "
            "Poisson rate and steps (batched re-implementation of Opacus's algorithm)"
        )
    return "plain: shadow heads trained without DP (DP-SGD shadows of MLP heads are too slow)"
