"""Figures of the per-example risk (``risk.py``), written under ``RISK_FOLDER / "plots"``.

Like the risk files they are computed from the private data (scores, and for image data
the pictures of named members), so they live beside them, never in ``plots/``:

* ``hist_<method>``: LiRA's score, members against non-members, at each epsilon (and the
  unprotected head); where the two histograms coincide the attack cannot tell them apart;
* ``class_auc_<method>``: LiRA's AUC per class with its 95% DeLong interval, per epsilon;
* ``top16``: the 16 members LiRA finds most exposed, for the unprotected head and each
  method at its largest epsilon, drawn as images (only where the data are images);
* ``top_overlap``: how many of the k most exposed members of a release are among the
  unprotected head's k, as epsilon grows (k = ``risk.top_size``; chance is k / n).

Every figure uses the first seed of the run.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, NullFormatter

from alm_opacus.report.folders import replace_folder
from alm_opacus.report.plot_style import save_figure
from alm_opacus.report.results import BASELINE
from alm_opacus.report.risk import (
    RISK_FOLDER,
    CellScores,
    class_auc,
    top_overlap,
    top_size,
)
from alm_opacus.report.series import CHANCE_COLOUR, format_epsilon, method_colours

__all__ = ["RISK_DPI", "RISK_PLOTS", "risk_figures", "write_risk_plots"]

#: Where the risk figures go, relative to the run folder.
RISK_PLOTS = RISK_FOLDER / "plots"
#: Images of the most exposed members shown per release.
TOP_IMAGES = 16
#: Resolution of the PNGs.
RISK_DPI = 110
#: Histogram panels per row.
HIST_COLUMNS = 4
#: Font sizes (points). report.html shows each PNG at most 1100 px wide; every figure here
#: is narrower than that at 110 dpi, so SMALL is 13.75 px on the page.
FONT = 10.0
SMALL = 9.0
#: ``images(rows) -> (k, H, W)`` or ``(k, H, W, C)`` arrays for dataset rows.
ImageSource = Callable[[np.ndarray], np.ndarray]

Cells = Mapping[tuple[str, float], CellScores]


def _kind(cell: CellScores) -> str:
    return "lira" if "lira" in cell.scores else next(iter(cell.scores))


def _label(cell: CellScores) -> str:
    return "unprotected" if cell.method == BASELINE else f"ε = {format_epsilon(cell.epsilon)}"


def histogram_figure(cells: Sequence[CellScores]) -> Figure:
    """One panel per release of one method: the score histograms of members and
    non-members (the unprotected head first), at most :data:`HIST_COLUMNS` to a row so that
    the text stays readable at the report's width."""
    cols = min(len(cells), HIST_COLUMNS)
    grid_rows = -(-len(cells) // cols)
    fig, axes = plt.subplots(
        grid_rows, cols, figsize=(2.25 * cols, 2.3 * grid_rows + 0.9), squeeze=False
    )
    for ax, cell in zip(axes.flat, cells, strict=False):
        kind = _kind(cell)
        scores = cell.scores[kind]
        ok = np.isfinite(scores)
        # LiRA's ratio has heavy tails: bin the middle 96% and pile the rest into the ends
        low, high = np.percentile(scores[ok], [2, 98]) if ok.any() else (0.0, 1.0)
        high = high if high > low else low + 1.0
        bins = np.linspace(low, high, 25)
        shown = np.clip(scores, low, high)
        # one filled outline per histogram, not a patch per bar: the same picture, drawn in
        # about two thirds of the time (the report draws one panel per release)
        for rows, colour, label in (
            (cell.is_member & ok, "#d62728", "members"),
            (~cell.is_member & ok, "#1f77b4", "non-members"),
        ):
            ax.hist(
                shown[rows], bins=bins, alpha=0.55, color=colour, label=label, histtype="stepfilled"
            )
        ax.set_title(_label(cell), fontsize=FONT)
        ax.tick_params(labelsize=SMALL)
    for ax in axes.flat[len(cells) :]:
        ax.set_visible(False)
    for row in axes:
        row[0].set_ylabel("examples", fontsize=SMALL)
    axes[0][0].legend(fontsize=SMALL)
    method = next((c.method for c in cells if c.method != BASELINE), BASELINE)
    attacks = ", ".join(dict.fromkeys(c.attacks[_kind(c)] for c in cells))
    fig.suptitle(f"{method}: attack scores of members and non-members", fontsize=FONT + 1)
    fig.supxlabel(f"{attacks} score (2-98% range; the ends hold the tails)", fontsize=SMALL)
    fig.tight_layout()
    return fig


def class_auc_figure(cells: Sequence[CellScores]) -> Figure:
    """LiRA's AUC per class with its 95% interval, one series per release."""
    fig, ax = plt.subplots(figsize=(7.5, 3.4))
    width = 0.8 / max(len(cells), 1)
    colours = plt.get_cmap("viridis")(np.linspace(0, 0.9, max(len(cells), 1)))
    for k, cell in enumerate(cells):
        found = class_auc(cell, kind=_kind(cell))
        if not found:
            continue
        labels = np.array([f[0] for f in found], dtype=float)
        auc = np.array([f[1] for f in found])
        err = np.array(
            [
                [a - f[2] for a, f in zip(auc, found, strict=True)],
                [f[3] - a for a, f in zip(auc, found, strict=True)],
            ]
        )
        colour = "black" if cell.method == BASELINE else colours[k]
        ax.errorbar(
            labels - 0.4 + width * (k + 0.5),
            auc,
            yerr=np.nan_to_num(err),
            fmt="o",
            ms=4,
            capsize=2,
            lw=0.9,
            color=colour,
            label=_label(cell),
        )
    ax.axhline(0.5, color=CHANCE_COLOUR, ls=":", lw=1, label="chance")
    classes = sorted({int(v) for c in cells for v in c.labels})
    ax.set_xticks(classes)
    ax.tick_params(labelsize=SMALL)
    ax.set_xlabel("class", fontsize=FONT)
    ax.set_ylabel("AUC (95% DeLong interval)", fontsize=FONT)
    method = next((c.method for c in cells if c.method != BASELINE), BASELINE)
    ax.set_title(f"{method}: membership AUC per class", fontsize=FONT + 1)
    ax.legend(fontsize=SMALL, loc="center left", bbox_to_anchor=(1.0, 0.5))
    fig.tight_layout()
    return fig


def _grey(image: np.ndarray) -> tuple[np.ndarray, str | None]:
    img = np.asarray(image, dtype=np.float64)
    if img.ndim == 3 and img.shape[0] in (1, 3) and img.shape[-1] not in (1, 3):
        img = np.moveaxis(img, 0, -1)  # CHW -> HWC
    if img.ndim == 3 and img.shape[-1] == 1:
        img = img[..., 0]
    top = img.max() if img.size else 1.0
    img = img / (255.0 if top > 1 else 1.0)
    return np.clip(img, 0, 1), ("gray_r" if img.ndim == 2 else None)


def top_images_figure(cells: Sequence[CellScores], images: ImageSource) -> Figure:
    """Per release (one row each), its :data:`TOP_IMAGES` most exposed members."""
    # 0.55 in per image: the 16 of a row fit the report's width with their row label
    fig, axes = plt.subplots(
        len(cells),
        TOP_IMAGES,
        figsize=(TOP_IMAGES * 0.55 + 1.1, 0.9 * len(cells) + 0.6),
        squeeze=False,
    )
    for row, cell in zip(axes, cells, strict=True):
        kind = _kind(cell)
        ranks = cell.ranks(kind)
        order = [i for i in np.argsort(np.nan_to_num(ranks, nan=np.inf)) if cell.is_member[i]]
        chosen = order[:TOP_IMAGES]
        pictures = images(cell.rows[chosen]) if chosen else np.empty((0,))
        for j, ax in enumerate(row):
            ax.set_xticks([])
            ax.set_yticks([])
            if j >= len(chosen):
                ax.set_visible(False)
                continue
            picture, cmap = _grey(pictures[j])
            ax.imshow(picture, cmap=cmap)
            ax.set_title(f"#{cell.rows[chosen[j]]}", fontsize=SMALL - 1, pad=1)
        row[0].set_ylabel(
            f"{cell.method}\n{_label(cell)}", fontsize=SMALL, rotation=0, ha="right", va="center"
        )
    fig.suptitle(
        f"the {TOP_IMAGES} most exposed members (LiRA rank 1 first; above each: its dataset row)",
        fontsize=FONT,
    )
    fig.subplots_adjust(
        wspace=0.08, hspace=0.5, left=0.12, right=0.995, top=1 - 0.45 / fig.get_figheight()
    )
    return fig


def _log_x(ax: plt.Axes) -> None:
    ax.set_xscale("log")
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.xaxis.set_minor_formatter(NullFormatter())


def overlap_figure(cells: Cells) -> Figure:
    """Per method, the overlap of each release's top-k with the unprotected head's top-k."""
    fig, ax = plt.subplots(figsize=(6, 3.6))
    baselines = {c.seed: c for (m, _), c in cells.items() if m == BASELINE}
    base = next(iter(baselines.values()), None)
    methods = sorted({m for m, _ in cells} - {BASELINE})
    colours = method_colours(methods)
    k = 0
    for method in methods:
        found = sorted((e, c) for (m, e), c in cells.items() if m == method and c.seed in baselines)
        if not found:
            continue
        xs = [e for e, _ in found]
        ys = [top_overlap(c, baselines[c.seed], kind=_kind(c)) for _, c in found]
        k = top_size(int(found[0][1].is_member.sum()))
        ax.plot(xs, ys, marker="o", color=colours[method], label=method)
    if base is not None:
        n = int(base.is_member.sum())
        k = top_size(n)
        ax.axhline(k / n, color=CHANCE_COLOUR, ls=":", lw=1, label=f"chance (k/n = {k}/{n})")
    if ax.has_data():
        _log_x(ax)
    ax.set_ylim(0, 1.02)
    ax.tick_params(labelsize=SMALL)
    ax.set_xlabel("ε (as requested)", fontsize=FONT)
    ax.set_ylabel(f"share of the top {k}\nalso in the unprotected top {k}", fontsize=FONT)
    ax.set_title("Are the same members exposed? (LiRA)", fontsize=FONT + 1)
    ax.legend(fontsize=SMALL, loc="center left", bbox_to_anchor=(1.0, 0.5))
    fig.tight_layout()
    return fig


def risk_figures(
    cells: Cells, *, images: ImageSource | None = None
) -> dict[str, Callable[[], Figure]]:
    """Every risk figure by file stem (``cells``: one seed's scores per (method, epsilon))."""
    out: dict[str, Callable[[], Figure]] = {}
    base = [c for (m, _), c in cells.items() if m == BASELINE]
    methods = sorted({m for m, _ in cells} - {BASELINE})
    for method in methods:
        series = base + [
            c for (m, e), c in sorted(cells.items(), key=lambda kv: kv[0][1]) if m == method
        ]
        out[f"hist_{method}"] = lambda s=series: histogram_figure(s)  # type: ignore[misc]
        out[f"class_auc_{method}"] = lambda s=series: class_auc_figure(s)  # type: ignore[misc]
    if not methods and base:
        out["hist_none"] = lambda: histogram_figure(base)
        out["class_auc_none"] = lambda: class_auc_figure(base)
    if images is not None:
        largest = [
            max((c for (m, _), c in cells.items() if m == method), key=lambda c: c.epsilon)
            for method in methods
        ]
        rows = base + largest
        if rows:
            out["top16"] = lambda: top_images_figure(rows, images)
    if base and methods:
        out["top_overlap"] = lambda: overlap_figure(cells)
    return out


def write_risk_plots(run: Path, cells: Cells, *, images: ImageSource | None = None) -> list[Path]:
    """Replace ``run / RISK_PLOTS`` with every figure of :func:`risk_figures` (PNG,
    :data:`RISK_DPI`).

    Returns:
        The PNG paths written.
    """
    drawers = risk_figures(cells, images=images)
    folder = Path(run) / RISK_PLOTS

    def build(tmp: Path) -> None:
        for stem, draw in drawers.items():
            fig = draw()
            try:
                save_figure(fig, [(tmp / f"{stem}.png", RISK_DPI)])
            finally:
                plt.close(fig)

    replace_folder(folder, build)
    return [folder / f"{stem}.png" for stem in drawers]


def one_seed(
    cells: Mapping[tuple[str, float, int], CellScores],
) -> dict[tuple[str, float], CellScores]:
    """The cells of the smallest seed, keyed by (method, epsilon)."""
    if not cells:
        return {}
    seed = min(s for _, _, s in cells)
    return {(m, e): c for (m, e, s), c in cells.items() if s == seed and not math.isnan(e)}
