"""Privacy statements, and the post-training privacy engine (ALM paper, Algorithm 1).

A :class:`PrivacyStatement` travels with every release. Its constructor refuses any
combination that would claim more than is proven, e.g. ``pure-dp`` with a sampled
sensitivity, or ``approx-dp`` with ``delta == 0``.
"""

from __future__ import annotations

import copy
import enum
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from alm_opacus._validation import check_sensitivity
from alm_opacus.io import atomic_torch_save
from alm_opacus.mechanisms import AdditiveNoiseMechanism, create_mechanism, make_generator
from alm_opacus.mechanisms.gaussian import ClassicGaussianMechanism


class Guarantee(str, enum.Enum):
    """The kind of guarantee a release carries (strongest first)."""

    PURE_DP = "pure-dp"
    APPROX_DP = "approx-dp"
    RANDOM_DP = "random-dp"  # sensitivity sampled: holds with a confidence (Rubinstein & Aldà 2017)
    PER_QUERY = "per-query"  # each answer is DP; the released model as a whole is not
    NONE = "none"


class SensitivitySource(str, enum.Enum):
    ANALYTIC = "analytic"
    SAMPLED = "sampled"


@dataclass(frozen=True)
class SensitivityInfo:
    """Where a sensitivity came from.

    Attributes:
        value: the sensitivity used for calibration.
        norm: ``"l1"`` or ``"l2"``.
        source: analytic bound, or sampled by Algorithm 2.
        m: number of sampled neighbour pairs (sampled only).
        gamma: the probability that the sampled sensitivity is exceeded by a fresh
            neighbour pair (sampled only); the release is (epsilon, gamma)-random-DP.
        confidence: the probability, over the sampler's randomness, that gamma holds
            (sampled only).
        adjacency: ``"replace-one"`` or ``"remove-one"``.
    """

    value: float
    norm: str
    source: SensitivitySource
    m: int | None = None
    gamma: float | None = None
    confidence: float | None = None
    adjacency: str = "replace-one"

    def __post_init__(self) -> None:
        if not (math.isfinite(self.value) and self.value > 0):
            raise ValueError(f"sensitivity={self.value!r} is invalid: expected a finite number > 0")
        if self.norm not in ("l1", "l2"):
            raise ValueError(f"norm={self.norm!r} is invalid: expected 'l1' or 'l2'")
        object.__setattr__(self, "source", SensitivitySource(self.source))
        if self.source is SensitivitySource.SAMPLED:
            for name in ("m", "gamma", "confidence"):
                if getattr(self, name) is None:
                    raise ValueError(f"a sampled sensitivity needs {name}; got None")
            assert self.gamma is not None and self.confidence is not None
            if not (0 < self.gamma < 1 and 0 < self.confidence < 1):
                raise ValueError(
                    f"gamma={self.gamma!r}, confidence={self.confidence!r}: expected both in (0, 1)"
                )


