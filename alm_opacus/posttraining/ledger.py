"""The ledger of a post-training engine: what repeated releases of one clean model spent.

Every release of the same clean weights spends privacy of the same members, so the engine
composes them. A total is stated as the weakest kind among its releases, with every
parameter of that kind:

- pure DP only: ε-DP with ε = Σεᵢ (basic composition, tight for pure DP);
- pure and approximate DP: (Σεᵢ, Σδᵢ)-DP (basic composition, Dwork & Roth 2014,
  Theorem 3.16), or, where every release has a registered privacy-loss distribution and one
  neighbouring relation, the ``alm_pld`` accountant's ε at the same δ when that is smaller
  (for Gaussian releases only, their exact composition instead: one Gaussian mechanism);
- any random DP: (Σεᵢ, Σγᵢ)-random DP with δ = Σδᵢ and confidence 1 − Σ(1 − cᵢ). Each
  release's bound fails on a fraction γᵢ of neighbouring pairs drawn from the population, so
  by the union bound all hold on all but Σγᵢ of them, and on those pairs the releases compose
  as DP does; likewise each γᵢ holds with confidence cᵢ over its sampler (union bound). It
  stays random DP: a pure or approximate release mixed in does not make it DP;
- anything without a model-level guarantee (``none``, ``per-query``): no guarantee.

Each model's composition is kept between releases and a new release is composed into it
once (`_Running`): the total is the one `compose_records` gives over every record, exactly.

Mixed relations: add/remove releases are stated under replace-one by group privacy,
(2ε, (1 + e^ε)δ) (`alm_opacus.accounting.to_replace_one`); a random-DP add/remove release
cannot be converted (its γ is over add/remove pairs), so such a mix has no guarantee.

**Which model is "the same".** A value digest alone is unsound: casting the head to
float64 or moving it to another device changes the bytes, not the data it was trained on,
and would open a fresh ledger at full budget. The ledger therefore links a release to

- the module object itself (a weak reference): ``head.double()``, ``head.to(device)`` and
  further training in place return the same object, and keep its ledger;
- digests of its state, each rounded to float32, float16 and bfloat16 on the CPU (names,
  shapes and values; integer buffers as they are): a copy cast to float64 rounds back to
  the same float32 values, and a copy cast to half or bfloat16 has the digest at its own
  precision that the original registered.

A module that matches several ledgers merges them (counting more is the safe side). No
ledger can follow weights through arbitrary transformations (re-training from scratch,
wrapping the head in another module): it records what one engine released, nothing more.
"""

from __future__ import annotations

import functools
import hashlib
import math
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from alm_opacus import accounting
from alm_opacus.accounting import ADD_REMOVE, REPLACE_ONE, to_replace_one
from alm_opacus.mechanisms import GaussianMechanism, create_mechanism
from alm_opacus.mechanisms.analysis import gaussian_epsilon
from alm_opacus.statement import Guarantee, PrivacyStatement

if TYPE_CHECKING:  # at run time `accounting` imports it (and Opacus) on first use
    from alm_opacus.accounting import PipelineAccountant

__all__ = [
    "KEY_DTYPES",
    "Ledger",
    "LedgerRecord",
    "LedgerTotal",
    "compose_records",
    "weight_keys",
]

#: Precisions a module's state is rounded to for its ledger keys (see the module docstring).
KEY_DTYPES = (torch.float32, torch.float16, torch.bfloat16)

#: Guarantee kinds from strongest to weakest; a total takes the weakest of its releases.
_ORDER = (
    Guarantee.PURE_DP,
    Guarantee.APPROX_DP,
    Guarantee.RANDOM_DP,
    Guarantee.PER_QUERY,
    Guarantee.NONE,
)


@dataclass(frozen=True)
class LedgerRecord:
    """One release, as the ledger keeps it.

    Attributes:
        guarantee: the release's kind.
        epsilon: its ε (``inf`` for ``none``).
        delta: its δ.
        neighbouring: its relation (empty for ``none``).
        gamma: random DP only: the fraction of population pairs its bound may miss.
        confidence: random DP only: the confidence of ``gamma`` over the sampler.
        mechanism: the mechanism's registry name (for the accountant).
        scale: the noise scale.
        sensitivity: the sensitivity the noise was calibrated to.
        dim: the number of noised coordinates.
    """

    guarantee: Guarantee
    epsilon: float
    delta: float
    neighbouring: str
    gamma: float | None = None
    confidence: float | None = None
    mechanism: str = ""
    scale: float | None = None
    sensitivity: float | None = None
    dim: int | None = None

    @classmethod
    def from_statement(cls, statement: PrivacyStatement, *, dim: int | None) -> LedgerRecord:
        """The record of a release with this statement and ``dim`` noised coordinates."""
        info = statement.sensitivity
        random = statement.guarantee is Guarantee.RANDOM_DP and info is not None
        return cls(
            guarantee=statement.guarantee,
            epsilon=float(statement.epsilon),
            delta=float(statement.delta),
            neighbouring=statement.neighbouring,
            gamma=info.gamma if random and info is not None else None,
            confidence=info.confidence if random and info is not None else None,
            mechanism=statement.mechanism,
            scale=statement.noise_scale,
            # an exact release's noise is calibrated to the grid's Δ' (Δ plus rounding)
            sensitivity=statement.grid_sensitivity or (None if info is None else info.value),
            dim=dim,
        )


