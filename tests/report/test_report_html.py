"""``report.html`` from synthetic rows: every section, method and epsilon, embedded images
only, guarantees in plain words, escaped text, and the private-data warning only where the
page holds per-member risk. With Chromium installed, the page renders offline."""

from __future__ import annotations

import base64
import importlib.util
import math
import re
import shutil
from collections.abc import Callable
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pytest

from alm_opacus.report.html import REPORT_FILE, RunFacts, write_report
from alm_opacus.report.plots import write_plots
from alm_opacus.report.results import ResultRow
from alm_opacus.report.risk import CellScores

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
    def __init__(self) -> None:
        super().__init__()
        self.ids: list[str] = []
        self.images: list[str] = []
        self.cells: list[str] = []
        self.refs: list[str] = []
        self._cell = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        found = dict(attrs)
        if "id" in found:
            self.ids.append(found["id"] or "")
        if tag == "img":
            self.images.append(found.get("src") or "")
        if "href" in found or (tag != "img" and "src" in found):
            self.refs.append(found.get("href") or found.get("src") or "")
        self._cell = tag == "td"

    def handle_data(self, data: str) -> None:
        if self._cell:
            self.cells.append(data.strip())
            self._cell = False


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


@pytest.fixture
def page(tmp_path: Path, synthetic_rows: RowsFactory) -> tuple[str, Page]:
    rows = synthetic_rows()
    fpr = list(np.linspace(0, 1, 11))
    write_plots(rows, {("alm", e, "loss"): (fpr, fpr) for e in EPSILONS}, tmp_path / "plots")
    risk = {(m, e): _risk(m, e) for m, e in (("none", math.inf), ("alm", 1.0), ("alm", 100.0))}
    settings = {
        "dataset": "digits",
        "methods": ["none", "alm", "laplace", "dpsgd"],
        "epsilons": list(EPSILONS),
        "split": {"members": 150, "nonmembers": None},
    }
    path = write_report(
        tmp_path, rows=rows, settings=settings, facts=FACTS, risk=risk, risk_plots=[]
    )
    assert path == tmp_path / REPORT_FILE
    text = path.read_text()
    parsed = Page()
    parsed.feed(text)
    return text, parsed


def test_every_section_method_and_epsilon_is_on_the_page(page: tuple[str, Page]) -> None:
    text, parsed = page
    assert {"settings", "guarantees", "tradeoff", "table", "risk", "attacks"} <= set(parsed.ids)
    for method in ("none", "alm", "laplace", "dpsgd"):
        assert method in parsed.cells
    for epsilon in ("0.1", "1", "10", "100", "1000", "10000", "inf"):
        assert epsilon in parsed.cells
    assert "random DP: not a DP guarantee, because" in text
    assert "(ε, δ)-DP (approximate differential privacy)" in text and "no guarantee" in text
    assert "ε-DP (pure differential privacy)" in text


def test_images_are_embedded_pngs_and_nothing_is_fetched(page: tuple[str, Page]) -> None:
    text, parsed = page
    assert len(parsed.images) == 6  # the trade-off figures of plots/
    for src in parsed.images:
        assert src.startswith("data:image/png;base64,")
        assert base64.b64decode(src.split(",", 1)[1])[:8] == b"\x89PNG\r\n\x1a\n"
    assert all(ref.startswith("#") for ref in parsed.refs)
    assert not re.search(r"(src|href)=\"(https?:)?//", text)


def test_risk_section_warns_and_lists_the_most_exposed(page: tuple[str, Page]) -> None:
    text, _ = page
    assert "computed from the private" in text
    assert "alm (ε = 100): the 10 most exposed members (lira-online)" in text


def test_text_is_escaped(tmp_path: Path, synthetic_rows: RowsFactory) -> None:
    rows = [
        r.replace(method="<b>x</b>") if r.method == "alm" else r
        for r in synthetic_rows(methods=("alm",))
    ]
    path = write_report(
        tmp_path, rows=rows, settings={"dataset": "<i>d</i>"}, facts=FACTS, risk={}, risk_plots=[]
    )
    text = path.read_text()
    assert "<b>x</b>" not in text and "&lt;b&gt;x&lt;/b&gt;" in text
    assert "<i>d</i>" not in text
    assert "computed from the private" not in text.split('id="risk"')[0]  # no risk: no warning


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
        "report_1_settings",
        "report_2_guarantees",
        "report_3_tradeoff",
        "report_4_table",
        "report_5_risk",
        "report_6_attacks",
    ]
    from PIL import Image

    for path in written:
        with Image.open(path) as image:
            assert image.width == 900 and image.height > 50
            assert np.unique(np.asarray(image.convert("L"))).size > 2  # drawn, not blank
