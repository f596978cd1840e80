#!/usr/bin/env python
"""Every stage against the number of members n: times, growth exponents, docs/scale.md.

Synthetic features: a Gaussian mixture of C = 10 classes in d = 512 dimensions (class means
N(0, 0.15^2 I), unit noise, rows scaled to unit norm; a head on 2,000 members tests at ~0.9),
written as a ``features:PATH`` file of 5n rows with a role column (n members, n non-members,
2n attacker's pool, n public), the harness's own split proportions. Each stage runs alone, in a
fresh process (its peak RSS is the process's), at n in ``--sizes``:

* ``head``: the default head (``features:`` recipe, Newton) on the members;
* ``analytic``: the convex head at the analytic lambda and its proven bound;
* ``sampled``: the population sensitivity sampler with ``--m`` pairs (default 500);
* ``release-alm``, ``release-laplace``, ``release-gaussian``: one post-training release of a
  trained head (noise on its weights, and the statement), and ``dperm``: its convex head and
  release;
* ``lira-references``: online LiRA's 64 reference heads; ``shadow-models``: the 64 shadow
  heads (offline LiRA's references too) and the shadow attack's classifier;
  ``metric-attacks``: the five metric attacks fitted on the shadow heads and scored, with
  their intervals over 5 noise draws, as a cell computes them;
* ``dpsgd-head``: one DP-SGD head at epsilon = 1 (the dataset's schedule, no tuning), and
  ``dpsgd-attacker``: the adaptive attacker's DP-SGD shadow and reference heads.

Each stage's growth exponent is the least-squares slope of log(seconds) on log(n). Results go
to a cache (``--cache``, a JSON file) as each unit finishes: a re-run skips what is there
(``--force`` redoes it), so an interrupted run resumes. ``--paper`` adds the issue-21 settings:
the sampler with m = 500 at n = 50,000 (d = 512) in one process, the default ``compare.py
--methods alm,gaussian,dpsgd`` grid on a 10,000-member features file and on a 50,000-member
one, each a fresh process from an empty cache (wall time and peak RSS; a grid interrupted,
e.g. with its session, continues with ``--resume`` on the next invocation, and its time is the
sum of its parts'), with issue 38's targets; and issue 38's check that its speed-ups changed no
result: the grid at 1,000 members with ``--reproducible-noise`` on this code and on the code
before them (``--equal-to``, a git revision checked out in a worktree), ``results.csv`` value
by value but for the timings. ``--write`` regenerates
the marked blocks of docs/scale.md and docs/scale.png from the cache.

    .venv/bin/python scripts/bench_scale.py --write                 # all stages, all sizes
    .venv/bin/python scripts/bench_scale.py --sizes 1000,5000 --stages head,sampled --m 50
    .venv/bin/python scripts/bench_scale.py --paper --write         # the three paper figures

Timings depend on the machine and its load; the table records the threads, the load average
and the date of every unit.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import math
import os
import platform
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO, Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "scale.md"
PLOT = ROOT / "docs" / "scale.png"
DEFAULT_CACHE = ROOT / "runs" / "bench_scale" / "results.json"
SIZES = (1_000, 5_000, 20_000, 50_000)
DIM, CLASSES, SEPARATION = 512, 10, 0.15
#: Growth exponents the issue allows (issue 21, item 3).
EXPONENT_TARGET = 1.1
#: The issue-21 target of ``--paper``'s sampler: seconds.
SAMPLER_TARGET_SECONDS = 600.0
#: The grids' targets, (seconds, GiB) by members: issue 38's (10,000 members in 10 minutes,
#: within issue 21's 4 GiB; 50,000 in an hour and 4 GiB).
GRID_TARGETS: dict[int, tuple[float, float]] = {10_000: (600.0, 4.0), 50_000: (3600.0, 4.0)}
GRID_METHODS = "alm,gaussian,dpsgd"
#: Issue 38's check that its speed-ups changed no result: the grid at this many members with
#: ``--reproducible-noise``, on this code and on :data:`BEFORE`, the code before issue 38.
EQUAL_MEMBERS = 1_000
BEFORE = "180b05d"
#: Columns of results.csv that time the run rather than describe its results.
TIMING_COLUMNS = ("seconds",)


# --- data --------------------------------------------------------------------------------------


def gaussian_mixture(rows: int, *, seed: int, dim: int = DIM) -> tuple[np.ndarray, np.ndarray]:
    """``rows`` unit-norm features of a C-class Gaussian mixture and their labels, float32."""
    rng = np.random.default_rng(np.random.SeedSequence([seed, dim, 21]))
    means = rng.standard_normal((CLASSES, dim)) * SEPARATION
    labels = rng.integers(0, CLASSES, size=rows)
    x = np.empty((rows, dim), dtype=np.float32)
    for start in range(0, rows, 65_536):  # in blocks: bounded float64 temporaries
        y = labels[start : start + 65_536]
        block = means[y] + rng.standard_normal((len(y), dim))
        x[start : start + len(y)] = block / np.linalg.norm(block, axis=1, keepdims=True)
    return x, labels


def features_path(folder: Path, members: int, *, dim: int = DIM) -> Path:
    return folder / f"mixture-n{members}-d{dim}.npz"


def features_file(folder: Path, members: int, *, dim: int = DIM) -> Path:
    """The mixture as a ``features:PATH`` file with roles: n members, n non-members, 2n
    attacker's pool, n public (written once, atomically)."""
    path = features_path(folder, members, dim=dim)
    if path.exists():
        return path
    folder.mkdir(parents=True, exist_ok=True)
    x, y = gaussian_mixture(5 * members, seed=members, dim=dim)
    counts = {"member": members, "non-member": members, "attacker": 2 * members, "public": members}
    role = np.concatenate([np.full(k, name) for name, k in counts.items()])
    tmp = path.with_suffix(".tmp.npz")
    np.savez(tmp, x=x, y=y, role=role)
    os.replace(tmp, path)
    return path


