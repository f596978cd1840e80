#!/usr/bin/env python
"""The table of registered datasets in docs/datasets.md, generated from their specs.

Every value comes from ``dataset_spec(name)`` (split, SimCLR recipe, DP-SGD schedule, epsilon
grid, head recipe), so the table cannot drift from the code; ``tests/data/test_data_docs.py``
fails when the committed table differs from what this prints, and ``tests/test_docblocks.py``
when its generated block ``datasets-table`` is older than the specs.

    .venv/bin/python scripts/dataset_table.py            # print the table
    .venv/bin/python scripts/dataset_table.py --write    # rewrite its block in docs/datasets.md
"""

from __future__ import annotations

import argparse
from pathlib import Path

from alm_opacus.data import available_dataset_specs, dataset_spec
from alm_opacus.data.features import FEATURES_EPSILONS, FEATURES_HEAD
from alm_opacus.data.spec import DatasetSpec
from alm_opacus.heads import HeadConfig
from docblocks import write_block

DOC = Path(__file__).resolve().parents[1] / "docs" / "datasets.md"
BLOCK = "datasets-table"
#: What the table depends on besides this script: the specs and the head recipes.
DEPS = ("alm_opacus/data", "alm_opacus/heads.py", "alm_opacus/steppers.py")


def _split(spec: DatasetSpec) -> str:
    s = spec.split
    nonmembers = f"{s.members:,}" if s.nonmembers is None else f"{s.nonmembers:,}"
    public = "rest" if s.public is None else f"{s.public:,}"
    return f"{s.members:,} / {nonmembers} / {s.attacker:,} / {public}"


def _grid(epsilons: tuple[float, ...]) -> str:
    return ", ".join(f"{e:g}" for e in epsilons)


def _head(h: HeadConfig) -> str:
    return f"{h.kind}, {h.solver}, l2 = {h.l2:g}"


def table() -> str:
    """The markdown table of every registered dataset (``features:PATH`` last)."""
    lines = [
        "| name | data | default split (members / non-members / attacker / public) | SimCLR "
        "(encoder, augmentation, epochs) | DP-SGD (epochs, batch) | epsilon grid | head | root |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name in available_dataset_specs():
        if ":" in name:  # a family's member (features:PATH) resolved in this process
            continue
        spec = dataset_spec(name)
        ssl = spec.ssl
        simclr = "none" if ssl is None else f"`{ssl.encoder}`, `{ssl.augmentation}`, {ssl.epochs}"
        lines.append(
            f"| `{name}` | {spec.description} | {_split(spec)} | {simclr} | "
            f"{spec.dpsgd.epochs}, {spec.dpsgd.batch_size} | {_grid(spec.epsilons)} | "
            f"{_head(spec.head)} | "
            f"{'yes' if spec.needs_root else 'no'} |"
        )
    lines.append(
        "| `features:PATH` | your own encoder's features (`docs/own_features.md`) | 1 : 1 : 2 : 1 "
        "of the rows, or the file's `role` column | none | 20, members / 4 (at most 256) | "
        f"{_grid(FEATURES_EPSILONS)} | {_head(FEATURES_HEAD)} | no |"
    )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--write", action="store_true", help="rewrite the block in the doc")
    args = parser.parse_args()
    if args.write:
        write_block(DOC, name=BLOCK, script=__file__, args=["--write"], deps=DEPS, body=table())
    print(table())


if __name__ == "__main__":
    main()