@dataclass(frozen=True)
class PrivacyStatement:
    """What a release may honestly claim.

    Attributes:
        epsilon: the privacy parameter (``inf`` for ``none``).
        delta: 0 for pure-DP; the failure probability for approx-DP.
        guarantee: see :class:`Guarantee`.
        mechanism: registry name of the mechanism or method that produced the release.
        noise_scale: the scale parameter of the noise (``b``, ``s`` or ``sigma``).
        sensitivity: provenance of the sensitivity, if one was used.
        notes: caveats a reader must see (e.g. the actual delta of the classic Gaussian).
    """

    epsilon: float
    delta: float
    guarantee: Guarantee
    mechanism: str
    noise_scale: float | None = None
    sensitivity: SensitivityInfo | None = None
    notes: tuple[str, ...] = field(default_factory=tuple)

    def __post_init__(self) -> None:
        object.__setattr__(self, "guarantee", Guarantee(self.guarantee))
        object.__setattr__(self, "notes", tuple(self.notes))
        g = self.guarantee
        if math.isnan(self.epsilon) or self.epsilon <= 0:
            raise ValueError(f"epsilon={self.epsilon!r} is invalid: expected a number > 0")
        if math.isnan(self.delta) or not 0 <= self.delta < 1:
            raise ValueError(f"delta={self.delta!r} is invalid: expected a number in [0, 1)")
        if g is Guarantee.NONE:
            if self.epsilon != math.inf:
                raise ValueError("guarantee 'none' must state epsilon=inf")
            return
        if math.isinf(self.epsilon) and g is not Guarantee.NONE:
            raise ValueError(f"guarantee {g.value!r} needs a finite epsilon")
        sampled = (
            self.sensitivity is not None and self.sensitivity.source is SensitivitySource.SAMPLED
        )
        if sampled and g is not Guarantee.RANDOM_DP:
            raise ValueError(
                f"a sampled sensitivity only supports 'random-dp', not {g.value!r}: "
                "the bound holds with a confidence, not for every neighbouring pair"
            )
        if g is Guarantee.RANDOM_DP and not sampled:
            raise ValueError("'random-dp' is for sampled sensitivities; none was given")
        if g is Guarantee.PURE_DP and self.delta != 0:
            raise ValueError(f"'pure-dp' needs delta=0, got {self.delta!r}")
        if g is Guarantee.APPROX_DP and self.delta == 0:
            raise ValueError("'approx-dp' needs delta > 0; use 'pure-dp' for delta=0")

    @classmethod
    def unprotected(cls, *, mechanism: str = "none") -> PrivacyStatement:
        """The statement of a release with no protection."""
        return cls(epsilon=math.inf, delta=0.0, guarantee=Guarantee.NONE, mechanism=mechanism)

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["guarantee"] = self.guarantee.value
        out["notes"] = list(self.notes)
        if self.sensitivity is not None:
            out["sensitivity"]["source"] = self.sensitivity.source.value
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> PrivacyStatement:
        data = dict(data)
        sens = data.get("sensitivity")
        data["sensitivity"] = None if sens is None else SensitivityInfo(**sens)
        data["notes"] = tuple(data.get("notes", ()))
        return cls(**data)

    def __str__(self) -> str:
        g = self.guarantee
        if g is Guarantee.NONE:
            head = "no privacy guarantee"
        elif g is Guarantee.PURE_DP:
            head = f"{self.epsilon:g}-DP (pure)"
        elif g is Guarantee.APPROX_DP:
            head = f"({self.epsilon:g}, {self.delta:g})-DP"
        elif g is Guarantee.PER_QUERY:
            head = f"({self.epsilon:g}, {self.delta:g})-DP per query only"
        else:
            s = self.sensitivity
            assert s is not None
            head = (
                f"({self.epsilon:g}, gamma={s.gamma:g})-random-DP"
                + (f" with delta={self.delta:g}" if self.delta else "")
                + f", holding with confidence {s.confidence:g} over the sensitivity sampler"
            )
        parts = [f"{head}; mechanism={self.mechanism}"]
        if self.noise_scale is not None:
            parts.append(f"noise scale={self.noise_scale:.6g}")
        if self.sensitivity is not None:
            s = self.sensitivity
            extra = f", m={s.m}" if s.m is not None else ""
            parts.append(
                f"{s.norm.upper()} sensitivity={s.value:.6g} ({s.source.value}, "
                f"{s.adjacency}{extra})"
            )
        parts.extend(self.notes)
        return "; ".join(parts)


# --- the post-training privacy engine (ALM paper, Algorithm 1) -------------------------------

RELEASE_KIND = "alm_opacus.protected-module"


