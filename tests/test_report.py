"""What users see: TensorBoard events (read back), plots, the table, and resumable runs."""

from __future__ import annotations

import base64
import dataclasses
import json
import math
from html.parser import HTMLParser
from pathlib import Path

import pytest
from sklearn.metrics import roc_auc_score
from tensorboard.backend.event_processing.plugin_event_multiplexer import EventMultiplexer
from tensorboard.plugins.custom_scalar import layout_pb2
from tensorboard.util import tensor_util

import alm_opacus.run.harness as harness
from alm_opacus.report.draws import read_draws
from alm_opacus.report.results import read_results
from alm_opacus.report.risk import risk_table
from alm_opacus.report.risk_plots import RISK_PLOTS
from alm_opacus.report.series import points
from alm_opacus.report.table import format_tradeoff_table
from alm_opacus.report.tensorboard import (
    LAYOUT_NAME,
    TRADEOFF_TAG,
    EpsilonAxis,
    run_label,
    tradeoff_steps,
)
from alm_opacus.run.harness import RunConfig, run
from alm_opacus.run.rundir import SPLIT_FILE


def _small(out: Path, cache: Path, **changes: object) -> RunConfig:
    base = RunConfig(
        methods=("alm", "gaussian"),
        epsilons=(1.0, 10.0),
        noise_draws=2,
        attacks=("loss", "lira-offline"),
        out=str(out),
        cache_dir=str(cache),
        progress=False,
        options={"m": 16},
    )
    return dataclasses.replace(base, **changes)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def small_run(tmp_path_factory: pytest.TempPathFactory, shared_cache: Path):  # type: ignore[no-untyped-def]
    out = tmp_path_factory.mktemp("small_run")
    return run(_small(out, shared_cache))


@pytest.mark.slow
def test_tensorboard_events_hold_the_results(small_run) -> None:  # type: ignore[no-untyped-def]
    """End to end: the harness's TensorBoard folder, read back with TensorBoard's loader,
    holds every (method, epsilon) point of results.csv at its log-spaced step and on the
    trade-off chart (AUC at round(test accuracy x 1000)), and one hparams session per point."""
    rows = small_run.rows
    mux = EventMultiplexer(tensor_size_guidance={"scalars": 0, "images": 0})
    mux.AddRunsFromDirectory(str(small_run.out / "tb"))
    mux.Reload()
    axis = EpsilonAxis(sorted({r.epsilon for r in rows if math.isfinite(r.epsilon)}))
    for method in ("alm", "gaussian"):
        first = next(r for r in rows if r.method == method)
        run = run_label(method, first.guarantee, first.neighbouring)
        logged = {
            e.step: float(tensor_util.make_ndarray(e.tensor_proto))
            for e in mux.Tensors(run, "utility_loss")
        }
        auc = {
            e.step: float(tensor_util.make_ndarray(e.tensor_proto))
            for e in mux.Tensors(run, "attack/loss/mia_auc")
        }
        for row in rows:
            if row.method == method and row.attack == "loss":
                step = axis.step(row.epsilon)
                assert logged[step] == pytest.approx(row.utility_loss, abs=1e-6)
                assert auc[step] == pytest.approx(row.mia_auc, abs=1e-6)
    layout = layout_pb2.Layout()
    (config,) = mux.Tensors(".", "custom_scalars__config__")
    layout.ParseFromString(tensor_util.make_ndarray(config.tensor_proto).item())
    assert any(c.title.startswith(LAYOUT_NAME) for c in layout.category)
    assert any(t.startswith("plots/roc") for t in mux.Runs()["."]["tensors"])
    # The trade-off: every point of results.csv, read back from the file, in its method's run.
    found = points(read_results(small_run.out / "results.csv"))
    for t in tradeoff_steps(found):
        point = next(p for p in found if (p.method, p.epsilon) == (t.method, t.epsilon))
        first = next(r for r in rows if r.method == t.method)
        run = run_label(t.method, first.guarantee, first.neighbouring)
        shown = {
            e.step: float(tensor_util.make_ndarray(e.tensor_proto))
            for e in mux.Tensors(run, TRADEOFF_TAG)
        }
        assert t.wanted == round(point.test_accuracy.mean * 1000)
        assert shown[t.step] == pytest.approx(point.mia_auc.mean, abs=1e-6)
    assert len(tradeoff_steps(found)) == len(found) == 1 + 2 * 2
    # One hparams session per (method, epsilon) point, the table's numbers: the baseline's
    # and 2 methods x 2 epsilons, each over its 2 releases (noise draws); draws.csv also has
    # the no-leak reference's release, which has no session (it is no method).
    draws = read_draws(small_run.out / "draws.csv")
    assert len(draws) == 1 + 1 + 2 * 2 * 2
    sessions = [r for r in mux.Runs() if r.startswith("hparams/")]
    assert len(sessions) == len(found)
    for p in found:
        eps = "inf" if math.isinf(p.epsilon) else f"{p.epsilon:g}"
        (event,) = mux.Tensors(f"hparams/{p.method}/eps={eps}", "hparams/mia_auc")
        assert float(tensor_util.make_ndarray(event.tensor_proto)) == pytest.approx(p.mia_auc.mean)


