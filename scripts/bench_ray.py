#!/usr/bin/env python
"""The harness on Ray against in-process, as ratios measured in one run (issue 20).

* grid: ``compare.py --dataset D --methods M --reproducible-noise`` in a child process,
  in-process and then with ``--executor ray`` (a local cluster of this machine's CPUs, one
  worker each, started by the child: its start-up is part of the time), each from a copy of one warm
  encoder/feature cache, so neither reuses the other's heads, sensitivities or shadow
  heads; the ratio of wall times (target >= 1.5x with 2 workers) and whether every column
  of the two tables but ``seconds`` agrees (it must);
* overhead: a no-op unit mapped as Ray tasks against the same units in-process, per unit
  (target <= 50 ms).

Timings on a machine other jobs share are noisy: the ratio is what to compare.

    .venv/bin/python scripts/bench_ray.py [--dataset mnist] [--methods all] [--write-docs]
"""

from __future__ import annotations

import argparse
import csv
import json
import operator
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "distributed.md"
BLOCK = "bench-ray"
#: What the timings depend on besides this script: the harness and everything it runs.
DEPS = ("alm_opacus", "baselines", "constraints.txt")
#: Targets of issue 20: the wall-time ratio with 2 local workers, and a no-op unit's cost.
TARGET_RATIO = 1.5
TARGET_OVERHEAD_MS = 50.0
#: Files of the cache that both runs share: the encoder and its features (pre-training).
SHARED_CACHE = ("encoder-*", "features-*")


def unit_overhead(*, units: int = 200, cpus: int = 2) -> dict[str, Any]:
    """Seconds per no-op unit mapped as Ray tasks (after a warm-up), minus in-process. The
    unit is ``operator.getitem(shared, i)``: importable by every worker, it does nothing."""
    from alm_opacus.run.executors import RayExecutor
    from alm_opacus.unit_map import serial_map

    items = list(range(units))
    t0 = time.perf_counter()
    serial_map(operator.getitem, items, shared=items)
    serial = time.perf_counter() - t0
    with RayExecutor(num_cpus=cpus) as executor:
        executor.map(operator.getitem, items[: 4 * cpus], shared=items)  # start the workers
        t0 = time.perf_counter()
        executor.map(operator.getitem, items, shared=items)
        mapped = time.perf_counter() - t0
        t0 = time.perf_counter()
        shared = executor.put(items)
        list(executor.as_completed(operator.getitem, [(shared, u) for u in items]))
        submitted = time.perf_counter() - t0
    return {
        "units": units,
        "map_ms_per_unit": 1e3 * (mapped - serial) / units,
        "as_completed_ms_per_unit": 1e3 * (submitted - serial) / units,
        "target_ms": TARGET_OVERHEAD_MS,
    }


def _table(path: Path) -> dict[tuple[str, ...], dict[str, str]]:
    with path.open() as handle:
        rows = list(csv.DictReader(handle))
    return {(r["method"], r["epsilon"], r["seed"], r["attack"]): r for r in rows}


def _differences(a: Path, b: Path) -> list[str]:
    """Cells of the two tables that differ, every column but ``seconds``."""
    left, right = _table(a), _table(b)
    if set(left) != set(right):
        return [f"rows differ: {sorted(set(left) ^ set(right))[:3]}"]
    return [
        f"{key} {col}: {row[col]} vs {right[key][col]}"
        for key, row in left.items()
        for col in row
        if col != "seconds" and row[col] != right[key][col]
    ]


