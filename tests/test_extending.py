"""The extension examples of docs/api.md run as written: a method, a dataset and an attack,
each one new file, then used by the harness on the same grid, splits and attacks."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

import pytest

from alm_opacus.registry import Registry

ROOT = Path(__file__).resolve().parents[1]


def _example(first_line: str) -> str:
    """The python block of docs/api.md that starts with ``first_line``."""
    text = (ROOT / "docs" / "api.md").read_text()
    for block in re.findall(r"```python\n(.*?)```", text, flags=re.S):
        if block.startswith(first_line):
            return block
    raise AssertionError(f"docs/api.md has no example starting {first_line!r}")


def _load(tmp_path: Path, first_line: str, name: str) -> None:
    path = tmp_path / f"{name}.py"
    path.write_text(_example(first_line))
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)


@pytest.fixture
def isolated(monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    """Registrations made by the examples vanish after the test."""
    # Registry.isolated loads the plugins first, into the real registries: registered inside
    # the block, they would vanish with it, and a later load finds them already imported.
    with Registry.isolated():
        yield


@pytest.mark.slow
def test_the_three_examples_run_in_the_harness(tmp_path, isolated) -> None:  # type: ignore[no-untyped-def]
    from alm_opacus.attacks import available_attacks
    from alm_opacus.run.config import RunConfig
    from alm_opacus.run.harness import run

    _load(tmp_path, "# my_package/rounded.py", "rounded_example")
    _load(tmp_path, "# my_package/four_digits.py", "four_digits_example")
    _load(tmp_path, "# my_package/max_probability.py", "max_probability_example")
    assert "max-probability" in available_attacks()
    config = RunConfig(
        dataset="four-digits",
        methods=("rounded", "alm"),
        epsilons=(1.0,),
        noise_draws=1,
        attacks=("max-probability", "loss"),
        options={"rounded.decimals": 2, "m": 4},
        out=str(tmp_path / "run"),
        cache_dir=str(tmp_path / "cache"),
        progress=False,
    )
    rows = run(config).rows
    got = {(r.method, r.attack) for r in rows}
    assert ("rounded", "max-probability") in got and ("alm", "max-probability-clean") in got
    assert {r.dataset for r in rows} == {"four-digits"}
    baseline = next(r for r in rows if r.method == "none")
    assert baseline.test_accuracy > 0.8  # four classes of digits are easy
