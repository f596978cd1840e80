"""TensorBoard output read back with TensorBoard's own loader (the plugin event multiplexer
its server uses): the trade-off series holds every (method, epsilon) point at its utility
step, one run per method with every point at its log-spaced epsilon step, one hparams
session per point, runs ordered so that each method gets its own colour, and ``tb/`` holds
exactly the rows it was last written from."""

from __future__ import annotations

import importlib.util
import json
import math
import re
import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any
from urllib.parse import parse_qs, urlsplit

import numpy as np
import pytest
from tensorboard.backend.event_processing.plugin_event_multiplexer import EventMultiplexer
from tensorboard.plugins.custom_scalar import layout_pb2
from tensorboard.plugins.hparams import metadata as hparams_metadata
from tensorboard.util import tensor_util

from alm_opacus.report import events
from alm_opacus.report.draws import DrawRecord
from alm_opacus.report.plots import write_plots
from alm_opacus.report.results import ResultRow
from alm_opacus.report.series import NO_LEAK, Point, Stat, points
from alm_opacus.report.tensorboard import (
    HPARAM_COLUMNS,
    NO_LEAK_RUN,
    POLYMER_PALETTE,
    README_TAG,
    TIME_SERIES_PALETTE,
    TRADEOFF_EPSILON_TAG,
    TRADEOFF_TAG,
    EpsilonAxis,
    coloured_runs,
    dashboard_urls,
    run_label,
    run_order,
    tradeoff_steps,
    write_tensorboard,
)

ROOT = Path(__file__).resolve().parents[2]
EPSILONS = (0.1, 1.0, 10.0, 100.0, 1000.0, 10000.0)
METHODS = ("alm", "laplace", "dpsgd")
#: Scalars are stored as float32: values agree with the rows to float32 rounding.
F32 = 1e-6

RowsFactory = Callable[..., list[ResultRow]]


def load(logdir: Path) -> EventMultiplexer:
    """Every run under ``logdir``, keeping every sample (no reservoir downsampling)."""
    guidance = {"scalars": 0, "text": 0, "images": 0, "hparams": 0, "custom_scalars": 0}
    mux = EventMultiplexer(tensor_size_guidance=guidance)
    mux.AddRunsFromDirectory(str(logdir))
    mux.Reload()
    return mux


def series(mux: EventMultiplexer, run: str, tag: str) -> dict[int, float]:
    events_ = mux.Tensors(run, tag)
    steps = [e.step for e in events_]
    assert len(steps) == len(set(steps)), f"{run}/{tag}: a step was logged twice"
    return {e.step: float(tensor_util.make_ndarray(e.tensor_proto)) for e in events_}


def label_of(rows: list[ResultRow], method: str) -> str:
    first = next(r for r in rows if r.method == method)
    return run_label(method, first.guarantee, first.neighbouring)


def cell(rows: list[ResultRow], method: str, epsilon: float, seed: int) -> list[ResultRow]:
    return [r for r in rows if (r.method, r.epsilon, r.seed) == (method, epsilon, seed)]


def step(epsilon: float) -> int:
    """The stated x axis: 100 steps per decade from 0.1, the grid's lowest power of ten."""
    return round(100 * math.log10(epsilon / 0.1))


def draws_of(rows: list[ResultRow]) -> list[DrawRecord]:
    """Two releases per cell, each with values that differ per draw."""
    out = []
    for method, epsilon, seed in sorted({(r.method, r.epsilon, r.seed) for r in rows}):
        this = cell(rows, method, epsilon, seed)
        for draw in range(2):
            out.append(
                DrawRecord(
                    method=method,
                    epsilon=epsilon,
                    seed=seed,
                    draw=draw,
                    test_accuracy=this[0].test_accuracy + 0.001 * draw,
                    mia_auc=max(r.mia_auc for r in this) - 0.002 * draw,
                    mia_accuracy=0.6,
                    tpr_at_fpr_0_01=0.02,
                    tpr_at_fpr_0_001=math.nan,
                    attack="loss",
                )
            )
    return out


