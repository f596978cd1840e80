"""Shokri et al. (2017) shadow-model attack, with features in which membership shows.

``k`` shadow heads are trained on ``n`` rows of the shadow data each, with the victim's
recipe. Each (shadow head, example) pair is one training pair for the attack classifier:
target = whether the example was in that head's training rows; input = :func:`attack_features`
of the head's probability vector and the example's label, standardised with the mean and
spread of the shadow pairs (never of the evaluation set).

The ALM appendix feeds the raw probability vector and the one-hot label. Raw probabilities
hide the signal: every confident example sits at ``p_y ~ 1`` whether it was trained on or
not, and the difference is in how close to 1 (``1 - p_y`` of 1e-6 against 1e-3). The
features are therefore on a log scale: the logit-scaled confidence
``phi = log(p_y / (1 - p_y))`` (Carlini et al. 2022, Sec. IV-A), ``log p_y`` (the loss), the
log of the probability vector sorted in decreasing order (the shape of the prediction,
independent of the class order), and the one-hot label.

Two classifiers (``AttackConfig.shadow_model``):

- ``mlp``: the ALM appendix's MLP with ``attack_layers`` (5) ReLU hidden layers, Adam at
  ``attack_lr`` (0.001), trained full batch on ``attack_pairs`` (2,000) balanced pairs;
- ``gbm``: scikit-learn's ``HistGradientBoostingClassifier`` on every balanced pair, up to
  :data:`GBM_PAIRS` (2^19) unless ``attack_pairs`` says otherwise;
- ``auto``: both are trained on the pairs of three quarters of the shadow examples and scored
  on the pairs of the held-out quarter (examples the classifiers never saw in any head); the
  one with the larger held-out AUC is refitted on all pairs. The evaluation set is never used.

With ``shadow_per_class`` one classifier per class is trained on that class's pairs
(Shokri et al. 2017, Sec. IV-D). The decision is member iff the classifier's log-odds >= 0.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt
import torch
from threadpoolctl import threadpool_limits
from torch import Tensor
from torch.nn import functional as F

from alm_opacus.attacks.base import AttackConfig, AttackKind, BoolArray, FloatArray, ShadowModel
from alm_opacus.attacks.context import ShadowContext, concat_pairs
from alm_opacus.attacks.metrics import roc_auc, roc_curve
from alm_opacus.attacks.registry import Attack, AttackScores, TargetQuery, register_attack
from alm_opacus.attacks.scores import logit_confidence, loss_score
from alm_opacus.attacks.shadow_data import subseed

if TYPE_CHECKING:
    from sklearn.ensemble import HistGradientBoostingClassifier

MlpParams = list[tuple[Tensor, Tensor]]
Scorer = Callable[[FloatArray], FloatArray]
"""A fitted classifier: (P, F) standardised features -> (P,) membership log-odds."""

_TINY = float(np.finfo(np.float64).tiny)
#: Rows per block of :func:`attack_features` (row-wise: any block size gives the same values).
_ROWS_PER_BLOCK = 1 << 16
#: Rows per block of :meth:`Standardiser.fit` (one block below it: numpy's own statistics).
_STATS_ROWS = 1 << 20
#: Shadow pairs whose features take more than this are never held whole (:func:`fitted_rows`).
_WHOLE_BYTES = 1 << 29
HELD_OUT_FRACTION = 0.25
"""Share of the shadow examples whose pairs ``auto`` holds out to compare the classifiers."""


def attack_features(proba: FloatArray, labels: npt.NDArray[np.int64]) -> FloatArray:
    """(P, 2 + 2C) float64: ``phi``, ``log p_y``, log of the sorted probabilities, one-hot.

    ``phi`` and ``log p_y`` are computed as in ``scores.py`` (``1 - p_y`` summed from the other
    classes), so confident examples stay apart where ``p_y`` rounds to 1.
    """
    num_classes = proba.shape[-1]
    out = np.empty((len(proba), 2 + 2 * num_classes))
    # Row blocks into one output: every column is a function of its row alone, so the values
    # are those of the whole; the temporaries stay bounded (the shadow pairs are B 2n rows,
    # and whole-array temporaries cost several copies of the output at 10^5 members).
    for start in range(0, len(proba), _ROWS_PER_BLOCK):
        p, y = proba[start : start + _ROWS_PER_BLOCK], labels[start : start + _ROWS_PER_BLOCK]
        block = out[start : start + len(p)]
        block[:, 0] = logit_confidence(p, y)
        block[:, 1] = loss_score(p, y)
        ranked = block[:, 2 : 2 + num_classes]
        np.negative(np.sort(-p, axis=-1), out=ranked)
        np.log(np.clip(ranked, _TINY, None, out=ranked), out=ranked)
        block[:, 2 + num_classes :] = np.eye(num_classes)[y]
    return out


@dataclass(frozen=True)
class Standardiser:
    """``(x - mean) / scale`` per column, fitted on shadow pairs only."""

    mean: FloatArray
    scale: FloatArray

    @classmethod
    def fit(cls, x: FloatArray) -> Standardiser:
        """Column means and standard deviations (two passes over row blocks). Up to
        :data:`_STATS_ROWS` rows, one block: ``x.mean(0)`` and ``x.std(0)`` bit for bit; past
        it (the shadow pairs of ~10^4 members and more: B 2n rows), temporaries of a block's
        size instead of two of the whole array's."""
        blocks = [x[i : i + _STATS_ROWS] for i in range(0, max(len(x), 1), _STATS_ROWS)]
        mean = _sum_rows(blocks) / len(x)
        deviations = (np.multiply(d, d, out=d) for d in (b - mean for b in blocks))
        scale = np.sqrt(_sum_rows(deviations) / len(x))
        return cls(mean=mean, scale=np.where(scale > 0, scale, 1.0))

    def __call__(self, x: FloatArray, *, in_place: bool = False) -> FloatArray:
        """Standardised ``x``; with ``in_place``, written over ``x`` (the same values, without
        a second array of the shadow pairs' size)."""
        if not in_place:
            return (x - self.mean) / self.scale
        x -= self.mean
        x /= self.scale
        return x