class ProtectedModule(nn.Module):
    """A released copy of a module whose selected parameters carry noise drawn once.

    Queries spend no budget: the noise is fixed at release time (ALM paper, Algorithm 1),
    so any number of forward passes is post-processing. Its ``state_dict()`` holds only the
    noisy weights; the clean weights stay with the owner's :class:`PostTrainingPrivacyEngine`.
    """

    def __init__(self, module: nn.Module, *, statement: PrivacyStatement,
                 protected: tuple[str, ...]) -> None:  # fmt: skip
        super().__init__()
        self.module = module
        self.statement = statement
        self.protected = protected

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self.module(*args, **kwargs)

    def save(self, path: str | Path) -> None:
        """Write the noisy weights and the statement, atomically."""
        atomic_torch_save(
            {
                "kind": RELEASE_KIND,
                "statement": self.statement.to_dict(),
                "protected": list(self.protected),
                "shapes": {k: list(v.shape) for k, v in self.module.state_dict().items()},
                "state_dict": self.module.state_dict(),
            },
            path,
        )

    @classmethod
    def load(cls, path: str | Path, *, module: nn.Module) -> ProtectedModule:
        """Load a saved release into ``module`` (an instance of the same architecture).

        Raises:
            ValueError: if the file is not a release, or its weights do not fit ``module``.
        """
        try:
            state = torch.load(path, map_location="cpu", weights_only=False)
        except Exception as exc:
            raise ValueError(f"{path}: not a readable release file ({exc})") from exc
        if not isinstance(state, dict) or state.get("kind") != RELEASE_KIND:
            raise ValueError(f"{path}: expected a file of kind {RELEASE_KIND!r}")
        expected = {k: list(v.shape) for k, v in module.state_dict().items()}
        if state["shapes"] != expected:
            diff = _shape_diff(state["shapes"], expected)
            raise ValueError(
                f"{path}: the release does not fit this architecture; mismatched "
                f"parameters (name: saved vs module): {'; '.join(diff)}"
            )
        target = copy.deepcopy(module)
        target.load_state_dict(state["state_dict"])
        return cls(target, statement=PrivacyStatement.from_dict(state["statement"]),
                   protected=tuple(state["protected"]))  # fmt: skip


def _shape_diff(saved: dict[str, list[int]], module: dict[str, list[int]]) -> list[str]:
    return [
        f"{k}: {saved.get(k, 'absent')} vs {module.get(k, 'absent')}"
        for k in sorted(set(saved) | set(module))
        if saved.get(k) != module.get(k)
    ]


def _as_sensitivity(sensitivity: float | SensitivityInfo, *, norm: str) -> SensitivityInfo:
    if isinstance(sensitivity, SensitivityInfo):
        if sensitivity.norm != norm:
            raise ValueError(
                f"sensitivity norm {sensitivity.norm!r} does not fit this mechanism, which is "
                f"calibrated to the {norm!r} sensitivity"
            )
        return sensitivity
    value = check_sensitivity(sensitivity)
    return SensitivityInfo(value=value, norm=norm, source=SensitivitySource.ANALYTIC)


