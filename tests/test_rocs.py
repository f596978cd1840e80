"""Bounded ROC curves (``bound_roc``) and ``rocs.jsonl``, appended per cell (issue 38, item 4):
every stored point lies on the full curve, the size does not grow with the scores beyond the
low-FPR part, the file grows by one line per cell and a killed append is dropped on resume."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from sklearn.metrics import roc_curve as sklearn_roc

from alm_opacus.attacks.metrics import roc_auc, roc_curve
from alm_opacus.attacks.roc_bounds import ROC_FPR_CUT, ROC_GRID, ROC_GRID_POINTS, bound_roc
from alm_opacus.report.results import ResultRow, read_results
from alm_opacus.report.rocs import ROCS_FILE, RocLine, append_rocs, read_rocs, roc_map
from alm_opacus.run import writer as writer_module
from alm_opacus.run.cells import CellOutcome
from alm_opacus.run.config import RunConfig
from alm_opacus.run.plan import plan_run
from alm_opacus.run.resume import check_manifest, check_rocs
from alm_opacus.run.writer import RunWriter


def _scores(
    n: int, *, seed: int, shift: float = 0.8, decimals: int | None = 2
) -> tuple[np.ndarray, np.ndarray]:
    """``n`` scores, half of them members' (rounded: many ties, across the two classes)."""
    rng = np.random.default_rng(seed)
    member = rng.random(n) < 0.5
    scores = rng.normal(size=n) + shift * member
    return (scores if decimals is None else np.round(scores, decimals)), member


def _full(
    n: int, *, seed: int, shift: float = 0.8, decimals: int | None = 2
) -> tuple[np.ndarray, np.ndarray]:
    scores, member = _scores(n, seed=seed, shift=shift, decimals=decimals)
    fpr, tpr, _ = sklearn_roc(member, scores, drop_intermediate=False)
    return fpr, tpr


def _on_polyline(x: float, y: float, fpr: np.ndarray, tpr: np.ndarray) -> bool:
    """Whether (x, y) lies on a segment of the polyline through (fpr, tpr)."""
    lo = int(np.searchsorted(fpr, x, side="left")) - 1
    hi = int(np.searchsorted(fpr, x, side="right"))
    for i in range(max(lo, 0), min(hi, fpr.size - 1) + 1):
        a, b = (fpr[i], tpr[i]), (fpr[min(i + 1, fpr.size - 1)], tpr[min(i + 1, fpr.size - 1)])
        if not a[0] <= x <= b[0]:
            continue
        if b[0] == a[0]:
            if min(a[1], b[1]) - 1e-12 <= y <= max(a[1], b[1]) + 1e-12:
                return True
        elif abs(a[1] + (x - a[0]) / (b[0] - a[0]) * (b[1] - a[1]) - y) <= 1e-12:
            return True
    return False


def _run_interiors(fpr: np.ndarray) -> np.ndarray:
    """The vertices inside a vertical run (same FPR before and after)."""
    return np.r_[False, fpr[1:] == fpr[:-1]] & np.r_[fpr[:-1] == fpr[1:], False]


@pytest.mark.parametrize(("n", "seed"), [(300, 0), (4_000, 1), (20_000, 2)])
def test_every_bounded_point_lies_on_sklearns_full_curve(n: int, seed: int) -> None:
    fpr, tpr = _full(n, seed=seed)
    # the project's curve is sklearn's (drop_intermediate=False)
    scores, member = _scores(n, seed=seed)
    ours = roc_curve(scores=scores, is_member=member)
    np.testing.assert_array_equal(ours.fpr, fpr)
    np.testing.assert_array_equal(ours.tpr, tpr)
    bf, bt = bound_roc(fpr=fpr, tpr=tpr)
    assert (bf[0], bt[0], bf[-1], bt[-1]) == (0.0, 0.0, 1.0, 1.0)
    assert np.all(np.diff(bf) >= 0) and np.all(np.diff(bt) >= 0)
    off = [(x, y) for x, y in zip(bf, bt, strict=True) if not _on_polyline(x, y, fpr, tpr)]
    assert off == []
    # every grid FPR from the first false positive on is kept, at the full curve's top TPR there
    first = fpr[fpr > 0].min()
    for g in ROC_GRID[first <= ROC_GRID]:
        assert g in bf
        assert bt[bf == g].max() >= tpr[fpr <= g].max() - 1e-12
    assert ROC_GRID.size == ROC_GRID_POINTS and (ROC_GRID[0], ROC_GRID[-1]) == (1e-3, 1.0)


