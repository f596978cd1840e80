"""PNG plots of a run: the ALM paper's Figures 1 and 2, and ROC curves on log-log axes."""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # headless: plots are files, never windows

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.figure import Figure

from alm_opacus.report.results import ResultRow
from alm_opacus.report.table import best_attack_rows

RocMap = Mapping[tuple[str, float, str], tuple[Sequence[float], Sequence[float]]]


def _series(
    rows: Sequence[ResultRow], field: str, std_field: str | None
) -> dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """Per method: epsilons, means and error bars of ``field`` over seeds (and draws).

    The error bar combines the spread over seeds with the mean within-seed spread over
    noise draws (``std_field``), as sqrt(var_seeds + mean var_draws).
    """
    per: dict[str, dict[float, list[ResultRow]]] = defaultdict(lambda: defaultdict(list))
    for (method, epsilon), cell in best_attack_rows(rows).items():
        if not math.isinf(epsilon):
            per[method][epsilon].extend(cell)
    out = {}
    for method, cells in per.items():
        eps = np.array(sorted(cells))
        means, errs, kept = [], [], []
        for e in eps:
            vals = np.array([getattr(r, field) for r in cells[e]], dtype=float)
            if np.isnan(vals).all():
                continue
            within = (np.array([getattr(r, std_field) for r in cells[e]], dtype=float)
                      if std_field else np.zeros_like(vals))  # fmt: skip
            within = np.nan_to_num(within)
            means.append(np.nanmean(vals))
            errs.append(math.sqrt(np.nanvar(vals) + np.mean(within**2)))
            kept.append(e)
        if kept:
            out[method] = (np.array(kept), np.array(means), np.array(errs))
    return out


def _log_x(ax: plt.Axes) -> None:
    if ax.has_data():
        ax.set_xscale("log")
    else:
        ax.text(0.5, 0.5, "no data for this plot in the run", ha="center", transform=ax.transAxes)


def _baseline(rows: Sequence[ResultRow], field: str) -> float:
    vals = [getattr(r, field) for r in rows if r.method == "none"]
    finite = [v for v in vals if not math.isnan(v)]
    return float(np.max(finite)) if finite else math.nan


def plot_utility(rows: Sequence[ResultRow], path: Path) -> None:
    """ALM paper, Figure 1: utility loss against epsilon, one line per mechanism."""
    fig, ax = plt.subplots(figsize=(6, 4))
    for method, (eps, mean, err) in _series(rows, "utility_loss", "utility_loss_std").items():
        ax.errorbar(eps, mean, yerr=err, marker="o", capsize=3, label=method)
    _log_x(ax)
    ax.set_xlabel("epsilon")
    ax.set_ylabel("utility loss  1 - M(protected)/M(unprotected)")
    ax.set_title("Utility loss vs privacy budget")
    ax.axhline(0.0, color="grey", lw=0.8)
    if ax.get_legend_handles_labels()[1]:
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_mia(rows: Sequence[ResultRow], path: Path) -> None:
    """ALM paper, Figure 2: best-attack MIA accuracy against epsilon and against utility loss."""
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    acc = _series(rows, "mia_accuracy", "mia_accuracy_std")
    loss = _series(rows, "utility_loss", "utility_loss_std")
    for method, (eps, mean, err) in acc.items():
        left.errorbar(eps, mean, yerr=err, marker="o", capsize=3, label=method)
        if method in loss:
            right.errorbar(loss[method][1], mean, yerr=err, marker="o", capsize=3, label=method)
    base = _baseline(rows, "mia_accuracy")
    for ax in (left, right):
        ax.axhline(0.5, color="grey", lw=0.8, ls=":", label="chance")
        if not math.isnan(base):
            ax.axhline(base, color="black", lw=0.8, ls="--", label="unprotected")
        ax.set_ylabel("best-attack MIA accuracy")
    _log_x(left)
    left.set_xlabel("epsilon")
    left.set_title("MIA accuracy vs epsilon")
    right.set_xlabel("utility loss")
    right.set_title("MIA accuracy vs utility loss")
    left.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def roc_figure(rocs: RocMap, *, epsilon: float | None = None) -> Figure:
    """ROC curves on log-log axes (Carlini et al. 2022) at ``epsilon`` (default: the largest
    finite one): per method, its strongest attack by AUC, plus the unprotected head."""
    finite = sorted({e for (_, e, _) in rocs if not math.isinf(e)})
    target = epsilon if epsilon is not None else (finite[-1] if finite else math.inf)
    fig, ax = plt.subplots(figsize=(5.5, 5))
    floor = 1e-4
    best: dict[str, tuple[float, str, np.ndarray, np.ndarray]] = {}
    for (method, eps, attack), (fpr, tpr) in rocs.items():
        if eps != target and not math.isinf(eps):
            continue
        f, t = np.asarray(fpr, dtype=float), np.asarray(tpr, dtype=float)
        auc = float(np.sum(np.diff(f) * (t[1:] + t[:-1]) / 2))
        if method not in best or auc > best[method][0]:
            best[method] = (auc, attack, f, t)
    for method, (auc, attack, f, t) in sorted(best.items()):
        ax.plot(np.clip(f, floor, 1), np.clip(t, floor, 1), lw=1.2,
                label=f"{method}: {attack} (AUC {auc:.2f})")  # fmt: skip
    ax.plot([floor, 1], [floor, 1], color="grey", ls=":", lw=0.8)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(floor, 1)
    ax.set_ylim(floor, 1)
    ax.set_xlabel("false positive rate")
    ax.set_ylabel("true positive rate")
    ax.set_title(f"ROC (log-log), epsilon={target:g}")
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    return fig


def plot_roc(rocs: RocMap, path: Path, *, epsilon: float | None = None) -> None:
    """Save :func:`roc_figure` as a PNG."""
    fig = roc_figure(rocs, epsilon=epsilon)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def write_plots(rows: Sequence[ResultRow], rocs: RocMap, folder: Path) -> list[Path]:
    """Write every plot under ``folder``; returns the paths written."""
    folder.mkdir(parents=True, exist_ok=True)
    written = [folder / "fig1_utility_loss.png", folder / "fig2_mia.png"]
    plot_utility(rows, written[0])
    plot_mia(rows, written[1])
    if rocs:
        written.append(folder / "roc_loglog.png")
        plot_roc(rocs, written[2])
    return written
