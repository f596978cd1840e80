"""LiRA, the likelihood-ratio attack of Carlini et al. (S&P 2022), offline and online.

The statistic is the logit-scaled confidence ``phi = log(p_y / (1 - p_y))`` (Sec. IV-A), for
which the spread over retrained models is close to Gaussian. For every example, Gaussians
are fitted to ``phi`` under reference heads that did (*in*) and did not (*out*) train on it:

- online (Algorithm 1): score = ``log N(phi; mu_in, s_in^2) - log N(phi; mu_out, s_out^2)``,
  the log likelihood ratio; the references train on halves of pool + candidates, so each
  candidate is *in* for exactly half of them.
- offline (Sec. IV-C): only *out* references; score = ``(phi - mu_out) / s_out``, monotone
  in the one-sided p-value ``Pr[Z <= phi]``, ``Z ~ N(mu_out, s_out^2)``, so the ROC is the
  same and nothing saturates. As in Carlini et al. (Sec. VI-A), the references train on
  random halves of all the attacker's data, candidates included (the online bank), and each
  candidate is scored with the ``N / 2`` references that did not train on it
  (``lira-offline``). ``lira-offline-pool`` is the stricter attacker whose ``N`` references
  train on halves of the pool only, so none ever saw a candidate.

``fixed_variance`` replaces the per-example variances by the pooled within-example variance,
which Carlini et al. recommend with few references. The Gaussians are maximum-likelihood fits
(``ddof = 0``, as ``scipy.stats.norm.fit``). Feature-space heads have no data augmentation, so
one query per example is made (Carlini et al. average over augmented queries).

Thresholds (for ``mia_accuracy``) are chosen on the pool: each reference head in turn plays
the target, and the *other* heads are its references (leave one head out).
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import torch

from alm_opacus.attacks.base import (
    AttackKind,
    BoolArray,
    FloatArray,
    LiraLocation,
    Predictor,
    ThresholdScope,
)
from alm_opacus.attacks.context import ShadowContext
from alm_opacus.attacks.registry import Attack, AttackScores, TargetQuery, register_attack
from alm_opacus.attacks.scores import logit_confidence
from alm_opacus.attacks.shadow_data import HeadBank, predict_heads
from alm_opacus.attacks.thresholds import Threshold

MIN_STD = 1e-3
"""Floor on a fitted standard deviation, in logit units (identical references give 0)."""

_LOG_SQRT_2PI = 0.5 * math.log(2 * math.pi)


def fit_gaussian(
    samples: FloatArray,
    mask: BoolArray | None = None,
    *,
    location: LiraLocation = LiraLocation.MEAN,
) -> tuple[FloatArray, FloatArray]:
    """Normal fit of each row's selected samples.

    Args:
        samples: (n, k) values.
        mask: (n, k) which values to use (all when None); every row needs one.
        location: the centre: the mean (maximum likelihood) or the median.

    Returns:
        ``(centre, std)``, each (n,), with ``std = sqrt(mean((x - mean)^2))`` (``ddof = 0``,
        the maximum-likelihood spread, as ``scipy.stats.norm.fit``).

    Raises:
        ValueError: if a row selects no sample.
    """
    w = np.ones_like(samples, dtype=bool) if mask is None else mask
    count = w.sum(1)
    if (count == 0).any():
        raise ValueError(f"{int((count == 0).sum())} rows select no sample to fit")
    mean = np.where(w, samples, 0.0).sum(1) / count
    var = np.where(w, (samples - mean[:, None]) ** 2, 0.0).sum(1) / count
    if LiraLocation(location) is LiraLocation.MEDIAN:
        mean = np.nanmedian(np.where(w, samples, np.nan), axis=1)
    return mean, np.sqrt(var)


def gaussian_logpdf(x: FloatArray, mean: FloatArray, std: FloatArray) -> FloatArray:
    """``log N(x; mean, std^2)``, elementwise."""
    z = (x - mean) / std
    return -0.5 * z * z - np.log(std) - _LOG_SQRT_2PI


def pooled_std(phi: FloatArray, mask: BoolArray) -> float:
    """The pooled within-example standard deviation of ``phi`` (B, n) over ``mask`` (B, n)."""
    count = mask.sum(0)
    use = count > 0
    mean = np.where(mask, phi, 0.0).sum(0)[use] / count[use]
    sq = np.where(mask[:, use], (phi[:, use] - mean) ** 2, 0.0).sum()
    return max(math.sqrt(sq / max(int(count.sum()), 1)), MIN_STD)


def leave_one_out_fit(
    phi: FloatArray, mask: BoolArray, *, location: LiraLocation = LiraLocation.MEAN
) -> tuple[FloatArray, FloatArray]:
    """For each head ``j`` and example ``i``, the Gaussian of ``phi[h, i]`` over the heads
    ``h != j`` selected by ``mask[h, i]``.

    Returns:
        ``(centre, std)`` of shape (B, n); NaN where no such head remains.
    """
    center = phi.mean(0)  # centring first keeps the sum-of-squares formula well conditioned
    x = np.where(mask, phi - center, 0.0)
    s1, s2, c = x.sum(0), (x * x).sum(0), mask.sum(0)
    s1j, s2j, cj = s1 - x, s2 - x * x, c - mask
    with np.errstate(invalid="ignore", divide="ignore"):
        m = s1j / cj
        var = np.maximum(s2j / cj - m * m, 0.0)
    if LiraLocation(location) is LiraLocation.MEDIAN:
        values = np.where(mask, phi, np.nan)
        m = np.empty_like(phi)
        with warnings.catch_warnings():  # all-NaN columns (no head left) give NaN, as above
            warnings.simplefilter("ignore", RuntimeWarning)
            for j in range(phi.shape[0]):
                m[j] = np.nanmedian(np.delete(values, j, axis=0), axis=0)
        return m, np.sqrt(var)
    return m + center, np.sqrt(var)


def _std(std: FloatArray, fixed: float | None) -> FloatArray:
    return np.full_like(std, fixed) if fixed is not None else np.maximum(std, MIN_STD)


def _fit_loo_threshold(scores: FloatArray, is_member: BoolArray) -> Threshold:
    ok = np.isfinite(scores)
    return Threshold.fit(
        scores=scores[ok],
        labels=np.zeros(int(ok.sum()), dtype=np.int64),
        is_member=is_member[ok],
        num_classes=1,
        scope=ThresholdScope.GLOBAL,
    )


def _phi(bank: HeadBank) -> FloatArray:
    return logit_confidence(bank.proba, bank.labels.cpu().numpy().astype(np.int64))


@register_attack(AttackKind.LIRA_OFFLINE_POOL)
class LiraOfflinePoolAttack(Attack):
    """Offline LiRA on references that never saw a candidate: halves of the pool only, so all
    ``N`` are *out* for every candidate (a stricter attacker than :class:`LiraOfflineAttack`)."""

    banks = frozenset({"offline"})
    #: The reference heads (not their bank: its (B, n, C) probabilities, 512 MB at 5*10^4
    #: members, serve only :meth:`fit`).
    predictors: tuple[Predictor, ...] | None = None
    threshold: Threshold | None = None
    fixed_std: float | None = None
    #: The references' Gaussians on the last query's rows: every cell of a run asks about the
    #: same evaluation rows, and the bank's predictions on them (B heads on 2n rows: most of
    #: this attack's time at 10^4 members) do not depend on the release.
    _reference: _ReferenceMemo | None = None

    def fit(self, context: ShadowContext) -> None:
        self._reference = None
        bank = context.offline_bank()
        self.predictors = bank.predictors
        phi = _phi(bank)
        out = ~bank.in_mask
        fixed = self.config.lira_fixed_variance
        self.fixed_std = pooled_std(phi, out) if fixed in (None, True) else None
        mean, std = leave_one_out_fit(phi, out, location=self.config.lira_location)
        scores = (phi - mean) / _std(std, self.fixed_std)
        self.threshold = _fit_loo_threshold(scores.reshape(-1), bank.in_mask.reshape(-1))

    def score(self, query: TargetQuery) -> AttackScores:
        if self.predictors is None or self.threshold is None:
            raise RuntimeError(f"attack {self.name!r} was scored before fit()")
        mean, std = self._reference_fit(self.predictors, query)
        s = (logit_confidence(query.proba, query.labels) - mean) / _std(std, self.fixed_std)
        return AttackScores(scores=s, decisions=self.threshold.apply(s, query.labels))

    def _reference_fit(
        self, predictors: tuple[Predictor, ...], query: TargetQuery
    ) -> tuple[FloatArray, FloatArray]:
        """Each row's out-Gaussian over the references, computed once per set of rows."""
        memo = self._reference
        if memo is not None and memo.matches(query):
            return memo.mean, memo.std
        ref = logit_confidence(predict_heads(predictors, query.features), query.labels)  # (N, q)
        mean, std = fit_gaussian(ref.T, location=self.config.lira_location)
        self._reference = _ReferenceMemo.of(query, mean=mean, std=std)
        return mean, std


