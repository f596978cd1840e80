"""Run a comparison: splits, encoder, each method x epsilon x seed, attacks, results.

The private split never touches the encoder: pre-training sees only the public split (or
the dataset's unlabeled set), each method sees the members, each attack sees what its
threat model allows.

A run is resolved once into a :class:`~alm_opacus.run.plan.RunPlan` (:func:`plan_run`: the
data, the split, method objects, attack classes, the cells and the checks), then computed by
small pure units:
:func:`prepare_unit` does a method's per-seed work once (shared by methods with one
preparation key), :func:`plain_attacks_unit` the plain attacker's per seed, and
:func:`cell_unit` turns one cell into rows. :func:`run` (the driver) submits them to an
executor (:mod:`alm_opacus.run.executors`: in this process, or on Ray), fills the utility
losses from each seed's baseline, and alone writes the run folder:
:class:`~alm_opacus.run.writer.RunWriter` writes results, ROC curves, ``config.json``,
TensorBoard and plots after every cell.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import time
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm.auto import tqdm

from alm_opacus.data import Dataset
from alm_opacus.data.features import release_pages
from alm_opacus.data.split import Split
from alm_opacus.methods import PLUGIN_GROUP, load_plugins
from alm_opacus.report.results import ResultRow
from alm_opacus.run.cells import Cell, CellOutcome
from alm_opacus.run.config import RunConfig
from alm_opacus.run.estimate import forecast
from alm_opacus.run.evaluation import Evaluation, torch_threads, with_reference
from alm_opacus.run.executors import Executor, create_executor
from alm_opacus.run.plan import RunPlan, plan_run
from alm_opacus.run.rundir import SPLIT_FILE, RunFolder
from alm_opacus.run.units import (
    Infeasible,
    RunData,
    RunInputs,
    Session,
    cell_unit,
    plain_attacks_unit,
    prepare_unit,
    run_cell,
)
from alm_opacus.run.writer import RunWriter
from alm_opacus.ssl.pretrain import array_digest, config_hash, extract_features, pretrain

__all__ = [
    "PLUGIN_GROUP",
    "Cell",
    "CellOutcome",
    "Evaluation",
    "Infeasible",
    "RunConfig",
    "RunData",
    "RunInputs",
    "RunPlan",
    "RunResult",
    "Session",
    "cell_calls",
    "cell_unit",
    "load_plugins",
    "plain_attacks_unit",
    "plan_run",
    "prepare",
    "prepare_unit",
    "run",
    "run_cell",
    "spread_by_method",
]


def prepare(plan: RunPlan) -> RunData:
    """Pre-train on the public part and extract features (a dataset of features,
    ``features:PATH``, brings its own: nothing is pre-trained)."""
    config, dataset, split = plan.config, plan.dataset, plan.split
    if dataset.images is None:
        return given_features(plan)
    public_images = _public_images(dataset, split)
    key = encoder_key(config, dataset, split)
    encoder = pretrain(
        public_images,
        config=config.ssl_config,
        key=key,
        cache_dir=config.encoder_cache_path,
        device=config.device,
        seed=config.split_seed,
        progress=config.progress,
    )
    features = extract_features(
        encoder,
        dataset.images,
        key=key,
        cache_dir=config.cache_path,
        device=config.device,
        progress=config.progress,
    )
    return RunData(
        split=split,
        features=features,
        labels=torch.from_numpy(np.asarray(dataset.labels, dtype=np.int64)),
        num_classes=dataset.num_classes,
        delta=plan.delta,
        images=dataset.images,
        encoder=encoder,
    )


def _public_images(dataset: Dataset, split: Split) -> np.ndarray:
    """What the encoder pre-trains on: the unlabeled set where the dataset has one, else
    the public split's images."""
    assert dataset.images is not None
    return dataset.unlabeled if dataset.unlabeled is not None else dataset.images[split.public]


def encoder_key(config: RunConfig, dataset: Dataset, split: Split) -> str:
    """The encoder's cache key: its recipe, the public rows and the data's bytes."""
    source = "unlabeled" if dataset.unlabeled is not None else array_digest(split.public)
    return config_hash(
        {
            "dataset": dataset.name,
            "public": source,
            "n": len(_public_images(dataset, split)),
            "ssl": config.ssl_config.to_dict(),
            "seed": config.split_seed,
            "version": 1,
            "data": _data_digest(dataset),
        }
    )


