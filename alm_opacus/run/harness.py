"""Run a comparison: splits, encoder, each method x epsilon x seed, attacks, results.

The private split never touches the encoder: pre-training sees only the public split (or
the dataset's unlabeled set), each method sees the members, each attack sees what its
threat model allows.

A run is small units: :func:`plan_cells` lists the (method, epsilon, seed) cells,
:func:`run_cell` turns one cell into rows, and :class:`~alm_opacus.run.writer.RunWriter` writes
results, ROC curves, ``config.json``, TensorBoard and plots after every cell.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn
from tqdm.auto import tqdm

from alm_opacus._validation import default_delta
from alm_opacus.attacks import AttackConfig, AttackResult, PreparedAttacks
from alm_opacus.data import load_dataset, to_float
from alm_opacus.data.split import Split, make_split
from alm_opacus.errors import InfeasibleRelease
from alm_opacus.heads import accuracy
from alm_opacus.methods import (
    INPUT_KINDS,
    InputKind,
    Method,
    MethodContext,
    NoisePolicy,
    Release,
    create_method,
    method_class,
    method_options,
    plain_shadow_trainer,
)
from alm_opacus.report.draws import draw_records
from alm_opacus.report.results import ResultRow
from alm_opacus.report.risk import cell_scores
from alm_opacus.run.cells import Cell, CellOutcome, RocMap
from alm_opacus.run.config import RunConfig
from alm_opacus.run.evaluation import (
    CLEAN_SUFFIX,
    Evaluation,
    cell_rows,
    infeasible_row,
    torch_threads,
)
from alm_opacus.run.rundir import RunFolder, check_writable_dir
from alm_opacus.run.writer import RunWriter, run_settings, tensorboard_hparams
from alm_opacus.ssl.pretrain import array_digest, config_hash, extract_features, pretrain

__all__ = [
    "PLUGIN_GROUP",
    "Cell",
    "CellOutcome",
    "Prepared",
    "RunConfig",
    "RunResult",
    "Session",
    "load_plugins",
    "plan_cells",
    "preflight",
    "prepare",
    "run",
    "run_cell",
]

PLUGIN_GROUP = "alm_opacus.methods"
#: Pre-training a small CNN is a per-run cost; cells are many small tensor ops that run
#: faster on one thread (see :func:`~alm_opacus.run.evaluation.torch_threads`).
CELL_THREADS = 1


def load_plugins() -> list[str]:
    """Import the packages that register methods through the ``alm_opacus.methods`` entry
    point group (e.g. ``baselines``), so ``alm_opacus`` never imports them by name."""
    loaded = []
    for entry in importlib.metadata.entry_points(group=PLUGIN_GROUP):
        entry.load()
        loaded.append(entry.name)
    return loaded


@dataclass
class Prepared:
    """The data a run's methods and attacks share.

    Attributes:
        images: the dataset's images as stored (uint8 or float, possibly a memmap); converted
            to float per part, and only for methods that take images.
        encoder: the encoder pre-trained on the public split.
    """

    config: RunConfig
    split: Split
    features: Tensor
    labels: Tensor
    num_classes: int
    delta: float
    images: np.ndarray | None = None
    encoder: nn.Module | None = None

    def part(self, name: str) -> tuple[Tensor, Tensor]:
        idx = torch.from_numpy(getattr(self.split, name))
        return self.features[idx], self.labels[idx]

    def inputs(self, kind: InputKind, name: str) -> Tensor:
        """The split part ``name`` as ``kind``: features, or images as float in [0, 1]."""
        if kind == "features":
            return self.part(name)[0]
        if kind != "images" or self.images is None:
            raise ValueError(f"inputs kind {kind!r} is not available: expected {INPUT_KINDS}")
        idx = getattr(self.split, name)
        rows = np.sort(idx)  # sorted reads are sequential on a memmap
        images = torch.from_numpy(to_float(np.asarray(self.images[rows])))
        return images[np.argsort(np.argsort(idx))]  # back in the split's order


def prepare(config: RunConfig) -> Prepared:
    """Load the data, split it, pre-train on the public part, and extract features."""
    dataset = load_dataset(config.dataset, root=config.data_root)
    split = make_split(dataset, sizes=config.split_sizes, seed=config.split_seed)
    public_images = (
        dataset.unlabeled if dataset.unlabeled is not None else dataset.images[split.public]
    )
    ssl = config.ssl_config
    source = "unlabeled" if dataset.unlabeled is not None else array_digest(split.public)
    key = config_hash(
        {"dataset": dataset.name, "public": source, "n": len(public_images), "ssl": ssl.to_dict(),
         "seed": config.split_seed, "version": 1}
    )  # fmt: skip
    cache = config.cache_path
    encoder = pretrain(
        public_images, config=ssl, key=key, cache_dir=cache, device=config.device,
        seed=config.split_seed, progress=config.progress,
    )  # fmt: skip
    features = extract_features(
        encoder, dataset.images, key=key, cache_dir=cache, device=config.device,
        progress=config.progress,
    )  # fmt: skip
    n = len(split.members)
    delta = config.delta if config.delta is not None else default_delta(n)
    return Prepared(
        config=config, split=split, features=features,
        labels=torch.from_numpy(np.asarray(dataset.labels, dtype=np.int64)),
        num_classes=dataset.num_classes, delta=delta, images=dataset.images, encoder=encoder,
    )  # fmt: skip


def preflight(config: RunConfig) -> None:
    """Every check that can fail before the run writes anything.

    Raises:
        ValueError: for an unusable device or cache folder; DataError for missing data.
    """
    if config.device.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(
            f"--device={config.device!r}: CUDA is not available here (torch "
            f"{torch.__version__}); use --device cpu"
        )
    check_writable_dir(config.cache_path, flag="--cache-dir")
    load_dataset(config.dataset, root=config.data_root)  # missing or corrupt files fail here


def baseline_methods(config: RunConfig) -> list[str]:
    """The run's unprotected baselines: those it names, else ``none`` (always run)."""
    return [m for m in config.methods if method_class(m).baseline] or ["none"]


