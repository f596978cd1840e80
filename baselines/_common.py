"""Helpers shared by the baselines: seeds, the tuning budget, public-data splits, and the
tuning template every baseline's release starts with.

Tuning protocol (docs/baselines.md, "Fair tuning"): every baseline tries at most
:data:`TUNING_BUDGET` configurations at each epsilon. Each is trained on a subset of the
*public* split of the members' size, with the privacy mechanism at the target epsilon, and
scored by its mean accuracy over :data:`TUNING_DRAWS` noise draws on the rest of the public
split. Members, non-members and the attacker's pool are never looked at, so the choice costs
no privacy budget.

:class:`TunedMethod` is that protocol as a template: a baseline says what it may try
(:meth:`TunedMethod.tuning_space`) and how a candidate answers the validation rows
(:meth:`TunedMethod.tuning_answers`); :meth:`TunedMethod.choose` does the rest, once per
budget, and ``release`` starts from its choice.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import torch
from torch import Tensor

from alm_opacus.plugin import (
    Method,
    MethodContext,
    MethodOptions,
    ReleaseRequest,
    derive_seed,
    tensor_digest,
)

__all__ = [
    "TUNING_BUDGET",
    "TUNING_DRAWS",
    "PreparedData",
    "PublicSplit",
    "TunedMethod",
    "TuningResult",
    "TuningSpace",
    "accuracy_of",
    "choose",
    "derive_seed",
    "mean_accuracy",
    "public_split",
    "select_config",
    "single_thread",
    "tensor_digest",
    "untuned",
]

#: Configurations every baseline may try per epsilon (the equal tuning budget).
TUNING_BUDGET = 4
#: Independent noise draws averaged per configuration when scoring it.
TUNING_DRAWS = 2
#: The validation part must hold at least this many rows, else tuning is skipped.
MIN_VALIDATION = 20

T = TypeVar("T")


@dataclass(frozen=True)
class PublicSplit:
    """Public rows for tuning: ``train`` has the members' size, ``validation`` the rest."""

    train_features: Tensor
    train_labels: Tensor
    validation_features: Tensor
    validation_labels: Tensor


def public_split(
    *, context: MethodContext, n: int, seed: int, inputs: Tensor | None = None
) -> PublicSplit | None:
    """Split the public data into a training part of ``n`` rows and a validation part.

    Args:
        context: holds ``public_features`` and ``public_labels``.
        n: the members' size; training on as many rows makes the noise level match.
        seed: seeds the permutation.
        inputs: rows to split instead of the public features, aligned with them (e.g.
            ``context.public_images``); the split is the same either way.

    Returns:
        The split, or None when there is no public data or fewer than ``n + 20`` rows.
    """
    x = context.public_features if inputs is None else inputs
    y = context.public_labels
    if inputs is not None and y is not None and len(inputs) != len(y):
        raise ValueError(f"inputs has {len(inputs)} rows but the public labels {len(y)}")
    if x is None or y is None or len(x) < n + MIN_VALIDATION:
        return None
    g = torch.Generator().manual_seed(derive_seed("public-split", seed, n) % 2**63)
    perm = torch.randperm(len(x), generator=g)
    tr, va = perm[:n], perm[n:]
    return PublicSplit(x[tr], y[tr], x[va], y[va])


_P = TypeVar("_P", bound="PreparedData")


