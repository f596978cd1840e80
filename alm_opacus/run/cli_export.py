"""``alm-opacus export RUN DEST``: the subcommand that copies what may be shared of a run."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

from alm_opacus.run.catalogue import PRIVATE_DIR
from alm_opacus.run.cli_parser import _one_line, _Parser


def export_main(argv: Sequence[str]) -> int:
    """``alm-opacus export RUN DEST``: copy what may be shared of a finished run folder, with
    a report page without the per-member section (:mod:`alm_opacus.run.export`)."""
    parser = _Parser(
        prog="alm-opacus export",
        description="Copy what may be shared of a finished run folder (results, ROC curves, "
        "figures, TensorBoard events, config.json without the split seed) into a new folder, "
        "with a report page without the per-member section; never "
        f"{PRIVATE_DIR}/ (member indices, clean weights), a cache, or the owner's report.html.",
    )
    parser.add_argument("run", help="the run folder")
    parser.add_argument("dest", help="a new folder for the shareable copy")
    args = parser.parse_args(list(argv))
    # not rundir: it imports the run's config, and with it torch
    from alm_opacus.run.export import default_seed_note, export_run

    try:
        done = export_run(Path(args.run), Path(args.dest))
    except ValueError as exc:
        print(f"alm-opacus export: error: {_one_line(str(exc))}", file=sys.stderr)
        return 2
    except OSError as exc:
        where = f"{exc.filename}: " if exc.filename else ""
        print(f"alm-opacus export: error: {where}{exc.strerror or exc}", file=sys.stderr)
        return 2
    strays = f", {len(done.left_out)} other files (README.txt names them)" if done.left_out else ""
    print(
        f"exported {len(done.copied)} files and the shareable report to "
        f"{Path(args.dest) / 'report.html'} (left out: {PRIVATE_DIR}/, caches, the split "
        f"seed, the per-member section{strays})"
    )
    if done.default_split_seed:
        print(f"alm-opacus export: note: {default_seed_note()}", file=sys.stderr)
    return 0
