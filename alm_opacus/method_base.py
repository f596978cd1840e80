"""What a method is and what it releases: :class:`Method`, :class:`Release`, the context.

A method works in two phases so that the harness can reuse expensive work:

* ``prepare(...)`` once per (data, seed): e.g. train the clean head and its sensitivity;
* ``release(prepared, request)`` once per (epsilon, noise draw), the
  :class:`ReleaseRequest` naming the members, the budget, the seed and the draw.

Post-training protections (ALM, Laplace, Gaussian) make ``release`` cheap: re-protecting
at a new epsilon needs no retraining. During-training protections (DP-SGD) do their
training in ``release``.

The built-in methods (:mod:`alm_opacus.posttraining.method`) build on these types, and the registry
(:mod:`alm_opacus.methods`, which re-exports every name here) builds on the built-ins: this
module imports neither.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Generic, Literal, TypeVar, cast

from torch import Tensor, nn

from alm_opacus._hashing import derive_seed
from alm_opacus.attacks.base import Predictor, ShadowTrainer
from alm_opacus.heads import HeadConfig
from alm_opacus.mechanisms.sampling import NoiseGenerator, make_generator
from alm_opacus.options import MethodOptions, NoOptions, OptionError
from alm_opacus.statement import PrivacyStatement
from alm_opacus.unit_map import UnitMap, serial_map

__all__ = [
    "INPUT_KINDS",
    "AttackerFactory",
    "InputKind",
    "Method",
    "MethodContext",
    "NoisePolicy",
    "Predict",
    "Release",
    "ReleaseRequest",
    "RunMemo",
    "TrainingNoise",
    "same_factory",
]

#: ``inputs (q, ...) -> probabilities (q, C)``.
Predict = Predictor
#: What a method trains on and its release is queried with: the frozen public encoder's
#: L2-normalised features (n, d), or the images (n, C, H, W), float in [0, 1].
InputKind = Literal["features", "images"]
INPUT_KINDS: tuple[InputKind, ...] = ("features", "images")
#: Builds the adaptive attacker's trainer for one release (called once per cell).
AttackerFactory = Callable[[], ShadowTrainer]

OptionsT = TypeVar("OptionsT", bound=MethodOptions)
PreparedT = TypeVar("PreparedT")
T = TypeVar("T")


@dataclass(frozen=True)
class TrainingNoise:
    """The accounting of a release trained with noise (DP-SGD and its variants).

    Attributes:
        noise_multiplier: sigma, unitless: the noise scale per coordinate is sigma * clip.
        clip_norm: the per-example clipping norm ``C`` (the per-step sensitivity).
        clip_norm_kind: ``"l2"`` (Gaussian) or ``"l1"`` (logistic, Laplace).
        sample_rate: Poisson sampling probability per step.
        steps: optimiser steps.
        accountant: the accountant behind ``epsilon_spent``.
        epsilon_spent: the accountant's epsilon at the release's delta (<= the target).
        mechanism: the per-step noise mechanism (``gaussian``, ``alm``, ``laplace``).
    """

    noise_multiplier: float
    clip_norm: float
    sample_rate: float
    steps: int
    accountant: str
    epsilon_spent: float
    clip_norm_kind: str = "l2"
    mechanism: str = "gaussian"


@dataclass
class Release:
    """What leaves the data owner's hands: a black-box predictor and its statement.

    Attributes:
        method: registry name of the method.
        statement: what the release may claim.
        predict_proba: inputs of the method's :attr:`Method.inputs` kind (features (q, d) by
            default) -> probabilities (q, C).
        module: the released module, if the method releases weights.
        baseline: true for the unprotected reference every utility loss is measured against.
        chosen_config: the configuration the method tuned for this epsilon (public data only).
        attacker: builds the adaptive attacker's shadow trainer (one that imitates this
            release's protection); ``None``: the attacker trains plain heads.
        attacker_note: how the attacker's shadows relate to the victim (for the notes).
        training: the accounting of noisy training, for methods that train with noise.
        noise_std: standard deviation of one noise coordinate of the released weights (or of
            each step's noise on the summed gradients, for noisy training).
        info: method-specific diagnostics; never read by the harness.
    """

    method: str
    statement: PrivacyStatement
    predict_proba: Predict
    module: nn.Module | None = None
    baseline: bool = False
    chosen_config: dict[str, Any] | None = None
    attacker: AttackerFactory | None = None
    attacker_note: str = ""
    training: TrainingNoise | None = None
    noise_std: float | None = None
    info: dict[str, Any] = field(default_factory=dict)


class RunMemo:
    """Work shared within one run (a clean head, shadow heads, a noise multiplier): computed
    once per key and kept on the run's context, never in a module-level cache."""

    def __init__(self) -> None:
        self._store: dict[Hashable, Any] = {}

    def get(self, key: Hashable, compute: Callable[[], T]) -> T:
        """``compute()`` the first time ``key`` is asked for, the stored value afterwards."""
        if key not in self._store:
            self._store[key] = compute()
        return cast(T, self._store[key])

    def __contains__(self, key: Hashable) -> bool:
        return key in self._store

    def __len__(self) -> int:
        return len(self._store)


@dataclass(frozen=True)
class NoisePolicy:
    """Where release noise comes from.

    Attributes:
        reproducible: draw from a seeded generator derived from public labels (method,
            seed, draw, epsilon): reproducible research only, as anyone who knows the
            labels can regenerate and subtract the noise. Default: the OS CSPRNG.
    """

    reproducible: bool = False

    @property
    def source(self) -> str:
        """``"seeded"`` or ``"secure"`` (what statements and results record)."""
        return "seeded" if self.reproducible else "secure"

    def generator(self, *labels: object, device: str = "cpu") -> NoiseGenerator:
        """A generator for one release's noise: seeded from ``labels`` when reproducible."""
        if self.reproducible:
            return make_generator(seed=derive_seed(*labels), device=device)
        return make_generator(secure_mode=True, device=device)

    def seed(self, *labels: object) -> int | None:
        """The seed a seeded draw would use (``None`` for secure noise)."""
        return derive_seed(*labels) if self.reproducible else None


@dataclass(frozen=True)
class MethodContext:
    """What every method may use besides the members' data.

    Attributes:
        num_classes: number of classes.
        head: the fine-tuning recipe shared by every method (and known to the attacker).
        device: ``"cpu"`` or ``"cuda"``.
        public_features: features of the public split (non-private; for tuning and for
            sampling sensitivities).
        public_labels: their labels.
        public_images: the same rows as images, given only when a method with
            ``inputs = "images"`` runs.
        encoder: the encoder pre-trained on public data (frozen; a method that fine-tunes it
            must copy it), given only when a method with ``inputs = "images"`` runs.
        cache_dir: where a method may cache per-config work on disk.
        public_cache_dir: where a method may cache work that reads no member's data (e.g. a
            noise multiplier found from ε, δ and the sampling rate), shared by every run:
            the harness gives the encoder's cache folder. ``None``: use ``cache_dir``.
        progress: whether to show progress bars.
        dataset: the dataset's registry name.
        schedule: the dataset's DP-SGD schedule ``(epochs, expected batch size)``.
        noise: where release noise comes from.
        memo: work shared within the run.
        map_units: runs a method's independent units (e.g. the sensitivity sampler's chunks);
            default: in this process, in order. Results never depend on it.
    """

    num_classes: int
    head: HeadConfig
    device: str = "cpu"
    public_features: Tensor | None = None
    public_labels: Tensor | None = None
    public_images: Tensor | None = None
    encoder: nn.Module | None = None
    cache_dir: Path | None = None
    public_cache_dir: Path | None = None
    progress: bool = False
    dataset: str | None = None
    schedule: tuple[int, int] | None = None
    noise: NoisePolicy = field(default_factory=NoisePolicy)
    memo: RunMemo = field(default_factory=RunMemo)
    map_units: UnitMap = serial_map


@dataclass(frozen=True, eq=False)  # eq=False: tensors compare elementwise, not as one bool
class ReleaseRequest:
    """One release asked of a prepared method: whose data, at what budget, which draw.

    Attributes:
        features: the members' inputs, of the method's :attr:`Method.inputs` kind.
        labels: their labels (n,).
        epsilon: the target epsilon (``inf`` for the unprotected and no-leak references).
        delta: the target delta (a pure-DP method may ignore it).
        seed: the cell's seed, the one ``prepare`` got.
        draw: the noise draw's index within the cell (0, 1, ...).
        context: what every method may use besides the members' data.
    """

    features: Tensor
    labels: Tensor
    epsilon: float
    delta: float
    seed: int
    draw: int
    context: MethodContext

    def noise_labels(self, method: str) -> tuple[object, ...]:
        """The public labels a reproducible draw of ``method``'s noise is seeded from:
        ``(method, seed, draw, epsilon)``, one stream per release."""
        return (method, self.seed, self.draw, float(self.epsilon))

    def noise_generator(self, method: str, *, device: str = "cpu") -> NoiseGenerator:
        """The generator of this release's noise (:meth:`NoisePolicy.generator`)."""
        return self.context.noise.generator(*self.noise_labels(method), device=device)

    def noise_seed(self, method: str) -> int | None:
        """The seed of this release's noise, ``None`` for secure noise
        (:meth:`NoisePolicy.seed`)."""
        return self.context.noise.seed(*self.noise_labels(method))


def same_factory(a: AttackerFactory, b: AttackerFactory | None) -> bool:
    """Whether two attacker factories make the same shadow trainer: ``functools.partial``
    objects of equal function and arguments (a partial compares by identity), else ``is``."""
    if isinstance(a, functools.partial) and isinstance(b, functools.partial):
        return (a.func, a.args, a.keywords) == (b.func, b.args, b.keywords)
    return a is b


class Method(Generic[OptionsT, PreparedT]):
    """Base class. Subclasses set ``name`` (and ``Options``) and override ``prepare`` and
    ``release``; ``self.options`` holds the validated options."""

    name: ClassVar[str] = ""
    #: The options dataclass (defaults and validation); see :mod:`alm_opacus.options`.
    Options: ClassVar[type[MethodOptions]] = NoOptions
    #: True when ``release`` is a post-training step on a fixed trained model.
    post_training: ClassVar[bool] = False
    #: True for the unprotected reference (released once, at epsilon = inf).
    baseline: ClassVar[bool] = False
    #: True for a reference release that is no protection and never saw the members (released
    #: once, at epsilon = inf, in every run that attacks): the views read every protection's
    #: attack figures against it (``alm_opacus.report.series.NO_LEAK``).
    reference: ClassVar[bool] = False
    #: The hyper-parameter configurations the method may try per epsilon (selected on public
    #: validation data only); the harness lists them in ``config.json`` so that equal tuning
    #: budgets can be checked. Empty: the method has nothing to tune beyond the shared recipe.
    tuning_grid: ClassVar[tuple[dict[str, Any], ...]] = ()
    #: What ``prepare``/``release`` get as ``features`` and the release's ``predict_proba``
    #: takes. The attacker's shadow and reference heads always work on features.
    inputs: ClassVar[InputKind] = "features"
    #: Whether ``--methods all`` includes the method (false: opt-in, named explicitly).
    in_all: ClassVar[bool] = True

    def __init__(self, options: OptionsT | None = None) -> None:
        if options is None:
            options = cast(OptionsT, self.Options())
        if not isinstance(options, self.Options):
            raise OptionError(
                f"{self.name} takes {self.Options.__name__}, got {type(options).__name__}"
            )
        self.options: OptionsT = options

    @property
    def needs_delta(self) -> bool:
        """Whether this method's releases need ``delta > 0`` (approximate DP): a run refuses
        ``delta = 0`` for it before its first cell (default: False)."""
        return False

    @property
    def sensitivity_source(self) -> str | None:
        """Where the release's sensitivity comes from (``"sampled"``, ``"analytic"``...), for
        the run's HParams; ``None`` for methods without a post-training sensitivity."""
        return None

    @property
    def public_split_use(self) -> str | None:
        """What this method draws from the public split besides the shared recipe (a run
        refuses a public split of fewer than 2 rows for it, saying this), or ``None``."""
        return None

    @property
    def needs_newton_basis(self) -> bool:
        """Whether ``prepare`` fits the dense (d+1)^2 Newton basis whatever the head's solver
        (a run checks its memory before the first cell; default: False)."""
        return False

    def prepare(
        self, *, features: Tensor, labels: Tensor, seed: int, context: MethodContext
    ) -> PreparedT:
        """Work shared by every epsilon and noise draw (default: none)."""
        return cast(PreparedT, None)

    def preparation_key(self) -> Hashable:
        """Methods with equal keys share one :meth:`prepare` per seed (e.g. ALM, Laplace and
        Gaussian protect the very same trained head): the harness prepares each key once."""
        return (self.name, self.options)

    def attacker_before_release(
        self, prepared: PreparedT, request: ReleaseRequest
    ) -> AttackerFactory | None:
        """The adaptive attacker of ``release(prepared, request)`` when it is known before the
        release is made (it needs the protection's parameters, not the released model): the
        harness then prepares it beside the training. It must equal the release's own
        ``attacker`` (the harness checks: ``functools.partial`` factories by their function and
        arguments, others by identity).
        ``None`` (the default): known from the release only."""
        return None

    def release(self, prepared: PreparedT, request: ReleaseRequest) -> Release:
        """One release of ``prepared`` (what :meth:`prepare` returned for these members and
        seed) at the request's budget and noise draw."""
        raise NotImplementedError
