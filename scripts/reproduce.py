#!/usr/bin/env python
"""Check the source papers' claims on this project's runs; with --update-docs, write
docs/results.md.

It runs the comparison on each dataset and split seed, into its own folder (default
``runs/reproduce-<UTC time>``, never a tracked file),

    python scripts/compare.py --dataset D --methods all --split-seed S --reproducible-noise \\
        --out <folder>/D-split<S>

and turns the ``results.csv`` files into one row per claim of the ALM paper (Yang, Gohari &
Topcu) and of Lu et al. (2022): holds / fails / not testable here, with numbers and 95%
intervals that include the variation between split seeds. Each verdict is the outcome of
interval tests written beside the claim; the sentence on why names which test decided it,
so the text changes only when a test's outcome does. ``reproduce.json`` in the folder
records the verdicts and each run's wall time; the docs state that cost.

Noise is seeded (``--reproducible-noise``) so that a re-run reproduces the same releases;
those releases are private only while the seeds are secret, which is moot for a check of
published claims.

    python scripts/reproduce.py [--datasets digits,mnist] [--split-seeds 0,1,2]
        [--out DIR | --reuse DIR] [--jobs N] [--update-docs]

``--paper-scale`` checks the ALM claims at the paper's scale instead, on a features file of
10,000 members under every sensitivity setting (``scripts/reproduce_paper_scale.py``):

    python scripts/reproduce.py --paper-scale [--paper-members N] [--update-docs]
"""

from __future__ import annotations

import argparse
import datetime
import json
import shlex
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the scripts beside this one

import reproduce_claims as rc
from reproduce_claims import ROOT, Run, Runs


def main(argv: list[str] | None = None) -> int:
    import reproduce_paper_scale as paper_scale

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--datasets", default=None, help="(default digits,mnist)")
    parser.add_argument(
        "--split-seeds", default=None, help="(default 0,1,2; one seed with --paper-scale, 0)"
    )
    parser.add_argument("--methods", default=None, help="passed to compare.py (default all)")
    parser.add_argument("--compare-args", default="", help="more compare.py flags (quoted)")
    group = parser.add_mutually_exclusive_group()
    group.add_argument(
        "--out", default=None, help="a new folder for the runs (default runs/reproduce-<UTC time>)"
    )
    group.add_argument("--reuse", default=None, help="finish and reuse the runs in this folder")
    parser.add_argument("--jobs", type=int, default=1, help="runs at a time")
    parser.add_argument(
        "--update-docs",
        action="store_true",
        help="write docs/results.md (the only tracked file written)",
    )
    paper_scale.add_arguments(parser)
    args = parser.parse_args(argv)
    paper_scale.check_arguments(args, parser)
    datasets = [d.strip() for d in (args.datasets or "digits,mnist").split(",") if d.strip()]
    seeds = [int(s) for s in (args.split_seeds or "0,1,2").split(",") if s.strip()]
    args.methods = args.methods or "all"
    if args.reuse is not None:
        folder = Path(args.reuse)
        if not folder.is_dir():
            parser.error(f"--reuse={args.reuse!r}: expected an existing folder")
    else:
        stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%d-%H%M%S")
        kind = "reproduce-paper" if args.paper_scale else "reproduce"
        folder = Path(args.out or ROOT / "runs" / f"{kind}-{stamp}")
        if folder.exists() and any(folder.iterdir()):
            parser.error(f"--out={str(folder)!r} is not empty: use --reuse to continue it")
    folder.mkdir(parents=True, exist_ok=True)
    if args.paper_scale:
        return paper_scale.main(args, folder=folder)
    extra = shlex.split(args.compare_args)
    jobs = {
        (d, s): rc._compare_command(
            d,
            s,
            folder / f"{d}-split{s}",
            methods=args.methods,
            cache=folder / "cache",
            extra=extra,
        )
        for d in datasets
        for s in seeds
    }
    record_path = folder / "reproduce.json"
    record = json.loads(record_path.read_text()) if record_path.exists() else {}
    seconds: dict[str, float] = dict(record.get("seconds", {}))
    with ThreadPoolExecutor(max_workers=max(args.jobs, 1)) as pool:
        futures = {
            k: pool.submit(rc._run_one, cmd, folder / f"{k[0]}-split{k[1]}")
            for k, cmd in jobs.items()
        }
        for (d, s), future in futures.items():
            spent = future.result()
            if spent:
                seconds[f"{d}-split{s}"] = seconds.get(f"{d}-split{s}", 0.0) + spent
    runs = [Runs([Run(folder / f"{d}-split{s}") for s in seeds]) for d in datasets]
    found = rc.claims(runs)
    timing = {"seconds": seconds, "machine": record.get("machine", rc.machine())}
    record = {
        **timing,
        "commands": {f"{d}-split{s}": c for (d, s), c in jobs.items()},
        "claims": [{"dataset": d, **asdict(c)} for d, c in found],
    }
    from alm_opacus.io import atomic_write_json, atomic_write_text

    atomic_write_json(record_path, record)
    for dataset, claim in found:
        print(f"{dataset:13s} {claim.verdict:17s} {claim.paper}, {claim.where}")
    print(f"runs and verdicts: {folder}")
    if args.update_docs:
        from docblocks import find_blocks, write_block

        placeholder = "<!-- generated results -->\n<!-- end generated results -->\n"
        if not rc.DOC.exists():
            atomic_write_text(rc.DOC, placeholder)
        elif "results" not in {b.name for b in find_blocks(rc.DOC)}:  # keep the rest of the page
            atomic_write_text(rc.DOC, placeholder + rc.DOC.read_text())
        body = rc.render(runs, found, timing)
        write_block(
            rc.DOC,
            name="results",
            script=__file__,
            deps=rc.DEPS,
            body=body,
            args=[
                "--datasets",
                ",".join(datasets),
                "--split-seeds",
                ",".join(map(str, seeds)),
                "--methods",
                args.methods,
                "--compare-args",
                args.compare_args,
                "--update-docs",
            ],
        )
        print(f"written: {rc.DOC}")
    return 0


if __name__ == "__main__":
    np.seterr(all="ignore")
    sys.exit(main())
