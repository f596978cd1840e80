"""What a resumed run folder must hold before its rows are kept.

:class:`~alm_opacus.run.rundir.RunFolder` (which re-exports these names) calls them from
``check`` before anything is written: the kept rows (:func:`check_rows`) and ROC curves
(:func:`check_rocs`: ``rocs.jsonl``, :mod:`alm_opacus.report.rocs`) must belong to the
previous ``config.json``'s grid, the folder must match
its ``manifest.json`` (:func:`check_manifest`) and the data its recorded digest
(:func:`check_data`). Each refusal is one line naming the file, the entry and what to do.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Collection, Sequence
from pathlib import Path
from typing import Any

from alm_opacus.methods import method_class
from alm_opacus.report.draws import DRAWS_FILE
from alm_opacus.report.results import ResultRow, cell_key, out_of_range
from alm_opacus.report.rocs import LEGACY_ROCS_FILE, ROCS_FILE, read_rocs
from alm_opacus.run.manifest import MANIFEST_FILE, read_manifest, verify_manifest
from alm_opacus.run.row_rules import row_rule_problem

__all__ = ["check_data", "check_manifest", "check_rocs", "check_rows"]


def _read_json(path: Path, *, what: str, hint: str, prefix: str = "") -> Any:
    """``path``'s JSON, or a one-line ValueError naming it, what it should be, and what to do."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ValueError(f"{prefix}{path}: not a readable {what} ({exc}); {hint}") from exc


# -- kept rows ----------------------------------------------------------------------------

#: How far a kept utility loss may sit from 1 - accuracy / reference: the three numbers are
#: written with 6 significant digits, so their rounding moves it by at most ~1e-5 for any
#: reference accuracy >= 0.1.
_UTILITY_TOLERANCE = 1e-4


def check_rows(rows: Sequence[ResultRow], *, settings: dict[str, Any], path: Path) -> None:
    """Check the rows a resumed run keeps against the previous ``config.json`` (``settings``).

    Every row must belong to that run's grid (its data set, methods, epsilons, seeds; the
    baselines at epsilon ``inf``), appear once per (method, epsilon, seed, attack), hold
    values in the ranges its columns declare (:func:`~alm_opacus.report.results.out_of_range`),
    keep the cross-column rules (:func:`~alm_opacus.run.row_rules.row_rule_problem`: guarantee
    vs sensitivity source, ``epsilon_spent`` and ``noise_scale`` vs epsilon), and its utility
    loss must be ``1 - accuracy / reference`` for its seed's unprotected baseline.

    Raises:
        ValueError: naming ``path``, the line, the column or rule, the value and what was
            expected.
    """
    methods = _str_list(settings, "methods", path)
    seeds = settings.get("seeds")
    if not isinstance(seeds, list) or not all(type(s) is int for s in seeds):
        raise ValueError(
            f"--resume: {path.parent / 'config.json'}: 'seeds' is {seeds!r}: "
            "expected a list of integers; use --overwrite"
        )
    grid = {cell_key("", e, 0)[1] for e in _float_list(settings, "epsilons", path)}
    draws = settings.get("noise_draws", 1)
    seen: dict[tuple[str, str, int, str], int] = {}
    baselines: dict[int, list[float]] = {}
    for line, row in enumerate(rows, start=2):
        where = f"--resume: {path}: line {line}"

        def bad(column: str, value: object, expected: str, where: str = where) -> ValueError:
            return ValueError(
                f"{where}: {column}={value!r} is invalid: expected {expected}; "
                "use --overwrite to start again"
            )

        if row.dataset != settings.get("dataset"):
            raise bad("dataset", row.dataset, f"{settings.get('dataset')!r} (config.json)")
        if row.method not in methods:
            raise bad("method", row.method, f"one of config.json's methods {methods}")
        kind = method_class(row.method)
        baseline = kind.baseline
        label = cell_key(row.method, row.epsilon, row.seed)[1]
        if (baseline or kind.reference) and not math.isinf(row.epsilon):
            what = "baseline" if baseline else "reference"
            raise bad("epsilon", row.epsilon, f"inf for the {what} {row.method!r}")
        if not (baseline or kind.reference) and label not in grid:
            raise bad("epsilon", row.epsilon, "one of config.json's epsilons")
        if row.seed not in seeds:
            raise bad("seed", row.seed, f"one of config.json's seeds {seeds}")
        key = (row.method, label, row.seed, row.attack)
        if key in seen:
            raise ValueError(
                f"{where}: repeats the row of line {seen[key]} (method "
                f"{row.method!r}, epsilon {label}, seed {row.seed}, attack "
                f"{row.attack!r}); use --overwrite to start again"
            )
        seen[key] = line
        wrong = out_of_range(row)
        if wrong is not None:
            raise bad(*wrong)
        if row.noise_draws > max(1, int(draws)):
            raise bad("noise_draws", row.noise_draws, f"an integer in [0, {draws}]")
        problem = row_rule_problem(row)
        if problem is not None:
            raise ValueError(f"{where}: {problem}; use --overwrite to start again")
        measured = row.status == "ok"
        if baseline and measured:
            baselines.setdefault(row.seed, []).append(row.test_accuracy)
    for line, row in enumerate(rows, start=2):
        refs = baselines.get(row.seed, [])
        if row.status != "ok" or not refs:
            continue
        expected = [1 - row.test_accuracy / r for r in refs if r > 0]
        if not any(abs(row.utility_loss - e) <= _UTILITY_TOLERANCE for e in expected):
            raise ValueError(
                f"--resume: {path}: line {line}: utility_loss={row.utility_loss!r} is not "
                f"1 - test_accuracy / the baseline's accuracy for seed {row.seed} "
                f"({', '.join(f'{e:.6g}' for e in expected) or 'no baseline above 0'}); "
                "use --overwrite to start again"
            )


