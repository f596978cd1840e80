"""The run plan (issue 36, item 1): a RunConfig resolved once into objects, and nothing below
it resolving a name again."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

from alm_opacus.attacks.registry import ATTACKS
from alm_opacus.method_base import Method
from alm_opacus.methods import METHODS, NoProtection
from alm_opacus.posttraining.method import PostTrainingMethod
from alm_opacus.report.results import read_results
from alm_opacus.run.config import RunConfig
from alm_opacus.run.harness import run
from alm_opacus.run.plan import RunPlan, plan_run


def test_the_plan_holds_method_objects_with_their_options(tmp_path: Path) -> None:
    config = RunConfig(
        methods=("laplace", "alm"),
        epsilons=(1.0, 4.0),
        seeds=(0, 1),
        options={"m": 7},
        attacks=("loss",),
        out=str(tmp_path / "run"),
    )
    plan = plan_run(config)
    assert isinstance(plan, RunPlan)
    assert list(plan.methods) == ["none", "laplace", "alm", "no-leak"]
    assert all(isinstance(m, Method) for m in plan.methods.values())
    assert isinstance(plan.methods["none"], NoProtection)
    alm = plan.method("alm")
    assert isinstance(alm, PostTrainingMethod) and alm.options.m == 7
    assert plan.baselines == ("none",) and plan.references == ("no-leak",)
    assert [a.name for a in plan.attacks] == ["loss"]
    # the split, the data and delta are the plan's: min(1e-5, 1/(10 n)) for n members
    members = len(plan.split.members)
    assert plan.delta == min(1e-5, 1 / (10 * members))
    assert plan.dataset.num_classes == 10 and plan.facts.num_classes == 10
    assert plan.facts.members == members
    # cells: per seed the baseline, the protections over the grid, the reference
    assert len(plan.cells) == 2 * (1 + 2 * 2 + 1)
    assert plan.cells[0].method == "none" and math.isinf(plan.cells[0].epsilon)
    assert [c.method for c in plan.cells[1:5]] == ["laplace", "laplace", "alm", "alm"]
    # config.json's settings are the plan's facts: the methods and their resolved options
    assert plan.settings["methods"] == list(plan.methods)
    assert plan.settings["method_options"]["alm"]["m"] == 7
    assert plan.settings["num_classes"] == 10
    assert plan.hparams["sensitivity"] == "sampled"
    assert not (tmp_path / "run").exists()  # planning writes nothing


def test_planning_refuses_what_the_objects_cannot_do(tmp_path: Path) -> None:
    out = str(tmp_path / "run")
    with pytest.raises(ValueError, match=r"--delta=0 cannot be met by gaussian"):
        plan_run(RunConfig(methods=("alm", "gaussian"), delta=0.0, out=out))
    # the sampled sensitivity draws from the public split: too few rows are named
    with pytest.raises(ValueError, match=r"--split: public=1 is too small: alm's sensitivity"):
        plan_run(RunConfig(methods=("alm",), split=_sizes(public=1), out=out))
    # the analytic sensitivity does not need the public split
    plan_run(
        RunConfig(
            methods=("alm",), split=_sizes(public=1), options={"sensitivity": "analytic"}, out=out
        )
    )
    assert not (tmp_path / "run").exists()


def _sizes(**parts: int) -> Any:
    from dataclasses import replace

    return replace(RunConfig().split_sizes, **parts)


@pytest.mark.slow
def test_below_the_plan_no_name_is_resolved(
    tmp_path: Path, shared_cache: Path, default_pipeline: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Once planned, a run completes with the method and attack registries emptied: the
    driver, the units and the writer get objects, never names to look up."""
    config = RunConfig(
        methods=("alm",),
        epsilons=(2.0,),
        noise_draws=1,
        attacks=("loss",),
        options={"m": 6},
        cache_dir=str(shared_cache),
        out=str(tmp_path / "run"),
        progress=False,
        reproducible_noise=True,
    )
    plan = plan_run(config)
    for registry in (METHODS, ATTACKS):
        monkeypatch.setattr(registry, "_items", {})
        monkeypatch.setattr(registry, "_load", None)
    result = run(plan)
    rows = read_results(tmp_path / "run" / "results.csv")
    assert {r.method for r in rows} == {"none", "alm", "no-leak"}
    assert [r.cell() for r in rows] == [r.cell() for r in result.rows]
    assert {r.attack for r in rows} == {"loss", "loss-clean"}
    with pytest.raises(ValueError, match="unknown"):  # the registries really were empty
        METHODS["alm"]