def fitted_rows(
    proba: FloatArray, labels: npt.NDArray[np.int64], rows: npt.NDArray[np.int64] | None
) -> tuple[Standardiser, FloatArray]:
    """The :class:`Standardiser` of every shadow pair's :func:`attack_features`, and the
    standardised features of the pairs ``rows`` (in that order; ``None``: every pair).

    Bit for bit ``Standardiser.fit(f)`` and ``f[rows]`` standardised, for ``f`` the features
    of every pair. Past :data:`_WHOLE_BYTES` of features (about 23,000 members' 64 shadow
    heads) ``f`` is never held whole: the statistics take two passes over the blocks of
    :meth:`Standardiser.fit`, computing each block's features again in the second, and only
    the rows asked for are kept (1.1 GB of features at 5*10^4 members, against the 2^19 pairs
    boosting trains on).
    """
    width = 2 + 2 * proba.shape[-1]
    if rows is None or len(proba) * width * 8 <= _WHOLE_BYTES:
        feats = attack_features(proba, labels)
        scaler = Standardiser.fit(feats)
        return scaler, scaler(feats if rows is None else feats[rows], in_place=True)
    starts = range(0, len(proba), _STATS_ROWS)

    def block(start: int) -> FloatArray:
        end = start + _STATS_ROWS
        return attack_features(proba[start:end], labels[start:end])

    order = np.argsort(rows, kind="stable")
    out = np.empty((len(rows), width))
    edges = np.searchsorted(rows[order], [*starts, len(proba)])

    def first_pass() -> Iterator[FloatArray]:  # each block, after keeping its asked rows
        for i, start in enumerate(starts):
            feats = block(start)
            mine = order[edges[i] : edges[i + 1]]
            out[mine] = feats[rows[mine] - start]
            yield feats

    mean = _sum_rows(first_pass()) / len(proba)
    # a block is computed afresh, so its deviations can overwrite it: the same values as
    # Standardiser.fit's, one block's memory instead of two
    deviations = (np.square(np.subtract(d, mean, out=d), out=d) for d in map(block, starts))
    spread = np.sqrt(_sum_rows(deviations) / len(proba))
    scaler = Standardiser(mean=mean, scale=np.where(spread > 0, spread, 1.0))
    return scaler, scaler(out, in_place=True)


def _sum_rows(blocks: Iterable[FloatArray]) -> FloatArray:
    """Column sums of stacked row blocks (one block: its own ``sum(axis=0)``, bit for bit)."""
    total: FloatArray | None = None
    for block in blocks:
        part = block.sum(axis=0)
        total = part if total is None else total + part
    assert total is not None
    return total