@pytest.fixture
def written(tmp_path: Path, synthetic_rows: RowsFactory) -> tuple[list[ResultRow], Path]:
    rows = synthetic_rows(methods=METHODS, seeds=(0, 1), epsilons=EPSILONS)
    logdir = write_tensorboard(
        rows, tmp_path / "tb", epsilons=EPSILONS, hparams={"m": 16}, draws=draws_of(rows)
    )
    return rows, logdir


def test_every_method_epsilon_point_is_at_its_log_step(
    written: tuple[list[ResultRow], Path],
) -> None:
    rows, logdir = written
    mux = load(logdir)
    for method in METHODS:
        run = label_of(rows, method)
        loss, auc = series(mux, run, "utility_loss"), series(mux, run, "best/mia_auc")
        shown, seeds = series(mux, run, "grid/epsilon"), series(mux, run, "seeds")
        assert sorted(loss) == sorted(auc) == sorted(shown) == [step(e) for e in EPSILONS]
        for epsilon in EPSILONS:
            k = step(epsilon)
            # the mean over seeds of each seed's strongest attack (largest AUC of its rows)
            per_seed = [max(r.mia_auc for r in cell(rows, method, epsilon, s)) for s in (0, 1)]
            assert auc[k] == pytest.approx(np.mean(per_seed), rel=F32)
            losses = [cell(rows, method, epsilon, s)[0].utility_loss for s in (0, 1)]
            assert loss[k] == pytest.approx(np.mean(losses), rel=F32)
            assert shown[k] == pytest.approx(epsilon, rel=F32) and seeds[k] == 2
            for attack in {r.attack for r in cell(rows, method, epsilon, 0)}:
                both = [
                    r.mia_auc
                    for r in rows
                    if (r.method, r.epsilon, r.attack) == (method, epsilon, attack)
                ]
                per_attack = series(mux, run, f"attack/{attack}/mia_auc")
                assert per_attack[k] == pytest.approx(np.mean(both), rel=F32)


def test_one_run_per_method(written: tuple[list[ResultRow], Path]) -> None:
    rows, logdir = written
    runs = {r for r in load(logdir).Runs() if not r.startswith("hparams/") and r != "."}
    assert runs == {label_of(rows, m) for m in ("none", *METHODS)}
    assert "dpsgd [approx-dp, add-remove]" in runs and "alm [random-dp]" in runs


def test_epsilon_axis_is_log_spaced_and_stated() -> None:
    axis = EpsilonAxis([0.1, 1.0, 10.0, 1e4])
    assert axis.steps == [0, 100, 200, 500] and axis.origin == 0.1
    assert "x = 100·log10(ε/0.1)" in axis.caption() and "100 ↔ ε=1" in axis.caption()
    close = EpsilonAxis([1.0, 1.01, 3.0])  # 100 per decade puts 1 and 1.01 on one step
    assert close.per_decade == 1000 and len(set(close.steps)) == 3
    for epsilon, k in zip(close.grid, close.steps, strict=True):
        assert close.epsilon(k) == pytest.approx(epsilon, rel=2e-3)
    assert EpsilonAxis([0.003, 5.0]).steps == [48, 370]  # origin 0.001


def test_add_remove_runs_carry_their_replace_one_epsilon(
    written: tuple[list[ResultRow], Path],
) -> None:
    _, logdir = written
    mux = load(logdir)
    run = "dpsgd [approx-dp, add-remove]"
    converted = series(mux, run, "grid/epsilon_replace_one")
    for epsilon in EPSILONS:
        assert converted[step(epsilon)] == pytest.approx(2 * epsilon, rel=F32)  # group privacy
    weak = series(mux, run, "grid/weak_guarantee")
    assert [weak[step(e)] for e in EPSILONS] == [0, 0, 1, 1, 1, 1]  # 2 * 10 > 10
    assert series(mux, "laplace [pure-dp]", "grid/weak_guarantee")[step(10.0)] == 0


def test_baseline_is_drawn_across_the_grid(written: tuple[list[ResultRow], Path]) -> None:
    rows, logdir = written
    mux = load(logdir)
    unprotected = np.mean([max(r.mia_auc for r in cell(rows, "none", math.inf, s)) for s in (0, 1)])
    flat = series(mux, "none [none]", "best/mia_auc")
    assert flat == pytest.approx({step(e): unprotected for e in EPSILONS}, rel=F32)


