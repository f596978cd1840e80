"""Everything a run writes after each cell: results, ROC curves, config, TensorBoard, plots."""

from __future__ import annotations

import contextlib
import importlib.metadata
import json
import math
import platform
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

import alm_opacus
from alm_opacus.io import atomic_write_json, atomic_write_text
from alm_opacus.methods import method_class, method_options
from alm_opacus.posthoc import PostTrainingOptions
from alm_opacus.report.plots import write_plots
from alm_opacus.report.results import ResultRow, read_results, write_results
from alm_opacus.report.tensorboard import write_tensorboard
from alm_opacus.run.cells import CellOutcome, RocMap
from alm_opacus.run.config import RunConfig

__all__ = ["RunWriter", "run_settings", "tensorboard_hparams"]

#: Seconds between live rewrites of ``tb/`` while cells finish; results.csv, rocs.json and
#: config.json are rewritten after every cell, and tb/ at the end and on an interruption.
TENSORBOARD_REFRESH_S = 20.0


def run_settings(config: RunConfig) -> dict[str, Any]:
    """What ``config.json`` records besides the chosen configurations."""
    methods = ["none", *[m for m in config.methods if m != "none"]]
    return {
        **config.to_dict(),
        "methods": methods,
        "environment": _environment(),
        "tuning_grids": {m: [dict(c) for c in method_class(m).tuning_grid] for m in methods},
        "method_options": {m: method_options(m, config.options).to_dict() for m in methods},
    }


def _environment() -> dict[str, str]:
    versions = {"alm_opacus": alm_opacus.__version__, "torch": torch.__version__,
                "python": platform.python_version()}  # fmt: skip
    for name in ("opacus", "dp-accounting"):
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            versions[name] = importlib.metadata.version(name)
    return versions


class RunWriter:
    """Holds the run's rows and rewrites its files atomically after every cell.

    On resume it starts from the previous run's rows, ROC curves and chosen configurations,
    and ``config.json``'s grid becomes the union of the previous grid and this one.

    Nothing is written before the first :meth:`add` (or :meth:`finish`), which first calls
    ``before_write`` (the run folder's ``commit``): a start that fails earlier leaves the
    folder as it was.
    """

    def __init__(
        self, out: Path, *, settings: dict[str, Any], resume: bool,
        hparams: dict[str, object] | None = None,
        before_write: Callable[[], None] | None = None,
    ) -> None:  # fmt: skip
        self.out = out
        self.before_write = before_write
        self.wrote = False
        self.hparams = dict(hparams or {})
        self.rows: list[ResultRow] = []
        self.rocs: RocMap = {}
        self.chosen: list[dict[str, Any]] = []
        self.settings = dict(settings)
        if resume:
            self._load_previous()
        self.done = {row.cell() for row in self.rows}
        self._board_written = -math.inf

    def _load_previous(self) -> None:
        path = self.out / "results.csv"
        if path.exists():
            try:
                self.rows = read_results(path)
            except (OSError, ValueError) as exc:
                raise ValueError(f"--resume: {exc}; use --overwrite to start again") from exc
        self.rocs = _load_rocs(self.out / "rocs.json")
        config = self.out / "config.json"
        previous = json.loads(config.read_text()) if config.exists() else {}
        self.chosen = list(previous.get("chosen_configs", []))
        for key in ("methods", "epsilons", "seeds"):
            merged = list(dict.fromkeys([*previous.get(key, []), *self.settings[key]]))
            self.settings[key] = merged

    def add(self, outcome: CellOutcome) -> None:
        """Record one finished cell and rewrite results, ROC curves, config and TensorBoard."""
        self._start_writing()
        self.rows.extend(outcome.rows)
        self.rocs.update(outcome.rocs)
        if outcome.chosen is not None:
            self.chosen.append(outcome.chosen)
        write_results(self.out / "results.csv", self.rows)
        _save_rocs(self.out / "rocs.json", self.rocs)
        self._write_config()
        if time.monotonic() - self._board_written > TENSORBOARD_REFRESH_S:
            self._write_tensorboard(images=False)

    def interrupted(self) -> None:
        """Bring ``tb/`` up to the finished cells (results.csv already is), after a Ctrl-C
        (nothing, if this run wrote nothing yet)."""
        if self.wrote:
            self._write_tensorboard(images=False)

    def finish(self, *, force: bool) -> None:
        """Render the plots once and TensorBoard with them; a resume that computed nothing and
        finds them skips the work."""
        self._start_writing()
        self._write_config()
        if force or not (self.out / "plots" / "fig1_utility_loss.png").exists():
            write_plots(self.rows, self.rocs, self.out / "plots")
            self._write_tensorboard(images=True)

    def _start_writing(self) -> None:
        if not self.wrote and self.before_write is not None:
            self.before_write()
        self.wrote = True

    def _write_config(self) -> None:
        atomic_write_json(self.out / "config.json", {**self.settings,
                                                      "chosen_configs": self.chosen})  # fmt: skip

    def _write_tensorboard(self, *, images: bool) -> None:
        """Rewrite ``tb/`` from all rows (built aside, then swapped in): it always holds
        exactly this run's rows, resumed ones included."""
        write_tensorboard(self.rows, self.out / "tb", epsilons=self.settings["epsilons"],
                          hparams=self.hparams,
                          images=self.out / "plots" if images else None)  # fmt: skip
        self._board_written = time.monotonic()


def tensorboard_hparams(config: RunConfig) -> dict[str, object]:
    """The run-wide hyperparameters TensorBoard's HParams view shows beside each cell."""
    head = config.recipe
    sources = sorted({o.sensitivity for o in (method_options(m, config.options)
                      for m in config.methods) if isinstance(o, PostTrainingOptions)})  # fmt: skip
    return {"dataset": config.dataset, "head": head.kind, "head_solver": head.solver,
            "head_steps": head.steps, "head_l2": head.l2, "noise_draws": config.noise_draws,
            "sensitivity": "/".join(sources) or "-"}  # fmt: skip


def _save_rocs(path: Path, rocs: RocMap) -> None:
    payload = [
        {"method": m, "epsilon": "inf" if math.isinf(e) else e, "attack": a, "fpr": f, "tpr": t}
        for (m, e, a), (f, t) in rocs.items()
    ]
    atomic_write_text(path, json.dumps(payload))


def _load_rocs(path: Path) -> RocMap:
    if not path.exists():
        return {}
    try:
        items = json.loads(path.read_text())
        return {(i["method"], float(i["epsilon"]), i["attack"]): (i["fpr"], i["tpr"])
                for i in items}  # fmt: skip
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"{path}: not a readable rocs.json ({exc}); use --overwrite") from exc
