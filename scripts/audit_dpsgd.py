#!/usr/bin/env python
"""Canary audit of DP-SGD with logistic (ALM), Laplace and Gaussian noise.

For each mechanism: calibrate σ to (epsilon, delta) with the engine's search, train
``--runs`` models with and ``--runs`` without the canary to choose a threshold, as many
again to bound, once per seed, and compare each seed's Clopper–Pearson lower bound with the
``alm_pld`` accountant's epsilon (`alm_opacus.training.audit`). Writes ``audit_dpsgd.json``
and ``audit_dpsgd.md`` (the table in ``docs/dpsgd_noise.md``) into ``--out``::

    python scripts/audit_dpsgd.py --out runs/audit_dpsgd

The audited step is the exact one DP-SGD ships (``--float-step``: the floating-point step).
Exit status 1 if any lower bound exceeds the accountant's epsilon.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

from alm_opacus.io import atomic_write_json, atomic_write_text
from alm_opacus.training.audit import CanaryAuditConfig, CanaryAuditResult, run_canary_audits


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--mechanisms", default="alm,laplace,gaussian")
    p.add_argument("--epsilon", type=float, default=4.0)
    p.add_argument("--delta", type=float, default=1e-5)
    p.add_argument("--sample-rate", type=float, default=0.25)
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--examples", type=int, default=32, help="real (non-canary) examples")
    p.add_argument("--batch-size", type=int, default=8, help="expected batch size")
    p.add_argument("--runs", type=int, default=10_000, help="models per world and phase")
    p.add_argument("--seeds", type=int, default=10)
    p.add_argument("--float-step", action="store_true", help="audit exact=False's step")
    p.add_argument("--out", type=Path, default=Path("runs/audit_dpsgd"))
    return p


def _row(results: list[CanaryAuditResult]) -> dict[str, Any]:
    bounds = [r.epsilon_lower_bound for r in results]
    first = results[0]
    return {
        "mechanism": first.config.noise_mechanism,
        "noise_multiplier": first.noise_multiplier,
        "accountant_epsilon": first.accountant_epsilon,
        "lower_bounds": bounds,
        "max_lower_bound": max(bounds),
        "median_lower_bound": statistics.median(bounds),
        "tightness_max": max(bounds) / first.accountant_epsilon,
        "tightness_median": statistics.median(bounds) / first.accountant_epsilon,
        "ceiling": first.epsilon_ceiling,
        "canary_full_norm": min(r.canary_full_norm for r in results),
        "violations": sum(b > first.accountant_epsilon for b in bounds),
    }


def _table(rows: list[dict[str, Any]], config: CanaryAuditConfig, seeds: int) -> str:
    lines = [
        f"Target (epsilon, delta) = ({config.target_epsilon:g}, {config.target_delta:g}), "
        f"q = {config.sample_rate:g}, T = {config.steps}, n = {config.num_examples} + canary, "
        f"{config.runs} runs per world and phase, {seeds} seeds, "
        f"confidence {config.confidence:g} per seed, "
        f"{'exact' if config.exact else 'floating-point'} step.",
        "",
        "| noise | σ | accountant ε | lower bound: median | max | max / accountant ε "
        "| ceiling | canary at full norm | bounds above ε |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['mechanism']} | {r['noise_multiplier']:.4f} | {r['accountant_epsilon']:.3f} "
            f"| {r['median_lower_bound']:.3f} | {r['max_lower_bound']:.3f} "
            f"| {r['tightness_max']:.2f} | {r['ceiling']:.2f} | {r['canary_full_norm']:.0%} "
            f"| {r['violations']} of {len(r['lower_bounds'])} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    torch.set_num_threads(1)
    rows, configs = [], []
    for mechanism in args.mechanisms.split(","):
        config = CanaryAuditConfig(
            noise_mechanism=mechanism, target_epsilon=args.epsilon, target_delta=args.delta,
            sample_rate=args.sample_rate, steps=args.steps, num_examples=args.examples,
            expected_batch_size=args.batch_size, runs=args.runs, exact=not args.float_step,
        )  # fmt: skip
        start = time.perf_counter()
        results = run_canary_audits(config, seeds=list(range(args.seeds)))
        rows.append(_row(results) | {"seconds": time.perf_counter() - start})
        configs.append(config.to_dict())
        print(f"{mechanism}: {rows[-1]}", flush=True)
    table = _table(rows, config, args.seeds)
    command = "python scripts/audit_dpsgd.py " + " ".join(sys.argv[1:] if argv is None else argv)
    atomic_write_json(args.out / "audit_dpsgd.json",
                      {"command": command, "configs": configs, "rows": rows})  # fmt: skip
    atomic_write_text(args.out / "audit_dpsgd.md", table)
    print(table)
    return 1 if any(r["violations"] for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