@dataclass(frozen=True)
class LedgerTotal:
    """What every recorded release of one clean model has spent, composed.

    Attributes:
        guarantee: the weakest kind among the releases (``pure-dp`` when there are none).
        epsilon: total ε (``inf`` for ``none``).
        delta: total δ.
        neighbouring: the relation of the total (empty for ``none`` or no release).
        releases: how many releases are composed.
        gamma: random DP only: Σγ over the random-DP releases.
        confidence: random DP only: 1 − Σ(1 − cᵢ) over them.
        composition: ``"basic"``, ``"gaussian"`` (Gaussian releases only: their exact
            composition, `_gaussian_epsilon`, was smaller) or ``"pld"`` (the ``alm_pld``
            accountant's ε was smaller); empty when nothing was composed.
        notes: why the total is what it is, where that is not plain.
    """

    guarantee: Guarantee
    epsilon: float
    delta: float
    neighbouring: str
    releases: int
    gamma: float | None = None
    confidence: float | None = None
    composition: str = ""
    notes: tuple[str, ...] = ()

    def statement_fields(self) -> dict[str, Any]:
        """The ``*_spent`` fields of a `PrivacyStatement` that states this total."""
        return {
            "epsilon_spent": self.epsilon,
            "delta_spent": self.delta,
            "guarantee_spent": self.guarantee,
            "gamma_spent": self.gamma,
            "confidence_spent": self.confidence,
            "neighbouring_spent": self.neighbouring,
        }


def _none(releases: int, reason: str) -> LedgerTotal:
    return LedgerTotal(
        guarantee=Guarantee.NONE,
        epsilon=math.inf,
        delta=0.0,
        neighbouring="",
        releases=releases,
        notes=(reason,),
    )


def _one_relation(
    records: Sequence[LedgerRecord],
) -> tuple[list[LedgerRecord], str, list[str]] | None:
    """The records under one relation: add/remove converted to replace-one if they mix;
    ``None`` if a random-DP add/remove release would need converting."""
    relations = {r.neighbouring for r in records}
    if len(relations) == 1:
        return list(records), relations.pop(), []
    out = []
    for r in records:
        if r.neighbouring != ADD_REMOVE:
            out.append(r)
        elif r.guarantee is Guarantee.RANDOM_DP:
            return None
        else:  # (2ε, (1 + e^ε)δ): a pure release stays pure, an approximate one approximate
            epsilon, delta = to_replace_one(
                epsilon=r.epsilon, delta=r.delta, neighbouring=ADD_REMOVE
            )
            out.append(replace(r, epsilon=epsilon, delta=delta, neighbouring=REPLACE_ONE))
    note = (
        "releases under add/remove and replace-one neighbours: the add/remove ones are stated "
        "under replace-one by group privacy (2 epsilon, (1 + e^epsilon) delta)"
    )
    return out, REPLACE_ONE, [note]


def _pld_epsilon(records: Sequence[LedgerRecord], delta: float, relation: str) -> float:
    """The ``alm_pld`` accountant's ε at ``delta`` over ``records``; ``inf`` if it has no
    privacy-loss distribution for one of them."""
    accountant = accounting.PipelineAccountant()
    try:
        for r in records:
            if r.scale is None or r.sensitivity is None:
                return math.inf
            accountant.record_release(
                mechanism=r.mechanism,
                scale=r.scale,
                sensitivity=r.sensitivity,
                dim=r.dim,
                neighbouring=relation,
            )
    except ValueError:  # a mechanism without a registered PLD (or an unknown name)
        return math.inf
    return float(accountant.get_epsilon(delta))


@functools.lru_cache(maxsize=64)
def _is_gaussian(mechanism: str) -> bool:
    try:
        return isinstance(create_mechanism(mechanism), GaussianMechanism)
    except ValueError:  # not a registered mechanism: no Gaussian profile is known
        return False


