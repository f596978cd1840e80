"""Privacy statements: what a release may claim, and nothing more.

A :class:`PrivacyStatement` travels with every release. Its constructor refuses any
combination that would claim more than is proven, e.g. ``pure-dp`` with a sampled
sensitivity, a guarantee from a sensitivity sampled on the private members, ``approx-dp``
with ``delta == 0``, ``pure-dp`` from Gaussian noise, or an epsilon below what the recorded
noise scale and sensitivity prove (`check_claim`). `describe` says a statement in plain words.
The guarantee kinds, the sensitivity's provenance and the claim rules live in
:mod:`alm_opacus.claims` (re-exported here).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from alm_opacus.claims import (
    _KIND_WORDS,
    _ORDER,
    CLAIM_TOLERANCE,
    NEIGHBOURING,
    NOISE_SOURCES,
    PROFILE_TOLERANCE,
    ClaimRule,
    Guarantee,
    SensitivityInfo,
    SensitivitySource,
    _enum,
    _fields_of,
    _is_real,
    check_claim,
    check_guarantee,
    register_claim_rule,
)

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
            included (the engine's ledger, `alm_opacus.posttraining.ledger`); ``None`` if not
            tracked.
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

    @classmethod
    def no_guarantee(
        cls, *, nominal_epsilon: float, notes: Sequence[str], **fields: Any
    ) -> PrivacyStatement:
        """Nothing claimed (epsilon = inf, delta = 0, no neighbouring relation) for a release
        whose noise was calibrated to ``nominal_epsilon``, kept for reference.

        Args:
            nominal_epsilon: the epsilon the noise was calibrated to.
            notes: why nothing is claimed, among the caveats.
            **fields: the statement's other fields (mechanism, noise scale, ...).
        """
        return cls(
            epsilon=math.inf,
            delta=0.0,
            guarantee=Guarantee.NONE,
            neighbouring="",
            nominal_epsilon=float(nominal_epsilon),
            notes=tuple(notes),
            **fields,
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
            if self.sensitivity.derivation is None:  # statements without one read as before
                del out["sensitivity"]["derivation"]
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
            extra += f", {s.derivation}" if s.derivation is not None else ""
            parts.append(
                f"{s.norm.upper()} sensitivity={s.value:.6g} ({s.source.value}, "
                f"{s.adjacency}{extra})"
            )
        parts.extend(self.notes)
        return "; ".join(parts)


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