def plan_cells(config: RunConfig) -> list[Cell]:
    """The grid, baseline first in each seed (every utility loss is measured against it)."""
    baselines = baseline_methods(config)
    others = [m for m in config.methods if m not in baselines]
    cells = []
    for seed in config.seeds:
        cells += [Cell(m, math.inf, seed, 1) for m in baselines]
        cells += [Cell(m, e, seed, config.noise_draws) for m in others for e in config.grid]
    return cells


@dataclass
class Session:
    """What the cells of one run share: the data, the methods, prepared work and attacks."""

    config: RunConfig
    data: Prepared
    context: MethodContext
    evaluation: Evaluation
    methods: dict[str, Method[Any, Any]] = field(default_factory=dict)
    prepared: dict[tuple[str, int], Any] = field(default_factory=dict)
    plain_attacks: dict[int, PreparedAttacks] = field(default_factory=dict)
    reference: dict[int, float] = field(default_factory=dict)
    _queries: dict[tuple[InputKind, str], Tensor] = field(default_factory=dict)

    @classmethod
    def open(cls, config: RunConfig, data: Prepared) -> Session:
        kinds = {method_class(m).inputs for m in ("none", *config.methods)}
        images = "images" in kinds
        public_x, public_y = data.part("public")
        context = MethodContext(
            num_classes=data.num_classes, head=config.recipe, device=config.device,
            public_features=public_x, public_labels=public_y,
            public_images=data.inputs("images", "public") if images else None,
            encoder=data.encoder if images else None, cache_dir=config.cache_path,
            progress=config.progress, dataset=config.dataset,
            schedule=config.spec.dpsgd.as_tuple(),
            noise=NoisePolicy(reproducible=config.reproducible_noise),
        )  # fmt: skip
        y_in, y_out = data.part("members")[1], data.part("nonmembers")[1]
        evaluation = Evaluation(
            features=torch.cat([data.part("members")[0], data.part("nonmembers")[0]]),
            labels=torch.cat([y_in, y_out]),
            is_member=np.r_[np.ones(len(y_in), bool), np.zeros(len(y_out), bool)],
            pool=data.part("attacker"), names=config.attack_names,
            num_classes=data.num_classes, config=AttackConfig(**config.attack_options),
        )  # fmt: skip
        return cls(config=config, data=data, context=context, evaluation=evaluation)

    def method(self, name: str) -> Method[Any, Any]:
        if name not in self.methods:
            options = method_options(name, self.config.options)
            self.methods[name] = create_method(name, options)
        return self.methods[name]

    def inputs(self, kind: InputKind, part: str) -> Tensor:
        """A split part (or ``evaluation``: members then non-members) as ``kind``, built once."""
        if (kind, part) not in self._queries:
            self._queries[kind, part] = (
                torch.cat([self.inputs(kind, "members"), self.inputs(kind, "nonmembers")])
                if part == "evaluation"
                else self.data.inputs(kind, part)
            )
        return self._queries[kind, part]

    def prepared_for(self, name: str, seed: int) -> Any:
        if (name, seed) not in self.prepared:
            method = self.method(name)
            self.prepared[name, seed] = method.prepare(
                features=self.inputs(method.inputs, "members"),
                labels=self.data.part("members")[1], seed=seed, context=self.context,
            )  # fmt: skip
        return self.prepared[name, seed]

    def plain(self, seed: int) -> PreparedAttacks:
        """Attacks with plain shadow heads (the victim's recipe, no protection), per seed."""
        if seed not in self.plain_attacks:
            trainer = plain_shadow_trainer(self.context)
            self.plain_attacks[seed] = self.evaluation.prepare(trainer, seed=seed)
        return self.plain_attacks[seed]


