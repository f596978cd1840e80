#!/usr/bin/env python
"""The sampled sensitivity of the convex head against its analytic bound (docs/sensitivity.md).

For each (n, lambda, R): the first n raw digits images (64 pixels in 0..16, unscaled), the
convex head (linear, L2 penalty lambda, features clipped to norm R) trained by Newton-CG;
Algorithm 2's sampled sensitivity (m pairs, the maximum) and the analytic bound at the
trainer's certified gradient tolerance, in both norms, and their ratio. The sampled value must
never exceed the bound (``tests/sensitivity/test_sensitivity_analytic.py`` checks every pair);
the ratio says how much noise the proof costs over the estimate.

    python scripts/sensitivity_table.py --write docs/sensitivity.md
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import torch

from alm_opacus.data import load_dataset
from alm_opacus.heads import HeadConfig
from alm_opacus.sensitivity import analytic_sensitivity, sample_sensitivity, train_convex_heads
from docblocks import relative, write_block

#: (n, lambda, R) of the table.
SETTINGS = ((150, 0.05, 1.0), (300, 0.05, 1.0), (300, 0.01, 1.0), (300, 0.01, 3.0))
#: What the numbers depend on besides this script.
DEPS = (
    "alm_opacus/sensitivity",
    "alm_opacus/heads.py",
    "alm_opacus/steppers.py",
    "alm_opacus/data",
    "constraints.txt",
)


def measure(*, n: int, l2: float, radius: float, m: int) -> dict[str, float]:
    """Sampled (maximum of m pairs) and analytic sensitivities of one convex head."""
    data = load_dataset("digits")
    assert data.images is not None  # digits ships images
    x = torch.from_numpy(np.asarray(data.images[:n]).reshape(n, -1).astype(np.float64))
    y = torch.from_numpy(np.asarray(data.labels[:n], dtype=np.int64))
    config = HeadConfig(l2=l2, clip_radius=radius)
    sample = sample_sensitivity(x, y, num_classes=10, config=config, seed=0, m=m, solver="newton")
    fit = train_convex_heads(
        x, y, masks=torch.ones(1, n, dtype=torch.bool), num_classes=10, config=config
    )
    bound = analytic_sensitivity(
        n=n, l2=l2, clip_radius=radius, grad_tol=fit.tol, num_params=10 * (x.shape[1] + 1)
    )
    assert bound.value_l1 is not None
    return {
        "sampled_l2": sample.value_l2,
        "analytic_l2": bound.value_l2,
        "sampled_l1": sample.value_l1,
        "analytic_l1": bound.value_l1,
    }


def render(rows: list[tuple[tuple[int, float, float], dict[str, float]]], *, m: int) -> str:
    lines = [
        f"Sampled (m = {m}, the maximum) against analytic, raw digits pixels, Newton-CG:",
        "",
        "| n | λ | R | sampled L2 | analytic L2 | ratio | sampled L1 | analytic L1 | ratio |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for (n, l2, radius), r in rows:
        lines.append(
            f"| {n} | {l2:g} | {radius:g} | {r['sampled_l2']:.3g} | {r['analytic_l2']:.3g} | "
            f"{r['sampled_l2'] / r['analytic_l2']:.2f} | {r['sampled_l1']:.3g} | "
            f"{r['analytic_l1']:.3g} | {r['sampled_l1'] / r['analytic_l1']:.2f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--m", type=int, default=200, help="pairs drawn by the sampler")
    parser.add_argument("--write", type=Path, default=None, help="doc whose block to replace")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    rows = [((n, l2, r), measure(n=n, l2=l2, radius=r, m=args.m)) for n, l2, r in SETTINGS]
    table = render(rows, m=args.m)
    print(table)
    if args.write is not None:
        shown = ["--m", str(args.m), "--write", relative(args.write)]
        write_block(
            args.write,
            name="sampled-vs-analytic",
            script=__file__,
            args=shown,
            deps=DEPS,
            body=table,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
