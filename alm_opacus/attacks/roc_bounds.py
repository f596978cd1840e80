"""ROC curves stored bounded (issue 38, item 4): every vertex below FPR 1e-3, then the curve
at a fixed log-spaced grid, each stored point a point of the full curve. A run's metrics are
computed on the full curve inside the cell (`alm_opacus.attacks.metrics`); ``rocs.jsonl``
keeps this bounded curve (`alm_opacus.report.rocs`).
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from alm_opacus.attacks.base import FloatArray

__all__ = ["ROC_FPR_CUT", "ROC_GRID", "ROC_GRID_POINTS", "bound_roc"]

ArrayLike = npt.ArrayLike


#: Below this FPR a stored ROC keeps the full curve's vertices (:func:`bound_roc`).
ROC_FPR_CUT = 1e-3
#: How many FPRs of the log-spaced grid a stored ROC is evaluated at, from ``ROC_FPR_CUT`` to
#: 1 (:func:`bound_roc`): consecutive grid FPRs differ by a factor 10^(3/199), about 3.5 %.
ROC_GRID_POINTS = 200
#: The grid itself, ascending, its ends exactly 1e-3 and 1.
ROC_GRID: FloatArray = np.logspace(-3.0, 0.0, ROC_GRID_POINTS)


def bound_roc(*, fpr: ArrayLike, tpr: ArrayLike) -> tuple[FloatArray, FloatArray]:
    """The ROC a run stores: bounded in size whatever the number of scores, exact at its points.

    The curve is the full ROC of :func:`roc_curve` read as :func:`roc_auc` reads it: the
    polyline through its vertices (ties move it diagonally). What is kept:

    * every vertex with FPR below :data:`ROC_FPR_CUT` (1e-3), and every vertex at the
      smallest positive FPR (one non-member, so a curve over fewer than 1,000 non-members still
      starts where the log-log axes do), except the interior vertices of a vertical run (one
      FPR, several TPRs): they lie on the segment between the run's ends, so the polyline is
      unchanged, and the low-FPR part holds at most 2 (1e-3 n + 2) points for n non-members;
    * the polyline at each FPR of :data:`ROC_GRID` (:data:`ROC_GRID_POINTS` = 200 FPRs,
      log-spaced from 1e-3 to 1) not below the smallest positive FPR (below it the curve is
      the segment between kept vertices): linearly interpolated between the two vertices
      around it, and at an FPR that is a vertex's, the top of its vertical run (there the
      value equals :func:`tpr_at_fpr`'s).

    So (0, 0) and (1, 1) are always kept, every kept point lies on the full curve, the
    smallest positive FPR kept is the full curve's (1/n: where the figures' axes start), and
    the curve has at most 2 (1e-3 n + 2) + 200 points. Metrics are computed on the full curve
    before it is bounded (the trapezoid AUC of the bounded curve is a chord approximation).

    Args:
        fpr: (k,) the full curve's FPRs, ascending from 0 to 1.
        tpr: (k,) its TPRs, ascending from 0 to 1.

    Returns:
        ``(fpr, tpr)`` of the bounded curve, ascending.

    Raises:
        ValueError: if the two are not 1-d of one length, not ascending, or do not run from
            (0, 0) to (1, 1).
    """
    f = np.asarray(fpr, dtype=np.float64)
    t = np.asarray(tpr, dtype=np.float64)
    if f.ndim != 1 or t.shape != f.shape or f.size < 2:
        raise ValueError(
            f"fpr and tpr must be 1-d of one length >= 2; got shapes {f.shape}, {t.shape}"
        )
    if (f[0], t[0], f[-1], t[-1]) != (0.0, 0.0, 1.0, 1.0):
        raise ValueError(
            f"a full ROC runs from (0, 0) to (1, 1); got ({f[0]}, {t[0]}) to ({f[-1]}, {t[-1]})"
        )
    if np.any(np.diff(f) < 0) or np.any(np.diff(t) < 0):
        raise ValueError("a full ROC's fpr and tpr must both be ascending")
    first = float(f[f > 0].min())
    run_before = np.r_[False, f[1:] == f[:-1]]
    run_after = np.r_[f[:-1] == f[1:], False]
    low = ((f < ROC_FPR_CUT) | (f == first)) & ~(run_before & run_after)
    # the last vertex at or below each grid FPR (the top of a vertical run there) and the
    # first one above it (none above 1: the top of the run at 1 is (1, 1))
    grid = ROC_GRID[first <= ROC_GRID]
    above = np.searchsorted(f, grid, side="right")
    at = above - 1
    after = np.minimum(above, f.size - 1)
    span = np.where(f[after] > f[at], f[after] - f[at], 1.0)
    weight = np.where(f[at] < grid, (grid - f[at]) / span, 0.0)
    grid_tpr = t[at] + weight * (t[after] - t[at])
    out_f = np.r_[f[low], grid]
    out_t = np.r_[t[low], grid_tpr]
    order = np.lexsort((out_t, out_f))
    out_f, out_t = out_f[order], out_t[order]
    new = np.r_[True, (out_f[1:] != out_f[:-1]) | (out_t[1:] != out_t[:-1])]
    return out_f[new], out_t[new]
