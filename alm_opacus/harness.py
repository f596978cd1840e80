"""Run a comparison: splits, encoder, each method x epsilon x seed, attacks, results.

The private split never touches the encoder: pre-training sees only the public split (or
the dataset's unlabeled set), each method sees the members, each attack sees what its
threat model allows.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.metadata
import json
import math
import os
import platform
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

import alm_opacus
from alm_opacus._validation import check_delta, check_epsilon
from alm_opacus.attacks import (
    DEFAULT_ATTACKS,
    AttackerKnowledge,
    AttackResult,
    AttackTarget,
    PreparedAttacks,
    aggregate_results,
    available_attacks,
    prepare_attacks,
)
from alm_opacus.data import available_datasets, load_dataset, to_float
from alm_opacus.data.split import DEFAULT_SIZES, Split, SplitSizes, make_split
from alm_opacus.heads import HeadConfig, accuracy, utility_loss
from alm_opacus.io import atomic_write_json, atomic_write_text
from alm_opacus.methods import (
    INPUT_KINDS,
    InputKind,
    Method,
    MethodContext,
    Release,
    available_methods,
    create_method,
)
from alm_opacus.report.plots import write_plots
from alm_opacus.report.results import ResultRow, cell_key, read_results, write_results
from alm_opacus.report.tensorboard import TensorBoardReporter
from alm_opacus.ssl.pretrain import (
    DEFAULT_SSL,
    SSLConfig,
    array_digest,
    config_hash,
    extract_features,
    pretrain,
)

PLUGIN_GROUP = "alm_opacus.methods"
DEFAULT_EPSILONS = (0.1, 0.5, 1.0, 2.0, 5.0, 10.0)


def load_plugins() -> list[str]:
    """Import the packages that register methods through the ``alm_opacus.methods`` entry
    point group (e.g. ``baselines``), so ``alm_opacus`` never imports them by name."""
    loaded = []
    for entry in importlib.metadata.entry_points(group=PLUGIN_GROUP):
        entry.load()
        loaded.append(entry.name)
    return loaded


@dataclass(frozen=True)
class RunConfig:
    """Everything that determines a run; saved as ``config.json``.

    Attributes:
        dataset: registry name.
        data_root: folder holding the dataset's files (not needed for ``digits``).
        methods: method names; ``none`` (the baseline) always runs too.
        epsilons: the privacy budgets of the grid.
        delta: ``None`` means min(1e-5, 1 / (10 n)) for ``n`` members.
        seeds: one cell per seed: head training, noise and attacks are seeded by it.
        split_seed: seeds the split and pre-training (shared by all seeds).
        device: ``"cpu"`` or ``"cuda"``.
        out: the run folder.
        cache_dir: encoder/feature cache (default ``<out>/../.cache``... see ``cache_path``).
        noise_draws: independent noise draws per (method, epsilon, seed).
        options: method options (``sensitivity``, ``m``, ...).
        attacks: attack names (``all`` for every registered attack; empty for none).
        resume: skip cells already in ``results.csv``.
        head: the fine-tuning recipe.
        ssl: the SimCLR recipe (``None``: the dataset's default).
        split: split sizes (``None``: the dataset's default).
        progress: show progress bars.
    """

    dataset: str = "digits"
    data_root: str | None = None
    methods: tuple[str, ...] = ("none",)
    epsilons: tuple[float, ...] = DEFAULT_EPSILONS
    delta: float | None = None
    seeds: tuple[int, ...] = (0,)
    split_seed: int = 0
    device: str = "cpu"
    out: str = "runs/latest"
    cache_dir: str | None = None
    noise_draws: int = 5
    options: dict[str, Any] = field(default_factory=dict)
    attacks: tuple[str, ...] = ("all",)
    resume: bool = False
    head: HeadConfig = field(default_factory=HeadConfig)
    ssl: SSLConfig | None = None
    split: SplitSizes | None = None
    progress: bool = True

    def __post_init__(self) -> None:
        if self.dataset not in available_datasets():
            names = ", ".join(available_datasets())
            raise ValueError(f"unknown dataset {self.dataset!r}: expected one of {names}")
        if not self.methods:
            raise ValueError("methods is empty: expected at least one method name")
        for name in self.methods:
            if name not in available_methods():
                raise ValueError(
                    f"unknown method {name!r}: expected one of {', '.join(available_methods())}"
                )
        for epsilon in self.epsilons:
            check_epsilon(epsilon)
        if self.delta is not None:
            check_delta(self.delta)
        if self.noise_draws < 1:
            raise ValueError(f"noise_draws={self.noise_draws!r} is invalid: expected >= 1")
        if not self.seeds:
            raise ValueError("seeds is empty: expected at least one seed")
        for name in self.attack_names:
            if name not in available_attacks():
                raise ValueError(
                    f"unknown attack {name!r}: expected one of {', '.join(available_attacks())}"
                    ", 'all' or 'none'"
                )
        if self.device not in ("cpu", "cuda") and not self.device.startswith("cuda:"):
            raise ValueError(f"device={self.device!r} is invalid: expected 'cpu' or 'cuda[:N]'")

    @property
    def attack_names(self) -> tuple[str, ...]:
        """The attacks to run: ``all`` expands to every registered one, ``none`` to none."""
        if tuple(self.attacks) == ("all",):
            return DEFAULT_ATTACKS
        if tuple(self.attacks) in (("none",), ()):
            return ()
        return tuple(self.attacks)

    @property
    def ssl_config(self) -> SSLConfig:
        return self.ssl if self.ssl is not None else DEFAULT_SSL.get(self.dataset, SSLConfig())

    @property
    def split_sizes(self) -> SplitSizes:
        if self.split is not None:
            return self.split
        if self.dataset not in DEFAULT_SIZES:
            raise ValueError(f"no default split sizes for {self.dataset!r}; pass split sizes")
        return DEFAULT_SIZES[self.dataset]

    @property
    def cache_path(self) -> Path:
        if self.cache_dir is not None:
            return Path(self.cache_dir)
        return Path(os.environ.get("ALM_OPACUS_CACHE", Path(self.out) / "cache"))

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["ssl"] = self.ssl_config.to_dict()
        out["split"] = dataclasses.asdict(self.split_sizes)
        return out


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


@dataclass
class RunResult:
    rows: list[ResultRow]
    out: Path
    seconds: float


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
    delta = config.delta if config.delta is not None else min(1e-5, 1.0 / (10 * n))
    return Prepared(
        config=config, split=split, features=features,
        labels=torch.from_numpy(np.asarray(dataset.labels, dtype=np.int64)),
        num_classes=dataset.num_classes, delta=delta, images=dataset.images, encoder=encoder,
    )  # fmt: skip


def check_out(out: Path) -> None:
    """Create ``out`` if needed and check that it can be written.

    Raises:
        ValueError: naming the folder, when it cannot.
    """
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe = out / ".write-test"
        probe.write_text("")
        probe.unlink()
    except OSError as exc:
        raise ValueError(f"out={str(out)!r} is not a writable folder: {exc}") from exc


def run(config: RunConfig) -> RunResult:
    """Run the whole comparison and write ``config.json``, ``split.json``,
    ``results.csv`` and TensorBoard events under ``config.out``.

    Raises:
        ValueError: for an invalid configuration or an unwritable ``out``.
        DataError: for a missing or corrupt dataset.
    """
    start = time.perf_counter()
    out = Path(config.out)
    check_out(out)
    results_path = out / "results.csv"
    rows: list[ResultRow] = []
    if config.resume and results_path.exists():
        rows = read_results(results_path)
    done = {row.cell() for row in rows}
    finished_before = len(rows)
    methods = ["none", *[m for m in config.methods if m != "none"]]
    settings = {
        **config.to_dict(),
        "environment": _environment(),
        "tuning_grids": {m: [dict(c) for c in create_method(m).tuning_grid] for m in methods},
    }
    chosen: list[dict[str, Any]] = []
    if config.resume and (out / "config.json").exists():  # keep the finished cells' choices
        chosen = json.loads((out / "config.json").read_text()).get("chosen_configs", [])
    atomic_write_json(out / "config.json", {**settings, "chosen_configs": chosen})
    data = prepare(config)
    data.split.save(out / "split.json")
    kinds = {name: _input_kind(create_method(name)) for name in methods}
    with_images = "images" in kinds.values()
    context = MethodContext(
        num_classes=data.num_classes, head=config.head, device=config.device,
        public_features=data.part("public")[0], public_labels=data.part("public")[1],
        public_images=data.inputs("images", "public") if with_images else None,
        encoder=data.encoder if with_images else None,
        cache_dir=config.cache_path, options={"dataset": config.dataset, **config.options},
        progress=config.progress,
    )  # fmt: skip
    reporter = TensorBoardReporter(out / "tb")
    # Heads, DP-SGD steps and attacks are many small tensor ops: one thread beats two, and
    # far more so on a loaded machine. Pre-training above used every thread.
    single_thread = contextlib.ExitStack()
    single_thread.enter_context(torch_threads(1))
    rocs = _load_rocs(out / "rocs.json") if config.resume else {}
    y_in, y_out = data.part("members")[1], data.part("nonmembers")[1]
    queries: dict[tuple[InputKind, str], Tensor] = {}

    def inputs(kind: InputKind, part: str) -> Tensor:  # built once, and only when asked
        if (kind, part) not in queries:
            queries[kind, part] = (
                torch.cat([inputs(kind, "members"), inputs(kind, "nonmembers")])
                if part == "evaluation"
                else data.inputs(kind, part)
            )
        return queries[kind, part]

    evaluation = Evaluation(
        features=inputs("features", "evaluation"), labels=torch.cat([y_in, y_out]),
        is_member=np.r_[np.ones(len(y_in), bool), np.zeros(len(y_out), bool)],
        pool=data.part("attacker"), names=config.attack_names, num_classes=data.num_classes,
    )  # fmt: skip
    try:
        for seed in config.seeds:
            reference: float | None = None
            plain_attacks: PreparedAttacks | None = None
            for name in methods:
                method = create_method(name)
                kind = kinds[name]
                prepared = None
                grid = (math.inf,) if name == "none" else config.epsilons
                for epsilon in grid:
                    cell = cell_key(name, epsilon, seed)
                    if cell in done:
                        if name == "none":
                            reference = next(r.test_accuracy for r in rows if r.cell() == cell)
                        continue
                    cell_start = time.perf_counter()
                    if prepared is None:
                        prepared = method.prepare(
                            features=inputs(kind, "members"), labels=y_in, seed=seed,
                            context=context,
                        )  # fmt: skip
                    draws = 1 if name == "none" else config.noise_draws
                    accuracies: list[float] = []
                    releases: list[Release] = []
                    results: list[AttackResult] = []
                    attacks: PreparedAttacks | None = None
                    for draw in range(draws):
                        release = method.release(
                            prepared, features=inputs(kind, "members"), labels=y_in,
                            epsilon=epsilon, delta=data.delta, seed=seed, draw=draw,
                            context=context,
                        )  # fmt: skip
                        releases.append(release)
                        accuracies.append(
                            accuracy(release.predict_proba(inputs(kind, "nonmembers")), y_out)
                        )
                        if not evaluation.names:
                            continue
                        if attacks is None:
                            adaptive = type(method).shadow_trainer is not Method.shadow_trainer
                            if adaptive or plain_attacks is None:
                                trainer = method.shadow_trainer(
                                    release=release, epsilon=epsilon, delta=data.delta,
                                    context=context,
                                )  # fmt: skip
                                attacks = evaluation.prepare(trainer, seed=seed)
                                if not adaptive:
                                    plain_attacks = attacks
                            else:
                                attacks = plain_attacks
                        queried = None if kind == "features" else inputs(kind, "evaluation")
                        results.extend(evaluation.attack(attacks, release, inputs=queried))
                    if name == "none":
                        reference = accuracies[0]
                    assert reference is not None
                    cell_rows = _cell_rows(
                        config=config, name=name, epsilon=epsilon, seed=seed,
                        releases=releases, accuracies=accuracies, reference=reference,
                        results=results, seconds=time.perf_counter() - cell_start,
                    )  # fmt: skip
                    rows.extend(cell_rows)
                    if "config" in releases[0].info:
                        chosen.append({"method": name, "epsilon": epsilon, "seed": seed,
                                       "config": releases[0].info["config"]})  # fmt: skip
                    for result in results[: len(evaluation.names)]:  # the first draw's ROCs
                        rocs[(name, epsilon, result.attack)] = (
                            result.roc.fpr.tolist(),
                            result.roc.tpr.tolist(),
                        )
                    _save_rocs(out / "rocs.json", rocs)
                    write_results(results_path, rows)
                    reporter.add_cell(cell_rows, hparams=_hparams(config))
        # Figures are rendered after the last cell, so missing plots mean an earlier run
        # stopped before them; a resume that computed nothing and finds them skips the work.
        plots_missing = not (out / "plots" / "fig1_utility_loss.png").exists()
        if len(rows) > finished_before or plots_missing:
            reporter.add_layout(methods)
            reporter.add_rocs(rocs)
            write_plots(rows, rocs, out / "plots")
        atomic_write_json(out / "config.json", {**settings, "chosen_configs": chosen})
    finally:
        single_thread.close()
        reporter.close()
    return RunResult(rows=rows, out=out, seconds=time.perf_counter() - start)


def _cell_rows(
    *, config: RunConfig, name: str, epsilon: float, seed: int, releases: Sequence[Release],
    accuracies: Sequence[float], reference: float, results: Sequence[AttackResult],
    seconds: float,
) -> list[ResultRow]:  # fmt: skip
    statement = releases[0].statement
    sens = statement.sensitivity
    mean_acc = float(np.mean(accuracies))
    base = ResultRow(
        dataset=config.dataset, method=name, epsilon=epsilon, delta=statement.delta,
        guarantee=statement.guarantee.value,
        sensitivity=sens.value if sens is not None else math.nan,
        noise_scale=statement.noise_scale if statement.noise_scale is not None else math.nan,
        seed=seed, test_accuracy=mean_acc,
        utility_loss=utility_loss(protected=mean_acc, unprotected=reference),
        seconds=seconds, noise_draws=len(releases),
        test_accuracy_std=float(np.std(accuracies)) if len(accuracies) > 1 else math.nan,
        utility_loss_std=float(np.std(accuracies)) / reference if len(accuracies) > 1 else math.nan,
        statement=str(statement),
    )  # fmt: skip
    if not results:
        return [base]
    out = []
    for agg in aggregate_results(results):
        mean, std = agg.mean, agg.std
        out.append(base.replace(
            attack=agg.attack, mia_accuracy=mean["mia_accuracy"],
            mia_advantage=mean["mia_advantage"], mia_auc=mean["mia_auc"],
            tpr_at_fpr_0_001=mean["tpr_at_fpr_0.001"], tpr_at_fpr_0_01=mean["tpr_at_fpr_0.01"],
            eps_lower_bound=mean["eps_lower_bound"], mia_auc_std=std["mia_auc"],
            mia_accuracy_std=std["mia_accuracy"],
        ))  # fmt: skip
    return out


def _input_kind(method: Method) -> InputKind:
    if method.inputs not in INPUT_KINDS:
        raise ValueError(
            f"method {method.name!r} declares inputs={method.inputs!r}: expected one of "
            f"{INPUT_KINDS}"
        )
    return method.inputs


@contextlib.contextmanager
def torch_threads(n: int) -> Iterator[None]:
    """Run a block with ``n`` intra-op threads: the attacks' many tiny matrix products are
    slower with more threads than they have work for."""
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


@dataclass
class Evaluation:
    """The balanced evaluation set (members and as many non-members) and the attacker's pool."""

    features: Tensor
    labels: Tensor
    is_member: np.ndarray
    pool: tuple[Tensor, Tensor]
    names: tuple[str, ...]
    num_classes: int

    def prepare(self, trainer: Any, *, seed: int) -> PreparedAttacks:
        """Fit every attack on the attacker's side, before any release is seen."""
        knowledge = AttackerKnowledge(features=self.pool[0], labels=self.pool[1], trainer=trainer,
                                      num_classes=self.num_classes)  # fmt: skip
        with torch_threads(1):
            return prepare_attacks(
                names=self.names, knowledge=knowledge, seed=seed,
                candidate_features=self.features, candidate_labels=self.labels,
            )  # fmt: skip

    def attack(
        self, prepared: PreparedAttacks, release: Release, *, inputs: Tensor | None = None
    ) -> list[AttackResult]:
        """Attack ``release``, querying it with ``inputs`` (the evaluation rows in the
        release's input kind; ``None``: the features)."""
        target = AttackTarget(
            predict=release.predict_proba, features=self.features, labels=self.labels,
            is_member=self.is_member, num_classes=self.num_classes,
            delta=release.statement.delta, inputs=inputs,
        )  # fmt: skip
        with torch_threads(1):
            return prepared.attack(target)


RocKey = tuple[str, float, str]


def _save_rocs(path: Path, rocs: dict[RocKey, tuple[list[float], list[float]]]) -> None:
    payload = [
        {"method": m, "epsilon": "inf" if math.isinf(e) else e, "attack": a, "fpr": f, "tpr": t}
        for (m, e, a), (f, t) in rocs.items()
    ]
    atomic_write_text(path, json.dumps(payload))


def _load_rocs(path: Path) -> dict[RocKey, tuple[list[float], list[float]]]:
    if not path.exists():
        return {}
    out = {}
    for item in json.loads(path.read_text()):
        out[(item["method"], float(item["epsilon"]), item["attack"])] = (item["fpr"], item["tpr"])
    return out


def _hparams(config: RunConfig) -> dict[str, object]:
    head = config.head
    return {"dataset": config.dataset, "head": head.kind, "head_steps": head.steps,
            "head_l2": head.l2, "noise_draws": config.noise_draws,
            "sensitivity": str(config.options.get("sensitivity", "")),
            "m": int(config.options.get("m", 0))}  # fmt: skip


def _environment() -> dict[str, str]:
    return {
        "alm_opacus": alm_opacus.__version__,
        "torch": torch.__version__,
        "python": platform.python_version(),
    }
