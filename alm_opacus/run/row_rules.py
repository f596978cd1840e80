"""Rules that tie the columns of one ``results.csv`` row together, checked on ``--resume``.

A value can be in its own column's range (:class:`~alm_opacus.report.results.ColumnSpec`)
and still contradict the others; these rules refuse such a row (a hand edit, a bit flip):

* **guarantee vs sensitivity source**: the statement's own kind rules
  (:func:`alm_opacus.statement.check_guarantee`): a sampled sensitivity gives only
  ``random-dp``, ``random-dp`` needs one, one sampled on the members gives no guarantee,
  ``pure-dp`` needs delta = 0 and ``approx-dp`` delta > 0.
* **epsilon_spent >= epsilon** for a release of a post-training method: the harness makes
  each one the first release of its clean head (a fresh engine per release), so the ledger's
  total is at least the release's own epsilon. DP-SGD's ``epsilon_spent`` is the
  accountant's epsilon, at most its target, and is not checked here.
* **noise_scale vs sensitivity and epsilon** for a post-training method that claims a
  guarantee: the scale is the mechanism's own calibration at the row's epsilon and delta
  for the sensitivity Δ' that grid rounding inflates Δ to, with Δ <= Δ' < 3Δ
  (:func:`alm_opacus.mechanisms.exact.plan_release` widens the grid at most until Δ' >= 2Δ,
  each widening doubling Δ' - Δ), so ``calibrate(Δ) <= noise_scale < calibrate(3Δ)``; and
  ``noise_std`` is the mechanism's standard deviation at that scale.

Each rule returns what is wrong in one clause, or ``None``; the caller names the file and
the row.
"""

from __future__ import annotations

import math

from alm_opacus.mechanisms import (
    AdditiveNoiseMechanism,
    ClassicGaussianMechanism,
    create_mechanism,
)
from alm_opacus.methods import method_class
from alm_opacus.posttraining.method import PostTrainingMethod
from alm_opacus.report.results import ResultRow
from alm_opacus.statement import Guarantee, SensitivitySource, check_guarantee

__all__ = ["CSV_ROUNDING", "SCALE_TOLERANCE", "row_rule_problem"]

#: Relative error of a number written with 6 significant digits (``results.csv``'s
#: ``%.6g``): half a unit in the sixth digit of a mantissa in [1, 10), at most 5e-6.
CSV_ROUNDING = 5e-6
#: Relative slack of the noise-scale rule. Both ``noise_scale`` and ``sensitivity`` are read
#: back from 6 significant digits, which moves their ratio by at most 2 * CSV_ROUNDING /
#: (1 - CSV_ROUNDING) (calibrations are linear in the sensitivity); recomputing the
#: calibration from another sensitivity moves the analytic Gaussian's root by at most a few
#: 1e-13 relative (measured <= 9.1e-13), which 2^-30 covers with a thousandfold margin.
SCALE_TOLERANCE = 2 * CSV_ROUNDING / (1 - CSV_ROUNDING) + 2.0**-30
#: Δ' < 3Δ: the most grid rounding can inflate the sensitivity a release is calibrated to.
_MAX_INFLATION = 3.0
#: The guarantees a release claims (a ``none`` or ``per-query`` row states no epsilon of
#: its noise that the noise-scale rule could check).
_CLAIMS = ("pure-dp", "approx-dp", "random-dp")


def row_rule_problem(row: ResultRow) -> str | None:
    """The first cross-column rule ``row`` breaks, in one clause, or ``None``.

    Rows of infeasible cells and of methods other than the post-training ones (DP-SGD, the
    plugins' methods) are only checked for their guarantee's kind (the other rules need the
    mechanism that drew the noise). Each column's own range is
    :func:`~alm_opacus.report.results.out_of_range`'s, checked first.
    """
    problem = _guarantee_problem(row)
    if problem is not None or row.status != "ok":
        return problem
    mechanism = _post_training_mechanism(row.method)
    if mechanism is None:
        return None
    return _spent_problem(row) or _scale_problem(row, mechanism)


def _guarantee_problem(row: ResultRow) -> str | None:
    try:  # an unknown kind or source text is a ValueError too (out_of_range names it first)
        source = SensitivitySource(row.sensitivity_source) if row.sensitivity_source else None
        check_guarantee(guarantee=Guarantee(row.guarantee), delta=row.delta, source=source)
    except ValueError as exc:
        return (
            f"guarantee={row.guarantee!r} with sensitivity_source={row.sensitivity_source!r} "
            f"and delta={row.delta!r} breaks the statement rule: {exc}"
        )
    return None


def _post_training_mechanism(method: str) -> str | None:
    """The noise mechanism of a post-training method's releases, or ``None``."""
    kind = method_class(method)
    if not issubclass(kind, PostTrainingMethod):
        return None
    return kind.mechanism


def _spent_problem(row: ResultRow) -> str | None:
    if math.isnan(row.epsilon_spent) or not math.isfinite(row.epsilon):
        return None
    if row.epsilon_spent >= row.epsilon * (1 - CSV_ROUNDING):
        return None
    return (
        f"epsilon_spent={row.epsilon_spent!r} is below epsilon={row.epsilon!r}: a post-training "
        "release is its head's first, so the ledger's total includes at least its own epsilon"
    )


def _scale_problem(row: ResultRow, mechanism: str) -> str | None:
    if row.guarantee not in _CLAIMS:
        return None
    mech = create_mechanism(mechanism)
    if math.isnan(row.noise_scale) or math.isnan(row.sensitivity) or row.sensitivity <= 0:
        return (
            f"noise_scale={row.noise_scale!r}, sensitivity={row.sensitivity!r}: a "
            f"{row.guarantee} release of the {mechanism} mechanism states its noise scale and "
            "a sensitivity > 0"
        )
    try:
        low = mech.calibrate(epsilon=row.epsilon, delta=row.delta, sensitivity=row.sensitivity)
        high = mech.calibrate(
            epsilon=row.epsilon, delta=row.delta, sensitivity=_MAX_INFLATION * row.sensitivity
        )
    except ValueError as exc:
        return f"the {mechanism} mechanism cannot be calibrated at this epsilon and delta ({exc})"
    # The textbook Gaussian beyond its theorem states a larger delta than it was calibrated
    # to (protect.statement_for), so its scale may sit above calibrate(3Δ) at that delta.
    unbounded = isinstance(mech, ClassicGaussianMechanism) and not mech.theorem_applies(
        epsilon=row.epsilon
    )
    scale = row.noise_scale
    if scale >= low * (1 - SCALE_TOLERANCE) and (unbounded or scale < high * (1 + SCALE_TOLERANCE)):
        return _std_problem(row, mech)
    return (
        f"noise_scale={scale!r} does not fit the {mechanism} mechanism's calibration for "
        f"sensitivity {row.sensitivity!r} at epsilon={row.epsilon!r}, delta={row.delta!r}: "
        f"expected at least {low:.6g}"
        + ("" if unbounded else f" and, with grid rounding, below {high:.6g}")
    )


def _std_problem(row: ResultRow, mech: AdditiveNoiseMechanism) -> str | None:
    """``noise_std`` is the mechanism's standard deviation at ``noise_scale`` (both read back
    from 6 significant digits)."""
    if math.isnan(row.noise_std):
        return None
    expected = mech.std(row.noise_scale)
    if abs(row.noise_std - expected) <= SCALE_TOLERANCE * expected:
        return None
    return (
        f"noise_std={row.noise_std!r} is not the {mech.name} mechanism's standard deviation at "
        f"noise_scale={row.noise_scale!r}: expected {expected:.6g}"
    )
