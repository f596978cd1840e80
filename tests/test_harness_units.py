"""The run's units on their own: the grid, one cell, the writer (issue 12, item 3)."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import pytest
import torch

from alm_opacus.report.results import read_results
from alm_opacus.run.config import RunConfig
from alm_opacus.run.evaluation import CLEAN_SUFFIX
from alm_opacus.run.harness import (
    Cell,
    CellOutcome,
    Session,
    plan_run,
    run_cell,
    spread_by_method,
)
from alm_opacus.run.writer import RunWriter


def plan_cells(config: RunConfig) -> list[Cell]:
    return list(plan_run(config).cells)


def test_the_grid_puts_the_baseline_first_in_every_seed() -> None:
    config = RunConfig(
        methods=("alm", "none", "laplace"), epsilons=(1.0, 2.0), seeds=(3, 4), noise_draws=2
    )
    cells = plan_cells(config)
    methods = ["none", "alm", "alm", "laplace", "laplace", "no-leak"]
    assert [c.method for c in cells[:6]] == methods
    assert cells[0] == Cell("none", math.inf, 3, 1) and cells[6] == Cell("none", math.inf, 4, 1)
    # the no-leak reference closes every seed, released once like the baseline
    assert cells[5] == Cell("no-leak", math.inf, 3, 1)
    assert cells[11] == Cell("no-leak", math.inf, 4, 1)
    assert {c.draws for c in cells if c.method in ("alm", "laplace")} == {2} and len(cells) == 12
    default = plan_cells(RunConfig(methods=("alm",)))
    assert [c.epsilon for c in default[1:-1]] == list(RunConfig().grid)
    # without attacks there is nothing for the reference to measure
    quiet = plan_cells(RunConfig(methods=("alm",), epsilons=(1.0,), attacks=()))
    assert [c.method for c in quiet] == ["none", "alm"]
    # named, it is still released once at epsilon inf, never over the grid
    named = plan_cells(RunConfig(methods=("no-leak", "alm"), epsilons=(1.0, 2.0), attacks=()))
    assert [(c.method, c.epsilon) for c in named] == [
        ("none", math.inf),
        ("alm", 1.0),
        ("alm", 2.0),
        ("no-leak", math.inf),
    ]


def test_cells_side_by_side_start_every_method_first() -> None:
    """Executors that run cells side by side take the first cell of every (method, seed)
    before the second of any (a method's first cell computes what its others share)."""
    config = RunConfig(methods=("alm", "none", "laplace"), epsilons=(1.0, 2.0, 4.0), seeds=(3, 4))
    cells = plan_cells(config)
    spread = spread_by_method(cells)
    assert sorted(spread, key=cells.index) == cells  # a permutation
    names = [(c.method, c.epsilon, c.seed) for c in spread]
    assert names[:8] == [
        ("none", math.inf, 3),
        ("alm", 1.0, 3),
        ("laplace", 1.0, 3),
        ("no-leak", math.inf, 3),
        ("none", math.inf, 4),
        ("alm", 1.0, 4),
        ("laplace", 1.0, 4),
        ("no-leak", math.inf, 4),
    ]
    assert names[8:12] == [
        ("alm", 2.0, 3),
        ("laplace", 2.0, 3),
        ("alm", 2.0, 4),
        ("laplace", 2.0, 4),
    ]
    for group in {(c.method, c.seed) for c in cells}:  # plan order within a (method, seed)
        assert [c for c in spread if (c.method, c.seed) == group] == [
            c for c in cells if (c.method, c.seed) == group
        ]


@pytest.fixture(scope="module")
def session(default_pipeline, shared_cache):  # type: ignore[no-untyped-def]
    config = RunConfig(
        methods=("alm", "gaussian-classic"),
        epsilons=(1.0,),
        noise_draws=2,
        attacks=("loss", "lira-online"),
        options={"m": 6},
        reproducible_noise=True,
        progress=False,
        cache_dir=str(shared_cache),
    )
    return Session.open(plan_run(config), default_pipeline)


def test_the_members_and_non_members_are_views_of_the_evaluation_rows(session) -> None:  # type: ignore[no-untyped-def]
    """One copy of the evaluation rows per input kind: members then non-members, each part
    a view of it with the split's rows and labels."""
    shared, data = session.shared, session.data
    both = shared.inputs("features", "evaluation")
    assert shared.evaluation.features is both
    members = shared.inputs("features", "members")
    nonmembers = shared.inputs("features", "nonmembers")
    assert members.untyped_storage().data_ptr() == both.untyped_storage().data_ptr()
    assert nonmembers.untyped_storage().data_ptr() == both.untyped_storage().data_ptr()
    assert torch.equal(members, data.part("members")[0])
    assert torch.equal(nonmembers, data.part("nonmembers")[0])
    assert torch.equal(shared.labels["members"], data.part("members")[1])
    assert torch.equal(shared.labels["nonmembers"], data.part("nonmembers")[1])
    assert len(members) == shared.evaluation.is_member.sum() == len(data.split.members)


@pytest.mark.slow
def test_one_cell_runs_alone_and_reports_both_attackers(session) -> None:  # type: ignore[no-untyped-def]
    baseline = run_cell(Cell("none", math.inf, 0, 1), session)
    assert [r.attack for r in baseline.rows] == ["loss", "lira-online"]
    assert session.reference[0] == baseline.rows[0].test_accuracy
    outcome = run_cell(Cell("alm", 1.0, 0, 2), session)
    attacks = [r.attack for r in outcome.rows]
    # the noise-aware attacker and the clean-reference attacker, each its own row
    assert attacks == ["loss", "lira-online", f"loss{CLEAN_SUFFIX}", f"lira-online{CLEAN_SUFFIX}"]
    row = outcome.rows[0]
    assert row.noise_draws == 2 and row.status == "ok" and row.neighbouring == "replace-one"
    assert row.noise_std == pytest.approx(row.noise_scale * math.pi / math.sqrt(3))
    assert row.sensitivity_source == "sampled" and row.noise_source == "seeded"
    assert row.utility_loss == pytest.approx(1 - row.test_accuracy / session.reference[0])
    assert set(outcome.rocs) == {("alm", 1.0, a) for a in attacks}


@pytest.mark.slow
def test_an_infeasible_cell_is_one_row_with_its_reason(session) -> None:  # type: ignore[no-untyped-def]
    run_cell(Cell("none", math.inf, 0, 1), session)
    outcome = run_cell(Cell("gaussian-classic", 500.0, 0, 2), session)
    (row,) = outcome.rows
    assert row.status == "infeasible" and "proven only for epsilon < 1" in row.reason
    assert math.isnan(row.test_accuracy) and row.guarantee == "none"
    feasible = run_cell(Cell("gaussian-classic", 0.5, 0, 1), session)
    assert feasible.rows[0].status == "ok" and feasible.rows[0].guarantee == "random-dp"


def test_the_writer_rewrites_every_file_after_a_cell_and_resumes(tmp_path: Path) -> None:
    from alm_opacus.report.results import ResultRow

    config = RunConfig(methods=("alm",), epsilons=(1.0,), out=str(tmp_path))
    out = tmp_path
    settings = plan_run(config).settings
    w = RunWriter(out, settings=settings, resume=False)
    row = ResultRow(
        dataset="digits",
        method="alm",
        epsilon=1.0,
        delta=0.0,
        guarantee="pure-dp",
        sensitivity=1.0,
        noise_scale=1.0,
        seed=0,
        test_accuracy=0.5,
        utility_loss=0.4,
        attack="loss",
        mia_auc=0.55,
    )
    w.add(
        CellOutcome(
            rows=[row],
            rocs={("alm", 1.0, "loss"): ([0.0, 1.0], [0.0, 1.0])},
            chosen={"method": "alm", "epsilon": 1.0, "seed": 0, "config": {"a": 1}},
        )
    )
    assert read_results(out / "results.csv") == [row]
    saved = json.loads((out / "config.json").read_text())
    assert saved["chosen_configs"][0]["config"] == {"a": 1}  # written after the cell, not at end
    assert saved["method_options"]["alm"]["m"] == 200
    assert (out / "tb").is_dir() and not list(out.glob(".tb-*"))
    again = RunWriter(
        out,
        settings=plan_run(RunConfig(methods=("alm",), epsilons=(2.0,), out=str(tmp_path))).settings,
        resume=True,
    )
    assert again.rows == [row] and again.done == {row.cell()}
    assert again.settings["epsilons"] == [1.0, 2.0]  # the grid grows on resume


def test_cells_of_a_large_pool_use_every_thread_and_a_small_one_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A small run's cells are many small ops (one thread); from PARALLEL_POOL_ROWS attacker
    rows up, the attacks run on the process's threads (a large run's products)."""
    import numpy as np
    import torch

    from alm_opacus.attacks import AttackConfig
    from alm_opacus.run import evaluation as ev

    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        assert ev.cell_threads(ev.PARALLEL_POOL_ROWS - 1) == 1
        assert ev.cell_threads(ev.PARALLEL_POOL_ROWS) == 2
        seen: list[int] = []
        monkeypatch.setattr(ev, "prepare_attacks", lambda **_: seen.append(torch.get_num_threads()))
        for threads in (1, 2):
            evaluation = ev.Evaluation(
                features=torch.zeros(2, 3),
                labels=torch.zeros(2, dtype=torch.long),
                is_member=np.array([True, False]),
                pool=(torch.zeros(4, 3), torch.zeros(4, dtype=torch.long)),
                attacks=(),
                num_classes=2,
                config=AttackConfig(),
                threads=threads,
            )
            evaluation.prepare(lambda *a: None, seed=0)  # type: ignore[arg-type,return-value]
        assert seen == [1, 2] and torch.get_num_threads() == 2  # restored after each
    finally:
        torch.set_num_threads(before)


@pytest.mark.slow
def test_the_default_run_keeps_its_cells_on_one_thread(session) -> None:  # type: ignore[no-untyped-def]
    assert len(session.evaluation.pool[0]) < 16_384 and session.evaluation.threads == 1


@pytest.mark.slow
def test_the_adaptive_attacker_is_prepared_beside_the_later_releases(  # type: ignore[no-untyped-def]
    session, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A cell prepares its adaptive attacker on a thread of its own, from the first release,
    while the main thread releases the other draws (a DP-SGD victim's training and the
    attacker's banks then share the cores); the rows are those of one after the other."""
    import threading

    from alm_opacus.run.evaluation import Evaluation

    run_cell(Cell("none", math.inf, 0, 1), session)
    before = run_cell(Cell("alm", 2.0, 0, 2), session)
    method = session.shared.method("alm")
    last_released = threading.Event()
    seen: dict[str, object] = {}
    release, prepare = type(method).release, Evaluation.prepare

    def releasing(self, prepared, request):  # type: ignore[no-untyped-def]
        out = release(self, prepared, request)
        if request.draw == 1:
            last_released.set()
        return out

    def preparing(self, trainer, *, seed):  # type: ignore[no-untyped-def]
        seen["thread"] = threading.current_thread().name
        # on the main thread this would wait for a release that comes only after it
        seen["beside"] = last_released.wait(timeout=20)
        return prepare(self, trainer, seed=seed)

    monkeypatch.setattr(type(method), "release", releasing)
    monkeypatch.setattr(Evaluation, "prepare", preparing)
    outcome = run_cell(Cell("alm", 2.0, 0, 2), session)
    assert seen == {"thread": seen["thread"], "beside": True}
    assert str(seen["thread"]).startswith("adaptive-attacker")
    # the same rows whichever finished first, the attacker or the releases (reproducible noise)
    assert _timeless(outcome.rows) == _timeless(before.rows)