def _gaussian_epsilon(records: Sequence[LedgerRecord], delta: float) -> float | None:
    """The exact ε at ``delta`` of Gaussian releases only; ``None`` if another is among them.

    Gaussian mechanisms with ``μᵢ = Δᵢ/σᵢ`` compose, adaptively, to exactly one Gaussian
    mechanism with ``μ = sqrt(Σμᵢ²)`` (Dong, Roth & Su 2022, Corollary 3.3), whose (ε, δ)
    curve is Balle & Wang's (2018) Theorem 8. So the total needs no privacy-loss grid: it
    is exact (no discretisation slack) and costs microseconds at any number of releases.
    """
    if not delta > 0.0 or not all(
        r.scale and r.sensitivity and _is_gaussian(r.mechanism) for r in records
    ):
        return None
    mu = math.sqrt(math.fsum((r.sensitivity / r.scale) ** 2 for r in records))  # type: ignore[operator]
    # μ a little up: its divisions, squares and root, and the root-finding of ε (whose
    # δ(ε) is evaluated in floats), may each land a few ulps low; 1e-12 covers them
    return gaussian_epsilon(delta=delta, scale=1.0, sensitivity=mu * (1.0 + 1e-12))


def compose_records(records: Sequence[LedgerRecord]) -> LedgerTotal:
    """Compose the releases of one clean model (rules in the module docstring).

    Args:
        records: the releases, in any order.

    Returns:
        Their total, stated as the weakest kind among them with every parameter of it.
    """
    return _compose(records, tight=_pld_epsilon)


def _compose(
    records: Sequence[LedgerRecord],
    *,
    tight: Callable[[Sequence[LedgerRecord], float, str], float],
) -> LedgerTotal:
    """`compose_records`, with the ``alm_pld`` ε of ``(records, delta, relation)`` from
    ``tight`` (from scratch, or from a kept composition: `_Running`)."""
    n = len(records)
    if n == 0:
        return LedgerTotal(
            guarantee=Guarantee.PURE_DP, epsilon=0.0, delta=0.0, neighbouring="", releases=0
        )
    weakest = max((r.guarantee for r in records), key=_ORDER.index)
    if weakest in (Guarantee.NONE, Guarantee.PER_QUERY):
        reason = (
            f"a {weakest.value} release of this model is among them: what it tells about the "
            "members is not bounded, so neither is the total"
        )
        return _none(n, reason)
    converted = _one_relation(records)
    if converted is None:
        reason = (
            "a random-DP add/remove release mixed with replace-one releases: its gamma is over "
            "add/remove pairs and does not convert"
        )
        return _none(n, reason)
    same, relation, notes = converted
    epsilon = math.fsum(r.epsilon for r in same)
    delta = math.fsum(r.delta for r in same)
    if not delta < 1:
        return _none(n, f"the deltas add up to {delta:g} >= 1")
    if weakest is Guarantee.RANDOM_DP:
        sampled = [r for r in same if r.guarantee is Guarantee.RANDOM_DP]
        gamma = math.fsum(r.gamma or 0.0 for r in sampled)
        confidence = 1.0 - math.fsum(1.0 - (r.confidence or 0.0) for r in sampled)
        if not (gamma < 1 and confidence > 0):
            reason = (
                f"the random-DP releases' gammas add up to {gamma:g} and their joint confidence "
                f"is {confidence:g}: nothing is left of the bound"
            )
            return _none(n, reason)
        return LedgerTotal(
            guarantee=Guarantee.RANDOM_DP,
            epsilon=epsilon,
            delta=delta,
            neighbouring=relation,
            releases=n,
            gamma=gamma,
            confidence=confidence,
            composition="basic",
            notes=tuple(notes),
        )
    if weakest is Guarantee.PURE_DP:
        return LedgerTotal(
            guarantee=Guarantee.PURE_DP,
            epsilon=epsilon,
            delta=0.0,
            neighbouring=relation,
            releases=n,
            composition="basic",
            notes=tuple(notes),
        )
    composition = "basic"
    if n > 1 and not notes:  # the accountant composes one relation only
        exact = _gaussian_epsilon(same, delta)
        if exact is not None and exact < epsilon:
            epsilon, composition = exact, "gaussian"
        elif exact is None:
            pld = tight(same, delta, relation)
            if pld < epsilon:
                epsilon, composition = pld, "pld"
    return LedgerTotal(
        guarantee=Guarantee.APPROX_DP,
        epsilon=epsilon,
        delta=delta,
        neighbouring=relation,
        releases=n,
        composition=composition,
        notes=tuple(notes),
    )