@dataclass(frozen=True)
class _ReferenceMemo:
    """The references' Gaussians on one query's rows, and what tells those rows again.

    The query's features are kept by reference with their version counter, not copied (a copy
    is 200 MB at 5*10^4 members, kept for the whole run): torch bumps the counter on every
    in-place write to the tensor or a view of it, so an unchanged counter means unchanged
    values, and ``torch.equal`` against them is the same test as against a copy. (Writes
    through a numpy array sharing its memory are not counted; the harness never writes its
    evaluation rows.)
    """

    features: torch.Tensor
    version: int
    labels: npt.NDArray[np.int64]
    mean: FloatArray
    std: FloatArray

    @classmethod
    def of(cls, query: TargetQuery, *, mean: FloatArray, std: FloatArray) -> _ReferenceMemo:
        f = query.features
        return cls(features=f, version=f._version, labels=query.labels.copy(), mean=mean, std=std)

    def matches(self, query: TargetQuery) -> bool:
        return (
            self.features._version == self.version
            and np.array_equal(self.labels, query.labels)
            and torch.equal(self.features, query.features)
        )


@dataclass(frozen=True)
class _Gaussians:
    """Per-candidate Gaussians of ``phi`` over the references of one side (in or out)."""

    mean: FloatArray
    std: FloatArray


