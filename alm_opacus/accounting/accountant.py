"""One privacy budget for a pipeline: DP-SGD steps and one-shot noisy releases, composed.

`PipelineAccountant` implements Opacus's ``IAccountant`` and is registered in Opacus's
accountant registry as ``"alm_pld"`` (on import of ``alm_opacus.accounting``, or explicitly
with `register`), so ``opacus.PrivacyEngine(accountant="alm_pld")`` works.
"""

from __future__ import annotations

import functools
import itertools
import math
from collections import OrderedDict
from collections.abc import Callable
from copy import deepcopy
from typing import Any

from opacus.accountants import IAccountant, create_accountant, register_accountant

from alm_opacus._validation import check_delta, check_epsilon
from alm_opacus.accounting.divergence import pld_delta, pld_epsilon
from alm_opacus.accounting.entries import (
    GAUSSIAN,
    Entry,
    check_noise_multiplier,
    check_noise_step,
    check_release,
    entry_pld,
    entry_span,
)
from alm_opacus.accounting.neighbouring import ADD_REMOVE
from alm_opacus.accounting.pld import (
    DEFAULT_VALUE_DISCRETIZATION_INTERVAL,
    PrivacyLossDistribution,
    _check_interval,
    _check_sample_rate,
    _check_steps,
    compose,
    log_mixture,
)
from alm_opacus.accounting.pld_grid import auto_delta, auto_epsilon, coarse_interval
from alm_opacus.accounting.subsampled import canonical_step_mechanism
from alm_opacus.mechanisms import create_mechanism
from alm_opacus.mechanisms.base import _check_dim

__all__ = ["ACCOUNTANT_NAME", "PipelineAccountant", "register"]

ACCOUNTANT_NAME = "alm_pld"
# 1: history + releases. 2: adds noise_steps and each release's neighbouring relation.
_STATE_VERSION = 2


