"""``RunConfig``: everything that determines a run, validated before anything is written."""

from __future__ import annotations

import dataclasses
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from alm_opacus._validation import check_delta, check_epsilon
from alm_opacus.attacks import DEFAULT_ATTACKS, AttackConfig, available_attacks
from alm_opacus.data import DatasetSpec, dataset_spec
from alm_opacus.data.split import SplitSizes
from alm_opacus.heads import HeadConfig
from alm_opacus.mechanisms.analysis import LARGEST_EPSILON
from alm_opacus.methods import method_class, validate_options
from alm_opacus.run.layout import DEFAULT_CACHE
from alm_opacus.ssl.pretrain import SSLConfig

__all__ = ["RESUME_KEYS", "RunConfig", "config_mismatch", "dedupe"]

#: The keys of ``config.json`` that decide what a cell's rows hold: a resumed run must agree
#: on all of them (the grid of methods, epsilons and seeds may grow).
RESUME_KEYS = (
    "dataset",
    "delta",
    "split_seed",
    "split",
    "ssl",
    "head",
    "noise_draws",
    "method_options",
    "attacks",
    "attack_options",
    "reproducible_noise",
    "device",
)


@dataclass(frozen=True)
class RunConfig:
    """Everything that determines a run; saved as ``config.json``.

    Attributes:
        dataset: registry name.
        data_root: folder holding the dataset's files (not needed for embedded datasets).
        methods: method names; the baseline (``none``) always runs too.
        epsilons: the privacy budgets of the grid (``None``: the dataset's default grid).
        delta: ``None`` means min(1e-5, 1 / (10 n)) for ``n`` members.
        seeds: one cell per seed: head training, noise and attacks are seeded by it.
        split_seed: seeds the split and pre-training (shared by all seeds).
        device: ``"cpu"`` or ``"cuda[:N]"``.
        out: the run folder.
        cache_dir: encoder/feature/head cache (default ``<out>/private/cache``, or
            ``$ALM_OPACUS_CACHE``).
        noise_draws: independent noise draws per (method, epsilon, seed).
        options: method options: shared keys (``"m"``) and scoped ones (``"dpsgd.lr"``).
        attacks: attack names (``all`` for every registered attack; ``none`` for none).
        attack_options: fields of :class:`~alm_opacus.attacks.AttackConfig` to override.
        resume: skip cells already in ``results.csv`` (the config must match).
        overwrite: replace a previous run in ``out`` (its caches are kept).
        reproducible_noise: seed release noise from public labels (research only: such
            releases are private only while the seeds stay secret).
        head: the fine-tuning recipe (``None``: the dataset's default recipe).
        ssl: the SimCLR recipe (``None``: the dataset's default).
        split: split sizes (``None``: the dataset's default).
        progress: show progress bars.
    """

    dataset: str = "digits"
    data_root: str | None = None
    methods: tuple[str, ...] = ("none",)
    epsilons: tuple[float, ...] | None = None
    delta: float | None = None
    seeds: tuple[int, ...] = (0,)
    split_seed: int = 0
    device: str = "cpu"
    out: str = "runs/latest"
    cache_dir: str | None = None
    noise_draws: int = 5
    options: dict[str, Any] = field(default_factory=dict)
    attacks: tuple[str, ...] = ("all",)
    attack_options: dict[str, Any] = field(default_factory=dict)
    resume: bool = False
    overwrite: bool = False
    reproducible_noise: bool = False
    head: HeadConfig | None = None
    ssl: SSLConfig | None = None
    split: SplitSizes | None = None
    progress: bool = True

    def __post_init__(self) -> None:
        spec = dataset_spec(self.dataset)  # a DataError (a ValueError) naming the known ones
        if spec.needs_root and self.data_root is None:
            raise ValueError(
                f"dataset {self.dataset!r} is read from local files: pass data_root (--data-root)"
            )
        if not self.methods:
            raise ValueError("methods is empty: expected at least one method name")
        for name in self.methods:
            method_class(name)  # names the registered ones
        if spec.ssl is None and self.ssl is not None:
            raise ValueError(
                f"ssl={self.ssl!r}: dataset {self.dataset!r} holds features, so nothing is "
                "pre-trained; drop the SimCLR recipe"
            )
        object.__setattr__(self, "methods", dedupe(self.methods))
        if self.epsilons is not None:
            if not self.epsilons:
                raise ValueError("epsilons is empty: expected at least one epsilon")
            eps = tuple(check_epsilon(e) for e in self.epsilons)
            if max(eps) > LARGEST_EPSILON:  # a Gaussian release would fail inside a cell
                raise ValueError(
                    f"epsilons: epsilon={max(eps)!r} is too large: expected epsilons in "
                    f"(0, {LARGEST_EPSILON:g}], the range the Gaussian mechanisms calibrate"
                )
            object.__setattr__(self, "epsilons", dedupe(eps))
        if self.delta is not None:
            check_delta(self.delta)
        for name, value in (("noise_draws", self.noise_draws), ("split_seed", self.split_seed)):
            if isinstance(value, bool) or not isinstance(value, int):
                raise ValueError(f"{name}={value!r} is invalid: expected an integer")
        if self.noise_draws < 1:
            raise ValueError(f"noise_draws={self.noise_draws!r} is invalid: expected >= 1")
        if not self.seeds:
            raise ValueError("seeds is empty: expected at least one seed")
        if any(isinstance(s, bool) or not isinstance(s, int) for s in self.seeds):
            raise ValueError(f"seeds={self.seeds!r} is invalid: expected integers")
        object.__setattr__(self, "seeds", dedupe(self.seeds))
        for flag in ("resume", "overwrite", "reproducible_noise", "progress"):
            if not isinstance(getattr(self, flag), bool):
                raise ValueError(f"{flag}={getattr(self, flag)!r} is invalid: expected true/false")
        if self.resume and self.overwrite:
            raise ValueError("resume and overwrite exclude each other: continue or replace")
        for name in self.attack_names:
            if name not in available_attacks():
                raise ValueError(
                    f"unknown attack {name!r}: expected one of {', '.join(available_attacks())}"
                    ", 'all' or 'none'"
                )
        if self.device not in ("cpu", "cuda") and not self.device.startswith("cuda:"):
            raise ValueError(f"device={self.device!r} is invalid: expected 'cpu' or 'cuda[:N]'")
        validate_options(self.options)
        try:
            AttackConfig(**self.attack_options)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"attack options: {exc}") from exc

    @property
    def attack_names(self) -> tuple[str, ...]:
        """The attacks to run: ``all`` expands in place to the default set (the opt-in
        attacks, RMIA, join when named: ``all,rmia-online``), ``none`` to none."""
        if tuple(self.attacks) in (("none",), ()):
            return ()
        names: list[str] = []
        for name in self.attacks:
            names += DEFAULT_ATTACKS if name == "all" else [name]
        return dedupe(tuple(names))

    @property
    def spec(self) -> DatasetSpec:
        """The dataset's registered spec (its defaults)."""
        return dataset_spec(self.dataset)

    @property
    def grid(self) -> tuple[float, ...]:
        """The epsilons of the grid (the dataset's default when none were given)."""
        return self.spec.epsilons if self.epsilons is None else self.epsilons

    @property
    def recipe(self) -> HeadConfig:
        """The fine-tuning recipe (the dataset's default when none was given)."""
        return self.spec.head if self.head is None else self.head

    @property
    def ssl_config(self) -> SSLConfig:
        """The SimCLR recipe.

        Raises:
            ValueError: for a dataset of features, which has none (nothing is pre-trained).
        """
        ssl = self.spec.ssl if self.ssl is None else self.ssl
        if ssl is None:
            raise ValueError(
                f"dataset {self.dataset!r} has no SimCLR recipe (its spec's ssl is None: a "
                "dataset of features, whose loader gives features, not images)"
            )
        return ssl

    @property
    def split_sizes(self) -> SplitSizes:
        return self.spec.split if self.split is None else self.split

    @property
    def cache_path(self) -> Path:
        """``cache_dir``, else ``$ALM_OPACUS_CACHE``, else ``<out>/private/cache`` (it holds
        the clean heads: ``alm_opacus.run.rundir``)."""
        if self.cache_dir is not None:
            return Path(self.cache_dir)
        return Path(os.environ.get("ALM_OPACUS_CACHE", Path(self.out) / DEFAULT_CACHE))

    @property
    def encoder_cache_path(self) -> Path:
        """Where the SimCLR encoder is cached: ``$ALM_OPACUS_ENCODER_CACHE``, else the user's
        cache (``$XDG_CACHE_HOME/alm_opacus/encoders``; ``~/.cache/...`` by default).

        The encoder sees only the public split, so it may be shared across runs and clones
        (keyed by its recipe, the public rows, the data's digest and the code): only the
        first run on a machine pre-trains. The features, which include the members', and
        the clean heads stay in :attr:`cache_path`.
        """
        if os.environ.get("ALM_OPACUS_ENCODER_CACHE"):
            return Path(os.environ["ALM_OPACUS_ENCODER_CACHE"])
        base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
        return Path(base) / "alm_opacus" / "encoders"

    def to_dict(self) -> dict[str, Any]:
        """Plain data for ``config.json`` (defaults resolved)."""
        out = dataclasses.asdict(self)
        out["epsilons"] = list(self.grid)
        out["head"] = dataclasses.asdict(self.recipe)
        out["ssl"] = None if self.spec.ssl is None else self.ssl_config.to_dict()
        out["split"] = dataclasses.asdict(self.split_sizes)
        return out


