"""Where a post-training method's sensitivity comes from: its options, and one finder per
``--sensitivity`` name, each training the clean head its bound covers.

* ``"sampled"`` (default): the victim's recipe retrained on neighbouring data sets of the
  members' size drawn from the public split (Rubinstein & Aldà's sampler; never the members);
  the statement is random-DP with the sampler's gamma and confidence, over that population.
* ``"sampled-members"``: Algorithm 2 on the members, as the ALM paper writes it; the estimate
  depends on the members and is published without noise, so no guarantee is stated.
* ``"analytic"``: the convex head (L2-regularised multinomial logistic regression on clipped
  features, trained to a certified gradient tolerance) and its proven bound
  (:mod:`alm_opacus.sensitivity.analytic`); pure-DP (ALM, Laplace) or approximate DP (Gaussian).
* ``"stability"``: the linear head trained by ``T`` full-batch gradient-descent steps from a
  data-independent start, and the bound uniform stability proves for it
  (:mod:`alm_opacus.sensitivity.stability`); pure or approximate DP, as ``analytic``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch
from torch import Tensor

from alm_opacus._validation import check_integer, check_positive
from alm_opacus.heads import HeadConfig, Params, flat_params, train_heads
from alm_opacus.method_base import MethodContext
from alm_opacus.options import MethodOptions, cli_option
from alm_opacus.posttraining.engine import SensitivityInfo
from alm_opacus.registry import Registry
from alm_opacus.sensitivity import (
    SensitivitySample,
    analytic_sensitivity,
    sample_population_sensitivity,
    sample_sensitivity,
    train_convex_heads,
)
from alm_opacus.sensitivity.stability import stability_sensitivity

__all__ = [
    "ANALYTIC_CLIP",
    "ANALYTIC_L2",
    "SENSITIVITY_SOURCES",
    "STABILITY_L2",
    "STABILITY_LR",
    "STABILITY_STEPS",
    "FoundSensitivity",
    "PostTrainingOptions",
    "convex_config",
    "stability_config",
]

#: The convex head's defaults for ``--sensitivity analytic`` (features are unit-norm already).
ANALYTIC_L2 = 0.1
ANALYTIC_CLIP = 1.0
#: The gradient-descent recipe's defaults for ``--sensitivity stability``: ``eta = 1`` keeps the
#: step map a contraction (``rho = 1 - eta lambda``) for unit-norm features (``beta = 1``).
STABILITY_STEPS = 100
STABILITY_LR = 1.0
STABILITY_L2 = 1e-3

SensitivitySourceName = Literal["sampled", "sampled-members", "analytic", "stability"]


@dataclass(frozen=True)
class PostTrainingOptions(MethodOptions):
    """Options of ``alm``, ``laplace``, ``gaussian`` and ``gaussian-classic``.

    Attributes:
        sensitivity: ``"sampled"``: neighbouring data sets of the members' size drawn from the
            public split (Rubinstein & Aldà's sampler; random-DP over that population);
            ``"sampled-members"``: Algorithm 2 on the members, as the ALM paper writes it (the
            estimate depends on the members: no guarantee, kept to reproduce the paper);
            ``"analytic"``: the convex head and its proven bound; ``"stability"``: the linear
            head after ``stability_steps`` full-batch gradient-descent steps, and its proven
            bound.
        m: neighbour pairs drawn by the sampler.
        gamma: the random-DP gamma of the sampled sensitivity.
        analytic_l2: lambda of the convex head the analytic bound covers.
        clip_radius: features are clipped to this L2 norm in the convex and the
            gradient-descent heads.
        stability_steps: ``T``, gradient-descent steps of the ``stability`` head.
        stability_lr: ``eta``, their step size.
        stability_l2: ``lambda`` of their objective (0 allowed).
    """

    sensitivity: SensitivitySourceName = cli_option(
        "sampled",
        help="sensitivity of the post-training mechanisms: sampled (neighbouring data sets "
        "drawn from the public split: random-DP), analytic (the convex head's proven bound: "
        "pure/approx DP), stability (a head trained by full-batch gradient descent and its "
        "proven bound: pure/approx DP), or sampled-members (the ALM paper's Algorithm 2 on "
        "the members: no guarantee, for reproducing the paper)",
    )
    m: int = cli_option(200, help="neighbour pairs drawn by the sensitivity sampler")
    gamma: float = 0.05
    analytic_l2: float = ANALYTIC_L2
    clip_radius: float = ANALYTIC_CLIP
    stability_steps: int = cli_option(
        STABILITY_STEPS, help="full-batch gradient-descent steps T of the stability head"
    )
    stability_lr: float = cli_option(
        STABILITY_LR, help="step size eta of the stability head's gradient descent"
    )
    stability_l2: float = cli_option(
        STABILITY_L2, help="L2 coefficient lambda of the stability head's objective (>= 0)"
    )

    def __post_init__(self) -> None:
        if self.m < 2:
            raise ValueError(f"m={self.m!r} is invalid: expected an integer >= 2")
        if not 0 < self.gamma < 1:
            raise ValueError(f"gamma={self.gamma!r} is invalid: expected a number in (0, 1)")
        check_positive(self.analytic_l2, name="analytic_l2")
        check_positive(self.clip_radius, name="clip_radius")
        check_integer(self.stability_steps, name="stability_steps")
        check_positive(self.stability_lr, name="stability_lr")
        if not self.stability_l2 >= 0:
            raise ValueError(
                f"stability_l2={self.stability_l2!r} is invalid: expected a number >= 0"
            )


@dataclass(frozen=True)
class FoundSensitivity:
    """A clean head (a batch of one) and its sensitivity in both norms.

    Attributes:
        config: the recipe that trained it (the attacker's shadow heads use it too).
        params: its parameters, with a leading dimension of 1.
        info: the sensitivity by norm (``"l1"``, ``"l2"``).
        details: what the statement's reader may want to check (constants, sampler counts).
        solver: the solver that trained it.
        sample: the sampler's whole sample (sampled sources), for plots.
    """

    config: HeadConfig
    params: Params
    info: dict[str, SensitivityInfo]
    details: dict[str, Any]
    solver: str
    sample: dict[str, Tensor] = field(default_factory=dict)


#: ``find(x, y, *, seed, context, options) -> FoundSensitivity``.
SensitivityFinder = Callable[..., FoundSensitivity]

#: The finders by ``--sensitivity`` name (:data:`SensitivitySourceName`).
SENSITIVITY_SOURCES: Registry[SensitivityFinder] = Registry("sensitivity")


def convex_config(head: HeadConfig, *, l2: float, clip_radius: float) -> HeadConfig:
    """The convex head the analytic bound covers: ``head``'s recipe as an L2-regularised
    linear head on clipped features, in float64 (also used by ``dperm``)."""
    return head.replace(
        kind="linear", l2=float(l2), clip_radius=float(clip_radius), dtype="float64"
    )


def stability_config(head: HeadConfig, *, options: PostTrainingOptions) -> HeadConfig:
    """The head the stability bound covers: ``head``'s recipe as a linear head on clipped
    features, trained in float64 by ``T`` full-batch gradient-descent steps."""
    return head.replace(
        kind="linear",
        solver="gd",
        steps=int(options.stability_steps),
        lr=float(options.stability_lr),
        l2=float(options.stability_l2),
        clip_radius=float(options.clip_radius),
        dtype="float64",
    )


def _all_rows(y: Tensor) -> Tensor:
    return torch.ones(1, len(y), dtype=torch.bool, device=y.device)


def _train(
    x: Tensor, y: Tensor, *, config: HeadConfig, context: MethodContext, seed: int
) -> Params:
    """One head on every member with ``config``, its start seeded by the run's seed (never by
    the data: neighbouring data sets share it)."""
    return train_heads(
        x, y, masks=_all_rows(y), num_classes=context.num_classes, config=config, seed=seed
    )


@SENSITIVITY_SOURCES.register("analytic")
def _analytic(
    x: Tensor, y: Tensor, *, seed: int, context: MethodContext, options: PostTrainingOptions
) -> FoundSensitivity:
    config = convex_config(context.head, l2=options.analytic_l2, clip_radius=options.clip_radius)
    assert config.clip_radius is not None  # convex_config always sets it
    fit = train_convex_heads(
        x, y, masks=_all_rows(y), num_classes=context.num_classes, config=config
    )
    bound = analytic_sensitivity(
        n=len(y),
        l2=config.l2,
        clip_radius=float(config.clip_radius),
        grad_tol=fit.tol,
        num_params=int(flat_params(fit.params).shape[1]),
    )
    return FoundSensitivity(
        config=config,
        params=fit.params,
        info={norm: bound.to_info(norm) for norm in ("l1", "l2")},
        details={
            "lipschitz": bound.lipschitz,
            "grad_tol": fit.tol,
            "l2": config.l2,
            "clip_radius": config.clip_radius,
        },
        solver="newton",
    )


@SENSITIVITY_SOURCES.register("stability")
def _stability(
    x: Tensor, y: Tensor, *, seed: int, context: MethodContext, options: PostTrainingOptions
) -> FoundSensitivity:
    config = stability_config(context.head, options=options)
    params = _train(x, y, config=config, context=context, seed=seed)
    bound = stability_sensitivity(
        n=len(y),
        steps=config.steps,
        lr=config.lr,
        l2=config.l2,
        clip_radius=float(options.clip_radius),
        num_features=int(x.shape[1]),
        num_classes=context.num_classes,
        dtype=config.dtype,
    )
    return FoundSensitivity(
        config=config,
        params=params,
        info={norm: bound.to_info(norm) for norm in ("l1", "l2")},
        details={
            "steps": bound.steps,
            "lr": bound.lr,
            "l2": bound.l2,
            "clip_radius": bound.clip_radius,
            "lipschitz": bound.lipschitz,
            "smoothness": bound.smoothness,
            "contraction": bound.contraction,
            "exact_l2": bound.exact_l2,
            "rounding_l2": bound.rounding_l2,
        },
        solver="gd",
    )


def _sampled_source(
    x: Tensor, y: Tensor, *, seed: int, context: MethodContext, options: PostTrainingOptions
) -> FoundSensitivity:
    config = context.head
    params = _train(x, y, config=config, context=context, seed=seed)
    result = _sample(x, y, seed=seed, context=context, options=options)
    return FoundSensitivity(
        config=config,
        params=params,
        info={norm: result.to_info(norm) for norm in ("l1", "l2")},
        details={
            "m": options.m,
            "order": result.order,
            "gamma": result.gamma,
            "confidence": result.confidence,
            "l1_max": float(result.l1.max()),
            "l2_max": float(result.l2.max()),
            "population": result.population or "the members (Algorithm 2)",
        },
        solver=config.solver,  # the recipe's (newton for a convex one), as train_heads ran it
        sample={
            "l1": torch.from_numpy(result.l1),
            "l2": torch.from_numpy(result.l2),
            "pairs": torch.from_numpy(result.pairs),
        },
    )


SENSITIVITY_SOURCES.add("sampled", _sampled_source)
SENSITIVITY_SOURCES.add("sampled-members", _sampled_source)


def _sample(
    x: Tensor, y: Tensor, *, seed: int, context: MethodContext, options: PostTrainingOptions
) -> SensitivitySample:
    """Algorithm 2 on the members (``sampled-members``), or Rubinstein & Aldà's sampler on
    the public split (``sampled``): pairs of the members' size, never touching the members."""
    common: dict[str, Any] = {
        "num_classes": context.num_classes,
        "config": context.head,
        "seed": seed,
        "m": options.m,
        "gamma": options.gamma,
        "progress": context.progress,
        "map_units": context.map_units,
    }
    if options.sensitivity == "sampled-members":
        return sample_sensitivity(x, y, **common)
    px, py = context.public_features, context.public_labels
    if px is None or py is None or len(px) < 2:
        have = 0 if px is None else len(px)
        raise ValueError(
            f"sensitivity='sampled' draws neighbouring data sets of the members' size "
            f"n={len(y)} from the public split, which has {have} rows (2 needed); use "
            "'analytic', 'stability', or 'sampled-members' (no guarantee)"
        )
    # the data set by name, never by the owner's path (features:PATH): statements are shared
    family, sep, argument = (context.dataset or "the dataset").partition(":")
    name = f"{family}:{Path(argument).name or argument}" if sep else family
    population = (
        f"the public split's empirical distribution ({len(px)} rows of "
        f"{name}, drawn with replacement)"
    )
    return sample_population_sensitivity(
        px.to(x.device), py.to(x.device), n=len(y), population=population, **common
    )