def run_cell(cell: Cell, session: Session) -> CellOutcome:
    """Release, evaluate and attack one cell; an infeasible budget becomes one row."""
    start = time.perf_counter()
    config, method = session.config, session.method(cell.method)
    try:
        prepared = session.prepared_for(cell.method, cell.seed)
        releases, accuracies, results = _draws(cell, session, method, prepared)
    except InfeasibleRelease as exc:
        row = infeasible_row(dataset=config.dataset, method=cell.method, epsilon=cell.epsilon,
                             seed=cell.seed, delta=session.data.delta, reason=str(exc),
                             seconds=time.perf_counter() - start)  # fmt: skip
        return CellOutcome(rows=[row], rocs={})
    if releases[0].baseline:
        session.reference[cell.seed] = accuracies[0]
    reference = session.reference[cell.seed]
    rows = cell_rows(
        dataset=config.dataset, method=cell.method, epsilon=cell.epsilon, seed=cell.seed,
        releases=releases, accuracies=accuracies, reference=reference, results=results,
        seconds=time.perf_counter() - start,
    )  # fmt: skip
    rocs: RocMap = {}
    for result in results:  # the first draw's curve of each attack
        key = (cell.method, cell.epsilon, result.attack)
        if key not in rocs:
            rocs[key] = (result.roc.fpr.tolist(), result.roc.tpr.tolist())
    chosen = releases[0].chosen_config
    entry = None if chosen is None else {"method": cell.method, "epsilon": cell.epsilon,
                                         "seed": cell.seed, "config": chosen}  # fmt: skip
    per_draw = _by_draw(results)
    draws = draw_records(method=cell.method, epsilon=cell.epsilon, seed=cell.seed,
                         accuracies=accuracies, results=per_draw)  # fmt: skip
    split, evaluation = session.data.split, session.evaluation
    scores = cell_scores(
        method=cell.method, epsilon=cell.epsilon, seed=cell.seed,
        rows=np.r_[split.members, split.nonmembers], labels=evaluation.labels.numpy(),
        is_member=evaluation.is_member,
        draws=[{r.attack: r.scores for r in d if r.scores is not None} for d in per_draw],
    )  # fmt: skip
    return CellOutcome(rows=rows, rocs=rocs, chosen=entry, draws=draws, scores=scores)


