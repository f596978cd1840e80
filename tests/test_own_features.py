"""docs/own_features.md as a user follows it: features exported with numpy alone, then
``compare.py --dataset features:PATH --methods alm,dpsgd``."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import numpy as np
import pytest

from alm_opacus.run.rundir import SPLIT_FILE

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "own_features.md"


def _blocks(kind: str) -> list[str]:
    return re.findall(rf"```{kind}\n(.*?)```", DOC.read_text(), flags=re.S)


def _user_code() -> dict[str, object]:
    """What the doc leaves to the user: their data and their encoder (a stand-in: a fixed
    random projection of scikit-learn's digits, in numpy)."""
    from sklearn.datasets import load_digits

    def load_my_images() -> tuple[np.ndarray, np.ndarray]:
        images, labels = load_digits(return_X_y=True)
        return images.reshape(-1, 8, 8), labels

    projection = np.random.default_rng(0).standard_normal((64, 32))

    def my_encoder(batch: np.ndarray) -> np.ndarray:
        return np.tanh(batch.reshape(len(batch), -1) @ projection / 16)

    return {"load_my_images": load_my_images, "my_encoder": my_encoder}


@pytest.mark.slow
def test_the_documented_flow_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from alm_opacus.run.cli import main

    monkeypatch.chdir(tmp_path)
    export, with_roles = _blocks("python")
    namespace = _user_code()
    exec(export, namespace)  # writes my_features.npz with numpy alone
    with np.load("my_features.npz") as saved:
        assert set(saved.files) == {"x", "y"} and saved["x"].shape == (1797, 32)
    (command,) = (b for b in _blocks("bash") if "features:" in b)
    argv = shlex.split(command)
    assert argv[:2] == ["python", "scripts/compare.py"]
    # the command as documented, made quick: one epsilon, one draw, two attacks, m = 20
    quick = [
        "--out",
        "run",
        "--cache-dir",
        "cache",
        "--no-progress",
        "--epsilons",
        "1",
        "--noise-draws",
        "1",
        "--attacks",
        "loss,lira-offline",
        "--opt",
        "m=20",
    ]
    assert main([*argv[2:], *quick]) == 0
    rows = (tmp_path / "run" / "results.csv").read_text().splitlines()
    assert {"none", "alm", "dpsgd"} <= {r.split(",")[1] for r in rows[1:]}
    exec(with_roles, namespace)  # the same file with a role column
    assert main([*argv[2:], *quick[:1], "run-roles", *quick[2:]]) == 0
    split = json.loads((tmp_path / "run-roles" / SPLIT_FILE).read_text())
    with np.load("my_features.npz") as saved:
        role = saved["role"]
    assert sorted(split["members"]) == np.flatnonzero(role == "member").tolist()
    assert sorted(split["public"]) == np.flatnonzero(role == "public").tolist()