def test_rewrite_holds_only_the_current_rows(tmp_path: Path, synthetic_rows: RowsFactory) -> None:
    logdir = tmp_path / "tb"
    write_tensorboard(synthetic_rows(), logdir, epsilons=EPSILONS)
    fewer = synthetic_rows(methods=("alm",), seeds=(0,), epsilons=(1.0, 10.0))
    write_tensorboard(fewer, logdir, epsilons=(1.0, 10.0))
    mux = load(logdir)
    runs = {r for r in mux.Runs() if not r.startswith("hparams/")}
    assert runs == {".", "alm [random-dp]", "none [none]"}
    assert series(mux, "alm [random-dp]", "grid/epsilon") == pytest.approx({0: 1, 100: 10})
    assert len([r for r in mux.Runs() if r.startswith("hparams/")]) == 3
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tb"]  # no temporary folder left
    assert len(list(logdir.rglob("events.out.tfevents.*"))) == len(mux.Runs())


def test_failed_rewrite_leaves_the_previous_folder(
    tmp_path: Path, synthetic_rows: RowsFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    logdir = tmp_path / "tb"
    write_tensorboard(synthetic_rows(methods=("alm",)), logdir, epsilons=EPSILONS)
    before = {p.relative_to(logdir): p.read_bytes() for p in logdir.rglob("*") if p.is_file()}
    calls = {"n": 0}
    real = events.write_run

    def dies(*args: object, **kwargs: object) -> None:
        calls["n"] += 1
        if calls["n"] == 3:
            raise KeyboardInterrupt
        real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(events, "write_run", dies)
    with pytest.raises(KeyboardInterrupt):
        write_tensorboard(synthetic_rows(), logdir, epsilons=EPSILONS)
    after = {p.relative_to(logdir): p.read_bytes() for p in logdir.rglob("*") if p.is_file()}
    assert after == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tb"]


def test_a_symlinked_logdir_is_replaced_not_followed(
    tmp_path: Path, synthetic_rows: RowsFactory
) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "keep.txt").write_text("not ours")
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "tb").symlink_to(elsewhere)
    write_tensorboard(synthetic_rows(methods=("alm",)), tmp_path / "out" / "tb", epsilons=())
    assert not (tmp_path / "out" / "tb").is_symlink()
    assert [p.name for p in elsewhere.iterdir()] == ["keep.txt"]


def test_logdir_that_is_a_file_is_refused(tmp_path: Path, synthetic_rows: RowsFactory) -> None:
    (tmp_path / "tb").write_text("a file")
    with pytest.raises(ValueError, match="not a folder"):
        write_tensorboard(synthetic_rows(), tmp_path / "tb", epsilons=EPSILONS)
    assert (tmp_path / "tb").read_text() == "a file"


def test_infeasible_cells_are_gaps_and_listed(tmp_path: Path, synthetic_rows: RowsFactory) -> None:
    rows = synthetic_rows(methods=("laplace",), infeasible=[("laplace", 10000.0)])
    mux = load(write_tensorboard(rows, tmp_path / "tb", epsilons=EPSILONS))
    assert sorted(series(mux, "laplace [pure-dp]", "utility_loss")) == [
        step(e) for e in EPSILONS[:5]
    ]
    (event,) = mux.Tensors(".", README_TAG)
    text = tensor_util.make_ndarray(event.tensor_proto).item().decode()
    assert "laplace at epsilon 10000, seed 0: no noise scale" in text
    assert "hparams/laplace/eps=10000" not in mux.Runs()  # no point, no session
    assert "hparams/laplace/eps=1000" in mux.Runs()