def ensure_features(folder: Path, members: int) -> Path:
    """`features_file`, written by a child process: the driver's own peak RSS stays small
    (see `run_child`)."""
    path = features_path(folder, members)
    if not path.exists():
        command = [
            sys.executable,
            __file__,
            "--make-features",
            str(members),
            "--unit-file",
            str(folder),
        ]
        run, _ = _stage_child(command)
        if run.code != 0 or not path.exists():
            raise RuntimeError(f"writing {path} failed (exit {run.code})")
    return path


# --- stages (run inside a child process) ----------------------------------------------------------


class Unit:
    """What every stage of one size shares: the run's prepared data and method context."""

    def __init__(self, path: Path, *, m: int) -> None:
        import torch

        from alm_opacus.run.config import RunConfig
        from alm_opacus.run.harness import Session, load_plugins, plan_run, prepare

        load_plugins()
        self.torch = torch
        # dpsgd: one run at the dataset's schedule (its tuning is a run per configuration)
        self.config = RunConfig(
            dataset=f"features:{path}",
            methods=("none",),
            progress=False,
            out=str(path.parent / "unused"),
            options={"m": m, "dpsgd.tune": False},
        )
        plan = plan_run(self.config)
        self.data = prepare(plan)
        self.session = Session.open(plan, self.data)
        self.context = self.session.context
        self.members = self.data.part("members")
        self.m = m

    def trained_head(self) -> Any:
        from alm_opacus.heads import train_head

        x, y = self.members
        return train_head(x, y, num_classes=self.data.num_classes, config=self.context.head, seed=0)

    def release(self, name: str, *, epsilon: float = 1.0, seed: int = 0) -> Any:
        from alm_opacus.methods import ReleaseRequest, create_method, method_options

        method = create_method(name, method_options(name, self.config.options))
        x, y = self.members
        prepared = method.prepare(features=x, labels=y, seed=seed, context=self.context)
        request = ReleaseRequest(
            features=x,
            labels=y,
            epsilon=epsilon,
            delta=self.data.delta,
            seed=seed,
            draw=0,
            context=self.context,
        )
        return method.release(prepared, request)


#: A stage: ``setup(unit) -> state`` (untimed), then ``timed(unit, state) -> info`` (timed).
Setup = Callable[["Unit"], Any]
Timed = Callable[["Unit", Any], dict[str, Any]]


def _nothing(unit: Unit) -> None:
    return None


def _stage_head(unit: Unit, state: None) -> dict[str, Any]:
    head = unit.trained_head()
    return {"params": sum(p.numel() for p in head.parameters())}


def _stage_analytic(unit: Unit, state: None) -> dict[str, Any]:
    from alm_opacus.posttraining.method import ANALYTIC_CLIP, ANALYTIC_L2, convex_config
    from alm_opacus.sensitivity import analytic_sensitivity, train_convex_heads

    x, y = unit.members
    config = convex_config(unit.context.head, l2=ANALYTIC_L2, clip_radius=ANALYTIC_CLIP)
    ones = unit.torch.ones(1, len(y), dtype=unit.torch.bool)
    fit = train_convex_heads(x, y, masks=ones, num_classes=unit.data.num_classes, config=config)
    bound = analytic_sensitivity(
        n=len(y), l2=config.l2, clip_radius=ANALYTIC_CLIP, grad_tol=fit.tol
    )
    return {"value_l2": bound.value_l2, "newton_iterations": fit.iterations}


def _stage_sampled(unit: Unit, state: None) -> dict[str, Any]:
    from alm_opacus.sensitivity import sample_population_sensitivity

    px, py = unit.data.part("public")
    sample = sample_population_sensitivity(
        px,
        py,
        n=len(unit.members[1]),
        num_classes=unit.data.num_classes,
        config=unit.context.head,
        seed=0,
        m=unit.m,
        population="the public split",
        progress=True,
    )
    return {"m": unit.m, "value_l1": sample.value_l1, "value_l2": sample.value_l2}


#: Releases take milliseconds: each is repeated this many times and the mean is recorded.
RELEASE_REPEATS = 20


def _stage_release(mechanism: str) -> Timed:
    def stage(unit: Unit, head: Any) -> dict[str, Any]:
        from alm_opacus.protect import (
            PostTrainingPrivacyEngine,
            SensitivityInfo,
            SensitivitySource,
        )

        norm = "l2" if mechanism == "gaussian" else "l1"
        info = SensitivityInfo(value=1.0, norm=norm, source=SensitivitySource("caller"))
        for _ in range(RELEASE_REPEATS):
            PostTrainingPrivacyEngine(mechanism=mechanism).make_private(
                head,
                epsilon=1.0,
                delta=unit.data.delta if mechanism == "gaussian" else 0.0,
                sensitivity=info,
            )
        return {"repeats": RELEASE_REPEATS}

    return stage


