"""What a new user meets first: a LICENSE that matches the package metadata, and README
references that resolve in a clone (nothing outside the repository)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
#: Where a README reference to a repository file starts.
TOP = ("docs/", "scripts/", "alm_opacus/", "baselines/", "tests/")


def _references(text: str) -> list[str]:
    """Backticked paths and Markdown link targets that name a repository file or folder."""
    spans = re.findall(r"`([^`\s]+)`", text) + re.findall(r"\]\(([^)\s]+)\)", text)
    found = []
    for span in spans:
        path = span.split("#")[0].rstrip(".,:;")
        if path.startswith(TOP) and not any(c in path for c in "<>*{}|="):
            found.append(path)
    return found


def test_license_matches_the_package_metadata() -> None:
    # tomllib is Python >= 3.11; the package supports 3.10
    meta = re.findall(r"^license = (.*)$", (ROOT / "pyproject.toml").read_text(), re.M)
    text = (ROOT / "LICENSE").read_text()
    assert meta == ['{ text = "Apache-2.0" }']
    assert "Apache License" in text and "Version 2.0, January 2004" in text
    assert "END OF TERMS AND CONDITIONS" in text


@pytest.mark.parametrize("page", ["README.md", "docs/design.md", "docs/reading_results.md"])
def test_references_resolve_inside_the_repository(page: str) -> None:
    text = (ROOT / page).read_text()
    assert "../shared" not in text  # a clone has no sibling folder
    refs = _references(text)
    assert refs, page
    missing = [r for r in refs if not (ROOT / r).exists()]
    assert not missing, f"{page} names files a clone does not have: {missing}"


def test_readme_states_the_cpu_index_and_the_venv_size() -> None:
    text = (ROOT / "README.md").read_text()
    assert "https://download.pytorch.org/whl/cpu" in text
    assert re.search(r"venv is [\d.]+ GB", text)
    assert "setup.cfg" in text
