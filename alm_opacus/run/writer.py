"""Everything a run writes after each cell: results, ROC curves, config, TensorBoard, plots.

A cell's ROC curves are appended to ``rocs.jsonl`` (:mod:`alm_opacus.report.rocs`), flushed
and fsynced, before ``results.csv`` is rewritten with its rows: a cell of ``results.csv``
always has its curves, and the curves file is never rewritten whole while cells finish.
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from alm_opacus.io import atomic_write_json, atomic_write_text
from alm_opacus.report.draws import DRAWS_FILE, DrawRecord, read_draws, write_draws
from alm_opacus.report.html import REPORT_FILE, RunFacts, write_report
from alm_opacus.report.results import (
    BASELINE,
    ResultRow,
    cell_key,
    read_results,
    write_results,
)
from alm_opacus.report.risk import RISK_FOLDER, CellScores, load_risk, write_risk
from alm_opacus.report.rocs import (
    LEGACY_ROCS_FILE,
    ROCS_FILE,
    RocLine,
    append_rocs,
    legacy_refusal,
    read_rocs,
    roc_map,
)
from alm_opacus.report.tensorboard import write_tensorboard
from alm_opacus.run.cells import CellOutcome, RocMap
from alm_opacus.run.layout import SPLIT_FILE
from alm_opacus.run.manifest import (
    MANIFEST_FILE,
    Manifest,
    folder_files,
    read_manifest,
    recorded,
    write_manifest,
)
from alm_opacus.run.plan import RunPlan

if TYPE_CHECKING:
    from alm_opacus.report.risk_plots import ImageSource

__all__ = ["RunWriter"]

#: What a cell may rewrite (named in the manifest before the writes: :mod:`.manifest`).
_CELL_FILES = ("results.csv", ROCS_FILE, DRAWS_FILE, "config.json", str(RISK_FOLDER), "tb")
#: What :meth:`RunWriter.finish` may rewrite.
_FINAL_FILES = ("config.json", "plots", str(RISK_FOLDER), "tb", REPORT_FILE)

#: Seconds between live rewrites of ``tb/`` while cells finish; results.csv and config.json
#: are rewritten after every cell (rocs.jsonl appended to), and tb/ at the end and on an
#: interruption.
TENSORBOARD_REFRESH_S = 20.0


class RunWriter:
    """Holds the run's rows and rewrites its files atomically after every cell.

    On resume it starts from the previous run's rows, ROC curves and chosen configurations,
    and ``config.json``'s grid becomes the union of the previous grid and this one. Lines of
    ``rocs.jsonl`` a killed run left without their rows (a torn last line, a cell missing
    from ``results.csv``) are dropped: the file is rewritten without them once, atomically,
    at the first write.

    Nothing is written before the first :meth:`add` (or :meth:`finish`), which first calls
    ``before_write`` (the run folder's ``commit``): a start that fails earlier leaves the
    folder as it was.

    Every file it writes is recorded in ``manifest.json`` (:mod:`alm_opacus.run.manifest`)
    with its digest, right after it is written; the manifest marks the run complete once
    :meth:`finish` wrote the report.
    """

    def __init__(
        self,
        out: Path,
        *,
        settings: dict[str, Any],
        resume: bool,
        facts: RunFacts | None = None,
        hparams: dict[str, object] | None = None,
        references: tuple[str, ...] = (),
        images: ImageSource | None = None,
        before_write: Callable[[], None] | None = None,
    ) -> None:
        """
        Args:
            out: the run folder.
            settings: what ``config.json`` records (:attr:`RunPlan.settings`).
            resume: start from the folder's previous rows.
            facts: what the views need besides the rows (default: read from ``settings``).
            hparams: TensorBoard's run-wide hyperparameters.
            references: the reference releases (no per-example risk file of their own).
            images: ``rows -> images`` for image data (the most exposed members' figure).
            before_write: called once, before the first write.
        """
        self.out = out
        self.before_write = before_write
        self.wrote = False
        self.hparams = dict(hparams or {})
        self.references = frozenset(references)
        self.rows: list[ResultRow] = []
        self._rocs: RocMap = {}
        #: the kept lines of rocs.jsonl, when a resume dropped some (rewritten at the first write)
        self._rocs_kept: bytes | None = None
        self.chosen: list[dict[str, Any]] = []
        self.draws: list[DrawRecord] = []
        self._scores: dict[tuple[str, str, int], CellScores] = {}
        self.settings = dict(settings)
        self.facts = RunFacts.from_settings(self.settings) if facts is None else facts
        self.manifest = Manifest()
        self._previous_curves = False  # rocs.jsonl and the risk files still to be read
        if resume:
            if (self.out / LEGACY_ROCS_FILE).exists():
                raise ValueError(f"--resume: {legacy_refusal(self.out)}")
            self._load_previous()
        self.done = {row.cell() for row in self.rows}
        self.images = images
        self._board_written = -math.inf

    @classmethod
    def for_plan(
        cls,
        plan: RunPlan,
        *,
        images: ImageSource | None = None,
        before_write: Callable[[], None] | None = None,
    ) -> RunWriter:
        """The writer of ``plan``'s folder, its facts taken from the plan."""
        return cls(
            plan.out,
            settings=plan.settings,
            resume=plan.config.resume,
            facts=plan.facts,
            hparams=plan.hparams,
            references=plan.references,
            images=images,
            before_write=before_write,
        )

    def _load_previous(self) -> None:
        if (self.out / MANIFEST_FILE).exists():  # verified by the run folder's check
            previous = read_manifest(self.out, prefix="--resume: ", hint="use --overwrite")
            self.manifest = dataclasses.replace(previous, complete=False)
        path = self.out / "results.csv"
        if path.exists():
            try:
                self.rows = read_results(path)
            except (OSError, ValueError) as exc:
                raise ValueError(f"--resume: {exc}; use --overwrite to start again") from exc
        if (self.out / DRAWS_FILE).exists():
            self.draws = read_draws(self.out / DRAWS_FILE)
        # The curves and the per-member scores are read when first needed (a cell to add, or
        # figures to draw): a resume of a finished run needs neither, and the manifest's
        # digests have already vouched for both files.
        self._previous_curves = True
        config = self.out / "config.json"
        previous = json.loads(config.read_text()) if config.exists() else {}
        self.chosen = list(previous.get("chosen_configs", []))
        ran = list(self.settings["methods"])
        for key in ("methods", "epsilons", "seeds"):
            merged = list(dict.fromkeys([*previous.get(key, []), *self.settings[key]]))
            self.settings[key] = merged
        # methods whose rows an earlier run left and this one did not run: the report lists
        # them apart from this run's methods
        kept = [m for m in self.settings["methods"] if m not in ran]
        if kept:
            self.settings["methods_kept"] = kept
        else:
            self.settings.pop("methods_kept", None)

    @property
    def rocs(self) -> RocMap:
        """Every cell's ROC curves, the resumed ones included."""
        self._load_curves()
        return self._rocs

    @property
    def scores(self) -> dict[tuple[str, str, int], CellScores]:
        """Per-example scores by cell key (private: written under ``risk.RISK_FOLDER``)."""
        self._load_curves()
        return self._scores

    def _load_curves(self) -> None:
        """Once, on a resume: the previous run's curves (the lines of ``rocs.jsonl`` whose
        cells ``results.csv`` holds; the others are dropped from the file at the first
        write) and its per-member scores."""
        if not self._previous_curves:
            return
        self._previous_curves = False
        self._load_rocs()
        cells = {(r.method, r.epsilon) for r in self.rows if r.status == "ok"}
        try:
            for table in load_risk(self.out, cells).values():
                for seed in table.seeds:
                    cell = table.cell(seed)
                    self._scores[cell_key(cell.method, cell.epsilon, seed)] = cell
        except ValueError as exc:
            raise ValueError(f"--resume: {exc}; use --overwrite to start again") from exc

    def _load_rocs(self) -> None:
        path = self.out / ROCS_FILE
        try:
            found = read_rocs(path, cells={row.cell() for row in self.rows})
        except ValueError as exc:
            raise ValueError(f"--resume: {exc}; use --overwrite to start again") from exc
        self._rocs = roc_map(found.lines)
        if found.dropped:
            self._rocs_kept = found.kept

    def add(self, outcome: CellOutcome) -> None:
        """Record one finished cell: append its ROC curves to ``rocs.jsonl`` (fsynced), then
        rewrite results, config, the releases' records, the cell's risk file and
        TensorBoard."""
        self._load_curves()  # first: it finds the stale lines `_start_writing` drops
        self._start_writing()
        self._writing(_CELL_FILES)
        written = [self.out / "results.csv"]
        line = _roc_line(outcome)
        if line is not None:
            # before results.csv: a cell of results.csv always has its curves
            append_rocs(self.out / ROCS_FILE, line)
            written.append(self.out / ROCS_FILE)
        self.rows.extend(outcome.rows)
        self.rocs.update(outcome.rocs)
        if outcome.chosen is not None:
            self.chosen.append(outcome.chosen)
        self.draws.extend(outcome.draws)
        write_results(written[0], self.rows)
        if self.draws:
            write_draws(self.out / DRAWS_FILE, self.draws)
            written.append(self.out / DRAWS_FILE)
        if outcome.scores is not None and outcome.scores.method not in self.references:
            cell = outcome.scores
            self.scores[cell_key(cell.method, cell.epsilon, cell.seed)] = cell
            # a baseline changes every file's unprotected column
            written += self._write_risk(
                None if cell.method == BASELINE else (cell.method, cell.epsilon)
            )
        self._write_config()
        board = time.monotonic() - self._board_written > TENSORBOARD_REFRESH_S
        self._record([*written, self.out / "config.json"], done=not board)
        if board:
            self._write_tensorboard(images=False, done=True)

    def interrupted(self) -> None:
        """Bring ``tb/`` up to the finished cells (results.csv already is), after a Ctrl-C
        (nothing, if this run wrote nothing yet)."""
        if self.wrote:
            self._writing(("tb",))
            self._write_tensorboard(images=False, done=True)

    def finish(self, *, force: bool) -> None:
        """Render the plots, the risk figures, TensorBoard and ``report.html`` once; a resume
        that computed nothing and finds them skips the work."""
        self._start_writing()
        self._writing(_FINAL_FILES)
        self._write_config()
        self._record([self.out / "config.json"])
        # plots/ is replaced whole (`replace_folder`): if it is there, it is complete
        done = [self.out / "plots", self.out / REPORT_FILE]
        if force or not all(p.exists() for p in done):
            # Here, not at the top: matplotlib's import (0.3-0.6 s) is needed only to draw,
            # which a resume of a finished run never does.
            from alm_opacus.report.plots import write_plots
            from alm_opacus.report.risk_plots import RISK_PLOTS, one_seed, write_risk_plots

            facts = self.facts
            plots = write_plots(
                self.rows,
                self.rocs,
                self.out / "plots",
                members=facts.members,
                nonmembers=facts.nonmembers,
                num_classes=facts.num_classes,
            )
            self._record(plots, replace_under="plots")
            self._record(self._write_risk(None))
            risk = one_seed(self.scores_by_cell())
            risk_plots = write_risk_plots(self.out, risk, images=self.images) if risk else []
            self._record(risk_plots, replace_under=RISK_PLOTS.as_posix())
            self._write_tensorboard(images=True, done=False)
            settings = {**self.settings, "chosen_configs": self.chosen}
            report = write_report(
                self.out,
                rows=self.rows,
                settings=settings,
                facts=self.facts,
                risk=risk,
                risk_plots=risk_plots,
            )
            self._record([report])
        self.manifest = dataclasses.replace(self.manifest, complete=True, writing=())
        write_manifest(self.out, self.manifest)

    def scores_by_cell(self) -> dict[tuple[str, float, int], CellScores]:
        return {(c.method, c.epsilon, c.seed): c for c in self.scores.values()}

    def _write_risk(self, only: tuple[str, float] | None) -> list[Path]:
        """Rewrite the risk file of ``only`` (method, epsilon), or of every cell; return the
        paths written."""
        groups: dict[tuple[str, float], list[CellScores]] = {}
        for cell in self.scores.values():
            groups.setdefault((cell.method, cell.epsilon), []).append(cell)
        baseline = {c.seed: c for c in self.scores.values() if c.method == BASELINE}
        return [
            write_risk(self.out, cells, baseline)
            for key, cells in groups.items()
            if only is None or key == only
        ]

    def _start_writing(self) -> None:
        if not self.wrote:
            if self.before_write is not None:
                self.before_write()
            # the split is saved before the first result (``harness.run``)
            split = self.out / SPLIT_FILE
            self.manifest = dataclasses.replace(self.manifest, complete=False)
            if split.is_file():
                self._record([split])
            if self._rocs_kept is not None:
                # the lines a killed run left without their rows go, once, before any append
                self._writing((ROCS_FILE,))
                atomic_write_text(self.out / ROCS_FILE, self._rocs_kept.decode())
                self._record([self.out / ROCS_FILE], done=True)
                self._rocs_kept = None
        self.wrote = True

    def _writing(self, names: tuple[str, ...]) -> None:
        """Name in the manifest what is about to be rewritten (a run killed before the
        manifest's next update left them so: :mod:`alm_opacus.run.manifest`)."""
        self.manifest = dataclasses.replace(self.manifest, writing=names, complete=False)
        write_manifest(self.out, self.manifest)

    def _record(
        self, paths: list[Path], *, replace_under: str | None = None, done: bool = False
    ) -> None:
        """Record the digests of the files just written, and rewrite the manifest (``done``:
        the batch :meth:`_writing` named is written)."""
        self.manifest = recorded(
            self.manifest, run=self.out, paths=paths, replace_under=replace_under
        )
        if done:
            self.manifest = dataclasses.replace(self.manifest, writing=())
        write_manifest(self.out, self.manifest)

    def _write_config(self) -> None:
        atomic_write_json(
            self.out / "config.json", {**self.settings, "chosen_configs": self.chosen}
        )

    def _write_tensorboard(self, *, images: bool, done: bool) -> None:
        """Rewrite ``tb/`` from all rows (built aside, then swapped in): it always holds
        exactly this run's rows, resumed ones included."""
        write_tensorboard(
            self.rows,
            self.out / "tb",
            epsilons=self.settings["epsilons"],
            hparams=self.hparams,
            draws=self.draws,
            members=self.facts.members,
            images=self.out / "plots" if images else None,
        )
        self._board_written = time.monotonic()
        # tb/ is rebuilt whole: it holds exactly what the run wrote now
        self._record(folder_files(self.out / "tb"), replace_under="tb", done=done)


def _roc_line(outcome: CellOutcome) -> RocLine | None:
    """The ``rocs.jsonl`` line of ``outcome`` (``None`` for a cell without curves)."""
    if not outcome.rocs:
        return None
    cells = {(m, e) for (m, e, _) in outcome.rocs}
    seeds = {row.seed for row in outcome.rows}
    if len(cells) != 1 or len(seeds) != 1:
        raise ValueError(
            f"a cell's outcome holds the curves of {sorted(cells)} and rows of seeds "
            f"{sorted(seeds)}: expected one method, epsilon and seed"
        )
    (method, epsilon), seed = cells.pop(), seeds.pop()
    curves = {a: (list(f), list(t)) for (_, _, a), (f, t) in outcome.rocs.items()}
    return RocLine(method=method, epsilon=epsilon, seed=seed, curves=curves)
