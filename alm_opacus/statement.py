"""Privacy statements: what a release may claim, and nothing more.

A :class:`PrivacyStatement` travels with every release. Its constructor refuses any
combination that would claim more than is proven, e.g. ``pure-dp`` with a sampled
sensitivity, a guarantee from a sensitivity sampled on the private members, ``approx-dp``
with ``delta == 0``, ``pure-dp`` from Gaussian noise, or an epsilon below what the recorded
noise scale and sensitivity prove (`check_claim`). `describe` says a statement in plain words.
"""

from __future__ import annotations

import enum
import math
import numbers
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields
from typing import Any, TypeVar

from alm_opacus.mechanisms import analysis
from alm_opacus.registry import Registry

__all__ = [
    "CLAIM_TOLERANCE",
    "NEIGHBOURING",
    "NOISE_SOURCES",
    "PROFILE_TOLERANCE",
    "ClaimRule",
    "Guarantee",
    "PrivacyStatement",
    "SensitivityInfo",
    "SensitivitySource",
    "check_claim",
    "check_guarantee",
    "describe",
    "register_claim_rule",
]


class Guarantee(str, enum.Enum):
    """The kind of guarantee a release carries (strongest first)."""

    PURE_DP = "pure-dp"
    APPROX_DP = "approx-dp"
    RANDOM_DP = "random-dp"  # sensitivity sampled: holds with a confidence (Rubinstein & Aldà 2017)
    PER_QUERY = "per-query"  # each answer is DP; the released model as a whole is not
    NONE = "none"


#: Guarantee kinds from strongest to weakest (the enum's order).
_ORDER = tuple(Guarantee)


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


