"""Post-training protections as methods: ``alm``, ``laplace``, ``gaussian``, ``gaussian-classic``.

Each trains the head once per seed (``prepare``), finds its sensitivity once, and then
releases a noisy copy per (epsilon, noise draw) with :class:`PostTrainingPrivacyEngine`:
re-protecting at a new epsilon needs no retraining (ALM paper, Algorithm 1).

Sensitivity (``context.options["sensitivity"]``):

* ``"sampled"`` (default, as in the ALM paper): Algorithm 2 on the victim's own recipe; the
  statement is random-DP with the sampler's gamma and confidence.
* ``"analytic"``: the convex head (L2-regularised multinomial logistic regression on
  clipped features, trained to a certified gradient tolerance) and its proven bound; the
  statement is pure-DP (ALM, Laplace) or approximate DP (Gaussian).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import torch
from torch import Tensor

from alm_opacus._hashing import derive_seed, tensor_digest
from alm_opacus.heads import Head, HeadConfig, batched_logits, flat_params, train_heads
from alm_opacus.io import cached
from alm_opacus.mechanisms import create_mechanism, make_generator
from alm_opacus.methods import (
    Method,
    MethodContext,
    Predict,
    Release,
    ShadowTrainer,
    register_method,
)
from alm_opacus.protect import PostTrainingPrivacyEngine, ProtectedModule, SensitivityInfo
from alm_opacus.sensitivity import analytic_sensitivity, sample_sensitivity, train_convex_heads
from alm_opacus.ssl.pretrain import config_hash

#: The convex head's defaults for ``--sensitivity analytic`` (features are unit-norm already).
ANALYTIC_L2 = 0.1
ANALYTIC_CLIP = 1.0


@dataclass(frozen=True)
class PreparedHead:
    """A clean head and its sensitivity in both norms (shared by every epsilon and draw)."""

    head: Head
    config: HeadConfig
    sensitivity: dict[str, SensitivityInfo]
    solver: str
    details: dict[str, Any]


def convex_config(context: MethodContext) -> HeadConfig:
    """The convex head the analytic bound covers."""
    return context.head.replace(
        kind="linear",
        l2=float(context.options.get("l2", ANALYTIC_L2)),
        clip_radius=float(context.options.get("clip_radius", ANALYTIC_CLIP)),
        dtype="float64",
    )


_PREPARED: dict[tuple[Any, ...], PreparedHead] = {}


def prepare_head(
    *, features: Tensor, labels: Tensor, seed: int, context: MethodContext
) -> PreparedHead:
    """Train the clean head and find its sensitivity. Cached in-process (ALM, Laplace and
    Gaussian protect the very same head) and, with ``context.cache_dir``, on disk by a hash
    of everything that determines it, so a resumed run does not redo Algorithm 2."""
    source = str(context.options.get("sensitivity", "sampled"))
    if source not in ("sampled", "analytic"):
        raise ValueError(f"sensitivity={source!r} is invalid: expected 'sampled' or 'analytic'")
    m = int(context.options.get("m", 200))
    gamma = float(context.options.get("gamma", 0.05))
    digest = tensor_digest(features, labels)
    key = (digest, seed, source, m, gamma, context.head, tuple(sorted(context.options.items())))
    if key in _PREPARED:
        return _PREPARED[key]
    path = None
    if context.cache_dir is not None:
        path = Path(context.cache_dir) / f"posthoc-head-{config_hash(repr(key))}.pt"
    payload = cached(
        path, kind="alm_opacus.posthoc-head", key=repr(key),
        compute=lambda: _prepare_payload(features, labels, seed=seed, context=context,
                                         source=source, m=m, gamma=gamma),
    )  # fmt: skip
    config = HeadConfig(**payload["config"])
    head = Head(in_features=int(features.shape[1]), num_classes=context.num_classes,
                config=config).to(context.device)  # fmt: skip
    head.load_state_dict(payload["state_dict"])
    prepared = PreparedHead(
        head=head, config=config,
        sensitivity={n: SensitivityInfo(**d) for n, d in payload["sensitivity"].items()},
        solver=payload["solver"], details=payload["details"],
    )  # fmt: skip
    _PREPARED[key] = prepared
    return prepared


def _prepare_payload(
    features: Tensor, labels: Tensor, *, seed: int, context: MethodContext, source: str, m: int,
    gamma: float,
) -> dict[str, Any]:  # fmt: skip
    """The clean head and its sensitivity, as a cacheable payload (tensors and primitives)."""
    x, y = features.to(context.device), labels.to(context.device)
    ones = torch.ones(1, len(y), dtype=torch.bool, device=x.device)
    sample: dict[str, Tensor] = {}
    if source == "analytic":
        config = convex_config(context)
        assert config.clip_radius is not None  # convex_config always sets it
        fit = train_convex_heads(x, y, masks=ones, num_classes=context.num_classes, config=config)
        params = fit.params
        bound = analytic_sensitivity(
            n=len(y), l2=config.l2, clip_radius=float(config.clip_radius), grad_tol=fit.tol,
            num_params=int(flat_params(fit.params).shape[1]),
        )  # fmt: skip
        info = {norm: bound.to_info(norm) for norm in ("l1", "l2")}
        details: dict[str, Any] = {"lipschitz": bound.lipschitz, "grad_tol": fit.tol,
                                   "l2": config.l2, "clip_radius": config.clip_radius}  # fmt: skip
        solver = "newton"
    else:
        config = context.head
        params = train_heads(x, y, masks=ones, num_classes=context.num_classes, config=config,
                             seed=seed)  # fmt: skip
        result = sample_sensitivity(
            x, y, num_classes=context.num_classes, config=config, seed=seed, m=m, gamma=gamma,
            progress=context.progress,
        )  # fmt: skip
        info = {norm: result.to_info(norm) for norm in ("l1", "l2")}
        details = {"m": m, "order": result.order, "gamma": result.gamma,
                   "confidence": result.confidence, "l1_max": float(result.l1.max()),
                   "l2_max": float(result.l2.max())}  # fmt: skip
        sample = {"l1": torch.from_numpy(result.l1), "l2": torch.from_numpy(result.l2),
                  "pairs": torch.from_numpy(result.pairs)}  # fmt: skip
        solver = "adam"
    head = Head.from_params(params, num_classes=context.num_classes, config=config)
    return {
        "config": dataclasses.asdict(config),
        "state_dict": {k: v.cpu() for k, v in head.state_dict().items()},
        "sensitivity": {n: _info_dict(i) for n, i in info.items()},
        "solver": solver,
        "details": details,
        "sample": sample,  # the whole sample of Algorithm 2, for plots
    }


def _info_dict(info: SensitivityInfo) -> dict[str, Any]:
    out = dataclasses.asdict(info)
    out["source"] = info.source.value
    return out


class PostTrainingMethod(Method):
    """Noise added once to the trained head's weights, calibrated to its sensitivity."""

    mechanism: ClassVar[str] = ""
    post_training = True

    def prepare(
        self, *, features: Tensor, labels: Tensor, seed: int, context: MethodContext
    ) -> Any:
        return prepare_head(features=features, labels=labels, seed=seed, context=context)

    def release(
        self, prepared: Any, *, features: Tensor, labels: Tensor, epsilon: float, delta: float,
        seed: int, draw: int, context: MethodContext,
    ) -> Release:  # fmt: skip
        assert isinstance(prepared, PreparedHead)
        mech = create_mechanism(self.mechanism)
        engine = PostTrainingPrivacyEngine(mechanism=mech)
        protected = engine.make_private(
            prepared.head, epsilon=epsilon, delta=0.0 if mech.pure else delta,
            sensitivity=prepared.sensitivity[mech.norm],
            seed=derive_seed(self.name, seed, draw, float(epsilon)),
        )  # fmt: skip
        return Release(
            method=self.name,
            statement=protected.statement,
            predict_proba=_predict(protected, context.device),
            module=protected,
            info={"solver": prepared.solver, **prepared.details},
        )

    def shadow_trainer(
        self, *, release: Release, epsilon: float, delta: float, context: MethodContext
    ) -> ShadowTrainer:
        """The adaptive attacker: shadow heads trained with the victim's recipe, then given
        noise of the released scale (the statement publishes it), drawn per head."""
        mech = create_mechanism(self.mechanism)
        scale = release.statement.noise_scale
        assert scale is not None
        solver = str(release.info.get("solver", "adam"))
        config = convex_config(context) if solver == "newton" else context.head

        def trainer(features: Tensor, labels: Tensor, masks: Tensor, seed: int) -> Predict:
            params = clean_shadow_heads(features, labels, masks=masks, seed=seed, config=config,
                                        solver=solver, num_classes=context.num_classes,
                                        cache_dir=context.cache_dir)  # fmt: skip
            generator = make_generator(seed=derive_seed("shadow-noise", self.name, seed, scale))
            noisy = {k: v + mech.sample(tuple(v.shape), scale=scale, generator=generator).to(v)
                     for k, v in sorted(params.items())}  # fmt: skip

            def predict(x: Tensor) -> Tensor:
                with torch.no_grad():
                    return torch.softmax(batched_logits(noisy, x, config=config), -1).float()

            return predict

        return trainer


