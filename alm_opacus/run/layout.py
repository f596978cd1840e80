"""The names of a run folder's parts, importable without torch.

The run (``rundir.py``, which imports the run's config and so torch) and the export
(``export.py``, which must not) both read them here. ``rundir`` re-exports every name, and
its docstring describes the layout.
"""

from __future__ import annotations

import re

from alm_opacus.report.draws import DRAWS_FILE
from alm_opacus.report.rocs import LEGACY_ROCS_FILE, ROCS_FILE

__all__ = [
    "DEFAULT_CACHE",
    "LOCK_FILE",
    "PRIVATE_DIR",
    "PRIVATE_README",
    "RESIDUE",
    "SHARED_FILES",
    "SPLIT_FILE",
    "WITHHELD_KEYS",
]

#: The folder of a run that holds what was computed from the members without noise.
PRIVATE_DIR = "private"
#: The split's indices, members included.
SPLIT_FILE = f"{PRIVATE_DIR}/split.json"
#: Says what ``private/`` holds and why it is never shared.
PRIVATE_README = f"{PRIVATE_DIR}/README.txt"
#: The cache of a run given ``--out`` and no ``--cache-dir`` (clean heads live there).
DEFAULT_CACHE = f"{PRIVATE_DIR}/cache"
#: What may be shared: aggregates over the evaluation set, with no member index and no
#: clean weight. ``export_run`` copies these (of ``plots/`` the figures, of ``tb/`` the
#: event files: :mod:`alm_opacus.run.export`); ``report.html`` names the most exposed
#: members, so it stays with the owner (the export writes a page without them). A finished
#: run of an older version has ``rocs.json`` (:data:`LEGACY_ROCS_FILE`) in place of
#: ``rocs.jsonl``: exported as it is.
SHARED_FILES = (
    "config.json",
    "results.csv",
    ROCS_FILE,
    LEGACY_ROCS_FILE,
    "tb",
    "plots",
    DRAWS_FILE,
)
#: ``config.json`` keys an export withholds: the split seed re-draws the member indices
#: (the split is a public, deterministic function of data set, sizes and seed). Paths of the
#: owner's machine are not withheld but cut to their last part (``export.PATH_KEYS``).
WITHHELD_KEYS = ("split_seed",)
#: Held (``flock``) by a run for as long as it writes the folder; the file stays.
LOCK_FILE = ".lock"
#: Leftovers of a killed writer: ``atomic_open``'s ``.NAME.*.tmp``, ``replace_folder``'s
#: ``.NAME.new-*`` / ``.NAME.old-*``, and write probes.
RESIDUE = re.compile(r"^\..+\.tmp$|^\..+\.(new|old)-[^/]+$|^\.probe-\d+$")
