"""DP-SGD on two processes (gloo, loopback only), for every mechanism, with DPDDP and with DDP:
identical ranks, the noise of one step drawn once, the one-process accounting, and the
one-process run replayed from the same seeds.

The ranks run every scenario once (`_distributed_worker.run`, ~20 s on an idle 2-core
machine, most of it importing torch in the two children) and the tests read what they saved.
The rendezvous is a file store, so nothing listens on a network port (torch's TCP store would
listen on every interface), and gloo is bound to the loopback interface.
"""

from __future__ import annotations

import math
import multiprocessing
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.multiprocessing as mp
from opacus.grad_sample import GradSampleModule
from scipy import stats
from torch import nn
from torch.utils.data import DataLoader

from alm_opacus.accounting import PipelineAccountant
from alm_opacus.training import PrivacyEngine, SecurePoissonSampler

pytestmark = [
    pytest.mark.slow,
    pytest.mark.hard_limit(1200),  # each phase: the ranks fixture waits DEADLINE for them
    pytest.mark.filterwarnings("ignore:Full backward hook is firing"),
    pytest.mark.filterwarnings("ignore:Using a non-full backward hook"),
]

HERE = Path(__file__).resolve().parent
WORLD = 2
DEADLINE = 600  # seconds for both ranks, every scenario (scaled for the machine's load)
DELTA = 1e-5
UNIT_STD = {  # standard deviation of the unit-scale noise of each mechanism (scipy.stats)
    "alm": float(stats.logistic.std()),
    "laplace": float(stats.laplace.std()),
    "gaussian": float(stats.norm.std()),
}
EXCESS_KURTOSIS = {
    "alm": float(stats.logistic.stats(moments="k")),
    "laplace": float(stats.laplace.stats(moments="k")),
    "gaussian": float(stats.norm.stats(moments="k")),
}
CASES = [(w, m) for w in ("dpddp", "ddp") for m in ("alm", "laplace", "gaussian")]


@pytest.fixture(scope="module")
def worker() -> Any:
    sys.path.insert(0, str(HERE))  # the spawned children inherit sys.path
    try:
        import _distributed_worker

        yield _distributed_worker
    finally:
        sys.path.remove(str(HERE))


@pytest.fixture(scope="module")
def ranks(
    worker: Any, tmp_path_factory: pytest.TempPathFactory, deadline: Any
) -> list[dict[str, Any]]:
    """Spawn two gloo ranks that run every scenario; return what each saved."""
    out = tmp_path_factory.mktemp("ranks")
    init_file = out / "rendezvous"
    args = (WORLD, str(init_file), str(out), deadline(120))
    context = mp.spawn(worker.run, args=args, nprocs=WORLD, join=False)
    limit = deadline(DEADLINE)
    end = time.monotonic() + limit
    try:
        while not context.join(timeout=5):
            if time.monotonic() > end:
                raise TimeoutError(f"the {WORLD} ranks did not finish in {limit:.0f} s")
    finally:
        for process in context.processes:
            if process.is_alive():
                process.kill()
            process.join()
    assert not multiprocessing.active_children()
    return [torch.load(out / f"rank{r}.pt", weights_only=False) for r in range(WORLD)]


@pytest.mark.parametrize(("wrapper", "mechanism"), CASES)
def test_ranks_hold_identical_parameters_after_20_steps(
    ranks: list[dict[str, Any]], wrapper: str, mechanism: str
) -> None:
    first, second = (r[f"train/{wrapper}/{mechanism}"] for r in ranks)
    assert first["optimizer"] == "DistributedMechanismDPOptimizer"
    assert first["sampler"] == "SecureDistributedPoissonSampler"
    assert len(first["sizes"]) == len(second["sizes"]) == 20
    # the ranks started from different weights; the wrapper broadcast rank 0's, and every
    # step added the same all-reduced gradient: the same bits on both ranks
    assert torch.equal(first["params"], second["params"])
    assert first["noise_draws"] == 20 and second["noise_draws"] == 0  # drawn once per step


@pytest.mark.parametrize(("wrapper", "mechanism"), CASES)
def test_every_rank_accounts_the_one_process_steps(
    ranks: list[dict[str, Any]], wrapper: str, mechanism: str
) -> None:
    first, second = (r[f"train/{wrapper}/{mechanism}"] for r in ranks)
    q = 1 / 8  # 1 / len(DataLoader(256 examples, batch_size=32)): the global rate
    assert first["sample_rate"] == second["sample_rate"] == q
    assert first["expected_batch_size"] * WORLD == 32  # per rank, as Opacus; 32 in all
    reference = PipelineAccountant()
    reference.step(
        noise_multiplier=1.0, sample_rate=q, mechanism=mechanism, dim=first["dim"], num_steps=20
    )
    assert first["dim"] == 8 * 16 + 16 + 16 * 2 + 2  # every parameter, as on one process
    assert first["epsilon"] == second["epsilon"] == reference.get_epsilon(DELTA)
    assert first["noise_steps"] == second["noise_steps"] == reference.noise_steps
    assert first["history"] == second["history"] == reference.history