def test_the_low_fpr_part_is_the_full_curves_points() -> None:
    fpr, tpr = _full(
        60_000, seed=3, shift=2.5, decimals=3
    )  # a strong attack: long vertical runs at low FPR
    bf, bt = bound_roc(fpr=fpr, tpr=tpr)
    low = (fpr < ROC_FPR_CUT) & ~_run_interiors(fpr)
    kept = bf < ROC_FPR_CUT
    np.testing.assert_array_equal(bf[kept], fpr[low])
    np.testing.assert_array_equal(bt[kept], tpr[low])
    # the dropped run interiors lie on the bounded curve: it is the same polyline there
    for x, y in zip(fpr[fpr < ROC_FPR_CUT], tpr[fpr < ROC_FPR_CUT], strict=True):
        assert _on_polyline(x, y, bf, bt)
    assert tpr[fpr < ROC_FPR_CUT].max() > 0.05  # the case is what it claims


def test_the_size_is_bounded_whatever_the_number_of_scores() -> None:
    fpr, tpr = _full(100_000, seed=4, decimals=None)  # one vertex per score
    negatives = round(1 / fpr[fpr > 0].min())
    bf, bt = bound_roc(fpr=fpr, tpr=tpr)
    low = int((bf < ROC_FPR_CUT).sum())
    assert low <= 2 * (ROC_FPR_CUT * negatives + 2)
    assert bf.size - low <= ROC_GRID_POINTS + 2
    assert fpr.size > 5 * bf.size  # much smaller than the full curve
    # the trapezoid AUC of the stored curve is the full one's to well under the figures' 0.01
    scores, member = _scores(100_000, seed=4, decimals=None)
    full = roc_auc(roc_curve(scores=scores, is_member=member))
    assert abs(float(np.sum(np.diff(bf) * (bt[1:] + bt[:-1]) / 2)) - full) < 1e-3


def test_a_small_evaluation_set_keeps_its_first_false_positive() -> None:
    fpr, tpr = _full(300, seed=5)  # about 150 non-members: 1/n above the cut
    first = fpr[fpr > 0].min()
    assert first > ROC_FPR_CUT
    bf, bt = bound_roc(fpr=fpr, tpr=tpr)
    assert bf[bf > 0].min() == first  # where the log-log axes start (roc_floor)
    np.testing.assert_array_equal(bt[bf == first], np.unique(tpr[fpr == first][[0, -1]]))


@pytest.mark.parametrize(
    ("fpr", "tpr", "needle"),
    [
        ([0.0, 0.5, 1.0], [0.0, 1.0], "1-d of one length"),
        ([0.1, 1.0], [0.0, 1.0], "from (0, 0) to (1, 1)"),
        ([0.0, 0.6, 0.4, 1.0], [0.0, 0.5, 0.6, 1.0], "ascending"),
    ],
)
def test_bound_roc_refuses_what_is_not_a_full_curve(
    fpr: list[float], tpr: list[float], needle: str
) -> None:
    with pytest.raises(ValueError) as info:
        bound_roc(fpr=fpr, tpr=tpr)
    assert needle in str(info.value)


# -- rocs.jsonl ---------------------------------------------------------------------------