def weight_keys(module: nn.Module) -> tuple[str, ...]:
    """Digests of ``module``'s state rounded to each of `KEY_DTYPES`, on the CPU.

    Floating tensors are rounded to the key's precision (then widened to float32, exactly,
    to be hashed); other tensors are hashed as they are, with their dtype.
    """
    state = sorted(module.state_dict().items())
    keys = []
    for dtype in KEY_DTYPES:
        h = hashlib.sha256(str(dtype).encode())
        for name, value in state:
            t = value.detach().to("cpu")
            if t.is_floating_point():
                t = t.to(dtype).to(torch.float32)
            else:
                h.update(str(t.dtype).encode())
            h.update(f"{name}{tuple(t.shape)}".encode())
            h.update(t.contiguous().numpy().tobytes())
        keys.append(h.hexdigest())
    return tuple(keys)


class _Running:
    """One clean model's releases and their composition, kept between releases.

    A new release is composed once into what is kept: the ``alm_pld`` accountant keeps the
    composed privacy-loss distribution of every earlier release (per grid) and composes the
    new one into it, the same left fold as composing the whole list again, so the total is
    that of `compose_records` over the same records, exactly. The basic sums are
    re-added with ``math.fsum`` over the kept records (exactly rounded; microseconds).
    """

    def __init__(self, records: Sequence[LedgerRecord] = ()) -> None:
        self.records: list[LedgerRecord] = []
        # The records' PLDs under their one relation; None once the tight ε can no longer
        # be used (a record without a PLD, a second relation, or a kind weaker than
        # approximate DP: each stays among the records, so it is never needed again).
        self._accountant: PipelineAccountant | None = accounting.PipelineAccountant()
        for r in records:
            self.records.append(r)
            self._keep(r)
        self.total = _compose(self.records, tight=self._tight)

    def add(self, record: LedgerRecord) -> LedgerTotal:
        """Compose one more release into the kept total, and return the new total."""
        self.records.append(record)
        self._keep(record)
        self.total = _compose(self.records, tight=self._tight)
        return self.total

    def _keep(self, r: LedgerRecord) -> None:
        accountant = self._accountant
        if accountant is None:
            return
        if (
            r.guarantee not in (Guarantee.PURE_DP, Guarantee.APPROX_DP)
            or r.scale is None
            or r.sensitivity is None
        ):
            self._accountant = None
            return
        try:
            accountant.record_release(
                mechanism=r.mechanism,
                scale=r.scale,
                sensitivity=r.sensitivity,
                dim=r.dim,
                neighbouring=r.neighbouring,
            )
        except ValueError:  # no registered PLD, or a second relation (then no PLD is used)
            self._accountant = None

    def _tight(self, records: Sequence[LedgerRecord], delta: float, relation: str) -> float:
        """`_pld_epsilon` of the kept records, from the kept composition."""
        accountant = self._accountant
        if accountant is None:
            return math.inf
        # `_compose` asks only when every record is under ``relation``, as recorded
        assert len(accountant.releases) == len(records) == len(self.records)
        return float(accountant.get_epsilon(delta))


class Ledger:
    """Releases per clean model, linked by object identity and by rounded digests; each
    model's composition is kept and extended by one release at a time (`_Running`)."""

    def __init__(self) -> None:
        self._records: dict[int, _Running] = {}
        self._keys: dict[str, int] = {}
        self._owners: weakref.WeakKeyDictionary[nn.Module, int] = weakref.WeakKeyDictionary()
        self._merged: dict[int, int] = {}  # a merged ledger's id → the id it went to

    def _resolve(self, ledger_id: int) -> int:
        while ledger_id in self._merged:
            ledger_id = self._merged[ledger_id]
        return ledger_id

    def _find(self, module: nn.Module, keys: tuple[str, ...]) -> int | None:
        found = {self._resolve(self._keys[k]) for k in keys if k in self._keys}
        owner = self._owners.get(module)
        if owner is not None:
            found.add(self._resolve(owner))
        if not found:
            return None
        target, *others = sorted(found)
        if others:  # one model seen as two: merge (counting more is safe), composed again
            merged = list(self._records[target].records)
            for other in others:
                merged.extend(self._records.pop(other).records)
                self._merged[other] = target
            self._records[target] = _Running(merged)
        return target

    def total(self, module: nn.Module) -> LedgerTotal:
        """What the recorded releases of ``module`` have spent (nothing if none)."""
        ledger_id = self._find(module, weight_keys(module))
        return compose_records(()) if ledger_id is None else self._records[ledger_id].total

    def record(self, module: nn.Module, record: LedgerRecord) -> LedgerTotal:
        """Add a release of ``module`` (its clean weights) and return the new total."""
        keys = weight_keys(module)
        ledger_id = self._find(module, keys)
        if ledger_id is None:
            ledger_id = len(self._records) + len(self._merged)
            self._records[ledger_id] = _Running()
        total = self._records[ledger_id].add(record)
        for key in keys:
            self._keys[key] = ledger_id
        self._owners[module] = ledger_id
        return total