def _is_real(value: object) -> bool:
    """Whether ``value`` is a real number (a bool or a string is not)."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


_E = TypeVar("_E", bound=enum.Enum)


def _enum(kind: type[_E], value: object, *, name: str) -> _E:
    """``kind(value)``, with a message that names the field and the values expected."""
    try:
        return kind(value)
    except ValueError:
        expected = [member.value for member in kind]
        raise ValueError(f"{name}={value!r} is invalid: expected one of {expected}") from None


def _fields_of(kind: type, data: object, *, what: str) -> dict[str, Any]:
    """``data`` as a dict of ``kind``'s fields, refusing anything else by name."""
    if not isinstance(data, dict) or not all(isinstance(k, str) for k in data):
        raise ValueError(f"{what}={data!r} is invalid: expected a mapping of field names to values")
    known = {f.name for f in fields(kind)}
    unknown = sorted(set(data) - known)
    if unknown:
        raise ValueError(f"{what} has unknown fields {unknown}; expected some of {sorted(known)}")
    return dict(data)


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
        if not (_is_real(self.value) and math.isfinite(self.value) and self.value > 0):
            raise ValueError(f"sensitivity={self.value!r} is invalid: expected a finite number > 0")
        if self.norm not in ("l1", "l2"):
            raise ValueError(f"norm={self.norm!r} is invalid: expected 'l1' or 'l2'")
        object.__setattr__(self, "source", _enum(SensitivitySource, self.source, name="source"))
        if not isinstance(self.adjacency, str) or self.adjacency not in _RELATION:
            raise ValueError(
                f"adjacency={self.adjacency!r} is invalid: expected one of {sorted(_RELATION)}"
            )
        if self.population is not None and not isinstance(self.population, str):
            raise ValueError(f"population={self.population!r} is invalid: expected a string")
        if self.source not in (SensitivitySource.SAMPLED, SensitivitySource.SAMPLED_MEMBERS):
            # m, gamma and confidence qualify a sampled bound; on any other source they mean
            # an edited or inconsistent record, which must not pass as a proven bound
            extra = [n for n in ("m", "gamma", "confidence") if getattr(self, n) is not None]
            if extra:
                raise ValueError(
                    f"{', '.join(f'{n}={getattr(self, n)!r}' for n in extra)} given for a "
                    f"sensitivity of source {self.source.value!r}: expected None (only sampled "
                    "sensitivities have m, gamma and confidence)"
                )
            return
        for name in ("m", "gamma", "confidence"):
            if getattr(self, name) is None:
                raise ValueError(f"a sampled sensitivity needs {name}; got None")
        m = self.m
        if isinstance(m, bool) or not isinstance(m, numbers.Integral) or m < 1:
            raise ValueError(f"m={m!r} is invalid: expected an integer ≥ 1 (sampled pairs)")
        for name in ("gamma", "confidence"):
            value = getattr(self, name)
            if not (_is_real(value) and 0 < value < 1):
                raise ValueError(f"{name}={value!r} is invalid: expected a number in (0, 1)")


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
            included (the engine's ledger, `alm_opacus.ledger`); ``None`` if not tracked.
        delta_spent: total delta spent likewise.
        guarantee_spent: the kind of that total: the weakest kind among the releases (a
            random-DP release makes the total random DP); ``None`` if not tracked.
        gamma_spent: for a random-DP total, the summed gamma of its random-DP releases.
        confidence_spent: for a random-DP total, the confidence that every gamma holds.
        neighbouring_spent: the relation of the total.
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
    guarantee_spent: Guarantee | None = None
    gamma_spent: float | None = None
    confidence_spent: float | None = None
    neighbouring_spent: str = ""
    unprotected_parameters: tuple[str, ...] = ()
    grid: float | None = None
    clamp: float | None = None
    grid_sensitivity: float | None = None

    def __post_init__(self) -> None:
        self._check_types()
        self._check_grid()
        object.__setattr__(self, "guarantee", _enum(Guarantee, self.guarantee, name="guarantee"))
        object.__setattr__(self, "notes", tuple(self.notes))
        object.__setattr__(self, "unprotected_parameters", tuple(self.unprotected_parameters))
        if self.guarantee_spent is not None:
            total = _enum(Guarantee, self.guarantee_spent, name="guarantee_spent")
            object.__setattr__(self, "guarantee_spent", total)
        self._check_spent()
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
        info = self.sensitivity
        check_guarantee(guarantee=g, delta=self.delta, source=None if info is None else info.source)
        # The one place a claim meets its noise. For a release on a grid (issue 19) pass the
        # sensitivity the scale was calibrated to (the clean one plus the grid's inflation).
        check_claim(
            mechanism=self.mechanism,
            guarantee=g,
            epsilon=self.epsilon,
            delta=self.delta,
            scale=self.noise_scale,
            sensitivity=None if info is None else info.value,
            norm=None if info is None else info.norm,
        )

    def _check_types(self) -> None:
        """Every field has its type: a number where a number belongs (never a string or a
        bool), strings where strings belong, so that the checks after it compare like with
        like and an edited field is refused by name."""
        for name in ("epsilon", "delta"):
            if not _is_real(getattr(self, name)):
                raise ValueError(f"{name}={getattr(self, name)!r} is invalid: expected a number")
        optional = (
            "noise_scale",
            "nominal_epsilon",
            "epsilon_spent",
            "delta_spent",
            "gamma_spent",
            "confidence_spent",
            "grid",
            "clamp",
            "grid_sensitivity",
        )
        for name in optional:
            value = getattr(self, name)
            if value is not None and not _is_real(value):
                raise ValueError(f"{name}={value!r} is invalid: expected a number or None")
        for name in ("noise_scale", "nominal_epsilon", "epsilon_spent"):
            value = getattr(self, name)
            if value is not None and (math.isnan(value) or value <= 0):
                raise ValueError(f"{name}={value!r} is invalid: expected a number > 0")
        if self.delta_spent is not None and not self.delta_spent >= 0:
            raise ValueError(f"delta_spent={self.delta_spent!r} is invalid: expected a number ≥ 0")
        for name in ("mechanism", "neighbouring", "noise", "neighbouring_spent"):
            if not isinstance(getattr(self, name), str):
                raise ValueError(f"{name}={getattr(self, name)!r} is invalid: expected a string")
        for name in ("notes", "unprotected_parameters"):
            value = getattr(self, name)
            if (
                isinstance(value, str)
                or not isinstance(value, (tuple, list))
                or not all(isinstance(item, str) for item in value)
            ):
                raise ValueError(f"{name}={value!r} is invalid: expected a list of strings")
        if self.sensitivity is not None and not isinstance(self.sensitivity, SensitivityInfo):
            raise ValueError(
                f"sensitivity={self.sensitivity!r} is invalid: expected a SensitivityInfo or None"
            )

    def _check_spent(self) -> None:
        total = self.guarantee_spent
        if self.neighbouring_spent not in ("", *NEIGHBOURING):
            raise ValueError(
                f"neighbouring_spent={self.neighbouring_spent!r} is invalid: expected one of "
                f"{NEIGHBOURING}"
            )
        if total is None:
            return
        if _ORDER.index(total) < _ORDER.index(self.guarantee):
            raise ValueError(
                f"guarantee_spent={total.value!r} is stronger than this release's "
                f"{self.guarantee.value!r}: a total is never stronger than a release in it"
            )
        if total is Guarantee.RANDOM_DP:
            for name in ("gamma_spent", "confidence_spent"):
                value = getattr(self, name)
                if value is None or not 0 < value < 1:
                    raise ValueError(
                        f"{name}={value!r} is invalid for a random-DP total: expected (0, 1)"
                    )

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
        return cls(
            epsilon=math.inf,
            delta=0.0,
            guarantee=Guarantee.NONE,
            mechanism=mechanism,
            neighbouring="",
        )

    @property
    def seeded(self) -> bool:
        """Whether the noise came from a seeded generator (replayable by whoever has the seed)."""
        return self.noise == "seeded"

    def to_dict(self) -> dict[str, Any]:
        """The statement as plain data (JSON-able; loadable with ``weights_only=True``)."""
        out = asdict(self)
        out["guarantee"] = self.guarantee.value
        out["guarantee_spent"] = (
            None if self.guarantee_spent is None else self.guarantee_spent.value
        )
        out["notes"] = list(self.notes)
        out["unprotected_parameters"] = list(self.unprotected_parameters)
        if self.sensitivity is not None:
            out["sensitivity"]["source"] = self.sensitivity.source.value
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> PrivacyStatement:
        """Inverse of :meth:`to_dict`; statements saved before a field existed still load.

        Every field is checked as the constructor checks it, so an edited statement is
        refused rather than loaded as a stronger claim.

        Raises:
            ValueError: for data that is not a mapping, an unknown or missing field, a field
                of the wrong type, or a statement that claims too much.
        """
        data = _fields_of(cls, data, what="statement")
        missing = sorted({"epsilon", "delta", "guarantee", "mechanism"} - set(data))
        if missing:
            raise ValueError(f"statement lacks the fields {missing}: expected them all")
        sens = data.get("sensitivity")
        if sens is not None:
            what = "statement's sensitivity"
            sens = _fields_of(SensitivityInfo, sens, what=what)
            lacking = sorted({"value", "norm", "source"} - set(sens))
            if lacking:
                raise ValueError(f"{what} lacks the fields {lacking}: expected them all")
            data["sensitivity"] = SensitivityInfo(**sens)
        for name in ("notes", "unprotected_parameters"):
            value = data.get(name, ())
            if not isinstance(value, (list, tuple)):
                raise ValueError(f"{name}={value!r} is invalid: expected a list of strings")
            data[name] = tuple(value)
        if _enum(Guarantee, data["guarantee"], name="guarantee") is Guarantee.NONE:
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
            spent = (
                f"spent on this model so far: epsilon={self.epsilon_spent:g}, "
                f"delta={self.delta_spent or 0:g}"
            )
            total = self.guarantee_spent
            if total is Guarantee.RANDOM_DP:
                spent += (
                    f", gamma={self.gamma_spent:g} with confidence {self.confidence_spent:g}"
                    " (random-DP, not DP"
                )
            elif total is not None:
                spent += f" ({_KIND_WORDS[total]}"
            if total is not None:
                relation = self.neighbouring_spent
                spent += f" under {relation} neighbours)" if relation else ")"
            parts.append(spent)
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


_KIND_WORDS = {
    Guarantee.PURE_DP: "pure DP",
    Guarantee.APPROX_DP: "approximate DP",
    Guarantee.RANDOM_DP: "random-DP, not DP",
    Guarantee.PER_QUERY: "per query only",
    Guarantee.NONE: "no guarantee",
}


# --- what the noise proves: the constructor's check of a claim -------------------------------

#: Relative slack of `check_claim` for a pure claim (δ = 0): 4 units in the last place of
#: float64. The scale was computed as b = fl(Δ/ε) and the check computes fl(Δ/b), each a
#: correctly rounded division (relative error ≤ u = 2⁻⁵³), so an exact claim ε = Δ/b can
#: look at most (1 + u)² − 1 < 4u too strong; nothing larger is forgiven.
CLAIM_TOLERANCE = 4 * 2.0**-53
#: Relative slack for δ > 0, where the smallest ε is a root of a log-space privacy profile:
#: the inverses round it up (Brent to rtol 1e-14, then steps of 1e-13·ε, doubling, until the
#: computed δ is below the target: `alm_opacus.mechanisms.analysis`), and the computed
#: profile itself wobbles by ~1e-14 relative (log_ndtr, expm1), so the ε the calibration
#: reached can sit up to a few 1e-13 below the recomputed root; 2⁻⁴⁰ ≈ 9.1e-13 covers that.
PROFILE_TOLERANCE = 2.0**-40


@dataclass(frozen=True)
class ClaimRule:
    """What a mechanism's noise proves, to check a statement's claim against it.

    Attributes:
        pure: whether the noise can support pure DP (δ = 0) at all.
        norm: the sensitivity norm the noise is calibrated in (``"l1"``/``"l2"``).
        epsilon: ``(*, delta, scale, sensitivity) -> ε``, the smallest ε the noise proves at
            ``delta`` (rounded up); ``None`` when the statement does not record enough to
            compute it (composed DP-SGD steps).
        bound: the pure formula, for messages (e.g. ``"Delta_1 / b (Laplace)"``).
        profile: the profile used for δ > 0, for messages.
    """

    pure: bool
    norm: str | None = None
    epsilon: Callable[..., float] | None = None
    bound: str = ""
    profile: str = ""


#: What each mechanism's noise proves, by mechanism name.
CLAIM_RULES: Registry[ClaimRule] = Registry("claim rule")


def register_claim_rule(mechanism: str, rule: ClaimRule, *, force: bool = False) -> None:
    """Register what the noise of ``mechanism`` (a statement's ``mechanism`` up to " (")
    proves, so that `PrivacyStatement` refuses claims beyond it.

    Raises:
        ValueError: if ``mechanism`` is already registered and ``force`` is false.
    """
    CLAIM_RULES.add(mechanism, rule, force=force)


def check_guarantee(
    *, guarantee: Guarantee, delta: float, source: SensitivitySource | None
) -> None:
    """Refuse a guarantee that its sensitivity's source or its delta does not support.

    The kind rules of `PrivacyStatement` (which calls this), also applied to the rows of a
    resumed ``results.csv``: a sensitivity sampled on the members supports no guarantee; a
    sampled one supports only ``random-dp``, and ``random-dp`` needs one; an analytic or
    caller's bound (or none) supports ``pure-dp`` (delta = 0), ``approx-dp`` (delta > 0) and
    ``per-query``. ``none`` is always allowed.

    Raises:
        ValueError: naming the rule the combination breaks.
    """
    g = Guarantee(guarantee)
    if g is Guarantee.NONE:
        return
    if source is SensitivitySource.SAMPLED_MEMBERS:
        raise ValueError(
            "a sensitivity sampled on the private members supports no guarantee: the "
            "estimate depends on the members (state guarantee 'none')"
        )
    sampled = source is SensitivitySource.SAMPLED
    if sampled and g is not Guarantee.RANDOM_DP:
        raise ValueError(
            f"a sampled sensitivity only supports 'random-dp', not {g.value!r}: "
            "the bound holds with a confidence, not for every neighbouring pair"
        )
    if g is Guarantee.RANDOM_DP and not sampled:
        raise ValueError("'random-dp' is for sampled sensitivities; none was given")
    if g is Guarantee.PURE_DP and delta != 0:
        raise ValueError(f"'pure-dp' needs delta=0, got {delta!r}")
    if g is Guarantee.APPROX_DP and delta == 0:
        raise ValueError("'approx-dp' needs delta > 0; use 'pure-dp' for delta=0")


def _pure_epsilon(*, delta: float, scale: float, sensitivity: float) -> float:
    # A pure (Δ/b)-DP mechanism with nothing more known: the randomized-response profile,
    # which bounds every (Δ/b)-DP pair (Kairouz, Oh & Viswanath 2015).
    return analysis.pure_dp_epsilon(delta=delta, pure_epsilon=sensitivity / scale)


def check_claim(
    *,
    mechanism: str,
    guarantee: Guarantee,
    epsilon: float,
    delta: float,
    scale: float | None,
    sensitivity: float | None,
    norm: str | None,
) -> None:
    """Refuse a claim the noise does not prove (`PrivacyStatement` calls this).

    Reads the statement's ``mechanism``, ``guarantee``, ``epsilon``, ``delta``,
    ``noise_scale`` and ``sensitivity.value``/``.norm``. Mechanisms without a registered
    `ClaimRule` are not checked; claims without a recorded scale or sensitivity are checked
    for their kind only.

    - Kind: Gaussian noise (``gaussian``, ``gaussian-classic``, Gaussian DP-SGD) is never
      pure DP: its δ(ε) > 0 at every ε.
    - Norm: a mechanism calibrated in L1 needs an L1 sensitivity (an L2 bound is smaller).
    - Value: ε ≥ Δ₁/b (Laplace), Δ₁/s (ALM), Δ₂/b (the L2 Laplace of ``dperm``) for δ = 0,
      up to `CLAIM_TOLERANCE`; for δ > 0, ε ≥ the smallest ε of the noise's privacy profile
      at δ (analytic Gaussian, Balle & Wang 2018, Theorem 8; scalar Laplace and logistic;
      randomized response for the L2 Laplace), up to `PROFILE_TOLERANCE`.

    Raises:
        ValueError: naming the bound the claim exceeds.
    """
    rule = CLAIM_RULES.get(mechanism.split(" (")[0])
    if rule is None or guarantee in (Guarantee.NONE, Guarantee.PER_QUERY):
        return
    if not rule.pure and delta == 0:
        raise ValueError(
            f"mechanism={mechanism!r} adds Gaussian noise, whose delta(epsilon) > 0 at every "
            f"epsilon: a {guarantee.value!r} claim with delta=0 is never proven by it"
        )
    if rule.epsilon is None or scale is None or sensitivity is None:
        return
    if rule.norm is not None and norm != rule.norm:
        raise ValueError(
            f"mechanism={mechanism!r} is calibrated to an {rule.norm.upper()} sensitivity; "
            f"a {str(norm).upper()} sensitivity does not bound it"
        )
    proven = rule.epsilon(delta=delta, scale=scale, sensitivity=sensitivity)
    slack = CLAIM_TOLERANCE if delta == 0 else PROFILE_TOLERANCE
    if proven > epsilon * (1.0 + slack):
        how = rule.bound if delta == 0 else f"{rule.profile} at delta={delta!r}"
        raise ValueError(
            f"epsilon={epsilon!r} claims more than the noise proves: {how}, with scale "
            f"{scale!r} and sensitivity {sensitivity!r}, gives epsilon >= {proven!r} "
            f"(mechanism={mechanism!r})"
        )


_GAUSSIAN = ClaimRule(
    pure=False,
    norm="l2",
    epsilon=analysis.gaussian_epsilon,
    profile="the analytic Gaussian profile (Balle & Wang 2018, Theorem 8)",
)
# For delta > 0, ALM and Laplace use their scalar profiles: the least a release with this L1
# bound proves (a one-coordinate shift attains it; docs/accounting.md: also the most).
_LOGISTIC = ClaimRule(
    pure=True,
    norm="l1",
    epsilon=analysis.logistic_epsilon,
    bound="Delta_1 / s (ALM)",
    profile="the scalar logistic profile",
)
_GAUSSIAN_DPSGD = ClaimRule(pure=False)
for _name, _rule in {
    "alm": _LOGISTIC,
    "logistic": _LOGISTIC,
    "laplace": ClaimRule(
        pure=True,
        norm="l1",
        epsilon=analysis.laplace_epsilon,
        bound="Delta_1 / b (Laplace)",
        profile="the Laplace profile",
    ),
    "l2-laplace": ClaimRule(
        pure=True,
        norm="l2",
        epsilon=_pure_epsilon,
        bound="Delta_2 / b (L2 Laplace, Chaudhuri et al. 2011)",
        profile="the randomized-response profile of pure Delta_2 / b",
    ),
    "gaussian": _GAUSSIAN,
    "gaussian-classic": _GAUSSIAN,
    "lu-gaussian": _GAUSSIAN_DPSGD,
    "dp-sgd": _GAUSSIAN_DPSGD,
    "dp-sgd on encoder and head": _GAUSSIAN_DPSGD,
}.items():
    register_claim_rule(_name, _rule)


# --- plain words ------------------------------------------------------------------------------


def describe(statement: PrivacyStatement) -> str:
    """The statement in plain words, for tables and reports.

    Examples: ``"1-DP (pure), replace-one"``, ``"(1, 1e-05)-DP, add-remove"``,
    ``"random DP: not a DP guarantee, because ..."``, ``"no guarantee"``.
    """
    s, g = statement, statement.guarantee
    if g is Guarantee.NONE:
        return "no guarantee" + (
            f" (noise calibrated to a nominal epsilon={s.nominal_epsilon:g}, nothing proven)"
            if s.nominal_epsilon is not None
            else ""
        )
    if g is Guarantee.RANDOM_DP:
        info = s.sensitivity
        assert info is not None
        text = (
            f"random DP (epsilon={s.epsilon:g}"
            + (f", delta={s.delta:g}" if s.delta else "")
            + f", gamma={info.gamma:g}, {s.neighbouring}): not a DP guarantee, because the "
            f"sensitivity was sampled from {info.population or 'non-private data'} and bounds "
            f"all but a fraction {info.gamma:g} of neighbouring pairs drawn from it (with "
            f"confidence {info.confidence:g}); it covers pairs containing the real members only "
            "if the members are exchangeable with that population"
        )
    elif g is Guarantee.PER_QUERY:
        text = (
            f"({s.epsilon:g}, {s.delta:g})-DP per query, {s.neighbouring}: each answer only, "
            "no guarantee for the model"
        )
    elif g is Guarantee.PURE_DP:
        text = f"{s.epsilon:g}-DP (pure), {s.neighbouring}"
    else:
        text = f"({s.epsilon:g}, {s.delta:g})-DP, {s.neighbouring}"
    if s.sensitivity is not None and s.sensitivity.source is SensitivitySource.CALLER:
        text += ", if the caller's sensitivity bound holds"
    if s.seeded:
        text += ", only while the noise seed stays secret"
    if s.unprotected_parameters:
        text += f"; {', '.join(s.unprotected_parameters)} released without noise"
    return text
