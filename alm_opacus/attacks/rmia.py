"""RMIA, the relative membership inference attack of Zarifzadeh, Liu & Shokri (ICML 2024).

RMIA (paper Sec. 3) tests a candidate ``x`` against *population samples* ``z`` (records the
target never trained on) instead of against a parametric model of ``x``'s own spread:

- ``Pr(x|θ)``: the model's softmax probability of ``x``'s true label;
- ``Pr(x)``: its marginal over models, the mean of ``Pr(x|θ')`` over reference models ``θ'``;
- the pairwise likelihood ratio ``LR_θ(x, z) = (Pr(x|θ) / Pr(x)) / (Pr(z|θ) / Pr(z))``
  (Sec. 3, Bayes' rule applied to ``Pr(θ|x) / Pr(θ|z)``);
- the score ``Score(x; θ) = Pr_z[LR_θ(x, z) >= γ]``, the fraction of population samples
  that ``x`` dominates by a factor ``γ`` (Sec. 3); a member iff the score reaches a threshold.

Two attackers, on the same reference heads as LiRA (the online bank: each head trains on a
random half of the candidates, so each candidate is *in* for half of them):

- ``rmia-online``: ``Pr(x)`` averages over all references, *in* and *out*;
- ``rmia-offline``: only the references that did not train on ``x``, with the paper's linear
  approximation of the missing *in* half (Sec. 3, offline setting):
  ``Pr(x) = ½((1 + a)·Pr_OUT(x) + (1 − a))``, i.e. ``Pr_IN(x) ≈ a·Pr_OUT(x) + (1 − a)``.

``Pr(z)`` is computed the same way from the references (offline: those that did not train on
``z``, all of them when the pool is not in the bank). The population samples are
``rmia_population`` rows of the attacker's pool, never candidates, and the release is queried
on them once per scoring (``TargetQuery.predict``).

Computation. ``LR_θ(x, z) >= γ`` iff ``r(z) <= r(x) − log γ`` with
``r = log Pr(·|θ) − log Pr(·)``, so a score is one ``searchsorted`` of ``r(x) − log γ`` in
the sorted ``r(z)``: ``O((n + Z) log Z)``, never an ``(n, Z)`` matrix. Working in logs, with
``1 − p`` summed from the other classes (``scores._true_and_rest``), keeps confident
examples apart where ``p`` rounds to 1. For one target, the score is the empirical CDF of
``r(z)`` at ``r(x) − log γ``: a non-decreasing function of ``r(x)``, so ``γ`` and the
population change the ROC only through ties (where no ``r(z)`` separates two candidates).

Thresholds (for ``mia_accuracy``) are chosen as LiRA's, leave one head out: each reference
in turn plays the target, the others are its references, and its population is the sampled
pool rows it did not train on; the candidates' rows of the bank are scored.
"""

from __future__ import annotations

import math
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from fractions import Fraction
from typing import ClassVar

import numpy as np
import numpy.typing as npt
import torch

from alm_opacus.attacks.base import AttackKind, BoolArray, FloatArray
from alm_opacus.attacks.context import ShadowContext
from alm_opacus.attacks.lira import _fit_loo_threshold
from alm_opacus.attacks.registry import Attack, AttackScores, TargetQuery, register_attack
from alm_opacus.attacks.scores import BLOCK_ROWS, _true_and_rest
from alm_opacus.attacks.shadow_data import HeadBank, subseed, to_numpy
from alm_opacus.attacks.thresholds import Threshold

_TINY = float(np.finfo(np.float64).tiny)


@dataclass(frozen=True)
class Signal:
    """``Pr(x|θ)`` of heads (B, m) (or of one release, (m,)) on ``m`` rows.

    Attributes:
        p: the true-class probability.
        rest: ``1 − p``, summed from the other classes (exact where ``p`` rounds to 1).
        log_p: ``log p``, from ``rest`` where ``p`` is close to 1.
    """

    p: FloatArray
    rest: FloatArray
    log_p: FloatArray

    @classmethod
    def of(cls, proba: FloatArray, labels: npt.NDArray[np.int64]) -> Signal:
        """From probabilities (..., m, C) and labels (m,)."""
        p, rest, log_p = _true_and_rest(proba, labels)
        return cls(p=p, rest=rest, log_p=log_p)