def _stage_dperm(unit: Unit, state: None) -> dict[str, Any]:
    release = unit.release("dperm")
    return {"noise_scale": release.statement.noise_scale}


def _context(unit: Unit, trainer: Any = None) -> Any:
    """The attacker's side of a cell (the victim's plain recipe unless ``trainer`` is given)."""
    from alm_opacus.attacks import AttackerKnowledge, ShadowContext
    from alm_opacus.methods import plain_shadow_trainer

    ev = unit.session.evaluation
    knowledge = AttackerKnowledge(
        features=ev.pool[0],
        labels=ev.pool[1],
        trainer=trainer or plain_shadow_trainer(unit.context),
        num_classes=ev.num_classes,
        train_size=int(ev.is_member.sum()),
    )
    return ShadowContext(
        knowledge=knowledge, config=ev.config, seed=0, candidates=(ev.features, ev.labels)
    )


def _stage_lira_references(unit: Unit, state: None) -> dict[str, Any]:
    bank, _ = _context(unit).online_bank()
    return {"heads": bank.num_heads}


def _stage_shadow_models(unit: Unit, state: None) -> dict[str, Any]:
    from alm_opacus.attacks import attack_class

    context = _context(unit)
    bank = context.shadow_bank()
    attack = attack_class("shadow")(config=context.config, seed=0)
    attack.fit(context)
    return {"heads": bank.num_heads}


def _banked(unit: Unit) -> tuple[Any, Any]:
    """The attacker's context with its shadow heads trained, and a trained head to attack."""
    context = _context(unit)
    context.shadow_bank()
    return context, unit.trained_head()


def _stage_metric_attacks(unit: Unit, state: tuple[Any, Any]) -> dict[str, Any]:
    """Given the shadow heads: fit, score 5 noise draws, aggregate with intervals (a cell's
    work per attack)."""
    from alm_opacus.attacks import AttackTarget, PreparedAttacks, aggregate_results, attack_class

    context, head = state
    ev = unit.session.evaluation
    names = ("loss", "confidence", "entropy", "modified-entropy", "correctness")
    attacks = []
    for name in names:  # prepare_attacks' loop, on the context whose bank is trained
        attack = attack_class(name)(config=ev.config, seed=0)
        attack.fit(context)
        attacks.append(attack)
    prepared = PreparedAttacks(
        attacks=tuple(attacks),
        config=ev.config,
        seed=0,
        num_classes=ev.num_classes,
        notes=(),
        prepare_seconds=0.0,
    )
    target = AttackTarget(
        predict=lambda q: head.predict_proba(q).float(),
        features=ev.features,
        labels=ev.labels,
        is_member=ev.is_member,
        num_classes=ev.num_classes,
        delta=unit.data.delta,
    )
    results = [r for _ in range(5) for r in prepared.attack(target, intervals=False)]
    aggregate_results(results, claimed_epsilon=None, seed=0)
    return {"attacks": len(names), "draws": 5}


def _stage_dpsgd_head(unit: Unit, state: None) -> dict[str, Any]:
    release = unit.release("dpsgd")
    assert release.training is not None
    return {"steps": release.training.steps, "sample_rate": release.training.sample_rate}


def _dpsgd_release(unit: Unit) -> Any:
    release = unit.release("dpsgd")
    assert release.attacker is not None
    return _context(unit, trainer=release.attacker())


def _stage_dpsgd_attacker(unit: Unit, context: Any) -> dict[str, Any]:
    """Given a DP-SGD release: its adaptive attacker's DP-SGD shadow and reference heads."""
    shadow = context.shadow_bank()
    online, _ = context.online_bank()
    return {"heads": shadow.num_heads + online.num_heads}


STAGES: dict[str, tuple[Setup, Timed]] = {
    "head": (_nothing, _stage_head),
    "analytic": (_nothing, _stage_analytic),
    "sampled": (_nothing, _stage_sampled),
    "release-alm": (Unit.trained_head, _stage_release("alm")),
    "release-laplace": (Unit.trained_head, _stage_release("laplace")),
    "release-gaussian": (Unit.trained_head, _stage_release("gaussian")),
    "dperm": (_nothing, _stage_dperm),
    "lira-references": (_nothing, _stage_lira_references),
    "shadow-models": (_nothing, _stage_shadow_models),
    "metric-attacks": (_banked, _stage_metric_attacks),
    "dpsgd-head": (_nothing, _stage_dpsgd_head),
    "dpsgd-attacker": (_dpsgd_release, _stage_dpsgd_attacker),
}


def run_stage(stage: str, path: Path, *, m: int, threads: int) -> dict[str, Any]:
    """Run one stage in this process: its wall and CPU seconds, without loading the data and
    without the stage's untimed setup."""
    import torch

    torch.set_num_threads(threads)
    unit = Unit(path, m=m)
    setup, timed = STAGES[stage]
    state = setup(unit)
    wall, cpu = time.perf_counter(), time.process_time()
    info = timed(unit, state)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    repeats = info.get("repeats", 1)
    return {"seconds": wall / repeats, "cpu_seconds": cpu / repeats, **info}


# --- the driver: child processes, the cache, the docs --------------------------------------------


