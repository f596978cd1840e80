"""Benchmark the batched sensitivity sampler against the sequential loop, in one process.

``bench_sampler`` times, on the same pairs:

* ``batched``: :func:`alm_opacus.sensitivity.sample_sensitivity` (distinct heads trained
  together, one pair of GEMMs per step for linear heads);
* ``sequential``: Algorithm 2 as written, 2m single-head ``train_heads`` calls
  (:func:`alm_opacus.sensitivity.sample_sensitivity_sequential`); ``ratio`` is against it;
* ``sequential_autograd``: the same loop with gradients by autograd
  (``train_heads_autograd``, the trainer before the closed-form path), timed on the first
  ``autograd_pairs`` pairs and scaled to m (each pair costs the same).

The batched time is the mean of one run before and one after the sequential loop, so drifting
load on a shared machine biases neither side. Standalone, on digits raw pixels::

    .venv/bin/python scripts/bench_sensitivity.py --m 200 --n 300
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

import numpy as np
import torch

from alm_opacus.heads import HeadConfig, flat_params, train_heads_autograd
from alm_opacus.sensitivity import (
    default_chunk_size,
    draw_pairs,
    sample_sensitivity,
    sample_sensitivity_sequential,
)


def _autograd_loop_seconds(
    features: torch.Tensor,
    labels: torch.Tensor,
    *,
    num_classes: int,
    config: HeadConfig,
    seed: int,
    pairs: np.ndarray,
) -> float:
    n = features.shape[0]
    start = time.perf_counter()
    for pair in pairs:
        for row in pair:
            mask = torch.ones(1, n, dtype=torch.bool, device=features.device)
            mask[0, int(row)] = False
            flat_params(
                train_heads_autograd(
                    features,
                    labels,
                    masks=mask,
                    num_classes=num_classes,
                    config=config,
                    seed=seed,
                )
            )
    return time.perf_counter() - start


def bench_sampler(
    *,
    features: torch.Tensor,
    labels: torch.Tensor,
    num_classes: int,
    m: int = 200,
    config: HeadConfig,
    seed: int = 0,
    autograd_pairs: int = 10,
) -> dict[str, Any]:
    """Time the batched sampler against the sequential loop at ``m`` pairs.

    Args:
        features: (n, d) member features.
        labels: (n,) labels.
        num_classes: number of classes.
        m: number of pairs.
        config: the head recipe (``solver="adam"``).
        seed: sampler seed.
        autograd_pairs: pairs timed for the autograd loop (0 to skip it).

    Returns:
        A dict with ``ratio`` (sequential seconds / batched seconds), the seconds of each,
        ``ratio_vs_autograd``, ``max_rel_diff`` (batched against sequential distances,
        relative to the largest distance), the sampled values and the problem sizes.
    """
    kwargs: dict[str, Any] = {"num_classes": num_classes, "config": config, "seed": seed, "m": m}
    t0 = time.perf_counter()
    batched = sample_sensitivity(features, labels, **kwargs)
    t1 = time.perf_counter()
    sequential = sample_sensitivity_sequential(features, labels, **kwargs)
    t2 = time.perf_counter()
    sample_sensitivity(features, labels, **kwargs)
    t3 = time.perf_counter()
    seconds_batched = ((t1 - t0) + (t3 - t2)) / 2
    seconds_sequential = t2 - t1
    rel = max(
        float(np.max(np.abs(batched.l1 - sequential.l1)) / np.max(np.abs(sequential.l1))),
        float(np.max(np.abs(batched.l2 - sequential.l2)) / np.max(np.abs(sequential.l2))),
    )
    out: dict[str, Any] = {
        "m": m,
        "n": int(features.shape[0]),
        "d": int(features.shape[1]),
        "kind": config.kind,
        "steps": config.steps,
        "threads": torch.get_num_threads(),
        "heads_sequential": 2 * m,
        "heads_batched": len(np.unique(batched.pairs)),
        "chunk_size": default_chunk_size(
            n=int(features.shape[0]),
            num_classes=num_classes,
            config=config,
            heads=len(np.unique(batched.pairs)),
        ),
        "seconds_batched": seconds_batched,
        "seconds_sequential": seconds_sequential,
        "ratio": seconds_sequential / seconds_batched,
        "max_rel_diff": rel,
        "value_l1": batched.value_l1,
        "value_l2": batched.value_l2,
    }
    if autograd_pairs > 0:
        k = min(autograd_pairs, m)
        pairs = draw_pairs(n=int(features.shape[0]), m=k, seed=seed)
        secs = _autograd_loop_seconds(
            features, labels, num_classes=num_classes, config=config, seed=seed, pairs=pairs
        )
        out["seconds_sequential_autograd"] = secs * m / k
        out["autograd_pairs_timed"] = k
        out["ratio_vs_autograd"] = out["seconds_sequential_autograd"] / seconds_batched
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--m", type=int, default=200)
    parser.add_argument("--n", type=int, default=300, help="members (first n digits)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=None, help="torch threads")
    parser.add_argument("--autograd-pairs", type=int, default=10)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    from alm_opacus.data import load_dataset

    ds = load_dataset("digits")
    assert ds.images is not None  # an image dataset
    x = torch.from_numpy(ds.images[: args.n].reshape(args.n, -1).astype(np.float64))
    y = torch.from_numpy(ds.labels[: args.n])
    result = bench_sampler(
        features=x,
        labels=y,
        num_classes=ds.num_classes,
        m=args.m,
        config=HeadConfig(),
        seed=args.seed,
        autograd_pairs=args.autograd_pairs,
    )
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