class PostTrainingPrivacyEngine:
    """Protect a trained module once, with noise calibrated to its sensitivity.

    The owner keeps the clean module and may call :meth:`make_private` again at a new
    epsilon without retraining; each call returns an independent release.

    Example:
        >>> engine = PostTrainingPrivacyEngine(mechanism="alm")
        >>> release = engine.make_private(head, epsilon=1.0, sensitivity=info)  # doctest: +SKIP
        >>> release.statement.guarantee  # doctest: +SKIP
    """

    def __init__(self, *, mechanism: str | AdditiveNoiseMechanism = "alm",
                 secure_mode: bool = False) -> None:  # fmt: skip
        self.mechanism = create_mechanism(mechanism) if isinstance(mechanism, str) else mechanism
        self.secure_mode = secure_mode

    def make_private(
        self,
        module: nn.Module,
        *,
        epsilon: float,
        delta: float = 0.0,
        sensitivity: float | SensitivityInfo,
        parameters: Sequence[str] | None = None,
        seed: int | None = None,
    ) -> ProtectedModule:
        """Release a noisy copy of ``module`` with its :class:`PrivacyStatement`.

        Args:
            module: the trained module; it is not modified.
            epsilon: the privacy budget.
            delta: 0 for ALM and Laplace; > 0 for the Gaussian mechanisms.
            sensitivity: the sensitivity of the vector of ``parameters`` (all of them
                concatenated) in the mechanism's norm. A :class:`SensitivityInfo` says where
                it came from; a bare number is taken as an analytic bound the caller vouches for.
            parameters: names of the parameters to protect (default: all). The guarantee
                covers only these; every other parameter must not depend on private data.
            seed: seeds the noise; ``None`` requires ``secure_mode`` (OS entropy).

        Returns:
            The release, noise drawn once.

        Raises:
            ValueError: on invalid budgets, a sensitivity in the wrong norm, unknown
                parameter names, or no seed without ``secure_mode``.
        """
        mech = self.mechanism
        info = _as_sensitivity(sensitivity, norm=mech.norm)
        scale = mech.calibrate(epsilon=epsilon, delta=delta, sensitivity=info.value)
        statement = statement_for(mechanism=mech, epsilon=epsilon, delta=delta, scale=scale,
                                  sensitivity=info)  # fmt: skip
        release = copy.deepcopy(module)
        named = dict(release.named_parameters())
        names = tuple(named) if parameters is None else tuple(parameters)
        unknown = [n for n in names if n not in named]
        if unknown:
            raise ValueError(f"parameters {unknown} are not in the module; it has {list(named)}")
        generator = make_generator(seed=None if self.secure_mode else seed,
                                   secure_mode=self.secure_mode)  # fmt: skip
        with torch.no_grad():
            for name in names:
                p = named[name]
                noise = mech.sample(tuple(p.shape), scale=scale, generator=generator)
                p.add_(noise.to(device=p.device, dtype=p.dtype))
        return ProtectedModule(release, statement=statement, protected=names)


def statement_for(
    *, mechanism: AdditiveNoiseMechanism, epsilon: float, delta: float, scale: float,
    sensitivity: SensitivityInfo,
) -> PrivacyStatement:  # fmt: skip
    """What a one-shot release of ``mechanism`` at ``scale`` may claim.

    * sampled sensitivity: random-DP with the sampler's gamma and confidence;
    * analytic sensitivity: pure-DP (ALM, Laplace) or approximate DP (Gaussian);
    * the classic Gaussian outside its theorem (epsilon >= 1) states the delta its sigma
      actually achieves, from the exact Gaussian profile, and says so.
    """
    notes: list[str] = []
    claimed_delta = float(delta)
    if isinstance(mechanism, ClassicGaussianMechanism) and not mechanism.theorem_applies(
        epsilon=epsilon
    ):
        actual = mechanism.achieved_delta(epsilon=epsilon, scale=scale,
                                          sensitivity=sensitivity.value)  # fmt: skip
        claimed_delta = max(claimed_delta, actual)
        notes.append(
            f"textbook Gaussian sigma is proven only for epsilon < 1; at epsilon={epsilon:g} "
            f"it achieves delta={actual:.3g} (exact Gaussian profile), which is the delta stated"
        )
    if sensitivity.source is SensitivitySource.SAMPLED:
        guarantee = Guarantee.RANDOM_DP
        notes.append(
            "sensitivity sampled (ALM Algorithm 2): the bound may be exceeded by a fraction "
            f"gamma={sensitivity.gamma:g} of neighbouring datasets, and that holds with "
            f"confidence {sensitivity.confidence:g} (Rubinstein & Aldà 2017); this is not DP"
        )
    else:
        guarantee = Guarantee.PURE_DP if mechanism.pure else Guarantee.APPROX_DP
    return PrivacyStatement(
        epsilon=float(epsilon), delta=claimed_delta, guarantee=guarantee,
        mechanism=mechanism.name, noise_scale=float(scale), sensitivity=sensitivity,
        notes=tuple(notes),
    )  # fmt: skip
