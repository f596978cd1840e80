#!/usr/bin/env python
"""Lu et al.'s sensitivity chain against ours, for three settings (docs/baselines.md).

Exact arithmetic of ``baselines.lu.compare_chains`` (their Eq. 21 chain, and ours with a
proven Lipschitz bound), with H = 128, C = 10, lambda = 0.0005, R = 1:

    python scripts/lu_chains.py --write docs/baselines.md
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from baselines.lu import compare_chains
from docblocks import relative, write_block

#: (label, members n, input dimension d) of the table's rows.
SETTINGS = (
    ("MNIST as in the paper (n = 10000, d = 784)", 10_000, 784),
    ("digits (n = 150, d = 128)", 150, 128),
    ("embedded mnist (n = 1000, d = 576 SimCLR features)", 1000, 576),
)
DEPS = ("baselines/lu",)


def render(*, l2: float) -> str:
    lines = ["| setting | theirs ρ / Δω / Δz_T / Δp | ours ρ / Δω / Δz_T / Δp |", "|---|---|---|"]
    for label, n, d in SETTINGS:
        c = compare_chains(n=n, input_dim=d, hidden=128, num_classes=10, l2=l2)
        theirs = " / ".join(
            f"{v:.4g}" for v in (c.paper.rho, c.paper.delta_omega, c.paper.delta_z, c.paper.delta_p)
        )
        ours = " / ".join(
            f"{v:.4g}" for v in (c.ours.rho, c.ours.delta_omega, c.ours.delta_z, c.ours.delta_p)
        )
        lines.append(f"| {label} | {theirs} | {ours} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--l2", type=float, default=0.0005, help="lambda of both chains")
    parser.add_argument("--write", type=Path, default=None, help="doc whose block to replace")
    args = parser.parse_args(argv)
    table = render(l2=args.l2)
    print(table)
    if args.write is not None:
        shown = ["--l2", repr(args.l2), "--write", relative(args.write)]
        write_block(
            args.write, name="lu-chains", script=__file__, args=shown, deps=DEPS, body=table
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
