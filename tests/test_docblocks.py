"""Every number in the docs is generated (issue 23, item 7): each generated block is what its
script wrote from the code as it is now, and no doc keeps a marker that names no script."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest

from docblocks import (
    LEGACY,
    ROOT,
    find_blocks,
    mark_pending,
    pending,
    staleness,
    write_block,
)

DOCS = sorted([*(ROOT / "docs").glob("*.md"), ROOT / "README.md"])
BLOCKS = [block for doc in DOCS for block in find_blocks(doc)]


@pytest.mark.parametrize("block", BLOCKS, ids=[f"{b.doc.name}:{b.name}" for b in BLOCKS])
def test_every_generated_block_in_the_docs_is_fresh(block) -> None:  # type: ignore[no-untyped-def]
    assert staleness(block) is None, staleness(block)
    notice = pending(block)
    if notice:  # accepted, and said in every test run until it is re-measured
        warnings.warn(f"{block.doc.name}: block {block.name!r}: {notice}", stacklevel=1)


@pytest.mark.parametrize("doc", DOCS, ids=[d.name for d in DOCS])
def test_no_doc_keeps_a_marker_that_names_no_script(doc: Path) -> None:
    legacy = LEGACY.findall(doc.read_text())
    assert not legacy, f"{doc.name}: {legacy} name no generator; use scripts/docblocks.py"


def test_the_docs_have_generated_blocks() -> None:
    assert len(BLOCKS) >= 4  # the test above is not vacuous


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """A tiny repository: a script, a dependency, and a doc with a placeholder block."""
    (tmp_path / "scripts").mkdir()
    (tmp_path / "scripts" / "measure.py").write_text("print(42)\n")
    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / "maths.py").write_text("X = 1\n")
    (tmp_path / "lib" / "notes.txt").write_text("not code\n")
    (tmp_path / "doc.md").write_text(
        "# Title\n\nBefore.\n\n<!-- generated table -->\n(run the script)\n"
        "<!-- end generated table -->\n\nAfter.\n"
    )
    return tmp_path


def _write(repo: Path, body: str = "| a | 0.913 |", args: tuple[str, ...] = ("--n", "3")) -> None:
    write_block(
        repo / "doc.md",
        name="table",
        script="scripts/measure.py",
        args=args,
        deps=("lib",),
        body=body,
        root=repo,
    )


def _stale(repo: Path) -> str | None:
    (block,) = find_blocks(repo / "doc.md")
    return staleness(block, root=repo)


def test_a_written_block_is_fresh_and_names_its_command(repo: Path) -> None:
    assert _stale(repo) is None  # a placeholder holding no digit
    _write(repo)
    (block,) = find_blocks(repo / "doc.md")
    assert block.command == "python scripts/measure.py --n 3"
    assert block.body.strip() == "| a | 0.913 |"
    assert _stale(repo) is None
    text = (repo / "doc.md").read_text()
    assert text.startswith("# Title\n\nBefore.\n\n<!-- generated table by scripts/measure.py")
    assert text.endswith("<!-- end generated table -->\n\nAfter.\n")
    _write(repo, body="| a | 0.920 |")  # rewriting replaces, never duplicates
    assert len(find_blocks(repo / "doc.md")) == 1 and _stale(repo) is None


@pytest.mark.parametrize(
    ("change", "needle"),
    [
        (lambda r: (r / "scripts" / "measure.py").write_text("print(43)\n"), "is stale"),
        (lambda r: (r / "lib" / "maths.py").write_text("X = 2\n"), "is stale"),
        (lambda r: (r / "lib" / "new.py").write_text("Y = 1\n"), "is stale"),
        (lambda r: (r / "lib" / "maths.py").unlink(), "is stale"),
        (lambda r: (r / "scripts" / "measure.py").unlink(), "a file that is gone"),
        (
            lambda r: (r / "doc.md").write_text(
                (r / "doc.md").read_text().replace("0.913", "0.931")
            ),
            "edited by hand",
        ),
        (
            lambda r: (r / "doc.md").write_text(
                (r / "doc.md").read_text().replace("--n 3", "--n 4")
            ),
            "is stale",
        ),
    ],
    ids=["script", "dep", "new-dep-file", "dep-removed", "script-gone", "hand-edit", "args"],
)
def test_a_block_is_stale_when_what_made_it_changes(repo: Path, change, needle: str) -> None:  # type: ignore[no-untyped-def]
    _write(repo)
    change(repo)
    reason = _stale(repo)
    assert reason is not None and needle in reason
    assert "re-run `python scripts/measure.py --n" in reason


def test_what_does_not_make_a_block_stale(repo: Path) -> None:
    _write(repo)
    (repo / "lib" / "notes.txt").write_text("edited prose, not code\n")  # not a .py under lib
    text = (repo / "doc.md").read_text()
    (repo / "doc.md").write_text(text.replace("Before.", "Rewritten prose."))  # outside
    assert _stale(repo) is None


def test_placeholders_hold_no_numbers_and_markers_must_pair(repo: Path) -> None:
    text = (repo / "doc.md").read_text()
    (repo / "doc.md").write_text(text.replace("(run the script)", "run `measure.py --n 3`"))
    assert _stale(repo) is None  # a command in a code span is no measurement
    (repo / "doc.md").write_text(text.replace("(run the script)", "accuracy 0.9"))
    reason = _stale(repo)
    assert reason is not None and "holds numbers but was never generated" in reason
    (repo / "doc.md").write_text(text.replace("<!-- end generated table -->", ""))
    with pytest.raises(ValueError, match="has no '<!-- end generated table -->'"):
        find_blocks(repo / "doc.md")
    (repo / "doc.md").write_text(text)
    with pytest.raises(ValueError, match="no generated block 'other'"):
        write_block(
            repo / "doc.md",
            name="other",
            script="scripts/measure.py",
            args=(),
            deps=(),
            body="x",
            root=repo,
        )


def test_a_pending_notice_covers_exactly_the_change_it_names(repo: Path) -> None:
    _write(repo)
    (repo / "lib" / "maths.py").write_text("X = 2\n")
    assert _stale(repo) is not None
    reason = "X changed; hours to re-measure."
    mark_pending(repo / "doc.md", name="table", reason=reason, root=repo)
    text = (repo / "doc.md").read_text()
    # the reader sees it right above the numbers, with the command that re-measures them
    notice = "> **Measured on earlier code; re-measurement pending.** X changed; hours to "
    assert notice + "re-measure. Re-run `python scripts/measure.py --n 3`." in text
    assert _stale(repo) is None
    (block,) = find_blocks(repo / "doc.md")
    assert "X changed" in (pending(block, root=repo) or "")
    # a later change is not covered: the notice pins the digest it was written for
    (repo / "lib" / "maths.py").write_text("X = 3\n")
    assert "is stale" in (_stale(repo) or "")
    assert pending(block, root=repo) is None
    mark_pending(repo / "doc.md", name="table", reason="X changed again.", root=repo)
    assert _stale(repo) is None and (repo / "doc.md").read_text().count("<!-- pending") == 1
    # a hand-edited body is refused even under a notice
    edited = (repo / "doc.md").read_text().replace("0.913", "0.999")
    (repo / "doc.md").write_text(edited)
    assert "edited by hand" in (_stale(repo) or "")
    # re-measuring removes the notice
    _write(repo)
    assert "pending" not in (repo / "doc.md").read_text() and _stale(repo) is None


def test_a_notice_must_stand_right_above_its_block(repo: Path) -> None:
    _write(repo)
    (repo / "lib" / "maths.py").write_text("X = 2\n")
    mark_pending(repo / "doc.md", name="table", reason="X changed.", root=repo)
    text = (repo / "doc.md").read_text()
    moved = text.replace("<!-- generated table", "Prose between.\n\n<!-- generated table", 1)
    (repo / "doc.md").write_text(moved)
    assert "is stale" in (_stale(repo) or "")
    with pytest.raises(ValueError, match="a placeholder needs no notice"):
        mark_pending(repo / "doc.md", name="other", reason="none", root=repo)


def test_a_notice_covers_a_block_whose_name_has_a_colon(repo: Path) -> None:
    # recipes.md names its blocks recipes:digits and recipes:mnist
    text = (repo / "doc.md").read_text().replace("generated table", "generated recipes:digits")
    (repo / "doc.md").write_text(text)
    write_block(
        repo / "doc.md",
        name="recipes:digits",
        script="scripts/measure.py",
        args=("--n", "3"),
        deps=("lib",),
        body="| a | 0.913 |",
        root=repo,
    )
    (repo / "lib" / "maths.py").write_text("X = 2\n")
    assert "is stale" in (_stale(repo) or "")
    mark_pending(repo / "doc.md", name="recipes:digits", reason="X changed.", root=repo)
    (block,) = find_blocks(repo / "doc.md")
    assert _stale(repo) is None and "X changed" in (pending(block, root=repo) or "")
    mark_pending(repo / "doc.md", name="recipes:digits", reason="Again.", root=repo)
    assert (repo / "doc.md").read_text().count("<!-- pending") == 1
