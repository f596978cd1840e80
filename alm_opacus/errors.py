"""Errors shared across layers (kept here so that low layers need not import high ones)."""

from __future__ import annotations

__all__ = ["InfeasibleRelease"]


class InfeasibleRelease(ValueError):
    """No release is possible at this budget (e.g. no noise level reaches the target epsilon).

    The harness records such a cell as ``infeasible`` with this message as its reason, and
    goes on with the rest of the grid.
    """