@pytest.mark.slow
def test_plots_are_shown_as_images(tmp_path: Path, synthetic_rows: RowsFactory) -> None:
    rows = synthetic_rows(methods=("alm",), seeds=(0,))
    fpr = list(np.linspace(0, 1, 11))
    rocs = {("alm", e, "loss"): (fpr, fpr) for e in EPSILONS}
    plots = tmp_path / "plots"
    write_plots(rows, rocs, plots)
    mux = load(write_tensorboard(rows, tmp_path / "tb", epsilons=EPSILONS, images=plots))
    images = {t for t in mux.Runs()["."]["tensors"] if t.startswith("plots/")}
    expected = {
        f"plots/{p.relative_to(plots).with_suffix('').as_posix()}" for p in plots.rglob("*.png")
    }
    assert images == expected and "plots/equal_noise" in images
    (event,) = mux.Tensors(".", "plots/roc_loglog")
    blob = tensor_util.make_ndarray(event.tensor_proto)[2]  # [width, height, png]
    assert blob == (plots / "roc_loglog.png").read_bytes()


def with_no_leak(rows: list[ResultRow], *, shift: float = 0.12) -> list[ResultRow]:
    """``rows`` with a no-leak reference release per seed: the baseline's rows, renamed,
    with a lower AUC and its interval."""
    return rows + [
        r.replace(
            method=NO_LEAK,
            test_accuracy=r.test_accuracy - 0.05,
            mia_auc=r.mia_auc - shift,
            mia_auc_ci_low=r.mia_auc_ci_low - shift,
            mia_auc_ci_high=r.mia_auc_ci_high - shift,
        )
        for r in rows
        if r.method == "none"
    ]


def per_mille(point: Point) -> int:
    return round(point.test_accuracy.mean * 1000)


def read_me_text(mux: EventMultiplexer) -> str:
    (event,) = mux.Tensors(".", README_TAG)
    return str(tensor_util.make_ndarray(event.tensor_proto).item().decode())


def test_tradeoff_series_holds_every_point_at_its_utility_step(
    written: tuple[list[ResultRow], Path],
) -> None:
    """The trade-off chart: for every (method, epsilon) of the rows, the strongest attack's
    AUC (the same numbers as the table: ``series.points``) at step round(accuracy x 1000),
    in the method's run, and nothing else in that series."""
    rows, logdir = written
    mux = load(logdir)
    found = points(rows)
    assert len(found) == 1 + len(METHODS) * len(EPSILONS)
    for method in ("none", *METHODS):
        mine = [p for p in found if p.method == method]
        auc = series(mux, label_of(rows, method), TRADEOFF_TAG)
        assert auc == pytest.approx({per_mille(p): p.mia_auc.mean for p in mine}, rel=F32)
        if method == "none":  # no guarantee, no ε′
            assert TRADEOFF_EPSILON_TAG not in mux.Runs()[label_of(rows, method)]["tensors"]
        else:
            log_eps = series(mux, label_of(rows, method), TRADEOFF_EPSILON_TAG)
            expected = {per_mille(p): math.log10(p.epsilon_common) for p in mine}
            assert log_eps == pytest.approx(expected, rel=F32)
        low = series(mux, label_of(rows, method), f"{TRADEOFF_TAG}/low")
        assert low == pytest.approx({per_mille(p): p.mia_auc.low for p in mine}, rel=F32)
    # the steps are the accuracies: 0.1 + 0.8 * level (+ a code) for the methods, 0.925 for none
    assert sorted(series(mux, "alm [random-dp]", TRADEOFF_TAG)) == [101, 261, 421, 581, 741, 901]
    assert list(series(mux, "none [none]", TRADEOFF_TAG)) == [925]
    tagged = {r for r, kinds in mux.Runs().items() if TRADEOFF_TAG in kinds["tensors"]}
    assert tagged == {label_of(rows, m) for m in ("none", *METHODS)}  # one run per method


