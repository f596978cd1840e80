"""`AdditiveNoiseMechanism` and its name registry (Opacus's ``register_accountant`` style).

A noise law's mechanism class is registered with the law's other parts (a ``NoiseLaw``,
`alm_opacus.noise_laws`); `register_mechanism` remains for a class without them (it then has
no exact cells, accounting or claim rule).
"""

from __future__ import annotations

import abc
from typing import ClassVar, Literal

import torch

from alm_opacus._validation import check_delta, check_epsilon, check_positive, check_sensitivity
from alm_opacus.mechanisms import analysis
from alm_opacus.mechanisms.sampling import NoiseGenerator, Shape
from alm_opacus.registry import Registry, load_entry_points

__all__ = [
    "AdditiveNoiseMechanism",
    "PureAdditiveNoiseMechanism",
    "available_mechanisms",
    "create_mechanism",
    "register_mechanism",
]

Norm = Literal["l1", "l2"]
Guarantee = Literal["pure-dp", "approx-dp"]


def _check_dim(dim: int | None) -> int | None:
    if dim is not None and (isinstance(dim, bool) or not isinstance(dim, int) or dim < 1):
        raise ValueError(f"dim={dim!r} is invalid: expected None or an integer ≥ 1")
    return dim


class AdditiveNoiseMechanism(abc.ABC):
    """Releases ``value + noise``, noise i.i.d. per coordinate, calibrated to a sensitivity.

    Attributes:
        name: canonical registry name.
        norm: the sensitivity norm the guarantee uses, ``"l1"`` or ``"l2"``.
        pure: whether `calibrate` yields pure ε-DP (δ = 0).
    """

    name: ClassVar[str]
    norm: ClassVar[Norm]
    pure: ClassVar[bool]

    def calibrate(self, *, epsilon: float, delta: float, sensitivity: float) -> float:
        """Return the noise scale that makes a release with this sensitivity (ε, δ)-DP.

        Args:
            epsilon: target ε > 0.
            delta: target δ in [0, 1) (in (0, 1) for Gaussian mechanisms).
            sensitivity: the release's sensitivity in `norm`, > 0.

        Returns:
            The scale (logistic s, Laplace b, or Gaussian σ).

        Raises:
            ValueError: if an argument is NaN, infinite or out of range.
        """
        return self._calibrate(
            epsilon=check_epsilon(epsilon),
            delta=check_delta(delta, allow_zero=self.pure),
            sensitivity=check_sensitivity(sensitivity),
        )

    def sample(
        self,
        shape: Shape,
        *,
        scale: float,
        generator: NoiseGenerator,
        dtype: torch.dtype = torch.float64,
    ) -> torch.Tensor:
        """Draw i.i.d. noise of this mechanism, computed in float64 then cast to ``dtype``.

        Args:
            shape: output shape (an int or a sequence of ints).
            scale: noise scale > 0, as returned by `calibrate`.
            generator: source of randomness; see `make_generator`.
            dtype: output dtype.

        Returns:
            A tensor of the given shape on the generator's device.

        Raises:
            ValueError: if ``scale`` is not finite and positive or ``shape`` is invalid.
        """
        s = check_positive(scale, name="scale")
        return (s * self._standard_noise(shape, generator=generator)).to(dtype)

    def epsilon(
        self, *, delta: float, scale: float, sensitivity: float, dim: int | None = None
    ) -> float:
        """Smallest ε such that a release at this scale is (ε, δ)-DP.

        Args:
            delta: δ in [0, 1) (in (0, 1) for Gaussian mechanisms).
            scale: noise scale > 0.
            sensitivity: sensitivity in `norm`, > 0.
            dim: number of released coordinates. ``1`` gives the exact scalar profile;
                ``None`` (any dimension) gives a profile valid for every dimension.

        Returns:
            ε ≥ 0, rounded up.

        Raises:
            ValueError: if an argument is out of range.
        """
        return self._epsilon(
            delta=check_delta(delta, allow_zero=self.pure),
            scale=check_positive(scale, name="scale"),
            sensitivity=check_sensitivity(sensitivity),
            dim=_check_dim(dim),
        )

    def delta(
        self, *, epsilon: float, scale: float, sensitivity: float, dim: int | None = None
    ) -> float:
        """Smallest δ such that a release at this scale is (ε, δ)-DP.

        Args:
            epsilon: ε > 0.
            scale: noise scale > 0.
            sensitivity: sensitivity in `norm`, > 0.
            dim: as in `epsilon`.

        Returns:
            δ in [0, 1).

        Raises:
            ValueError: if an argument is out of range.
        """
        return self._delta(
            epsilon=check_epsilon(epsilon),
            scale=check_positive(scale, name="scale"),
            sensitivity=check_sensitivity(sensitivity),
            dim=_check_dim(dim),
        )

    def std(self, scale: float) -> float:
        """Standard deviation of one noise coordinate at this scale (to compare at equal noise).

        Raises:
            ValueError: if ``scale`` is not finite and positive.
        """
        return check_positive(scale, name="scale") * self._unit_std

    def guarantee(self, *, delta: float) -> Guarantee:
        """Kind of guarantee a release calibrated at this δ carries.

        Raises:
            ValueError: if ``delta`` is out of range for this mechanism.
        """
        check_delta(delta, allow_zero=self.pure)
        return "pure-dp" if self.pure else "approx-dp"

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r}, norm={self.norm!r})"

    _unit_std: ClassVar[float]

    @abc.abstractmethod
    def _calibrate(self, *, epsilon: float, delta: float, sensitivity: float) -> float: ...

    @abc.abstractmethod
    def _standard_noise(self, shape: Shape, *, generator: NoiseGenerator) -> torch.Tensor: ...

    @abc.abstractmethod
    def _epsilon(
        self, *, delta: float, scale: float, sensitivity: float, dim: int | None
    ) -> float: ...

    @abc.abstractmethod
    def _delta(
        self, *, epsilon: float, scale: float, sensitivity: float, dim: int | None
    ) -> float: ...


