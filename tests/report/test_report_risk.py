"""Per-example risk: scores by dataset row, ranks, the unprotected column, the files and the
Python API, per-class AUC against scikit-learn, and the top-k overlap."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pytest
from scipy import stats
from sklearn.metrics import roc_auc_score

from alm_opacus.report.risk import (
    RISK_FOLDER,
    CellScores,
    cell_scores,
    class_auc,
    read_risk,
    risk_path,
    risk_table,
    top_overlap,
    top_size,
    write_risk,
)
from alm_opacus.report.risk_plots import RISK_DPI, RISK_PLOTS, risk_figures, write_risk_plots

MEMBERS = 40


def make_cell(method: str, epsilon: float, *, seed: int = 0, signal: float = 1.0) -> CellScores:
    """Members then non-members, rows shuffled; LiRA and loss scores with a member signal."""
    rng = np.random.default_rng(int(1000 * signal) + seed + (0 if math.isinf(epsilon) else 7))
    rows = np.random.default_rng(seed).permutation(1000)[: 2 * MEMBERS]
    member = np.r_[np.ones(MEMBERS, bool), np.zeros(MEMBERS, bool)]
    lira = rng.normal(size=2 * MEMBERS) + signal * member
    return CellScores(
        method=method,
        epsilon=epsilon,
        seed=seed,
        rows=rows,
        labels=rows % 4,
        is_member=member,
        scores={"lira": lira, "loss": -np.abs(rng.normal(size=2 * MEMBERS))},
        attacks={"lira": "lira-online", "loss": "loss"},
        draws=2,
    )


def test_ranks_put_the_highest_member_score_first_and_share_ties() -> None:
    cell = make_cell("alm", 1.0)
    scores = cell.scores["lira"].copy()
    scores[0] = scores[1] = scores[:MEMBERS].max() + 1  # a tie at the top
    tied = CellScores(**{**cell.__dict__, "scores": {"lira": scores, "loss": scores}})
    ranks = tied.ranks("lira")
    assert ranks[0] == ranks[1] == 1 and np.isnan(ranks[MEMBERS:]).all()
    # away from ties, the rank is scipy's "min" rank of the negated member scores
    expected = stats.rankdata(-scores[:MEMBERS], method="min")
    assert np.array_equal(ranks[:MEMBERS], expected)
    # many ties (scores on a coarse grid) and unscored members (NaN: RMIA without a
    # reference): scipy's "min" ranks among the scored, the unscored after them in row order
    coarse = np.round(cell.scores["lira"], 1)
    coarse[[3, 17]] = np.nan
    grid = CellScores(**{**cell.__dict__, "scores": {"lira": coarse, "loss": coarse}})
    got = grid.ranks("lira")[:MEMBERS]
    scored = ~np.isnan(coarse[:MEMBERS])
    assert np.unique(coarse[:MEMBERS][scored]).size < scored.sum() - 5  # ties do occur
    assert np.array_equal(got[scored], stats.rankdata(-coarse[:MEMBERS][scored], method="min"))
    assert list(got[[3, 17]]) == [MEMBERS - 1, MEMBERS]


def test_cell_scores_average_the_draws_and_prefer_online_lira() -> None:
    rng = np.random.default_rng(0)
    draws = [
        {name: rng.normal(size=6) for name in ("loss", "lira-offline", "lira-online")}
        for _ in range(3)
    ]
    cell = cell_scores(
        method="alm",
        epsilon=1.0,
        seed=0,
        rows=np.arange(6),
        labels=np.zeros(6, int),
        draws=draws,
        is_member=np.r_[np.ones(3, bool), np.zeros(3, bool)],
    )
    assert cell is not None and cell.attacks == {"lira": "lira-online", "loss": "loss"}
    assert np.allclose(cell.scores["lira"], np.mean([d["lira-online"] for d in draws], axis=0))
    assert cell.draws == 3
    none = cell_scores(
        method="alm",
        epsilon=1.0,
        seed=0,
        rows=np.arange(6),
        labels=np.zeros(6, int),
        draws=[{"shadow": np.zeros(6)}],
        is_member=np.r_[np.ones(3, bool), np.zeros(3, bool)],
    )
    assert none is None  # neither a LiRA nor the loss attack ran


def test_risk_file_round_trips_and_names_the_unprotected_score(tmp_path: Path) -> None:
    base = make_cell("none", math.inf, signal=2.0)
    cell = make_cell("alm", 1000.0)
    path = write_risk(tmp_path, [cell], {0: base})
    assert path == tmp_path / RISK_FOLDER / "alm-eps1000.csv" == tmp_path / risk_path("alm", 1000.0)
    table = risk_table(tmp_path, method="alm", epsilon=1000.0)
    assert table.kinds == ["lira", "loss"] and table.seeds == [0]
    back = table.cell(0)
    order = np.lexsort((cell.rows, ~cell.is_member))  # members then non-members, by row
    assert np.array_equal(back.rows, cell.rows[order])
    assert np.allclose(back.scores["lira"], cell.scores["lira"][order], rtol=0, atol=0)
    clean = dict(zip(base.rows.tolist(), base.scores["lira"], strict=True))
    for record in table.records:
        assert record["lira_score_unprotected"] == clean[record["row"]]
    top = table.top(3)
    assert [r["lira_rank"] for r in top.records] == [1, 2, 3]
    assert top.records[0]["lira_score"] == cell.scores["lira"][:MEMBERS].max()
    assert "lira_rank" in str(top)


def test_missing_and_corrupt_risk_files_are_named(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"no risk file .*alm-eps2\.csv"):
        risk_table(tmp_path, method="alm", epsilon=2.0)
    bad = tmp_path / "bad.csv"
    bad.write_text("a,b\n1,2\n")
    with pytest.raises(ValueError, match=r"bad\.csv: not a readable risk file"):
        read_risk(bad, method="alm", epsilon=1.0)
    with pytest.raises(ValueError, match="exactly one"):
        write_risk(tmp_path, [make_cell("alm", 1.0), make_cell("alm", 2.0)], {})


def test_class_auc_matches_scikit_learn_per_class() -> None:
    cell = make_cell("alm", 1.0, signal=1.5)
    found = class_auc(cell)
    assert [label for label, *_ in found] == [0, 1, 2, 3]
    for label, auc, low, high in found:
        mask = cell.labels == label
        assert auc == pytest.approx(roc_auc_score(cell.is_member[mask], cell.scores["lira"][mask]))
        assert low < auc < high


def test_top_overlap_counts_shared_members() -> None:
    base = make_cell("none", math.inf, signal=3.0)
    same = CellScores(**{**base.__dict__, "method": "alm", "epsilon": 1.0})
    assert top_overlap(same, base) == 1.0
    k = top_size(MEMBERS)
    assert k == MEMBERS // 4 and top_size(1000) == 100
    flipped = CellScores(**{**same.__dict__, "scores": {"lira": -base.scores["lira"]}})
    ranks_base, ranks_flip = base.ranks("lira"), flipped.ranks("lira")
    mine = set(base.rows[ranks_flip <= k].tolist())
    theirs = set(base.rows[ranks_base <= k].tolist())
    assert top_overlap(flipped, base) == len(mine & theirs) / k


@pytest.mark.slow
def test_risk_figures_are_written_with_and_without_images(tmp_path: Path) -> None:
    cells = {
        (c.method, c.epsilon): c
        for c in (
            make_cell("none", math.inf, signal=2.0),
            make_cell("alm", 1.0),
            make_cell("alm", 100.0),
            make_cell("dpsgd", 1.0),
        )
    }
    pictures = np.random.default_rng(0).integers(0, 256, size=(1000, 8, 8), dtype=np.uint8)
    written = write_risk_plots(tmp_path, cells, images=lambda rows: pictures[rows])
    names = sorted(p.stem for p in written)
    assert names == [
        "class_auc_alm",
        "class_auc_dpsgd",
        "hist_alm",
        "hist_dpsgd",
        "top16",
        "top_overlap",
    ]
    for path in written:
        assert path.parent == tmp_path / RISK_PLOTS and path.read_bytes()[:4] == b"\x89PNG"
    without = write_risk_plots(tmp_path, cells, images=None)  # feature data: no pictures
    assert "top16" not in {p.stem for p in without}
    assert sorted(p.name for p in (tmp_path / RISK_PLOTS).iterdir()) == sorted(
        p.name for p in without
    )


@pytest.mark.slow
def test_risk_figures_are_readable_at_the_report_width(
    text_px: Callable[..., tuple[float, str]],
) -> None:
    # the default grid: the unprotected head and six epsilons, and image data
    cells = {("none", math.inf): make_cell("none", math.inf, signal=2.0)}
    for epsilon in (0.1, 1.0, 10.0, 100.0, 1000.0, 10000.0):
        for method in ("alm", "dpsgd"):
            cells[(method, epsilon)] = make_cell(method, epsilon)
    pictures = np.random.default_rng(0).integers(0, 256, size=(1000, 8, 8), dtype=np.uint8)
    drawers = risk_figures(cells, images=lambda rows: pictures[rows])
    assert {"hist_alm", "class_auc_alm", "top16", "top_overlap"} <= set(drawers)
    for stem, draw in drawers.items():
        fig = draw()
        try:
            # report.html shows the risk figures in the same 1100 px column as plots/
            size, text = text_px(fig, dpi=RISK_DPI, page_width=1100)
        finally:
            plt.close(fig)
        assert size >= 10, (stem, text, size)
