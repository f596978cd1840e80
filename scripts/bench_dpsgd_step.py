"""One DP-SGD step of ours against Opacus's, each engine in its own process, against Opacus
as shipped and against the fastest configuration of Opacus found on the machine
(``scripts/bench_dpsgd.py`` runs it and writes its block).

Opacus's backward pass allocates its per-sample gradients afresh every step. On a CPU,
glibc serves a tensor of tens of megabytes with ``mmap``, so every step faults in and zeroes
fresh pages; the same unmodified Opacus run in a process whose environment holds `TUNED`
keeps those pages in the heap, and on a 1M-weight MLP it was 3.3x faster (issue 38). A ratio
against Opacus as shipped therefore mostly measures the allocator. Here every candidate
Opacus configuration (its grad sample modes ``hooks``, ``ew`` and ``functorch`` with the
tuned allocator, and ``hooks`` as shipped) is timed, the fastest whole step is the baseline,
and our engines are timed in both environments, so each is compared in the baseline's.

On CUDA, tensors come from PyTorch's caching allocator, which reuses Opacus's blocks across
steps whatever malloc does: the tuned environment is skipped there (`CUDA_SKIP`), and every
timed part is bracketed by ``torch.cuda.synchronize``.

A worker is this file run with ``--worker SPEC``; it answers on stdout, one JSON line per
request, and sends everything else it prints to stderr.
"""

from __future__ import annotations

import contextlib
import json
import os
import statistics
import subprocess
import sys
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import IO, Any

import torch
from torch import nn

import alm_opacus
from alm_opacus._validation import check_integer

__all__ = [
    "CUDA_SKIP",
    "MODELS",
    "MODES",
    "OURS",
    "PARTS",
    "TUNED",
    "Engine",
    "bench_step",
    "check_step_args",
    "child_env",
    "engines_for",
    "head",
    "mlp",
    "private",
    "summarize",
    "synthetic_batch",
]

PARTS = ("forward_backward", "clip", "noise", "rest")
OURS = ("alm", "laplace", "gaussian")
#: Opacus's grad sample modes that may be the fastest (``hooks`` is its default).
MODES = ("hooks", "ew", "functorch")
DEVICES = ("cpu", "cuda")
#: glibc's malloc kept from returning freed memory to the kernel: large blocks from the heap
#: (no ``mmap``), and the heap's top never trimmed (threshold 2^40 bytes).
TUNED = {"MALLOC_MMAP_MAX_": "0", "MALLOC_TRIM_THRESHOLD_": str(2**40)}
CUDA_SKIP = (
    "tuned malloc skipped on CUDA: tensors come from PyTorch's caching allocator, which "
    "reuses Opacus's per-sample gradient blocks from step to step whatever malloc does"
)
#: Warnings every engine raises on these synthetic batches (hooks, seeded noise, accountant).
_QUIET = ("Full backward hook is firing", "Secure RNG turned off", "Optimal order is the")


def mlp(width: int) -> nn.Module:
    """784 -> width -> 256 -> 10 (width 1024: 1,068,810 parameters), seeded."""
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Linear(784, width), nn.ReLU(), nn.Linear(width, 256), nn.ReLU(), nn.Linear(256, 10)
    )


def head() -> nn.Module:
    """The harness's mnist head: 576 SimCLR features -> 10 classes (5,770 weights), seeded."""
    torch.manual_seed(0)
    return nn.Linear(576, 10)


#: The models of `bench_step`: name -> (model factory given the MLP width, batch size).
MODELS: dict[str, tuple[Callable[[int], nn.Module], int]] = {
    "mlp": (mlp, 64),
    "head": (lambda _width: head(), 256),
}


@dataclass(frozen=True)
class Engine:
    """One timed process: whose engine, in which allocator environment, which grad sample
    mode (Opacus's; ours always runs its own hooks)."""

    kind: str  # "opacus" or one of OURS
    allocator: str  # "shipped" or "tuned"
    mode: str = "hooks"

    @property
    def name(self) -> str:
        engine = f"opacus-{self.mode}" if self.kind == "opacus" else self.kind
        return f"{engine}@{self.allocator}"