def test_tradeoff_steps_keep_every_epsilon_of_one_utility() -> None:
    """Two epsilons of a method at one per-mille step: the larger goes to the next free
    step, so both stay on the chart; other methods keep their own steps."""

    def point(method: str, epsilon: float, accuracy: float) -> Point:
        s = Stat(accuracy, accuracy, accuracy, "")
        return Point(
            method,
            "pure-dp",
            "replace-one",
            epsilon,
            epsilon,
            0.0,
            0.0,
            (0,),
            s,
            s,
            s,
            s,
            s,
            s,
            0.0,
            math.nan,
            0.0,
            0.0,
        )

    found = [
        point("a", 100.0, 0.9201),
        point("a", 10.0, 0.9204),
        point("a", 1000.0, 0.92),
        point("a", 1.0, 0.921),
        point("b", 10.0, 0.92),
        point("a", 0.1, math.nan),
    ]
    steps = {(t.method, t.epsilon): (t.step, t.wanted) for t in tradeoff_steps(found)}
    assert steps == {
        ("a", 1.0): (921, 921),
        ("a", 10.0): (920, 920),
        ("a", 100.0): (922, 920),
        ("a", 1000.0): (923, 920),
        ("b", 10.0): (920, 920),
    }


def test_a_shared_utility_step_is_read_back_and_listed(
    tmp_path: Path, synthetic_rows: RowsFactory
) -> None:
    rows = synthetic_rows(methods=("alm",), seeds=(0,), epsilons=(1.0, 10.0, 100.0))
    top = next(r for r in rows if r.method == "alm" and r.epsilon == 100.0).test_accuracy
    rows = [r.replace(test_accuracy=top) if r.epsilon == 10.0 else r for r in rows]
    mux = load(write_tensorboard(rows, tmp_path / "tb", epsilons=(1.0, 10.0, 100.0)))
    k = round(top * 1000)
    auc = series(mux, "alm [random-dp]", TRADEOFF_TAG)
    best = {
        e: max(r.mia_auc for r in rows if (r.method, r.epsilon) == ("alm", e))
        for e in (10.0, 100.0)
    }
    assert auc[k] == pytest.approx(best[10.0], rel=F32)
    assert auc[k + 1] == pytest.approx(best[100.0], rel=F32)
    assert len(auc) == 3
    assert f"alm at ε = 100: step {k + 1} (accuracy ×1000 rounds to {k})" in read_me_text(mux)


def test_no_leak_reference_is_a_flat_run_never_a_method(
    tmp_path: Path, synthetic_rows: RowsFactory
) -> None:
    rows = with_no_leak(synthetic_rows(methods=("alm", "dpsgd"), seeds=(0, 1)))
    mux = load(write_tensorboard(rows, tmp_path / "tb", epsilons=EPSILONS, draws=draws_of(rows)))
    reference = [r for r in rows if r.method == NO_LEAK]
    auc = np.mean([max(r.mia_auc for r in reference if r.seed == s) for s in (0, 1)])
    steps = [per_mille(p) for p in points(rows)]
    flat = series(mux, NO_LEAK_RUN, TRADEOFF_TAG)
    assert flat == pytest.approx({min(steps): auc, max(steps): auc}, rel=F32)
    assert series(mux, NO_LEAK_RUN, "best/mia_auc") == pytest.approx(
        {step(e): auc for e in EPSILONS}, rel=F32
    )
    tags = set(mux.Runs()[NO_LEAK_RUN]["tensors"])
    assert not any(t.startswith(("grid/", "attack/", "noise")) for t in tags)  # no guarantee
    assert TRADEOFF_EPSILON_TAG not in tags
    assert not any(NO_LEAK in r for r in mux.Runs() if r.startswith("hparams/"))
    text = read_me_text(mux)
    assert f"`{NO_LEAK_RUN}` is flat across the utility range" in text
    assert f"({auc:.3f}, 95% interval" in text and "| no-leak |" not in text


def test_read_me_flags_weak_per_method_on_replace_one(
    written: tuple[list[ResultRow], Path],
) -> None:
    """DP-SGD's epsilon = 10 is replace-one 20 with delta' = (1 + e^10) 1e-5 = 0.22: weak;
    ALM's epsilon = 10 is not. Each row gives the step, the asked and the replace-one
    guarantee."""
    _, logdir = written
    text = read_me_text(load(logdir))
    assert "| 200 | 10 | dpsgd | 20 | 0.22 | **weak** |" in text
    assert "| 200 | 10 | alm | 10 | 1e-05 |  |" in text
    assert "| 100 | 1 | dpsgd | 2 | 3.7e-05 |  |" in text
    assert "| 300 | 100 | dpsgd | 200 | ≥ 1 (proves nothing) | **weak** |" in text
    assert "x = 100·log10(ε/0.1)" in text and "smoothing off" in text
    assert "random DP: not a DP guarantee" in text