def describe_plan(plan: RunPlan, cells: Sequence[Cell]) -> str:
    """The first line a run prints: what will run, where it writes, and a forecast of the
    time it takes (:mod:`alm_opacus.run.estimate`)."""
    config, dataset, split = plan.config, plan.dataset, plan.split
    members = len(split.members)
    methods = [
        m + (" (reference)" if m in plan.references else "")
        for m in dict.fromkeys(c.method for c in cells)
    ]
    epsilons = sorted({c.epsilon for c in cells if not math.isinf(c.epsilon)})
    seeds = sorted({c.seed for c in cells})
    pretrain_note = ""
    public, epochs, cached = 0, 0, True
    if dataset.images is not None:
        key = encoder_key(config, dataset, split)
        cached = (config.encoder_cache_path / f"encoder-{key}.pt").exists()
        public, epochs = len(_public_images(dataset, split)), config.ssl_config.epochs
        pretrain_note = (
            "the SimCLR encoder is cached"
            if cached
            else f"pre-trains the SimCLR encoder first ({epochs} epochs on {public} public images; "
            f"cached in {config.encoder_cache_path} for later runs)"
        )
    guess = forecast(
        cells=[(c.method, c.draws) for c in cells],
        members=members,
        public_images=public,
        epochs=epochs,
        encoder_cached=cached,
    )
    grid = f"ε {', '.join(f'{e:g}' for e in epsilons)}" if epsilons else "no ε grid"
    parts = [
        f"alm-opacus: {config.dataset}, {members} members; {', '.join(methods) or 'nothing'} "
        f"at {grid}, seed{'s' if len(seeds) > 1 else ''} {', '.join(map(str, seeds))}: "
        f"{len(cells)} cells into {config.out}",
        pretrain_note,
        f"expected {guess.text()} (a forecast for 2 cores; the progress bar refines it)",
    ]
    return "; ".join(p for p in parts if p) + "."


def _data_digest(dataset: Dataset) -> str:
    """The bytes of the images (and unlabeled images) the encoder and features come from:
    the cache key pins the data, not only its name and split."""
    parts = [dataset.images, dataset.unlabeled]
    return "/".join(array_digest(part) for part in parts if part is not None)


def given_features(plan: RunPlan) -> RunData:
    """The run's data from a dataset of features (the user's encoder ran already): the rows
    are used as the dataset holds them (memory-mapped for ``features:PATH``), not copied."""
    dataset = plan.dataset
    assert dataset.features is not None
    return RunData(
        split=plan.split,
        features=torch.from_numpy(dataset.features),
        labels=torch.from_numpy(np.asarray(dataset.labels, dtype=np.int64)),
        num_classes=dataset.num_classes,
        delta=plan.delta,
    )


def spread_by_method(cells: Sequence[Cell]) -> list[Cell]:
    """``cells`` reordered for executors that run cells side by side: the first cell of every
    (method, seed) before the second of any, and so on, plan order within each round.

    A method's first cell pays for the work its other cells share through the run's memo
    (``lu``'s shadow networks, DP-SGD's noise multipliers), so starting it early spreads that
    work over the run instead of leaving it for last: in plan order, ``lu``'s cells started
    after every other cell and its shadow networks were the run's tail (scripts/bench_ray.py).
    Seeds come from the cells, so the table does not depend on the order.
    """
    rank: dict[tuple[str, int], int] = {}
    order = []
    for index, cell in enumerate(cells):
        group = (cell.method, cell.seed)
        order.append((rank.get(group, 0), index))
        rank[group] = rank.get(group, 0) + 1
    return [cells[index] for _, index in sorted(order)]


def cell_calls(engine: Executor, shared: RunInputs, cells: Sequence[Cell]) -> list[tuple[Any, ...]]:
    """The arguments of :func:`cell_unit` for each of ``cells``, after submitting what they
    need: ``shared`` put once, one prepare unit per (preparation key, seed), one
    plain-attacks unit per seed (when the run attacks). Their handles are the cells'
    arguments, so a cell starts as soon as its inputs exist.
    """
    ref = engine.put(shared)
    prepared: dict[tuple[Hashable, int], Any] = {}
    plain: dict[int, Any] = {}
    calls = []
    for cell in cells:
        key = (shared.method(cell.method).preparation_key(), cell.seed)
        if key not in prepared:
            prepared[key] = engine.submit(prepare_unit, ref, cell.method, cell.seed)
        if shared.evaluation.attacks and cell.seed not in plain:
            plain[cell.seed] = engine.submit(plain_attacks_unit, ref, cell.seed)
        calls.append((ref, cell, prepared[key], plain.get(cell.seed)))
    return calls


@dataclass
class RunResult:
    rows: list[ResultRow]
    out: Path
    seconds: float
    num_classes: int | None = None


def image_source(images: np.ndarray | None) -> Callable[[np.ndarray], np.ndarray] | None:
    """``rows -> images`` for data whose rows are pictures ((N, H, W) or (N, H, W, C)), for
    the figure of the most exposed members; ``None`` for feature vectors."""
    if images is None or np.ndim(images) < 3:
        return None
    return lambda rows: np.asarray(images[np.asarray(rows, dtype=np.int64)])


