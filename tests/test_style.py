"""The formatter owns the style: `fmt: skip` only on numeric tables (scripts/check_fmt_skip.py).

The repository check runs the checker over the code; the rest pins its definition of a table
on small sources, and what ``--fix`` leaves behind.
"""

from __future__ import annotations

import ast
import importlib.util
import sys
import textwrap
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def checker() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "check_fmt_skip", ROOT / "scripts" / "check_fmt_skip.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["check_fmt_skip"] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def _lines(checker: ModuleType, source: str) -> list[int]:
    return [o.line for o in checker.check_source(textwrap.dedent(source))]


def test_the_code_has_no_formatter_suppression_but_on_tables(checker: ModuleType) -> None:
    files = checker.python_files(ROOT / p for p in checker.DEFAULT_PATHS)
    assert len(files) > 100  # the walk found the code
    offences = [o for f in files for o in checker.check_source(f.read_text("utf-8"), path=f)]
    if offences:
        pytest.fail(
            "formatter suppressions outside numeric tables (remove them with "
            "`python scripts/check_fmt_skip.py --fix`, then run `ruff format .`):\n"
            + "\n".join(map(str, offences)),
            pytrace=False,
        )


@pytest.mark.parametrize(
    "source",
    [
        # a coefficient table, aligned over several lines
        """\
        _A = (3.3871328727963666080e0, 1.3314166789178437745e2,
              -1.9715909503065514427e3, 1.3731693765509461125e4)  # fmt: skip
        """,
        # golden values with row labels and dict keys, nested
        """\
        GOLDEN = {"alm":     [("eps=1", 0.50,  0.25), ("eps=2", 0.75, 0.125)],
                  "laplace": [("eps=1", 1.00, -0.5),  ("eps=2", 2.0,  math.inf)]}  # fmt: skip
        """,
        # a matrix handed to an array constructor, and an annotated class constant
        """\
        class T:
            M: Final = np.array([[1.0,  0.0],
                                 [0.0, -1.0]], dtype=np.float64)  # fmt: skip
        """,
        """\
        expected = torch.tensor([1, -2, +3], dtype=torch.int64)  # fmt: skip
        """,
        """\
        SIZES = {1: 10, 2: 20}  # fmt:skip
        """,
    ],
    ids=["coefficients", "labelled-golden", "np-array", "torch-tensor", "numeric-keys"],
)
def test_a_numeric_table_may_keep_its_alignment(checker: ModuleType, source: str) -> None:
    assert _lines(checker, source) == []


@pytest.mark.parametrize(
    ("source", "line"),
    [
        ("x = f(a,  b)  # fmt: skip\n", 1),
        ("assert f(x) == [1.0,  2.0]  # fmt: skip\n", 1),
        ("return_value = [\n    compute(a,\n            b),\n    2.0,\n]  # fmt: skip\n", 5),
        ("def f():\n    return (1.0,  2.0)  # fmt: skip\n", 2),
        ("def f(a,\n      b):  # fmt: skip\n    pass\n", 2),
        ("x = (1.0,  # fmt: skip\n     2.0)\n", 1),
        ("f(x,\n  y)  # fmt: skip\n", 2),
        ("rows += [1.0,  2.0]  # fmt: skip\n", 1),
        ('__all__ = ["a",  "b"]  # fmt: skip\n', 1),
        ('TRUTH = {"yes": True,  "no": False}  # fmt: skip\n', 1),
        ('row = {"seed": seed,  "m": 12}  # fmt: skip\n', 1),
        ("v = [x * 2 for x in (1.0,  2.0)]  # fmt: skip\n", 1),
        ("v = [*base,  1.0, 2.0]  # fmt: skip\n", 1),
        ("v = (1.0,)  # fmt: skip\n", 1),
        ('v = [("a-label-far-longer-than-any-table-key", 1.0, 2.0)]  # fmt: skip\n', 1),
        ("v = np.array([1.0, 2.0], [3.0])  # fmt: skip\n", 1),
        ("# fmt: off\nA = (1.0,  2.0)\n# fmt: on\n", 1),
        ("A = (1.0,  2.0)  # fmt: off\n", 1),
        ("A = (1.0,  2.0)  # yapf: disable\n", 1),
    ],
    ids=[
        "call",
        "assert",
        "multi-line-expression",
        "return",
        "def-header",
        "inside-brackets",
        "multi-line-call",
        "augmented",
        "string-list",
        "bool-dict",
        "names",
        "comprehension",
        "unpacking",
        "one-number",
        "long-label",
        "wrapper-with-two-arguments",
        "fmt-off-block",
        "trailing-fmt-off",
        "yapf",
    ],
)
def test_anything_else_is_refused_at_its_line(checker: ModuleType, source: str, line: int) -> None:
    assert _lines(checker, source)[:1] == [line]


def test_fmt_off_and_on_are_both_refused(checker: ModuleType) -> None:
    assert _lines(checker, "# fmt: off\nA = (1.0,  2.0)\n# fmt: on\n") == [1, 3]


def test_a_pragma_inside_a_string_is_no_comment(checker: ModuleType) -> None:
    assert _lines(checker, 'x = f("# fmt: skip")\ny = """\n# fmt: off\n"""\n') == []


def test_fix_removes_only_the_pragma(checker: ModuleType) -> None:
    source = textwrap.dedent(
        """\
        def f(a,
              b):  # type: ignore[no-untyped-def]  # fmt: skip
            x = g(a,  b)  # fmt: skip
            y = g(a,  "# fmt: skip")  # fmt: skip  # noqa: E501
            # fmt: off
            z = (1.0,  2.0)  # fmt: skip
            # fmt: on
            return x, y, z
        """
    )
    fixed = checker.fix_source(source, checker.check_source(source))
    assert fixed == textwrap.dedent(
        """\
        def f(a,
              b):  # type: ignore[no-untyped-def]
            x = g(a,  b)
            y = g(a,  "# fmt: skip")  # noqa: E501
            z = (1.0,  2.0)  # fmt: skip
            return x, y, z
        """
    )
    ast.parse(fixed)
    assert checker.check_source(fixed) == []


def test_the_command_lists_offenders_and_fix_clears_them(
    checker: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text("A = (1.0,  2.0)  # fmt: skip\nf(a,\n  b)  # fmt: skip\n")
    (tmp_path / "notes.txt").write_text("# fmt: skip\n")  # not Python: not read
    assert checker.main(["--check", str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert out.splitlines() == [
        f"{bad}:3: on an expression statement, not a table assignment: # fmt: skip"
    ]
    assert checker.main(["--fix", str(tmp_path)]) == 0
    assert bad.read_text() == "A = (1.0,  2.0)  # fmt: skip\nf(a,\n  b)\n"
    assert checker.main(["--check", str(tmp_path)]) == 0
    assert checker.main(["--check", str(tmp_path / "notes.txt")]) == 2
    (tmp_path / "broken.py").write_text("x = (\n")
    assert checker.main(["--check", str(tmp_path)]) == 2
    assert "broken.py:1: does not parse" in capsys.readouterr().err