_CLEAN_SHADOWS: dict[tuple[Any, ...], dict[str, Tensor]] = {}


def clean_shadow_heads(
    features: Tensor, labels: Tensor, *, masks: Tensor, seed: int, config: HeadConfig,
    solver: str, num_classes: int, cache_dir: Path | None = None,
) -> dict[str, Tensor]:  # fmt: skip
    """The attacker's shadow heads before noise. Post-training noise does not change how
    they are trained, so every epsilon and mechanism reuses them (cached in-process and, with
    ``cache_dir``, on disk by a hash of everything that determines them)."""
    key = (
        tensor_digest(features, labels, masks),
        seed, config, solver, num_classes,
    )  # fmt: skip
    if key not in _CLEAN_SHADOWS:

        def train() -> dict[str, Tensor]:
            if solver == "newton":
                return train_convex_heads(features, labels, masks=masks, num_classes=num_classes,
                                          config=config).params  # fmt: skip
            return train_heads(features, labels, masks=masks, num_classes=num_classes,
                               config=config, seed=seed)  # fmt: skip

        path = None if cache_dir is None else (
            Path(cache_dir) / f"shadow-heads-{config_hash(repr(key))}.pt"
        )  # fmt: skip
        _CLEAN_SHADOWS[key] = cached(path, kind="alm_opacus.shadow-heads", key=repr(key),
                                     compute=train)  # fmt: skip
    return _CLEAN_SHADOWS[key]


def _predict(module: ProtectedModule, device: str) -> Predict:
    def predict(x: Tensor) -> Tensor:
        with torch.no_grad():
            return torch.softmax(module(x.to(device)), -1).float().cpu()

    return predict


def _register(name: str, mechanism: str, doc: str) -> None:
    cls = type(
        f"{name.title().replace('-', '')}Method", (PostTrainingMethod,),
        {"name": name, "mechanism": mechanism, "__doc__": doc},
    )  # fmt: skip
    register_method(name)(cls)


_register("alm", "alm", "The additive logistic mechanism (ALM paper), L1 sensitivity.")
_register("laplace", "laplace", "The Laplace mechanism, L1 sensitivity.")
_register("gaussian", "gaussian", "The analytic Gaussian mechanism (Balle & Wang 2018), L2.")
_register(
    "gaussian-classic", "gaussian-classic",
    "The textbook Gaussian sigma, kept to reproduce the ALM paper (proven for epsilon < 1).",
)  # fmt: skip