def log_marginal(
    p_mean: FloatArray, rest_mean: FloatArray, *, offline_a: float | None
) -> FloatArray:
    """``log Pr(x)`` from the references' mean ``Pr(x|θ')`` and mean ``1 − Pr(x|θ')``.

    Online (``offline_a=None``) the mean itself. Offline, the mean is ``Pr_OUT(x)`` and
    ``Pr(x) = ½((1 + a)·Pr_OUT(x) + (1 − a))`` (Zarifzadeh et al., Sec. 3), for which
    ``1 − Pr(x) = ½(1 + a)·(1 − Pr_OUT(x))``: the complement is scaled, not subtracted,
    so ``log Pr(x) = log1p(−(1 − Pr(x)))`` stays exact near 1.

    Returns:
        ``log Pr(x)``, NaN where the mean is NaN (no reference selected).
    """
    if offline_a is not None:
        p_mean = 0.5 * ((1.0 + offline_a) * p_mean + (1.0 - offline_a))
        rest_mean = 0.5 * (1.0 + offline_a) * rest_mean
    with np.errstate(invalid="ignore"):
        near_one = rest_mean < 0.5
        out = np.log(np.clip(p_mean, _TINY, None))
    out[near_one] = np.log1p(-rest_mean[near_one])
    return out


def relative_scores(
    log_ratio_x: FloatArray, log_ratio_z: FloatArray, *, gamma: float
) -> FloatArray:
    """``Score(x) = |{z : LR(x, z) >= γ}| / |Z|`` for each ``x``, by sorting.

    Args:
        log_ratio_x: (n,) ``r(x) = log Pr(x|θ) − log Pr(x)``.
        log_ratio_z: (Z,) ``r(z)`` of the population samples; non-finite ones are dropped.
        gamma: ``γ > 0``.

    Returns:
        (n,) scores in [0, 1]; NaN where ``r(x)`` is NaN.

    Raises:
        ValueError: if no population sample has a finite ``r(z)``.
    """
    z = np.sort(log_ratio_z[np.isfinite(log_ratio_z)])
    if z.size == 0:
        raise ValueError("RMIA needs at least one population sample z with a finite ratio")
    # LR(x, z) >= γ  <=>  r(x) − r(z) >= log γ  <=>  r(z) <= r(x) − log γ
    counts = np.searchsorted(z, log_ratio_x - math.log(gamma), side="right")
    scores = counts / z.size
    scores[np.isnan(log_ratio_x)] = np.nan
    return scores


def _selected_mean(values: FloatArray, mask: BoolArray | None) -> FloatArray:
    """Column means of (B, m) ``values`` over the rows selected by ``mask`` (all: None)."""
    if mask is None:
        return np.asarray(values.mean(0))
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.asarray(np.where(mask, values, 0.0).sum(0) / mask.sum(0))


def _leave_one_out_mean(values: FloatArray, mask: BoolArray) -> FloatArray:
    """For each head ``j`` and column ``i``: the mean of ``values[h, i]`` over the heads
    ``h != j`` selected by ``mask[h, i]``; NaN where none remains."""
    own = np.where(mask, values, 0.0)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = (own.sum(0) - own) / (mask.sum(0) - mask)
    return np.asarray(np.maximum(mean, 0.0))  # a difference of sums can round below 0


