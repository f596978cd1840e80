"""Contrastive losses as pure functions."""

from __future__ import annotations

import torch
from torch import Tensor
from torch.nn import functional as F


def nt_xent(z1: Tensor, z2: Tensor, *, temperature: float = 0.5) -> Tensor:
    """NT-Xent (normalised temperature-scaled cross-entropy), SimCLR (Chen et al. 2020, Eq. 1).

    ``z1[k]`` and ``z2[k]`` are two views of example ``k``. For each of the ``2N`` views the
    positive is its twin and the ``2N - 2`` other views are negatives; the loss is the mean
    over all ``2N`` anchors of ``-log softmax`` of the positive's cosine similarity / T.

    Args:
        z1: (N, D) projections of the first views.
        z2: (N, D) projections of the second views.
        temperature: the temperature ``T`` > 0.

    Returns:
        The scalar loss.

    Raises:
        ValueError: for mismatched shapes, N < 2, or a non-positive temperature.
    """
    if z1.shape != z2.shape or z1.ndim != 2:
        raise ValueError(f"z1 and z2 must both be (N, D); got {tuple(z1.shape)}, {tuple(z2.shape)}")
    if z1.shape[0] < 2:
        raise ValueError(f"NT-Xent needs N >= 2 examples for negatives; got N={z1.shape[0]}")
    if not temperature > 0:
        raise ValueError(f"temperature={temperature!r} is invalid: expected a number > 0")
    n = z1.shape[0]
    z = F.normalize(torch.cat([z1, z2]), dim=1)
    sim = z @ z.T / temperature
    sim = sim.masked_fill(torch.eye(2 * n, dtype=torch.bool, device=z.device), float("-inf"))
    positives = torch.cat([torch.arange(n, 2 * n), torch.arange(0, n)]).to(z.device)
    return F.cross_entropy(sim, positives)
