#!/usr/bin/env python
"""Latency of repeated Gaussian releases of one head (issue 38, item 3: <= 10 ms each).

The head is the digits default: the harness's linear head (``dataset_spec("digits").head``)
on the small CNN's 128 features, 10 classes, float64 (1,290 weights), and a float16 copy of
it (planned in float32, where the exact grid may widen). One engine releases it ``count``
times at epsilon = 1, delta = 1e-5 with an analytic L2 sensitivity (the ledger composes
approximate-DP releases tightly, Gaussian ones exactly as one Gaussian; a sampled
sensitivity composes by sums) and
noise from the OS CSPRNG, as a user's release does. Release 1 is timed with the calibration
memo and the accountant's caches empty (the process is warmed on another head first, so
imports and compiled kernels are not counted); each later release is timed as it comes.

    .venv/bin/python scripts/bench_release.py [--count 100]
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import time
from typing import Any

import torch

#: Issue 38's target for the 1st and the 100th release (milliseconds).
TARGET_MS = 10.0


def _clear_caches() -> None:
    """Empty every cache a first release would find empty (absent ones are skipped, so the
    script also times the code from before they existed)."""
    from alm_opacus.accounting import entries

    entries.clear_entry_cache()
    span = getattr(entries, "_release_span", None)
    if span is not None:
        span.cache_clear()
    try:
        from alm_opacus.posttraining import memo
    except ImportError:
        return
    memo.clear()


def _releases(head: torch.nn.Module, *, count: int) -> list[float]:
    """Seconds of each of ``count`` releases of ``head`` by one fresh engine."""
    from alm_opacus.posttraining.engine import PostTrainingPrivacyEngine
    from alm_opacus.statement import SensitivityInfo, SensitivitySource

    info = SensitivityInfo(value=0.1, norm="l2", source=SensitivitySource.ANALYTIC)
    engine = PostTrainingPrivacyEngine(mechanism="gaussian")
    _clear_caches()
    seconds = []
    for _ in range(count):
        start = time.perf_counter()
        engine.make_private(head, epsilon=1.0, delta=1e-5, sensitivity=info)
        seconds.append(time.perf_counter() - start)
    return seconds


def default_head(seed: int = 0) -> torch.nn.Module:
    """The digits harness's head module at its initialisation (the values do not matter)."""
    from alm_opacus.data import dataset_spec
    from alm_opacus.heads import Head

    torch.manual_seed(seed)
    return Head(in_features=128, num_classes=10, config=dataset_spec("digits").head)


def bench_release(*, count: int = 100) -> dict[str, Any]:
    """The 1st and the ``count``-th release of the default head, float64 and float16.

    Returns:
        Per dtype: ``first_ms``, ``last_ms``, ``median_ms`` (releases 2..count), ``max_ms``,
        ``over_target`` (how many exceed the target), ``count``; and ``target_ms``.
    """
    with torch.no_grad():
        _releases(default_head(seed=1), count=3)  # warm the process: imports, kernels
    head = default_head()
    out: dict[str, Any] = {"target_ms": TARGET_MS, "count": count}
    for name, module in (("float64", head), ("float16", copy.deepcopy(head).half())):
        ms = [1e3 * s for s in _releases(module, count=count)]
        out[name] = {
            "first_ms": ms[0],
            "last_ms": ms[-1],
            "median_ms": statistics.median(ms[1:]),
            "max_ms": max(ms),
            "over_target": sum(m > TARGET_MS for m in ms),
        }
    return out


def format_rows(report: dict[str, Any]) -> list[tuple[str, str, str]]:
    """Rows for `scripts/bench.py`'s table."""
    n, target = report["count"], report["target_ms"]
    rows = []
    for name in ("float64", "float16"):
        r = report[name]
        head = f"Gaussian release, default digits head, {name}"
        rows += [
            (f"{head}: 1st (ms)", f"{r['first_ms']:.1f}", f"<= {target:g}"),
            (f"  {n}th (ms)", f"{r['last_ms']:.1f}", f"<= {target:g}"),
            (
                f"  2nd..{n}th median / max (ms)",
                f"{r['median_ms']:.1f} / {r['max_ms']:.0f}",
                f"{r['over_target']} of {n} over {target:g}",
            ),
        ]
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=100)
    args = parser.parse_args()
    report = bench_release(count=args.count)
    print(json.dumps(report, indent=2))
    width = max(len(r[0]) for r in format_rows(report))
    for a, b, c in format_rows(report):
        print(f"{a:<{width}}  {b:>14}  {c}")


if __name__ == "__main__":
    main()