def leave_one_out_scores(
    x_sig: Signal,
    x_in: BoolArray,
    z_sig: Signal,
    z_in: BoolArray,
    *,
    offline_a: float | None,
    gamma: float,
) -> FloatArray:
    """RMIA's scores with each reference head in turn as the target (for the threshold).

    Head ``j`` plays the target; the heads ``h != j`` are its references (online: all of
    them; offline, ``offline_a`` given: those that did not train on the row); its population
    is the samples it did not train on, as the victim never trained on the pool.

    Args:
        x_sig: (B, n) the heads' signal on the rows to score.
        x_in: (B, n) which heads trained on each of them.
        z_sig: (B, Z) the heads' signal on the population samples.
        z_in: (B, Z) which heads trained on each of those.
        offline_a: offline RMIA's ``a``; ``None`` for online RMIA.
        gamma: ``γ``.

    Returns:
        (B, n) scores; NaN where a row has no reference left (offline) or a head trained on
        every population sample.
    """

    offline = offline_a is not None
    means = _loo_means(x_sig, x_in, offline=offline), _loo_means(z_sig, z_in, offline=offline)
    return _loo_scores(x_sig, z_sig, z_in, means=means, offline_a=offline_a, gamma=gamma)


_Means = tuple[FloatArray, FloatArray]


def _loo_means(sig: Signal, inn: BoolArray, *, offline: bool) -> _Means:
    """Leave-one-head-out means of ``Pr(·|θ')`` and of its complement over the references
    (offline: those out on the row); they do not depend on ``a``."""
    ref = ~inn if offline else np.ones_like(inn)
    return _leave_one_out_mean(sig.p, ref), _leave_one_out_mean(sig.rest, ref)


def _loo_scores(
    x_sig: Signal,
    z_sig: Signal,
    z_in: BoolArray,
    *,
    means: tuple[_Means, _Means],
    offline_a: float | None,
    gamma: float,
) -> FloatArray:
    """:func:`leave_one_out_scores` from the means of :func:`_loo_means` (x's, then z's)."""
    (x_p, x_rest), (z_p, z_rest) = means
    rx = x_sig.log_p - log_marginal(x_p, x_rest, offline_a=offline_a)
    rz = z_sig.log_p - log_marginal(z_p, z_rest, offline_a=offline_a)
    scores = np.full(rx.shape, np.nan)

    def head(j: int) -> None:  # writes row j only: the heads are independent
        outside = ~z_in[j] & np.isfinite(rz[j])
        if outside.any():
            scores[j] = relative_scores(rx[j], rz[j, outside], gamma=gamma)

    # numpy's sorts and searches release the GIL: the caller's intra-op threads (one in a
    # small run's cells, every core in a large one's) score heads side by side
    threads = min(torch.get_num_threads(), rx.shape[0])
    if threads <= 1:
        for j in range(rx.shape[0]):
            head(j)
    else:
        with ThreadPoolExecutor(max_workers=threads) as pool:
            list(pool.map(head, range(rx.shape[0])))
    return scores


def exact_auc(scores: FloatArray, is_member: BoolArray) -> Fraction:
    """The AUC, P(member scored above non-member) + ½ P(tie), as an exact fraction (the
    Mann-Whitney count): ``Σ_members (#non-members below + #non-members at or below)`` over
    ``2·m·n``, by two sorts and two searches (no ROC is built)."""
    pos, neg = np.sort(scores[is_member]), np.sort(scores[~is_member])
    if pos.size == 0 or neg.size == 0:
        raise ValueError("the AUC needs at least one member and one non-member")
    below = np.searchsorted(neg, pos, side="left")
    at_or_below = np.searchsorted(neg, pos, side="right")
    twice_u = int(below.sum()) + int(at_or_below.sum())
    return Fraction(twice_u, 2 * pos.size * neg.size)


#: The offline ``a`` values :func:`tune_offline_a` tries (``a = 1``: ``Pr(x) = Pr_OUT(x)``).
A_GRID = tuple(k / 10 for k in range(11))


