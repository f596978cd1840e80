"""One privacy budget for a pipeline: DP-SGD steps and one-shot noisy releases, composed.

`PipelineAccountant` implements Opacus's ``IAccountant`` and is registered in Opacus's
accountant registry as ``"alm_pld"``, so ``PrivacyEngine(accountant="alm_pld")`` works once
``alm_opacus.accounting`` is imported.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Hashable, Mapping
from copy import deepcopy
from typing import Any

from opacus.accountants import IAccountant, create_accountant, register_accountant

from alm_opacus._validation import check_delta, check_epsilon, check_positive, check_sensitivity
from alm_opacus.accounting.pld import (
    _RELEASE_PLDS,
    DEFAULT_VALUE_DISCRETIZATION_INTERVAL,
    PrivacyLossDistribution,
    _check_sample_rate,
    _check_steps,
    compose,
    dpsgd_pld,
    release_pld,
)
from alm_opacus.mechanisms import create_mechanism
from alm_opacus.mechanisms.base import _check_dim

__all__ = ["ACCOUNTANT_NAME", "PipelineAccountant"]

ACCOUNTANT_NAME = "alm_pld"
_STATE_VERSION = 1


def _check_noise_multiplier(noise_multiplier: float) -> float:
    sigma = float(noise_multiplier)
    if not math.isfinite(sigma) or sigma < 0:
        raise ValueError(
            f"noise_multiplier={noise_multiplier!r} is invalid: expected a finite number ≥ 0"
        )
    return sigma


def _check_release(record: Mapping[str, Any]) -> dict[str, Any]:
    missing = {"mechanism", "scale", "sensitivity", "dim"} - set(record)
    if missing:
        raise ValueError(f"release record {dict(record)!r} is missing {sorted(missing)}")
    name = create_mechanism(record["mechanism"]).name
    if name not in _RELEASE_PLDS:
        raise ValueError(f"mechanism={record['mechanism']!r} has no registered PLD")
    return {
        "mechanism": name,
        "scale": check_positive(record["scale"], name="scale"),
        "sensitivity": check_sensitivity(record["sensitivity"]),
        "dim": _check_dim(record["dim"]),
    }


class PipelineAccountant(IAccountant):
    """PLD accountant for DP-SGD steps composed with one-shot additive-noise releases.

    ``history`` holds DP-SGD steps exactly as Opacus's ``prv`` accountant does,
    ``(noise_multiplier, sample_rate, num_steps)`` tuples with consecutive equal steps merged,
    so Opacus's own tools (``get_noise_multiplier``) can drive it. ``releases`` holds the
    one-shot releases. Every entry becomes a pessimistic dp_accounting PLD (see
    `alm_opacus.accounting.pld`) and the composition answers ε(δ) and δ(ε).

    All entries must use the same neighbouring relation: DP-SGD is accounted under add/remove
    of one example, so release sensitivities must be bounds for that relation too.
    """

    def __init__(self) -> None:
        super().__init__()
        self.history: list[tuple[float, float, int]] = []
        self.releases: list[dict[str, Any]] = []
        self._cache: tuple[Hashable, PrivacyLossDistribution | None] | None = None

    def step(self, *, noise_multiplier: float, sample_rate: float) -> None:
        """Record one DP-SGD step (Opacus's optimizer hook calls this).

        Args:
            noise_multiplier: σ ≥ 0 (0 means no privacy).
            sample_rate: Poisson sampling probability in (0, 1].

        Raises:
            ValueError: if an argument is out of range.
        """
        sigma = _check_noise_multiplier(noise_multiplier)
        q = _check_sample_rate(sample_rate)
        if self.history and self.history[-1][:2] == (sigma, q):
            self.history[-1] = (sigma, q, self.history[-1][2] + 1)
        else:
            self.history.append((sigma, q, 1))

    def record_release(
        self, *, mechanism: str, scale: float, sensitivity: float, dim: int | None = None
    ) -> None:
        """Record one release ``value + noise`` of a registered mechanism.

        Args:
            mechanism: mechanism name (aliases accepted; stored under the canonical name).
            scale: noise scale > 0.
            sensitivity: sensitivity in the mechanism's norm, > 0.
            dim: released coordinates; ``1`` allows the exact scalar PLD for pure
                mechanisms, ``None`` means any dimension (pure-DP bound).

        Raises:
            ValueError: if the mechanism is unknown or an argument is out of range.
        """
        self.releases.append(
            _check_release(
                {"mechanism": mechanism, "scale": scale, "sensitivity": sensitivity, "dim": dim}
            )
        )

    def privacy_loss_distribution(
        self, *, value_discretization_interval: float = DEFAULT_VALUE_DISCRETIZATION_INTERVAL
    ) -> PrivacyLossDistribution | None:
        """The composed pessimistic PLD; ``None`` when nothing was recorded.

        Raises:
            ValueError: if a DP-SGD step had noise_multiplier 0 (no finite PLD).
        """
        h = value_discretization_interval
        if self._noiseless():
            raise ValueError("noise_multiplier=0 was recorded: no finite privacy loss")
        # Opacus may assign ``history`` directly, so the cache is keyed on the contents.
        key = (
            h,
            tuple(map(tuple, self.history)),
            tuple(tuple(sorted(r.items())) for r in self.releases),
        )
        if self._cache is not None and self._cache[0] == key:
            return self._cache[1]
        plds = [
            dpsgd_pld(
                noise_multiplier=sigma, sample_rate=q, steps=n, value_discretization_interval=h
            )
            for sigma, q, n in self.history
        ]
        plds += [release_pld(**r, value_discretization_interval=h) for r in self.releases]
        composed = compose(plds)
        self._cache = (key, composed)
        return composed

    def get_epsilon(
        self,
        delta: float,
        *,
        value_discretization_interval: float = DEFAULT_VALUE_DISCRETIZATION_INTERVAL,
        **kwargs: Any,
    ) -> float:
        """Smallest ε (rounded up) for which everything recorded is (ε, δ)-DP.

        Args:
            delta: δ in [0, 1). At δ = 0 the answer is the sum of the pure-DP epsilons,
                or ``inf`` if any Gaussian noise was recorded.
            value_discretization_interval: PLD grid step; smaller is tighter and slower.
            **kwargs: ignored, as Opacus passes accountant-specific options through.

        Returns:
            ε ≥ 0, or ``inf``.

        Raises:
            ValueError: if ``delta`` is out of range.
        """
        target = check_delta(delta)
        if self._noiseless():
            return math.inf
        if target == 0.0:
            return self._pure_epsilon()
        pld = self.privacy_loss_distribution(
            value_discretization_interval=value_discretization_interval
        )
        return 0.0 if pld is None else float(pld.get_epsilon_for_delta(target))

    def get_delta(
        self,
        epsilon: float,
        *,
        value_discretization_interval: float = DEFAULT_VALUE_DISCRETIZATION_INTERVAL,
    ) -> float:
        """Smallest δ (rounded up) for which everything recorded is (ε, δ)-DP.

        Raises:
            ValueError: if ``epsilon`` is NaN, infinite or non-positive.
        """
        eps = check_epsilon(epsilon)
        if self._noiseless():
            return 1.0
        pld = self.privacy_loss_distribution(
            value_discretization_interval=value_discretization_interval
        )
        return 0.0 if pld is None else float(pld.get_delta_for_epsilon(eps))

    def __len__(self) -> int:
        """Number of DP-SGD steps plus number of releases (non-zero once budget is spent)."""
        return sum(n for _, _, n in self.history) + len(self.releases)

    @classmethod
    def mechanism(cls) -> str:
        return ACCOUNTANT_NAME

    def state_dict(self, destination: Any = None) -> Any:
        """Opacus's ``history`` and ``mechanism`` plus ``releases``; plain types only.

        Args:
            destination: mapping to fill; a new ``OrderedDict`` when ``None``.

        Returns:
            The filled mapping, loadable with ``torch.load(..., weights_only=True)``.
        """
        destination = super().state_dict(OrderedDict() if destination is None else destination)
        destination["releases"] = deepcopy(self.releases)
        destination["version"] = _STATE_VERSION
        return destination

    def load_state_dict(self, state_dict: Any) -> None:
        """Validate ``state_dict`` fully, then replace this accountant's state.

        Raises:
            ValueError: if the state is empty, comes from another accountant, or holds an
                invalid entry; the current state is then left unchanged.
        """
        if not state_dict:
            raise ValueError(f"state_dict={state_dict!r} is empty and cannot be loaded")
        kind = state_dict.get("mechanism")
        if kind != ACCOUNTANT_NAME:
            raise ValueError(
                f"state_dict of accountant mechanism={kind!r} cannot be loaded into "
                f"{type(self).__name__} (mechanism {ACCOUNTANT_NAME!r})"
            )
        missing = {"history", "releases"} - set(state_dict)
        if missing:
            raise ValueError(f"state_dict is missing {sorted(missing)}")
        history = []
        for entry in state_dict["history"]:
            if not isinstance(entry, tuple | list) or len(entry) != 3:
                raise ValueError(
                    f"history entry {entry!r} is invalid: expected "
                    "(noise_multiplier, sample_rate, num_steps)"
                )
            sigma, q, n = entry
            history.append((_check_noise_multiplier(sigma), _check_sample_rate(q), _check_steps(n)))
        releases = [_check_release(r) for r in state_dict["releases"]]
        self.history, self.releases = history, releases

    def _noiseless(self) -> bool:
        return any(sigma == 0.0 for sigma, _, _ in self.history)

    def _pure_epsilon(self) -> float:
        # Pure ε-DP composes exactly by summation (tight: attained by randomized response).
        if self.history or any(not create_mechanism(r["mechanism"]).pure for r in self.releases):
            return math.inf
        return math.fsum(r["sensitivity"] / r["scale"] for r in self.releases)


def _register() -> None:
    """Register into Opacus's registry; re-registering our own class (a reload) is allowed."""
    try:
        register_accountant(ACCOUNTANT_NAME, PipelineAccountant)
    except ValueError:
        existing = type(create_accountant(ACCOUNTANT_NAME))
        ours = (existing.__module__, existing.__qualname__) == (
            PipelineAccountant.__module__,
            PipelineAccountant.__qualname__,
        )
        if not ours:
            raise
        register_accountant(ACCOUNTANT_NAME, PipelineAccountant, force=True)


_register()