@dataclasses.dataclass(frozen=True)
class ChildRun:
    """A finished child process: its exit code, wall seconds and peak RSS (GiB)."""

    code: int
    seconds: float
    peak_rss_gib: float


def run_child(
    command: list[str],
    *,
    stdout: IO[str],
    stderr: IO[str] | None = None,
    poll: float | None = None,
    on_poll: Callable[[float, float], None] | None = None,
) -> ChildRun:
    """Run ``command`` to its end, calling ``on_poll(seconds, peak_rss_gib)`` every ``poll``
    seconds while it runs (its peak so far, from /proc).

    The peak at the end is wait4's ru_maxrss. On Linux that is the larger of the child's own
    peak and the driver's peak when it spawned the child (subprocess spawns with vfork, and
    exec keeps the old address space's high-water mark): the driver therefore never holds
    the data (`ensure_features` writes them in a child) and records its own peak beside
    every figure (`_driver_peak_gib`), so a figure above that is the child's.
    """
    import threading

    reaped: dict[str, Any] = {}
    done = threading.Event()
    start = time.perf_counter()
    child = subprocess.Popen(command, stdout=stdout, stderr=stderr, text=True, cwd=ROOT)

    def reap() -> None:
        _, reaped["status"], reaped["usage"] = os.wait4(child.pid, 0)
        done.set()

    threading.Thread(target=reap, daemon=True).start()
    peak = 0.0
    while not done.wait(poll):
        peak = max(peak, _peak_rss_gib(child.pid))
        if on_poll is not None:
            on_poll(time.perf_counter() - start, peak)
    seconds = time.perf_counter() - start
    child.returncode = os.waitstatus_to_exitcode(reaped["status"])  # reaped: no double wait
    return ChildRun(
        code=child.returncode,
        seconds=seconds,
        peak_rss_gib=max(peak, reaped["usage"].ru_maxrss / 2**20),
    )


def _driver_peak_gib() -> float:
    """This process's own peak RSS so far (see `run_child`)."""
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def _stage_child(command: list[str], *, log: Path | None = None) -> tuple[ChildRun, str]:
    """A child whose result is the last line of its stdout."""
    import tempfile

    with tempfile.TemporaryFile("w+") as out:
        if log is None:
            run = run_child(command, stdout=out)
        else:
            with log.open("w") as err:
                run = run_child(command, stdout=out, stderr=err)
        out.seek(0)
        return run, out.read()


def _stamp() -> dict[str, Any]:
    return {
        "when": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M"),
        "load": round(os.getloadavg()[0], 2),
        "cpus": os.cpu_count(),
        "machine": platform.processor() or platform.machine(),
    }


