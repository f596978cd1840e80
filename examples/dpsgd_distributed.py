#!/usr/bin/env python
"""DP-SGD with logistic (ALM) noise on several processes: an Opacus DPDDP script, switched.

    torchrun --nproc_per_node 2 examples/dpsgd_distributed.py

On a CPU the processes talk through gloo; with ``--device cuda`` each process drives one GPU
(``LOCAL_RANK``) and they talk through nccl. Every rank builds the same model and loader over
the whole dataset; the engine samples each rank's shard (Poisson at the global rate
``1 / len(train_loader)``), draws each step's noise once, on rank 0, and all-reduces the
noisy sum, so every rank takes the same step and reports the same epsilon. Against the
Opacus script it came from, two lines differ (``# was:``).
"""

from __future__ import annotations

import argparse
import os
import warnings

import torch
import torch.distributed as dist
from opacus.distributed import DifferentiallyPrivateDistributedDataParallel as DPDDP
from sklearn.datasets import load_digits
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from alm_opacus.training import PrivacyEngine, l1_clip  # was: from opacus import PrivacyEngine


def digits() -> tuple[TensorDataset, TensorDataset]:
    """scikit-learn's embedded digits (no download): 1,400 training and 397 test images."""
    data = load_digits()
    x = torch.tensor(data.data / 16.0, dtype=torch.float32)
    y = torch.tensor(data.target)
    order = torch.randperm(len(x), generator=torch.Generator().manual_seed(0))
    train, test = order[:1400], order[1400:]
    return TensorDataset(x[train], y[train]), TensorDataset(x[test], y[test])


def train(device: torch.device, epochs: int) -> None:
    """The Opacus DPDDP loop, switched to logistic noise; rank 0 prints the outcome."""
    train, test = digits()

    torch.manual_seed(0)
    model = DPDDP(nn.Linear(64, 10).to(device))  # DPDDP broadcasts rank 0's weights
    optimizer = torch.optim.SGD(model.parameters(), lr=0.25)
    train_loader = DataLoader(train, batch_size=64)  # global batch 64 on average

    privacy_engine = PrivacyEngine()
    model, optimizer, train_loader = privacy_engine.make_private(
        module=model,
        optimizer=optimizer,
        data_loader=train_loader,
        noise_multiplier=0.5,
        max_grad_norm=l1_clip(1.0, params=model), noise_mechanism="alm",  # was: max_grad_norm=1.0,
    )  # fmt: skip
    for _ in range(epochs):
        for x, y in train_loader:
            optimizer.zero_grad()
            nn.functional.cross_entropy(model(x.to(device)), y.to(device)).backward()
            optimizer.step()
    epsilon = privacy_engine.get_epsilon(delta=1e-5)

    weights = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    gathered = [torch.empty_like(weights) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, weights)
    identical = all(torch.equal(w, gathered[0]) for w in gathered)
    x_test, y_test = (t.to(device) for t in test.tensors)
    with torch.no_grad():
        accuracy = (model(x_test).argmax(1) == y_test).float().mean().item()
    if dist.get_rank() == 0:
        print(
            f"ranks={dist.get_world_size()} backend={dist.get_backend()} noise=alm "
            f"epsilon={epsilon:.3f} (delta=1e-5) test_accuracy={accuracy:.3f} "
            f"identical_parameters={identical}"
        )
    if not identical:
        raise SystemExit("the ranks' parameters differ")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--init-method", default="env://", help="torchrun's env:// by default")
    args = parser.parse_args()
    # Opacus's hooks fire on inputs that need no gradient; torch says so on every backward
    warnings.filterwarnings("ignore", message="Full backward hook is firing")
    device = torch.device(args.device)
    dist.init_process_group(  # torchrun sets RANK and WORLD_SIZE in each process
        "nccl" if device.type == "cuda" else "gloo", init_method=args.init_method,
        rank=int(os.environ["RANK"]), world_size=int(os.environ["WORLD_SIZE"]),
    )  # fmt: skip
    try:
        if device.type == "cuda":  # one GPU per process
            device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
            torch.cuda.set_device(device)
        train(device, args.epochs)
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
