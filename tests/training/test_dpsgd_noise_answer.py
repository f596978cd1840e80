"""Helpers of ``scripts/dpsgd_noise_answer.py`` (the numbers of docs/dpsgd_noise.md's answer)."""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest
import torch

from alm_opacus.heads import HeadConfig
from baselines.dpsgd.config import DPSGDConfig
from baselines.dpsgd.head import HeadNet, init_params


@pytest.fixture(scope="module")
def script() -> ModuleType:
    path = Path(__file__).parents[2] / "scripts" / "dpsgd_noise_answer.py"
    spec = importlib.util.spec_from_file_location("dpsgd_noise_answer", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("hidden", [None, 16, 64])
def test_head_params_counts_what_the_engine_noises(script: ModuleType, hidden: int | None) -> None:
    d, k = 7, 3
    head = HeadConfig() if hidden is None else HeadConfig(kind="mlp", hidden=hidden)
    net = HeadNet(init_params(d=d, num_classes=k, head=head, seed=0), head.kind)
    trainable = sum(p.numel() for p in net.parameters() if p.requires_grad)
    assert script.head_params(d=d, num_classes=k, hidden=hidden) == trainable


def test_l1_clips_are_the_l2_clips_times_sqrt_params(script: ModuleType) -> None:
    assert script.clip_grid("gaussian", 1290) == script.L2_CLIP_GRID
    for mech in ("alm", "laplace"):
        scaled = script.clip_grid(mech, 1290)
        assert scaled == pytest.approx([c * math.sqrt(1290) for c in script.L2_CLIP_GRID])


@pytest.mark.parametrize(
    ("n_public", "n_members", "sizes"), [(600, 150, (150, 450)), (1000, 1000, (750, 250))]
)
def test_public_tuning_split_is_disjoint_and_inside_public(
    script: ModuleType, n_public: int, n_members: int, sizes: tuple[int, int]
) -> None:
    tr, va = script.public_tuning_split(n_public, n_members=n_members, seed=3)
    assert (len(tr), len(va)) == sizes
    assert not set(tr) & set(va)
    assert set(tr) | set(va) == set(range(n_public))
    with pytest.raises(ValueError, match="public rows"):
        script.public_tuning_split(10, n_members=5, seed=0)


def test_selection_sees_only_the_score_and_takes_the_first_best(script: ModuleType) -> None:
    grid = [DPSGDConfig(lr=lr, max_grad_norm=c) for lr in (1.0, 4.0) for c in (0.5, 1.0)]
    seen: list[DPSGDConfig] = []
    scores = {0.5: 0.2, 1.0: 0.7}

    def score(cfg: DPSGDConfig) -> float:
        seen.append(cfg)
        return scores[cfg.max_grad_norm]

    chosen, got = script.select_on_public(grid, score)
    assert seen == grid and got == [0.2, 0.7, 0.2, 0.7]
    assert chosen == grid[1]  # tie with grid[3]: the first wins


def _row(script: ModuleType, mech: str, acc: float) -> object:
    return script.Row(
        dataset="digits",
        head="linear",
        params=1290,
        mechanism=mech,
        epsilon=10.0,
        sigma=2.0,
        lr=1.0,
        clip=0.5,
        accuracy=acc,
        auc=0.55,
    )


def test_table_puts_mechanisms_side_by_side(script: ModuleType) -> None:
    table = script.render_table([_row(script, "alm", 0.1), _row(script, "gaussian", 0.8)])
    lines = table.strip().splitlines()
    assert lines[0].startswith("| dataset | head | params | ε | acc gaussian | acc alm |")
    assert "laplace" not in lines[0]
    assert lines[2] == (
        "| digits | linear | 1,290 | 10 | 0.800 | 0.100 | 0.550 | 0.550 | 2 / 0.5 | 2 / 0.5 |"
    )


def test_loss_attack_scores_low_loss_as_member(script: ModuleType) -> None:
    head = torch.nn.Linear(2, 2)
    with torch.no_grad():
        head.weight.copy_(torch.eye(2) * 5)
        head.bias.zero_()
    x = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    y_fit, y_wrong = torch.tensor([0, 1]), torch.tensor([1, 0])
    acc, auc = script._loss_auc_and_accuracy(head, x, y_fit, x, y_wrong)
    assert acc == 0.0 and auc == 1.0
    assert np.isclose(script._loss_auc_and_accuracy(head, x, y_fit, x, y_fit)[1], 0.5)