class PipelineAccountant(IAccountant):
    """PLD accountant for DP-SGD steps (Gaussian, logistic, Laplace) and one-shot releases.

    - ``history``: Gaussian DP-SGD steps exactly as Opacus's ``prv`` accountant keeps them,
      ``(noise_multiplier, sample_rate, num_steps)`` with consecutive equal steps merged, so
      Opacus's own tools (``get_noise_multiplier`` assigns ``history``) can drive it.
    - ``noise_steps``: DP-SGD steps with logistic (``alm``) or Laplace noise, as dicts.
    - ``releases``: one-shot releases, as dicts.

    Every entry becomes a pessimistic dp_accounting PLD (`alm_opacus.accounting.pld`,
    `alm_opacus.accounting.subsampled`) and their composition answers ε(δ) and δ(ε), on a
    grid chosen from the answer (`alm_opacus.accounting.pld_grid`) unless one is given.

    All entries must share one neighbouring relation: DP-SGD steps are add/remove, and a
    release declares its own (`record_release`); mixing them raises ``ValueError``.
    """

    def __init__(self) -> None:
        super().__init__()
        self.history: list[tuple[float, float, int]] = []
        self.noise_steps: list[dict[str, Any]] = []
        self.releases: list[dict[str, Any]] = []
        self._cache: OrderedDict[
            tuple[float, tuple[Entry, ...]], PrivacyLossDistribution | None
        ] = OrderedDict()

    def step(
        self,
        *,
        noise_multiplier: float,
        sample_rate: float,
        mechanism: str = GAUSSIAN,
        dim: int | None = None,
        num_steps: int = 1,
    ) -> None:
        """Record DP-SGD steps (Opacus's optimizer hook calls this once per step).

        Args:
            noise_multiplier: σ ≥ 0, noise scale over the clipping norm (0: no privacy).
            sample_rate: Poisson sampling probability in (0, 1].
            mechanism: ``"gaussian"`` (L2 clipping), ``"alm"``/``"logistic"`` or
                ``"laplace"`` (L1 clipping).
            dim: number of noised coordinates (``None``: any). Kept in the record; every
                registered profile holds in every dimension (``docs/accounting.md``).
            num_steps: how many identical steps to record, ≥ 1.

        Raises:
            ValueError: if an argument is out of range, or the accountant already holds
                replace-one releases (DP-SGD steps are add/remove).
        """
        sigma = check_noise_multiplier(noise_multiplier)
        q = _check_sample_rate(sample_rate)
        name = canonical_step_mechanism(mechanism)
        n = _check_steps(num_steps)
        self._check_relations(extra=ADD_REMOVE, what="a DP-SGD step")
        if name == GAUSSIAN:
            if self.history and tuple(self.history[-1][:2]) == (sigma, q):
                self.history[-1] = (sigma, q, int(self.history[-1][2]) + n)
            else:
                self.history.append((sigma, q, n))
            return
        record = check_noise_step(
            {
                "mechanism": name,
                "noise_multiplier": sigma,
                "sample_rate": q,
                "num_steps": n,
                "dim": _check_dim(dim),
            }
        )
        last = self.noise_steps[-1] if self.noise_steps else None
        same = ("mechanism", "noise_multiplier", "sample_rate", "dim")
        if last is not None and all(last[k] == record[k] for k in same):
            last["num_steps"] += n
        else:
            self.noise_steps.append(record)

    def record_release(
        self,
        *,
        mechanism: str,
        scale: float,
        sensitivity: float,
        dim: int | None = None,
        neighbouring: str = ADD_REMOVE,
    ) -> None:
        """Record one release ``value + noise`` of a registered mechanism.

        Args:
            mechanism: mechanism name (aliases accepted; stored under the canonical name).
            scale: noise scale > 0.
            sensitivity: sensitivity in the mechanism's norm, > 0, under ``neighbouring``.
            dim: released coordinates; ``None`` means any dimension (every registered
                release PLD holds in every dimension).
            neighbouring: the relation ``sensitivity`` bounds: ``"add-remove"`` or
                ``"replace-one"``.

        Raises:
            ValueError: if an argument is out of range, or ``neighbouring`` differs from the
                relation of what is already recorded.
        """
        record = check_release(
            {
                "mechanism": mechanism,
                "scale": scale,
                "sensitivity": sensitivity,
                "dim": dim,
                "neighbouring": neighbouring,
            }
        )
        self._check_relations(extra=record["neighbouring"], what="this release")
        self.releases.append(record)

    @property
    def neighbouring(self) -> str | None:
        """The relation of everything recorded; ``None`` when nothing is.

        Raises:
            ValueError: if entries under different relations were recorded.
        """
        return self._check_relations()

    def _check_relations(self, *, extra: str | None = None, what: str = "") -> str | None:
        sources: dict[str, str] = {}
        if self.history or self.noise_steps:
            sources.setdefault(ADD_REMOVE, "DP-SGD steps")
        for i, r in enumerate(self.releases):
            sources.setdefault(r["neighbouring"], f"release #{i}")
        if extra is not None:
            sources.setdefault(extra, what)
        if len(sources) > 1:
            (a, why_a), (b, why_b) = sorted(sources.items())
            raise ValueError(
                f"cannot compose entries under different neighbouring relations: {a!r} "
                f"({why_a}) and {b!r} ({why_b}); account for them separately, or bring both "
                "to replace-one with alm_opacus.accounting.to_replace_one"
            )
        return next(iter(sources), None)

    def _entries(self) -> list[Entry]:
        """Everything recorded, in composition order."""
        out = [
            Entry("step", GAUSSIAN, float(sg), 1.0, float(q), int(n), None)
            for sg, q, n in self.history
        ]
        out += [
            Entry(
                "step",
                s["mechanism"],
                s["noise_multiplier"],
                1.0,
                s["sample_rate"],
                s["num_steps"],
                s["dim"],
            )
            for s in self.noise_steps
        ]
        out += [
            Entry("release", r["mechanism"], r["scale"], r["sensitivity"], 1.0, 1, r["dim"])
            for r in self.releases
        ]
        return out

    def _composed(self, entries: list[Entry], interval: float) -> PrivacyLossDistribution | None:
        # Opacus may assign ``history`` directly, so the cache is keyed on the contents.
        cache_key = (interval, tuple(entries))
        if cache_key in self._cache:
            self._cache.move_to_end(cache_key)
            return self._cache[cache_key]
        # A kept composition of a prefix of ``entries`` on this grid (one more release since
        # the last answer, say) is extended by the rest only: composition is the same left
        # fold either way, so the result is the same PLD, bit for bit.
        start, composed = 0, None
        for (kept_interval, kept), pld in self._cache.items():
            if (
                kept_interval == interval
                and pld is not None
                and start < len(kept) < len(entries)
                and tuple(entries[: len(kept)]) == kept
            ):
                start, composed = len(kept), pld
        rest = (entry_pld(e, interval) for e in entries[start:])
        composed = compose(rest if composed is None else itertools.chain((composed,), rest))
        self._cache[cache_key] = composed
        while len(self._cache) > 4:
            self._cache.popitem(last=False)
        return composed

    def privacy_loss_distribution(
        self, *, value_discretization_interval: float = DEFAULT_VALUE_DISCRETIZATION_INTERVAL
    ) -> PrivacyLossDistribution | None:
        """The composed pessimistic PLD on a given grid; ``None`` when nothing was recorded.

        Raises:
            ValueError: if a step had noise_multiplier 0 (no finite PLD) or relations mix.
        """
        self._check_relations()
        if self._noiseless():
            raise ValueError("noise_multiplier=0 was recorded: no finite privacy loss")
        h = _check_interval(value_discretization_interval)
        return self._composed(self._entries(), h)

    def _answer(
        self,
        value_discretization_interval: float | None,
        on_grid: Callable[[PrivacyLossDistribution], float],
        auto: Callable[..., float],
    ) -> float:
        entries = self._entries()

        def pld_at(interval: float) -> PrivacyLossDistribution:
            composed = self._composed(entries, interval)
            assert composed is not None
            return composed

        if value_discretization_interval is not None:
            return on_grid(pld_at(_check_interval(value_discretization_interval)))
        return auto(pld_at=pld_at, widest_span=max(entry_span(e) for e in entries))

    def get_epsilon(
        self, delta: float, *, value_discretization_interval: float | None = None, **kwargs: Any
    ) -> float:
        """Smallest ε (rounded up) for which everything recorded is (ε, δ)-DP.

        Args:
            delta: δ in [0, 1). At δ = 0 the answer is the sum of the pure-DP epsilons,
                or ``inf`` if any Gaussian noise was recorded.
            value_discretization_interval: PLD grid step; ``None`` (default) chooses it
                from the answer, about 1e-4·ε (`alm_opacus.accounting.pld_grid.auto_epsilon`).
            **kwargs: ignored, as Opacus passes accountant-specific options through.

        Returns:
            ε ≥ 0, or ``inf``.

        Raises:
            ValueError: if ``delta`` is out of range, or relations mix.
        """
        target = check_delta(delta)
        self._check_relations()
        if self._noiseless():
            return math.inf
        if target == 0.0:
            return self._pure_epsilon()
        if len(self) == 0:
            return 0.0
        return self._answer(
            value_discretization_interval,
            lambda pld: pld_epsilon(pld, target),
            functools.partial(auto_epsilon, delta=target),
        )

    def _rough_epsilon(self, delta: float) -> float:
        """The first pass of `get_epsilon` only: an upper bound on a coarse grid (fast)."""
        entries = self._entries()
        if self._noiseless():
            return math.inf
        if not entries:
            return 0.0
        interval = coarse_interval(max(entry_span(e) for e in entries))
        if math.isinf(interval):
            return math.inf
        composed = self._composed(entries, interval)
        assert composed is not None
        return pld_epsilon(composed, check_delta(delta))

    def spent(self, *, delta: float) -> float:
        """The ε already spent at ``delta``: `get_epsilon` with the automatic grid."""
        return self.get_epsilon(delta)

    def get_delta(
        self, epsilon: float, *, value_discretization_interval: float | None = None
    ) -> float:
        """Smallest δ (rounded up) for which everything recorded is (ε, δ)-DP.

        Args:
            epsilon: ε > 0.
            value_discretization_interval: PLD grid step; ``None`` uses about 1e-4·ε.

        Raises:
            ValueError: if ``epsilon`` is NaN, infinite or non-positive, or relations mix.
        """
        eps = check_epsilon(epsilon)
        self._check_relations()
        if self._noiseless():
            return 1.0
        if len(self) == 0:
            return 0.0
        return self._answer(
            value_discretization_interval,
            lambda pld: pld_delta(pld, eps),
            functools.partial(auto_delta, epsilon=eps),
        )

    def __len__(self) -> int:
        """Number of DP-SGD steps plus number of releases (non-zero once budget is spent)."""
        steps = sum(int(n) for _, _, n in self.history)
        return steps + sum(s["num_steps"] for s in self.noise_steps) + len(self.releases)

    @classmethod
    def mechanism(cls) -> str:
        return ACCOUNTANT_NAME

    def get_optimizer_hook_fn(self, sample_rate: float) -> Callable[[Any], None]:
        """Opacus's step hook, reading the optimizer's noise mechanism and dimension.

        The optimizer's ``noise_mechanism`` (default ``"gaussian"``, Opacus's own
        optimizers) and ``noise_dim`` (default ``None``) select the step profile; the rate
        is ``sample_rate`` times the optimizer's ``accumulated_iterations``, as in Opacus.
        """

        def hook_fn(optim: Any) -> None:
            self.step(
                noise_multiplier=optim.noise_multiplier,
                sample_rate=sample_rate * optim.accumulated_iterations,
                mechanism=getattr(optim, "noise_mechanism", GAUSSIAN),
                dim=getattr(optim, "noise_dim", None),
            )

        return hook_fn

    def state_dict(self, destination: Any = None) -> Any:
        """Opacus's ``history`` and ``mechanism`` plus ``noise_steps`` and ``releases``.

        Args:
            destination: mapping to fill; a new ``OrderedDict`` when ``None``.

        Returns:
            The filled mapping, plain types only: loadable with
            ``torch.load(..., weights_only=True)``.
        """
        destination = super().state_dict(OrderedDict() if destination is None else destination)
        destination["history"] = [(float(s), float(q), int(n)) for s, q, n in self.history]
        destination["noise_steps"] = deepcopy(self.noise_steps)
        destination["releases"] = deepcopy(self.releases)
        destination["version"] = _STATE_VERSION
        return destination

    def load_state_dict(self, state_dict: Any) -> None:
        """Validate ``state_dict`` fully (version 1 or 2), then replace this state.

        Raises:
            ValueError: if the state is empty, comes from another accountant or a newer
                version, holds an invalid entry, or mixes neighbouring relations; the
                current state is then left unchanged.
        """
        if not state_dict:
            raise ValueError(f"state_dict={state_dict!r} is empty and cannot be loaded")
        kind = state_dict.get("mechanism")
        if kind != ACCOUNTANT_NAME:
            raise ValueError(
                f"state_dict of accountant mechanism={kind!r} cannot be loaded into "
                f"{type(self).__name__} (mechanism {ACCOUNTANT_NAME!r})"
            )
        version = state_dict.get("version", 1)
        if version not in (1, _STATE_VERSION):
            raise ValueError(f"state_dict version={version!r} is not 1 or {_STATE_VERSION}")
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
            history.append((check_noise_multiplier(sigma), _check_sample_rate(q), _check_steps(n)))
        steps = [check_noise_step(s) for s in state_dict.get("noise_steps", [])]
        releases = [check_release(r) for r in state_dict["releases"]]
        trial = PipelineAccountant()
        trial.history, trial.noise_steps, trial.releases = history, steps, releases
        trial._check_relations()
        self.history, self.noise_steps, self.releases = history, steps, releases

    def _noiseless(self) -> bool:
        return any(float(sigma) == 0.0 for sigma, _, _ in self.history) or any(
            s["noise_multiplier"] == 0.0 for s in self.noise_steps
        )

    def _pure_epsilon(self) -> float:
        # Pure ε-DP composes exactly by summation (tight: attained by randomized response);
        # a q-subsampled ε₀-DP step is ln(1 + q(e^{ε₀} − 1))-DP in both directions. ε₀ is
        # the mechanism's own ε at δ = 0: Δ/scale for ALM and Laplace, a plugin law's its own.
        records = [*self.releases, *self.noise_steps]
        if self.history or any(not create_mechanism(r["mechanism"]).pure for r in records):
            return math.inf

        def pure(mechanism: str, *, scale: float, sensitivity: float) -> float:
            return create_mechanism(mechanism).epsilon(
                delta=0.0, scale=scale, sensitivity=sensitivity
            )

        steps = (
            s["num_steps"]
            * log_mixture(
                s["sample_rate"], pure(s["mechanism"], scale=s["noise_multiplier"], sensitivity=1.0)
            )
            for s in self.noise_steps
        )
        releases = (
            pure(r["mechanism"], scale=r["scale"], sensitivity=r["sensitivity"])
            for r in self.releases
        )
        return math.fsum([*steps, *releases])


def register() -> None:
    """Register `PipelineAccountant` in Opacus's registry as ``"alm_pld"`` (idempotent).

    Importing ``alm_opacus.accounting`` already does this; calling it again is harmless.

    Raises:
        ValueError: if another class is registered under ``"alm_pld"``.
    """
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


_register = register  # the name earlier versions (and their tests) used
register()
