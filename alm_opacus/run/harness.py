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
from alm_opacus.attacks.base import ATTACKER_POOL_MIN
from alm_opacus.data import Dataset, load_dataset, to_float
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
from alm_opacus.report.results import ResultRow
from alm_opacus.run.cells import Cell, CellOutcome, RocMap
from alm_opacus.run.config import RunConfig
from alm_opacus.run.evaluation import (
    CLEAN_SUFFIX,
    Evaluation,
    cell_rows,
    infeasible_row,
    torch_threads,
)
from alm_opacus.run.rundir import SPLIT_FILE, RunFolder, check_can_create
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
    """Load the data, split it, pre-train on the public part, and extract features (a dataset
    of features, ``features:PATH``, brings its own: nothing is pre-trained)."""
    dataset = load_dataset(config.dataset, root=config.data_root)
    split = make_split(dataset, sizes=config.split_sizes, seed=config.split_seed)
    if dataset.images is None:
        return given_features(config, dataset, split)
    public_images = (
        dataset.unlabeled if dataset.unlabeled is not None else dataset.images[split.public]
    )
    ssl = config.ssl_config
    source = "unlabeled" if dataset.unlabeled is not None else array_digest(split.public)
    key = config_hash(
        {"dataset": dataset.name, "public": source, "n": len(public_images), "ssl": ssl.to_dict(),
         "seed": config.split_seed, "version": 1, "data": _data_digest(dataset)}
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


def _data_digest(dataset: Dataset) -> str:
    """The bytes of the images (and unlabeled images) the encoder and features come from:
    the cache key pins the data, not only its name and split."""
    parts = [dataset.images, *([] if dataset.unlabeled is None else [dataset.unlabeled])]
    return "/".join(array_digest(part) for part in parts)


def given_features(config: RunConfig, dataset: Dataset, split: Split) -> Prepared:
    """The run's data from a dataset of features (the user's encoder ran already): the rows
    are used as the dataset holds them (memory-mapped for ``features:PATH``), not copied."""
    assert dataset.features is not None
    n = len(split.members)
    return Prepared(
        config=config, split=split, features=torch.from_numpy(dataset.features),
        labels=torch.from_numpy(np.asarray(dataset.labels, dtype=np.int64)),
        num_classes=dataset.num_classes,
        delta=config.delta if config.delta is not None else default_delta(n),
    )  # fmt: skip


def preflight(config: RunConfig) -> None:
    """Every check that can fail before the run writes anything (it writes nothing).

    Raises:
        ValueError: for an unusable device or cache folder, or split sizes the data or the
            run cannot use (naming ``--split``); DataError for missing data.
    """
    if config.device.startswith("cuda"):
        index = int(config.device.partition(":")[2] or 0)
        if not torch.cuda.is_available() or index >= torch.cuda.device_count():
            raise ValueError(
                f"--device={config.device!r}: CUDA is not available here (torch "
                f"{torch.__version__}, {torch.cuda.device_count()} devices); use --device cpu"
            )
    check_can_create(config.cache_path, flag="--cache-dir")
    dataset = load_dataset(config.dataset, root=config.data_root)  # missing/corrupt files fail
    try:
        split = make_split(dataset, sizes=config.split_sizes, seed=config.split_seed)
    except ValueError as exc:
        raise ValueError(f"--split: {exc}") from exc
    _check_split(config, split.sizes())


def _check_split(config: RunConfig, sizes: dict[str, int]) -> None:
    """Split sizes too small for what the run does fail here, not after pre-training."""
    needs = [("members", 2, "a head, the sensitivity sampler and the attacks")]
    if config.attack_names:
        needs.append(("nonmembers", 2, "the attacks' split-half epsilon bound (halves of "
                                       "members and non-members)"))  # fmt: skip
        needs.append(("attacker", ATTACKER_POOL_MIN, "the attacker's shadow heads"))
    sampled = [m for m in config.methods if getattr(method_options(m, config.options),
                                                    "sensitivity", None) == "sampled"]  # fmt: skip
    if sampled:
        needs.append(("public", 2, f"{', '.join(sampled)}'s sensitivity sampler, which draws "
                                   "neighbouring data sets from the public split"))  # fmt: skip
    for part, low, why in needs:
        if sizes[part] < low:
            raise ValueError(
                f"--split: {part}={sizes[part]} is too small: {why} need at least {low}; "
                f"expected e.g. --split {part}={2 * low}"
            )


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
    return CellOutcome(rows=rows, rocs=rocs, chosen=entry)


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
        on_start: called with the run folder once it is validated, locked, and about to
            hold this run's first result.

    Raises:
        ValueError: for an invalid configuration, an unusable ``out`` or cache, a run folder
            that holds another run (without resume/overwrite), or a resume whose config
            differs. DataError: for a missing or corrupt dataset.
    """
    start = time.perf_counter()
    out = Path(config.out)
    preflight(config)
    folder = RunFolder(out, resume=config.resume, overwrite=config.overwrite,
                       cache=config.cache_path)  # fmt: skip
    settings = run_settings(config)
    folder.check(settings)

    def commit() -> None:  # before the first result: the folder now holds this run
        folder.commit()
        if on_start is not None:
            on_start(out)

    with folder, contextlib.ExitStack() as stack:
        writer = RunWriter(out, settings=settings, resume=config.resume,
                           hparams=tensorboard_hparams(config), before_write=commit)  # fmt: skip
        data = prepare(config)
        data.split.save(out / SPLIT_FILE)
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
    return RunResult(rows=writer.rows, out=out, seconds=time.perf_counter() - start)
