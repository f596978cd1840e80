"""The plots draw what the rows say: every point where it belongs, with its error bar, its
guarantee kind, the weak region, and the cells left out."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest
from matplotlib.axes import Axes
from matplotlib.collections import LineCollection
from matplotlib.container import ErrorbarContainer
from matplotlib.figure import Figure

from alm_opacus.report.plots import (
    WEAK_LABEL,
    attack_figure,
    equal_noise_figure,
    figures,
    mia_figure,
    roc_figure,
    utility_figure,
    write_plots,
)
from alm_opacus.report.results import ResultRow
from alm_opacus.report.series import GUARANTEE_STYLES, method_colours

EPSILONS = (0.1, 1.0, 10.0, 100.0, 1000.0, 10000.0)
RowsFactory = Callable[..., list[ResultRow]]


@pytest.fixture
def rows(synthetic_rows: RowsFactory) -> list[ResultRow]:
    return synthetic_rows(infeasible=[("laplace", 10000.0)])


@pytest.fixture
def close() -> Iterator[list[Figure]]:
    made: list[Figure] = []
    yield made
    import matplotlib.pyplot as plt

    for fig in made:
        plt.close(fig)


def containers(ax: Axes) -> dict[str, ErrorbarContainer]:
    return {c.get_label(): c for c in ax.containers if isinstance(c, ErrorbarContainer)}


def bar_ends(container: ErrorbarContainer) -> tuple[np.ndarray, np.ndarray]:
    """(lower, upper) end of each vertical error bar."""
    (bars,) = [c for c in container.lines[2] if isinstance(c, LineCollection)]
    segments = np.array(bars.get_segments())
    return segments[:, 0, 1], segments[:, 1, 1]


def test_utility_points_sit_at_their_replace_one_epsilon(
    rows: list[ResultRow], close: list[Figure]
) -> None:
    fig = utility_figure(rows)
    close.append(fig)
    (ax, *_) = fig.axes
    drawn = containers(ax)
    alm_x = drawn["alm (random-dp)"].lines[0].get_xdata()
    np.testing.assert_allclose(alm_x, EPSILONS)
    # laplace's infeasible epsilon 10000 is left out, and named in the footnote
    np.testing.assert_allclose(drawn["laplace (pure-dp)"].lines[0].get_xdata(), EPSILONS[:-1])
    notes = "\n".join(t.get_text() for t in fig.texts)
    assert "not plotted, infeasible: laplace at ε = 10000 (seeds 0, 1)" in notes
    # dpsgd is add/remove: drawn at 2 epsilon; from epsilon 100 on, (1 + e^eps) delta >= 1
    np.testing.assert_allclose(drawn["dpsgd (approx-dp)†"].lines[0].get_xdata(), [0.2, 2, 20])
    np.testing.assert_allclose(drawn["dpsgd (none)†"].lines[0].get_xdata(), [200, 2000, 20000])
    assert ax.get_xscale() == "log"


def test_means_and_bars_come_from_the_rows(rows: list[ResultRow], close: list[Figure]) -> None:
    fig = utility_figure(rows)
    close.append(fig)
    container = containers(fig.axes[0])["alm (random-dp)"]
    for k, epsilon in enumerate(EPSILONS):
        this = [r for r in rows if r.method == "alm" and r.epsilon == epsilon]
        seeds = {r.seed: r for r in this}  # every attack row of a seed repeats its utility
        values = [seeds[s].utility_loss for s in (0, 1)]
        spread = math.sqrt(
            np.var(values) + np.mean([seeds[s].utility_loss_std ** 2 for s in (0, 1)])
        )
        assert container.lines[0].get_ydata()[k] == pytest.approx(np.mean(values))
        low, high = bar_ends(container)
        assert high[k] - low[k] == pytest.approx(2 * spread)


def test_auc_bars_are_the_recorded_intervals(rows: list[ResultRow], close: list[Figure]) -> None:
    fig = attack_figure(rows)
    close.append(fig)
    container = containers(fig.axes[0])["alm (random-dp)"]
    low, high = bar_ends(container)
    for k, epsilon in enumerate(EPSILONS):
        best = [max((r for r in rows if (r.method, r.epsilon, r.seed) == ("alm", epsilon, s)),
                    key=lambda r: r.mia_auc) for s in (0, 1)]  # fmt: skip
        assert low[k] == pytest.approx(min(r.mia_auc_ci_low for r in best))
        assert high[k] == pytest.approx(max(r.mia_auc_ci_high for r in best))
    assert "95% interval" in "\n".join(t.get_text() for t in fig.texts)


@pytest.mark.parametrize("method, kind", [("alm", "random-dp"), ("laplace", "pure-dp"),
                                          ("dpsgd", "approx-dp")])  # fmt: skip
def test_guarantee_kind_sets_marker_and_line(
    rows: list[ResultRow], close: list[Figure], method: str, kind: str
) -> None:
    fig = mia_figure(rows)
    close.append(fig)
    (label,) = [k for k in containers(fig.axes[0]) if k.startswith(f"{method} ({kind})")]
    line = containers(fig.axes[0])[label].lines[0]
    assert line.get_marker() == GUARANTEE_STYLES[kind][0]
    assert line.get_color() == method_colours([method])[method]
    legend_titles = [lg.get_title().get_text() for lg in fig.legends]
    assert "guarantee (marker, line)" in legend_titles


@pytest.mark.parametrize("draw", [utility_figure, mia_figure, attack_figure])
def test_weak_region_is_shaded_and_labelled(
    rows: list[ResultRow], close: list[Figure], draw: Callable[[list[ResultRow]], Figure]
) -> None:
    fig = draw(rows)
    close.append(fig)
    ax = fig.axes[0]
    (region,) = [p for p in ax.patches if p.get_label() == WEAK_LABEL]
    start, end = region.get_x(), region.get_x() + region.get_width()  # type: ignore[attr-defined]
    assert start == pytest.approx(10.0) and end == pytest.approx(ax.get_xlim()[1])
    assert any(t.get_text() == WEAK_LABEL for t in ax.texts)


def test_equal_noise_view(rows: list[ResultRow], close: list[Figure]) -> None:
    fig = equal_noise_figure(rows)
    close.append(fig)
    left, middle, right = fig.axes[:3]
    # noise on the weights only: DP-SGD's per-step gradient noise is another quantity
    assert {k.split(" ")[0] for k in containers(left)} == {"alm", "laplace"}
    alm = containers(left)["alm (random-dp)"].lines[0]
    expected = [r.noise_std for r in rows if r.method == "alm" and r.seed == 0][::3]
    np.testing.assert_allclose(alm.get_xdata(), expected)
    assert left.get_xscale() == middle.get_xscale() == "log"
    # the equal-utility view has every method, each point labelled by its epsilon
    assert {k.split(" ")[0] for k in containers(right)} == {"alm", "laplace", "dpsgd"}
    labels = {t.get_text() for t in right.texts}
    assert {"0.1", "10000", "20000"} <= labels


def test_roc_axes_are_log_log(close: list[Figure]) -> None:
    fpr = list(np.linspace(0, 1, 21))
    fig = roc_figure({("alm", 1.0, "loss"): (fpr, fpr), ("none", math.inf, "loss"): (fpr, fpr)})
    close.append(fig)
    assert fig.axes[0].get_xscale() == fig.axes[0].get_yscale() == "log"


def test_colours_follow_the_name() -> None:
    few, many = method_colours(["alm", "dpsgd"]), method_colours(["alm", "dpsgd", "laplace", "lu"])
    assert few["alm"] == many["alm"] and few["dpsgd"] == many["dpsgd"]
    names = ["alm", "laplace", "gaussian", "gaussian-classic", "dpsgd", "lu", "dperm",
             "dpsgd-full", "dpsgd-alm", "dpsgd-laplace"]  # fmt: skip
    colours = method_colours(names)
    assert len({colours[n] for n in names}) == len(names)
    assert method_colours(["none"])["none"] == "black"


@pytest.mark.slow
def test_write_plots_writes_png_and_pdf_and_nothing_stale(
    tmp_path: Path, synthetic_rows: RowsFactory
) -> None:
    rows = synthetic_rows(methods=("alm",), seeds=(0,))
    fpr = list(np.linspace(0, 1, 11))
    rocs = {("alm", e, "loss"): (fpr, fpr) for e in EPSILONS}
    folder = tmp_path / "plots"
    folder.mkdir()
    (folder / "stale.png").write_bytes(b"old")
    written = write_plots(rows, rocs, folder)
    stems = set(figures(rows, rocs))
    assert {"fig1_utility_loss", "fig2_mia", "equal_noise", "roc_by_epsilon"} <= stems
    assert sorted(p.name for p in folder.iterdir()) == sorted(p.name for p in written)
    for path in written:
        magic = b"\x89PNG\r\n\x1a\n" if path.suffix == ".png" else b"%PDF"
        assert path.read_bytes().startswith(magic), path
    assert len(written) == 2 * len(stems)
