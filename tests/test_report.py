"""What users see: TensorBoard events (read back), plots, the table, and resumable runs."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pytest
from tensorboard.backend.event_processing.plugin_event_multiplexer import EventMultiplexer
from tensorboard.plugins.custom_scalar import layout_pb2
from tensorboard.util import tensor_util

import alm_opacus.run.harness as harness
from alm_opacus.report.results import read_results
from alm_opacus.report.table import format_tradeoff_table
from alm_opacus.report.tensorboard import LAYOUT_NAME, run_label
from alm_opacus.run.harness import RunConfig, run


def _small(out: Path, cache: Path, **changes: object) -> RunConfig:
    base = RunConfig(
        methods=("alm", "gaussian"), epsilons=(1.0, 10.0), noise_draws=2,
        attacks=("loss", "lira-offline"), out=str(out), cache_dir=str(cache), progress=False,
        options={"m": 16},
    )  # fmt: skip
    return dataclasses.replace(base, **changes)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def small_run(tmp_path_factory: pytest.TempPathFactory, shared_cache: Path):  # type: ignore[no-untyped-def]
    out = tmp_path_factory.mktemp("small_run")
    return run(_small(out, shared_cache))


@pytest.mark.slow
def test_tensorboard_events_hold_the_results(small_run) -> None:  # type: ignore[no-untyped-def]
    """End to end: the harness's TensorBoard folder, read back with TensorBoard's loader,
    holds every (method, epsilon) point of results.csv at step = index of epsilon."""
    rows = small_run.rows
    mux = EventMultiplexer(tensor_size_guidance={"scalars": 0, "images": 0})
    mux.AddRunsFromDirectory(str(small_run.out / "tb"))
    mux.Reload()
    grid = sorted({r.epsilon for r in rows if math.isfinite(r.epsilon)})
    for method in ("alm", "gaussian"):
        first = next(r for r in rows if r.method == method)
        run = f"{run_label(method, first.guarantee, first.neighbouring)}/seed=0"
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
                step = grid.index(row.epsilon)
                assert logged[step] == pytest.approx(row.utility_loss, abs=1e-6)
                assert auc[step] == pytest.approx(row.mia_auc, abs=1e-6)
    layout = layout_pb2.Layout()
    (config,) = mux.Tensors(".", "custom_scalars__config__")
    layout.ParseFromString(tensor_util.make_ndarray(config.tensor_proto).item())
    assert any(c.title.startswith(LAYOUT_NAME) for c in layout.category)
    assert any(t.startswith("plots/roc") for t in mux.Runs()["."]["tensors"])
    # The hparams plugin gets one session per (method, epsilon, seed) cell.
    assert len([r for r in mux.Runs() if r.startswith("hparams/")]) == 1 + 2 * 2


@pytest.mark.slow
def test_plots_and_table(small_run) -> None:  # type: ignore[no-untyped-def]
    for name in ("fig1_utility_loss", "fig2_mia", "equal_noise", "roc_loglog"):
        path = small_run.out / "plots" / f"{name}.png"
        assert path.exists() and path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert (small_run.out / "plots" / f"{name}.pdf").read_bytes()[:4] == b"%PDF"
    table = format_tradeoff_table(small_run.rows)
    lines = table.split("\n\n")[0].splitlines()
    assert "alm" in lines[0] and "gaussian" in lines[0] and "none" in lines[0]
    assert [ln.split("|")[0].strip() for ln in lines[3:]] == ["1", "10", "inf"]
    assert "random-dp" in table  # sampled sensitivity: never pure-dp


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
            (r.method, r.epsilon, r.attack, round(r.test_accuracy, 9), round(r.mia_auc, 9),
             round(r.eps_lower_bound, 9), r.statement)
            for r in rows
        )  # fmt: skip

    assert key(resumed) == key(whole_rows)
    assert format_tradeoff_table(resumed) == format_tradeoff_table(whole_rows)