class _Page(HTMLParser):
    """The report's table cells, images and links."""

    def __init__(self) -> None:
        super().__init__()
        self.cells: list[str] = []
        self.images: list[str] = []
        self.links: list[str] = []
        self._in_cell = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        found = dict(attrs)
        if tag == "img":
            self.images.append(found.get("src") or "")
        if tag in ("a", "link", "script"):
            self.links.append(found.get("href") or found.get("src") or "")
        self._in_cell = tag == "td"

    def handle_data(self, data: str) -> None:
        if self._in_cell:
            self.cells.append(data.strip())
            self._in_cell = False


@pytest.mark.slow
def test_report_html_holds_every_method_epsilon_and_image(small_run) -> None:  # type: ignore[no-untyped-def]
    page = _Page()
    text = (small_run.out / "report.html").read_text()
    page.feed(text)
    for method in ("none", "alm", "gaussian"):
        assert method in page.cells
    for epsilon in ("1", "10", "inf"):
        assert epsilon in page.cells
    assert "random DP: not a DP guarantee" in text and "no guarantee" in text
    assert len(page.images) >= 6  # trade-off figures and risk figures
    for src in page.images:
        assert src.startswith("data:image/png;base64,")
        data = base64.b64decode(src.split(",", 1)[1])
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 1000
    # offline: nothing is fetched, every link stays in the page
    assert all(link.startswith("#") for link in page.links)
    assert "http://" not in text and "https://" not in text


@pytest.mark.slow
def test_risk_files_name_the_split_rows_and_agree_with_results(small_run) -> None:  # type: ignore[no-untyped-def]
    split = json.loads((small_run.out / SPLIT_FILE).read_text())
    members, nonmembers = set(split["members"]), set(split["nonmembers"])
    base = risk_table(small_run.out, method="none", epsilon=math.inf)
    clean = {int(r["row"]): r["loss_score"] for r in base.records}
    for method, epsilon in (("none", math.inf), ("alm", 1.0), ("alm", 10.0), ("gaussian", 10.0)):
        table = risk_table(small_run.out, method=method, epsilon=epsilon)
        rows = {int(r["row"]): r for r in table.records}
        assert set(rows) == members | nonmembers
        assert {r for r, v in rows.items() if v["member"]} == members
        assert table.kinds == ["lira", "loss"]
        ranks = sorted(v["lira_rank"] for v in rows.values() if v["member"])
        assert ranks == list(range(1, len(members) + 1))
        by_score = sorted((v for v in rows.values() if v["member"]), key=lambda v: -v["lira_score"])
        assert [v["lira_rank"] for v in by_score] == ranks  # rank 1: the highest score
        for row, v in rows.items():  # the unprotected column is the baseline's own score
            assert v["loss_score_unprotected"] == pytest.approx(clean[row])
    # one draw: the baseline's loss scores give results.csv's loss AUC
    (loss,) = [r for r in small_run.rows if r.method == "none" and r.attack == "loss"]
    member = [bool(r["member"]) for r in base.records]
    score = [r["loss_score"] for r in base.records]
    assert roc_auc_score(member, score) == pytest.approx(loss.mia_auc, abs=1e-9)
    assert len(base.top(5).records) == 5 and "lira_rank" in str(base.top(5))
    for name in ("hist_alm", "class_auc_gaussian", "top16", "top_overlap"):
        assert (small_run.out / RISK_PLOTS / f"{name}.png").read_bytes()[:4] == b"\x89PNG"


