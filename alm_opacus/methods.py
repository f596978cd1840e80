"""The method registry: every protection turns member features into a :class:`Release`.

A method works in two phases so that the harness can reuse expensive work:

* ``prepare(...)`` once per (data, seed): e.g. train the clean head and its sensitivity;
* ``release(prepared, epsilon=..., draw=...)`` once per (epsilon, noise draw).

Post-training protections (ALM, Laplace, Gaussian) make ``release`` cheap: re-protecting
at a new epsilon needs no retraining. During-training protections (DP-SGD) do their
training in ``release``.

``alm_opacus`` never imports ``baselines``; baselines register themselves here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Literal

from torch import Tensor, nn

from alm_opacus.heads import HeadConfig, train_head
from alm_opacus.protect import PrivacyStatement

Predict = Callable[[Tensor], Tensor]
#: What a method trains on and its release is queried with: the frozen public encoder's
#: L2-normalised features (n, d), or the images (n, C, H, W), float in [0, 1].
InputKind = Literal["features", "images"]
INPUT_KINDS: tuple[InputKind, ...] = ("features", "images")
#: ``trainer(features, labels, masks (B, n), seed) -> predict``, predict giving (B, q, C).
ShadowTrainer = Callable[[Tensor, Tensor, Tensor, int], Predict]


@dataclass
class Release:
    """What leaves the data owner's hands: a black-box predictor and its statement.

    Attributes:
        method: registry name of the method.
        statement: what the release may claim.
        predict_proba: inputs of the method's :attr:`Method.inputs` kind (features (q, d) by
            default) -> probabilities (q, C).
        module: the released module, if the method releases weights.
        info: method-specific diagnostics (e.g. training time).
    """

    method: str
    statement: PrivacyStatement
    predict_proba: Predict
    module: nn.Module | None = None
    info: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class MethodContext:
    """What every method may use besides the members' data.

    Attributes:
        num_classes: number of classes.
        head: the fine-tuning recipe shared by every method (and known to the attacker).
        device: ``"cpu"`` or ``"cuda"``.
        public_features: features of the public split (non-private; for tuning).
        public_labels: their labels.
        public_images: the same rows as images, given only when a method with
            ``inputs = "images"`` runs.
        encoder: the encoder pre-trained on public data (frozen; a method that fine-tunes it
            must copy it), given only when a method with ``inputs = "images"`` runs.
        cache_dir: where a method may cache per-config work.
        options: method-specific options from the command line (e.g. ``sensitivity``, ``m``).
        progress: whether to show progress bars.
    """

    num_classes: int
    head: HeadConfig
    device: str = "cpu"
    public_features: Tensor | None = None
    public_labels: Tensor | None = None
    public_images: Tensor | None = None
    encoder: nn.Module | None = None
    cache_dir: Path | None = None
    options: dict[str, Any] = field(default_factory=dict)
    progress: bool = False


class Method:
    """Base class. Subclasses set ``name`` and override ``prepare`` and ``release``."""

    name: ClassVar[str] = ""
    #: True when ``release`` is a post-training step on a fixed trained model.
    post_training: ClassVar[bool] = False
    #: The hyper-parameter configurations the method may try per epsilon (selected on public
    #: validation data only); the harness lists them in ``config.json`` so that equal tuning
    #: budgets can be checked. Empty: the method has nothing to tune beyond the shared recipe.
    tuning_grid: ClassVar[tuple[dict[str, Any], ...]] = ()
    #: What ``prepare``/``release`` get as ``features`` and the release's ``predict_proba``
    #: takes. The attacker's shadow and reference heads always work on features.
    inputs: ClassVar[InputKind] = "features"
    #: Whether ``--methods all`` includes the method (false: opt-in, named explicitly).
    in_all: ClassVar[bool] = True

    def prepare(
        self, *, features: Tensor, labels: Tensor, seed: int, context: MethodContext
    ) -> Any:
        """Work shared by every epsilon and noise draw (default: none)."""
        return None

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
        raise NotImplementedError

    def shadow_trainer(
        self, *, release: Release, epsilon: float, delta: float, context: MethodContext
    ) -> ShadowTrainer:
        """A trainer for the attacker's shadow and reference heads.

        The default trains unprotected heads with the victim's recipe; methods whose
        protection the attacker can imitate cheaply override it (the adaptive attacker).
        The returned function maps ``(features, labels, masks (B, n), seed)`` to a
        predictor of probabilities with shape (B, q, C).
        """
        return plain_shadow_trainer(context)


def plain_shadow_trainer(
    context: MethodContext,
) -> ShadowTrainer:
    """Shadow heads trained with the victim's recipe, without protection."""
    from alm_opacus.attacks import recipe_trainer

    return recipe_trainer(config=context.head, num_classes=context.num_classes)


MethodFactory = Callable[[], Method]
_METHODS: dict[str, MethodFactory] = {}


def register_method(name: str, *, force: bool = False) -> Callable[[MethodFactory], MethodFactory]:
    """Decorator registering a method class (or factory) under ``name``.

    Raises:
        ValueError: if ``name`` is taken and ``force`` is false.
    """

    def decorator(factory: MethodFactory) -> MethodFactory:
        if name in _METHODS and not force:
            raise ValueError(f"method {name!r} is already registered; pass force=True")
        _METHODS[name] = factory
        return factory

    return decorator


def available_methods() -> list[str]:
    """Registered method names, sorted."""
    return sorted(_METHODS)


def default_methods() -> list[str]:
    """What ``all`` expands to: the registered methods that are not opt-in, sorted."""
    return [name for name in available_methods() if _METHODS[name]().in_all]


def create_method(name: str) -> Method:
    """Instantiate the method ``name``.

    Raises:
        ValueError: for an unknown name, listing the registered ones.
    """
    if name not in _METHODS:
        raise ValueError(
            f"unknown method {name!r}: expected one of {', '.join(available_methods())}"
        )
    return _METHODS[name]()


@register_method("none")
class NoProtection(Method):
    """The unprotected head: the baseline every utility loss is measured against."""

    name = "none"
    post_training = True

    def prepare(
        self, *, features: Tensor, labels: Tensor, seed: int, context: MethodContext
    ) -> Any:
        return train_head(
            features.to(context.device),
            labels.to(context.device),
            num_classes=context.num_classes,
            config=context.head,
            seed=seed,
        )

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
        head = prepared
        return Release(
            method=self.name,
            statement=PrivacyStatement.unprotected(),
            predict_proba=lambda x: head.predict_proba(x.to(context.device)).float().cpu(),
            module=head,
        )