@dataclass(frozen=True)
class _CandidateFit:
    """The candidates' features (a query must ask about exactly these) and their Gaussians."""

    features: torch.Tensor
    out: _Gaussians
    inn: _Gaussians | None = None

    @classmethod
    def of(
        cls,
        context: ShadowContext,
        phi: FloatArray,
        *,
        location: LiraLocation,
        fixed_out: float | None,
        fixed_in: float | None = None,
        with_in: bool = False,
    ) -> _CandidateFit:
        """Fit each candidate's out-Gaussian (and in-Gaussian) over the online bank's
        references (``phi`` on its rows): the candidates are the bank's rows after its pool
        rows; their features are kept as given (:meth:`ShadowContext.candidate_features`)."""
        bank, n_pool = context.online_bank()
        c_phi = phi[:, n_pool:].T  # (q, N): every reference on every candidate
        mask = bank.in_mask[:, n_pool:].T

        def side(selected: BoolArray, fixed: float | None) -> _Gaussians:
            mean, std = fit_gaussian(c_phi, selected, location=location)
            return _Gaussians(mean=mean, std=_std(std, fixed))

        return cls(
            features=context.candidate_features(),
            out=side(~mask, fixed_out),
            inn=side(mask, fixed_in) if with_in else None,
        )

    def check(self, name: str, query: TargetQuery) -> None:
        """Refuse a query about other examples than the candidates fitted."""
        q = query.features.to(self.features)
        if q.shape != self.features.shape or not torch.equal(q, self.features):
            raise ValueError(
                f"{name} was prepared for other candidates: the target's evaluation features "
                f"{tuple(query.features.shape)} differ from those given at preparation"
            )