def run(
    config: RunConfig | RunPlan,
    *,
    on_cell: Callable[[Cell], None] | None = None,
    on_start: Callable[[Path], None] | None = None,
    on_plan: Callable[[str], None] | None = None,
    executor: Executor | str = "in-process",
    executor_options: Mapping[str, Any] | None = None,
) -> RunResult:
    """Run the whole comparison into ``config.out``: ``config.json``, ``split.json``,
    ``results.csv``, ``rocs.jsonl`` (appended per cell), TensorBoard events and plots, each
    written atomically by this process (the driver) after every cell.

    Args:
        config: the run, or its plan (:func:`~alm_opacus.run.plan.plan_run`; a config is
            planned first).
        on_cell: called with each cell before its outcome is recorded (in-process: before
            it is computed; tests use it to interrupt a run).
        on_start: called with the run folder once it is validated, locked, and about to
            hold this run's first result.
        on_plan: called once, before any work, with one line saying what will run, where it
            writes and the forecast time (:func:`describe_plan`).
        executor: where the units run: an :class:`~alm_opacus.run.executors.Executor` (the
            caller's: left open), or a name (``in-process``, ``ray``) to create one for this
            run, after the checks, and close it at the end.
        executor_options: options of a named executor (``ray``: ``address``).

    Raises:
        ValueError: for an invalid configuration, an unusable ``out`` or cache, a run folder
            that holds another run (without resume/overwrite), a resume whose config
            differs, or ``ray`` without Ray installed. DataError: for a missing or corrupt
            dataset. ExecutorError: when a unit cannot be computed on the cluster.
    """
    start = time.perf_counter()
    # every name resolved and every check made before anything is written
    plan = config if isinstance(config, RunPlan) else plan_run(config)
    config, out = plan.config, plan.out
    folder = RunFolder(
        out, resume=config.resume, overwrite=config.overwrite, cache=config.cache_path
    )
    folder.check(plan.settings)

    def commit() -> None:  # before the first result: the folder now holds this run
        folder.commit()
        if on_start is not None:
            on_start(out)

    with folder, contextlib.ExitStack() as stack:
        writer = RunWriter.for_plan(
            plan, images=image_source(plan.dataset.images), before_write=commit
        )
        cells = [c for c in plan.cells if c.key not in writer.done]
        if on_plan is not None:
            on_plan(describe_plan(plan, cells))
        data = prepare(plan)
        plan.split.save(out / SPLIT_FILE)
        engine = (
            executor
            if isinstance(executor, Executor)
            else stack.enter_context(create_executor(executor, **dict(executor_options or {})))
        )
        shared = RunInputs.build(
            plan,
            data,
            memo=engine.memo(),
            map_units=engine.unit_map(),
            progress=config.progress and engine.in_driver,
        )
        release_pages(plan.dataset.features)  # the units read the parts copied out of it
        # a resumed run measures utility against its finished baseline
        references = {
            row.seed: row.test_accuracy for row in writer.rows if row.method in plan.baselines
        }
        # one thread for the small ops of a small run, every thread for a large one's products
        stack.enter_context(torch_threads(shared.evaluation.threads))
        if not engine.in_driver:  # cells run side by side: start every method's shared work
            cells = spread_by_method(cells)
        bar = tqdm(
            total=len(cells), desc="cells", unit="cell", disable=not config.progress or not cells
        )
        stack.callback(bar.close)

        def before(index: int) -> None:
            cell = cells[index]
            bar.set_postfix_str(f"{cell.method} eps={cell.epsilon:g} seed={cell.seed}")
            if on_cell is not None:
                on_cell(cell)

        waiting: dict[int, list[CellOutcome]] = {}  # finished before their seed's baseline
        try:
            calls = cell_calls(engine, shared, cells)
            for index, outcome in engine.as_completed(cell_unit, calls, before=before):
                seed = cells[index].seed
                if outcome.baseline_accuracy is not None:
                    references[seed] = outcome.baseline_accuracy
                waiting.setdefault(seed, []).append(outcome)
                if seed in references:
                    for done in waiting.pop(seed):
                        writer.add(_measured(done, references[seed]))
                bar.update()
        except KeyboardInterrupt:
            writer.interrupted()
            raise
        for outcomes in waiting.values():  # a seed whose baseline has no accuracy
            for done in outcomes:
                writer.add(done)
        writer.finish(force=bool(cells))
    return RunResult(
        rows=writer.rows,
        out=out,
        seconds=time.perf_counter() - start,
        num_classes=plan.dataset.num_classes,
    )


def _measured(outcome: CellOutcome, reference: float) -> CellOutcome:
    """The outcome with its utility losses measured against its seed's baseline."""
    return dataclasses.replace(outcome, rows=with_reference(outcome.rows, reference))