def test_read_me_weak_line_uses_the_member_count(
    tmp_path: Path, synthetic_rows: RowsFactory
) -> None:
    rows = synthetic_rows(methods=("dpsgd",), seeds=(0,), epsilons=(1.0, 3.0))
    # delta' = (1 + e^3) 1e-5 = 2.1e-4: weak under 1/n for n = 10_000, not for n = 150
    for members, mark in ((150, ""), (10_000, "**weak**")):
        mux = load(
            write_tensorboard(rows, tmp_path / str(members), epsilons=(1.0, 3.0), members=members)
        )
        assert f"| 48 | 3 | dpsgd | 6 | 0.00021 | {mark} |" in read_me_text(mux)
        weak = series(mux, "dpsgd [approx-dp, add-remove]", "grid/weak_guarantee")
        assert weak == {0: 0.0, 48: float(bool(mark))}


def _hparams(mux: EventMultiplexer, run: str, tag: str) -> object:
    content = mux.SummaryMetadata(run, tag).plugin_data.content
    if tag == hparams_metadata.EXPERIMENT_TAG:
        return hparams_metadata.parse_experiment_plugin_data(content)
    return hparams_metadata.parse_session_start_info_plugin_data(content)


def test_hparams_has_one_session_per_point_with_method_shown(
    written: tuple[list[ResultRow], Path],
) -> None:
    rows, logdir = written
    mux = load(logdir)
    experiment = _hparams(mux, ".", hparams_metadata.EXPERIMENT_TAG)
    infos = list(experiment.hparam_infos)  # type: ignore[attr-defined]
    assert [i.name for i in infos] == list(HPARAM_COLUMNS) and all(i.differs for i in infos)
    # TensorBoard 2.21 sorts by (not differs, name) and shows the first five
    shown = sorted(infos, key=lambda i: (not i.differs, i.name))[:5]
    assert "method" in [i.name for i in shown]
    assert {i.name: i.display_name for i in infos}["epsilon_replace_one"] == "ε′ (replace-one)"
    metrics = [m.name.tag for m in experiment.metric_infos]  # type: ignore[attr-defined]
    assert metrics[:2] == ["hparams/mia_auc", "hparams/test_accuracy"]  # colours by the first
    sessions = sorted(r for r in mux.Runs() if r.startswith("hparams/"))
    found = points(rows)
    assert len(sessions) == len(found) == 19  # one per table line, not one per release
    for p in found:
        name = f"hparams/{p.method}/eps={p.epsilon:g}"
        start = _hparams(mux, name, hparams_metadata.SESSION_START_INFO_TAG)
        hp = start.hparams  # type: ignore[attr-defined]
        assert hp["method"].string_value == p.method and hp["m"].number_value == 16
        assert hp["releases"].number_value == 4  # two seeds x two draws
        if math.isinf(p.epsilon):  # JSON has no inf, and no guarantee is neither weak nor not
            assert "epsilon" not in hp and "weak_guarantee" not in hp
        else:
            assert hp["epsilon_replace_one"].number_value == pytest.approx(p.epsilon_common)
            assert hp["weak_guarantee"].bool_value == p.weak
        assert series(mux, name, "hparams/mia_auc")[0] == pytest.approx(p.mia_auc.mean, rel=F32)
        assert series(mux, name, "hparams/test_accuracy")[0] == pytest.approx(
            p.test_accuracy.mean, rel=F32
        )


