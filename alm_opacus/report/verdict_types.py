"""What the verdict of a run is made of (:func:`alm_opacus.report.verdict.decide` computes
it): the outcome, the points it cites, each method's facts and the equal-utility
comparisons."""

from __future__ import annotations

import enum
from dataclasses import dataclass

from alm_opacus.report.series import Stat

__all__ = [
    "DP_KINDS",
    "USEFUL_FRACTION",
    "Comparison",
    "MethodVerdict",
    "Outcome",
    "Pick",
    "Verdict",
    "intervals_overlap",
]

#: The guarantee kinds (under replace-one) that are differential privacy.
DP_KINDS = ("pure-dp", "approx-dp")
#: The share of the unprotected head's gain over chance that a useful accuracy keeps.
USEFUL_FRACTION = 0.5


class Outcome(str, enum.Enum):
    """Which recommendation the run supports (the branches of
    :func:`~alm_opacus.report.verdict.decide`)."""

    #: no protected release finished (no row but the baseline, or every cell infeasible)
    NO_RESULTS = "no-results"
    #: no method has a DP row (e.g. only random-DP rows)
    NO_DP = "no-dp"
    #: DP rows exist, but every one is weak
    NO_MEANINGFUL = "no-meaningful"
    #: meaningful rows exist, but without the unprotected head usefulness is undefined
    NO_BASELINE = "no-baseline"
    #: no method keeps useful accuracy at a meaningful guarantee
    NONE_USEFUL = "none-useful"
    #: exactly one method does
    ONE_USEFUL = "one-useful"
    #: several methods do
    SEVERAL_USEFUL = "several-useful"


@dataclass(frozen=True)
class Pick:
    """One (method, ε) point the verdict cites."""

    method: str
    #: the ε the cell asked for, under the method's own relation
    epsilon: float
    #: the guarantee kind under replace-one (``Point.common_guarantee``)
    guarantee: str
    epsilon_common: float
    delta_common: float
    #: mean test accuracy over seeds and noise draws
    accuracy: float
    #: the strongest attack's AUC with its 95% interval
    auc: Stat
    eps_lower_bound: float
    #: whether ``accuracy`` is useful (None: no baseline, so undefined)
    useful: bool | None
    #: whether the AUC's mean lies inside the no-leak band (None: the run has no reference)
    inside_no_leak: bool | None

    @property
    def key(self) -> tuple[str, float]:
        return (self.method, self.epsilon)


@dataclass(frozen=True)
class MethodVerdict:
    """What one method reaches."""

    method: str
    #: the guarantee kinds of its feasible points, under replace-one, in grid order
    kinds: tuple[str, ...]
    #: whether any of its rows is DP under replace-one
    dp: bool
    #: its best accuracy at a meaningful guarantee (None: no such row)
    best: Pick | None
    #: a method without DP rows: its best accuracy at ε′ ≤ 10, δ′ ≤ 1/n (not DP)
    best_not_dp: Pick | None
    #: whether every cell of the method was infeasible
    infeasible: bool


@dataclass(frozen=True)
class Comparison:
    """Two methods at equal utility: AUCs interpolated at one accuracy both reach."""

    method: str
    other: str
    #: the common accuracy level (the highest both methods reach)
    accuracy: float
    auc: Stat
    other_auc: Stat
    #: whether the two AUC intervals do not overlap
    separated: bool
    #: the method whose interval lies lower, where ``separated`` (else None)
    leaks_less: str | None


@dataclass(frozen=True)
class Verdict:
    """The computed verdict of a run (see the module docstring for the rule)."""

    outcome: Outcome
    methods: tuple[MethodVerdict, ...]
    #: the unprotected head's mean accuracy (nan without a baseline)
    baseline_accuracy: float
    #: chance accuracy, 1 / number of classes (0 where unknown)
    chance: float
    #: the useful-accuracy line (nan without a baseline)
    useful_accuracy: float
    members: int | None
    #: the no-leak band: the reference's strongest-attack AUC (None: no reference)
    no_leak: Stat | None
    comparisons: tuple[Comparison, ...]
    #: the recommendation, one sentence
    sentence: str
    caveats: tuple[str, ...]
    #: the (method, ε) rows the verdict cites: per method the point it reports
    #: (:attr:`MethodVerdict.best`, else :attr:`MethodVerdict.best_not_dp`)
    cited: frozenset[tuple[str, float]]

    @property
    def text(self) -> str:
        """The recommendation and its caveats, as one paragraph."""
        return " ".join([self.sentence, *self.caveats])

    def method(self, name: str) -> MethodVerdict:
        """The :class:`MethodVerdict` of ``name``.

        Raises:
            KeyError: if the run has no such method.
        """
        for found in self.methods:
            if found.method == name:
                return found
        raise KeyError(name)


def intervals_overlap(a: Stat, b: Stat) -> bool:
    if a.kind == "" or b.kind == "":
        return True  # no interval: nothing shows a difference
    return not (a.high < b.low or b.high < a.low)