def grid(work: Path, *, dataset: str, methods: str, extra: list[str]) -> dict[str, Any]:
    """Both runs of the grid, each in a child process; their wall times and agreement. The
    Ray run starts a local cluster of all this machine's CPUs (one worker per CPU)."""
    warm = work / "warm"
    base = [
        sys.executable,
        str(ROOT / "scripts" / "compare.py"),
        "--dataset",
        dataset,
        "--methods",
        methods,
        "--reproducible-noise",
        "--no-progress",
        *extra,
    ]
    # pre-training once (its time is the same in both runs and is not what is compared)
    subprocess.run(
        [
            *base,
            "--methods",
            "none",
            "--attacks",
            "none",
            "--out",
            str(work / "warm-run"),
            "--cache-dir",
            str(warm),
        ],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    seconds: dict[str, float] = {}
    for name, flags in (("in-process", []), ("ray", ["--executor", "ray"])):
        cache = work / f"cache-{name}"
        cache.mkdir()
        for pattern in SHARED_CACHE:
            for file in warm.glob(pattern):
                shutil.copy2(file, cache / file.name)
        t0 = time.perf_counter()
        subprocess.run(
            [*base, *flags, "--out", str(work / name), "--cache-dir", str(cache)],
            check=True,
            stdout=subprocess.DEVNULL,
        )
        seconds[name] = time.perf_counter() - t0
    diff = _differences(work / "in-process" / "results.csv", work / "ray" / "results.csv")
    return {
        "dataset": dataset,
        "methods": methods,
        "extra": extra,
        "cpus": os.cpu_count(),
        "seconds_in_process": seconds["in-process"],
        "seconds_ray": seconds["ray"],
        "ratio": seconds["in-process"] / seconds["ray"],
        "target_ratio": TARGET_RATIO,
        "tables_agree": not diff,
        "differences": diff[:5],
        "load_average": os.getloadavg(),
        "machine_cpus": os.cpu_count(),
    }


def docs_block(report: dict[str, Any]) -> str:
    g, o = report["grid"], report["overhead"]
    command = f"--dataset {g['dataset']} --methods {g['methods']} {' '.join(g['extra'])}".strip()
    return "\n".join(
        [
            f"Measured by `scripts/bench_ray.py` on a {g['machine_cpus']}-core machine "
            f"(1-minute load average {g['load_average'][0]:.1f} at the end, the bench's own "
            f"processes included), "
            f"`{command}`, warm pre-training cache:",
            "",
            "| measure | value | target |",
            "|---|---|---|",
            f"| in-process (s) | {g['seconds_in_process']:.1f} | |",
            f"| Ray, local cluster of {g['cpus']} CPUs, start-up included (s) | "
            f"{g['seconds_ray']:.1f} | |",
            f"| wall-time ratio | {g['ratio']:.2f}x | >= {g['target_ratio']:g}x |",
            f"| tables agree (every column but `seconds`) | {g['tables_agree']} | True |",
            f"| no-op unit on Ray, per unit (ms) | {o['map_ms_per_unit']:.1f} | "
            f"<= {o['target_ms']:g} |",
        ]
    )


def write_docs(report: dict[str, Any], *, args: list[str]) -> None:
    """The generated block ``bench-ray``; ``args`` are the options that decided it."""
    from docblocks import write_block

    write_block(DOC, name=BLOCK, script=__file__, args=args, deps=DEPS, body=docs_block(report))


def bench_ray(
    *,
    dataset: str = "mnist",
    methods: str = "all",
    extra: list[str] | None = None,
    cpus: int = 2,
) -> dict[str, Any]:
    """The grid ratio and the per-unit overhead on ``cpus`` workers (see the module
    docstring)."""
    with tempfile.TemporaryDirectory() as tmp:
        report = {
            "grid": grid(Path(tmp), dataset=dataset, methods=methods, extra=list(extra or []))
        }
    report["overhead"] = unit_overhead(cpus=cpus)
    return report


def format_rows(report: dict[str, Any]) -> list[tuple[str, str, str]]:
    g, o = report["grid"], report["overhead"]
    return [
        (
            f"Ray ({g['cpus']} CPUs) vs in-process, {g['dataset']} {g['methods']}",
            f"{g['ratio']:.2f}x",
            f">= {g['target_ratio']:g}x",
        ),
        ("  in-process / Ray (s)", f"{g['seconds_in_process']:.0f} / {g['seconds_ray']:.0f}", ""),
        ("  tables agree", str(g["tables_agree"]), "True"),
        (
            "no-op unit on Ray (ms per unit)",
            f"{o['map_ms_per_unit']:.1f}",
            f"<= {o['target_ms']:g}",
        ),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", default="mnist")
    parser.add_argument("--methods", default="all")
    parser.add_argument(
        "--cpus", type=int, default=2, help="workers of the overhead measurement's cluster"
    )
    parser.add_argument("--out", default="runs/bench_ray.json", help="the report (JSON)")
    parser.add_argument(
        "--write-docs", action="store_true", help=f"write the table into {DOC.name}'s block"
    )
    args, extra = parser.parse_known_args()  # other flags go to compare.py (e.g. --epsilons)
    report = bench_ray(dataset=args.dataset, methods=args.methods, extra=extra, cpus=args.cpus)
    from alm_opacus.io import atomic_write_text

    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out, json.dumps(report, indent=2, default=str) + "\n")
    for name, value, target in format_rows(report):
        print(f"{name:<55} {value:>14}  {target}")
    if report["grid"]["differences"]:
        print("tables differ:", *report["grid"]["differences"], sep="\n  ")
    if args.write_docs:
        shown = [
            "--dataset",
            args.dataset,
            "--methods",
            args.methods,
            "--cpus",
            str(args.cpus),
            *extra,
            "--write-docs",
        ]
        write_docs(report, args=shown)
        print(f"written: {DOC}")


if __name__ == "__main__":
    main()
