"""One rank of the 2-rank gloo runs of `test_training_distributed.py` (not collected by pytest).

`torch.multiprocessing.spawn` imports this module by name in each child (the test puts its
folder on ``sys.path``, which the spawned children inherit). Every scenario runs in one
process group, so the children start once; each rank saves what it saw to
``out/rank{r}.pt`` and the test compares the ranks and the references in the parent.
"""

from __future__ import annotations

import os
import socket
import warnings
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
from opacus.distributed import DifferentiallyPrivateDistributedDataParallel as DPDDP
from torch import distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset

from alm_opacus.training import PrivacyEngine, SecureDistributedPoissonSampler, l1_clip

MECHANISMS = ("alm", "laplace", "gaussian")
WRAPPERS = {"dpddp": DPDDP, "ddp": DDP}
N, BATCH = 256, 32  # the user's loader: q = 1 / len = 1/8, expected global batch 32
STEPS = 20
NOISE_STEPS, NOISE_WIDTH = 10, 64  # zero-gradient runs: 10 steps of a 64x64 linear layer
SEEDED_STEPS = 10
NOISE_SEED, BATCH_SEED = 11, 12


def loopback_interface() -> str:
    """The loopback interface's name, so that gloo binds to 127.0.0.1 only."""
    names = [name for _, name in socket.if_nameindex()]
    return "lo" if "lo" in names else next(n for n in names if n.startswith("lo"))


def dataset(dtype: torch.dtype = torch.float32) -> TensorDataset:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(N, 8, generator=g, dtype=dtype)
    return TensorDataset(x, (x[:, 0] + 0.5 * x[:, 1] > 0).long())


def model(seed: int, dtype: torch.dtype = torch.float32) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2)).to(dtype)


def clip(mechanism: str, module: nn.Module) -> float:
    return 1.0 if mechanism == "gaussian" else l1_clip(1.0, params=module)


def flat(module: nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1).clone() for p in module.parameters()])


def train(wrapper: str, mechanism: str, rank: int) -> dict[str, Any]:
    """20 secure steps from rank-dependent initial weights (the wrapper synchronises them)."""
    net = model(seed=100 + rank)
    engine = PrivacyEngine()
    private, optimizer, loader = engine.make_private(
        module=WRAPPERS[wrapper](net),
        optimizer=torch.optim.SGD(net.parameters(), lr=0.5),
        data_loader=DataLoader(dataset(), batch_size=BATCH),
        noise_multiplier=1.0,
        max_grad_norm=clip(mechanism, net),
        noise_mechanism=mechanism,
    )
    sizes, steps = [], 0
    while steps < STEPS:
        for x, y in loader:
            optimizer.zero_grad()
            nn.functional.cross_entropy(private(x), y).backward()
            optimizer.step()
            sizes.append(len(y))
            steps += 1
            if steps == STEPS:
                break
    accountant = engine.accountant
    return {
        "params": flat(net),
        "epsilon": engine.get_epsilon(1e-5),
        "noise_steps": accountant.noise_steps,
        "history": accountant.history,
        "noise_draws": optimizer.noise_draws,
        "optimizer": type(optimizer).__name__,
        "sampler": type(loader.batch_sampler).__name__,
        "sample_rate": loader.sample_rate,
        "dim": optimizer.noise_dim,
        "sizes": sizes,
        "expected_batch_size": optimizer.expected_batch_size,
    }


def zero_gradient_noise(wrapper: str, mechanism: str) -> torch.Tensor:
    """The averaged noisy gradient of 10 steps whose per-sample gradients are all zero."""
    net = nn.Linear(NOISE_WIDTH, NOISE_WIDTH).double()
    x = torch.randn(N, NOISE_WIDTH, dtype=torch.float64)
    engine = PrivacyEngine()
    private, optimizer, loader = engine.make_private(
        module=WRAPPERS[wrapper](net),
        optimizer=torch.optim.SGD(net.parameters(), lr=0.0),
        data_loader=DataLoader(TensorDataset(x), batch_size=BATCH),
        noise_multiplier=1.0,
        max_grad_norm=1.0,
        noise_mechanism=mechanism,
    )
    grads = []
    for _, (batch,) in zip(range(NOISE_STEPS), loader, strict=False):
        optimizer.zero_grad()
        (0.0 * private(batch).sum()).backward()
        optimizer.step()
        grads.append(torch.cat([p.grad.reshape(-1) for p in net.parameters()]))
    return torch.stack(grads)


def seeded(wrapper: str, mechanism: str) -> torch.Tensor:
    """10 steps from the seeds the parent's one-process reference uses (float64)."""
    net = model(seed=0, dtype=torch.float64)
    engine = PrivacyEngine(secure_mode=False)
    private, optimizer, loader = engine.make_private(
        module=WRAPPERS[wrapper](net),
        optimizer=torch.optim.SGD(net.parameters(), lr=0.5),
        data_loader=DataLoader(
            dataset(torch.float64),
            batch_size=BATCH,
            generator=torch.Generator().manual_seed(BATCH_SEED),
        ),
        noise_multiplier=1.0,
        max_grad_norm=clip(mechanism, net),
        noise_mechanism=mechanism,
        noise_generator=torch.Generator().manual_seed(NOISE_SEED),
    )
    for _, (x, y) in zip(range(SEEDED_STEPS), loader, strict=False):
        optimizer.zero_grad()
        nn.functional.cross_entropy(private(x), y).backward()
        optimizer.step()
    return flat(net)


