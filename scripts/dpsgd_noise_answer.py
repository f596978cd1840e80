#!/usr/bin/env python
"""Logistic (ALM), Laplace and Gaussian DP-SGD at equal (epsilon, delta), heads of growing width.

For each dataset, head (the linear head and one-hidden-layer MLPs), noise mechanism and
epsilon: choose (lr, clip) from a fixed grid of :data:`LR_GRID` x :data:`L2_CLIP_GRID` on the
PUBLIC split only (the same budget for every mechanism; the L1 mechanisms' clips are the L2
clips times sqrt(number of parameters), :func:`clip_grid`), then train ``--draws`` times on the
members with secure noise (``alm_opacus.training.PrivacyEngine``, sigma from the ``alm_pld``
accountant for the target (epsilon, delta)) and report the median test accuracy on the
non-members and the median AUC of the loss attack (members against non-members)::

    python scripts/dpsgd_noise_answer.py --write docs/dpsgd_noise.md

``--write`` replaces the generated block ``answer`` (``scripts/docblocks.py``, atomically);
without it the table is printed only.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from sklearn.metrics import roc_auc_score
from torch import Tensor
from torch.nn import functional as F

from alm_opacus.data import dataset_spec
from alm_opacus.heads import HeadConfig
from alm_opacus.run.config import RunConfig
from alm_opacus.run.harness import plan_run, prepare
from baselines._common import derive_seed
from baselines.dpsgd.accounting import SigmaCache
from baselines.dpsgd.config import TUNING_GRID, DPSGDConfig
from baselines.dpsgd.head import head_size, train_dpsgd_head
from baselines.dpsgd.mechanisms import ALM_TRAINING, l1_clip
from docblocks import relative, write_block

__all__ = [
    "DEPS",
    "L2_CLIP_GRID",
    "LR_GRID",
    "Row",
    "clip_grid",
    "head_params",
    "public_tuning_split",
    "render_table",
    "select_on_public",
]

MECHANISMS = ("gaussian", "alm", "laplace")
#: The tuning grid (lr x clip), four configurations for every mechanism: the ``dpsgd``
#: baseline's (``baselines.dpsgd.config.TUNING_GRID``); per-example gradients of these heads on
#: the SimCLR features have L2 norm of order 1.
LR_GRID = tuple(dict.fromkeys(c["lr"] for c in TUNING_GRID))
L2_CLIP_GRID = tuple(dict.fromkeys(c["max_grad_norm"] for c in TUNING_GRID))
#: What the table depends on besides this script (a change makes the doc's block stale).
DEPS = (
    "alm_opacus/training",
    "alm_opacus/accounting",
    "alm_opacus/mechanisms",
    "alm_opacus/heads.py",
    "alm_opacus/steppers.py",
    "alm_opacus/ssl",
    "alm_opacus/data",
    "baselines/dpsgd",
    "baselines/_common.py",
    "constraints.txt",
)


def head_params(*, d: int, num_classes: int, hidden: int | None) -> int:
    """Trainable parameters of the head: linear (``hidden=None``) or one hidden layer of
    width ``hidden`` (:func:`baselines.dpsgd.head.head_size`)."""
    head = HeadConfig() if hidden is None else HeadConfig(kind="mlp", hidden=hidden)
    return head_size(d=d, num_classes=num_classes, head=head)


def clip_grid(mechanism: str, params: int) -> tuple[float, ...]:
    """The clipping bounds tried for ``mechanism``: :data:`L2_CLIP_GRID` for Gaussian (L2
    clipping); moved to the L1 scale for the L1 mechanisms (:func:`l1_clip`, as the
    ``dpsgd-alm`` and ``dpsgd-laplace`` methods tune)."""
    if mechanism == "gaussian":
        return L2_CLIP_GRID
    return tuple(l1_clip(c, params=params) for c in L2_CLIP_GRID)


def public_tuning_split(
    n_public: int, *, n_members: int, seed: int, min_validation: int = 20
) -> tuple[np.ndarray, np.ndarray]:
    """Indices into the PUBLIC rows: a training part of ``min(n_members, 3/4 of them)`` rows
    and a validation part of the rest (at least ``min_validation``, or a quarter)."""
    n_val = max(min_validation, n_public // 4, n_public - n_members)
    n_train = n_public - n_val
    if n_train < 1:
        raise ValueError(f"{n_public} public rows cannot hold a training and a validation part")
    perm = np.random.default_rng(seed).permutation(n_public)
    return perm[:n_train], perm[n_train:]


def select_on_public(
    candidates: Sequence[DPSGDConfig], score: Callable[[DPSGDConfig], float]
) -> tuple[DPSGDConfig, list[float]]:
    """The candidate with the best public validation score (the first on ties), and the
    scores. ``score`` is the only data access, so nothing but public data can decide."""
    scores = [float(score(c)) for c in candidates]
    best = max(range(len(candidates)), key=lambda i: (scores[i], -i))
    return candidates[best], scores


@dataclass(frozen=True)
class Row:
    """One (dataset, head, mechanism, epsilon) of the table: medians over the draws."""

    dataset: str
    head: str
    params: int
    mechanism: str
    epsilon: float
    sigma: float
    lr: float
    clip: float
    accuracy: float
    auc: float


def render_table(rows: Sequence[Row]) -> str:
    """Markdown: one line per (dataset, head, epsilon), the three mechanisms side by side."""
    mechs = [m for m in MECHANISMS if any(r.mechanism == m for r in rows)]
    header = ["dataset", "head", "params", "ε"]
    header += [f"acc {m}" for m in mechs] + [f"AUC {m}" for m in mechs]
    header += [f"σ / C {m}" for m in mechs]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    keys = dict.fromkeys((r.dataset, r.head, r.params, r.epsilon) for r in rows)
    by = {(r.dataset, r.head, r.epsilon, r.mechanism): r for r in rows}
    for ds, head, params, eps in keys:
        cells = [by.get((ds, head, eps, m)) for m in mechs]
        line = [ds, head, f"{params:,}", f"{eps:g}"]
        line += ["" if c is None else f"{c.accuracy:.3f}" for c in cells]
        line += ["" if c is None else f"{c.auc:.3f}" for c in cells]
        line += ["" if c is None else f"{c.sigma:.3g} / {c.clip:.3g}" for c in cells]
        lines.append("| " + " | ".join(line) + " |")
    return "\n".join(lines) + "\n"


def _loss_auc_and_accuracy(
    head: torch.nn.Module, x_in: Tensor, y_in: Tensor, x_out: Tensor, y_out: Tensor
) -> tuple[float, float]:
    """Test accuracy on the non-members, and the AUC of the loss attack (score: -loss)."""
    with torch.no_grad():
        logits_in, logits_out = head(x_in), head(x_out)
        loss = torch.cat(
            [
                F.cross_entropy(logits_in, y_in, reduction="none"),
                F.cross_entropy(logits_out, y_out, reduction="none"),
            ]
        )
    member = np.r_[np.ones(len(y_in)), np.zeros(len(y_out))]
    auc = float(roc_auc_score(member, -loss.double().numpy()))
    acc = float((logits_out.argmax(1) == y_out).double().mean())
    return acc, auc


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--datasets", default="digits,mnist")
    p.add_argument("--heads", default="linear,16,64,256", help="'linear' or MLP hidden widths")
    p.add_argument(
        "--max-params",
        type=int,
        default=60_000,
        help="skip heads with more parameters (mnist's width-256 MLP, 150,282, takes ~20 s a "
        "run on 2 CPU cores)",
    )
    p.add_argument("--mechanisms", default=",".join(MECHANISMS))
    p.add_argument("--epsilons", default="1,10,100")
    p.add_argument("--draws", type=int, default=3, help="secure noise draws per cell")
    p.add_argument("--tuning-draws", type=int, default=1, help="seeded draws per candidate")
    p.add_argument("--cache-dir", default="runs/cache")
    p.add_argument("--write", type=Path, default=None, help="doc whose answer block to replace")
    return p


@dataclass(frozen=True)
class _Data:
    """One dataset's parts: members, non-members, the public tuning and validation parts."""

    name: str
    members: tuple[Tensor, Tensor]
    nonmembers: tuple[Tensor, Tensor]
    tune: tuple[Tensor, Tensor]
    validation: tuple[Tensor, Tensor]
    num_classes: int
    delta: float
    epochs: int
    batch: int
    tune_batch: int


