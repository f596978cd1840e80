#!/usr/bin/env python
"""Mark generated blocks whose re-measurement is pending, with a notice every reader sees.

For blocks that take hours to measure, when a change to what they depend on lands first
(``scripts/docblocks.py``, "Pending re-measurement"). The notice pins the current code: a later
change makes the block stale again. Re-running the block's own command removes the notice.

    .venv/bin/python scripts/mark_pending.py docs/scale.md scale-table --reason "..."
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from docblocks import mark_pending


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("doc", type=Path, help="the markdown file")
    parser.add_argument("names", nargs="+", help="the generated blocks to mark")
    parser.add_argument("--reason", required=True, help="what changed since they were measured")
    args = parser.parse_args()
    for name in args.names:
        mark_pending(args.doc, name=name, reason=args.reason)
        print(f"{args.doc}: block {name!r} marked: re-measurement pending")


if __name__ == "__main__":
    main()