def test_layout_puts_the_tradeoff_first_on_logged_tags(
    written: tuple[list[ResultRow], Path],
) -> None:
    _, logdir = written
    mux = load(logdir)
    (event,) = mux.Tensors(".", "custom_scalars__config__")
    layout = layout_pb2.Layout()
    layout.ParseFromString(tensor_util.make_ndarray(event.tensor_proto).item())
    tags = {t for run, kinds in mux.Runs().items() for t in kinds["tensors"]}
    first = layout.category[0].chart[0]
    assert [t for t in first.multiline.tag if re.search(t, TRADEOFF_TAG)] == list(
        first.multiline.tag
    )
    assert "test accuracy ×1000" in first.title and "AUC of the strongest attack" in first.title
    assert "x = 100·log10(ε/0.1)" in layout.category[1].title
    by_epsilon = [
        list(c.multiline.tag) for c in layout.category[1].chart if c.HasField("multiline")
    ]
    for metric in ("test_accuracy", "utility_loss", "best/mia_auc", "best/tpr_at_fpr_0\\.01"):
        assert [f"^{metric}$"] in by_epsilon, metric
    assert [r"^grid/log10_epsilon$", r"^grid/log10_epsilon_replace_one$"] in by_epsilon
    for chart in (c for category in layout.category for c in category.chart):
        if chart.HasField("multiline"):
            for regex in chart.multiline.tag:
                assert any(re.search(regex, t) for t in tags), (chart.title, regex)
        else:
            for s in chart.margin.series:
                assert {s.value, s.lower, s.upper} <= tags, chart.title


def test_epsilon_is_charted_as_log10(written: tuple[list[ResultRow], Path]) -> None:
    _, logdir = written
    mux = load(logdir)
    shown = series(mux, "dpsgd [approx-dp, add-remove]", "grid/log10_epsilon_replace_one")
    assert shown == pytest.approx({step(e): math.log10(2 * e) for e in EPSILONS}, rel=F32)


def listing(mux: EventMultiplexer) -> list[str]:
    """The runs in the order TensorBoard 2.21 lists them (``core_plugin._serve_runs``: by
    start time, the first event's wall time, then by name), which sets their colours."""
    return sorted(mux.Runs(), key=lambda r: (mux.FirstEventTimestamp(r), r))


def test_every_method_gets_its_own_colour_in_both_views(
    tmp_path: Path, synthetic_rows: RowsFactory
) -> None:
    """Custom Scalars colours the run at list position i with POLYMER_PALETTE[i % 7]; Time
    Series gives each colour group of the link's ``runColorGroup`` the next colour. Before
    this ordering ``alm`` and ``none`` shared a blue."""
    rows = with_no_leak(synthetic_rows())
    mux = load(write_tensorboard(rows, tmp_path / "tb", epsilons=EPSILONS, draws=draws_of(rows)))
    listed = listing(mux)
    polymer = {run: POLYMER_PALETTE[k % 7] for k, run in enumerate(listed)}
    coloured = coloured_runs(rows)
    assert coloured == [
        "alm [random-dp]",
        "laplace [pure-dp]",
        "dpsgd [approx-dp, add-remove]",
        "none [none]",
        NO_LEAK_RUN,
    ]
    assert [polymer[r] for r in coloured] == ["#ff7043", "#0077bb", "#009988", "#ee3377", "#bbbbbb"]
    query = parse_qs(urlsplit(dashboard_urls()["time series"]).query)
    group = re.compile(query["runColorGroup"][0].removeprefix("regex:"))
    groups = list(dict.fromkeys(m.group(1) for r in listed if (m := group.search(r))))
    assert sorted(groups) == sorted(coloured)  # the sessions and the root take no colour
    series_colours = [TIME_SERIES_PALETTE[groups.index(r) % 7] for r in coloured]
    assert len(set(series_colours)) == len(coloured)


def test_run_order_falls_back_when_slots_run_out(synthetic_rows: RowsFactory) -> None:
    rows = synthetic_rows(methods=("alm",), seeds=(0,), epsilons=(1.0, 10.0))
    many = rows + [r.replace(method=f"m{k}") for k in range(6) for r in rows if r.method == "alm"]
    coloured = coloured_runs(many)
    assert len(coloured) == 8  # seven methods and none: in order, colours repeat after 7
    assert run_order(many, ["."]) == [*coloured, "."]
    # one method, the baseline and the reference need slots 0, 4 and 6: gaps to fill
    few = with_no_leak(rows)
    assert run_order(few, [".", "s1", "s2", "s3", "s4"]) == [
        "alm [random-dp]",
        ".",
        "s1",
        "s2",
        "none [none]",
        "s3",
        NO_LEAK_RUN,
        "s4",
    ]
    assert run_order(few, [".", "s1"]) == [*coloured_runs(few), ".", "s1"]  # too few to fill


