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
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "reading_results.md"
IMAGES = ROOT / "docs" / "img" / "report"
BLOCK = "report-shots"
#: What the images depend on besides this script (and the run folder rendered).
DEPS = ("alm_opacus/report",)
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
#: Chromium flags for a headless, offline, throw-away profile.
FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--hide-scrollbars",
)
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


def chromium() -> str:
    """The Chromium executable.

    Raises:
        SystemExit: when it is not installed (naming the package).
    """
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None:
        raise SystemExit("chromium not found: install it with `apt-get install -y chromium`")
    return found


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
        dom = _run(["--virtual-time-budget=5000", f"--window-size={width},800", "--dump-dom",
                    copy.as_uri()], Path(tmp) / "profile")  # fmt: skip
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
        _run([f"--window-size={width},{height}", f"--screenshot={shot}", page.resolve().as_uri()],
             Path(tmp) / "profile")  # fmt: skip
        image = Image.open(shot).convert("RGB")
    tops = [(name, int(where[name])) for name in SECTIONS if name in where]
    written = []
    for k, (name, top) in enumerate(tops):
        bottom = tops[k + 1][1] if k + 1 < len(tops) else image.height
        crop = image.crop((0, max(top - 10, 0), width, min(bottom, top + max_height)))
        path = out / f"report_{k + 1}_{name}.png"
        crop.quantize(colors=64).save(path, optimize=True)
        written.append(path)
    head = image.crop((0, 0, width, min(tops[0][1] if tops else 600, 600)))
    path = out / "report_0_top.png"
    head.quantize(colors=64).save(path, optimize=True)
    return [path, *written]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", help="a run folder holding report.html")
    parser.add_argument("--out", default=None, help=f"image folder (default {IMAGES})")
    parser.add_argument("--width", type=int, default=1100)
    parser.add_argument("--update-docs", action="store_true",
                        help=f"show the images in {DOC.relative_to(ROOT)}")  # fmt: skip
    args = parser.parse_args(argv)
    page = Path(args.run) / "report.html"
    if not page.exists():
        parser.error(f"{page} does not exist: expected a finished run folder")
    out = Path(args.out) if args.out else IMAGES
    written = render(page, out, width=args.width)
    for path in written:
        print(f"written: {path} ({path.stat().st_size // 1024} KiB)")
    if args.update_docs:
        from alm_opacus.docblocks import relative, write_block

        lines = [f"Rendered by `scripts/render_report.py` (Chromium, {args.width} px wide):", ""]
        for path in written:
            name = path.stem.split("_", 2)[-1]
            rel = path.resolve().relative_to(DOC.parent.resolve()).as_posix()
            lines += [f"![{CAPTIONS.get(name, name)}]({rel})", ""]
        # The images also depend on the run folder, which no digest covers: re-run after
        # re-running the default run.
        shown = [relative(args.run), "--width", str(args.width), "--update-docs"]
        write_block(DOC, name=BLOCK, script=__file__, args=shown, deps=DEPS,
                    body="\n".join(lines))  # fmt: skip
        print(f"written: {DOC}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