def init_mlp(sizes: list[int], *, models: int, generator: torch.Generator) -> MlpParams:
    """``models`` independent MLPs with PyTorch's default ``nn.Linear`` initialisation."""
    params = []
    for fan_in, fan_out in itertools.pairwise(sizes):
        bound = 1.0 / math.sqrt(fan_in)
        w = (torch.rand(models, fan_in, fan_out, generator=generator) * 2 - 1) * bound
        b = (torch.rand(models, 1, fan_out, generator=generator) * 2 - 1) * bound
        params.append((w.requires_grad_(True), b.requires_grad_(True)))
    return params


def mlp_logits(params: MlpParams, x: Tensor) -> Tensor:
    """(M, P, in) -> (M, P) logits; ReLU after every layer but the last."""
    h = x
    for i, (w, b) in enumerate(params):
        h = torch.baddbmm(b, h, w)
        if i < len(params) - 1:
            h = torch.relu(h)
    return h[..., 0]


def train_mlp(
    x: Tensor,
    y: Tensor,
    weight: Tensor,
    *,
    hidden: int,
    layers: int,
    steps: int,
    lr: float,
    seed: int,
) -> MlpParams:
    """Train ``M`` binary MLPs at once, full batch with Adam, on padded pairs.

    Args:
        x: (M, P, in) inputs; y: (M, P) 0/1 targets; weight: (M, P) 1 for real pairs, 0 for
            padding. Each model minimises its own mean BCE; the sum decouples under Adam.
    """
    g = torch.Generator().manual_seed(seed)
    params = init_mlp([x.shape[-1], *[hidden] * layers, 1], models=x.shape[0], generator=g)
    flat = [t for pair in params for t in pair]
    opt = torch.optim.Adam(flat, lr=lr)
    denom = weight.sum(1).clamp_min(1)
    for _ in range(steps):
        opt.zero_grad(set_to_none=True)
        bce = F.binary_cross_entropy_with_logits(mlp_logits(params, x), y, reduction="none")
        loss = ((bce * weight).sum(1) / denom).sum()
        loss.backward()
        opt.step()
    return [(w.detach(), b.detach()) for w, b in params]


