"""The pure units of a run and the inputs they share.

* :class:`RunData`: the run's data, split and features (built by the driver's
  :func:`~alm_opacus.run.harness.prepare` from the :class:`~alm_opacus.run.plan.RunPlan`);
* :class:`RunInputs`: what every unit reads, built once by the driver (read-only; on Ray, one
  object in the object store);
* :func:`prepare_unit`: a method's work shared by every epsilon and draw of a seed;
* :func:`plain_attacks_unit`: the attacks with plain shadow heads, per seed;
* :func:`cell_unit`: one (method, epsilon, seed) cell's rows, from the two above.

Each is a pure function of its arguments: seeds come from the unit, never from the order
units run in, so any executor (:mod:`alm_opacus.run.executors`) gives the same rows.
:class:`Session` computes them one at a time in this process, each shared piece once.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Callable, Hashable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from alm_opacus.attacks import AttackResult, PreparedAttacks
from alm_opacus.attacks.roc_bounds import bound_roc
from alm_opacus.data import to_float
from alm_opacus.data.split import Split
from alm_opacus.errors import InfeasibleRelease
from alm_opacus.heads import accuracy
from alm_opacus.method_base import same_factory
from alm_opacus.methods import (
    INPUT_KINDS,
    AttackerFactory,
    InputKind,
    Method,
    MethodContext,
    NoisePolicy,
    Release,
    ReleaseRequest,
    RunMemo,
    load_plugins,
    plain_shadow_trainer,
)
from alm_opacus.report.draws import draw_records
from alm_opacus.report.risk import cell_scores
from alm_opacus.run.cells import Cell, CellOutcome, RocMap
from alm_opacus.run.evaluation import (
    CLEAN_SUFFIX,
    Evaluation,
    cell_rows,
    cell_threads,
    infeasible_row,
    with_reference,
)
from alm_opacus.run.plan import RunPlan
from alm_opacus.unit_map import ThreadMap, UnitMap, runs_here, serial_map

__all__ = [
    "Infeasible",
    "PlainAttacks",
    "RunData",
    "RunInputs",
    "Session",
    "cell_unit",
    "plain_attacks_unit",
    "prepare_unit",
    "run_cell",
]

#: Pool rows from which a run's chunks go one at a time again: a chunk's working memory
#: grows with its bank's rows. At 5*10^4 members (10^5 pool rows, ``--methods alm,dpsgd
#: --epsilons 10``) two at once held 3.6 GB 40 s in, against 2.4 GB one at a time, and passed
#: 4.1 GB (the whole run's peak had been 3.2 GB; issue 38 allows the grid 4 GiB). At 10^4
#: members (2*10^4 rows) they raised the grid's peak from 1.9 to 2.6 GiB.
THREADED_POOL_ROWS = 1 << 16


@dataclass
class RunData:
    """The data a run's methods and attacks share.

    Attributes:
        images: the dataset's images as stored (uint8 or float, possibly a memmap); converted
            to float per part, and only for methods that take images.
        encoder: the encoder pre-trained on the public split.
    """

    split: Split
    features: Tensor
    labels: Tensor
    num_classes: int
    delta: float
    images: np.ndarray | None = None
    encoder: nn.Module | None = None

    def part(self, name: str) -> tuple[Tensor, Tensor]:
        """The split part ``name`` (or ``evaluation``: members then non-members), copied."""
        idx = torch.from_numpy(self.rows(name))
        return self.features[idx], self.labels[idx]

    def rows(self, name: str) -> np.ndarray:
        """The dataset rows of the split part ``name`` (``evaluation``: members, then
        non-members)."""
        if name == "evaluation":
            return np.r_[self.split.members, self.split.nonmembers]
        return np.asarray(getattr(self.split, name))

    def inputs(self, kind: InputKind, name: str) -> Tensor:
        """The split part ``name`` (or ``evaluation``) as ``kind``: features, or images as
        float in [0, 1]."""
        if kind == "features":
            return self.part(name)[0]
        if kind != "images" or self.images is None:
            raise ValueError(f"inputs kind {kind!r} is not available: expected {INPUT_KINDS}")
        idx = self.rows(name)
        rows = np.sort(idx)  # sorted reads are sequential on a memmap
        images = torch.from_numpy(to_float(np.asarray(self.images[rows])))
        return images[np.argsort(np.argsort(idx))]  # back in the split's order


@dataclass
class RunInputs:
    """What every unit of a run reads: built once by the driver, read-only, and sent once
    (on Ray: one object in the object store, whatever the number of tasks).

    Attributes:
        dataset: the dataset's name (the rows' first column).
        methods: the plan's method objects by name (:attr:`RunPlan.methods`).
        delta: the run's delta.
        context: what every method may use besides the members' data.
        evaluation: the balanced evaluation set and the attacker's pool.
        queries: ``(kind, part) -> inputs`` for the parts ``members``, ``nonmembers`` and
            ``evaluation`` (members then non-members), in each input kind the run's methods
            take.
        labels: ``part -> labels`` for ``members`` and ``nonmembers``.
        rows: the dataset rows of the evaluation set (members then non-members), for the
            per-example scores behind ``risk/``.
    """

    dataset: str
    methods: Mapping[str, Method[Any, Any]]
    delta: float
    context: MethodContext
    evaluation: Evaluation
    queries: dict[tuple[InputKind, str], Tensor]
    labels: dict[str, Tensor]
    rows: np.ndarray

    @classmethod
    def build(
        cls,
        plan: RunPlan,
        data: RunData,
        *,
        memo: RunMemo | None = None,
        map_units: UnitMap = serial_map,
        progress: bool | None = None,
    ) -> RunInputs:
        """The inputs of ``plan``'s units from the prepared data.

        Args:
            memo: work shared by the units (default: a fresh in-process memo).
            map_units: how units map their own units (sampler and bank chunks);
                :func:`~alm_opacus.unit_map.serial_map` becomes a
                :class:`~alm_opacus.unit_map.ThreadMap` when the cells use several threads
                and the pool has fewer than :data:`THREADED_POOL_ROWS` rows.
            progress: show progress bars inside units (default: the config's).
        """
        config = plan.config
        pool = data.part("attacker")
        threads = cell_threads(len(pool[1]))
        if map_units is serial_map and threads > 1 and len(pool[1]) < THREADED_POOL_ROWS:
            map_units = ThreadMap(workers=threads)
        kinds = {method.inputs for method in plan.methods.values()}
        images = "images" in kinds
        public_x, public_y = data.part("public")
        context = MethodContext(
            num_classes=data.num_classes,
            head=config.recipe,
            device=config.device,
            public_features=public_x,
            public_labels=public_y,
            public_images=data.inputs("images", "public") if images else None,
            encoder=data.encoder if images else None,
            cache_dir=config.cache_path,
            public_cache_dir=config.encoder_cache_path,
            progress=config.progress if progress is None else progress,
            dataset=config.dataset,
            schedule=config.spec.dpsgd.as_tuple(),
            noise=NoisePolicy(reproducible=config.reproducible_noise),
            memo=RunMemo() if memo is None else memo,
            map_units=map_units,
        )
        # one copy of the evaluation rows per input kind: the members and non-members are
        # views of it (at 5*10^4 members of d = 512, each copy of them is 400 MB)
        queries: dict[tuple[InputKind, str], Tensor] = {}
        members = len(data.split.members)
        wanted: set[InputKind] = {*kinds, "features"}
        for kind in sorted(wanted):
            both = data.inputs(kind, "evaluation")
            queries[kind, "evaluation"] = both
            queries[kind, "members"], queries[kind, "nonmembers"] = both[:members], both[members:]
        labels = data.labels[torch.from_numpy(data.rows("evaluation"))]
        y_in, y_out = labels[:members], labels[members:]
        evaluation = Evaluation(
            features=queries["features", "evaluation"],
            labels=labels,
            is_member=np.r_[np.ones(len(y_in), bool), np.zeros(len(y_out), bool)],
            pool=pool,
            attacks=plan.attacks,
            num_classes=data.num_classes,
            config=plan.attack_config,
            map_units=map_units,
            threads=threads,
        )
        return cls(
            dataset=config.dataset,
            methods=dict(plan.methods),
            delta=plan.delta,
            context=context,
            evaluation=evaluation,
            queries=queries,
            labels={"members": y_in, "nonmembers": y_out},
            rows=np.r_[data.split.members, data.split.nonmembers],
        )

    def method(self, name: str) -> Method[Any, Any]:
        """The plan's method ``name`` (resolved with the run's options)."""
        return self.methods[name]

    def inputs(self, kind: InputKind, part: str) -> Tensor:
        """A split part (or ``evaluation``: members then non-members) as ``kind``."""
        return self.queries[kind, part]


@dataclass(frozen=True)
class Infeasible:
    """A preparation that no release can meet (its cells become one infeasible row each)."""

    reason: str


def prepare_unit(shared: RunInputs, name: str, seed: int) -> Any:
    """Unit: method ``name``'s work shared by every epsilon and draw of ``seed`` (e.g. the
    clean head and its sampled sensitivity), or :class:`Infeasible`."""
    _load_plugins_once()
    method = shared.method(name)
    try:
        return method.prepare(
            features=shared.inputs(method.inputs, "members"),
            labels=shared.labels["members"],
            seed=seed,
            context=shared.context,
        )
    except InfeasibleRelease as exc:
        return Infeasible(str(exc))


def plain_attacks_unit(shared: RunInputs, seed: int) -> PreparedAttacks:
    """Unit: the attacks with plain shadow heads (the victim's recipe, no protection)."""
    return shared.evaluation.prepare(plain_shadow_trainer(shared.context), seed=seed)


PlainAttacks = PreparedAttacks | Callable[[], PreparedAttacks] | None


def cell_unit(shared: RunInputs, cell: Cell, prepared: Any, plain: PlainAttacks) -> CellOutcome:
    """Unit: release, evaluate and attack one cell; an infeasible budget becomes one row.

    A pure function of its arguments: ``prepared`` is :func:`prepare_unit`'s value for the
    cell's method and seed, ``plain`` the seed's :func:`plain_attacks_unit` (or a function
    that computes it on first use). The rows' utility losses are left NaN: the driver fills
    them from the seed's baseline (:func:`~alm_opacus.run.evaluation.with_reference`).
    """
    _load_plugins_once()
    start = time.perf_counter()
    method = shared.method(cell.method)
    try:
        if isinstance(prepared, Infeasible):
            raise InfeasibleRelease(prepared.reason)
        releases, accuracies, per_draw = _draws(cell, shared, method, prepared, plain)
    except InfeasibleRelease as exc:
        row = infeasible_row(
            dataset=shared.dataset,
            method=cell.method,
            epsilon=cell.epsilon,
            seed=cell.seed,
            delta=shared.delta,
            reason=str(exc),
            seconds=time.perf_counter() - start,
        )
        return CellOutcome(rows=[row], rocs={})
    results = [result for draw in per_draw for result in draw]
    rows = cell_rows(
        dataset=shared.dataset,
        method=cell.method,
        epsilon=cell.epsilon,
        seed=cell.seed,
        releases=releases,
        accuracies=accuracies,
        reference=None,
        results=results,
        seconds=time.perf_counter() - start,
    )
    rocs: RocMap = {}
    for result in results:  # the first draw's curve of each attack, bounded (rows have its metrics)
        key = (cell.method, cell.epsilon, result.attack)
        if key not in rocs:
            fpr, tpr = bound_roc(fpr=result.roc.fpr, tpr=result.roc.tpr)
            rocs[key] = (fpr.tolist(), tpr.tolist())
    chosen = releases[0].chosen_config
    entry = (
        None
        if chosen is None
        else {"method": cell.method, "epsilon": cell.epsilon, "seed": cell.seed, "config": chosen}
    )
    baseline = accuracies[0] if releases[0].baseline else None
    draws = draw_records(
        method=cell.method,
        epsilon=cell.epsilon,
        seed=cell.seed,
        accuracies=accuracies,
        results=per_draw,
    )
    evaluation = shared.evaluation
    scores = cell_scores(
        method=cell.method,
        epsilon=cell.epsilon,
        seed=cell.seed,
        rows=shared.rows,
        labels=evaluation.labels.numpy(),
        is_member=evaluation.is_member,
        draws=[{r.attack: r.scores for r in d if r.scores is not None} for d in per_draw],
    )
    return CellOutcome(
        rows=rows, rocs=rocs, chosen=entry, baseline_accuracy=baseline, draws=draws, scores=scores
    )


def _draws(
    cell: Cell, shared: RunInputs, method: Method[Any, Any], prepared: Any, plain: PlainAttacks
) -> tuple[list[Release], list[float], list[list[AttackResult]]]:
    """Every noise draw of a cell: its release, test accuracy and attack results (a list per
    draw)."""
    evaluation, context = shared.evaluation, shared.context
    kind = method.inputs
    releases: list[Release] = []
    accuracies: list[float] = []
    per_draw: list[list[AttackResult]] = []
    y_in, y_out = shared.labels["members"], shared.labels["nonmembers"]

    def plain_attacks() -> PreparedAttacks:
        if plain is None:
            raise ValueError(f"cell {cell.key}: attacks were asked but no plain attacks given")
        return plain() if callable(plain) else plain

    # One adaptive attacker per cell, prepared on a side thread from before the first training
    # (`Method.attacker_before_release`) or the first release that has one: the victim's
    # Python steps and the banks' batched products keep both cores busy, neither reading the
    # other's values (seeded, per-thread torch thread counts). Only when the attacker's units
    # run in this process: a Ray task that waited on its nested units kept its CPU (a hang).
    beside = runs_here(evaluation.map_units)
    adaptive: Future[PreparedAttacks] | None = None

    def prepare_adaptive(
        side: ThreadPoolExecutor, factory: AttackerFactory
    ) -> Future[PreparedAttacks]:
        if beside:
            return side.submit(evaluation.prepare, factory(), seed=cell.seed)
        done: Future[PreparedAttacks] = Future()
        done.set_result(evaluation.prepare(factory(), seed=cell.seed))
        return done

    def request(draw: int) -> ReleaseRequest:
        return ReleaseRequest(
            features=shared.inputs(kind, "members"),
            labels=y_in,
            epsilon=cell.epsilon,
            delta=shared.delta,
            seed=cell.seed,
            draw=draw,
            context=context,
        )

    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="adaptive-attacker") as side:
        early = None
        if evaluation.attacks and beside and cell.draws:
            early = method.attacker_before_release(prepared, request(0))
            adaptive = None if early is None else prepare_adaptive(side, early)
        for draw in range(cell.draws):
            release = method.release(prepared, request(draw))
            releases.append(release)
            accuracies.append(
                accuracy(release.predict_proba(shared.inputs(kind, "nonmembers")), y_out)
            )
            if early is not None and draw == 0 and not same_factory(early, release.attacker):
                raise RuntimeError(
                    f"cell {cell.key}: {cell.method}'s attacker_before_release gave "
                    f"{early!r}, but its release's attacker is {release.attacker!r}"
                )
            if evaluation.attacks and release.attacker is not None and adaptive is None:
                adaptive = prepare_adaptive(side, release.attacker)
        queried = None if kind == "features" else shared.inputs(kind, "evaluation")
        for release in releases:
            results: list[AttackResult] = []
            per_draw.append(results)
            if not evaluation.attacks:
                continue
            if release.attacker is None:
                results += evaluation.attack(plain_attacks(), release, inputs=queried)
                continue
            assert adaptive is not None
            results += evaluation.attack(adaptive.result(), release, inputs=queried)
            results += evaluation.attack(
                plain_attacks(), release, inputs=queried, suffix=CLEAN_SUFFIX
            )
    return releases, accuracies, per_draw