def check_rocs(
    path: Path, *, settings: dict[str, Any], cells: Collection[tuple[str, str, int]]
) -> None:
    """Check a resumed run's ``rocs.jsonl`` (:mod:`alm_opacus.report.rocs`): every complete
    line one cell's curves, with as many FPRs as TPRs, all in [0, 1]; of the lines of the
    ``cells`` of ``results.csv`` (the others, and a torn last line, the resumed run drops),
    one per cell, each of a method and epsilon of ``config.json`` (``settings``).

    Raises:
        ValueError: naming ``path`` and the first bad line.
    """
    try:
        found = read_rocs(path, cells=cells)
    except ValueError as exc:
        raise ValueError(f"--resume: {exc}; use --overwrite") from exc
    methods = _str_list(settings, "methods", path)
    grid = {cell_key("", e, 0)[1] for e in _float_list(settings, "epsilons", path)} | {"inf"}
    for line in found.lines:
        method, label, seed = line.cell()
        if method not in methods or label not in grid:
            raise ValueError(
                f"--resume: {path}: the curves of ({method!r}, epsilon {label}, seed {seed}) "
                "are not of a cell of config.json's grid; use --overwrite"
            )


# -- what the folder and the data were ---------------------------------------------------


def check_manifest(out: Path) -> None:
    """Check a resumed run folder against its ``manifest.json``: every file the run wrote
    must be there with the recorded size and SHA-256 (a file a killed run was rewriting is
    accepted as it is: :mod:`alm_opacus.run.manifest`); the run's own top-level files must
    all be recorded, except one the manifest names as being written (a killed run's first
    write of it).

    Raises:
        ValueError: one line naming the file that does not match, or the missing manifest.
    """
    hint = "use --overwrite to start again"
    manifest = read_manifest(out, prefix="--resume: ", hint=hint)
    verify_manifest(out, manifest, prefix="--resume: ", hint=hint, tolerate_writing=True)
    for name in ("config.json", "results.csv", ROCS_FILE, LEGACY_ROCS_FILE, DRAWS_FILE):
        new = name not in manifest.files and name not in manifest.writing
        if os.path.lexists(out / name) and new:
            raise ValueError(
                f"--resume: {out / name} is not in {out / MANIFEST_FILE}: the run "
                f"did not write it; {hint}"
            )


def check_data(previous: dict[str, Any], current: dict[str, Any], *, out: Path) -> None:
    """Refuse a resume whose data changed under the same name: ``config.json``'s
    ``data_digest`` (``writer.data_digest``) must equal this run's.

    Raises:
        ValueError: naming the data (its path for ``features:PATH``) and both digests.
    """
    saved, now = previous.get("data_digest"), current.get("data_digest")
    if saved == now:
        return
    name = str(current.get("dataset", ""))
    family, sep, argument = name.partition(":")
    what = argument if sep and family == "features" else name
    raise ValueError(
        f"--resume: the data {what} changed since the run began: SHA-256 {now} now, {saved} "
        f"in {out / 'config.json'}; the finished cells were computed on other data: use "
        "--overwrite or another --out"
    )


def _str_list(settings: dict[str, Any], key: str, path: Path) -> list[str]:
    value = settings.get(key)
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ValueError(
            f"--resume: {path.parent / 'config.json'}: {key!r} is {value!r}: "
            "expected a list of names; use --overwrite"
        )
    return value


def _float_list(settings: dict[str, Any], key: str, path: Path) -> list[float]:
    value = settings.get(key)
    ok = isinstance(value, list) and all(
        isinstance(v, int | float) and not isinstance(v, bool) and 0 < v < math.inf for v in value
    )
    if not ok:
        raise ValueError(
            f"--resume: {path.parent / 'config.json'}: {key!r} is {value!r}: "
            "expected a list of positive numbers; use --overwrite"
        )
    return [float(v) for v in value]  # type: ignore[union-attr]
