"""TensorBoard output read back with TensorBoard's own loader (the plugin event multiplexer
its server uses): every (method, epsilon, seed) point survives, and ``tb/`` holds exactly
the rows it was last written from."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from tensorboard.backend.event_processing.plugin_event_multiplexer import EventMultiplexer
from tensorboard.plugins.custom_scalar import layout_pb2
from tensorboard.plugins.hparams import metadata as hparams_metadata
from tensorboard.util import tensor_util

from alm_opacus.report import events
from alm_opacus.report.plots import write_plots
from alm_opacus.report.results import ResultRow
from alm_opacus.report.tensorboard import (
    CHANCE_RUN,
    README_TAG,
    dashboard_urls,
    run_label,
    write_tensorboard,
)

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


@pytest.fixture
def written(tmp_path: Path, synthetic_rows: RowsFactory) -> tuple[list[ResultRow], Path]:
    rows = synthetic_rows(methods=METHODS, seeds=(0, 1), epsilons=EPSILONS)
    logdir = write_tensorboard(rows, tmp_path / "tb", epsilons=EPSILONS, hparams={"m": 16})
    return rows, logdir


def test_every_method_epsilon_seed_point_survives(written: tuple[list[ResultRow], Path]) -> None:
    rows, logdir = written
    mux = load(logdir)
    for method in METHODS:
        for seed in (0, 1):
            run = f"{label_of(rows, method)}/seed={seed}"
            loss, auc = series(mux, run, "utility_loss"), series(mux, run, "best/mia_auc")
            shown = series(mux, run, "grid/epsilon")
            assert sorted(loss) == sorted(auc) == sorted(shown) == list(range(len(EPSILONS)))
            for step, epsilon in enumerate(EPSILONS):
                this = cell(rows, method, epsilon, seed)
                assert loss[step] == pytest.approx(this[0].utility_loss, rel=F32)
                # the strongest attack: the largest AUC over every attack row of the cell
                assert auc[step] == pytest.approx(max(r.mia_auc for r in this), rel=F32)
                assert shown[step] == pytest.approx(epsilon, rel=F32)
                for row in this:
                    per_attack = series(mux, run, f"attack/{row.attack}/mia_auc")
                    assert per_attack[step] == pytest.approx(row.mia_auc, rel=F32)


def test_mean_run_averages_the_seeds(written: tuple[list[ResultRow], Path]) -> None:
    rows, logdir = written
    mux = load(logdir)
    for method in METHODS:
        run = f"{label_of(rows, method)}/mean"
        auc, seeds = series(mux, run, "best/mia_auc"), series(mux, run, "seeds")
        for step, epsilon in enumerate(EPSILONS):
            per_seed = [max(r.mia_auc for r in cell(rows, method, epsilon, s)) for s in (0, 1)]
            assert auc[step] == pytest.approx(np.mean(per_seed), rel=F32)
            assert seeds[step] == 2


def test_add_remove_runs_carry_their_replace_one_epsilon(
    written: tuple[list[ResultRow], Path],
) -> None:
    _, logdir = written
    mux = load(logdir)
    run = "dpsgd [approx-dp, add-remove]/seed=0"
    assert run in mux.Runs()
    converted = series(mux, run, "grid/epsilon_replace_one")
    for step, epsilon in enumerate(EPSILONS):
        assert converted[step] == pytest.approx(2 * epsilon, rel=F32)  # group privacy, k = 2
    weak = series(mux, run, "grid/weak_guarantee")
    assert [weak[k] for k in range(len(EPSILONS))] == [0, 0, 1, 1, 1, 1]  # 2 * 10 > 10
    assert series(mux, "laplace [pure-dp]/seed=0", "grid/weak_guarantee")[2] == 0


def test_baseline_and_chance_are_drawn_across_the_grid(
    written: tuple[list[ResultRow], Path],
) -> None:
    rows, logdir = written
    mux = load(logdir)
    for seed in (0, 1):
        unprotected = max(r.mia_auc for r in cell(rows, "none", math.inf, seed))
        flat = series(mux, f"none [none]/seed={seed}", "best/mia_auc")
        assert flat == pytest.approx(dict.fromkeys(range(len(EPSILONS)), unprotected), rel=F32)
    assert series(mux, CHANCE_RUN, "best/mia_auc") == dict.fromkeys(range(len(EPSILONS)), 0.5)


def test_read_me_gives_the_grid_and_the_weak_region(
    written: tuple[list[ResultRow], Path],
) -> None:
    _, logdir = written
    mux = load(logdir)
    (event,) = mux.Tensors(".", README_TAG)
    text = tensor_util.make_ndarray(event.tensor_proto).item().decode()
    assert "| 3 | 100 | yes |" in text and "| 2 | 10 |  |" in text
    assert "smoothing to 0" in text


def _hparams(mux: EventMultiplexer, run: str, tag: str) -> object:
    content = mux.SummaryMetadata(run, tag).plugin_data.content
    if tag == hparams_metadata.EXPERIMENT_TAG:
        return hparams_metadata.parse_experiment_plugin_data(content)
    return hparams_metadata.parse_session_start_info_plugin_data(content)


def test_hparams_has_method_delta_and_guarantee_columns(
    written: tuple[list[ResultRow], Path],
) -> None:
    rows, logdir = written
    mux = load(logdir)
    experiment = _hparams(mux, ".", hparams_metadata.EXPERIMENT_TAG)
    columns = {info.name: info for info in experiment.hparam_infos}  # type: ignore[attr-defined]
    assert {"method", "delta", "guarantee", "epsilon", "seed", "neighbouring", "m"} <= set(columns)
    assert set(columns["method"].domain_discrete.values[i].string_value
               for i in range(len(columns["method"].domain_discrete.values))) == {
        "none", *METHODS}  # fmt: skip
    sessions = [r for r in mux.Runs() if r.startswith("hparams/")]
    assert len(sessions) == 2 * (1 + len(METHODS) * len(EPSILONS))  # one per cell
    start = _hparams(mux, "hparams/dpsgd/eps=10/seed=1", hparams_metadata.SESSION_START_INFO_TAG)
    hp = start.hparams  # type: ignore[attr-defined]
    assert hp["method"].string_value == "dpsgd" and hp["guarantee"].string_value == "approx-dp"
    assert hp["delta"].number_value == pytest.approx(1e-5)
    assert hp["epsilon"].number_value == 10 and hp["seed"].number_value == 1
    auc = series(mux, "hparams/dpsgd/eps=10/seed=1", "hparams/best_mia_auc")
    assert auc[0] == pytest.approx(max(r.mia_auc for r in cell(rows, "dpsgd", 10.0, 1)), rel=F32)
    none = _hparams(mux, "hparams/none/eps=inf/seed=0", hparams_metadata.SESSION_START_INFO_TAG)
    assert "epsilon" not in none.hparams  # type: ignore[attr-defined]  # JSON has no inf


def test_layout_charts_point_at_logged_tags(written: tuple[list[ResultRow], Path]) -> None:
    import re

    _, logdir = written
    mux = load(logdir)
    (event,) = mux.Tensors(".", "custom_scalars__config__")
    layout = layout_pb2.Layout()
    layout.ParseFromString(tensor_util.make_ndarray(event.tensor_proto).item())
    tags = {t for run, kinds in mux.Runs().items() for t in kinds["tensors"]}
    charts = [c for category in layout.category for c in category.chart]
    assert any("weak guarantee" in category.title for category in layout.category)
    for chart in charts:
        if chart.HasField("multiline"):
            for regex in chart.multiline.tag:
                assert any(re.search(regex, t) for t in tags), (chart.title, regex)
        else:
            for s in chart.margin.series:
                assert {s.value, s.lower, s.upper} <= tags, chart.title


def test_rewrite_holds_only_the_current_rows(tmp_path: Path, synthetic_rows: RowsFactory) -> None:
    logdir = tmp_path / "tb"
    write_tensorboard(synthetic_rows(), logdir, epsilons=EPSILONS)
    fewer = synthetic_rows(methods=("alm",), seeds=(0,), epsilons=(1.0, 10.0))
    write_tensorboard(fewer, logdir, epsilons=(1.0, 10.0))
    mux = load(logdir)
    runs = {r for r in mux.Runs() if not r.startswith("hparams/")}
    assert runs == {".", "alm [random-dp]/seed=0", "none [none]/seed=0", CHANCE_RUN}
    assert series(mux, "alm [random-dp]/seed=0", "grid/epsilon") == pytest.approx({0: 1, 1: 10})
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
    assert sorted(series(mux, "laplace [pure-dp]/seed=0", "utility_loss")) == [0, 1, 2, 3, 4]
    (event,) = mux.Tensors(".", README_TAG)
    text = tensor_util.make_ndarray(event.tensor_proto).item().decode()
    assert "laplace at epsilon 10000, seed 0: no noise scale" in text
    start = _hparams(
        mux, "hparams/laplace/eps=10000/seed=0", hparams_metadata.SESSION_START_INFO_TAG
    )
    assert start.hparams["status"].string_value == "infeasible"  # type: ignore[attr-defined]


@pytest.mark.slow
def test_plots_are_shown_as_images(tmp_path: Path, synthetic_rows: RowsFactory) -> None:
    rows = synthetic_rows(methods=("alm",), seeds=(0,))
    fpr = list(np.linspace(0, 1, 11))
    rocs = {("alm", e, "loss"): (fpr, fpr) for e in EPSILONS}
    plots = tmp_path / "plots"
    write_plots(rows, rocs, plots)
    mux = load(write_tensorboard(rows, tmp_path / "tb", epsilons=EPSILONS, images=plots))
    images = {t for t in mux.Runs()["."]["tensors"] if t.startswith("plots/")}
    expected = {f"plots/{p.relative_to(plots).with_suffix('').as_posix()}"
                for p in plots.rglob("*.png")}  # fmt: skip
    assert images == expected and "plots/equal_noise" in images
    (event,) = mux.Tensors(".", "plots/roc_loglog")
    blob = tensor_util.make_ndarray(event.tensor_proto)[2]  # [width, height, png]
    assert blob == (plots / "roc_loglog.png").read_bytes()


def test_dashboard_links_select_the_trade_off_runs_and_tags(
    written: tuple[list[ResultRow], Path],
) -> None:
    """The links' filters are JavaScript regexes; these patterns mean the same in Python's
    ``re`` (anchors, groups, alternation, a negative look-ahead)."""
    import re
    from urllib.parse import parse_qs, urlsplit

    _, logdir = written
    mux = load(logdir)
    runs = list(mux.Runs())
    links = dashboard_urls("http://host:6006")
    query = parse_qs(urlsplit(links["time series"]).query)
    assert query["smoothing"] == ["0"]
    shown = [r for r in runs if re.search(query["runFilter"][0], r)]
    assert shown and not any(r.startswith("hparams/") for r in shown)
    assert len(shown) == len(runs) - 2 * (1 + len(METHODS) * len(EPSILONS))
    tags = {t for r in shown for t in mux.Runs()[r]["tensors"]}
    key = {t for t in tags if re.search(query["tagFilter"][0], t)}
    assert {"utility_loss", "best/mia_auc", "best/tpr_at_fpr_0.001", "grid/epsilon"} <= key
    assert not any(t.startswith("attack/") for t in key)
    group = re.compile(query["runColorGroup"][0].removeprefix("regex:"))
    assert {group.match(r).group(1) for r in shown if r != "."} == {  # type: ignore[union-attr]
        "alm", "laplace", "dpsgd", "none", CHANCE_RUN}  # fmt: skip
    fragment = parse_qs(urlsplit(links["custom scalars"]).fragment.split("&", 1)[1])
    assert fragment == {"_smoothingWeight": ["0"], "regexInput": [query["runFilter"][0]]}
    root = parse_qs(urlsplit(links["read me"]).fragment.split("&", 1)[1])["regexInput"][0]
    assert [r for r in runs if re.search(root, r)] == ["."]
