"""Post-training protections as methods: ``alm``, ``laplace``, ``gaussian``, ``gaussian-classic``.

Each trains the head once per seed (``prepare``), finds its sensitivity once, and then
releases a noisy copy per (epsilon, noise draw) with :class:`PostTrainingPrivacyEngine`:
re-protecting at a new epsilon needs no retraining (ALM paper, Algorithm 1).

Sensitivity (option ``sensitivity``): ``sampled`` (default, random-DP), ``sampled-members``
(no guarantee), ``analytic`` or ``stability`` (proven: pure or approximate DP); the finders and
the options are in :mod:`alm_opacus.posttraining.sources`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Hashable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import torch
from torch import Tensor

from alm_opacus._hashing import code_digest, derive_seed, tensor_digest
from alm_opacus.attacks.base import SHADOW_DTYPE, ShadowTrainer
from alm_opacus.heads import Head, HeadConfig, batched_logits, train_heads, warm_start
from alm_opacus.io import cached
from alm_opacus.mechanisms import create_mechanism, make_generator
from alm_opacus.method_base import (
    Method,
    MethodContext,
    Predict,
    Release,
    ReleaseRequest,
    RunMemo,
)
from alm_opacus.methods import register_method
from alm_opacus.posttraining.engine import (
    PostTrainingPrivacyEngine,
    ProtectedModule,
    SensitivityInfo,
)
from alm_opacus.posttraining.sources import (
    ANALYTIC_CLIP,
    ANALYTIC_L2,
    SENSITIVITY_SOURCES,
    PostTrainingOptions,
    convex_config,
)
from alm_opacus.sensitivity import train_convex_heads
from alm_opacus.ssl.pretrain import config_hash

__all__ = [  # the options and recipes live in .sources; re-exported for existing imports
    "ANALYTIC_CLIP",
    "ANALYTIC_L2",
    "CODE",
    "POST_TRAINING_METHODS",
    "PostTrainingMethod",
    "PostTrainingOptions",
    "PreparedHead",
    "clean_shadow_heads",
    "convex_config",
    "prepare_head",
]

#: The modules whose code trains the clean and shadow heads and finds the sensitivity: their
#: cache files record its digest and are recomputed when it differs (``alm_opacus.io``).
CODE = (
    "alm_opacus.heads",
    "alm_opacus.steppers",
    "alm_opacus.paper_head",
    "alm_opacus.sensitivity",
    "alm_opacus.posttraining.method",
    "alm_opacus.posttraining.sources",
    "alm_opacus._hashing",
)


@dataclass(frozen=True)
class PreparedHead:
    """A clean head and its sensitivity in both norms (shared by every epsilon and draw)."""

    head: Head
    config: HeadConfig
    sensitivity: dict[str, SensitivityInfo]
    solver: str
    details: dict[str, Any]


def prepare_head(
    *,
    features: Tensor,
    labels: Tensor,
    seed: int,
    context: MethodContext,
    options: PostTrainingOptions,
) -> PreparedHead:
    """Train the clean head and find its sensitivity. Memoised on the run (ALM, Laplace and
    Gaussian protect the very same head) and, with ``context.cache_dir``, cached on disk by a
    hash of everything that determines it, so a resumed run does not redo Algorithm 2.

    The key holds the members, the public split the population sampler draws from, the
    recipe, the options and the seed; the cache file adds the code's digest (:data:`CODE`)."""
    digest = tensor_digest(features, labels)
    px, py = context.public_features, context.public_labels
    public = (
        tensor_digest(px, py)
        if options.sensitivity == "sampled" and px is not None and py is not None
        else None
    )
    key = (digest, public, seed, context.head, options, context.num_classes, context.dataset)
    return context.memo.get(
        ("posthoc-head", key),
        lambda: _load_or_prepare(
            features, labels, seed=seed, context=context, options=options, key=key
        ),
    )