def dedupe(values: tuple[Any, ...]) -> tuple[Any, ...]:
    """``values`` without repeats, first occurrences kept in order (floats compared exactly)."""
    return tuple(dict.fromkeys(values))


def config_mismatch(saved: dict[str, Any], current: dict[str, Any]) -> list[str]:
    """The :data:`RESUME_KEYS` (dotted to the first differing leaf) where two ``config.json``
    payloads differ, as ``"key (saved vs now)"``."""
    out: list[str] = []
    for key in RESUME_KEYS:
        a, b = saved.get(key), current.get(key)
        if key == "method_options" and isinstance(a, dict) and isinstance(b, dict):
            # a resumed run may add methods; those in both must agree
            a, b = ({m: v[m] for m in set(a) & set(b)} for v in (a, b))
        _diff(key, a, b, out)
    return out


def _diff(key: str, a: Any, b: Any, out: list[str]) -> None:
    if isinstance(a, dict) and isinstance(b, dict):
        for k in sorted(set(a) | set(b)):
            _diff(f"{key}.{k}", a.get(k), b.get(k), out)
        return
    if (
        isinstance(a, float)
        and isinstance(b, float)
        and (a == b or (math.isnan(a) and math.isnan(b)))
    ):
        return
    if a != b:
        out.append(f"{key} ({a!r} vs {b!r})")