def _line(method: str, epsilon: float, seed: int, *, tpr: float = 0.5) -> RocLine:
    return RocLine(
        method=method,
        epsilon=epsilon,
        seed=seed,
        curves={"loss": ([0.0, 0.25, 1.0], [0.0, tpr, 1.0]), "lira": ([0.0, 1.0], [0.0, 1.0])},
    )


def test_lines_round_trip_and_the_last_seed_wins(tmp_path: Path) -> None:
    path = tmp_path / ROCS_FILE
    lines = [_line("none", math.inf, 0), _line("alm", 1.0, 0), _line("alm", 1.0, 1, tpr=0.7)]
    for line in lines:
        append_rocs(path, line)
    found = read_rocs(path)
    assert found.lines == lines and found.dropped == 0
    assert found.kept == path.read_bytes() == b"".join(x.to_bytes() for x in lines)
    rocs = roc_map(found.lines)
    assert rocs[("alm", 1.0, "loss")] == ([0.0, 0.25, 1.0], [0.0, 0.7, 1.0])
    assert rocs[("none", math.inf, "lira")] == ([0.0, 1.0], [0.0, 1.0])


def test_a_torn_line_and_cells_without_rows_are_dropped(tmp_path: Path) -> None:
    path = tmp_path / ROCS_FILE
    append_rocs(path, _line("none", math.inf, 0))
    append_rocs(path, _line("alm", 1.0, 0))
    whole = path.read_bytes()
    with open(path, "ab") as handle:
        handle.write(_line("alm", 2.0, 0).to_bytes()[:40])  # killed mid-append
    found = read_rocs(path, cells={("none", "inf", 0)})
    assert [x.cell() for x in found.lines] == [("none", "inf", 0)]
    assert found.dropped == 2 and found.kept == _line("none", math.inf, 0).to_bytes()
    assert read_rocs(path).kept == whole


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        (b"{not json}\n", "line 2: expected one cell's curves"),
        (b'{"method":"alm","epsilon":1,"seed":0}\n', "line 2: expected one cell's curves"),
        (
            b'{"method":"alm","epsilon":1,"seed":0,"curves":{"loss":{"fpr":[0,1],"tpr":[0,2]}}}\n',
            "all in [0, 1]",
        ),
        (b"\n", "line 2: expected one cell's curves"),
        (
            b'{"method":"none","epsilon":"inf","seed":0,"curves":{}}\n',
            "repeats the curves of line 1",
        ),
    ],
    ids=["not-json", "no-curves", "tpr-2", "empty-line", "repeated-cell"],
)
def test_a_malformed_complete_line_is_named(tmp_path: Path, text: bytes, needle: str) -> None:
    path = tmp_path / ROCS_FILE
    append_rocs(path, _line("none", math.inf, 0))
    with open(path, "ab") as handle:
        handle.write(text)
    with pytest.raises(ValueError) as info:
        read_rocs(path)
    assert str(info.value).startswith(f"{path}: line 2: ") and needle in str(info.value)


# -- the writer: appended per cell, before results.csv ------------------------------------


def _row(method: str, epsilon: float, seed: int) -> ResultRow:
    return ResultRow(
        dataset="digits",
        method=method,
        epsilon=epsilon,
        delta=0.0,
        guarantee="pure-dp",
        sensitivity=1.0,
        noise_scale=1.0,
        seed=seed,
        test_accuracy=0.5,
        utility_loss=0.4,
        attack="loss",
        mia_auc=0.55,
    )


def _outcome(epsilon: float, seed: int = 0) -> CellOutcome:
    full_fpr, full_tpr = _full(2_000, seed=int(epsilon * 10))
    fpr, tpr = bound_roc(fpr=full_fpr, tpr=full_tpr)
    return CellOutcome(
        rows=[_row("alm", epsilon, seed)],
        rocs={("alm", epsilon, "loss"): (fpr.tolist(), tpr.tolist())},
    )


def _writer(out: Path, *, resume: bool = False) -> RunWriter:
    settings = plan_run(
        RunConfig(methods=("alm",), epsilons=(1.0, 2.0, 4.0), out=str(out))
    ).settings
    return RunWriter(out, settings=settings, resume=resume)