@pytest.mark.slow
def test_plots_and_table(small_run) -> None:  # type: ignore[no-untyped-def]
    for name in ("tradeoff", "fig1_utility_loss", "fig2_mia", "equal_noise", "roc_loglog"):
        path = small_run.out / "plots" / f"{name}.png"
        assert path.exists() and path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert (small_run.out / "plots" / f"{name}.pdf").read_bytes()[:4] == b"%PDF"
    table = format_tradeoff_table(small_run.rows)
    lines = table.split("\n\n")[0].splitlines()[2:]
    assert [ln.replace("►", "").split()[:3] for ln in lines] == [
        ["none", "inf", "none"],
        ["alm", "1", "random"],
        ["alm", "10", "random"],
        ["gaussian", "1", "random"],
        ["gaussian", "10", "random"],
    ]  # sampled sensitivity: random DP, never pure DP


@pytest.mark.slow
def test_rows_aggregate_noise_draws(small_run) -> None:  # type: ignore[no-untyped-def]
    rows = [r for r in small_run.rows if r.method == "alm"]
    # Each attack is run by a noise-aware attacker and by one with clean references.
    assert {r.attack for r in rows} == {"loss", "lira-offline", "loss-clean", "lira-offline-clean"}
    for r in rows:
        assert r.noise_draws == 2 and r.guarantee == "random-dp"
        assert not math.isnan(r.test_accuracy_std) and not math.isnan(r.mia_auc_std)
        # exact releases calibrate to the grid-rounded sensitivity Δ' ∈ (Δ, Δ(1 + 2⁻⁷)]
        assert r.sensitivity / r.epsilon < r.noise_scale
        assert r.noise_scale <= r.sensitivity * (1 + 2.0**-7) / r.epsilon * (1 + 1e-12)


@pytest.mark.slow
def test_interrupted_run_resumes_to_the_same_table(
    tmp_path: Path, shared_cache: Path, monkeypatch
) -> None:  # type: ignore[no-untyped-def]
    # Seeded noise, so that the resumed cells can be compared with the whole run's.
    run(_small(tmp_path / "whole", shared_cache, reproducible_noise=True))
    calls = {"n": 0}
    real = harness.Evaluation.attack

    def dies(self, prepared, release, **kwargs):  # type: ignore[no-untyped-def]
        calls["n"] += 1
        # none (1 call), alm at epsilon 1 (2 draws x noise-aware and clean), dies in epsilon 10
        if calls["n"] == 6:
            raise KeyboardInterrupt
        return real(self, prepared, release, **kwargs)

    monkeypatch.setattr(harness.Evaluation, "attack", dies)
    with pytest.raises(KeyboardInterrupt):
        run(_small(tmp_path / "cut", shared_cache, reproducible_noise=True))
    partial = read_results(tmp_path / "cut" / "results.csv")  # a valid file, finished cells only
    assert {(r.method, r.epsilon) for r in partial} == {("none", math.inf), ("alm", 1.0)}
    monkeypatch.setattr(harness.Evaluation, "attack", real)
    run(_small(tmp_path / "cut", shared_cache, resume=True, reproducible_noise=True))
    # Compare what each run wrote: finished cells of the cut run were read back from its file.
    resumed = read_results(tmp_path / "cut" / "results.csv")
    whole_rows = read_results(tmp_path / "whole" / "results.csv")

    def key(rows):  # type: ignore[no-untyped-def]
        return sorted(
            (
                r.method,
                r.epsilon,
                r.attack,
                round(r.test_accuracy, 9),
                round(r.mia_auc, 9),
                round(r.eps_lower_bound, 9),
                r.statement,
            )
            for r in rows
        )

    assert key(resumed) == key(whole_rows)
    assert format_tradeoff_table(resumed) == format_tradeoff_table(whole_rows)
