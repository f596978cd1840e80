"""The plots draw what the rows say: every point where it belongs, with its error bar, its
guarantee kind (a guarantee that is not DP hollow), the weak region, the cells and panels
left out, and every text readable at the report's width."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest
from matplotlib.axes import Axes
from matplotlib.collections import LineCollection
from matplotlib.colors import to_rgba
from matplotlib.container import ErrorbarContainer
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from alm_opacus.report.plots import (
    FIGURES,
    MIN_TEXT_PX,
    NO_LEAK_LABEL,
    NOT_DP,
    PAGE_WIDTH_PX,
    PNG_DPI,
    WEAK_LABEL,
    attack_figure,
    equal_noise_figure,
    figures,
    mia_figure,
    roc_epsilon,
    roc_figure,
    tradeoff_figure,
    utility_figure,
    write_plots,
)
from alm_opacus.report.results import ResultRow
from alm_opacus.report.series import GUARANTEE_STYLES, NO_LEAK, format_epsilon, method_colours

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
    alm_x = drawn["alm (random-dp, not DP)"].lines[0].get_xdata()
    np.testing.assert_allclose(alm_x, EPSILONS)
    # laplace's infeasible epsilon 10000 is left out, and named in the footnote
    np.testing.assert_allclose(drawn["laplace (pure-dp)"].lines[0].get_xdata(), EPSILONS[:-1])
    notes = "\n".join(t.get_text() for t in fig.texts)
    assert "not plotted, infeasible: laplace at ε = 10000 (seeds 0, 1)" in notes
    # dpsgd is add/remove: drawn at 2 epsilon; from epsilon 100 on, (1 + e^eps) delta >= 1
    np.testing.assert_allclose(drawn["dpsgd (approx-dp)†"].lines[0].get_xdata(), [0.2, 2, 20])
    np.testing.assert_allclose(
        drawn["dpsgd (none, not DP)†"].lines[0].get_xdata(), [200, 2000, 20000]
    )
    assert ax.get_xscale() == "log"


def test_means_and_bars_come_from_the_rows(rows: list[ResultRow], close: list[Figure]) -> None:
    fig = utility_figure(rows)
    close.append(fig)
    container = containers(fig.axes[0])["alm (random-dp, not DP)"]
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
    container = containers(fig.axes[0])["alm (random-dp, not DP)"]
    low, high = bar_ends(container)
    for k, epsilon in enumerate(EPSILONS):
        best = [
            max(
                (r for r in rows if (r.method, r.epsilon, r.seed) == ("alm", epsilon, s)),
                key=lambda r: r.mia_auc,
            )
            for s in (0, 1)
        ]
        assert low[k] == pytest.approx(min(r.mia_auc_ci_low for r in best))
        assert high[k] == pytest.approx(max(r.mia_auc_ci_high for r in best))
    assert "95% interval" in "\n".join(t.get_text() for t in fig.texts)


@pytest.mark.parametrize(
    "method, kind", [("alm", "random-dp"), ("laplace", "pure-dp"), ("dpsgd", "approx-dp")]
)
def test_guarantee_kind_sets_marker_and_line(
    rows: list[ResultRow], close: list[Figure], method: str, kind: str
) -> None:
    fig = mia_figure(rows)
    close.append(fig)
    (label,) = [k for k in containers(fig.axes[0]) if k.startswith(f"{method} ({kind}")]
    line = containers(fig.axes[0])[label].lines[0]
    assert line.get_marker() == GUARANTEE_STYLES[kind][0]
    assert line.get_color() == method_colours([method])[method]
    # a guarantee that is not DP is hollow and says so; a DP one is filled
    face = to_rgba(line.get_markerfacecolor())
    if kind == "random-dp":
        assert face == to_rgba("white") and label == f"{method} ({kind}, not DP)"
    else:
        assert face == to_rgba(method_colours([method])[method]) and "not DP" not in label
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
    alm = containers(left)["alm (random-dp, not DP)"].lines[0]
    expected = [r.noise_std for r in rows if r.method == "alm" and r.seed == 0][::3]
    np.testing.assert_allclose(alm.get_xdata(), expected)
    assert left.get_xscale() == middle.get_xscale() == "log"
    # the equal-utility view has every method, each point labelled by its epsilon
    assert {k.split(" ")[0] for k in containers(right)} == {"alm", "laplace", "dpsgd"}
    labels = {part for t in right.texts for part in t.get_text().split(", ")}
    assert {"0.1", "10000", "20000"} <= labels


def test_roc_axes_are_log_log(close: list[Figure]) -> None:
    fpr = list(np.linspace(0, 1, 21))
    fig = roc_figure({("alm", 1.0, "loss"): (fpr, fpr), ("none", math.inf, "loss"): (fpr, fpr)})
    close.append(fig)
    assert fig.axes[0].get_xscale() == fig.axes[0].get_yscale() == "log"


def test_colours_follow_the_name() -> None:
    few, many = method_colours(["alm", "dpsgd"]), method_colours(["alm", "dpsgd", "laplace", "lu"])
    assert few["alm"] == many["alm"] and few["dpsgd"] == many["dpsgd"]
    names = [
        "alm",
        "laplace",
        "gaussian",
        "gaussian-classic",
        "dpsgd",
        "lu",
        "dperm",
        "dpsgd-full",
        "dpsgd-alm",
        "dpsgd-laplace",
    ]
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


# --- the trade-off ---------------------------------------------------------------------------


def no_leak_rows(rows: list[ResultRow], *, shift: float = 0.08) -> list[ResultRow]:
    """A no-leak reference: the baseline's rows of each seed, renamed, its AUCs lowered."""
    return [
        r.replace(
            method=NO_LEAK,
            test_accuracy=0.85,
            mia_auc=r.mia_auc - shift,
            mia_auc_ci_low=r.mia_auc_ci_low - shift,
            mia_auc_ci_high=r.mia_auc_ci_high - shift,
        )
        for r in rows
        if r.method == "none"
    ]


