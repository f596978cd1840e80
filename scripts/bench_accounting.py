"""Benchmark DP-SGD calibration at every epsilon, and compare accountants on one grid.

``bench_calibration`` times `find_noise_multiplier` and Opacus's own ``get_noise_multiplier``
driving the ``alm_pld`` accountant, at the setting of issue 13 (q = 0.5, 60 steps,
δ = 1e-5), for targets from 0.01 to 10⁶, and the peak memory each call allocates
(``tracemalloc``, which numpy reports to, in a second run: tracing slows the code).
``compare_grid`` puts ``alm_pld``, Opacus's ``prv`` (its reported upper bound, its
estimate and its lower bound) and ``rdp`` side by side with our PLD on a 16× finer grid,
the reference. Standalone::

    .venv/bin/python scripts/bench_accounting.py            # calibration
    .venv/bin/python scripts/bench_accounting.py --compare  # accountant agreement table
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import time
import tracemalloc
from collections.abc import Callable, Sequence
from typing import Any

from opacus.accountants.utils import get_noise_multiplier

from alm_opacus.accounting import (
    ACCOUNTANT_NAME,
    PipelineAccountant,
    compare_accountants,
    find_noise_multiplier,
)
from alm_opacus.accounting.entries import entry_pld
from alm_opacus.accounting.grid import interval_for_epsilon

TARGETS = (0.01, 0.1, 1.0, 10.0, 100.0, 1e4, 1e6)
# (noise_multiplier, sample_rate, steps): the audit's two points first (issue 11, item 7).
COMPARE_GRID = (
    (10.0, 0.01, 1000),
    (2.0, 0.001, 5000),
    (4.0, 0.01, 1000),
    (1.0, 0.01, 1000),
    (0.8, 0.004, 2000),
    (2.0, 0.1, 200),
    (0.6, 0.1, 300),
)


def _measured(call: Callable[[], float]) -> tuple[float, float, float]:
    """(value, seconds, peak MiB allocated during the call), each from a cold cache.

    Timed without tracing (tracemalloc slows allocation-heavy code), then run again
    under tracemalloc for the peak.
    """
    entry_pld.cache_clear()
    start = time.perf_counter()
    value = call()
    seconds = time.perf_counter() - start
    entry_pld.cache_clear()
    tracemalloc.start()
    call()
    peak = tracemalloc.get_traced_memory()[1] / 2**20
    tracemalloc.stop()
    return value, seconds, peak


def bench_calibration(
    *,
    targets: Sequence[float] = TARGETS,
    sample_rate: float = 0.5,
    steps: int = 60,
    delta: float = 1e-5,
    opacus_targets: Sequence[float] = (100.0, 1e4),
) -> dict[str, Any]:
    """Seconds and peak MiB of calibration per target, and the ε the answer achieves."""
    rows = []
    for target in targets:
        sigma, seconds, peak = _measured(
            functools.partial(
                find_noise_multiplier,
                target_epsilon=target, target_delta=delta, sample_rate=sample_rate, steps=steps,
            )
        )  # fmt: skip
        acc = PipelineAccountant()
        acc.step(noise_multiplier=sigma, sample_rate=sample_rate, num_steps=steps)
        rows.append(
            {"target_epsilon": target, "noise_multiplier": sigma,
             "epsilon": acc.get_epsilon(delta), "seconds": seconds, "peak_mib": peak}
        )  # fmt: skip
    opacus = []
    for target in opacus_targets:
        sigma, seconds, peak = _measured(
            functools.partial(
                get_noise_multiplier,
                target_epsilon=target, target_delta=delta, sample_rate=sample_rate, steps=steps,
                accountant=ACCOUNTANT_NAME,
            )
        )  # fmt: skip
        opacus.append(
            {"target_epsilon": target, "noise_multiplier": sigma, "seconds": seconds,
             "peak_mib": peak}
        )  # fmt: skip
    return {
        "setting": {"sample_rate": sample_rate, "steps": steps, "delta": delta},
        "find_noise_multiplier": rows,
        "opacus_get_noise_multiplier": opacus,
        "max_seconds": max(r["seconds"] for r in rows),
        "max_peak_mib": max(r["peak_mib"] for r in rows),
    }


def compare_grid(
    *, grid: Sequence[tuple[float, float, int]] = COMPARE_GRID, delta: float = 1e-5
) -> list[dict[str, float]]:
    """ε per accountant, plus the reference: alm_pld's PLD on a grid 16× finer."""
    rows = []
    for sigma, q, steps in grid:
        row: dict[str, float] = {"noise_multiplier": sigma, "sample_rate": q, "steps": steps}
        row.update(
            compare_accountants(noise_multiplier=sigma, sample_rate=q, steps=steps, delta=delta)
        )
        acc = PipelineAccountant()
        acc.history = [(sigma, q, steps)]
        fine = interval_for_epsilon(row["alm_pld"]) / 16
        row["reference"] = acc.get_epsilon(delta, value_discretization_interval=fine)
        for name in ("alm_pld", "prv", "prv_estimate", "prv_lower", "rdp"):
            if name in row:
                row[f"{name}_vs_reference"] = row[name] / row["reference"] - 1.0
        rows.append(row)
    return rows


def _table(rows: list[dict[str, float]]) -> str:
    head = "| σ | q | steps | reference | alm_pld | prv | prv estimate | prv lower | rdp |"
    lines = [head, "|" + "---|" * 9]
    for r in rows:
        cells = [f"{r['noise_multiplier']:g}", f"{r['sample_rate']:g}", f"{int(r['steps'])}",
                 f"{r['reference']:.4f}"]  # fmt: skip
        for name in ("alm_pld", "prv", "prv_estimate", "prv_lower", "rdp"):
            value = r.get(name, math.nan)
            gap = r.get(f"{name}_vs_reference", math.nan)
            cells.append(f"{value:.4f} ({100 * gap:+.3f}%)")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--compare", action="store_true", help="accountant agreement table")
    parser.add_argument("--delta", type=float, default=1e-5)
    args = parser.parse_args()
    if args.compare:
        rows = compare_grid(delta=args.delta)
        print(_table(rows))
        print(json.dumps(rows, indent=1))
    else:
        print(json.dumps(bench_calibration(delta=args.delta), indent=1))


if __name__ == "__main__":
    main()