def _load_or_prepare(
    features: Tensor,
    labels: Tensor,
    *,
    seed: int,
    context: MethodContext,
    options: PostTrainingOptions,
    key: tuple[Any, ...],
) -> PreparedHead:
    path = None
    if context.cache_dir is not None:
        path = Path(context.cache_dir) / f"posthoc-head-{config_hash(repr(key))}.pt"
    payload = cached(
        path,
        kind="alm_opacus.posttraining.method-head",
        key=repr(key),
        code=code_digest(*CODE),
        compute=lambda: _prepare_payload(
            features, labels, seed=seed, context=context, options=options
        ),
    )
    config = HeadConfig(**payload["config"])
    head = Head(
        in_features=int(features.shape[1]), num_classes=context.num_classes, config=config
    ).to(context.device)
    head.load_state_dict(payload["state_dict"])
    return PreparedHead(
        head=head,
        config=config,
        sensitivity={n: SensitivityInfo(**d) for n, d in payload["sensitivity"].items()},
        solver=payload["solver"],
        details=payload["details"],
    )


def _prepare_payload(
    features: Tensor,
    labels: Tensor,
    *,
    seed: int,
    context: MethodContext,
    options: PostTrainingOptions,
) -> dict[str, Any]:
    """The clean head and its sensitivity, as a cacheable payload (tensors and primitives)."""
    x, y = features.to(context.device), labels.to(context.device)
    found = SENSITIVITY_SOURCES[options.sensitivity](
        x, y, seed=seed, context=context, options=options
    )
    head = Head.from_params(found.params, num_classes=context.num_classes, config=found.config)
    return {
        "config": dataclasses.asdict(found.config),
        "state_dict": {k: v.cpu() for k, v in head.state_dict().items()},
        "sensitivity": {n: _info_dict(i) for n, i in found.info.items()},
        "solver": found.solver,
        "details": found.details,
        "sample": found.sample,  # the whole sample of Algorithm 2, for plots
    }


def _info_dict(info: SensitivityInfo) -> dict[str, Any]:
    out = dataclasses.asdict(info)
    out["source"] = info.source.value
    return out


class PostTrainingMethod(Method[PostTrainingOptions, PreparedHead]):
    """Noise added once to the trained head's weights, calibrated to its sensitivity."""

    Options = PostTrainingOptions
    mechanism: ClassVar[str] = ""
    post_training = True

    @property
    def needs_delta(self) -> bool:
        return not create_mechanism(self.mechanism).pure

    @property
    def sensitivity_source(self) -> str | None:
        return self.options.sensitivity

    @property
    def public_split_use(self) -> str | None:
        if self.options.sensitivity != "sampled":
            return None
        return "sensitivity sampler, which draws neighbouring data sets from the public split"

    @property
    def needs_newton_basis(self) -> bool:
        return self.options.sensitivity == "analytic"  # the analytic bound's Newton fit

    def preparation_key(self) -> Hashable:
        return ("posthoc-head", self.options)  # every mechanism protects the same head

    def prepare(
        self, *, features: Tensor, labels: Tensor, seed: int, context: MethodContext
    ) -> PreparedHead:
        return prepare_head(
            features=features, labels=labels, seed=seed, context=context, options=self.options
        )

    def release(self, prepared: PreparedHead, request: ReleaseRequest) -> Release:
        mech = create_mechanism(self.mechanism)
        engine = PostTrainingPrivacyEngine(mechanism=mech)
        context = request.context
        protected = engine.make_private(
            prepared.head,
            epsilon=request.epsilon,
            delta=0.0 if mech.pure else request.delta,
            sensitivity=prepared.sensitivity[mech.norm],
            generator=request.noise_generator(self.name),
        )
        scale = protected.statement.noise_scale
        assert scale is not None
        return Release(
            method=self.name,
            statement=protected.statement,
            predict_proba=_predict(protected, context.device),
            module=protected,
            attacker=lambda: self._attacker(prepared=prepared, scale=scale, context=context),
            attacker_note="adaptive: shadow heads trained with the victim's recipe, then given "
            "noise of the released scale (published in the statement), drawn per head",
            noise_std=mech.std(scale),
            info={"solver": prepared.solver, **prepared.details},
        )

    def _attacker(
        self, *, prepared: PreparedHead, scale: float, context: MethodContext
    ) -> ShadowTrainer:
        """The adaptive attacker: shadow heads trained with the victim's recipe, then given
        noise of the released scale (the statement publishes it), drawn per head."""
        mech = create_mechanism(self.mechanism)
        solver, config = prepared.solver, prepared.config

        def trainer(features: Tensor, labels: Tensor, masks: Tensor, seed: int) -> Predict:
            params = clean_shadow_heads(
                features,
                labels,
                masks=masks,
                seed=seed,
                config=config,
                solver=solver,
                num_classes=context.num_classes,
                cache_dir=context.cache_dir,
                memo=context.memo,
            )
            generator = make_generator(seed=derive_seed("shadow-noise", self.name, seed, scale))
            # The noise is added in the recipe's dtype; the shadows then predict in float32,
            # the dtype their probabilities are handed on in: half the time of float64 (B heads
            # on every row of the bank, on every cell), moving a logit by ~1e-7 relative.
            noisy = {
                k: (v + mech.sample(tuple(v.shape), scale=scale, generator=generator).to(v)).float()
                for k, v in sorted(params.items())
            }

            def predict(x: Tensor) -> Tensor:
                with torch.no_grad():
                    logits = batched_logits(noisy, x, config=config, dtype=SHADOW_DTYPE)
                    return torch.softmax(logits, -1)

            return predict

        return trainer


