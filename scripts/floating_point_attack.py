#!/usr/bin/env python
"""Mironov's floating-point attack (CCS 2012) on released heads: float path against exact.

The attacker holds the released weights, knows the sampler bit for bit, and computes for each
of two neighbouring heads the exact probability of the shipped floats, with the attack of
``tests/mechanisms/test_mechanism_floating_point_attack.py`` (its helpers, loaded from the
test file, so the table and the tests share one attack): ``nn.Linear(8, 2)`` at ε = 1 and a
neighbour differing in all 18 weights by 0.999 in total, ``--releases`` releases of each
through ``PostTrainingPrivacyEngine.make_private`` (``exact=False``: the float path; the
default: exact). Reported per dtype and mechanism: the advantage (TPR − FPR) of the
likelihood-ratio test, and the share of releases impossible under the other head.

    python scripts/floating_point_attack.py --releases 100 --write docs/threat_model.md
"""

from __future__ import annotations

import argparse
import importlib.util
import math
import sys
from pathlib import Path
from types import ModuleType

import numpy as np
import torch

from alm_opacus.mechanisms import create_mechanism
from alm_opacus.protect import PostTrainingPrivacyEngine, SensitivityInfo, SensitivitySource
from docblocks import ROOT, relative, write_block

ATTACK = "tests/mechanisms/test_mechanism_floating_point_attack.py"
#: What the numbers depend on besides this script: the samplers, the release and the attack.
DEPS = (
    "alm_opacus/mechanisms",
    "alm_opacus/posttraining/engine.py",
    "alm_opacus/posttraining/module.py",
    ATTACK,
    "constraints.txt",
)
LABELS = {"alm": "logistic", "laplace": "Laplace", "gaussian": "Gaussian"}
#: (dtype, mechanism, float path's (advantage, impossible), exact path's).
Row = tuple[str, str, tuple[float, float], tuple[float, float]]


def attack_module() -> ModuleType:
    """The attack's helpers, from the test file that asserts them."""
    spec = importlib.util.spec_from_file_location("floating_point_attack_test", ROOT / ATTACK)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def attack(
    *, mechanism: str, dtype: torch.dtype, exact: bool, releases: int, helpers: ModuleType
) -> tuple[float, float]:
    """(advantage, share of releases impossible under the other head) of one setting."""
    head, other = helpers._neighbours(dtype)
    norm = create_mechanism(mechanism).norm
    info = SensitivityInfo(value=1.0, norm=norm, source=SensitivitySource.ANALYTIC)
    engine = PostTrainingPrivacyEngine(mechanism=mechanism)
    clean = (helpers._flat(head), helpers._flat(other))
    llr, impossible = [], 0
    for h, module in enumerate((head, other)):
        shipped = []
        for _ in range(releases):
            out = engine.make_private(
                module,
                epsilon=helpers.EPSILON,
                delta=helpers._delta(mechanism),
                sensitivity=info,
                exact=exact,
            )
            shipped.append(helpers._flat(out.module))
        rel, scale = torch.stack(shipped), out.statement.noise_scale
        assert scale is not None
        if exact:
            assert out.statement.grid is not None
            grid = helpers._grid_of(out.statement.grid)
            l0, l1 = (
                helpers._exact_log_likelihood(rel, c, mechanism=mechanism, scale=scale, grid=grid)
                for c in clean
            )
        else:
            l0, l1 = (
                helpers._float_log_likelihood(rel, c, mechanism=mechanism, scale=scale)
                for c in clean
            )
        impossible += int(np.sum(~np.isfinite(l1 if h == 0 else l0)))
        with np.errstate(invalid="ignore"):
            llr.append(np.nan_to_num(l0 - l1, posinf=1e300, neginf=-1e300))
    return helpers._advantage(*llr), impossible / (2 * releases)


def render(rows: list[Row], *, releases: int, bound: float) -> str:
    lines = [
        f"{releases} releases per hypothesis; advantage = TPR − FPR of the likelihood-ratio test.",
        "",
        "| dtype | mechanism | float path: advantage / releases impossible under the "
        "neighbour | exact path: advantage / impossible |",
        "|---|---|---|---|",
    ]
    for dtype, label, (fa, fi), (ea, ei) in rows:
        lines.append(
            f"| {dtype} | {label} | {fa:.2f} / {100 * fi:.0f}% | {ea:.2f} / {100 * ei:.0f}% |"
        )
    error = 2 / math.sqrt(2 * releases)  # two standard errors of a difference of two rates
    lines += [
        "",
        f"ε = 1 allows an advantage of at most (e^ε − 1 + 2δ)/(e^ε + 1) = {bound:.3f} "
        f"(tanh(ε/2) for pure DP); at {releases} releases per side the sampling error of an "
        f"advantage is up to about ±{error:.2f} (two standard errors).",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--releases", type=int, default=100, help="per hypothesis and setting")
    parser.add_argument("--write", type=Path, default=None, help="doc whose block to replace")
    args = parser.parse_args(argv)
    if args.releases < 1:
        parser.error(f"--releases must be ≥ 1, got {args.releases}")
    helpers = attack_module()
    rows: list[Row] = []
    for dtype in helpers.DTYPES:
        for mechanism in helpers.MECHANISMS:
            float_path, exact_path = (
                attack(
                    mechanism=mechanism,
                    dtype=dtype,
                    exact=exact,
                    releases=args.releases,
                    helpers=helpers,
                )
                for exact in (False, True)
            )
            rows.append(
                (str(dtype).removeprefix("torch."), LABELS[mechanism], float_path, exact_path)
            )
            print(rows[-1], flush=True)
    table = render(rows, releases=args.releases, bound=helpers.BOUND)
    print(table)
    if args.write is not None:
        shown = ["--releases", str(args.releases), "--write", relative(args.write)]
        write_block(
            args.write,
            name="floating-point-attack",
            script=__file__,
            args=shown,
            deps=DEPS,
            body=table,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