def empty_local_batch(rank: int) -> dict[str, Any]:
    """One step in which rank 1's local batch is empty: no hang, one accounted step each."""
    net = model(seed=0)
    engine = PrivacyEngine()
    private, optimizer, _ = engine.make_private(
        module=DPDDP(net),
        optimizer=torch.optim.SGD(net.parameters(), lr=0.5),
        data_loader=DataLoader(dataset(), batch_size=BATCH),
        noise_multiplier=1.0,
        max_grad_norm=1.0,
        noise_mechanism="alm",
    )
    x, y = dataset().tensors
    count = 3 if rank == 0 else 0
    optimizer.zero_grad()
    nn.functional.cross_entropy(private(x[:count]), y[:count]).backward()
    optimizer.step()
    return {"params": flat(net), "steps": len(engine.accountant)}


def virtual_steps() -> dict[str, Any]:
    """Opacus's BatchMemoryManager on each rank: physical batches of at most 4 examples, the
    ranks' physical step counts differ, noise and all-reduce once per logical step."""
    from opacus.utils.batch_memory_manager import BatchMemoryManager

    net = model(seed=0)
    engine = PrivacyEngine()
    private, optimizer, loader = engine.make_private(
        module=DPDDP(net),
        optimizer=torch.optim.SGD(net.parameters(), lr=0.5),
        data_loader=DataLoader(dataset(), batch_size=BATCH),
        noise_multiplier=1.0,
        max_grad_norm=l1_clip(1.0, params=net),
        noise_mechanism="laplace",
    )
    physical = 0
    with BatchMemoryManager(
        data_loader=loader, max_physical_batch_size=4, optimizer=optimizer
    ) as batches:
        for x, y in batches:
            optimizer.zero_grad()
            nn.functional.cross_entropy(private(x), y).backward()
            optimizer.step()
            physical += 1
    return {
        "params": flat(net),
        "physical": physical,
        "noise_draws": optimizer.noise_draws,
        "steps": len(engine.accountant),
    }


def sampler_batches(rank: int) -> dict[str, Any]:
    """Batches of the distributed sampler: seeded (to compare with one process) and secure
    with a tiny rate (empty local batches must still be yielded)."""
    seeded_sampler = SecureDistributedPoissonSampler(
        total_size=50,
        sample_rate=0.3,
        generator=torch.Generator().manual_seed(BATCH_SEED),
        steps=6,
    )
    sparse = SecureDistributedPoissonSampler(total_size=6, sample_rate=0.05, steps=40)
    return {
        "seeded": list(seeded_sampler),
        "shard": seeded_sampler.shard().tolist(),
        "sparse": list(sparse),
        "seeded_flag": seeded_sampler.seeded,
        "sparse_flag": sparse.seeded,
    }


def plain_module_warning() -> list[str]:
    """make_private on a module that is not wrapped, with torch.distributed running."""
    net = model(seed=0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        PrivacyEngine().make_private(
            module=net,
            optimizer=torch.optim.SGD(net.parameters(), lr=0.5),
            data_loader=DataLoader(dataset(), batch_size=BATCH),
            noise_multiplier=1.0,
            max_grad_norm=1.0,
        )
    return [str(w.message) for w in caught if issubclass(w.category, UserWarning)]


def fsdp_refusal() -> str:
    """The engine's message for an FSDP (fully_shard) module."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    net = fully_shard(model(seed=0), mesh=init_device_mesh("cpu", (dist.get_world_size(),)))
    try:
        PrivacyEngine().make_private(
            module=net,
            optimizer=torch.optim.SGD(net.parameters(), lr=0.5),
            data_loader=DataLoader(dataset(), batch_size=BATCH),
            noise_multiplier=1.0,
            max_grad_norm=1.0,
        )
    except ValueError as refusal:
        return str(refusal)
    return ""


def run(rank: int, world_size: int, init_file: str, out: str, timeout_s: float = 120.0) -> None:
    """The entry point of ``torch.multiprocessing.spawn``: every scenario, then save.
    ``timeout_s`` bounds the rendezvous and each collective (scaled for load by the test)."""
    os.environ["GLOO_SOCKET_IFNAME"] = loopback_interface()
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore", message="Full backward hook is firing")
    warnings.filterwarnings("ignore", message="Using a non-full backward hook")
    dist.init_process_group(
        "gloo",
        init_method=f"file://{init_file}",
        rank=rank,
        world_size=world_size,
        timeout=timedelta(seconds=timeout_s),
    )
    try:
        results: dict[str, Any] = {"rank": rank}
        for wrapper in WRAPPERS:
            for mechanism in MECHANISMS:
                results[f"train/{wrapper}/{mechanism}"] = train(wrapper, mechanism, rank)
                results[f"noise/{wrapper}/{mechanism}"] = zero_gradient_noise(wrapper, mechanism)
                results[f"seeded/{wrapper}/{mechanism}"] = seeded(wrapper, mechanism)
        results["empty"] = empty_local_batch(rank)
        results["virtual"] = virtual_steps()
        results["sampler"] = sampler_batches(rank)
        results["warnings"] = plain_module_warning()
        results["fsdp"] = fsdp_refusal()
        dist.barrier()
        torch.save(results, Path(out) / f"rank{rank}.pt")
    finally:
        dist.destroy_process_group()