def clean_shadow_heads(
    features: Tensor,
    labels: Tensor,
    *,
    masks: Tensor,
    seed: int,
    config: HeadConfig,
    solver: str,
    num_classes: int,
    cache_dir: Path | None = None,
    memo: RunMemo | None = None,
) -> dict[str, Tensor]:
    """The attacker's shadow heads before noise. Post-training noise does not change how
    they are trained, so every epsilon and mechanism reuses them (memoised on the run and,
    with ``cache_dir``, cached on disk by a hash of everything that determines them)."""
    key = (
        tensor_digest(features, labels, masks),
        seed,
        config,
        solver,
        num_classes,
    )

    def train() -> dict[str, Tensor]:
        if solver == "newton" or config.solver == "newton":
            # convex heads: each starts from the head on all their rows (same minimisers)
            convex = config.replace(solver="newton")
            init = warm_start(features, labels, masks=masks, num_classes=num_classes, config=convex)
            return train_convex_heads(
                features, labels, masks=masks, num_classes=num_classes, config=convex, init=init
            ).params
        return train_heads(
            features, labels, masks=masks, num_classes=num_classes, config=config, seed=seed
        )

    def load() -> dict[str, Tensor]:
        path = (
            None
            if cache_dir is None
            else (Path(cache_dir) / f"shadow-heads-{config_hash(repr(key))}.pt")
        )
        out: dict[str, Tensor] = cached(
            path,
            kind="alm_opacus.shadow-heads",
            key=repr(key),
            code=code_digest(*CODE),
            compute=train,
        )
        return out

    return load() if memo is None else memo.get(("shadow-heads", key), load)


def _predict(module: ProtectedModule, device: str) -> Predict:
    def predict(x: Tensor) -> Tensor:
        with torch.no_grad():
            return torch.softmax(module(x.to(device)), -1).float().cpu()

    return predict


def _method(name: str, mechanism: str, doc: str) -> type[PostTrainingMethod]:
    return type(
        f"{name.title().replace('-', '')}Method",
        (PostTrainingMethod,),
        {"name": name, "mechanism": mechanism, "__doc__": doc},
    )


#: The post-training methods, registered below through the method plugin group
#: (:data:`alm_opacus.methods.PLUGIN_GROUP` imports this module as its built-in).
POST_TRAINING_METHODS: tuple[type[PostTrainingMethod], ...] = (
    _method("alm", "alm", "The additive logistic mechanism (ALM paper), L1 sensitivity."),
    _method("laplace", "laplace", "The Laplace mechanism, L1 sensitivity."),
    _method("gaussian", "gaussian", "The analytic Gaussian mechanism (Balle & Wang 2018), L2."),
    _method(
        "gaussian-classic",
        "gaussian-classic",
        "The textbook Gaussian sigma, kept to reproduce the ALM paper (proven for epsilon < 1).",
    ),
)

for _cls in POST_TRAINING_METHODS:
    register_method(_cls.name)(_cls)