def expected_tradeoff(rows: list[ResultRow], method: str) -> list[tuple[float, float]]:
    """(mean accuracy, mean over seeds of the largest AUC) per feasible epsilon of
    ``method``, in replace-one epsilon order: computed here, from the rows alone."""
    out = []
    for epsilon in sorted({r.epsilon for r in rows if r.method == method}):
        cell = [r for r in rows if (r.method, r.epsilon) == (method, epsilon)]
        if any(r.status == "infeasible" for r in cell):
            continue
        seeds = sorted({r.seed for r in cell})
        accuracy = np.mean([next(r for r in cell if r.seed == s).test_accuracy for s in seeds])
        auc = np.mean([max(r.mia_auc for r in cell if r.seed == s) for s in seeds])
        out.append((cell[0].epsilon_replace_one, float(accuracy), float(auc)))
    return [(a, b) for _, a, b in sorted(out)]


def gid_lines(fig: Figure, gid: str) -> list[Line2D]:
    return [a for a in fig.axes[0].get_children() if isinstance(a, Line2D) and a.get_gid() == gid]


def test_tradeoff_draws_one_line_per_method_through_its_points_in_epsilon_order(
    rows: list[ResultRow], close: list[Figure]
) -> None:
    fig = tradeoff_figure(rows, members=150, num_classes=10)
    close.append(fig)
    for method in ("alm", "laplace", "dpsgd"):
        expected = expected_tradeoff(rows, method)
        assert len(expected) == (5 if method == "laplace" else 6)  # laplace 10000: infeasible
        points = gid_lines(fig, f"tradeoff-point:{method}")
        drawn = [(float(p.get_xdata()[0]), float(p.get_ydata()[0])) for p in points]
        np.testing.assert_allclose(drawn, expected)
        # the segments join consecutive epsilons, and nothing else
        segments = gid_lines(fig, f"tradeoff-line:{method}")
        joined = [tuple(map(tuple, np.column_stack(s.get_data()))) for s in segments]
        assert len(joined) == len(expected) - 1
        for (a, b), start, end in zip(joined, expected, expected[1:], strict=False):
            np.testing.assert_allclose([a, b], [start, end])
    # the unprotected head is a reference (its accuracy as a vertical line), not a method
    assert not gid_lines(fig, "tradeoff-point:none")
    accuracy = np.mean([r.test_accuracy for r in rows if r.method == "none"][::3])
    verticals = [
        line.get_xdata()[0]
        for line in fig.axes[0].get_lines()
        if len(set(line.get_xdata())) == 1 and line.get_gid() is None
    ]
    for value in (accuracy, 1 / 10):  # the unprotected accuracy, and chance
        assert any(v == pytest.approx(value) for v in verticals), value


