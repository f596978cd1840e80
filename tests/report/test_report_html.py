"""``report.html`` from synthetic rows: it opens on the verdict and the trade-off figure;
every section, method and epsilon; embedded images only; guarantees in plain words; escaped
text; the risk section at the largest ε that is not weak; the private-data warning only where
the page holds per-member risk, and a shareable page without it. With Chromium installed, the
page renders offline."""

from __future__ import annotations

import base64
import importlib.util
import json
import math
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pytest

from alm_opacus.report.html import (
    PLOT_ORDER,
    REPORT_FILE,
    SHAREABLE_WITHHELD,
    RunFacts,
    render_report,
    shareable_report,
    write_report,
)
from alm_opacus.report.plots import write_plots
from alm_opacus.report.results import ResultRow, write_results
from alm_opacus.report.risk import CellScores
from alm_opacus.report.series import NO_LEAK

ROOT = Path(__file__).resolve().parents[2]
EPSILONS = (0.1, 1.0, 10.0, 100.0, 1000.0, 10000.0)
FACTS = RunFacts(
    dataset="digits",
    members=150,
    nonmembers=150,
    num_classes=10,
    attacks=("all",),
    num_reference=64,
)
RowsFactory = Callable[..., list[ResultRow]]


class Page(HTMLParser):
    """The page's structure: ids, sections and figures in order, images, table cells (per
    section id), and the rows of every table (per section id, header first)."""

    def __init__(self) -> None:
        super().__init__()
        self.ids: list[str] = []
        self.images: list[str] = []
        self.cells: list[str] = []
        self.refs: list[str] = []
        #: the block tags after the title, in order: ("section", id), ("figure", id), ...
        self.order: list[tuple[str, str]] = []
        self.tables: dict[str, list[list[list[str]]]] = {}
        self._cell = False
        self._section = ""
        self._titled = False
        self._text: list[str] | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        found = dict(attrs)
        if "id" in found:
            self.ids.append(found["id"] or "")
        if tag == "h1":
            self._titled = True
        if self._titled and tag in ("section", "figure", "table"):
            self.order.append((tag, found.get("id") or ""))
        if tag == "section":
            self._section = found.get("id") or ""
        if tag == "table":
            self.tables.setdefault(self._section, []).append([])
        if tag == "tr":
            self.tables[self._section][-1].append([])
        if tag in ("td", "th"):
            self._text = []
        if tag == "img":
            self.images.append(found.get("src") or "")
        if "href" in found or (tag != "img" and "src" in found):
            self.refs.append(found.get("href") or found.get("src") or "")
        self._cell = tag == "td"

    def handle_endtag(self, tag: str) -> None:
        if tag in ("td", "th") and self._text is not None:
            self.tables[self._section][-1][-1].append("".join(self._text).strip())
            self._text = None

    def handle_data(self, data: str) -> None:
        if self._text is not None:
            self._text.append(data)
        if self._cell:
            self.cells.append(data.strip())
            self._cell = False

    def table(self, section: str, index: int = 0) -> list[list[str]]:
        return self.tables[section][index]


def _risk(method: str, epsilon: float) -> CellScores:
    rng = np.random.default_rng(0)
    member = np.r_[np.ones(20, bool), np.zeros(20, bool)]
    return CellScores(
        method=method,
        epsilon=epsilon,
        seed=0,
        rows=np.arange(40) * 3,
        labels=np.arange(40) % 10,
        is_member=member,
        scores={"lira": rng.normal(size=40) + member, "loss": rng.normal(size=40)},
        attacks={"lira": "lira-online", "loss": "loss"},
    )


SETTINGS = {
    "dataset": "digits",
    "methods": ["none", "alm", "laplace", "dpsgd"],
    "epsilons": list(EPSILONS),
    "delta": None,
    "split": {"members": 150, "nonmembers": None, "attacker": 300, "public": 600},
    "split_seed": 7,
    "num_classes": 10,
    "method_options": {
        "none": {},
        "alm": {"m": 200, "sensitivity": "sampled"},
        "dpsgd": {"lr": None, "tune": True},
    },
}


def _plots(rows: list[ResultRow], folder: Path) -> None:
    """The run's figures, and a stand-in ``tradeoff.png`` (drawn by ``report.plots`` once it
    exists there)."""
    fpr = list(np.linspace(0, 1, 11))
    write_plots(rows, {("alm", e, "loss"): (fpr, fpr) for e in EPSILONS}, folder)
    if not (folder / "tradeoff.png").exists():
        from PIL import Image

        Image.new("RGB", (40, 30), "white").save(folder / "tradeoff.png")


def parse(text: str) -> Page:
    parsed = Page()
    parsed.feed(text)
    return parsed


@pytest.fixture
def page(tmp_path: Path, synthetic_rows: RowsFactory) -> tuple[str, Page]:
    rows = synthetic_rows()
    _plots(rows, tmp_path / "plots")
    risk = {(m, e): _risk(m, e) for m, e in (("none", math.inf), ("alm", 1.0), ("alm", 100.0))}
    path = write_report(
        tmp_path, rows=rows, settings=SETTINGS, facts=FACTS, risk=risk, risk_plots=[]
    )
    assert path == tmp_path / REPORT_FILE
    text = path.read_text()
    return text, parse(text)


