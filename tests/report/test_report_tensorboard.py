"""TensorBoard output read back with TensorBoard's own loader (the plugin event multiplexer
its server uses): one run per method with every (method, epsilon) point at its log-spaced
step, one hparams session per release, and ``tb/`` holds exactly the rows it was last
written from."""

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
from alm_opacus.report.draws import DrawRecord
from alm_opacus.report.plots import write_plots
from alm_opacus.report.results import ResultRow
from alm_opacus.report.tensorboard import (
    README_TAG,
    EpsilonAxis,
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


def step(epsilon: float) -> int:
    """The stated x axis: 100 steps per decade from 0.1, the grid's lowest power of ten."""
    return round(100 * math.log10(epsilon / 0.1))


def draws_of(rows: list[ResultRow]) -> list[DrawRecord]:
    """Two releases per cell, each with values that differ per draw."""
    out = []
    for method, epsilon, seed in sorted({(r.method, r.epsilon, r.seed) for r in rows}):
        this = cell(rows, method, epsilon, seed)
        for draw in range(2):
            out.append(DrawRecord(method=method, epsilon=epsilon, seed=seed, draw=draw,
                                  test_accuracy=this[0].test_accuracy + 0.001 * draw,
                                  mia_auc=max(r.mia_auc for r in this) - 0.002 * draw,
                                  mia_accuracy=0.6, tpr_at_fpr_0_01=0.02,
                                  tpr_at_fpr_0_001=math.nan, attack="loss"))  # fmt: skip
    return out


@pytest.fixture
def written(tmp_path: Path, synthetic_rows: RowsFactory) -> tuple[list[ResultRow], Path]:
    rows = synthetic_rows(methods=METHODS, seeds=(0, 1), epsilons=EPSILONS)
    logdir = write_tensorboard(rows, tmp_path / "tb", epsilons=EPSILONS, hparams={"m": 16},
                               draws=draws_of(rows))  # fmt: skip
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
                both = [r.mia_auc for r in rows if (r.method, r.epsilon, r.attack)
                        == (method, epsilon, attack)]  # fmt: skip
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


def test_read_me_gives_the_axis_and_the_weak_region(
    written: tuple[list[ResultRow], Path],
) -> None:
    _, logdir = written
    mux = load(logdir)
    (event,) = mux.Tensors(".", README_TAG)
    text = tensor_util.make_ndarray(event.tensor_proto).item().decode()
    assert "| 300 | 100 | yes |" in text and "| 200 | 10 |  |" in text
    assert "smoothing off" in text and "random DP: not a DP guarantee" in text


def _hparams(mux: EventMultiplexer, run: str, tag: str) -> object:
    content = mux.SummaryMetadata(run, tag).plugin_data.content
    if tag == hparams_metadata.EXPERIMENT_TAG:
        return hparams_metadata.parse_experiment_plugin_data(content)
    return hparams_metadata.parse_session_start_info_plugin_data(content)


def test_hparams_has_one_session_per_release(written: tuple[list[ResultRow], Path]) -> None:
    rows, logdir = written
    mux = load(logdir)
    experiment = _hparams(mux, ".", hparams_metadata.EXPERIMENT_TAG)
    columns = {info.name: info for info in experiment.hparam_infos}  # type: ignore[attr-defined]
    assert {"method", "epsilon", "draw", "seed", "guarantee", "neighbouring", "m"} <= set(columns)
    metrics = {m.name.tag for m in experiment.metric_infos}  # type: ignore[attr-defined]
    assert {"hparams/test_accuracy", "hparams/mia_auc", "hparams/tpr_at_fpr_0.01"} <= metrics
    sessions = [r for r in mux.Runs() if r.startswith("hparams/")]
    assert len(sessions) == len(draws_of(rows))  # one per release
    for d in draws_of(rows):
        name = f"hparams/{d.method}/eps={d.epsilon:g}/seed={d.seed}/draw={d.draw}"
        if math.isinf(d.epsilon):
            name = f"hparams/{d.method}/eps=inf/seed={d.seed}/draw={d.draw}"
        hp = _hparams(mux, name, hparams_metadata.SESSION_START_INFO_TAG).hparams  # type: ignore[attr-defined]
        assert hp["method"].string_value == d.method and hp["draw"].number_value == d.draw
        assert ("epsilon" not in hp) if math.isinf(d.epsilon) else (  # JSON has no inf
            hp["epsilon"].number_value == d.epsilon)  # fmt: skip
        assert series(mux, name, "hparams/mia_auc")[0] == pytest.approx(d.mia_auc, rel=F32)
        assert series(mux, name, "hparams/test_accuracy")[0] == pytest.approx(
            d.test_accuracy, rel=F32)  # fmt: skip
        # an unresolved TPR is not logged
        assert "hparams/tpr_at_fpr_0.001" not in mux.Runs()[name]["tensors"]


def test_cells_without_release_records_get_one_session(
    tmp_path: Path, synthetic_rows: RowsFactory
) -> None:
    rows = synthetic_rows(methods=("alm",), seeds=(0,), epsilons=(1.0, 10.0))
    mux = load(write_tensorboard(rows, tmp_path / "tb", epsilons=(1.0, 10.0)))
    sessions = sorted(r for r in mux.Runs() if r.startswith("hparams/"))
    assert sessions == ["hparams/alm/eps=1/seed=0/mean", "hparams/alm/eps=10/seed=0/mean",
                        "hparams/none/eps=inf/seed=0/mean"]  # fmt: skip
    start = _hparams(mux, sessions[0], hparams_metadata.SESSION_START_INFO_TAG)
    assert start.hparams["draw"].number_value == -1  # type: ignore[attr-defined]


def test_layout_has_one_chart_per_metric_on_logged_tags(
    written: tuple[list[ResultRow], Path],
) -> None:
    import re

    _, logdir = written
    mux = load(logdir)
    (event,) = mux.Tensors(".", "custom_scalars__config__")
    layout = layout_pb2.Layout()
    layout.ParseFromString(tensor_util.make_ndarray(event.tensor_proto).item())
    tags = {t for run, kinds in mux.Runs().items() for t in kinds["tensors"]}
    charts = [c for category in layout.category for c in category.chart]
    assert "x = 100·log10(ε/0.1)" in layout.category[0].title
    trade_off = [c.multiline.tag for c in layout.category[0].chart if c.HasField("multiline")]
    for metric in ("test_accuracy", "utility_loss", "best/mia_auc", "best/tpr_at_fpr_0\\.01"):
        assert [f"^{metric}$"] in [list(t) for t in trade_off], metric
    for chart in charts:
        if chart.HasField("multiline"):
            for regex in chart.multiline.tag:
                assert any(re.search(regex, t) for t in tags), (chart.title, regex)
        else:
            for s in chart.margin.series:
                assert {s.value, s.lower, s.upper} <= tags, chart.title


def test_unresolved_tpr_gets_no_chart(tmp_path: Path, synthetic_rows: RowsFactory) -> None:
    rows = [r.replace(tpr_at_fpr_0_001=math.nan) for r in synthetic_rows(methods=("alm",))]
    mux = load(write_tensorboard(rows, tmp_path / "tb", epsilons=EPSILONS))
    (event,) = mux.Tensors(".", "custom_scalars__config__")
    layout = layout_pb2.Layout()
    layout.ParseFromString(tensor_util.make_ndarray(event.tensor_proto).item())
    titles = [c.title for c in layout.category[0].chart]
    assert not any("0.1% FPR" in t for t in titles) and any("1% FPR" in t for t in titles)


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
    start = _hparams(
        mux, "hparams/laplace/eps=10000/seed=0/mean", hparams_metadata.SESSION_START_INFO_TAG
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


def test_dashboard_links_select_the_method_runs_and_colour_each(
    written: tuple[list[ResultRow], Path],
) -> None:
    """The links' filters are JavaScript regexes; these patterns mean the same in Python's
    ``re`` (anchors, groups, a negative look-ahead). TensorBoard gives each colour group of
    ``runColorGroup`` one colour and runs that match no group none of the palette."""
    import re
    from urllib.parse import parse_qs, urlsplit

    rows, logdir = written
    mux = load(logdir)
    runs = list(mux.Runs())
    links = dashboard_urls("http://host:6006")
    query = parse_qs(urlsplit(links["time series"]).query)
    assert query["smoothing"] == ["0"]
    shown = [r for r in runs if re.search(query["runFilter"][0], r)]
    assert sorted(shown) == sorted(label_of(rows, m) for m in ("none", *METHODS))
    tags = {t for r in shown for t in mux.Runs()[r]["tensors"]}
    key = {t for t in tags if re.search(query["tagFilter"][0], t)}
    assert {"utility_loss", "test_accuracy", "best/mia_auc", "best/tpr_at_fpr_0.01"} <= key
    assert not any(t.startswith(("attack/", "grid/")) for t in key)
    group = re.compile(query["runColorGroup"][0].removeprefix("regex:"))
    groups = {r: group.match(r) for r in runs}
    assert {m.group(1) for r, m in groups.items() if m} == set(shown)  # one colour each
    assert all(groups[r] is None for r in runs if r.startswith("hparams/") or r == ".")
    fragment = parse_qs(urlsplit(links["custom scalars"]).fragment.split("&", 1)[1])
    assert fragment == {"_smoothingWeight": ["0"], "regexInput": [query["runFilter"][0]]}
    root = parse_qs(urlsplit(links["read me"]).fragment.split("&", 1)[1])["regexInput"][0]
    assert [r for r in runs if re.search(root, r)] == ["."]