def test_tradeoff_draws_guarantees_that_are_not_dp_hollow(
    rows: list[ResultRow], close: list[Figure]
) -> None:
    fig = tradeoff_figure(rows)
    close.append(fig)
    white = to_rgba("white")
    alm = gid_lines(fig, "tradeoff-point:alm")
    assert alm and all(to_rgba(p.get_markerfacecolor()) == white for p in alm)  # random DP
    laplace = gid_lines(fig, "tradeoff-point:laplace")
    colour = to_rgba(method_colours(["laplace"])["laplace"])
    assert all(to_rgba(p.get_markerfacecolor()) == colour for p in laplace)
    # DP-SGD: filled while (2 eps, (1 + e^eps) delta) is a guarantee, hollow from eps = 100
    dpsgd = gid_lines(fig, "tradeoff-point:dpsgd")
    faces = [to_rgba(p.get_markerfacecolor()) == white for p in dpsgd]
    assert faces == [False, False, False, True, True, True]
    # weak points are pale: DP-SGD from eps' = 20 (delta' 0.22), ALM from eps' = 100
    alphas = [p.get_alpha() for p in dpsgd]
    assert alphas[:2] == [1.0, 1.0] and all(a is not None and a < 1 for a in alphas[2:])
    labels = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert {
        "alm (random-dp, not DP)",
        "dpsgd (approx-dp)†",
        "dpsgd (none, not DP)†",
        "laplace (pure-dp)",
    } <= set(labels)
    assert any(label.startswith("pale: weak guarantee") for label in labels)


@pytest.mark.parametrize("with_reference", [True, False])
def test_tradeoff_no_leak_band_iff_the_run_has_the_reference(
    rows: list[ResultRow], close: list[Figure], with_reference: bool
) -> None:
    reference = no_leak_rows(rows) if with_reference else []
    fig = tradeoff_figure(rows + reference)
    close.append(fig)
    ax = fig.axes[0]
    bands = [p for p in ax.patches if p.get_gid() == "no-leak band"]
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert (NO_LEAK_LABEL in labels) is with_reference
    assert len(bands) == int(with_reference)
    if with_reference:
        # the band is the union of the seeds' 95% intervals of the strongest attack
        best = [max((r for r in reference if r.seed == s), key=lambda r: r.mia_auc) for s in (0, 1)]
        box = bands[0].get_bbox()  # type: ignore[attr-defined]
        assert box.y0 == pytest.approx(min(r.mia_auc_ci_low for r in best))
        assert box.y1 == pytest.approx(max(r.mia_auc_ci_high for r in best))
    # the reference is never drawn or named as a method
    assert not gid_lines(fig, f"tradeoff-point:{NO_LEAK}")
    assert not any(label.startswith(f"{NO_LEAK} (") for label in labels)


def test_tradeoff_labels_every_point_by_its_epsilon_without_overlap(
    rows: list[ResultRow], close: list[Figure]
) -> None:
    fig = tradeoff_figure(rows)
    close.append(fig)
    ax = fig.axes[0]
    renderer = fig.canvas.get_renderer()  # type: ignore[attr-defined]
    texts = [t for t in ax.texts if t.get_text()]
    shown = sorted(part for t in texts for part in t.get_text().split(", "))
    epsilons = {r.epsilon_replace_one for r in rows if r.method != "none" and r.status == "ok"}
    # every labelled point, each of its own method's colour (laplace and alm share epsilons)
    assert sorted(set(shown)) == sorted(format_epsilon(e) for e in epsilons)
    assert len(shown) == 6 + 5 + 6
    boxes = [t.get_window_extent(renderer) for t in texts]
    for i, a in enumerate(boxes):
        assert ax.get_window_extent(renderer).contains(a.x0, a.y0)
        for b in boxes[i + 1 :]:
            assert not a.overlaps(b)


# --- panels the evaluation set cannot resolve --------------------------------------------------


@pytest.mark.parametrize(
    "nonmembers, panels",
    [
        (150, ["AUC", "TPR at 1% FPR"]),
        (50, ["AUC"]),
        (1000, ["AUC", "TPR at 1% FPR", "TPR at 0.1% FPR"]),
    ],
)
def test_tpr_panels_the_evaluation_set_cannot_resolve_are_not_drawn(
    rows: list[ResultRow], close: list[Figure], nonmembers: int, panels: list[str]
) -> None:
    fig = attack_figure(rows, nonmembers=nonmembers)
    close.append(fig)
    assert [ax.get_ylabel().split("\n")[0] for ax in fig.axes] == panels
    notes = "\n".join(t.get_text() for t in fig.texts)
    if "TPR at 0.1% FPR" not in panels:
        assert f"TPR at 0.1% FPR not drawn: the evaluation set's {nonmembers} non-members" in notes