def test_the_page_opens_on_the_verdict_then_the_tradeoff(page: tuple[str, Page]) -> None:
    text, parsed = page
    sections = [i for tag, i in parsed.order if tag == "section"]
    assert parsed.order[0] == ("section", "verdict")  # nothing comes between title and verdict
    assert sections[:3] == ["verdict", "tradeoff", "table"]
    assert sections[-1] == "settings"
    figures = [i for tag, i in parsed.order if tag == "figure"]
    assert figures[0] == "fig-tradeoff" and figures[0] == f"fig-{PLOT_ORDER[0][0]}"
    verdict = text.split('id="verdict"')[1].split("</section>")[0]
    assert "At a meaningful guarantee (ε′ ≤ 10, δ′ ≤ 1/150) no method keeps useful" in verdict
    assert "alm&#39;s rows are random-DP, not DP" in verdict
    rows = parsed.table("verdict")
    assert [r[0] for r in rows[1:]] == ["none (unprotected)", "► alm", "► laplace", "► dpsgd"]
    laplace = rows[2]
    assert laplace[2] == "10" and laplace[5] == "no"  # its best: ε′ = 10, not useful


def test_every_method_and_epsilon_of_the_results_is_in_the_table(
    page: tuple[str, Page], synthetic_rows: RowsFactory
) -> None:
    _, parsed = page
    table = parsed.table("table")
    header = table[0]
    assert header[:6] == ["method", "ε", "kind", "ε′", "δ′", "ε_lb"]
    shown = {(r[0].removeprefix("► "), r[1]) for r in table[1:]}
    from alm_opacus.report.series import format_epsilon

    expected = {(r.method, format_epsilon(r.epsilon)) for r in synthetic_rows()}
    assert shown == expected
    marked = sorted((r[0], r[1]) for r in table[1:] if r[0].startswith("►"))
    assert marked == [("► alm", "10"), ("► dpsgd", "1"), ("► laplace", "10")]


def test_every_section_method_and_epsilon_is_on_the_page(page: tuple[str, Page]) -> None:
    text, parsed = page
    sections = {
        "verdict",
        "tradeoff",
        "table",
        "guarantees",
        "figures",
        "risk",
        "attacks",
        "settings",
    }
    assert sections <= set(parsed.ids)
    for method in ("none", "alm", "laplace", "dpsgd"):
        assert method in parsed.cells
    for epsilon in ("0.1", "1", "10", "100", "1000", "10000", "inf"):
        assert epsilon in parsed.cells
    assert "random DP: not a DP guarantee, because" in text
    assert "(ε, δ)-DP (approximate differential privacy)" in text and "no guarantee" in text
    assert "ε-DP (pure differential privacy)" in text


def test_images_are_embedded_pngs_and_nothing_is_fetched(page: tuple[str, Page]) -> None:
    text, parsed = page
    assert len(parsed.images) == 7  # the figures of plots/, the trade-off first
    for src in parsed.images:
        assert src.startswith("data:image/png;base64,")
        assert base64.b64decode(src.split(",", 1)[1])[:8] == b"\x89PNG\r\n\x1a\n"
    assert all(ref.startswith("#") for ref in parsed.refs)
    assert not re.search(r"(src|href)=\"(https?:)?//", text)


def test_risk_section_warns_and_lists_the_most_exposed(page: tuple[str, Page]) -> None:
    text, _ = page
    assert "computed from the private" in text
    # ε = 100 is weak (ε′ > 10): the largest ε that is not is 1
    assert "alm (ε = 1): the 10 most exposed members (lira-online)" in text
    assert "alm (ε = 100)" not in text


def test_risk_section_falls_back_to_the_smallest_epsilon_when_all_are_weak(
    tmp_path: Path, synthetic_rows: RowsFactory
) -> None:
    rows = synthetic_rows()
    risk = {(m, e): _risk(m, e) for m, e in (("dpsgd", 10.0), ("dpsgd", 100.0), ("alm", 10.0))}
    text = render_report(
        tmp_path, rows=rows, settings=SETTINGS, facts=FACTS, risk=risk, risk_plots=[]
    )
    # dpsgd at ε = 10 is ε′ = 20, δ′ = 0.22: weak, like ε = 100; alm at 10 is ε′ = 10
    assert "dpsgd (ε = 10, ε′ = 20): the 10 most exposed members" in text
    assert "Every ε of dpsgd is weak" in text
    assert "alm (ε = 10): the 10 most exposed members" in text
    assert "Every ε of alm is weak" not in text


def test_settings_show_resolved_values(page: tuple[str, Page]) -> None:
    _, parsed = page
    settings = {r[0]: r[1] for r in parsed.table("settings")[1:]}
    assert settings["δ"].startswith("1e-05 (the default, min(1e-5, 1/(10 n)) for n = 150")
    expected = "members 150, non-members 150 (= members, the default), attacker 300, public 600"
    assert settings["split"] == expected
    assert settings["split seed"] == "7"
    assert "alm: m=200, sensitivity=sampled" in settings["method options"]
    assert "dpsgd: lr=tuned (below), tune=yes" in settings["method options"]
    assert "none: no options" in settings["method options"]
    assert "None" not in "".join(settings.values())