class Cache:
    """The measurements, a JSON file rewritten (atomically) after every unit."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.data: dict[str, Any] = json.loads(path.read_text()) if path.exists() else {}

    def __contains__(self, key: str) -> bool:
        return key in self.data

    def put(self, key: str, value: dict[str, Any]) -> None:
        from alm_opacus.io import atomic_write_json

        self.data[key] = value
        self.path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_json(self.path, self.data)


def stage_key(stage: str, n: int, *, m: int, threads: int) -> str:
    extra = f",m={m}" if stage == "sampled" else ""
    return f"stage={stage},n={n},d={DIM}{extra},threads={threads}"


def measure_stages(args: argparse.Namespace, cache: Cache) -> None:
    from tqdm.auto import tqdm

    def done(stage: str, n: int) -> bool:
        return stage_key(stage, n, m=args.m, threads=args.threads) in cache

    todo = [(s, n) for n in args.sizes for s in args.stages if args.force or not done(s, n)]
    folder = args.cache.parent / "data"
    for stage, n in tqdm(todo, desc="bench_scale stages", unit="unit"):
        path = ensure_features(folder, n)
        stamp = _stamp()
        run, out = _stage_child(
            [
                sys.executable,
                __file__,
                "--unit",
                stage,
                "--unit-file",
                str(path),
                "--m",
                str(args.m),
                "--threads",
                str(args.threads),
            ],
        )
        if run.code != 0:
            print(
                f"bench_scale: {stage} at n={n} failed (exit {run.code}); skipped", file=sys.stderr
            )
            continue
        result = json.loads(out.strip().splitlines()[-1])
        record = {
            **result,
            "stage": stage,
            "n": n,
            "peak_rss_gib": run.peak_rss_gib,
            "wall": run.seconds,
            "threads": args.threads,
            **stamp,
            "driver_peak_rss_gib": _driver_peak_gib(),
            "load_after": round(os.getloadavg()[0], 2),
        }
        cache.put(stage_key(stage, n, m=args.m, threads=args.threads), record)


def measure_paper(args: argparse.Namespace, cache: Cache) -> None:
    """The sampler at m = 500, n = 50,000; the default grid at 10,000 and 50,000 members."""
    from tqdm.auto import tqdm

    folder = args.cache.parent
    units = [
        ("paper-sampler", 50_000),
        *(("paper-grid", n) for n in args.grid_members),
        ("paper-equal", EQUAL_MEMBERS),
    ]

    def stale(kind: str, n: int) -> bool:  # the equality check also when against another rev
        record = cache.data.get(f"{kind},n={n}")
        return record is None or (kind == "paper-equal" and record.get("rev") != args.equal_to)

    todo = [(k, n) for k, n in units if args.force or stale(k, n)]
    measures = {"paper-sampler": _paper_sampler, "paper-grid": _paper_grid}
    for kind, n in tqdm(todo, desc="bench_scale paper", unit="run"):
        path = ensure_features(folder / "data", n)
        stamp = _stamp()
        record = measures.get(kind, _paper_equal)(path, n=n, folder=folder, args=args)
        if record is None:
            print(f"bench_scale: {kind} at n={n} failed; see its log", file=sys.stderr)
            continue
        cache.put(
            f"{kind},n={n}",
            {
                "kind": kind,
                "n": n,
                "threads": args.threads,
                **stamp,
                **record,
                "driver_peak_rss_gib": _driver_peak_gib(),
                "load_after": round(os.getloadavg()[0], 2),
            },
        )


def compare_tables(before: Path, after: Path) -> dict[str, Any]:
    """Two runs' ``results.csv`` value by value, as written (the table a reader sees), but for
    :data:`TIMING_COLUMNS`: the rows are matched by (method, epsilon, seed, attack).

    Returns:
        ``rows`` and ``values`` compared, ``equal`` values, ``columns``: for each column with a
        difference, ``[rows that differ, largest |difference|, largest |difference| in units
        of the row's spread over noise draws]`` (NaN where not numbers; the spread is the
        earlier table's ``<column>_std``, or ``<metric>_std`` for ``<metric>_ci_low/high``, NaN
        where there is none), and ``unmatched``: rows in one table only.
    """
    import csv

    def rows(path: Path) -> dict[tuple[str, ...], dict[str, str]]:
        with path.open(newline="") as f:
            return {
                (r["method"], r["epsilon"], r["seed"], r["attack"]): r for r in csv.DictReader(f)
            }

    old, new = rows(before), rows(after)
    keys = [k for k in old if k in new]
    columns = [c for c in next(iter(old.values()), {}) if c not in TIMING_COLUMNS]
    differ: dict[str, list[float]] = {}
    equal = 0
    for key in keys:
        for column in columns:
            a, b = old[key].get(column, ""), new[key].get(column, "")
            if a == b:
                equal += 1
                continue
            gap = abs(_float(a) - _float(b))
            count, largest, scaled = differ.get(column, [0, 0.0, math.nan])
            spread = _float(old[key].get(_spread_column(column), ""))
            ratio = gap / spread if spread > 0 else math.nan
            differ[column] = [
                count + 1,
                gap if math.isnan(gap) else max(largest, gap),
                ratio if math.isnan(scaled) else max(scaled, ratio),
            ]
    return {
        "rows": len(keys),
        "values": len(keys) * len(columns),
        "equal": equal,
        "columns": differ,
        "unmatched": len(old) + len(new) - 2 * len(keys),
    }


def _spread_column(column: str) -> str:
    """The column of a value's spread over noise draws (``compare_tables``)."""
    base = column.removesuffix("_ci_low").removesuffix("_ci_high")
    return f"{base}_std"


def _float(text: str) -> float:
    """A ``results.csv`` cell as a number; NaN where it is none (empty, a word)."""
    try:
        return float(text)
    except ValueError:
        return math.nan


def _grid_command(path: Path, out: Path, *, root: Path = ROOT) -> list[str]:
    return [
        sys.executable,
        str(root / "scripts" / "compare.py"),
        "--dataset",
        f"features:{path}",
        "--methods",
        GRID_METHODS,
        "--out",
        str(out),
        "--cache-dir",
        str(out / "cache"),
        "--no-progress",
    ]


def _paper_equal(
    path: Path, *, n: int, folder: Path, args: argparse.Namespace
) -> dict[str, Any] | None:
    """The grid with ``--reproducible-noise`` on this code and on ``args.equal_to`` (checked
    out in a worktree of this repository, run with its own code), and `compare_tables`."""
    rev = args.equal_to
    tree = folder / f"worktree-{rev}"
    git = ["git", "-C", str(ROOT), "worktree"]
    shutil.rmtree(tree, ignore_errors=True)  # an interrupted earlier check's
    subprocess.run([*git, "prune"], capture_output=True)
    made = subprocess.run([*git, "add", "--detach", str(tree), rev], capture_output=True, text=True)
    if made.returncode != 0:
        print(f"bench_scale: git worktree add {rev} failed: {made.stderr}", file=sys.stderr)
        return None
    outs = {}
    try:
        for name, root in (("before", tree), ("after", ROOT)):
            out = folder / f"equal-{n}-{name}"
            shutil.rmtree(out, ignore_errors=True)
            command = [*_grid_command(path, out, root=root), "--reproducible-noise"]
            env = {**os.environ, "PYTHONPATH": str(root)}
            with (folder / f"paper-equal-{n}-{name}.log").open("w") as log:
                run = subprocess.run(command, cwd=root, env=env, stdout=log, stderr=log)
            if run.returncode != 0:
                return None
            outs[name] = out / "results.csv"
    finally:  # the repository keeps no worktree of the check
        subprocess.run([*git, "remove", "--force", str(tree)], capture_output=True)
    return {"rev": rev, **compare_tables(outs["before"], outs["after"])}


