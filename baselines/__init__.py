"""Baselines to compare post-training protections with: ``dpsgd``, ``lu``, ``dperm`` and the
opt-in ``dpsgd-full``.

Importing this package registers them into ``alm_opacus``'s method registry (the harness
imports it through the ``alm_opacus.methods`` entry point group; ``alm_opacus`` never
imports ``baselines``). ``TUNING_GRIDS`` lists the configurations each one may try per
epsilon, for the run's ``config.json``.
"""

from __future__ import annotations

from typing import Any

from baselines import dperm, dpsgd, dpsgd_full, lu
from baselines._common import TUNING_BUDGET, TUNING_DRAWS

__all__ = [
    "METHODS",
    "TUNING_BUDGET",
    "TUNING_DRAWS",
    "TUNING_GRIDS",
    "dperm",
    "dpsgd",
    "dpsgd_full",
    "lu",
    "tuning_grids",
]

METHODS = ("dpsgd", "lu", "dperm", "dpsgd-full")

TUNING_GRIDS: dict[str, tuple[dict[str, float], ...]] = {
    "dpsgd": dpsgd.TUNING_GRID,
    "lu": lu.TUNING_GRID,
    "dperm": dperm.TUNING_GRID,
    "dpsgd-full": dpsgd_full.FULL_TUNING_GRID,
}


def tuning_grids() -> dict[str, Any]:
    """JSON-able description of the tuning protocol and grids, for ``config.json``."""
    return {
        "budget": TUNING_BUDGET,
        "draws_per_config": TUNING_DRAWS,
        "selection": "highest accuracy on a public validation split, at the target epsilon; "
        "trained on a public subset of the members' size; never on members or attack data",
        "grids": {name: [dict(c) for c in grid] for name, grid in TUNING_GRIDS.items()},
    }