def test_text_is_escaped(tmp_path: Path, synthetic_rows: RowsFactory) -> None:
    evil = "<script>alert(1)</script>"
    rows = [r.replace(method=evil) if r.method == "alm" else r for r in synthetic_rows()]
    path = write_report(
        tmp_path, rows=rows, settings={"dataset": "<i>d</i>"}, facts=FACTS, risk={}, risk_plots=[]
    )
    text = path.read_text()
    assert "<script" not in text and "&lt;script&gt;alert(1)&lt;/script&gt;" in text
    assert "<i>d</i>" not in text
    parsed = parse(text)
    assert evil in {r[0].removeprefix("► ") for r in parsed.table("table")[1:]}  # as text
    assert "computed from the private" not in text.split('id="risk"')[0]  # no risk: no warning


def test_shareable_page_leaves_out_every_member(
    tmp_path: Path, synthetic_rows: RowsFactory
) -> None:
    rows = synthetic_rows()
    _plots(rows, tmp_path / "plots")
    risk = {(m, e): _risk(m, e) for m, e in (("none", math.inf), ("alm", 1.0))}
    risk_png = tmp_path / "private_hist_alm.png"
    shutil.copy(tmp_path / "plots" / "fig1_utility_loss.png", risk_png)  # must not be embedded
    text = render_report(
        tmp_path,
        rows=rows,
        settings=SETTINGS,
        facts=FACTS,
        risk=risk,
        risk_plots=[risk_png],
        shareable=True,
    )
    parsed = parse(text)
    assert "risk" not in parsed.ids and 'href="#risk"' not in text
    assert "most exposed" not in text and "computed from the private" not in text
    assert all(t[0][:2] != ["row", "label"] for ts in parsed.tables.values() for t in ts)
    assert len(parse(text).images) == 7  # plots/ only
    (tmp_path / "plots" / "fig1_utility_loss.png").unlink()
    text = render_report(
        tmp_path,
        rows=rows,
        settings=SETTINGS,
        facts=FACTS,
        risk=risk,
        risk_plots=[risk_png],
        shareable=True,
    )
    assert base64.b64encode(risk_png.read_bytes()).decode() not in text
    assert "Shareable page: the per-member risk section" in text.split('id="verdict"')[0]
    settings = {r[0]: r[1] for r in parsed.table("settings")[1:]}
    assert "split seed" not in settings  # it re-draws the member indices
    assert parsed.order[0] == ("section", "verdict")  # after the note: still the verdict first
    assert set(SHAREABLE_WITHHELD) >= {"split_seed"}


def test_shareable_report_reads_the_run_folder_without_torch(
    tmp_path: Path, synthetic_rows: RowsFactory
) -> None:
    rows = synthetic_rows()
    rows += [r.replace(method=NO_LEAK, test_accuracy=0.8) for r in rows if r.method == "none"]
    write_results(tmp_path / "results.csv", rows)
    (tmp_path / "config.json").write_text(json.dumps(SETTINGS))
    _plots(rows, tmp_path / "plots")
    code = (
        "import sys; from pathlib import Path; "
        "from alm_opacus.report.html import shareable_report; "
        f"page = shareable_report(Path({str(tmp_path)!r})); "
        "assert 'torch' not in sys.modules, 'torch imported'; print(len(page))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    text = shareable_report(tmp_path)
    assert int(done.stdout) == len(text)
    parsed = parse(text)
    assert parsed.order[0] == ("section", "verdict") and "risk" not in parsed.ids
    # the no-leak reference is a reference line of the verdict, never a method of the table
    assert [r[0] for r in parsed.table("verdict")[1:]][-1] == "no-leak reference"
    assert NO_LEAK not in {r[0].removeprefix("► ") for r in parsed.table("table")[1:]}
    assert "no-leak band" in parsed.table("verdict")[0]
    with pytest.raises(ValueError, match=r"config\.json"):
        shareable_report(tmp_path / "nowhere")


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("chromium") is None, reason="needs Debian's chromium")
def test_chromium_renders_every_section(tmp_path: Path, page: tuple[str, Page]) -> None:
    spec = importlib.util.spec_from_file_location(
        "render_report", ROOT / "scripts" / "render_report.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    html_file = next(tmp_path.glob("**/report.html"))
    written = module.render(html_file, tmp_path / "shots", width=900)
    assert [p.stem for p in written] == [
        "report_0_top",
        "report_1_verdict",
        "report_2_tradeoff",
        "report_3_table",
        "report_4_guarantees",
        "report_5_figures",
        "report_6_risk",
        "report_7_attacks",
        "report_8_settings",
    ]
    from PIL import Image

    for path in written:
        with Image.open(path) as image:
            assert image.width == 900 and image.height > 50
            assert np.unique(np.asarray(image.convert("L"))).size > 2  # drawn, not blank
