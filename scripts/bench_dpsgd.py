"""Benchmark one DP-SGD step: our mechanisms against Opacus's Gaussian DP-SGD, as shipped and
in its fastest configuration on the machine, and 2 gloo ranks against one process
(``scripts/bench.py`` imports :func:`bench_dpsgd`).

* ``step`` (`bench_dpsgd_step`): per step, on one torch thread, ``alm_opacus.training``'s
  engine with ``alm``, ``laplace`` and ``gaussian`` noise against ``opacus.PrivacyEngine``
  (Gaussian, its default ``prv`` accountant) on the same model and batch, for two models: an
  MLP of 1,068,810 parameters (batch 64) and the harness's mnist head, a linear layer of
  5,770 weights (batch 256). A step is timed in its parts: forward and backward with the
  per-sample gradient hooks, clipping (``clip_and_accumulate``), noise (``add_noise``), and
  the rest (scaling, the accountant's step hook, the wrapped optimizer's step). Each engine
  runs in its own process; the processes take turns, a block of steps per round, and each
  part is the median over the timed steps. Opacus is timed as shipped and in each candidate
  configuration (grad sample modes ``hooks``, ``ew``, ``functorch``, with glibc's malloc
  tuned so that freed per-sample gradients stay in the heap); the fastest whole step is the
  baseline, and ours is timed in that baseline's allocator environment (issue 38: a whole
  step within 1.0x of it, the optimizer's part (clip, noise, rest) within 1.2x). On CUDA
  (``--device cuda``) the allocator variant is skipped: PyTorch's caching allocator reuses
  the blocks already.
* ``distributed``: DP-SGD (``alm``) with 2 gloo ranks on this machine against one process on
  the same global batch, on the CPU: samples per second, and the share of a step each rank
  spends in ``all_reduce`` (on rank 1 that includes waiting for rank 0, which alone draws
  the noise). Each rank runs one torch thread; the one process runs on one thread, then on
  as many threads as there are ranks.

Standalone::

    .venv/bin/python scripts/bench_dpsgd.py [--rounds 7] [--block 10] [--width 1024] \\
        [--device cpu|cuda] [--modes hooks,ew,functorch] [--skip-distributed] \\
        [--out report.json] [--write docs/dpsgd_noise.md]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
import warnings
from collections.abc import Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.multiprocessing as mp
from bench_dpsgd_step import (
    MODELS,
    MODES,
    OURS,
    PARTS,
    TUNED,
    bench_step,
    check_step_args,
    mlp,
    private,
    synthetic_batch,
)
from torch import distributed as dist
from torch import nn

from alm_opacus.io import atomic_write_text
from alm_opacus.training import PrivacyEngine, l1_clip
from docblocks import relative, write_block

__all__ = [
    "DEPS",
    "bench_distributed",
    "bench_dpsgd",
    "bench_step",
    "format_rows",
    "markdown",
    "mlp",
]

#: What the numbers depend on besides this script.
DEPS = (
    "alm_opacus/mechanisms",
    "alm_opacus/training",
    "constraints.txt",
    "scripts/bench_dpsgd_step.py",
)
#: Warnings the distributed ranks raise on these synthetic batches.
_QUIET = ("Full backward hook is firing", "Secure RNG turned off", "Optimal order is the")


def _rank(
    rank: int, world: int, init_file: str, out: str, width: int, batch: int, steps: int
) -> None:
    """One rank of `bench_distributed`: ``steps`` timed steps on a fixed local batch."""
    import os
    import socket

    names = [name for _, name in socket.if_nameindex()]
    os.environ["GLOO_SOCKET_IFNAME"] = "lo" if "lo" in names else names[0]
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore", message="Full backward hook is firing")
    dist.init_process_group(
        "gloo",
        init_method=f"file://{init_file}",
        rank=rank,
        world_size=world,
        timeout=timedelta(seconds=300),
    )
    try:
        reduce_seconds = [0.0]
        all_reduce = dist.all_reduce

        def timed_all_reduce(*args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            result = all_reduce(*args, **kwargs)
            reduce_seconds[0] += time.perf_counter() - t0
            return result

        from opacus.distributed import DifferentiallyPrivateDistributedDataParallel as DPDDP

        model = mlp(width)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        x, y = synthetic_batch(batch * world)
        x, y = x[rank::world], y[rank::world]  # this rank's half of the global batch
        loader = torch.utils.data.DataLoader(
            torch.utils.data.TensorDataset(x, y), batch_size=len(y)
        )
        private, dp_optimizer, _ = PrivacyEngine().make_private(
            module=DPDDP(model),
            optimizer=optimizer,
            data_loader=loader,
            noise_multiplier=1.0,
            max_grad_norm=l1_clip(1.0, params=model),
            noise_mechanism="alm",
        )
        dist.all_reduce = timed_all_reduce
        _step(private, dp_optimizer, x, y)  # warm-up
        dist.barrier()
        reduce_seconds[0] = 0.0
        t0 = time.perf_counter()
        for _ in range(steps):
            _step(private, dp_optimizer, x, y)
        seconds = time.perf_counter() - t0
        dist.all_reduce = all_reduce
        torch.save({"seconds": seconds, "all_reduce": reduce_seconds[0]}, f"{out}/rank{rank}.pt")
    finally:
        dist.destroy_process_group()


def _step(model: nn.Module, optimizer: Any, x: torch.Tensor, y: torch.Tensor) -> None:
    optimizer.zero_grad()
    nn.functional.cross_entropy(model(x), y).backward()
    optimizer.step()


def _one_process(*, width: int, batch: int, steps: int, threads: int) -> float:
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        model, optimizer = private("alm", model=mlp(width), batch=batch)
        x, y = synthetic_batch(batch)
        _step(model, optimizer, x, y)
        t0 = time.perf_counter()
        for _ in range(steps):
            _step(model, optimizer, x, y)
        return time.perf_counter() - t0
    finally:
        torch.set_num_threads(old)


def bench_distributed(
    *, width: int = 1024, batch: int = 128, steps: int = 10, world: int = 2
) -> dict[str, Any]:
    """``alm`` DP-SGD on ``world`` gloo ranks against one process, same global batch.

    Returns:
        samples per second of each, their ratio, and each rank's all-reduce share.
    """
    with tempfile.TemporaryDirectory() as tmp:
        context = mp.spawn(
            _rank,
            args=(world, f"{tmp}/rendezvous", tmp, width, batch, steps),
            nprocs=world,
            join=False,
        )
        try:
            while not context.join(timeout=5):
                pass
        finally:
            for process in context.processes:
                if process.is_alive():
                    process.kill()
                process.join()
        ranks = [torch.load(Path(tmp) / f"rank{r}.pt") for r in range(world)]
    seconds = max(r["seconds"] for r in ranks)
    one_thread = _one_process(width=width, batch=batch, steps=steps, threads=1)
    all_threads = _one_process(width=width, batch=batch, steps=steps, threads=world)
    return {
        "world": world,
        "global_batch": batch,
        "steps": steps,
        "samples_per_second": batch * steps / seconds,
        "samples_per_second_one_process": batch * steps / one_thread,
        "samples_per_second_one_process_all_threads": batch * steps / all_threads,
        "speedup": one_thread / seconds,
        "all_reduce_share": [r["all_reduce"] / r["seconds"] for r in ranks],
    }


def bench_dpsgd(
    *,
    width: int = 1024,
    rounds: int = 7,
    block: int = 10,
    device: str = "cpu",
    modes: Sequence[str] = MODES,
    distributed: bool = True,
) -> dict[str, Any]:
    """Both benchmarks (``scripts/bench.py``); the step one on one torch thread, on
    ``device``; the distributed one (unless ``distributed`` is false) on the CPU.

    Raises:
        ValueError: on an invalid argument, before anything runs.
    """
    for name in MODELS:
        check_step_args(
            model=name, width=width, rounds=rounds, block=block, device=device, modes=modes
        )
    with warnings.catch_warnings():
        for message in _QUIET:
            warnings.filterwarnings("ignore", message=message)
        steps = [
            bench_step(
                model=name,
                width=width,
                rounds=rounds,
                block=block,
                threads=1,
                device=device,
                modes=modes,
            )
            for name in MODELS
        ]
        report: dict[str, Any] = {"steps": steps}
        if distributed:
            report["distributed"] = bench_distributed(width=width)
        return report


def _label(engine: dict[str, Any]) -> str:
    """An engine row's name: ``Opacus hooks``, ``alm``, ..."""
    return f"Opacus {engine['mode']}" if engine["kind"] == "opacus" else engine["kind"]