def _timeless(rows: list[object]) -> list[str]:
    return [repr(dataclasses.replace(row, seconds=0.0)) for row in rows]  # type: ignore[type-var]


@pytest.mark.slow
def test_a_dpsgd_attacker_is_prepared_before_the_first_victim_trains(  # type: ignore[no-untyped-def]
    default_pipeline, shared_cache, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A DP-SGD cell knows its adaptive attacker before training
    (``attacker_before_release``): the attacker is prepared beside the first victim's
    training, the rows equal those of a cell that waits for the release, and an attacker that
    differs from the release's stops the cell."""
    import functools
    import threading

    from alm_opacus.run.evaluation import Evaluation

    config = RunConfig(
        methods=("dpsgd",),
        epsilons=(2.0,),
        attacks=("loss",),
        options={"dpsgd.tune": False},
        reproducible_noise=True,
        progress=False,
        cache_dir=str(shared_cache),
    )
    session = Session.open(plan_run(config), default_pipeline)
    run_cell(Cell("none", math.inf, 0, 1), session)
    method = session.shared.method("dpsgd")
    cls = type(method)
    monkeypatch.setattr(cls, "attacker_before_release", lambda self, prepared, request: None)
    late = run_cell(Cell("dpsgd", 2.0, 0, 1), session)
    monkeypatch.undo()

    started = threading.Event()
    seen: dict[str, object] = {}
    release, prepare = cls.release, Evaluation.prepare

    def preparing(self, trainer, *, seed):  # type: ignore[no-untyped-def]
        started.set()
        return prepare(self, trainer, seed=seed)

    def releasing(self, prepared, request):  # type: ignore[no-untyped-def]
        # with the attacker known only from the release, this would wait in vain
        seen["prepared first"] = started.wait(timeout=30)
        return release(self, prepared, request)

    monkeypatch.setattr(Evaluation, "prepare", preparing)
    monkeypatch.setattr(cls, "release", releasing)
    early = run_cell(Cell("dpsgd", 2.0, 0, 1), session)
    assert seen == {"prepared first": True}
    assert _timeless(early.rows) == _timeless(late.rows)

    before = cls.attacker_before_release

    def other(self, prepared, request):  # type: ignore[no-untyped-def]
        factory = before(self, prepared, request)
        return functools.partial(factory.func, **{**factory.keywords, "sigma": 1.0})

    monkeypatch.setattr(cls, "attacker_before_release", other)
    with pytest.raises(RuntimeError, match="attacker_before_release gave"):
        run_cell(Cell("dpsgd", 2.0, 0, 1), session)
