"""Privacy statements: what a release may claim, and nothing more.

A :class:`PrivacyStatement` travels with every release. Its constructor refuses any
combination that would claim more than is proven, e.g. ``pure-dp`` with a sampled
sensitivity, a guarantee from a sensitivity sampled on the private members, or ``approx-dp``
with ``delta == 0``.
"""

from __future__ import annotations

import enum
import math
from dataclasses import asdict, dataclass, field, fields
from typing import Any

__all__ = [
    "NEIGHBOURING",
    "NOISE_SOURCES",
    "Guarantee",
    "PrivacyStatement",
    "SensitivityInfo",
    "SensitivitySource",
]


class Guarantee(str, enum.Enum):
    """The kind of guarantee a release carries (strongest first)."""

    PURE_DP = "pure-dp"
    APPROX_DP = "approx-dp"
    RANDOM_DP = "random-dp"  # sensitivity sampled: holds with a confidence (Rubinstein & Aldà 2017)
    PER_QUERY = "per-query"  # each answer is DP; the released model as a whole is not
    NONE = "none"


class SensitivitySource(str, enum.Enum):
    """Where a sensitivity came from, which decides what a release may claim."""

    ANALYTIC = "analytic"  # a proven bound: pure or approximate DP
    SAMPLED = "sampled"  # Algorithm 2 on non-private data from the population: random-DP
    SAMPLED_MEMBERS = "sampled-members"  # Algorithm 2 on the private members: no guarantee
    CALLER = "caller"  # a number the caller vouches for; the guarantee is conditional on it