def test_tpr_panels_without_a_count_follow_the_rows(
    rows: list[ResultRow], close: list[Figure]
) -> None:
    fig = attack_figure(rows)  # every row has both TPRs
    close.append(fig)
    assert len(fig.axes) == 3
    blank = [r.replace(tpr_at_fpr_0_001=math.nan) for r in rows]
    fig = attack_figure(blank)
    close.append(fig)
    assert [ax.get_ylabel().split("\n")[0] for ax in fig.axes] == ["AUC", "TPR at 1% FPR"]
    assert "no row of the run has a value" in "\n".join(t.get_text() for t in fig.texts)


# --- ROC curves ------------------------------------------------------------------------------


def step_curve(height: float) -> tuple[list[float], list[float]]:
    """A ROC curve through (0.2, height): AUC = 0.1 height + 0.4 (height + 1)."""
    return [0.0, 0.2, 1.0], [0.0, height, 1.0]


def synthetic_rocs(
    rows: list[ResultRow],
) -> dict[tuple[str, float, str], tuple[list[float], list[float]]]:
    heights = {"loss": 0.3, "lira-online": 0.6, "lira-online-clean": 0.45}
    return {
        (r.method, r.epsilon, r.attack): step_curve(heights[r.attack])
        for r in rows
        if r.status == "ok"
    }


@pytest.mark.parametrize(
    "members, epsilon, why",
    [
        (None, 1.0, "the largest ε at which no method's guarantee is weak"),
        (150, 1.0, "the largest ε at which no method's guarantee is weak"),
        # with a million members delta = 1e-5 > 1/n: every epsilon is weak for every method
        (10**6, 0.1, "the smallest ε: every ε gives some method a weak guarantee"),
    ],
)
def test_roc_figure_is_at_the_largest_epsilon_that_is_not_weak(
    rows: list[ResultRow], close: list[Figure], members: int | None, epsilon: float, why: str
) -> None:
    rocs = synthetic_rocs(rows)
    # at eps = 10, DP-SGD's replace-one guarantee (20, 0.22) is weak; ALM's (10, 1e-5) is not
    assert roc_epsilon(rocs, rows, members=members) == (epsilon, why)
    fig = roc_figure(rocs, rows=rows, members=members)
    close.append(fig)
    assert fig.axes[0].get_title() == f"ROC (log-log) at ε = {format_epsilon(epsilon)}:\n{why}"


def test_roc_legend_says_which_curve_and_the_tables_mean(
    rows: list[ResultRow], close: list[Figure]
) -> None:
    fig = roc_figure(synthetic_rocs(rows), rows=rows)
    close.append(fig)
    legend = fig.axes[0].get_legend()
    labels = [t.get_text() for t in legend.get_texts()]
    # lira-online has the highest curve; in brackets the rows' AUC (mean over draws), over seeds
    mean = np.mean(
        [r.mia_auc for r in rows if (r.method, r.epsilon, r.attack) == ("alm", 1.0, "lira-online")]
    )
    curve = 0.1 * 0.6 + 0.4 * 1.6
    assert f"alm ({NOT_DP}): lira-online, {curve:.2f} [{mean:.2f}]" in labels
    assert f"laplace: lira-online, {curve:.2f} [" in "\n".join(labels)
    assert f"none: lira-online, {curve:.2f}" in labels  # one draw: no bracket
    title = legend.get_title().get_text()
    assert "first of 2 noise draws" in title and "mean over draws and seeds" in title


# --- readability at the report's width ------------------------------------------------------


@pytest.mark.slow
def test_every_figure_is_readable_at_the_report_width(
    rows: list[ResultRow], close: list[Figure], text_px: Callable[..., tuple[float, str]]
) -> None:
    run = rows + no_leak_rows(rows)
    rocs = synthetic_rocs(run)
    drawers = figures(run, rocs, members=150, nonmembers=150, num_classes=10)
    assert list(drawers) == list(FIGURES)
    for stem, draw in drawers.items():
        fig = draw()
        close.append(fig)
        size, text = text_px(fig, dpi=PNG_DPI, page_width=PAGE_WIDTH_PX)
        assert size >= MIN_TEXT_PX, (stem, text, size)
