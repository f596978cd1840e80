"""``scripts/reproduce.py``: intervals that hold the split-seed variation, verdicts decided by
interval tests only, and a re-run that agrees and leaves the tracked docs alone."""

from __future__ import annotations

import csv
import importlib.util
import json
import math
import sys
from pathlib import Path
from types import ModuleType

import pytest
from scipy import stats

from alm_opacus.report.results import ResultRow, write_results

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def reproduce() -> ModuleType:
    path = ROOT / "scripts" / "reproduce.py"
    spec = importlib.util.spec_from_file_location("reproduce", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["reproduce"] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def claims(reproduce: ModuleType) -> ModuleType:
    """The claims and run types (scripts/reproduce_claims.py), as reproduce.py imports them."""
    return sys.modules["reproduce_claims"]


def test_combined_interval_is_the_wider_of_within_and_between(
    reproduce: ModuleType, claims: ModuleType
) -> None:
    values, halves = [0.60, 0.64, 0.70], [0.01, 0.01, 0.01]
    got = claims.combine(values, halves)
    mean = sum(values) / 3
    t = stats.t.interval(0.95, df=2, loc=mean, scale=stats.sem(values))  # independent
    assert (got.low, got.high) == pytest.approx(t)
    wide = claims.combine(values, [0.5, 0.5, 0.5])  # within-run noise dominates
    assert wide.high - wide.mean == pytest.approx(0.5 / math.sqrt(3))
    one = claims.combine([0.6], [0.05])
    assert (one.low, one.high) == pytest.approx((0.55, 0.65))


def _row(method: str, epsilon: float, *, loss: float, acc: float, auc: float) -> list[ResultRow]:
    base = ResultRow(
        dataset="digits",
        method=method,
        epsilon=epsilon,
        delta=1e-5,
        guarantee="none" if method == "none" else "random-dp",
        sensitivity=1.0,
        noise_scale=1.0,
        seed=0,
        test_accuracy=0.9 * (1 - loss),
        utility_loss=loss,
        noise_draws=5,
        test_accuracy_std=0.01,
    )
    return [
        base.replace(
            attack="loss",
            mia_accuracy=acc,
            mia_auc=auc,
            mia_auc_ci_low=auc - 0.05,
            mia_auc_ci_high=auc + 0.05,
        )
    ]


def _run(folder: Path, seed: int, shift: float) -> Path:
    """A run folder of one split seed; ``shift`` moves every point estimate a little."""
    folder.mkdir(parents=True)
    config = {
        "dataset": "digits",
        "split_seed": seed,
        "split": {"members": 150, "nonmembers": None, "attacker": 300, "public": 600},
    }
    (folder / "config.json").write_text(json.dumps(config))
    rows = _row("none", math.inf, loss=0.0, acc=0.66 + shift, auc=0.70 + shift)
    for method, extra in (("alm", 0.0), ("laplace", 0.01), ("gaussian", -0.3)):
        for epsilon, loss in ((0.1, 0.88), (100.0, 0.35), (1000.0, 0.0)):
            value = min(max(loss + extra * (epsilon > 1), 0.0), 0.99) + shift
            rows += _row(method, epsilon, loss=value, acc=0.55 + shift, auc=0.6 + shift)
    write_results(folder / "results.csv", rows)
    return folder


def test_verdicts_and_reasons_move_only_with_their_interval_tests(
    reproduce: ModuleType, tmp_path: Path, claims: ModuleType
) -> None:
    """Shifting every point estimate by 0.004 (well inside each interval) changes numbers but
    neither a verdict nor its sentence."""
    found = {}
    for name, shift in (("a", 0.0), ("b", 0.004)):
        runs = claims.Runs(
            [claims.Run(_run(tmp_path / name / f"s{s}", s, shift * (s + 1))) for s in (0, 1, 2)]
        )
        found[name] = [(c.verdict, c.why) for c in (make(runs) for make in claims.CLAIMS)]
    assert found["a"] == found["b"]
    verdicts = dict(
        zip([m.__name__ for m in claims.CLAIMS], [v for v, _ in found["a"]], strict=True)
    )
    assert verdicts["unprotected_vulnerable"] == claims.HOLDS  # 0.66 meets [0.61, 0.71]
    assert verdicts["figure1"] == claims.FAILS  # the Gaussian loses less, not more


def _verdicts(folder: Path) -> list[tuple[str, str, str]]:
    record = json.loads((folder / "reproduce.json").read_text())
    return [(c["dataset"], c["claim"], c["verdict"]) for c in record["claims"]]


@pytest.mark.slow
def test_a_rerun_agrees_and_leaves_the_docs_alone(
    reproduce: ModuleType, tmp_path: Path, shared_cache: Path, claims: ModuleType
) -> None:
    docs = (ROOT / "docs" / "results.md").read_bytes()
    args = [
        "--datasets",
        "digits",
        "--split-seeds",
        "0",
        "--methods",
        "alm,laplace,gaussian",
        "--compare-args",
        f"--epsilons 100,1000 --attacks loss --noise-draws 2 --m 16 --cache-dir {shared_cache}",
    ]
    for name in ("first", "second"):
        assert reproduce.main([*args, "--out", str(tmp_path / name)]) == 0
    first, second = _verdicts(tmp_path / "first"), _verdicts(tmp_path / "second")
    assert first == second and len(first) == len(claims.CLAIMS) + 1
    with (
        open(tmp_path / "first" / "digits-split0" / "results.csv", newline="") as a,
        open(tmp_path / "second" / "digits-split0" / "results.csv", newline="") as b,
    ):  # seeded noise: the same releases, so the same numbers
        keep = ("method", "epsilon", "attack", "test_accuracy", "mia_auc")
        assert [[r[k] for k in keep] for r in csv.DictReader(a)] == [
            [r[k] for k in keep] for r in csv.DictReader(b)
        ]
    assert (ROOT / "docs" / "results.md").read_bytes() == docs  # only --update-docs writes it
