"""Lu's networks train as one vectorised bank: every head of a ``train_lu_nets`` call is the
network that call would train on that head's rows alone (the adaptive attacker's shadow
banks rely on it)."""

from __future__ import annotations

import pytest
import torch

from baselines.lu.net import LuConfig, train_lu_nets

CONFIG = LuConfig(hidden=16, steps=60, lr=0.05)


def _data() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    x = torch.nn.functional.normalize(torch.randn(60, 8, generator=g, dtype=torch.float64), dim=1)
    return x, torch.randint(0, 3, (60,), generator=g)


@pytest.mark.parametrize("sizes", [(30, 30, 30, 30), (20, 30, 45, 30)])
def test_a_bank_equals_its_heads_trained_one_at_a_time(sizes: tuple[int, ...]) -> None:
    # Equal sizes train on each head's own rows (gathered), unequal ones on every row with
    # the head's mask: both must give each head the network of its rows alone.
    x, y = _data()
    g = torch.Generator().manual_seed(1)
    masks = torch.zeros(len(sizes), len(y), dtype=torch.bool)
    for b, size in enumerate(sizes):
        masks[b, torch.randperm(len(y), generator=g)[:size]] = True
    bank = train_lu_nets(x, y, masks=masks, num_classes=3, config=CONFIG, seed=7)
    for b in range(len(sizes)):
        alone = train_lu_nets(x, y, masks=masks[b : b + 1], num_classes=3, config=CONFIG, seed=7)
        for name, value in alone.items():
            assert value.shape[0] == 1 and bank[name].shape[0] == len(sizes)
            # batched and single products round differently; Adam keeps that at rounding
            torch.testing.assert_close(bank[name][b], value[0], atol=1e-9, rtol=0)
    # the heads did learn different networks (their rows differ)
    assert not torch.allclose(bank["fc1.weight"][0], bank["fc1.weight"][1])
