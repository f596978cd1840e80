"""Shokri et al. (2017) shadow-model attack, with the attack MLP of the ALM paper's appendix.

``k`` shadow heads are trained on halves of the shadow data with the victim's recipe. Each
(shadow head, example) pair is one training pair for the attack classifier: input = the
head's probability vector and the one-hot label, target = whether the example was in that
head's training half. ``attack_pairs`` pairs (ALM appendix: 2,000), balanced in/out, train an
MLP with ``attack_layers`` ReLU hidden layers (ALM appendix: 5). With ``shadow_per_class`` one
MLP per class is trained on that class's pairs (Shokri et al. 2017, Sec. IV-D), all at once.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import numpy.typing as npt
import torch
from torch import Tensor
from torch.nn import functional as F

from alm_opacus.attacks.base import AttackKind, BoolArray, FloatArray
from alm_opacus.attacks.registry import (
    Attack,
    AttackScores,
    ShadowContext,
    TargetQuery,
    concat_pairs,
    register_attack,
)
from alm_opacus.attacks.shadow_data import subseed

MlpParams = list[tuple[Tensor, Tensor]]


def attack_inputs(proba: FloatArray, labels: npt.NDArray[np.int64], num_classes: int) -> Tensor:
    """(P, 2C) float32: the probability vector, then the one-hot label."""
    onehot = np.eye(num_classes, dtype=np.float32)[labels]
    return torch.from_numpy(np.concatenate([proba.astype(np.float32), onehot], axis=1))


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


@register_attack(AttackKind.SHADOW)
class ShadowModelAttack(Attack):
    """The shadow-model attack. Decision: the attack MLP's membership probability >= 1/2."""

    params: MlpParams | None = None
    num_classes: int = 0

    def fit(self, context: ShadowContext) -> None:
        cfg = self.config
        proba, labels, is_member = concat_pairs(context.shadow_bank())
        self.num_classes = c = context.num_classes
        groups = (
            [np.flatnonzero(labels == k) for k in range(c)]
            if cfg.shadow_per_class
            else [np.arange(labels.size)]
        )
        picks = balanced_pairs(
            is_member, groups=groups, size=cfg.attack_pairs, seed=subseed(self.seed, "pairs")
        )
        width = max(1, max(p.size for p in picks))
        x = torch.zeros(len(picks), width, 2 * c)
        y = torch.zeros(len(picks), width)
        weight = torch.zeros(len(picks), width)
        for m, pick in enumerate(picks):
            x[m, : pick.size] = attack_inputs(proba[pick], labels[pick], c)
            y[m, : pick.size] = torch.from_numpy(is_member[pick].astype(np.float32))
            weight[m, : pick.size] = 1.0
        sizes = [int(p.size) for p in picks]
        if min(sizes) < cfg.attack_pairs:
            scope = "per class (min over classes)" if cfg.shadow_per_class else "in total"
            self.notes = (
                f"attack MLP trained on {min(sizes)} balanced pairs {scope}, fewer than "
                f"attack_pairs={cfg.attack_pairs}: the shadow data holds no more",
            )
        self.params = train_mlp(
            x,
            y,
            weight,
            hidden=cfg.attack_hidden,
            layers=cfg.attack_layers,
            steps=cfg.attack_steps,
            lr=cfg.attack_lr,
            seed=subseed(self.seed, "mlp"),
        )

    def score(self, query: TargetQuery) -> AttackScores:
        if self.params is None:
            raise RuntimeError("attack 'shadow' was scored before fit()")
        x = attack_inputs(query.proba, query.labels, self.num_classes)
        with torch.no_grad():
            logits = mlp_logits(self.params, x.unsqueeze(0).expand(len(self.params[0][0]), -1, -1))
        rows = query.labels if self.config.shadow_per_class else np.zeros_like(query.labels)
        s = logits.double().numpy()[rows, np.arange(rows.size)]
        return AttackScores(scores=s, decisions=s >= 0.0)