def tune_offline_a(
    x_sig: Signal,
    x_in: BoolArray,
    z_sig: Signal,
    z_in: BoolArray,
    *,
    gamma: float,
    grid: tuple[float, ...] = A_GRID,
) -> tuple[float, FloatArray]:
    """Offline RMIA's ``a``, chosen as the RMIA paper does (Zarifzadeh et al., offline
    setting): with the attacker's own reference heads, each in turn the target and the others
    its references, the ``a`` of ``grid`` whose leave-one-out scores separate the heads'
    members best (largest AUC; the first of ties). Uses no victim data.

    Returns:
        The chosen ``a`` and its leave-one-out scores (:func:`leave_one_out_scores`), which
        the attack's threshold is fitted on.
    """
    labels = x_in.reshape(-1)
    # the means do not depend on a: computed once; each a's AUC is compared exactly
    means = _loo_means(x_sig, x_in, offline=True), _loo_means(z_sig, z_in, offline=True)
    found: list[tuple[float, FloatArray]] = []
    best_auc = Fraction(-1)
    for a in grid:
        scores = _loo_scores(x_sig, z_sig, z_in, means=means, offline_a=a, gamma=gamma)
        flat = scores.reshape(-1)
        ok = np.isfinite(flat)
        if not ok.any() or labels[ok].all() or not labels[ok].any():
            found = found or [(a, scores)]  # no AUC anywhere: the first of the grid
            continue
        auc = exact_auc(flat[ok], labels[ok])
        if auc > best_auc:
            found, best_auc = [(a, scores)], auc
    return found[0]


@dataclass(frozen=True)
class _Fitted:
    """What scoring a release needs: the candidates (a query must ask about exactly these),
    their ``log Pr(x)``, and the population samples with their ``log Pr(z)``."""

    features: torch.Tensor
    log_px: FloatArray
    z_features: torch.Tensor
    z_labels: npt.NDArray[np.int64]
    log_pz: FloatArray
    population_rows: npt.NDArray[np.int64]


