"""``scripts/stability_sweep.py`` at a tiny size: every unit is measured once and cached, a
second invocation measures nothing, and the table states each recipe's claim."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def sweep() -> ModuleType:
    sys.path.insert(0, str(ROOT / "scripts"))
    spec = importlib.util.spec_from_file_location(
        "stability_sweep", ROOT / "scripts" / "stability_sweep.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["stability_sweep"] = module
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_a_tiny_sweep_caches_every_unit_and_resumes(
    sweep: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cache = tmp_path / "sweep" / "cache.json"
    options = {
        "--datasets": "features",
        "--sizes": "120",
        "--steps": "3,30",
        "--l2s": "0",
        "--draws": "1",
        "--dpsgd-epsilons": "1",
        "--m": "6",
        "--cache": str(cache),
    }
    argv = [part for pair in options.items() for part in pair]
    assert sweep.main(argv) == 0
    data = json.loads(cache.read_text())
    recipes = {key.split("|")[2] for key in data}
    assert recipes == {
        "gd T=3, eta=1, lambda=0",
        "gd T=30, eta=1, lambda=0",
        "converged, sampled",
        "converged, analytic",
        "dpsgd",
    }
    assert len(data) == 2 * 3 + 2 * 3 + 1
    for key, value in data.items():
        claim = value["guarantee"]
        if key.split("|")[2].startswith(("gd ", "converged, analytic")):
            assert claim in ("pure-dp", "approx-dp"), key
        elif "sampled" in key:
            assert claim == "random-dp", key
        assert all(0 <= acc <= 1 for acc in value["accuracy"].values())
    # the proven L2 sensitivity of T steps is T times that of one (lambda = 0, rho = 1)
    t3 = data["features|120|gd T=3, eta=1, lambda=0|gaussian"]["l2"]
    t30 = data["features|120|gd T=30, eta=1, lambda=0|gaussian"]["l2"]
    assert t30 == pytest.approx(10 * t3, rel=1e-9)
    stamp = cache.stat().st_mtime_ns
    assert sweep.main(argv) == 0  # everything cached: nothing measured, nothing rewritten
    assert cache.stat().st_mtime_ns == stamp
    table = capsys.readouterr().out
    assert "| gd T=30, eta=1, lambda=0 | gaussian | approx-dp |" in table


def test_an_unknown_dataset_exits_2(sweep: ModuleType, tmp_path: Path) -> None:
    with pytest.raises(SystemExit) as exit_info:
        sweep.main(["--datasets", "cifar", "--cache", str(tmp_path / "c.json")])
    assert exit_info.value.code == 2