def format_rows(report: dict[str, Any]) -> list[tuple[str, str, str]]:
    """Rows of `scripts/bench.py`'s table: each ratio against the best Opacus first."""
    rows: list[tuple[str, str, str]] = []
    for step in report["steps"]:
        engines = step["engines"]
        best, shipped = engines[step["best"]], engines[step["shipped"]]
        rows.append(
            (
                f"DP-SGD step, {step['model']} ({step['parameters']:,} params, batch "
                f"{step['batch']}, {step['device']}): ours / best Opacus "
                f"({_label(best)}, {best['allocator']} malloc)",
                "",
                "",
            )
        )
        for kind in OURS:
            r, s = step["ratios"][kind], step["ratios_shipped"][kind]
            rows += [
                (
                    f"  {kind}: total (without noise)",
                    f"{r['total']:.2f}x ({r['without_noise']:.2f}x)",
                    "<= 1.0x",
                ),
                (
                    f"  {kind}: optimizer (clip, noise, rest); clipping alone",
                    f"{r['optimizer']:.2f}x; {r['clip']:.2f}x",
                    "<= 1.2x",
                ),
                (f"  {kind}: total against Opacus as shipped", f"{s['total']:.2f}x", ""),
            ]
        rows.append(
            (
                "  Opacus as shipped / best Opacus, step (ms)",
                f"{shipped['total']:.1f} / {best['total']:.1f}",
                "",
            )
        )
        for name, parts in engines.items():
            rows.append(
                (
                    f"  {_label(parts)}, {parts['allocator']} malloc: "
                    "backward / clip / noise / step (ms)",
                    f"{parts['forward_backward']:.1f} / {parts['clip']:.1f} / "
                    f"{parts['noise']:.1f} / {parts['total']:.1f}",
                    f"noise {step['noise_share'][name]:.0%}",
                )
            )
    if "distributed" not in report:
        return rows
    spread = report["distributed"]
    rows += [
        (
            f"DP-SGD alm, {spread['world']} gloo ranks vs 1 process, 1 thread each (samples/s)",
            f"{spread['samples_per_second']:.0f} / {spread['samples_per_second_one_process']:.0f}",
            f"{spread['speedup']:.2f}x",
        ),
        (
            f"  1 process on {spread['world']} threads (samples/s)",
            f"{spread['samples_per_second_one_process_all_threads']:.0f}",
            "",
        ),
        (
            "  all-reduce share of a step, per rank",
            " / ".join(f"{s:.0%}" for s in spread["all_reduce_share"]),
            "",
        ),
    ]
    return rows