class _RmiaAttack(Attack):
    """RMIA on the online bank; subclasses choose online or offline ``Pr(x)``."""

    online: ClassVar[bool] = True
    queries_release: ClassVar[bool] = True  # on the population samples z
    banks = frozenset({"online"})
    fitted: _Fitted | None = None
    threshold: Threshold | None = None

    #: Offline ``a`` chosen by :meth:`fit` when ``rmia_offline_a`` is None (tuned).
    tuned_a: float | None = None

    @property
    def offline_a(self) -> float | None:
        if self.online:
            return None
        chosen = self.config.rmia_offline_a
        return self.tuned_a if chosen is None else chosen

    def _references(self, in_mask: BoolArray) -> BoolArray | None:
        """The references ``Pr(·)`` averages over: all (online), or those out (offline)."""
        return None if self.online else ~in_mask

    def fit(self, context: ShadowContext) -> None:
        bank, n_pool = context.online_bank()
        cfg = self.config
        x_sig = Signal.of(bank.proba[:, n_pool:], _labels(bank.labels[n_pool:]))
        x_in = bank.in_mask[:, n_pool:]
        pool = context.knowledge
        num_pool = int(pool.features.shape[0])
        rng = np.random.default_rng(subseed(self.seed, "rmia-population"))
        rows = np.sort(rng.choice(num_pool, size=min(cfg.rmia_population, num_pool), replace=False))
        z_features, z_labels = pool.features[rows], _labels(pool.labels[rows])
        if n_pool > 0:  # the bank's first rows are the pool, in order: some heads trained on z
            z_sig = Signal.of(bank.proba[:, rows], z_labels)
            z_in = bank.in_mask[:, rows]
        else:
            z_sig = _bank_signal(bank, z_features, z_labels)
            z_in = np.zeros((bank.num_heads, rows.size), dtype=bool)
        if not self.online and cfg.rmia_offline_a is None:
            self.tuned_a, loo = tune_offline_a(x_sig, x_in, z_sig, z_in, gamma=cfg.rmia_gamma)
            self.notes = (
                f"{self.name}: a = {self.tuned_a:g}, tuned on the attacker's own references "
                "(each plays the target, the others score it; the largest AUC over a grid)",
            )
        else:  # the scores at the given a (tuning computed them already)
            loo = leave_one_out_scores(
                x_sig, x_in, z_sig, z_in, offline_a=self.offline_a, gamma=cfg.rmia_gamma
            )
        self.threshold = _fit_loo_threshold(loo.reshape(-1), x_in.reshape(-1))
        x_ref, z_ref = self._references(x_in), self._references(z_in)
        self.fitted = _Fitted(
            features=context.candidate_features(),
            log_px=log_marginal(
                _selected_mean(x_sig.p, x_ref),
                _selected_mean(x_sig.rest, x_ref),
                offline_a=self.offline_a,
            ),
            z_features=z_features,
            z_labels=z_labels,
            log_pz=log_marginal(
                _selected_mean(z_sig.p, z_ref),
                _selected_mean(z_sig.rest, z_ref),
                offline_a=self.offline_a,
            ),
            population_rows=rows,
        )

    def score(self, query: TargetQuery) -> AttackScores:
        f = self.fitted
        if f is None or self.threshold is None:
            raise RuntimeError(f"attack {self.name!r} was scored before fit()")
        q = query.features.to(f.features)
        if q.shape != f.features.shape or not torch.equal(q, f.features):
            raise ValueError(
                f"{self.name} was prepared for other candidates: the target's evaluation "
                f"features {tuple(query.features.shape)} differ from those given at preparation"
            )
        if query.predict is None:
            raise ValueError(
                f"{self.name} queries the release on {f.z_labels.size} rows of the attacker's "
                "pool (its population samples z), but this release is queried with other "
                "inputs than features (AttackTarget.inputs): leave rmia out of its attacks"
            )
        with torch.no_grad():
            z_proba = to_numpy(query.predict(f.z_features))
        expected = (f.z_labels.size, query.proba.shape[1])
        if z_proba.shape != expected or not np.isfinite(z_proba).all():
            raise ValueError(
                f"the release returned shape {z_proba.shape} (or non-finite values) on the "
                f"population samples; expected finite probabilities of shape {expected}"
            )
        rx = Signal.of(query.proba, query.labels).log_p - f.log_px
        rz = Signal.of(z_proba, f.z_labels).log_p - f.log_pz
        s = relative_scores(rx, rz, gamma=self.config.rmia_gamma)
        return AttackScores(scores=s, decisions=self.threshold.apply(s, query.labels))


def _labels(labels: torch.Tensor) -> npt.NDArray[np.int64]:
    return labels.cpu().numpy().astype(np.int64)


def _bank_signal(bank: HeadBank, features: torch.Tensor, labels: npt.NDArray[np.int64]) -> Signal:
    """Every head's signal on rows outside the bank, predicted in blocks so that a large
    population never holds all heads' (B, Z, C) probabilities at once."""
    parts = []
    for start in range(0, int(features.shape[0]), BLOCK_ROWS):
        stop = start + BLOCK_ROWS
        parts.append(Signal.of(bank.predict(features[start:stop]), labels[start:stop]))
    return Signal(
        p=np.concatenate([s.p for s in parts], axis=1),
        rest=np.concatenate([s.rest for s in parts], axis=1),
        log_p=np.concatenate([s.log_p for s in parts], axis=1),
    )


@register_attack(AttackKind.RMIA_ONLINE)
class RmiaOnlineAttack(_RmiaAttack):
    """Online RMIA: ``Pr(x)`` and ``Pr(z)`` average over all reference heads, in and out."""

    online = True


@register_attack(AttackKind.RMIA_OFFLINE)
class RmiaOfflineAttack(_RmiaAttack):
    """Offline RMIA: ``Pr(x)`` from the references that did not train on ``x``, with the
    linear approximation ``Pr(x) = ½((1 + a)·Pr_OUT(x) + (1 − a))``, ``a = rmia_offline_a``
    (None: tuned on the attacker's references, :func:`tune_offline_a`)."""

    online = False
