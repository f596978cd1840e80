"""Benchmark the cost of DP-SGD against post-training protection, in one process.

Two ratios, and a third when images and an encoder are given (``scripts/bench.py`` imports
:func:`bench_baselines`):

* ``dpsgd_vs_plain``: one DP-SGD head training (``baselines.dpsgd``, Opacus, sigma cached,
  as for every noise draw after the first) against one non-private head training with the
  shared recipe (``alm_opacus.heads.train_head``);
* ``retrain_vs_reprotect``: a DP-SGD retrain at a *new* epsilon (``make_private_with_epsilon``
  must find a new sigma, then train and account) against re-protecting an already trained
  head at that epsilon with ``PostTrainingPrivacyEngine`` (noise drawn once; the
  sensitivity does not depend on epsilon, so it is not recomputed);
* ``full_vs_head``: one ``dpsgd-full`` run (encoder and head, sigma cached) against one
  ``dpsgd`` head run with the same schedule.

Times are medians of ``repeats`` runs; the machine's load is not controlled, so compare
ratios from one run. Both sides of each ratio run with one torch intra-op thread.
Standalone, on a stand-in for the digits default (150 members, 128-d
unit-norm features: digits pixels through a fixed random projection)::

    .venv/bin/python scripts/bench_baselines.py --n 150 --repeats 3
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from alm_opacus.heads import HeadConfig, train_head
from alm_opacus.protect import PostTrainingPrivacyEngine, SensitivityInfo
from baselines import dpsgd
from baselines.dpsgd import (
    DPSGDConfig,
    SigmaCache,
    dpsgd_full_finetune,
    single_thread,
    train_dpsgd_head,
)

__all__ = [
    "bench_baselines",
    "bench_dpsgd_vs_plain",
    "bench_full_vs_head",
    "bench_retrain_vs_reprotect",
    "stand_in",
]


def _median_seconds(fn: Any, repeats: int) -> float:
    # One intra-op thread for both sides: DP-SGD training already runs so (see
    # ``baselines.dpsgd.single_thread``), and tiny-tensor loops on a shared two-core machine
    # slow down many times over with two threads, which would distort the ratio.
    times = []
    with single_thread():
        for _ in range(repeats):
            start = time.perf_counter()
            fn()
            times.append(time.perf_counter() - start)
    return statistics.median(times)


def bench_dpsgd_vs_plain(
    *,
    features: Tensor,
    labels: Tensor,
    num_classes: int,
    head: HeadConfig,
    config: DPSGDConfig,
    epsilon: float = 1.0,
    delta: float = 1e-5,
    accountant: str = "prv",
    repeats: int = 3,
) -> dict[str, Any]:
    """DP-SGD head training (sigma already cached) against non-private head training.

    Returns:
        ``seconds_dpsgd``, ``seconds_plain``, ``ratio`` (dpsgd / plain), the DP-SGD steps,
        ``seconds_make_private_with_epsilon`` (the first, uncached call's calibration) and
        the recipe.
    """
    kwargs: dict[str, Any] = {
        "num_classes": num_classes,
        "head": head,
        "config": config,
        "epsilon": epsilon,
        "delta": delta,
        "accountant": accountant,
        "sigmas": SigmaCache(),  # one run's cache: the first call searches sigma
    }
    first = train_dpsgd_head(features, labels, seed=0, noise_seed=0, **kwargs)  # warms the cache
    counter = iter(range(1, 10**6))
    dp = _median_seconds(
        lambda: train_dpsgd_head(features, labels, seed=0, noise_seed=next(counter), **kwargs),
        repeats,
    )
    plain = _median_seconds(
        lambda: train_head(features, labels, num_classes=num_classes, config=head, seed=0), repeats
    )
    return {
        "seconds_dpsgd": dp,
        "seconds_plain": plain,
        "ratio": dp / plain,
        "dpsgd_steps": first.steps,
        "plain_steps": head.steps,
        "seconds_make_private_with_epsilon": first.seconds["calibration"]
        if not first.from_cache
        else None,
        "accountant": accountant,
        "config": config.to_dict(),
    }


def bench_retrain_vs_reprotect(
    *,
    features: Tensor,
    labels: Tensor,
    num_classes: int,
    head: HeadConfig,
    config: DPSGDConfig,
    epsilon: float = 3.0,
    delta: float = 1e-5,
    accountant: str = "prv",
    mechanism: str = "alm",
    repeats: int = 3,
) -> dict[str, Any]:
    """A DP-SGD retrain at a new epsilon against a post-training re-protection at it.

    Each DP-SGD repeat uses a fresh epsilon (``epsilon * (1 + 1e-3 k)``), so that
    ``make_private_with_epsilon`` must search a new sigma as a user changing epsilon would.
    The re-protection uses a placeholder sensitivity (its cost does not depend on the value).

    Returns:
        ``seconds_retrain`` (calibration + training + accounting), its parts,
        ``seconds_reprotect``, and ``ratio`` (retrain / reprotect).
    """
    parts: list[dict[str, float]] = []
    totals: list[float] = []
    for k in range(repeats):
        eps = epsilon * (1 + 1e-3 * (k + 1))
        start = time.perf_counter()
        run = train_dpsgd_head(
            features,
            labels,
            num_classes=num_classes,
            head=head,
            config=config,
            epsilon=eps,
            delta=delta,
            accountant=accountant,
            seed=0,
            noise_seed=k,
        )
        totals.append(time.perf_counter() - start)
        parts.append(run.seconds)
    trained = train_head(features, labels, num_classes=num_classes, config=head, seed=0)
    engine = PostTrainingPrivacyEngine(mechanism=mechanism)
    info = SensitivityInfo(value=1.0, norm=engine.mechanism.norm, source="analytic")  # type: ignore[arg-type]
    counter = iter(range(10**6))
    reprotect = _median_seconds(
        lambda: engine.make_private(trained, epsilon=epsilon, sensitivity=info, seed=next(counter)),
        max(repeats, 5),
    )
    retrain = statistics.median(totals)
    return {
        "seconds_retrain": retrain,
        "seconds_retrain_parts": {k: statistics.median(p[k] for p in parts) for k in parts[0]},
        "seconds_reprotect": reprotect,
        "ratio": retrain / reprotect,
        "mechanism": mechanism,
        "accountant": accountant,
    }


def bench_full_vs_head(
    *,
    features: Tensor,
    images: Tensor,
    encoder: nn.Module,
    labels: Tensor,
    num_classes: int,
    head: HeadConfig,
    config: DPSGDConfig,
    epsilon: float = 1.0,
    delta: float = 1e-5,
    accountant: str = "prv",
    repeats: int = 3,
) -> dict[str, Any]:
    """One ``dpsgd-full`` run against one ``dpsgd`` head run (same schedule, sigma cached).

    Returns:
        ``seconds_full``, ``seconds_head``, ``ratio`` (full / head) and the encoder's size.
    """
    common: dict[str, Any] = {
        "num_classes": num_classes,
        "config": config,
        "epsilon": epsilon,
        "delta": delta,
        "accountant": accountant,
        "sigmas": SigmaCache(),
    }
    train_dpsgd_head(features, labels, head=head, seed=0, noise_seed=0, **common)  # warm sigma
    counter = iter(range(1, 10**6))
    full = _median_seconds(
        lambda: dpsgd_full_finetune(
            encoder=encoder,
            images=images,
            labels=labels,
            seed=0,
            noise_seed=next(counter),
            **common,
        ),
        repeats,
    )
    one = _median_seconds(
        lambda: train_dpsgd_head(
            features, labels, head=head, seed=0, noise_seed=next(counter), **common
        ),
        repeats,
    )
    return {
        "seconds_full": full,
        "seconds_head": one,
        "ratio": full / one,
        "encoder_parameters": sum(p.numel() for p in encoder.parameters()),
    }


def bench_baselines(
    *,
    features: Tensor,
    labels: Tensor,
    num_classes: int,
    head: HeadConfig | None = None,
    config: DPSGDConfig | None = None,
    accountant: str = "prv",
    repeats: int = 3,
    images: Tensor | None = None,
    encoder: nn.Module | None = None,
) -> dict[str, Any]:
    """The ratios in one process.

    Args:
        features: (n, d) member features.
        labels: (n,) labels.
        num_classes: ``C``.
        head: the head recipe (default ``HeadConfig()``).
        config: the DP-SGD recipe (default: the dataset schedule by ``n``, lr 4, clip 1).
        accountant: the DP-SGD accountant.
        repeats: timing repeats.
        images: (n, C, H, W) the members' images, for ``full_vs_head``.
        encoder: the public encoder, for ``full_vs_head``.

    Returns:
        ``{"dpsgd_vs_plain": {...}, "retrain_vs_reprotect": {...}, "n": n, "d": d,
        "threads": torch threads}``, plus ``"full_vs_head"`` with images and an encoder.
    """
    head = head or HeadConfig()
    if config is None:
        epochs, batch = dpsgd.default_schedule(n=int(features.shape[0]))
        config = DPSGDConfig(epochs=epochs, batch_size=batch)
    common: dict[str, Any] = {
        "features": features,
        "labels": labels,
        "num_classes": num_classes,
        "head": head,
        "config": config,
        "accountant": accountant,
        "repeats": repeats,
    }
    out = {
        "n": int(features.shape[0]),
        "d": int(features.shape[1]),
        "threads": torch.get_num_threads(),
        "dpsgd_vs_plain": bench_dpsgd_vs_plain(**common),
        "retrain_vs_reprotect": bench_retrain_vs_reprotect(**common),
    }
    if images is not None and encoder is not None:
        out["full_vs_head"] = bench_full_vs_head(images=images, encoder=encoder, **common)
    return out


def stand_in(*, n: int, d: int = 128, seed: int = 0) -> tuple[Tensor, Tensor, int]:
    """Digits pixels through a fixed Gaussian projection to ``d`` dims, unit-normalised."""
    from alm_opacus.data import load_dataset

    ds = load_dataset("digits")
    assert ds.images is not None  # an image dataset
    x = torch.from_numpy(ds.images[:n].reshape(n, -1).astype(np.float64))
    proj = torch.randn(x.shape[1], d, generator=torch.Generator().manual_seed(seed), dtype=x.dtype)
    feats = torch.nn.functional.normalize(x @ proj, dim=1)
    return feats, torch.from_numpy(ds.labels[:n]).long(), ds.num_classes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=150, help="members (first n digits)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--accountant", default="prv", choices=dpsgd.ACCOUNTANTS)
    parser.add_argument("--threads", type=int, default=None, help="torch threads")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    x, y, c = stand_in(n=args.n)
    result = bench_baselines(
        features=x, labels=y, num_classes=c, accountant=args.accountant, repeats=args.repeats
    )
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