class PureAdditiveNoiseMechanism(AdditiveNoiseMechanism):
    """A mechanism that is pure (Δ₁/scale)-DP for any dimension, under L1 sensitivity.

    Profiles: with ``dim=1`` the exact scalar profile of the subclass; otherwise the profile
    of randomized response at ε₀ = Δ₁/scale, which bounds every ε₀-DP mechanism.
    """

    norm: ClassVar[Norm] = "l1"
    pure: ClassVar[bool] = True

    def _calibrate(self, *, epsilon: float, delta: float, sensitivity: float) -> float:
        # Pure calibration: delta is checked but unused, the release is (epsilon, 0)-DP.
        return sensitivity / epsilon

    def _epsilon(self, *, delta: float, scale: float, sensitivity: float, dim: int | None) -> float:
        if delta == 0.0:
            return sensitivity / scale
        if dim == 1:
            return self._scalar_epsilon(delta=delta, scale=scale, sensitivity=sensitivity)
        return analysis.pure_dp_epsilon(delta=delta, pure_epsilon=sensitivity / scale)

    def _delta(self, *, epsilon: float, scale: float, sensitivity: float, dim: int | None) -> float:
        if dim == 1:
            return self._scalar_delta(epsilon=epsilon, scale=scale, sensitivity=sensitivity)
        return analysis.pure_dp_delta(epsilon=epsilon, pure_epsilon=sensitivity / scale)

    @abc.abstractmethod
    def _scalar_epsilon(self, *, delta: float, scale: float, sensitivity: float) -> float: ...

    @abc.abstractmethod
    def _scalar_delta(self, *, epsilon: float, scale: float, sensitivity: float) -> float: ...


def _check_mechanism(name: str, mechanism: type[AdditiveNoiseMechanism]) -> None:
    if not (isinstance(mechanism, type) and issubclass(mechanism, AdditiveNoiseMechanism)):
        raise TypeError(f"mechanism={mechanism!r} is not an AdditiveNoiseMechanism subclass")


#: The entry point group of noise laws (`alm_opacus.noise_laws`): the package declares its
#: built-in laws' module there (`alm_opacus.registry.declare_builtins`), plugins theirs.
NOISE_LAW_GROUP = "alm_opacus.noise_laws"


class NoiseLawPluginError(ImportError):
    """A noise-law module (entry point of :data:`NOISE_LAW_GROUP`) that fails to import."""


def _load_noise_laws() -> None:
    """The load hook of every lookup a noise law's part is registered in: imports the
    modules that register laws. They assemble parts from the layers above this one
    (accounting, claims), so they are found through the entry point group, never named."""
    load_entry_points(
        NOISE_LAW_GROUP,
        what="noise law",
        error=NoiseLawPluginError,
        expected="a module that registers its noise laws on import",
    )


#: Mechanism classes by name (an alias may name an existing class): each noise law's, and
#: those of `register_mechanism`.
MECHANISMS: Registry[type[AdditiveNoiseMechanism]] = Registry(
    "mechanism", check=_check_mechanism, load=_load_noise_laws
)


def register_mechanism(
    name: str, mechanism: type[AdditiveNoiseMechanism], *, force: bool = False
) -> None:
    """Register a mechanism class under ``name`` (an alias may name an existing class).

    Args:
        name: registry name.
        mechanism: a concrete subclass of `AdditiveNoiseMechanism`.
        force: overwrite an existing registration.

    Raises:
        ValueError: if ``name`` is empty or already registered and ``force`` is false.
        TypeError: if ``mechanism`` is not an `AdditiveNoiseMechanism` subclass.
    """
    MECHANISMS.add(name, mechanism, force=force)


def create_mechanism(name: str) -> AdditiveNoiseMechanism:
    """Instantiate the mechanism registered under ``name``.

    Raises:
        ValueError: if ``name`` is not registered.
    """
    return MECHANISMS[name]()


def available_mechanisms() -> list[str]:
    """Sorted registered names, aliases included."""
    return MECHANISMS.names()