@register_attack(AttackKind.LIRA_ONLINE)
class LiraOnlineAttack(Attack):
    """Online LiRA: the log likelihood ratio of in- and out-Gaussians fitted per candidate."""

    banks = frozenset({"online"})
    fitted: _CandidateFit | None = None
    threshold: Threshold | None = None

    def fit(self, context: ShadowContext) -> None:
        bank, _ = context.online_bank()
        phi = _phi(bank)
        inn, out = bank.in_mask, ~bank.in_mask
        loc = self.config.lira_location
        fixed = self.config.lira_fixed_variance is True  # None: per example, online
        fix_in = pooled_std(phi, inn) if fixed else None
        fix_out = pooled_std(phi, out) if fixed else None
        # Thresholds leave one head out: each reference plays the target and the others are
        # its references, on every row of the bank (the candidates' membership in the
        # victim is never used, only in the attacker's own heads).
        mi, si = leave_one_out_fit(phi, inn, location=loc)
        mo, so = leave_one_out_fit(phi, out, location=loc)
        with np.errstate(invalid="ignore"):
            loo = gaussian_logpdf(phi, mi, _std(si, fix_in)) - gaussian_logpdf(
                phi, mo, _std(so, fix_out)
            )
        self.threshold = _fit_loo_threshold(loo.reshape(-1), inn.reshape(-1))
        self.fitted = _CandidateFit.of(
            context, phi, location=loc, fixed_out=fix_out, fixed_in=fix_in, with_in=True
        )

    def score(self, query: TargetQuery) -> AttackScores:
        f = self.fitted
        if f is None or f.inn is None or self.threshold is None:
            raise RuntimeError(f"attack {self.name!r} was scored before fit()")
        f.check(self.name, query)
        phi = logit_confidence(query.proba, query.labels)
        s = gaussian_logpdf(phi, f.inn.mean, f.inn.std) - gaussian_logpdf(
            phi, f.out.mean, f.out.std
        )
        return AttackScores(scores=s, decisions=self.threshold.apply(s, query.labels))


@register_attack(AttackKind.LIRA_OFFLINE)
class LiraOfflineAttack(Attack):
    """Offline LiRA at full strength (Carlini et al. 2022, Sec. IV-C and VI-A): the references
    train on random halves of the candidates (and pool), and each candidate is scored against
    the Gaussian of the ``N / 2`` references that did not train on it."""

    banks = frozenset({"online"})
    fitted: _CandidateFit | None = None
    threshold: Threshold | None = None

    def fit(self, context: ShadowContext) -> None:
        bank, _ = context.online_bank()
        phi = _phi(bank)
        out = ~bank.in_mask
        loc = self.config.lira_location
        fixed = self.config.lira_fixed_variance in (None, True)  # None: pooled, offline
        fix_out = pooled_std(phi, out) if fixed else None
        # each reference in turn plays the target; the others' out-Gaussians score it
        mo, so = leave_one_out_fit(phi, out, location=loc)
        with np.errstate(invalid="ignore"):
            loo = (phi - mo) / _std(so, fix_out)
        self.threshold = _fit_loo_threshold(loo.reshape(-1), bank.in_mask.reshape(-1))
        self.fitted = _CandidateFit.of(context, phi, location=loc, fixed_out=fix_out)

    def score(self, query: TargetQuery) -> AttackScores:
        f = self.fitted
        if f is None or self.threshold is None:
            raise RuntimeError(f"attack {self.name!r} was scored before fit()")
        f.check(self.name, query)
        s = (logit_confidence(query.proba, query.labels) - f.out.mean) / f.out.std
        return AttackScores(scores=s, decisions=self.threshold.apply(s, query.labels))