def _paper_sampler(
    path: Path, *, n: int, folder: Path, args: argparse.Namespace
) -> dict[str, Any] | None:
    command = [
        sys.executable,
        __file__,
        "--unit",
        "sampled",
        "--unit-file",
        str(path),
        "--m",
        "500",
        "--threads",
        str(args.threads),
    ]
    run, text = _stage_child(command, log=folder / f"paper-sampler-{n}.log")
    if run.code != 0:
        return None
    return {
        **json.loads(text.strip().splitlines()[-1]),
        "wall": run.seconds,
        "peak_rss_gib": run.peak_rss_gib,
    }


def _paper_grid(
    path: Path, *, n: int, folder: Path, args: argparse.Namespace
) -> dict[str, Any] | None:
    """The grid as one more part of its run (`resumable_child`); its time is the sum of the
    parts', its start the first part's."""
    out = folder / f"grid-{n}"
    parts_file = out / "bench-parts.json"
    parts = [] if args.force or not parts_file.exists() else json.loads(parts_file.read_text())
    if not parts:
        shutil.rmtree(out, ignore_errors=True)  # a fresh run from an empty cache
    command = [*_grid_command(path, out), *(["--resume"] if parts else [])]
    code, parts = resumable_child(
        command, log=folder / f"paper-grid-{n}.log", parts_file=parts_file, parts=parts
    )
    if code != 0:
        return None
    return {
        "wall": sum(p["seconds"] for p in parts),
        "when": parts[0]["when"],
        "load": parts[0]["load"],
        "peak_rss_gib": max(p["peak_rss_gib"] for p in parts),
        "parts": len(parts),
        **grid_summary(out),
    }


def grid_summary(out: Path) -> dict[str, Any]:
    """Where a grid's time went, from its run folder: each method's cells (count, shortest,
    longest, total seconds; ``results.csv``'s ``seconds``, one value per cell) and the name
    and size of its ROC file (``rocs.jsonl``; ``rocs.json`` in runs of older versions)."""
    import csv

    cells: dict[tuple[str, str], float] = {}
    with (out / "results.csv").open(newline="") as f:
        for row in csv.DictReader(f):
            cells[row["method"], row["epsilon"]] = float(row["seconds"])
    methods: dict[str, list[float]] = {}
    for (method, _), seconds in cells.items():
        methods.setdefault(method, []).append(seconds)
    rocs = out / "rocs.jsonl" if (out / "rocs.jsonl").exists() else out / "rocs.json"
    return {
        "cells": {m: [len(v), min(v), max(v), sum(v)] for m, v in methods.items()},
        "rocs_file": rocs.name,
        "rocs_bytes": rocs.stat().st_size,
    }


def _peak_rss_gib(pid: int) -> float:
    """A running process's peak RSS so far (Linux's VmHWM; 0 where there is no /proc)."""
    try:
        lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    except OSError:
        return 0.0
    kib = [int(line.split()[1]) for line in lines if line.startswith("VmHWM:")]
    return kib[0] / 2**20 if kib else 0.0


def resumable_child(
    command: list[str],
    *,
    log: Path,
    parts_file: Path,
    parts: list[dict[str, Any]],
    poll: float = 30.0,
) -> tuple[int, list[dict[str, Any]]]:
    """Run ``command`` as one more part of a run that may have been interrupted before.

    Its wall seconds and peak RSS so far go to ``parts_file`` every ``poll`` seconds, so a
    run killed with its session (the 50,000-member grid takes hours) keeps what it measured,
    and the next part (``--resume``) adds to it. Returns the exit code and the parts.
    """
    from alm_opacus.io import atomic_write_json

    part: dict[str, Any] = {**_stamp(), "seconds": 0.0, "peak_rss_gib": 0.0, "done": False}
    parts = [*parts, part]
    parts_file.parent.mkdir(parents=True, exist_ok=True)

    def record(seconds: float, peak: float) -> None:
        part.update(seconds=seconds, peak_rss_gib=peak)
        atomic_write_json(parts_file, parts)

    with log.open("a") as err:
        run = run_child(command, stdout=err, stderr=err, poll=poll, on_poll=record)
    part["done"] = run.code == 0
    record(run.seconds, run.peak_rss_gib)
    return run.code, parts


def _work(record: dict[str, Any]) -> float:
    """What an exponent is fitted to: CPU seconds (a single-threaded stage's work, which other
    processes' load barely moves), else wall seconds."""
    return float(record.get("cpu_seconds", record["seconds"]))


def exponent(points: list[tuple[int, float]]) -> float:
    """Least-squares slope of log(seconds) on log(n) (nan with fewer than two sizes)."""
    if len(points) < 2:
        return math.nan
    n, s = (np.log(np.array(v, dtype=float)) for v in zip(*points, strict=True))
    return float(np.polyfit(n, s, 1)[0])


def _label(record: dict[str, Any]) -> str:
    stage = record["stage"]
    return f"{stage} (m = {record['m']})" if stage == "sampled" else stage


def _by_stage(cache: Cache) -> dict[str, list[dict[str, Any]]]:
    """Measurements by stage (the sampler by its m too), in :data:`STAGES` order."""
    out: dict[str, list[dict[str, Any]]] = {}
    for key, value in cache.data.items():
        if key.startswith("stage=") and value["stage"] in STAGES:
            out.setdefault(_label(value), []).append(value)
    order = {stage: i for i, stage in enumerate(STAGES)}
    labels = sorted(out, key=lambda k: (order[out[k][0]["stage"]], k))
    return {k: sorted(out[k], key=lambda r: r["n"]) for k in labels}