class _Killed(BaseException):
    """A SIGKILL at a known point: nothing after it runs."""


def test_each_cell_appends_one_line_and_leaves_the_earlier_ones(tmp_path: Path) -> None:
    w = _writer(tmp_path)
    before = b""
    for epsilon in (1.0, 2.0, 4.0):
        w.add(_outcome(epsilon))
        now = (tmp_path / ROCS_FILE).read_bytes()
        assert now.startswith(before) and now.count(b"\n") == before.count(b"\n") + 1
        assert json.loads(now[len(before) :])["epsilon"] == epsilon
        before = now
    assert not (tmp_path / "rocs.json").exists()
    assert w.manifest.files[ROCS_FILE].size == len(before)


@pytest.mark.parametrize("kill", ["mid-append", "before-results"])
def test_a_killed_cell_resumes_to_the_straight_runs_curves(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kill: str
) -> None:
    straight = tmp_path / "straight"
    w = _writer(straight)
    for epsilon in (1.0, 2.0, 4.0):
        w.add(_outcome(epsilon))
    out = tmp_path / "killed"
    w = _writer(out)
    w.add(_outcome(1.0))
    if kill == "mid-append":

        def torn(path: Path, line: RocLine) -> None:
            with open(path, "ab") as handle:
                handle.write(line.to_bytes()[:100])
            raise _Killed

        monkeypatch.setattr(writer_module, "append_rocs", torn)
    else:

        def killed(path: Path, rows: object) -> None:
            raise _Killed

        monkeypatch.setattr(writer_module, "write_results", killed)
    with pytest.raises(_Killed):
        w.add(_outcome(2.0))
    monkeypatch.undo()
    first = (straight / ROCS_FILE).read_bytes().split(b"\n")[0] + b"\n"
    left = (out / ROCS_FILE).read_bytes()
    assert left.startswith(first) and len(left) > len(first)  # the killed cell's (part) line
    assert [r.epsilon for r in read_results(out / "results.csv")] == [1.0]
    assert ROCS_FILE in w.manifest.writing  # a kill leaves it named: resume accepts it
    check_manifest(out)
    settings = json.loads((out / "config.json").read_text())
    check_rocs(out / ROCS_FILE, settings=settings, cells={("alm", "1", 0)})
    resumed = _writer(out, resume=True)
    assert set(resumed.rocs) == {("alm", 1.0, "loss")}
    assert [r.epsilon for r in resumed.rows] == [1.0]
    for epsilon in (2.0, 4.0):
        resumed.add(_outcome(epsilon))
    assert (out / ROCS_FILE).read_bytes() == (straight / ROCS_FILE).read_bytes()
    assert read_results(out / "results.csv") == read_results(straight / "results.csv")
    assert resumed.rocs == _writer(straight, resume=True).rocs


def test_a_finished_runs_resume_reads_no_curves_and_draws_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "run"
    w = _writer(out)
    for epsilon in (1.0, 2.0, 4.0):
        w.add(_outcome(epsilon))
    w.finish(force=False)
    drawn = {p: p.stat().st_mtime_ns for p in (out / "plots").iterdir()}
    assert drawn and (out / "report.html").exists()

    def unread(*args: object, **kwargs: object) -> None:
        raise AssertionError("read although nothing is drawn or added")

    # a resume that computes nothing: the curves and risk files stay unread, nothing redrawn
    monkeypatch.setattr(writer_module, "read_rocs", unread)
    monkeypatch.setattr(writer_module, "load_risk", unread)
    resumed = _writer(out, resume=True)
    resumed.finish(force=False)
    assert {p: p.stat().st_mtime_ns for p in (out / "plots").iterdir()} == drawn
    monkeypatch.undo()
    # ... and they are there, as written, when a cell or a figure needs them
    assert resumed.rocs == w.rocs
    check_manifest(out)