def test_dashboard_links_show_the_tradeoff_first(written: tuple[list[ResultRow], Path]) -> None:
    """The links' filters are JavaScript regexes; these patterns mean the same in Python's
    ``re`` (anchors, groups, a negative look-ahead, escaped metacharacters)."""
    rows, logdir = written
    mux = load(logdir)
    runs = list(mux.Runs())
    links = dashboard_urls("http://host:6006")
    query = parse_qs(urlsplit(links["time series"]).query)
    assert query["smoothing"] == ["0"]
    assert json.loads(query["pinnedCards"][0]) == [{"plugin": "scalars", "tag": TRADEOFF_TAG}]
    shown = [r for r in runs if re.search(query["runFilter"][0], r)]
    assert sorted(shown) == sorted(label_of(rows, m) for m in ("none", *METHODS))
    tags = {t for r in shown for t in mux.Runs()[r]["tensors"]}
    key = sorted(t for t in tags if re.search(query["tagFilter"][0], t))
    assert key == [TRADEOFF_TAG, TRADEOFF_EPSILON_TAG]  # listed by name: the AUC first
    fragment = parse_qs(urlsplit(links["custom scalars"]).fragment.split("&", 1)[1])
    assert fragment == {"_smoothingWeight": ["0"], "regexInput": [query["runFilter"][0]]}
    root = parse_qs(urlsplit(links["read me"]).fragment.split("&", 1)[1])["regexInput"][0]
    assert [r for r in runs if re.search(root, r)] == ["."]


def _render_script(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "render_tensorboard", ROOT / "scripts" / "render_tensorboard.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_render_script_serves_the_folder_on_loopback(
    tmp_path: Path, synthetic_rows: RowsFactory, monkeypatch: pytest.MonkeyPatch, deadline: Any
) -> None:
    """The screenshot script's server: TensorBoard on 127.0.0.1 at a free port lists every
    run in the written order (so the colours are as designed) and serves the layout with
    the trade-off first; it is stopped afterwards. Then, where Chromium is installed, one
    screenshot of the printed Custom Scalars link, once TensorBoard has drawn it."""
    from urllib.request import urlopen

    script = _render_script(monkeypatch)
    rows = with_no_leak(synthetic_rows(methods=("alm", "dpsgd"), seeds=(0,)))
    logdir = write_tensorboard(rows, tmp_path / "run" / "tb", epsilons=EPSILONS)
    expected = script.expected_runs(logdir)
    assert "." in expected and NO_LEAK_RUN in expected and len(expected) == 5 + 13
    with script.serving(logdir, deadline_s=deadline(120)) as (base, listed):
        assert base.startswith("http://127.0.0.1:")
        assert listed == listing(load(logdir))
        assert [listed.index(r) for r in coloured_runs(rows)] == [0, 1, 4, 6]
        with urlopen(f"{base}/data/plugin/custom_scalars/layout", timeout=10) as response:
            layout = json.load(response)
        first = layout["category"][0]["chart"][0]
        assert first["title"].startswith("AUC of the strongest attack (y) vs test accuracy")
        if shutil.which("chromium") is not None:
            url = dashboard_urls(base)["custom scalars"]
            with script.Browser(tmp_path / "profile") as browser:
                shot = script.screenshot(browser, url, tmp_path / "cs.png", width=1200, height=820)
            from PIL import Image

            with Image.open(shot) as image:
                assert image.size == (1200, 820)
                pixels = np.asarray(image.convert("RGB"), dtype=int).reshape(-1, 3)
            # alm's line, markers and checkbox are drawn in its palette colour, #ff7043
            assert (np.abs(pixels - [0xFF, 0x70, 0x43]).sum(axis=1) < 24).sum() > 50
    with pytest.raises(OSError):
        urlopen(f"{base}/data/runs", timeout=2)  # stopped