@dataclass
class PreparedData:
    """What a baseline keeps per (members, seed): the members and the public tuning split.

    Attributes:
        n: the members' count.
        seed: the cell's seed.
        features: the members' inputs.
        labels: their labels.
        split: the public tuning split (:func:`public_split`), or None.
        tuned: what :meth:`TunedMethod.choose` chose, per tuning key.
    """

    n: int
    seed: int
    features: Tensor
    labels: Tensor
    split: PublicSplit | None
    # keyword-only, so that subclasses may add fields without defaults
    tuned: dict[Hashable, tuple[Any, TuningResult]] = field(default_factory=dict, kw_only=True)

    @classmethod
    def build(
        cls: type[_P],
        *,
        features: Tensor,
        labels: Tensor,
        seed: int,
        context: MethodContext,
        inputs: Tensor | None = None,
        **extra: Any,
    ) -> _P:
        """The members and the public split of their size (``inputs``: public rows in the
        method's own input kind); ``extra`` fills a subclass's fields."""
        n = int(features.shape[0])
        split = public_split(context=context, n=n, seed=seed, inputs=inputs)
        return cls(n=n, seed=seed, features=features, labels=labels, split=split, **extra)


@dataclass(frozen=True)
class TuningResult:
    """What the tuning tried and what it chose (goes to ``Release.info``)."""

    chosen: dict[str, Any]
    tried: tuple[dict[str, Any], ...]
    note: str

    def to_info(self) -> dict[str, Any]:
        """JSON-able record (for ``Release.info["tuning"]``)."""
        return {
            "chosen": dict(self.chosen),
            "tried": [dict(t) for t in self.tried],
            "note": self.note,
        }


def select_config(
    candidates: Sequence[T],
    *,
    score: Callable[[T], float],
    describe: Callable[[T], dict[str, Any]],
    scoring: str | None = None,
) -> tuple[T, TuningResult]:
    """Pick the candidate with the highest public validation score (first one on ties).

    Args:
        candidates: at most :data:`TUNING_BUDGET` configurations.
        score: public validation accuracy of a configuration (higher is better).
        describe: a JSON-able description of a configuration.
        scoring: how the candidates were trained for scoring, when not as the release is
            (appended to the record's note).

    Returns:
        The chosen configuration and the record of what was tried.

    Raises:
        ValueError: if there are no candidates or more than the budget.
    """
    if not candidates or len(candidates) > TUNING_BUDGET:
        raise ValueError(
            f"{len(candidates)} candidates: expected between 1 and TUNING_BUDGET={TUNING_BUDGET}"
        )
    scores = [float(score(c)) for c in candidates]
    best = max(range(len(candidates)), key=lambda i: (scores[i], -i))
    tried = tuple(
        {**describe(c), "validation_accuracy": s} for c, s in zip(candidates, scores, strict=True)
    )
    note = "chosen on public validation data at the target epsilon; costs no privacy"
    return candidates[best], TuningResult(
        chosen=describe(candidates[best]),
        tried=tried,
        note=note if scoring is None else f"{note}; {scoring}",
    )


def untuned(
    candidate: T, *, describe: Callable[[T], dict[str, Any]], reason: str
) -> tuple[T, TuningResult]:
    """The default configuration, when tuning is off or impossible (recorded as such)."""
    return candidate, TuningResult(
        chosen=describe(candidate), tried=(describe(candidate),), note=f"not tuned: {reason}"
    )


def choose(
    store: dict[Any, tuple[T, TuningResult]],
    key: Hashable,
    candidates: Sequence[T],
    *,
    default: T,
    describe: Callable[[T], dict[str, Any]],
    score: Callable[[T], float],
    fixed: str | None,
    tune: bool,
    split: PublicSplit | None,
    scoring: str | None = None,
) -> tuple[T, TuningResult]:
    """The tuning protocol in one place, run once per ``key`` (kept in ``store``).

    :func:`select_config` over ``candidates``, unless the configuration is fixed by options
    (``fixed`` names what), tuning is off, or there is no public validation ``split``: then
    ``default``, recorded with the reason. ``scoring`` goes to :func:`select_config`.

    Returns:
        The configuration and the record of what was tried.
    """
    if key not in store:
        skip = (
            f"{fixed} fixed by options"
            if fixed
            else "tune=false"
            if not tune
            else "no public data large enough for a validation split"
            if split is None
            else None
        )
        store[key] = (
            untuned(default, describe=describe, reason=skip)
            if skip is not None
            else select_config(candidates, score=score, describe=describe, scoring=scoring)
        )
    return store[key]