def _by_draw(results: list[AttackResult]) -> list[list[AttackResult]]:
    """The results of a cell split per noise draw (within a draw every attack name, with its
    attacker's suffix, occurs once, so a repeated name starts the next draw)."""
    out: list[list[AttackResult]] = []
    names: set[str] = set()
    for result in results:
        if not out or result.attack in names:
            out.append([])
            names = set()
        out[-1].append(result)
        names.add(result.attack)
    return out


def _draws(
    cell: Cell, session: Session, method: Method[Any, Any], prepared: Any
) -> tuple[list[Release], list[float], list[AttackResult]]:
    """Every noise draw of a cell: its release, test accuracy and attack results."""
    evaluation, data, context = session.evaluation, session.data, session.context
    kind = method.inputs
    releases: list[Release] = []
    accuracies: list[float] = []
    results: list[AttackResult] = []
    adaptive: PreparedAttacks | None = None
    y_in, y_out = data.part("members")[1], data.part("nonmembers")[1]
    for draw in range(cell.draws):
        release = method.release(
            prepared, features=session.inputs(kind, "members"), labels=y_in,
            epsilon=cell.epsilon, delta=data.delta, seed=cell.seed, draw=draw, context=context,
        )  # fmt: skip
        releases.append(release)
        accuracies.append(accuracy(release.predict_proba(session.inputs(kind, "nonmembers")),
                                   y_out))  # fmt: skip
        if not evaluation.names:
            continue
        queried = None if kind == "features" else session.inputs(kind, "evaluation")
        if release.attacker is None:
            results += evaluation.attack(session.plain(cell.seed), release, inputs=queried)
            continue
        if adaptive is None:  # one adaptive attacker per cell: its protection is the cell's
            adaptive = evaluation.prepare(release.attacker(), seed=cell.seed)
        results += evaluation.attack(adaptive, release, inputs=queried)
        results += evaluation.attack(session.plain(cell.seed), release, inputs=queried,
                                     suffix=CLEAN_SUFFIX)  # fmt: skip
    return releases, accuracies, results


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
    config: RunConfig,
    *,
    on_cell: Callable[[Cell], None] | None = None,
    on_start: Callable[[Path], None] | None = None,
) -> RunResult:
    """Run the whole comparison into ``config.out``: ``config.json``, ``split.json``,
    ``results.csv``, ``rocs.json``, TensorBoard events and plots, each written atomically
    after every cell.

    Args:
        config: the run.
        on_cell: called before each cell is computed (tests use it to interrupt a run).
        on_start: called with the run folder once it is validated and locked.

    Raises:
        ValueError: for an invalid configuration, an unusable ``out`` or cache, a run folder
            that holds another run (without resume/overwrite), or a resume whose config
            differs. DataError: for a missing or corrupt dataset.
    """
    start = time.perf_counter()
    out = Path(config.out)
    preflight(config)
    folder = RunFolder(out, resume=config.resume, overwrite=config.overwrite)
    settings = run_settings(config)
    folder.check(settings)
    with folder, contextlib.ExitStack() as stack:
        if on_start is not None:
            on_start(out)
        writer = RunWriter(out, settings=settings, resume=config.resume,
                           hparams=tensorboard_hparams(config))  # fmt: skip
        data = prepare(config)
        data.split.save(out / "split.json")
        writer.describe(num_classes=data.num_classes, images=image_source(data.images))
        session = Session.open(config, data)
        baselines = baseline_methods(config)
        for row in writer.rows:  # a resumed run measures utility against its finished baseline
            if row.method in baselines:
                session.reference[row.seed] = row.test_accuracy
        stack.enter_context(torch_threads(CELL_THREADS))
        cells = [c for c in plan_cells(config) if c.key not in writer.done]
        bar = tqdm(cells, desc="cells", unit="cell", disable=not config.progress or not cells)
        try:
            for cell in bar:
                bar.set_postfix_str(f"{cell.method} eps={cell.epsilon:g} seed={cell.seed}")
                if on_cell is not None:
                    on_cell(cell)
                writer.add(run_cell(cell, session))
        except KeyboardInterrupt:
            writer.interrupted()
            raise
        writer.finish(force=bool(cells))
    return RunResult(
        rows=writer.rows, out=out, seconds=time.perf_counter() - start, num_classes=data.num_classes
    )
