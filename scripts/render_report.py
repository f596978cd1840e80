#!/usr/bin/env python
"""Render a run's ``report.html`` to PNG screenshots with headless Chromium.

The page is self-contained, so Chromium opens it from disk with the network off. Each
section (verdict, trade-off, table, guarantees, figures, risk, attack strength, settings) is
cut out of one full-page screenshot by its position, so the images shown in
``docs/reading_results.md`` are what a reader of the report sees.

Needs Debian's ``chromium`` (``apt-get install -y chromium``).

    .venv/bin/python scripts/render_report.py runs/latest [--width 1100] [--update-docs]

With ``--update-docs`` the images go to ``docs/img/report/`` and the marked block
``report-shots`` of ``docs/reading_results.md`` shows them.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from PIL import Image

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "scripts")]
from chromium_shots import FLAGS, chromium, print_written, save_png, show_in_doc  # noqa: E402

DOC = ROOT / "docs" / "reading_results.md"
IMAGES = ROOT / "docs" / "img" / "report"
BLOCK = "report-shots"
#: What the images depend on besides this script (and the run folder rendered).
DEPS = ("alm_opacus/report", "scripts/chromium_shots.py")
CAPTIONS = {
    "top": "the page's head: what ran, and the warning that it holds private risk",
    "verdict": "the verdict: the recommendation, its caveats, and per method the best "
    "accuracy at a meaningful guarantee",
    "tradeoff": "the trade-off figure: attack AUC against utility, one line per method",
    "table": "the table, with the empirical ε lower bound, the verdict's marks and the "
    "definition of every word of its header",
    "guarantees": "what each method guarantees, in plain words",
    "figures": "the other figures (the first of them)",
    "risk": "per-member risk at each method's largest ε that is not weak",
    "attacks": "how strong the attacks were",
    "settings": "the settings of the run, with resolved values",
}
SECTIONS = ("verdict", "tradeoff", "table", "guarantees", "figures", "risk", "attacks", "settings")
#: Section positions, measured in the page itself (CSS pixels from the top).
_MEASURE = """<script>
window.addEventListener('load', () => {
  const out = {height: document.documentElement.scrollHeight};
  for (const id of %s) {
    const el = document.getElementById(id);
    if (el) out[id] = el.getBoundingClientRect().top + window.scrollY;
  }
  document.title = 'SECTIONS=' + JSON.stringify(out);
});
</script>"""


def _run(args: list[str], profile: Path) -> str:
    command = [chromium(), *FLAGS, f"--user-data-dir={profile}", *args]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, check=True)
    return done.stdout


def measure(page: Path, *, width: int) -> dict[str, float]:
    """The page height and each section's top, from a copy with a measuring script."""
    text = page.read_text()
    probe = text.replace("</body>", _MEASURE % json.dumps(list(SECTIONS)) + "</body>")
    with tempfile.TemporaryDirectory() as tmp:
        copy = Path(tmp) / "probe.html"
        copy.write_text(probe)
        dom = _run(
            [
                "--virtual-time-budget=5000",
                f"--window-size={width},800",
                "--dump-dom",
                copy.as_uri(),
            ],
            Path(tmp) / "profile",
        )
    start = dom.index("SECTIONS=") + len("SECTIONS=")
    end = dom.index("</title>", start)
    return json.loads(dom[start:end].replace("&quot;", '"'))


def render(page: Path, out: Path, *, width: int = 1100, max_height: int = 1400) -> list[Path]:
    """Screenshot ``page`` whole, then cut one PNG per section (at most ``max_height``
    pixels tall each, palette-quantised to stay small).

    Returns:
        The PNG files written into ``out``.
    """
    where = measure(page, width=width)
    height = int(where["height"]) + 20
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        shot = Path(tmp) / "page.png"
        _run(
            [f"--window-size={width},{height}", f"--screenshot={shot}", page.resolve().as_uri()],
            Path(tmp) / "profile",
        )
        image = Image.open(shot).convert("RGB")
    tops = [(name, int(where[name])) for name in SECTIONS if name in where]
    written = []
    for k, (name, top) in enumerate(tops):
        bottom = tops[k + 1][1] if k + 1 < len(tops) else image.height
        crop = image.crop((0, max(top - 10, 0), width, min(bottom, top + max_height)))
        path = out / f"report_{k + 1}_{name}.png"
        written.append(save_png(crop, path, colors=64))
    head = image.crop((0, 0, width, min(tops[0][1] if tops else 600, 600)))
    return [save_png(head, out / "report_0_top.png", colors=64), *written]


def _caption(path: Path) -> str:
    """The caption of a section's image (``report_3_table.png``: the table's)."""
    name = path.stem.split("_", 2)[-1]
    return CAPTIONS.get(name, name)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", help="a run folder holding report.html")
    parser.add_argument("--out", default=None, help=f"image folder (default {IMAGES})")
    parser.add_argument("--width", type=int, default=1100)
    parser.add_argument(
        "--update-docs", action="store_true", help=f"show the images in {DOC.relative_to(ROOT)}"
    )
    args = parser.parse_args(argv)
    page = Path(args.run) / "report.html"
    if not page.exists():
        parser.error(f"{page} does not exist: expected a finished run folder")
    out = Path(args.out) if args.out else IMAGES
    written = render(page, out, width=args.width)
    print_written(written)
    if args.update_docs:
        show_in_doc(
            DOC,
            block=BLOCK,
            script=__file__,
            run=args.run,
            args=["--width", str(args.width)],
            intro=f"Rendered by `scripts/render_report.py` (Chromium, {args.width} px wide):",
            images=[(p, _caption(p)) for p in written],
            deps=DEPS,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