@pytest.mark.parametrize(("wrapper", "mechanism"), CASES)
def test_noise_of_a_step_has_the_one_process_variance(
    ranks: list[dict[str, Any]], wrapper: str, mechanism: str
) -> None:
    grads = [r[f"noise/{wrapper}/{mechanism}"] for r in ranks]
    assert torch.equal(grads[0], grads[1])
    # all per-sample gradients are zero: each coordinate of the averaged gradient is Z / B,
    # Z of scale sigma * C = 1, B = 32 the expected global batch
    values = (grads[0] * 32).reshape(-1)
    n = values.numel()
    ratio = float(values.pow(2).mean()) / UNIT_STD[mechanism] ** 2  # E = 1 (mean known: 0)
    # s^2 / sigma^2 has variance (kurtosis - 1) / n. A 99.99% two-sided interval: with six
    # cases per run a 99% one failed about one CI run in 17 (seen: 2.7 sd on dpddp-gaussian,
    # while 3.2e7 draws of the same sampler matched its variance to 0.05%); it is still far
    # narrower than the gap to the doubled variance below.
    half_width = stats.norm.ppf(1 - 1e-4 / 2) * math.sqrt((EXCESS_KURTOSIS[mechanism] + 2) / n)
    assert abs(ratio - 1) < half_width
    # noise drawn on both ranks would double the variance: far outside its own interval
    assert abs(ratio - WORLD) > WORLD * half_width


def _one_process(mechanism: str, worker: Any) -> torch.Tensor:
    net = worker.model(seed=0, dtype=torch.float64)
    engine = PrivacyEngine(secure_mode=False)
    private, optimizer, loader = engine.make_private(
        module=net,
        optimizer=torch.optim.SGD(net.parameters(), lr=0.5),
        data_loader=DataLoader(
            worker.dataset(torch.float64),
            batch_size=worker.BATCH,
            generator=torch.Generator().manual_seed(worker.BATCH_SEED),
        ),
        noise_multiplier=1.0,
        max_grad_norm=worker.clip(mechanism, net),
        noise_mechanism=mechanism,
        noise_generator=torch.Generator().manual_seed(worker.NOISE_SEED),
    )
    for _, (x, y) in zip(range(worker.SEEDED_STEPS), loader, strict=False):
        optimizer.zero_grad()
        nn.functional.cross_entropy(private(x), y).backward()
        optimizer.step()
    return worker.flat(net)


@pytest.mark.parametrize(("wrapper", "mechanism"), CASES)
def test_two_ranks_replay_the_one_process_run_from_the_same_seeds(
    ranks: list[dict[str, Any]], worker: Any, wrapper: str, mechanism: str
) -> None:
    first, second = (r[f"seeded/{wrapper}/{mechanism}"] for r in ranks)
    assert torch.equal(first, second)
    # the same batches (the union of the shards) and the same noise: only the order of the
    # float64 sums differs (two partial sums, then the all-reduce), ~1e-16 per step
    torch.testing.assert_close(first, _one_process(mechanism, worker), rtol=1e-10, atol=1e-12)


def test_an_empty_local_batch_takes_part_in_the_step(ranks: list[dict[str, Any]]) -> None:
    first, second = (r["empty"] for r in ranks)
    assert torch.equal(first["params"], second["params"])
    assert first["steps"] == second["steps"] == 1


def test_virtual_steps_noise_and_reduce_once_per_logical_step(
    ranks: list[dict[str, Any]],
) -> None:
    first, second = (r["virtual"] for r in ranks)
    assert torch.equal(first["params"], second["params"])
    assert first["steps"] == second["steps"] == 8  # one epoch of logical steps, q = 1/8
    assert first["noise_draws"] == 8 and second["noise_draws"] == 0
    assert min(first["physical"], second["physical"]) > 8  # ~16 examples per rank, 4 at a time


def test_the_seeded_shards_partition_the_one_process_batches(ranks: list[dict[str, Any]]) -> None:
    samplers = [r["sampler"] for r in ranks]
    assert sorted(samplers[0]["shard"] + samplers[1]["shard"]) == list(range(50))
    reference = SecurePoissonSampler(
        num_samples=50, sample_rate=0.3, generator=torch.Generator().manual_seed(12), steps=6
    )
    for step, batch in enumerate(reference):
        first, second = samplers[0]["seeded"][step], samplers[1]["seeded"][step]
        assert set(first).isdisjoint(second)
        assert sorted(first + second) == batch
    assert samplers[0]["seeded_flag"] is True and samplers[0]["sparse_flag"] is False


