"""A victim on digits (raw 64-pixel features) that several attack tests share."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
import torch
from torch import Tensor

from alm_opacus.attacks import AttackTarget
from alm_opacus.data import load_dataset
from alm_opacus.heads import HeadConfig, train_head

DigitsTarget = Callable[..., tuple[Tensor, Tensor, np.ndarray, AttackTarget]]


@pytest.fixture(scope="module")
def digits_target() -> DigitsTarget:
    """``make(members=, recipe=)``: digits' features and labels, a permutation of the rows
    (seed 1), and the target: a head (seed 5) trained on the first ``members`` rows of it,
    evaluated on them and the next ``members`` (the attacker's pool is the rows after)."""

    def make(
        *, members: int, recipe: HeadConfig
    ) -> tuple[Tensor, Tensor, np.ndarray, AttackTarget]:
        ds = load_dataset("digits")
        x = torch.from_numpy(ds.images.reshape(len(ds.images), -1)).double()
        y = torch.from_numpy(ds.labels)
        perm = np.random.default_rng(1).permutation(len(y))
        mem, non = perm[:members], perm[members : 2 * members]
        head = train_head(x[mem], y[mem], num_classes=10, config=recipe, seed=5)
        ev = np.r_[mem, non]
        target = AttackTarget(
            predict=head.predict_proba,
            features=x[ev],
            labels=y[ev],
            is_member=np.r_[np.ones(members, bool), np.zeros(members, bool)],
            num_classes=10,
        )
        return x, y, perm, target

    return make
