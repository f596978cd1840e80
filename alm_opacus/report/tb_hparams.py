"""The HParams view of ``tb/``: one session per (method, ε) point, with the columns the view
shows and the run-wide settings beside them."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path

from tensorboard.compat.proto import summary_pb2

from alm_opacus.report import events
from alm_opacus.report.draws import DrawRecord
from alm_opacus.report.results import ResultRow
from alm_opacus.report.series import (
    WEAK_DELTA_UNKNOWN_N,
    WEAK_EPSILON,
    cells,
    format_epsilon,
    points,
)

__all__ = [
    "HPARAMS_FOLDER",
    "HPARAM_COLUMNS",
    "HPARAM_METRICS",
    "hparams_sessions",
    "weak_rule",
    "write_hparams",
]

HPARAMS_FOLDER = "hparams"
#: shows the first five and colours its plots by the first.
HPARAM_METRICS = {
    "hparams/mia_auc": ("mia_auc", "AUC (strongest attack)"),
    "hparams/test_accuracy": ("test_accuracy", "test accuracy"),
    "hparams/utility_loss": ("utility_loss", "utility loss"),
    "hparams/tpr_at_fpr_0.01": ("tpr_at_fpr_0_01", "TPR at 1% FPR"),
    "hparams/mia_accuracy": ("mia_accuracy", "MIA accuracy (strongest attack)"),
    "hparams/tpr_at_fpr_0.001": ("tpr_at_fpr_0_001", "TPR at 0.1% FPR"),
}
#: The hparams the HParams view shows, with their display names: the experiment lists only
#: these, as the view shows five columns whatever their number (listed by name), and a
#: sixth column would push the metrics off a 1400 px screen. The session's other hparams
#: (the asked ε, which the session's name gives, the run's settings) are recorded with it.
HPARAM_COLUMNS = {
    "epsilon_replace_one": "ε′ (replace-one)",
    "guarantee": "guarantee (replace-one)",
    "method": "method",
    "weak_guarantee": "weak",  # named with its rule by weak_rule
}


def _hparam_value(value: object) -> events.HParamValue:
    return value if isinstance(value, str | int | float | bool) else str(value)


def hparams_sessions(
    rows: Sequence[ResultRow],
    draws: Sequence[DrawRecord],
    settings: Mapping[str, object],
    members: int | None,
) -> list[tuple[str, dict[str, events.HParamValue], dict[str, float]]]:
    """(run name, hparams, metrics): one session per (method, ε) point, its numbers the
    point's (the mean over seeds of each seed's strongest attack, as in the table), so the
    sessions are as many as the table's lines, not one per release. Infinite values (the
    unprotected head's ε) are left out: the plugin serves JSON, which has no inf."""
    releases = Counter((d.method, d.epsilon) for d in draws)
    by_cell = cells(rows)
    out = []
    for point in points(rows):
        # the releases averaged: the draw records, else the draws each seed's row counts
        drawn = releases.get((point.method, point.epsilon)) or sum(
            by_cell[(point.method, point.epsilon, s)][0].noise_draws for s in point.seeds
        )
        hparams: dict[str, events.HParamValue] = {
            "method": point.method,
            "epsilon": point.epsilon,
            "guarantee": point.common_guarantee,
            "epsilon_replace_one": point.epsilon_common,
            "delta_replace_one": point.delta_common,
            "neighbouring": point.neighbouring or "unstated",
            "seeds": len(point.seeds),
            "releases": drawn,
            **{k: _hparam_value(v) for k, v in settings.items()},
        }
        if math.isfinite(point.epsilon_common):  # no guarantee: neither weak nor not
            hparams["weak_guarantee"] = point.weak_for(members)
        metrics = {tag: getattr(point, field).mean for tag, (field, _) in HPARAM_METRICS.items()}
        name = f"{HPARAMS_FOLDER}/{point.method}/eps={format_epsilon(point.epsilon)}"
        out.append((name, hparams, metrics))
    return out


def write_hparams(
    sessions: Sequence[tuple[str, dict[str, events.HParamValue], dict[str, float]]],
    folder: Path,
    start: Mapping[str, float],
    members: int | None,
) -> summary_pb2.Summary.Value:
    """Write each session (:func:`hparams_sessions`) under ``folder`` at its ``start`` time;
    returns the experiment for the root run."""
    for name, hparams, metrics in sessions:
        begin, end = events.hparams_session(hparams, wall_time=start[name])
        events.write_run(
            folder / name, {0: [begin, *events.scalars(metrics), end]}, wall_time=start[name]
        )
    logged = {tag for _, _, metrics in sessions for tag, v in metrics.items() if not math.isnan(v)}
    return events.hparams_experiment(
        [h for _, h, _ in sessions],
        {tag: shown for tag, (_, shown) in HPARAM_METRICS.items() if tag in logged},
        columns=tuple(HPARAM_COLUMNS),
        display_names={**HPARAM_COLUMNS, "weak_guarantee": f"weak ({weak_rule(members)})"},
    )


def weak_rule(members: int | None) -> str:
    """The weak-guarantee rule (``series.is_weak``) in words, for ``members`` members."""
    line = f"1/{members}" if members else f"{WEAK_DELTA_UNKNOWN_N:g}"
    return f"ε′ > {WEAK_EPSILON:g} or δ′ > {line}"