#: Neighbouring relations of a guarantee: replace one record, or add/remove one record.
NEIGHBOURING = ("replace-one", "add-remove")
#: A sensitivity's adjacency and the relation of the guarantee it supports.
_RELATION = {"replace-one": "replace-one", "remove-one": "add-remove"}
#: How a release's noise was drawn.
NOISE_SOURCES = ("secure", "seeded")


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
        adjacency: ``"replace-one"`` or ``"remove-one"`` (a remove-one bound supports
            add/remove-one DP).
        population: for a sampled sensitivity, the data its neighbouring sets were drawn from.
    """

    value: float
    norm: str
    source: SensitivitySource
    m: int | None = None
    gamma: float | None = None
    confidence: float | None = None
    adjacency: str = "replace-one"
    population: str | None = None

    @property
    def neighbouring(self) -> str:
        """The neighbouring relation of the guarantee this bound supports."""
        return _RELATION[self.adjacency]

    def __post_init__(self) -> None:
        if not (math.isfinite(self.value) and self.value > 0):
            raise ValueError(f"sensitivity={self.value!r} is invalid: expected a finite number > 0")
        if self.norm not in ("l1", "l2"):
            raise ValueError(f"norm={self.norm!r} is invalid: expected 'l1' or 'l2'")
        object.__setattr__(self, "source", SensitivitySource(self.source))
        if self.adjacency not in _RELATION:
            raise ValueError(
                f"adjacency={self.adjacency!r} is invalid: expected one of {sorted(_RELATION)}"
            )
        if self.source in (SensitivitySource.SAMPLED, SensitivitySource.SAMPLED_MEMBERS):
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
        neighbouring: ``"replace-one"`` or ``"add-remove"``: the relation under which
            ``epsilon`` and ``delta`` hold (empty for ``none``).
        noise: ``"secure"`` (OS CSPRNG: nobody can replay it) or ``"seeded"`` (private only
            while the seed stays secret); empty when no noise was drawn.
        nominal_epsilon: the epsilon the noise was calibrated to when no guarantee holds
            (``none``), so a reader sees what was attempted; ``None`` otherwise.
        epsilon_spent: total epsilon spent so far on the same clean model, this release
            included (basic composition over the engine's ledger); ``None`` if not tracked.
        delta_spent: total delta spent likewise.
        unprotected_parameters: parameters released without noise, declared public by the
            caller (the guarantee does not cover them).
        grid: γ, the power-of-two grid of an exact release (every shipped value is a
            multiple of it; ``None`` for a floating-point or noiseless release).
        clamp: B, the largest |clean value| an exact release represents (larger ones were
            clamped before noise); ``None`` when nothing is clamped.
        grid_sensitivity: Δ', the sensitivity of the grid-rounded query that the noise was
            calibrated to (Δ plus what rounding adds: `docs/mechanisms.md`).
    """

    epsilon: float
    delta: float
    guarantee: Guarantee
    mechanism: str
    noise_scale: float | None = None
    sensitivity: SensitivityInfo | None = None
    notes: tuple[str, ...] = field(default_factory=tuple)
    neighbouring: str = "replace-one"
    noise: str = ""
    nominal_epsilon: float | None = None
    epsilon_spent: float | None = None
    delta_spent: float | None = None
    unprotected_parameters: tuple[str, ...] = ()
    grid: float | None = None
    clamp: float | None = None
    grid_sensitivity: float | None = None

    def __post_init__(self) -> None:
        self._check_grid()
        object.__setattr__(self, "guarantee", Guarantee(self.guarantee))
        object.__setattr__(self, "notes", tuple(self.notes))
        object.__setattr__(self, "unprotected_parameters", tuple(self.unprotected_parameters))
        if self.noise not in ("", *NOISE_SOURCES):
            raise ValueError(f"noise={self.noise!r} is invalid: expected one of {NOISE_SOURCES}")
        if self.neighbouring not in ("", *NEIGHBOURING):
            raise ValueError(
                f"neighbouring={self.neighbouring!r} is invalid: expected one of {NEIGHBOURING}"
            )
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
        if not self.neighbouring:
            raise ValueError(f"guarantee {g.value!r} needs its neighbouring relation")
        if self.sensitivity is not None and self.sensitivity.neighbouring != self.neighbouring:
            raise ValueError(
                f"neighbouring={self.neighbouring!r} but the sensitivity is a "
                f"{self.sensitivity.adjacency} bound (supports {self.sensitivity.neighbouring!r})"
            )
        if (
            self.sensitivity is not None
            and self.sensitivity.source is SensitivitySource.SAMPLED_MEMBERS
        ):
            raise ValueError(
                "a sensitivity sampled on the private members supports no guarantee: the "
                "estimate depends on the members (state guarantee 'none')"
            )
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

    def _check_grid(self) -> None:
        """An exact release's grid is a positive power of two, and its calibrated
        sensitivity is at least the sensitivity it inflates."""
        if self.grid is not None and not (
            math.isfinite(self.grid) and self.grid > 0 and math.frexp(self.grid)[0] == 0.5
        ):
            raise ValueError(f"grid={self.grid!r} is invalid: expected a power of two > 0")
        if self.clamp is not None and not self.clamp > 0:
            raise ValueError(f"clamp={self.clamp!r} is invalid: expected a number > 0")
        if self.grid_sensitivity is not None:
            floor = self.sensitivity.value if self.sensitivity is not None else 0.0
            if not (math.isfinite(self.grid_sensitivity) and self.grid_sensitivity >= floor):
                raise ValueError(
                    f"grid_sensitivity={self.grid_sensitivity!r} is invalid: expected a finite "
                    f"number ≥ the sensitivity {floor!r}"
                )

    @property
    def inflation(self) -> float | None:
        """(Δ' − Δ)/Δ: what grid rounding added to the sensitivity (``None`` if not exact)."""
        if self.grid_sensitivity is None or self.sensitivity is None:
            return None
        return self.grid_sensitivity / self.sensitivity.value - 1.0

    @classmethod
    def unprotected(cls, *, mechanism: str = "none") -> PrivacyStatement:
        """The statement of a release with no protection."""
        return cls(epsilon=math.inf, delta=0.0, guarantee=Guarantee.NONE, mechanism=mechanism,
                   neighbouring="")  # fmt: skip

    @property
    def seeded(self) -> bool:
        """Whether the noise came from a seeded generator (replayable by whoever has the seed)."""
        return self.noise == "seeded"

    def to_dict(self) -> dict[str, Any]:
        """The statement as plain data (JSON-able; loadable with ``weights_only=True``)."""
        out = asdict(self)
        out["guarantee"] = self.guarantee.value
        out["notes"] = list(self.notes)
        out["unprotected_parameters"] = list(self.unprotected_parameters)
        if self.sensitivity is not None:
            out["sensitivity"]["source"] = self.sensitivity.source.value
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> PrivacyStatement:
        """Inverse of :meth:`to_dict`; statements saved before a field existed still load.

        Raises:
            ValueError: for an unknown field or a statement that claims too much.
        """
        data = dict(data)
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"statement has unknown fields {unknown}; expected some of {known}")
        sens = data.get("sensitivity")
        data["sensitivity"] = None if sens is None else SensitivityInfo(**sens)
        data["notes"] = tuple(data.get("notes", ()))
        data["unprotected_parameters"] = tuple(data.get("unprotected_parameters", ()))
        if Guarantee(data["guarantee"]) is Guarantee.NONE:
            data.setdefault("neighbouring", "")
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
        if g is not Guarantee.NONE:
            head += f" under {self.neighbouring} neighbours"
        elif self.nominal_epsilon is not None:
            head += f" (noise calibrated to a nominal epsilon={self.nominal_epsilon:g})"
        parts = [f"{head}; mechanism={self.mechanism}"]
        if self.noise:
            parts.append(f"noise={self.noise}")
        if self.epsilon_spent is not None:
            parts.append(
                f"spent on this model so far: epsilon={self.epsilon_spent:g}, "
                f"delta={self.delta_spent or 0:g}"
            )
        if self.unprotected_parameters:
            parts.append(
                "released without noise (declared public): "
                + ", ".join(self.unprotected_parameters)
            )
        if self.noise_scale is not None:
            parts.append(f"noise scale={self.noise_scale:.6g}")
        if self.grid is not None:
            exact = f"exact on the released floats: grid 2^{math.frexp(self.grid)[1] - 1}"
            if self.clamp is not None:
                exact += f", clean values clamped to ±{self.clamp:.6g}"
            if self.grid_sensitivity is not None and self.inflation is not None:
                exact += (
                    f", noise calibrated to sensitivity {self.grid_sensitivity:.6g} "
                    f"(+{100 * self.inflation:.2f}% for rounding)"
                )
            parts.append(exact)
        if self.sensitivity is not None:
            s = self.sensitivity
            extra = f", m={s.m}" if s.m is not None else ""
            parts.append(
                f"{s.norm.upper()} sensitivity={s.value:.6g} ({s.source.value}, "
                f"{s.adjacency}{extra})"
            )
        parts.extend(self.notes)
        return "; ".join(parts)