def accuracy_of(proba: Tensor, labels: Tensor) -> float:
    """Accuracy of the argmax of ``proba`` (q, C) against ``labels`` (q,)."""
    return float((proba.argmax(-1).cpu() == labels.cpu()).double().mean())


def mean_accuracy(answer: Callable[[int], Tensor], labels: Tensor) -> float:
    """Mean accuracy over the :data:`TUNING_DRAWS` tuning draws (in draw order).

    Args:
        answer: ``draw -> probabilities (q, C)`` of one noisy candidate on the validation rows.
        labels: their labels (q,).
    """
    accs = [accuracy_of(answer(draw), labels) for draw in range(TUNING_DRAWS)]
    return sum(accs) / len(accs)


@dataclass(frozen=True)
class TuningSpace(Generic[T]):
    """What a method may try for one release's budget (:meth:`TunedMethod.choose`).

    Attributes:
        key: the choice is made once per key on one prepared state (e.g. the epsilon).
        candidates: the configurations tried, at most :data:`TUNING_BUDGET`.
        default: the configuration released when tuning is skipped.
        describe: a JSON-able description of a configuration.
        fixed: what the options fix (tuning is then skipped), or None.
        tune: false skips tuning (the method's ``tune`` option).
        scoring: how candidates are trained for scoring when not as the release is (it goes
            to the tuning record's note), or None.
    """

    key: Hashable
    candidates: Sequence[T]
    default: T
    describe: Callable[[T], dict[str, Any]]
    fixed: str | None = None
    tune: bool = True
    scoring: str | None = None


OptionsT = TypeVar("OptionsT", bound=MethodOptions)
PreparedT = TypeVar("PreparedT", bound=PreparedData)


class TunedMethod(Method[OptionsT, PreparedT], Generic[OptionsT, PreparedT, T]):
    """A baseline whose release uses a configuration tuned on public data.

    Subclasses say what they may try and how a candidate answers the public validation
    rows; ``release`` starts with :meth:`choose` and keeps what it fits and how it adds
    noise to itself.
    """

    def tuning_space(self, prepared: PreparedT, request: ReleaseRequest) -> TuningSpace[T]:
        """The candidates for the request's budget, the default and what skips tuning."""
        raise NotImplementedError

    def tuning_answers(
        self, prepared: PreparedT, candidate: T, *, split: PublicSplit, request: ReleaseRequest
    ) -> Callable[[int], Tensor]:
        """``candidate`` trained on ``split``'s training rows at the request's budget (work
        shared by the draws is done here, once): ``draw -> probabilities`` on the validation
        rows, with public, seeded noise."""
        raise NotImplementedError

    def choose(self, prepared: PreparedT, request: ReleaseRequest) -> tuple[T, TuningResult]:
        """The configuration for the request's budget: the candidate with the best mean
        public validation accuracy over the tuning draws, chosen once per tuning key."""
        space = self.tuning_space(prepared, request)
        split = prepared.split

        def score(candidate: T) -> float:
            assert split is not None  # choose scores only with a split
            answer = self.tuning_answers(prepared, candidate, split=split, request=request)
            return mean_accuracy(answer, split.validation_labels)

        return choose(
            prepared.tuned,
            space.key,
            space.candidates,
            default=space.default,
            describe=space.describe,
            fixed=space.fixed,
            tune=space.tune,
            split=split,
            score=score,
            scoring=space.scoring,
        )


@contextmanager
def single_thread() -> Iterator[None]:
    """Run a block with one torch intra-op thread, restoring the count afterwards.

    A small network's training step is microseconds of arithmetic; with two threads on a
    shared two-core machine, thread hand-offs made 60 DP-SGD steps take 3-6 s instead of
    0.15 s.
    """
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(old)