def test_every_rank_takes_every_step_even_when_its_batch_is_empty(
    ranks: list[dict[str, Any]],
) -> None:
    for rank in ranks:
        batches = rank["sampler"]["sparse"]
        assert len(batches) == 40  # Opacus's sampler skips empty local batches
        assert sum(not b for b in batches) > 0  # q = 0.05 on 3 examples: most are empty


def test_a_module_not_wrapped_for_the_ranks_is_warned_about(ranks: list[dict[str, Any]]) -> None:
    for rank in ranks:
        assert any("is not wrapped for them" in w for w in rank["warnings"])


def test_fsdp_is_refused_with_the_reason(ranks: list[dict[str, Any]]) -> None:
    for rank in ranks:
        assert "FSDP shards every parameter" in rank["fsdp"]
        assert "DifferentiallyPrivateDistributedDataParallel" in rank["fsdp"]


def test_no_process_is_left_behind(ranks: list[dict[str, Any]]) -> None:
    assert len(ranks) == WORLD
    assert not multiprocessing.active_children()
    assert not torch.distributed.is_initialized()  # the parent never joined a group


def test_a_distributed_module_without_a_process_group_is_refused() -> None:
    from opacus.distributed import DifferentiallyPrivateDistributedDataParallel as DPDDP

    module = GradSampleModule(nn.Linear(2, 2))
    fake = DPDDP.__new__(DPDDP)  # DPDDP's constructor would need the process group itself
    nn.Module.__init__(fake)
    fake.module = module
    with pytest.raises(ValueError, match=r"torch\.distributed is not initialised"):
        PrivacyEngine().make_private(
            module=fake,
            optimizer=torch.optim.SGD(fake.parameters(), lr=0.1),
            data_loader=DataLoader(torch.utils.data.TensorDataset(torch.zeros(4, 2)), batch_size=2),
            noise_multiplier=1.0,
            max_grad_norm=1.0,
        )


ROOT = HERE.parents[1]
EXAMPLE = ROOT / "examples" / "dpsgd_distributed.py"


def _launch(command: list[str], *, env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        command, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )


def test_the_torchrun_example_runs_on_two_cpu_ranks(
    worker: Any, tmp_path: Path, deadline: Any
) -> None:
    """``torchrun --nproc_per_node 2 examples/dpsgd_distributed.py`` with what torchrun sets
    in each process's environment, but a file rendezvous (torchrun's TCP store listens on
    every interface; the docs' command itself was run by hand)."""
    env = {
        **os.environ,
        "WORLD_SIZE": str(WORLD),
        "LOCAL_WORLD_SIZE": str(WORLD),
        "GLOO_SOCKET_IFNAME": worker.loopback_interface(),
        "OMP_NUM_THREADS": "1",
    }
    command = [
        sys.executable,
        str(EXAMPLE),
        "--epochs",
        "2",
        "--init-method",
        f"file://{tmp_path / 'rendezvous'}",
    ]
    processes = [
        _launch(command, env={**env, "RANK": str(r), "LOCAL_RANK": str(r)}) for r in range(WORLD)
    ]
    try:
        end = time.monotonic() + deadline(DEADLINE)
        outputs = [p.communicate(timeout=max(1.0, end - time.monotonic()))[0] for p in processes]
    finally:
        for p in processes:
            if p.poll() is None:
                p.kill()
            p.wait()
    assert [p.returncode for p in processes] == [0, 0], outputs
    (line,) = [x for x in outputs[0].splitlines() if x.startswith("ranks=")]
    assert "ranks=2 backend=gloo noise=alm" in line and "identical_parameters=True" in line
    assert not any(x.startswith("ranks=") for x in outputs[1].splitlines())  # rank 0 prints


def test_the_example_is_an_opacus_dpddp_script_with_two_lines_changed() -> None:
    ours = EXAMPLE.read_text().splitlines()
    changed = [line for line in ours if "# was: " in line]
    assert len(changed) == 2
    opacus_script = [
        line[: line.index(line.lstrip())] + line.split("# was: ")[1] if "# was: " in line else line
        for line in ours
    ]
    assert "from opacus import PrivacyEngine" in opacus_script
    assert not any("noise_mechanism" in x or "l1_clip" in x for x in opacus_script)
    assert sum(a != b for a, b in zip(ours, opacus_script, strict=True)) == 2