def _load(name: str, cache_dir: str) -> _Data:
    data = prepare(
        plan_run(RunConfig(dataset=name, cache_dir=cache_dir, progress=False, out="runs/answer"))
    )
    epochs, batch = dataset_spec(name).dpsgd.as_tuple()
    x_pub, y_pub = data.part("public")
    n = len(data.part("members")[1])
    tr, va = public_tuning_split(len(y_pub), n_members=n, seed=derive_seed("answer", name))
    return _Data(
        name=name,
        members=data.part("members"),
        nonmembers=data.part("nonmembers"),
        tune=(x_pub[tr], y_pub[tr]),
        validation=(x_pub[va], y_pub[va]),
        num_classes=data.num_classes,
        delta=data.delta,
        epochs=epochs,
        batch=batch,
        # Same Poisson rate on the tuning part as on the members (same sigma).
        tune_batch=max(1, round(batch * len(tr) / n)),
    )


def _cell(
    data: _Data,
    *,
    head: str,
    hidden: int | None,
    params: int,
    mech: str,
    eps: float,
    sigmas: SigmaCache,
    draws: int,
    tuning_draws: int,
) -> Row:
    """Tune (lr, clip) on the public parts, then train ``draws`` times on the members."""
    config = HeadConfig(kind="linear") if hidden is None else HeadConfig(kind="mlp", hidden=hidden)

    def fit(
        xy: tuple[Tensor, Tensor], cfg: DPSGDConfig, noise_seed: int | None, seed: int
    ) -> torch.nn.Module:
        return train_dpsgd_head(
            xy[0],
            xy[1],
            num_classes=data.num_classes,
            head=config,
            config=cfg,
            epsilon=eps,
            delta=data.delta,
            accountant="alm_pld",
            seed=seed,
            noise_seed=noise_seed,
            sigmas=sigmas,
            backend=ALM_TRAINING,
            mechanism=mech,
        ).head

    def score(cfg: DPSGDConfig) -> float:
        tuned = DPSGDConfig(cfg.lr, cfg.max_grad_norm, data.epochs, data.tune_batch)
        accs = []
        for t in range(tuning_draws):
            s = derive_seed("answer-tune", data.name, head, mech, eps, t)
            model = fit(data.tune, tuned, s, s)  # public data: seeded noise
            with torch.no_grad():
                pred = model(data.validation[0]).argmax(1)
            accs.append(float((pred == data.validation[1]).double().mean()))
        return statistics.mean(accs)

    candidates = [
        DPSGDConfig(lr=lr, max_grad_norm=c, epochs=data.epochs, batch_size=data.batch)
        for lr in LR_GRID
        for c in clip_grid(mech, params)
    ]
    chosen, _ = select_on_public(candidates, score)
    results = []
    for draw in range(draws):
        model = fit(data.members, chosen, None, derive_seed("answer-init", data.name, head, draw))
        results.append(_loss_auc_and_accuracy(model, *data.members, *data.nonmembers))
    n = len(data.members[1])
    sigma = sigmas.cached(
        epsilon=eps,
        delta=data.delta,
        sample_rate=1.0 / -(-n // data.batch),
        epochs=data.epochs,
        accountant="alm_pld",
        mechanism=mech,
        dim=params,
    )
    return Row(
        dataset=data.name,
        head=head,
        params=params,
        mechanism=mech,
        epsilon=eps,
        sigma=float("nan") if sigma is None else sigma,
        lr=chosen.lr,
        clip=chosen.max_grad_norm,
        accuracy=statistics.median(r[0] for r in results),
        auc=statistics.median(r[1] for r in results),
    )


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    torch.set_num_threads(1)
    rows: list[Row] = []
    sigmas = SigmaCache()
    heads = [None if h == "linear" else int(h) for h in args.heads.split(",")]
    for ds in args.datasets.split(","):
        start = time.perf_counter()
        data = _load(ds, args.cache_dir)
        (n, d), k = data.members[0].shape, data.num_classes
        print(
            f"{ds}: n={n} d={d} delta={data.delta:g} schedule={data.epochs}x{data.batch} "
            f"public tuning {len(data.tune[1])}+{len(data.validation[1])} (batch "
            f"{data.tune_batch}); features {time.perf_counter() - start:.0f}s",
            file=sys.stderr,
        )
        for hidden in heads:
            name = "linear" if hidden is None else f"mlp-{hidden}"
            params = head_params(d=d, num_classes=k, hidden=hidden)
            if params > args.max_params:
                print(f"  {name} ({params}) skipped: over --max-params", file=sys.stderr)
                continue
            for mech in args.mechanisms.split(","):
                for eps in (float(e) for e in args.epsilons.split(",")):
                    t0 = time.perf_counter()
                    row = _cell(
                        data,
                        head=name,
                        hidden=hidden,
                        params=params,
                        mech=mech,
                        eps=eps,
                        sigmas=sigmas,
                        draws=args.draws,
                        tuning_draws=args.tuning_draws,
                    )
                    rows.append(row)
                    print(
                        f"  {name} ({params}) {mech} eps={eps:g}: acc={row.accuracy:.3f} "
                        f"auc={row.auc:.3f} sigma={row.sigma:.3g} lr={row.lr:g} "
                        f"clip={row.clip:.3g} [{time.perf_counter() - t0:.1f}s]",
                        file=sys.stderr,
                        flush=True,
                    )
    table = render_table(rows)
    print(table)
    if args.write is not None:
        shown = [
            "--datasets",
            args.datasets,
            "--heads",
            args.heads,
            "--max-params",
            str(args.max_params),
            "--mechanisms",
            args.mechanisms,
            "--epsilons",
            args.epsilons,
            "--draws",
            str(args.draws),
            "--tuning-draws",
            str(args.tuning_draws),
            "--write",
            relative(args.write),
        ]
        write_block(args.write, name="answer", script=__file__, args=shown, deps=DEPS, body=table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
