"""One record per noise law, registered once: the mechanism and everything that depends on it.

A noise law (ALM's logistic, Laplace, the Gaussian) reaches every layer: the mechanism class
that calibrates and samples it (`alm_opacus.mechanisms`), its law rounded to a grid for exact
releases and DP-SGD steps (a `CellLaw`) with the compiled first pass of that law, the PLD of
one release and of one DP-SGD step (`alm_opacus.accounting`), and what its noise proves (a
`ClaimRule`). A `NoiseLaw` holds them all, and `register_noise_law` is the one place a law is
made known: it enters each part into the lookup of its layer (``MECHANISMS``, ``CELL_LAWS``,
``FIRST_PASS_FILLS``, ``RELEASE_PLDS``, ``STEP_PROFILES``, ``CLAIM_RULES``), all or none, so
the existing calls (`create_mechanism`, `cell_law`, `release_pld`, `step_pld`,
`PrivacyStatement`'s check, ...) answer for it.

This module assembles parts from the layers below it, so they never import it: the package
root declares it in the entry point group ``alm_opacus.noise_laws``
(`alm_opacus.registry.declare_builtins`), and each of those lookups imports that group on its
first miss: this module, which registers the built-in laws, then the plugins' modules, which
register theirs with `register_noise_law` (exported by `alm_opacus.plugin`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from alm_opacus.accounting.pld import (
    RELEASE_PLDS,
    ReleasePLDBuilder,
    _gaussian_pld,
    _laplace_pld,
    _logistic_pld,
)
from alm_opacus.accounting.subsampled import (
    GAUSSIAN_STEP_PROFILE,
    LAPLACE_STEP_PROFILE,
    LOGISTIC_STEP_PROFILE,
    STEP_PROFILES,
    StepProfile,
)
from alm_opacus.claims import (
    CLAIM_RULES,
    GAUSSIAN_CLAIM,
    LAPLACE_CLAIM,
    LOGISTIC_CLAIM,
    ClaimRule,
)
from alm_opacus.mechanisms.base import (
    MECHANISMS,
    NOISE_LAW_GROUP,
    AdditiveNoiseMechanism,
    NoiseLawPluginError,
    _load_noise_laws,
)
from alm_opacus.mechanisms.cell_laws import (
    CELL_LAWS,
    CellLaw,
    GaussianCells,
    LaplaceCells,
    LogisticCells,
)
from alm_opacus.mechanisms.gaussian import ClassicGaussianMechanism, GaussianMechanism
from alm_opacus.mechanisms.kernels import (
    FIRST_PASS_FILLS,
    FirstPassFill,
    _gaussian_x,
    _x_laplace,
    _x_logistic,
)
from alm_opacus.mechanisms.laplace import LaplaceMechanism
from alm_opacus.mechanisms.logistic import LogisticMechanism
from alm_opacus.registry import Registry

__all__ = [
    "NOISE_LAWS",
    "NOISE_LAW_GROUP",
    "NoiseLaw",
    "NoiseLawPluginError",
    "available_noise_laws",
    "register_noise_law",
]


@dataclass(frozen=True)
class NoiseLaw:
    """Everything the package needs to release, train and account with one noise law.

    Attributes:
        name: the canonical name (``mechanism.name``), as statements and ``results.csv``
            show it.
        mechanism: the `AdditiveNoiseMechanism` subclass that calibrates and samples it.
        cell_law: its law rounded to a grid, for exact releases and exact DP-SGD steps
            (``None``: floating-point noise only). Its ``name`` keys ``first_pass``.
        first_pass: the compiled first pass of the cell law (`kernels.FirstPassFill`);
            ``None`` takes the eager pass, which draws the same law.
        release_pld: ``(*, scale, sensitivity, dim, interval) -> PLD``, the pessimistic PLD
            of one release (``None``: the accountant refuses its releases).
        step_profile: how one Poisson-subsampled DP-SGD step becomes a PLD (``None``: not
            for DP-SGD).
        claim_rule: what its noise proves, checked against every statement that names it
            (``None``: claims are not checked).
        aliases: other names the mechanism and its claim rule answer to (``logistic``).
    """

    name: str
    mechanism: type[AdditiveNoiseMechanism]
    cell_law: CellLaw | None = None
    first_pass: FirstPassFill | None = None
    release_pld: ReleasePLDBuilder | None = None
    step_profile: StepProfile | None = None
    claim_rule: ClaimRule | None = None
    aliases: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not (
            isinstance(self.mechanism, type) and issubclass(self.mechanism, AdditiveNoiseMechanism)
        ):
            raise TypeError(
                f"mechanism={self.mechanism!r} is invalid: expected an AdditiveNoiseMechanism "
                "subclass"
            )
        if self.name != getattr(self.mechanism, "name", None):
            raise ValueError(
                f"name={self.name!r} is invalid: expected the mechanism's own name "
                f"{getattr(self.mechanism, 'name', None)!r} (lookups resolve aliases to it)"
            )
        if self.first_pass is not None and self.cell_law is None:
            raise ValueError(f"noise law {self.name!r} has a first pass but no cell law")
        for field, kind in (
            ("cell_law", CellLaw),
            ("step_profile", StepProfile),
            ("claim_rule", ClaimRule),
        ):
            part = getattr(self, field)
            if part is not None and not isinstance(part, kind):
                raise TypeError(f"{field}={part!r} is invalid: expected a {kind.__name__} or None")
        if self.step_profile is not None and self.step_profile.norm != self.mechanism.norm:
            raise ValueError(
                f"noise law {self.name!r}: its step profile clips in {self.step_profile.norm} "
                f"but the mechanism is calibrated in {self.mechanism.norm}"
            )
        if not isinstance(self.aliases, tuple) or not all(
            isinstance(a, str) and a for a in self.aliases
        ):
            raise ValueError(f"aliases={self.aliases!r} is invalid: expected a tuple of names")

    def _entries(self) -> list[tuple[Registry[Any], str, object]]:
        """(lookup, name, part) for every part this law registers."""
        out: list[tuple[Registry[Any], str, object]] = []
        for name in (self.name, *self.aliases):
            out.append((MECHANISMS, name, self.mechanism))
            if self.claim_rule is not None:
                out.append((CLAIM_RULES, name, self.claim_rule))
        if self.cell_law is not None:
            out.append((CELL_LAWS, self.name, self.cell_law))
            if self.first_pass is not None:
                out.append((FIRST_PASS_FILLS, self.cell_law.name, self.first_pass))
        if self.release_pld is not None:
            out.append((RELEASE_PLDS, self.name, self.release_pld))
        if self.step_profile is not None:
            out.append((STEP_PROFILES, self.name, self.step_profile))
        return out


#: Noise laws by canonical name.
NOISE_LAWS: Registry[NoiseLaw] = Registry("noise law", load=_load_noise_laws)


def register_noise_law(law: NoiseLaw, *, force: bool = False) -> NoiseLaw:
    """Make a noise law known to every layer: its mechanism, cell law, first pass, PLDs and
    claim rule under its name (the mechanism and claim rule under its aliases too).

    All or nothing: a name that any part's lookup holds for another object is refused before
    anything is registered.

    Args:
        law: the record.
        force: replace what is registered under the law's names.

    Returns:
        ``law``.

    Raises:
        TypeError: if ``law`` is not a `NoiseLaw`.
        ValueError: naming the lookup and name taken (without ``force``).
    """
    if not isinstance(law, NoiseLaw):
        raise TypeError(f"law={law!r} is invalid: expected a NoiseLaw")
    entries = [(NOISE_LAWS, law.name, law), *law._entries()]
    if not force:
        for registry, name, part in entries:
            # load=False: the built-ins are registered from inside a lookup's load hook
            held = registry.get(name, load=False)
            if held is not None and held is not part:
                raise ValueError(
                    f"noise law {law.name!r}: {registry.kind} {name!r} is already "
                    "registered; pass force=True"
                )
    for registry, name, part in entries:
        registry.add(name, part, force=force)
    return law


#: The laws this package ships, registered on import (the package declares this module in
#: :data:`NOISE_LAW_GROUP`, so a lookup's first miss imports it).
for _law in (
    NoiseLaw(
        name="alm",
        mechanism=LogisticMechanism,
        cell_law=LogisticCells(),
        first_pass=_x_logistic,
        release_pld=_logistic_pld,
        step_profile=LOGISTIC_STEP_PROFILE,
        claim_rule=LOGISTIC_CLAIM,
        aliases=("logistic",),
    ),
    NoiseLaw(
        name="laplace",
        mechanism=LaplaceMechanism,
        cell_law=LaplaceCells(),
        first_pass=_x_laplace,
        release_pld=_laplace_pld,
        step_profile=LAPLACE_STEP_PROFILE,
        claim_rule=LAPLACE_CLAIM,
    ),
    NoiseLaw(
        name="gaussian",
        mechanism=GaussianMechanism,
        cell_law=GaussianCells(),
        first_pass=_gaussian_x,
        release_pld=_gaussian_pld,
        step_profile=GAUSSIAN_STEP_PROFILE,
        claim_rule=GAUSSIAN_CLAIM,
    ),
    # The textbook σ of the same Gaussian noise: not for DP-SGD (no step profile).
    NoiseLaw(
        name="gaussian-classic",
        mechanism=ClassicGaussianMechanism,
        cell_law=GaussianCells(),
        release_pld=_gaussian_pld,
        claim_rule=GAUSSIAN_CLAIM,
    ),
):
    register_noise_law(_law)


def available_noise_laws() -> list[str]:
    """Canonical names of the registered noise laws (plugins included), sorted."""
    return NOISE_LAWS.names()