def engines_for(*, device: str, modes: Sequence[str] = MODES) -> list[Engine]:
    """The processes of one `bench_step`: Opacus as shipped (``hooks``, glibc's defaults), each
    Opacus mode in ``modes`` with the tuned allocator (on CUDA: as shipped), and ours in
    every allocator environment an Opacus candidate runs in."""
    allocator = "shipped" if device == "cuda" else "tuned"
    opacus = [Engine("opacus", "shipped")]
    opacus += [e for m in modes if (e := Engine("opacus", allocator, m)) not in opacus]
    environments = dict.fromkeys(e.allocator for e in opacus)
    return opacus + [Engine(kind, a) for a in environments for kind in OURS]


def child_env(allocator: str, *, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment a worker process starts with: ``base`` (default: this process's)
    without any malloc tuning (``MALLOC_*``, ``GLIBC_TUNABLES``), plus `TUNED` if
    ``allocator`` is ``"tuned"``; the ``alm_opacus`` imported here comes first on its path.

    glibc reads these variables once, when the process's first ``malloc`` initialises the
    allocator (before Python starts), so they must be in the environment the process is
    created with; setting ``os.environ`` inside it would be too late.

    Raises:
        ValueError: on an allocator other than ``shipped`` and ``tuned``.
    """
    if allocator not in ("shipped", "tuned"):
        raise ValueError(f"allocator={allocator!r} is invalid: expected 'shipped' or 'tuned'")
    env = {
        k: v
        for k, v in (os.environ if base is None else base).items()
        if not k.startswith("MALLOC_") and k != "GLIBC_TUNABLES"
    }
    if allocator == "tuned":
        env |= TUNED
    root = str(Path(alm_opacus.__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    return env


def check_step_args(
    *,
    model: str = "mlp",
    width: int = 1024,
    rounds: int = 7,
    block: int = 10,
    threads: int = 1,
    device: str = "cpu",
    modes: Sequence[str] = MODES,
) -> None:
    """Check `bench_step`'s arguments before any process starts.

    Raises:
        ValueError: naming the first invalid value and what was expected.
    """
    if model not in MODELS:
        raise ValueError(f"model={model!r} is invalid: expected one of {sorted(MODELS)}")
    for name, value in (("width", width), ("rounds", rounds), ("block", block)):
        check_integer(value, name=name)
    check_integer(threads, name="threads")
    if device not in DEVICES:
        raise ValueError(f"device={device!r} is invalid: expected one of {list(DEVICES)}")
    if device == "cuda" and not torch.cuda.is_available():
        raise ValueError(
            "device='cuda' is invalid here: torch.cuda.is_available() is False "
            f"(torch {torch.__version__}); expected a machine with a CUDA device"
        )
    unknown = [m for m in modes if m not in MODES]
    if not modes or unknown or len(set(modes)) != len(modes):
        raise ValueError(
            f"modes={list(modes)!r} is invalid: expected distinct Opacus grad sample modes "
            f"among {list(MODES)}, at least one"
        )


def synthetic_batch(size: int, features: int = 784) -> tuple[torch.Tensor, torch.Tensor]:
    """``size`` seeded standard normal rows and labels in 0..9."""
    g = torch.Generator().manual_seed(1)
    return torch.randn(size, features, generator=g), torch.randint(0, 10, (size,), generator=g)


def _features(model: nn.Module) -> int:
    first = next(m for m in model.modules() if isinstance(m, nn.Linear))
    return first.in_features


def private(
    kind: str, *, model: nn.Module, batch: int, mode: str = "hooks"
) -> tuple[nn.Module, Any]:
    """``model`` made private by Opacus's engine (``kind == "opacus"``, grad sample ``mode``)
    or by ours with noise ``kind``: the wrapped module and the DP optimizer."""
    from alm_opacus.training import PrivacyEngine, l1_clip

    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = synthetic_batch(batch, _features(model))  # the loader only gives the sample rate
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=batch)
    if kind == "opacus":
        import opacus

        engine: Any = opacus.PrivacyEngine()
        clip = 1.0
        extra: dict[str, Any] = {"grad_sample_mode": mode}
    else:
        engine = PrivacyEngine()
        clip = 1.0 if kind == "gaussian" else l1_clip(1.0, params=model)
        extra = {"noise_mechanism": kind}
    private_model, dp_optimizer, _ = engine.make_private(
        module=model,
        optimizer=optimizer,
        data_loader=loader,
        noise_multiplier=1.0,
        max_grad_norm=clip,
        **extra,
    )
    return private_model, dp_optimizer


def _timed_step(
    model: nn.Module,
    optimizer: Any,
    x: torch.Tensor,
    y: torch.Tensor,
    sync: Callable[[], None],
) -> list[float]:
    """One DPOptimizer step, as ``pre_step`` runs it, timed in `PARTS`; ``sync`` waits for
    the device before each clock reading (CUDA kernels run asynchronously)."""
    optimizer.zero_grad()
    sync()
    t0 = time.perf_counter()
    nn.functional.cross_entropy(model(x), y).backward()
    sync()
    t1 = time.perf_counter()
    optimizer.clip_and_accumulate()
    sync()
    t2 = time.perf_counter()
    optimizer.add_noise()
    sync()
    t3 = time.perf_counter()
    optimizer.scale_grad()
    if optimizer.step_hook:
        optimizer.step_hook(optimizer)
    optimizer.original_optimizer.step()
    sync()
    t4 = time.perf_counter()
    return [t1 - t0, t2 - t1, t3 - t2, t4 - t3]


def _worker_main(spec: dict[str, Any]) -> None:
    """One engine of `bench_step` in its own process: build it, say its size and the malloc
    environment it started with, then time the requested number of consecutive steps per
    line of stdin until stdin closes."""
    answer = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # anything a library prints goes to stderr; stdout carries answers only
    torch.set_num_threads(spec["threads"])
    for message in _QUIET:
        warnings.filterwarnings("ignore", message=message)
    device = torch.device(spec["device"])
    sync = torch.cuda.synchronize if device.type == "cuda" else lambda: None
    make, batch = MODELS[spec["model"]]
    network = make(spec["width"]).to(device)
    x, y = synthetic_batch(batch, _features(network))
    x, y = x.to(device), y.to(device)
    setup = private(spec["kind"], model=network, batch=batch, mode=spec["mode"])
    hello = {
        "parameters": sum(p.numel() for p in network.parameters()),
        "environment": {k: os.environ.get(k) for k in TUNED},
    }
    _send(answer, hello)
    for line in sys.stdin:
        _send(answer, [_timed_step(*setup, x, y, sync) for _ in range(int(line))])


def _send(stream: IO[str], message: Any) -> None:
    stream.write(json.dumps(message) + "\n")
    stream.flush()


class Worker:
    """A worker process of `bench_step`, started with the environment of its allocator."""

    def __init__(
        self, engine: Engine, *, model: str, width: int, threads: int, device: str
    ) -> None:
        self.engine = engine
        self.env = child_env(engine.allocator)
        spec = asdict(engine) | {
            "model": model,
            "width": width,
            "threads": threads,
            "device": device,
        }
        self.process = subprocess.Popen(
            [sys.executable, str(Path(__file__).resolve()), "--worker", json.dumps(spec)],
            env=self.env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )

    def receive(self) -> Any:
        """The worker's next answer.

        Raises:
            RuntimeError: if the worker exited (its traceback is on stderr).
        """
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        if not line:
            code = self.process.wait()
            raise RuntimeError(
                f"step worker {self.engine.name} exited with code {code} before answering "
                "(its error is printed above)"
            )
        return json.loads(line)

    def hello(self) -> int:
        """The model's size, after checking the worker started in the intended environment.

        Raises:
            RuntimeError: if its malloc variables differ from the ones it was given.
        """
        message = self.receive()
        expected = {k: self.env.get(k) for k in TUNED}
        if message["environment"] != expected:
            raise RuntimeError(
                f"step worker {self.engine.name} started with malloc environment "
                f"{message['environment']}, expected {expected}"
            )
        return int(message["parameters"])

    def steps(self, count: int) -> list[list[float]]:
        """``count`` consecutive timed steps, each as seconds per part of `PARTS`."""
        assert self.process.stdin is not None
        self.process.stdin.write(f"{count}\n")
        self.process.stdin.flush()
        return list(self.receive())

    def close(self) -> None:
        """End the worker: closing stdin ends its loop; killed if it does not exit."""
        if self.process.stdin is not None and not self.process.stdin.closed:
            with contextlib.suppress(BrokenPipeError):  # it had exited already
                self.process.stdin.close()
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def bench_step(
    *,
    model: str = "mlp",
    width: int = 1024,
    rounds: int = 7,
    block: int = 10,
    threads: int = 1,
    device: str = "cpu",
    modes: Sequence[str] = MODES,
) -> dict[str, Any]:
    """Per-step parts of ours (3 mechanisms) and of every Opacus candidate (`engines_for`) on
    one of `MODELS`, on ``device``.

    Each engine runs in its own process, as a user runs one, and the processes take turns,
    ``block`` consecutive steps each per round (drift in the machine's load falls on all
    alike; within a block the caches hold the engine's own data, as in a training loop).
    Each part is the median over all timed steps; the first round warms up. In one shared
    process the engines disturb each other through the allocator: glibc serves Opacus's
    fresh per-step tensors from the heap or from fresh pages depending on what the other
    engines freed before. Taking one step per turn instead would time every step with the
    caches of another process, which slows both engines and favoured ours.

    Returns:
        `summarize`'s report.

    Raises:
        ValueError: on an invalid argument (`check_step_args`), before any process starts.
        RuntimeError: if a worker fails.
    """
    check_step_args(
        model=model,
        width=width,
        rounds=rounds,
        block=block,
        threads=threads,
        device=device,
        modes=modes,
    )
    engines = engines_for(device=device, modes=modes)
    workers: list[Worker] = []
    samples: dict[str, list[list[float]]] = {e.name: [] for e in engines}
    try:
        for engine in engines:
            workers.append(Worker(engine, model=model, width=width, threads=threads, device=device))
        sizes = {w.engine.name: w.hello() for w in workers}
        for round_ in range(rounds + 1):
            for worker in workers:
                parts = worker.steps(block)
                if round_:  # the first round warms up
                    samples[worker.engine.name] += parts
    finally:
        for worker in workers:
            worker.close()
    meta = {
        "model": model,
        "parameters": sizes[engines[0].name],
        "batch": MODELS[model][1],
        "threads": threads,
        "rounds": rounds,
        "block": block,
        "device": device,
        "processes": "one per engine",
        "tuned_environment": TUNED if device == "cpu" else CUDA_SKIP,
    }
    return summarize(samples, engines=engines, meta=meta)


def summarize(
    samples: Mapping[str, Sequence[Sequence[float]]],
    *,
    engines: Sequence[Engine],
    meta: Mapping[str, Any],
) -> dict[str, Any]:
    """Medians per part, the baselines, and our ratios (a pure function of the timings).

    Args:
        samples: per engine name, its timed steps, each as seconds per part of `PARTS`.
        engines: the engines timed; at least Opacus as shipped and ours in every allocator
            environment an Opacus engine ran in.
        meta: what was run, copied into the report.

    Returns:
        ``meta`` and: ``engines`` (name -> kind, mode, allocator and ms per part and in
        total), ``shipped`` (Opacus as shipped) and ``best`` (the Opacus engine with the
        fastest whole step), ``ratios`` (per mechanism: total, without noise, the
        optimizer's part (clip, noise, rest) and clipping, each ours in the best's allocator
        environment over the best), ``ratios_shipped`` (the same, ours as shipped over
        Opacus as shipped) and ``noise_share`` (of each engine's step).
    """
    table: dict[str, dict[str, Any]] = {}
    for engine in engines:
        columns = zip(*samples[engine.name], strict=True)
        medians = [1e3 * statistics.median(column) for column in columns]
        parts = dict(zip(PARTS, medians, strict=True))
        table[engine.name] = asdict(engine) | parts | {"total": sum(medians)}
    shipped = Engine("opacus", "shipped").name
    candidates = [e.name for e in engines if e.kind == "opacus"]
    best = min(candidates, key=lambda name: table[name]["total"])

    def against(base: str) -> dict[str, dict[str, float]]:
        allocator = table[base]["allocator"]
        return {kind: _ratios(table[f"{kind}@{allocator}"], table[base]) for kind in OURS}

    return dict(meta) | {
        "engines": table,
        "shipped": shipped,
        "best": best,
        "ratios": against(best),
        "ratios_shipped": against(shipped),
        "noise_share": {name: row["noise"] / row["total"] for name, row in table.items()},
    }


def _ratios(ours: Mapping[str, float], base: Mapping[str, float]) -> dict[str, float]:
    return {
        "total": ours["total"] / base["total"],
        "without_noise": (ours["total"] - ours["noise"]) / (base["total"] - base["noise"]),
        "optimizer": _optimizer_ms(ours) / _optimizer_ms(base),
        "clip": ours["clip"] / base["clip"],
    }


def _optimizer_ms(parts: Mapping[str, float]) -> float:
    """The optimizer's share of a step: everything after the backward pass."""
    return parts["clip"] + parts["noise"] + parts["rest"]


if __name__ == "__main__" and sys.argv[1:2] == ["--worker"]:
    _worker_main(json.loads(sys.argv[2]))