@dataclass
class Session:
    """One run's units computed one at a time in this process, each shared piece once: the
    per-(preparation, seed) work, the plain attacks per seed, and the baselines' accuracies.
    For scripts and tests that compute cells by hand; :func:`run` drives an executor."""

    plan: RunPlan
    data: RunData
    shared: RunInputs
    prepared: dict[tuple[Hashable, int], Any] = field(default_factory=dict)
    plain_attacks: dict[int, PreparedAttacks] = field(default_factory=dict)
    reference: dict[int, float] = field(default_factory=dict)

    @classmethod
    def open(cls, plan: RunPlan, data: RunData) -> Session:
        return cls(plan=plan, data=data, shared=RunInputs.build(plan, data))

    @property
    def context(self) -> MethodContext:
        return self.shared.context

    @property
    def evaluation(self) -> Evaluation:
        return self.shared.evaluation

    def method(self, name: str) -> Method[Any, Any]:
        return self.shared.method(name)

    def inputs(self, kind: InputKind, part: str) -> Tensor:
        """A split part (or ``evaluation``: members then non-members) as ``kind``."""
        return self.shared.inputs(kind, part)

    def preparation(self, name: str, seed: int) -> Any:
        """:func:`prepare_unit`'s value for ``name`` and ``seed``, computed once per
        :meth:`~alm_opacus.methods.Method.preparation_key`."""
        key = (self.method(name).preparation_key(), seed)
        if key not in self.prepared:
            self.prepared[key] = prepare_unit(self.shared, name, seed)
        return self.prepared[key]

    def prepared_for(self, name: str, seed: int) -> Any:
        """The method's prepared work for ``seed``.

        Raises:
            InfeasibleRelease: when no release of the method can be made.
        """
        value = self.preparation(name, seed)
        if isinstance(value, Infeasible):
            raise InfeasibleRelease(value.reason)
        return value

    def plain(self, seed: int) -> PreparedAttacks:
        """Attacks with plain shadow heads (the victim's recipe, no protection), per seed."""
        if seed not in self.plain_attacks:
            self.plain_attacks[seed] = plain_attacks_unit(self.shared, seed)
        return self.plain_attacks[seed]


def run_cell(cell: Cell, session: Session) -> CellOutcome:
    """Release, evaluate and attack one cell in this process; a baseline's cell records its
    seed's reference accuracy, which every later cell's utility loss is measured against."""
    prepared = session.preparation(cell.method, cell.seed)
    outcome = cell_unit(session.shared, cell, prepared, lambda: session.plain(cell.seed))
    if outcome.baseline_accuracy is not None:
        session.reference[cell.seed] = outcome.baseline_accuracy
    if all(row.status != "ok" for row in outcome.rows):
        return outcome
    return dataclasses.replace(
        outcome, rows=with_reference(outcome.rows, session.reference[cell.seed])
    )


@functools.cache
def _load_plugins_once() -> None:
    """Register the plugin methods in a process that runs units (a Ray worker imports only
    what a task names)."""
    load_plugins()
