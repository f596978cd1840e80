from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest
import torch

import alm_opacus.io as io
from alm_opacus._hashing import code_digest, content_digest, source_digest
from alm_opacus.io import StaleCacheWarning, atomic_open, atomic_torch_save, atomic_write_text


def test_atomic_write_keeps_old_content_when_interrupted(tmp_path: Path) -> None:
    target = tmp_path / "results.csv"
    atomic_write_text(target, "old\n")
    with pytest.raises(KeyboardInterrupt), atomic_open(target) as handle:
        handle.write("half a ro")
        raise KeyboardInterrupt
    assert target.read_text() == "old\n"
    assert [p.name for p in tmp_path.iterdir()] == ["results.csv"]  # no temporary left behind


def test_a_full_disk_names_the_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Issue 23: the write's ENOSPC names no file by itself; the error must name the target.
    target = tmp_path / "results.csv"
    atomic_write_text(target, "old\n")

    def full(fd: int) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(io.os, "fsync", full)
    with pytest.raises(OSError) as info:
        atomic_write_text(target, "new\n")
    assert info.value.filename == str(target) and info.value.errno == errno.ENOSPC
    assert target.read_text() == "old\n"
    assert [p.name for p in tmp_path.iterdir()] == ["results.csv"]


@pytest.mark.parametrize(
    ("a", "b"),
    [
        (
            {"x": torch.ones(3), "y": [1, 2.5]},
            {"x": torch.ones(3, dtype=torch.float64), "y": [1, 2.5]},
        ),
        ({"x": torch.ones(3)}, {"x": torch.ones(1, 3)}),
        ({"x": [1, 2]}, {"x": (1, 2)}),
        ({"x": 1}, {"x": 1.0}),
        ({"x": 1}, {"x": True}),
        ({"x": "1"}, {"x": 1}),
        ({"x": 0.1}, {"x": 0.1 + 2**-56}),
        ({"ab": "c"}, {"a": "bc"}),
    ],
)
def test_content_digest_tells_apart_what_differs(a: object, b: object) -> None:
    assert content_digest(a) != content_digest(b)


def test_content_digest_ignores_key_order_and_refuses_unknown_types() -> None:
    x = torch.arange(6.0).reshape(2, 3)
    assert content_digest({"a": x, "b": None}) == content_digest({"b": None, "a": x.clone()})
    assert content_digest(x.t()) == content_digest(x.t().contiguous())
    with pytest.raises(TypeError, match="no stable digest for a object"):
        content_digest({"a": object()})


def test_code_digest_follows_the_source(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    package = tmp_path / "pkg_for_digest"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "mod.py").write_text("X = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    first = code_digest("pkg_for_digest")
    assert code_digest("pkg_for_digest.mod") != first
    (package / "mod.py").write_text("X = 2\n")
    code_digest.cache_clear()
    assert code_digest("pkg_for_digest") != first
    with pytest.raises(ModuleNotFoundError, match="no_such_module"):
        code_digest("no_such_module")


def test_source_digest_ignores_layout_and_comments_but_not_code(tmp_path: Path) -> None:
    # A reformatting cannot change what the code computes, so it must not stale a doc block
    # or a cache; any change of a name, a value or a docstring must.
    file = tmp_path / "mod.py"

    def digest(source: str) -> str:
        file.write_text(source)
        return source_digest([file], root=tmp_path)

    first = digest("def f(a, b):\n    return a + b  # sum\n")
    assert digest("def f(\n    a,\n    b,\n):\n    # why\n    return (a + b)\n") == first
    assert digest("def f(a, b):\n    return a - b\n") != first
    assert digest("def f(a, c):\n    return a + c\n") != first
    assert digest('def f(a, b):\n    """Sum."""\n    return a + b\n') != first
    # Other files, and Python that does not parse, count by their bytes.
    text = tmp_path / "constraints.txt"
    text.write_text("torch==2.13.0\n")
    pinned = source_digest([text], root=tmp_path)
    text.write_text("torch==2.13.0 \n")
    assert source_digest([text], root=tmp_path) != pinned
    assert digest("def f(:\n") != digest("def f( :\n")


def test_cached_recomputes_what_fails_a_check(tmp_path: Path) -> None:
    path = tmp_path / "thing.pt"
    calls = []

    def compute() -> dict[str, object]:
        calls.append(1)
        return {"w": torch.full((4,), 2.0), "note": "clean"}

    first = io.cached(path, kind="k", key="key", code="c1", compute=compute)
    back = io.cached(path, kind="k", key="key", code="c1", compute=compute)
    assert content_digest(back) == content_digest(first)
    assert len(calls) == 1  # read back, not recomputed
    with pytest.warns(StaleCacheWarning, match="written by other code"):
        io.cached(path, kind="k", key="key", code="c2", compute=compute)
    assert len(calls) == 2
    record = torch.load(path, weights_only=True)
    record["payload"]["w"][0] = 1e-6  # altered, digest kept
    atomic_torch_save(record, path)
    with pytest.warns(StaleCacheWarning, match="does not match its content digest"):
        again = io.cached(path, kind="k", key="key", code="c2", compute=compute)
    assert torch.equal(again["w"], first["w"]) and len(calls) == 3


def test_is_inside_compares_absolute_paths_without_resolving_links(tmp_path: Path) -> None:
    run = tmp_path / "run"
    assert io.is_inside(run, run)
    assert io.is_inside(run / "private" / "cache", run)
    assert not io.is_inside(tmp_path / "run2", run)  # a shared prefix is not enough
    assert not io.is_inside(run / ".." / "elsewhere", run)
    (tmp_path / "outside").mkdir()
    run.mkdir()
    (run / "link").symlink_to(tmp_path / "outside")
    assert io.is_inside(run / "link", run)  # the link itself lies in ``run``


def test_walk_entries_lists_folders_and_files_sorted_and_never_follows_links(
    tmp_path: Path,
) -> None:
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "z.txt").write_text("z")
    (tmp_path / "a.txt").write_text("a")
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "hidden.txt").write_text("h")
    (tmp_path / "b" / "link").symlink_to(tmp_path / "elsewhere")
    got = [p.relative_to(tmp_path).as_posix() for p in io.walk_entries(tmp_path / "b")]
    assert got == ["b/link", "b/z.txt"]
    top = [p.relative_to(tmp_path).as_posix() for p in io.walk_entries(tmp_path)]
    assert top == ["a.txt", "b", "elsewhere", "b/link", "b/z.txt", "elsewhere/hidden.txt"]