def _fmt_seconds(seconds: float) -> str:
    if seconds < 1:
        return f"{seconds * 1e3:.1f} ms"
    if seconds < 120:
        return f"{seconds:.1f} s"
    return f"{seconds / 60:.1f} min"


def table(cache: Cache) -> str:
    stages = _by_stage(cache)
    sizes = sorted({r["n"] for rows in stages.values() for r in rows})
    head = "| stage | " + " | ".join(f"n = {n:,}" for n in sizes) + " | exponent (CPU) |"
    lines = [head, "|---|" + "---:|" * (len(sizes) + 1)]
    for stage, rows in stages.items():
        at = {r["n"]: r for r in rows}
        cells = [_fmt_seconds(at[n]["seconds"]) if n in at else "" for n in sizes]
        k = exponent([(r["n"], _work(r)) for r in rows])
        flag = "" if not k > EXPONENT_TARGET else " (above 1.1)"
        name = f"`{rows[0]['stage']}`" + stage[len(rows[0]["stage"]) :]
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {k:.2f}{flag} |")
    every = [r for rows in stages.values() for r in rows]
    loads = [r["load"] for r in every]
    threads = "/".join(map(str, sorted({r["threads"] for r in every})))
    days = ", ".join(sorted({r["when"][:10] for r in every}))
    lines += [
        "",
        f"Wall seconds; the exponent is fitted to each stage's CPU seconds (its work, "
        f"which other processes' load barely moves). Measured {days} on "
        f"{every[0]['cpus']} CPUs ({every[0]['machine']}), {threads} torch thread(s) per "
        f"stage, load average {min(loads):.1f} to {max(loads):.1f} at the start of the "
        "units.",
    ]
    return "\n".join(lines)


def paper_block(cache: Cache) -> str:
    lines = []
    sampler = cache.data.get("paper-sampler,n=50000")
    if sampler is not None:
        ok = "within" if sampler["seconds"] <= SAMPLER_TARGET_SECONDS else "above"
        lines.append(
            f"- Sampled sensitivity, m = 500 pairs, n = 50,000 members, d = 512, one process "
            f"({sampler['threads']} thread(s)): **{_fmt_seconds(sampler['seconds'])}** "
            f"({ok} the 10-minute target), peak RSS {sampler['peak_rss_gib']:.2f} GiB; "
            f"{sampler['when']} UTC, load average {sampler['load']:.1f}."
        )
    for key, value in sorted(cache.data.items(), key=lambda item: item[1].get("n", 0)):
        if not key.startswith("paper-grid"):
            continue
        n = value["n"]
        target = ""
        if n in GRID_TARGETS:
            seconds, gib = GRID_TARGETS[n]
            ok = value["wall"] <= seconds and value["peak_rss_gib"] <= gib
            target = (
                f" ({'within' if ok else 'outside'} the {seconds / 60:g}-minute, "
                f"{gib:g} GiB target)"
            )
        lines.append(
            f"- `compare.py --dataset features:PATH --methods {GRID_METHODS}` (the default "
            f"grid: 6 epsilons, 5 noise draws, every attack) on {n:,} members ({5 * n:,} rows): "
            f"**{_fmt_seconds(value['wall'])}**, peak RSS **{value['peak_rss_gib']:.2f} GiB**"
            f"{target}; {value['when']} UTC, load average {value['load']:.1f}{_parts(value)}."
            f"{_cells(value)}"
        )
    equal = cache.data.get(f"paper-equal,n={EQUAL_MEMBERS}")
    if equal is not None:
        lines.append(_equal_line(equal))
    return "\n".join(lines) if lines else "(not measured yet: `scripts/bench_scale.py --paper`)"


_BEFORE_NOTE = " (the code before issue 38's speed-ups)"


def _equal_line(record: dict[str, Any]) -> str:
    """The reproducible-noise grid against the code before issue 38 (`compare_tables`)."""
    head = (
        f"- The same grid with `--reproducible-noise` on {record['n']:,} members, against the "
        f"same run on `{record['rev']}`{_BEFORE_NOTE if record['rev'] == BEFORE else ''}, "
        "`results.csv` "
        f"value by value as written ({record['rows']} rows, timings left out): "
    )
    if record["equal"] == record["values"] and not record["unmatched"]:
        return head + f"**all {record['values']:,} values equal**."
    gaps = "; ".join(
        f"`{column}` in {count} rows" + _gap(column, *rest)
        for column, (count, *rest) in record["columns"].items()
    )
    unmatched = f"; {record['unmatched']} rows in one table only" if record["unmatched"] else ""
    return (
        head + f"**{record['equal']:,} of {record['values']:,} values equal**; {gaps}{unmatched}."
    )


def _gap(column: str, largest: float, scaled: float = math.nan) -> str:
    """A column's largest difference, and in units of its rows' spread over noise draws where
    they have one (a record cached before the spread was compared has none)."""
    if math.isnan(largest):
        return ""
    if math.isnan(scaled):
        return f" (largest difference {largest:.3g})"
    return (
        f" (largest difference {largest:.3g}, at most {scaled:.2g} times the row's "
        f"`{_spread_column(column)}`)"
    )


def _parts(record: dict[str, Any]) -> str:
    """How an interrupted run was timed: the sum of its parts' wall times."""
    k = record.get("parts", 1)
    if k <= 1:
        return ""
    return (
        f"; in {k} parts (interrupted, continued with `--resume`): the sum of their wall "
        "times, work redone after an interruption counted twice"
    )


