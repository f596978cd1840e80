"""What a privacy claim rests on, and what the noise proves.

The vocabulary of :mod:`alm_opacus.statement` (which re-exports every public name here): the
guarantee kinds (:class:`Guarantee`), where a sensitivity came from (:class:`SensitivityInfo`),
and the rules that check a claim against its noise (`check_guarantee` for the kind,
`check_claim` for the value, one :class:`ClaimRule` per mechanism). Kept below the statement
so that the rules and the kinds can be read, registered and tested without it.
"""

from __future__ import annotations

import enum
import math
import numbers
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any, TypeVar

from alm_opacus.mechanisms import analysis
from alm_opacus.mechanisms.base import _load_noise_laws
from alm_opacus.registry import Registry

__all__ = [
    "CLAIM_RULES",
    "CLAIM_TOLERANCE",
    "NEIGHBOURING",
    "NOISE_SOURCES",
    "PROFILE_TOLERANCE",
    "ClaimRule",
    "Guarantee",
    "SensitivityInfo",
    "SensitivitySource",
    "check_claim",
    "check_guarantee",
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
        derivation: for a proven bound, the recipe it covers and where it is derived (e.g.
            ``--sensitivity stability``'s gradient-descent head); None when not recorded.
    """

    value: float
    norm: str
    source: SensitivitySource
    m: int | None = None
    gamma: float | None = None
    confidence: float | None = None
    adjacency: str = "replace-one"
    population: str | None = None
    derivation: str | None = None

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
        for name in ("population", "derivation"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, str):
                raise ValueError(f"{name}={value!r} is invalid: expected a string or None")
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
        if self.derivation is not None:
            raise ValueError(
                f"derivation={self.derivation!r} given for a sensitivity of source "
                f"{self.source.value!r}: expected None (a sampled bound has no derivation)"
            )
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


#: What each mechanism's noise proves, by mechanism name: each noise law's (with its aliases,
#: `alm_opacus.noise_laws`), and those of `register_claim_rule` (the baselines' noise).
CLAIM_RULES: Registry[ClaimRule] = Registry("claim rule", load=_load_noise_laws)


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
            f"mechanism={mechanism!r} is not pure DP (its noise's delta(epsilon) > 0 at every "
            f"epsilon, as Gaussian noise's): a {guarantee.value!r} claim with delta=0 is never "
            "proven by it"
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


# The built-in laws' rules are registered with their laws (`alm_opacus.noise_laws`).
GAUSSIAN_CLAIM = ClaimRule(
    pure=False,
    norm="l2",
    epsilon=analysis.gaussian_epsilon,
    profile="the analytic Gaussian profile (Balle & Wang 2018, Theorem 8)",
)
# For delta > 0, ALM and Laplace use their scalar profiles: the least a release with this L1
# bound proves (a one-coordinate shift attains it; docs/accounting.md: also the most).
LOGISTIC_CLAIM = ClaimRule(
    pure=True,
    norm="l1",
    epsilon=analysis.logistic_epsilon,
    bound="Delta_1 / s (ALM)",
    profile="the scalar logistic profile",
)
LAPLACE_CLAIM = ClaimRule(
    pure=True,
    norm="l1",
    epsilon=analysis.laplace_epsilon,
    bound="Delta_1 / b (Laplace)",
    profile="the Laplace profile",
)
_GAUSSIAN_DPSGD = ClaimRule(pure=False)
for _name, _rule in {
    "l2-laplace": ClaimRule(
        pure=True,
        norm="l2",
        epsilon=_pure_epsilon,
        bound="Delta_2 / b (L2 Laplace, Chaudhuri et al. 2011)",
        profile="the randomized-response profile of pure Delta_2 / b",
    ),
    "lu-gaussian": _GAUSSIAN_DPSGD,
    "dp-sgd": _GAUSSIAN_DPSGD,
    "dp-sgd on encoder and head": _GAUSSIAN_DPSGD,
}.items():
    register_claim_rule(_name, _rule)
