"""Baselines to compare post-training protections with: ``dpsgd`` (and its logistic and
Laplace variants ``dpsgd-alm``, ``dpsgd-laplace``), ``lu``, ``dperm`` and the opt-in
``dpsgd-full``.

Importing this package registers them into ``alm_opacus``'s method registry (the harness
imports it through the ``alm_opacus.methods`` entry point group; ``alm_opacus`` never
imports ``baselines``). Each method's ``tuning_grid`` lists the configurations it may try
per epsilon; :func:`tuning_grids` describes them for the run's ``config.json``.
"""

from __future__ import annotations

from typing import Any

from alm_opacus.methods import method_class
from baselines import dperm, dpsgd, lu
from baselines._common import TUNING_BUDGET, TUNING_DRAWS

__all__ = [
    "METHODS",
    "TUNING_BUDGET",
    "TUNING_DRAWS",
    "TUNING_GRIDS",
    "dperm",
    "dpsgd",
    "lu",
    "tuning_grids",
]

METHODS = ("dpsgd", "dpsgd-alm", "dpsgd-laplace", "lu", "dperm", "dpsgd-full")

TUNING_GRIDS: dict[str, tuple[dict[str, Any], ...]] = {
    name: method_class(name).tuning_grid for name in METHODS
}


def tuning_grids() -> dict[str, Any]:
    """JSON-able description of the tuning protocol and grids, for ``config.json``."""
    return {
        "budget": TUNING_BUDGET,
        "draws_per_config": TUNING_DRAWS,
        "selection": "highest accuracy on a public validation split, at the target epsilon; "
        "trained on a public subset of the members' size; never on members or attack data",
        "grids": {name: [dict(c) for c in grid] for name, grid in TUNING_GRIDS.items()},
        "notes": {
            name: "max_grad_norm is scaled by sqrt(p), p the head's trainable numbers (L1 clip)"
            for name in ("dpsgd-alm", "dpsgd-laplace")
        },
    }