def _cells(record: dict[str, Any]) -> str:
    """Where the grid's time went (`grid_summary`), where recorded."""
    if "cells" not in record:
        return ""
    each = [
        f"{k} {m}: "
        + (
            f"{_fmt_seconds(lo)}-{_fmt_seconds(hi)} each, {_fmt_seconds(total)} in all"
            if k > 1
            else _fmt_seconds(total)
        )
        for m, (k, lo, hi, total) in record["cells"].items()
    ]
    return (
        f" Cells ({'; '.join(each)}); the rest is preparing the run and writing it. "
        f"`{record.get('rocs_file', 'rocs.json')}`: {record['rocs_bytes'] / 1e6:.0f} MB."
    )


def plot(cache: Cache, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 5))
    tab20 = plt.get_cmap("tab20")  # 12 stages: tab10 would give two lines one colour
    for i, (stage, rows) in enumerate(_by_stage(cache).items()):
        k = exponent([(r["n"], _work(r)) for r in rows])
        ax.plot(
            [r["n"] for r in rows],
            [_work(r) for r in rows],
            marker="os^Dv"[i % 5],
            color=tab20((2 * i) % 20 + (2 * i) // 20),  # dark shades first, then the light ones
            label=f"{stage} ({k:.2f})",
        )
    all_n = sorted({r["n"] for rows in _by_stage(cache).values() for r in rows})
    if all_n:
        ref = np.array(all_n, dtype=float)
        ax.plot(ref, ref / ref[0], "k--", lw=0.8, label="slope 1 (linear)")
    ax.set(
        xscale="log",
        yscale="log",
        xlabel="members n",
        ylabel="CPU seconds",
        title="Each stage against n (growth exponent in the legend)",
    )
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    tmp = path.with_suffix(".tmp.png")
    fig.savefig(tmp, dpi=110)
    plt.close(fig)
    os.replace(tmp, path)


#: What the timings depend on besides this script: every stage's code.
DEPS = ("alm_opacus", "baselines", "constraints.txt")


def write_docs(cache: Cache, *, args: Sequence[str] = ("--write",)) -> None:
    """The generated blocks ``scale-table`` and ``scale-paper`` of docs/scale.md, and the
    plot; ``args`` are the options that decided the measurements (the block's command)."""
    from docblocks import write_block

    for name, body in (("scale-table", table(cache)), ("scale-paper", paper_block(cache))):
        write_block(DOC, name=name, script=__file__, args=args, deps=DEPS, body=body)
    plot(cache, PLOT)


def _ints(text: str) -> tuple[int, ...]:
    return tuple(int(v) for v in text.split(",") if v.strip())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", type=_ints, default=SIZES, help="members n, comma list")
    parser.add_argument(
        "--stages", default=",".join(STAGES), help=f"comma list of {', '.join(STAGES)}"
    )
    parser.add_argument("--m", type=int, default=500, help="sampler pairs of the sampled stage")
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch threads per stage (the harness runs cells on 1)",
    )
    parser.add_argument("--cache", type=Path, default=DEFAULT_CACHE, help="results JSON")
    parser.add_argument("--force", action="store_true", help="redo units already cached")
    parser.add_argument("--no-stages", action="store_true", help="measure no stage")
    parser.add_argument("--paper", action="store_true", help="the issue-21 paper settings")
    parser.add_argument(
        "--grid-members",
        type=_ints,
        default=(10_000, 50_000),
        help="members of the --paper grid runs",
    )
    parser.add_argument(
        "--equal-to",
        default=BEFORE,
        help="the revision whose --reproducible-noise grid --paper compares this code's with",
    )
    parser.add_argument("--write", action="store_true", help="write docs/scale.md and the plot")
    parser.add_argument("--unit", help=argparse.SUPPRESS)
    parser.add_argument("--unit-file", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--make-features", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.make_features:  # a child: the features file of that many members
        features_file(args.unit_file, args.make_features)
        return 0
    if args.unit:  # a child: one stage, its result as the last line of stdout
        print(json.dumps(run_stage(args.unit, args.unit_file, m=args.m, threads=args.threads)))
        return 0
    args.stages = [s.strip() for s in args.stages.split(",") if s.strip()]
    unknown = [s for s in args.stages if s not in STAGES]
    if unknown:
        parser.error(
            f"--stages: unknown stage {unknown[0]!r}; expected some of {', '.join(STAGES)}"
        )
    cache = Cache(args.cache)
    if not args.no_stages:
        measure_stages(args, cache)
    if args.paper:
        measure_paper(args, cache)
    if args.write:
        shown = [
            "--sizes",
            ",".join(map(str, args.sizes)),
            "--stages",
            ",".join(args.stages),
            "--m",
            str(args.m),
            "--threads",
            str(args.threads),
        ]
        if args.paper:
            shown += [
                "--paper",
                "--grid-members",
                ",".join(map(str, args.grid_members)),
                "--equal-to",
                args.equal_to,
            ]
        write_docs(cache, args=[*shown, "--write"])
    print(table(cache) if any(k.startswith("stage=") for k in cache.data) else "no stages yet")
    print(paper_block(cache))
    return 0


if __name__ == "__main__":
    sys.exit(main())