def markdown(steps: list[dict[str, Any]]) -> str:
    """The ``dpsgd-step`` block of ``docs/dpsgd_noise.md``: per model, ours against the best
    Opacus (in total and in the optimizer's part alone) and against Opacus as shipped, then
    every engine's step with the allocator environment it ran in."""

    def triple(step: dict[str, Any], key: str, part: str) -> str:
        return " / ".join(f"{step[key][kind][part]:.2f}x" for kind in OURS)

    lines = [
        "| model | ours / best Opacus: alm | laplace | gaussian | optimizer part alone "
        "(alm / laplace / gaussian) | best Opacus, step ms | Opacus as shipped, step ms "
        "| ours / Opacus as shipped (alm / laplace / gaussian) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for step in steps:
        best, shipped = step["engines"][step["best"]], step["engines"][step["shipped"]]
        ratios = " | ".join(f"{step['ratios'][kind]['total']:.2f}x" for kind in OURS)
        lines.append(
            f"| {step['model']}, {step['parameters']:,} weights, batch {step['batch']} "
            f"| {ratios} | {triple(step, 'ratios', 'optimizer')} "
            f"| {best['total']:.1f} ({_label(best)}, {best['allocator']} malloc) "
            f"| {shipped['total']:.1f} | {triple(step, 'ratios_shipped', 'total')} |"
        )
    lines += [
        "",
        "| model | engine | malloc | step, ms (backward / clip / noise / rest) |",
        "|---|---|---|---|",
    ]
    for step in steps:
        for name, row in step["engines"].items():
            parts = " / ".join(f"{row[p]:.1f}" for p in PARTS)
            best = " (best Opacus)" if name == step["best"] else ""
            lines.append(
                f"| {step['model']} | {_label(row)}{best} | {row['allocator']} "
                f"| {row['total']:.1f} ({parts}) |"
            )
    first = steps[0]
    if first["device"] == "cuda":
        environment = str(first["tuned_environment"]).capitalize() + "."
    else:
        tuned = " ".join(f"{k}={v}" for k, v in TUNED.items())
        environment = (
            f"Tuned malloc: `{tuned}` in the engine process's environment from its start "
            "(freed per-sample gradients stay in the heap); shipped: glibc's defaults."
        )
    lines += [
        "",
        f"Ratios of medians over {first['rounds']} rounds of {first['block']} consecutive steps "
        f"per engine, each engine in its own process, {first['threads']} torch thread, on "
        f"{first['device']}. Best Opacus: the Opacus configuration with the fastest whole step; "
        "ours is compared with it in its malloc environment, and with Opacus as shipped "
        f"(grad sample mode `hooks`, glibc's defaults) as shipped. {environment} Ours: exact "
        "steps from the secure source, alm and laplace with L1 clipping at "
        "`l1_clip(1.0, params=model)`; Opacus: its Gaussian default.",
    ]
    return "\n".join(lines) + "\n"


def _modes(text: str) -> tuple[str, ...]:
    return tuple(m.strip() for m in text.split(",") if m.strip())


def main(argv: Sequence[str] | None = None) -> None:
    """Run the benchmarks, print their rows, and write the JSON and the block if asked.

    Invalid arguments end the process with exit code 2 and a one-line message, before any
    engine starts or anything is written.
    """
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--block", type=int, default=10, help="consecutive steps per turn")
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--device", default="cpu", help="cpu or cuda (the step benchmark)")
    parser.add_argument(
        "--modes",
        type=_modes,
        default=MODES,
        help=f"Opacus grad sample modes to try as the best baseline (default: {','.join(MODES)})",
    )
    parser.add_argument("--skip-distributed", action="store_true")
    parser.add_argument("--out", default=None, help="also write the report as JSON here")
    parser.add_argument(
        "--write",
        type=Path,
        default=None,
        help="replace the dpsgd-step block of docs/dpsgd_noise.md",
    )
    args = parser.parse_args(argv)
    try:
        for name in MODELS:
            check_step_args(
                model=name,
                width=args.width,
                rounds=args.rounds,
                block=args.block,
                device=args.device,
                modes=args.modes,
            )
    except ValueError as exc:
        parser.error(str(exc))
    if args.write is not None and args.device != "cpu":
        parser.error(
            f"--write with --device {args.device}: the docs hold the CPU step block only; "
            "expected --device cpu (use --out to keep this device's report)"
        )
    if args.write is not None and list(args.modes) != list(MODES):
        parser.error(
            f"--write with --modes {','.join(args.modes)}: the docs' best Opacus is chosen "
            f"among every mode; expected the default {','.join(MODES)}"
        )
    report = bench_dpsgd(
        width=args.width,
        rounds=args.rounds,
        block=args.block,
        device=args.device,
        modes=args.modes,
        distributed=not args.skip_distributed,
    )
    for row in format_rows(report):
        print(f"{row[0]:<78} {row[1]:>20}  {row[2]}")
    if args.out:
        atomic_write_text(args.out, json.dumps(report, indent=2) + "\n")
    if args.write is not None:
        shown = ["--rounds", str(args.rounds), "--block", str(args.block)]
        shown += ["--width", str(args.width), "--write", relative(args.write)]
        write_block(
            args.write,
            name="dpsgd-step",
            script=__file__,
            args=shown,
            deps=DEPS,
            body=markdown(report["steps"]),
        )
        print(f"written: {args.write}")


if __name__ == "__main__":
    main()