def balanced_pairs(
    is_member: BoolArray, *, groups: list[npt.NDArray[np.int64]], size: int, seed: int
) -> list[npt.NDArray[np.int64]]:
    """Per group, ``size // 2`` in- and as many out-pairs (fewer if the group lacks them)."""
    rng = np.random.default_rng(seed)
    out = []
    for group in groups:
        ins, outs = group[is_member[group]], group[~is_member[group]]
        half = min(size // 2, ins.size, outs.size)
        pick = np.r_[rng.choice(ins, half, replace=False), rng.choice(outs, half, replace=False)]
        out.append(rng.permutation(pick))
    return out


def fit_mlp(
    x: FloatArray,
    y: BoolArray,
    picks: list[npt.NDArray[np.int64]],
    *,
    config: AttackConfig,
    seed: int,
) -> list[Scorer]:
    """One MLP per group of pair indices, all trained in one batch."""
    width = max(1, max(p.size for p in picks))
    xs = torch.zeros(len(picks), width, x.shape[1])
    ys = torch.zeros(len(picks), width)
    weight = torch.zeros(len(picks), width)
    for m, pick in enumerate(picks):
        xs[m, : pick.size] = torch.from_numpy(x[pick].astype(np.float32))
        ys[m, : pick.size] = torch.from_numpy(y[pick].astype(np.float32))
        weight[m, : pick.size] = 1.0
    params = train_mlp(
        xs,
        ys,
        weight,
        hidden=config.attack_hidden,
        layers=config.attack_layers,
        steps=config.attack_steps,
        lr=config.attack_lr,
        seed=seed,
    )

    def scorer(m: int) -> Scorer:
        one = [(w[m : m + 1], b[m : m + 1]) for w, b in params]

        def score(z: FloatArray) -> FloatArray:
            with torch.no_grad():
                logits = mlp_logits(one, torch.from_numpy(z.astype(np.float32))[None])
            return logits[0].double().numpy()

        return score

    return [scorer(m) for m in range(len(picks))]


def fit_gbm(
    x: FloatArray,
    y: BoolArray,
    picks: list[npt.NDArray[np.int64]],
    *,
    config: AttackConfig,
    seed: int,
) -> list[Scorer]:
    """One gradient-boosting classifier per group (scikit-learn's defaults, seeded)."""
    # imported here: scikit-learn's ensemble costs most of a second at every start of the CLI
    # (a --resume with nothing to compute included), and only this attacker uses it
    from sklearn.ensemble import HistGradientBoostingClassifier

    del config
    scorers: list[Scorer] = []
    for pick in picks:
        if np.unique(y[pick]).size < 2:  # a class without in- or out-pairs: no signal
            scorers.append(_constant)
            continue
        model = HistGradientBoostingClassifier(random_state=seed % 2**32)
        whole = pick.size == len(x) and bool((pick == np.arange(len(x))).all())
        # the caller's intra-op threads: one in a small run's cells, where many small fits
        # gain nothing from threads; every core for 10^6 pairs (``run.evaluation.cell_threads``)
        with threadpool_limits(limits=torch.get_num_threads()):
            model.fit(x if whole else x[pick], y if whole else y[pick])
        scorers.append(_decision(model))
    return scorers


def _constant(z: FloatArray) -> FloatArray:
    return np.zeros(len(z))


def _decision(model: HistGradientBoostingClassifier) -> Scorer:
    def score(z: FloatArray) -> FloatArray:
        with threadpool_limits(limits=torch.get_num_threads()):
            return np.asarray(model.decision_function(z), dtype=np.float64)

    return score


_FITTERS: dict[ShadowModel, Callable[..., list[Scorer]]] = {
    ShadowModel.MLP: fit_mlp,
    ShadowModel.GBM: fit_gbm,
}
#: Gradient boosting's default pairs: every balanced pair up to ~4,000 members (64 heads on
#: 2n rows), 2^19 past it. Measured at 2*10^4 members (2.56 million pairs, scikit-learn 1.9, one
#: thread): AUC 0.5196 on every pair, 0.5204 on 2^20, 0.5192 on 2^19, all within the AUC's own
#: interval (~+-0.006 on 4*10^4 rows), while the fit took 31 s on every pair and 8.8 s on 2^20;
#: at 5*10^4 members every pair was 6.4 million rows (~54 s and ~2.4 GB per fit, one fit per
#: cell). 2^19 halves the fit again, the largest single cost of a cell at 10^4 members.
GBM_PAIRS = 2**19
_DEFAULT_PAIRS: dict[ShadowModel, int] = {
    ShadowModel.MLP: 2000,  # the ALM appendix; full-batch MLP cost grows with the pairs
    ShadowModel.GBM: GBM_PAIRS,
}


def pair_count(config: AttackConfig, model: ShadowModel) -> int:
    """Balanced pairs (per attack model) that train ``model``."""
    return config.attack_pairs if config.attack_pairs is not None else _DEFAULT_PAIRS[model]


def _groups(
    labels: npt.NDArray[np.int64], rows: npt.NDArray[np.int64], per_class: bool, num_classes: int
) -> list[npt.NDArray[np.int64]]:
    if not per_class:
        return [rows]
    return [rows[labels[rows] == k] for k in range(num_classes)]


@register_attack(AttackKind.SHADOW)
class ShadowModelAttack(Attack):
    """The shadow-model attack. Decision: the classifier's log-odds >= 0.

    After ``fit``, ``chosen`` is the classifier used and ``held_out_auc`` the held-out AUC of
    each classifier compared (``auto`` only).
    """

    banks = frozenset({"shadow"})
    scorers: list[Scorer] | None = None
    standardise: Standardiser | None = None
    chosen: ShadowModel | None = None
    held_out_auc: dict[str, float] | None = None

    def fit(self, context: ShadowContext) -> None:
        self.begin_fit(context)()

    def begin_fit(self, context: ShadowContext) -> Callable[[], None]:
        """The pairs' features now; the classifier's training returned: it keeps the picked
        pairs (at most ``pair_count`` rows), not the bank, so the bank can be let go while it
        trains (``runner.prepare_attacks``)."""
        cfg = self.config
        bank = context.shadow_bank()
        proba, labels, is_member = concat_pairs(bank)
        c = context.num_classes
        all_rows = np.arange(labels.size)
        notes: list[str] = []
        chosen = cfg.shadow_model
        x: FloatArray | None = None
        if chosen is ShadowModel.AUTO:  # compares the classifiers on every pair's features
            self.standardise, x = fitted_rows(proba, labels, None)
            chosen = self._select(
                x, labels, is_member, num_examples=bank.in_mask.shape[1], num_classes=c
            )
            notes.append(
                f"shadow model 'auto' chose {chosen.value!r}: held-out shadow AUC "
                + ", ".join(f"{k} {v:.3f}" for k, v in (self.held_out_auc or {}).items())
            )
        wanted = pair_count(cfg, chosen)
        groups = _groups(labels, all_rows, cfg.shadow_per_class, c)
        picks = balanced_pairs(
            is_member, groups=groups, size=wanted, seed=subseed(self.seed, "pairs")
        )
        sizes = [int(p.size) for p in picks]
        scope = "per class (min over classes)" if cfg.shadow_per_class else "in total"
        if cfg.attack_pairs is not None and min(sizes) < cfg.attack_pairs:
            notes.append(
                f"attack model trained on {min(sizes)} balanced pairs {scope}, fewer than "
                f"attack_pairs={cfg.attack_pairs}: the shadow data holds no more"
            )
        held = [2 * min(int(is_member[g].sum()), int((~is_member[g]).sum())) for g in groups]
        if cfg.attack_pairs is None and sum(sizes) < sum(held):
            # totals on both sides; with a model per class, the cap is each class's
            where, each = (
                ("over the classes", " per class") if cfg.shadow_per_class else ("in total", "")
            )
            notes.append(
                f"attack model trained on {sum(sizes):,} balanced pairs {where} of the "
                f"{sum(held):,} the shadow heads give: {chosen.value!r} takes at most "
                f"{wanted:,}{each} unless attack_pairs is set"
            )
        y = is_member
        if x is None:  # the features of the picked pairs only, each group's in a row
            rows = np.concatenate(picks)
            self.standardise, x = fitted_rows(proba, labels, rows)
            y = is_member[rows]
            ends = np.cumsum([0, *sizes])
            picks = [np.arange(a, b) for a, b in itertools.pairwise(ends)]
        self.chosen = chosen
        self.notes = tuple(notes)
        rows_x, seed = x, subseed(self.seed, chosen.value)

        def train() -> None:
            self.scorers = _FITTERS[chosen](rows_x, y, picks, config=cfg, seed=seed)

        return train

    def _select(
        self,
        x: FloatArray,
        labels: npt.NDArray[np.int64],
        is_member: BoolArray,
        *,
        num_examples: int,
        num_classes: int,
    ) -> ShadowModel:
        """Compare the classifiers on the pairs of held-out shadow *examples*."""
        cfg = self.config
        rng = np.random.default_rng(subseed(self.seed, "held-out"))
        held = np.zeros(num_examples, dtype=bool)
        held[rng.permutation(num_examples)[: max(1, round(HELD_OUT_FRACTION * num_examples))]] = 1
        pair_held = np.tile(held, x.shape[0] // num_examples)
        train_rows, test_rows = np.flatnonzero(~pair_held), np.flatnonzero(pair_held)
        groups = _groups(labels, train_rows, cfg.shadow_per_class, num_classes)
        self.held_out_auc = {}
        for kind, fitter in _FITTERS.items():
            picks = balanced_pairs(
                is_member,
                groups=groups,
                size=pair_count(cfg, kind),
                seed=subseed(self.seed, "held-out-pairs"),
            )
            scorers = fitter(x, is_member, picks, config=cfg, seed=subseed(self.seed, kind.value))
            s = _apply(scorers, x[test_rows], labels[test_rows], cfg.shadow_per_class)
            roc = roc_curve(scores=s, is_member=is_member[test_rows])
            self.held_out_auc[kind.value] = roc_auc(roc)
        best = max(self.held_out_auc, key=lambda k: self.held_out_auc[k])  # type: ignore[index]
        return ShadowModel(best)

    def score(self, query: TargetQuery) -> AttackScores:
        if self.scorers is None or self.standardise is None:
            raise RuntimeError("attack 'shadow' was scored before fit()")
        x = self.standardise(attack_features(query.proba, query.labels))
        s = _apply(self.scorers, x, query.labels, self.config.shadow_per_class)
        return AttackScores(scores=s, decisions=s >= 0.0)


def _apply(
    scorers: list[Scorer], x: FloatArray, labels: npt.NDArray[np.int64], per_class: bool
) -> FloatArray:
    if not per_class:
        return scorers[0](x)
    out = np.zeros(labels.size)
    for k, scorer in enumerate(scorers):
        rows = np.flatnonzero(labels == k)
        if rows.size:
            out[rows] = scorer(x[rows])
    return out
