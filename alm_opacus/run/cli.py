"""``alm-opacus`` / ``python scripts/compare.py``: the command-line entry.

Bad input exits with code 2 and a one-line message naming the flag and what was expected.
The flags are built in :mod:`alm_opacus.run.cli_parser`, the ``export`` subcommand lives in
:mod:`alm_opacus.run.cli_export`; this module turns a command line into a run and prints it.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import importlib.util
import os
import sys
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from alm_opacus.run.catalogue import CLUSTER_EXTRA
from alm_opacus.run.cli_export import export_main
from alm_opacus.run.cli_parser import (
    RUNS,
    _apply_config_file,
    _one_line,
    build_parser,
    method_options_of,
)
from alm_opacus.run.ray_address import check_connect_timeout, cluster_address

if TYPE_CHECKING:
    from alm_opacus.run.config import RunConfig

# Everything else is imported where it is used: ``--help`` must not load torch.


@dataclass(frozen=True)
class Command:
    """A parsed command line: the run, and where its units are computed (which never
    changes the results, so it is not part of the :class:`RunConfig`)."""

    config: RunConfig
    executor: str = "in-process"
    executor_options: dict[str, Any] = field(default_factory=dict)
    wide_table: bool = False


def _ray_options(parser: argparse.ArgumentParser, args: argparse.Namespace) -> dict[str, Any]:
    """The Ray executor's options; its cluster address checked for form and then for an
    answer within --ray-connect-timeout seconds (``ray.init`` would retry for minutes)."""
    given = {"--ray-address": args.ray_address, "--ray-connect-timeout": args.ray_connect_timeout}
    for flag, value in given.items():
        if value is not None and args.executor != "ray":
            parser.error(f"{flag}={value!r} needs --executor ray")
    if args.executor != "ray":
        return {}
    if importlib.util.find_spec("ray") is None:
        parser.error(f"--executor ray needs Ray, which is not installed: {CLUSTER_EXTRA}")
    options: dict[str, Any] = {}
    try:
        if args.ray_connect_timeout is not None:
            options["connect_timeout"] = check_connect_timeout(args.ray_connect_timeout)
        cluster_address(args.ray_address, flag="--ray-address", **options)
    except ValueError as exc:
        parser.error(str(exc))
    if args.ray_address is not None:
        options["address"] = args.ray_address
    return options


def parse_config(argv: Sequence[str] | None = None) -> RunConfig:
    """Parse the command line into a :class:`RunConfig`; exits with code 2 on bad input."""
    return parse_command(argv).config


def parse_command(argv: Sequence[str] | None = None) -> Command:
    """Parse the command line into a :class:`Command`; exits with code 2 on bad input."""
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    if {"-h", "--help"} & set(argv):
        parser.parse_args(["--help"])  # prints and exits before anything heavy is imported
    from alm_opacus.data import DataError, dataset_spec, parse_split_sizes
    from alm_opacus.methods import load_plugins, method_flags
    from alm_opacus.options import OptionError
    from alm_opacus.run.config import RunConfig
    from alm_opacus.run.rundir import check_can_create

    load_plugins()
    try:  # the flags of every registered method, plugins included, with their checks
        flags = method_flags()
    except OptionError as exc:
        parser.error(str(exc))
    parser = build_parser(method_flags=flags)
    _apply_config_file(parser, argv)
    args = parser.parse_args(argv)
    methods = _methods(parser, str(args.methods))
    try:
        spec = dataset_spec(args.dataset)
    except DataError as exc:
        parser.error(f"--dataset={args.dataset!r}: {_one_line(str(exc))}")
    if args.data_root is not None and not Path(args.data_root).is_dir():
        parser.error(f"--data-root={args.data_root!r}: expected an existing folder")
    if args.device not in ("cpu", "cuda") and not str(args.device).startswith("cuda:"):
        parser.error(f"--device={args.device!r}: expected cpu or cuda")
    executor_options = _ray_options(parser, args)
    if args.out is None:
        latest = Path(RUNS) / "latest"
        if args.resume and not latest.exists():
            parser.error(f"--resume without --out continues {latest}, which does not exist")
        args.out = str(latest.resolve()) if args.resume else _new_run_folder()
        args.cache_dir = args.cache_dir or str(Path(RUNS) / "cache")
    for flag, value in (("--out", args.out), ("--cache-dir", args.cache_dir)):
        if value is not None:
            try:
                check_can_create(Path(value), flag=flag)
            except ValueError as exc:
                parser.error(str(exc))
    attacks = tuple(a.strip() for a in str(args.attacks).split(",") if a.strip())
    if not attacks:
        parser.error("--attacks is empty: expected a comma list of attack names, or 'all'")
    options: dict[str, Any] = method_options_of(args, flags)
    if args.l2 is not None and args.l2 > 0:
        options["analytic_l2"] = args.l2
    try:
        split = None if args.split is None else parse_split_sizes(args.split, default=spec.split)
    except ValueError as exc:
        parser.error(str(exc))
    head = None
    if args.head == "paper":
        from alm_opacus.paper_head import PAPER_RECIPE

        head = PAPER_RECIPE if args.l2 is None else PAPER_RECIPE.replace(l2=args.l2)
    elif args.head is not None or args.l2 is not None:
        kind = args.head or spec.head.kind
        l2 = spec.head.l2 if args.l2 is None else args.l2
        # the dataset's solver where it still applies (Newton needs a convex objective)
        solver = spec.head.solver if kind == "linear" and l2 > 0 else "adam"
        head = spec.head.replace(kind=kind, l2=l2, solver=solver)
    options.update(dict(args.opt))
    try:
        config = RunConfig(
            dataset=args.dataset,
            data_root=args.data_root,
            methods=tuple(methods),
            epsilons=None if args.epsilons is None else tuple(args.epsilons),
            delta=args.delta,
            seeds=tuple(args.seeds),
            split_seed=args.split_seed,
            device=args.device,
            out=args.out,
            cache_dir=args.cache_dir,
            noise_draws=args.noise_draws,
            options=options,
            attacks=attacks,
            resume=args.resume,
            overwrite=args.overwrite,
            attack_options={
                k: v
                for k, v in (
                    ("shadow_model", args.shadow_model),
                    ("num_reference", args.num_reference),
                )
                if v is not None
            },
            reproducible_noise=args.reproducible_noise,
            head=head,
            split=split,
            progress=not args.no_progress,
        )
    except ValueError as exc:
        parser.error(str(exc).splitlines()[0])
    return Command(
        config=config,
        executor=args.executor,
        executor_options=executor_options,
        wide_table=bool(args.wide_table),
    )


def _methods(parser: argparse.ArgumentParser, text: str) -> list[str]:
    from alm_opacus.methods import available_methods, default_methods

    methods = [m.strip() for m in text.split(",") if m.strip()]
    if not methods:
        parser.error("--methods is empty: expected a comma list of method names, or 'all'")
    if "all" in methods:  # "all" expands in place; the opt-in methods join when named
        at = methods.index("all")
        rest = [m for m in methods if m != "all"]
        methods = [*rest[:at], *default_methods(), *rest[at:]]
    unknown = [m for m in methods if m not in available_methods()]
    if unknown:
        parser.error(
            f"--methods: unknown method {unknown[0]!r}; registered: "
            f"{', '.join(available_methods())}"
        )
    return list(dict.fromkeys(methods))


def main(argv: Sequence[str] | None = None) -> int:
    """Run the comparison (or ``export RUN DEST``); return the process exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["export"]:
        return export_main(argv[1:])
    command = parse_command(argv)
    from alm_opacus.io import StaleCacheWarning

    with warnings.catch_warnings():
        shown = warnings.showwarning

        def show(
            message: Warning | str, category: type[Warning], *args: Any, **kwargs: Any
        ) -> None:
            if issubclass(category, StaleCacheWarning):  # one line per recomputed cache file
                print(f"alm-opacus: warning: {message}", file=sys.stderr)
            else:
                shown(message, category, *args, **kwargs)

        warnings.showwarning = show
        return _run(command, wide=command.wide_table)


def _run(command: Command, *, wide: bool) -> int:
    config = command.config
    from alm_opacus.data import DataError
    from alm_opacus.report.table import MAX_WIDTH, format_tradeoff_table
    from alm_opacus.report.tensorboard import dashboard_urls
    from alm_opacus.report.verdict import decide, format_verdict
    from alm_opacus.run.executors import ExecutorError
    from alm_opacus.run.harness import plan_run, run

    try:
        result = run(
            plan_run(config),  # names resolved once, every check made before any write
            on_start=_link_latest,
            on_plan=_announce,
            executor=command.executor,
            executor_options=command.executor_options,
        )
    except (ValueError, DataError) as exc:
        print(f"alm-opacus: error: {_one_line(str(exc))}", file=sys.stderr)
        return 2
    except OSError as exc:  # a full disk, a vanished folder, a permission change
        where = f"{exc.filename}: " if exc.filename else ""
        print(f"alm-opacus: error: cannot write {where}{exc.strerror or exc}", file=sys.stderr)
        return 2
    except ExecutorError as exc:
        print(
            f"alm-opacus: error: {_one_line(str(exc))}; finished cells are in "
            f"{Path(config.out) / 'results.csv'}; re-run with --resume to continue",
            file=sys.stderr,
        )
        return 1
    except KeyboardInterrupt:
        results = Path(config.out) / "results.csv"
        print(
            f"\ninterrupted; finished cells are in {results}; re-run with --resume to continue"
            if results.exists()
            else "\ninterrupted before the first cell finished; the run folder is as it was "
            "(caches are kept): re-run the same command",
            file=sys.stderr,
        )
        return 130
    split = config.split_sizes
    print()
    print(
        format_tradeoff_table(
            result.rows,
            wide=wide,
            members=split.members,
            nonmembers=split.nonmembers or split.members,
            num_classes=result.num_classes,
        )
    )
    print()
    verdict = decide(result.rows, members=split.members, num_classes=result.num_classes)
    print(format_verdict(verdict, width=MAX_WIDTH))
    print()
    print(f"results: {result.out / 'results.csv'}  ({result.seconds:.1f} s)")
    print(f"TensorBoard: {tensorboard_command()} --logdir {result.out / 'tb'}, then open:")
    for view in ("time series", "custom scalars", "hparams"):
        print(f"  {view}: {dashboard_urls()[view]}")
    plots = result.out / "plots"
    if plots.exists():
        print(f"plots: {plots}  (how to read them: docs/reading_results.md)")
    report = result.out / "report.html"
    if report.exists():
        print(
            f"report: {report}  (offline, self-contained; with per-member risk: for the data "
            "owner only)"
        )
    return 0


def _announce(line: str) -> None:
    print(line, flush=True)


def tensorboard_command() -> str:
    """``tensorboard`` as printed for the user: the one installed beside this Python (a
    venv's ``bin/``, which a fresh shell has not activated), relative to the working folder
    where it is below it; else this Python running TensorBoard's entry module."""
    found = Path(sys.executable).with_name("tensorboard")
    if not found.exists():
        return f"{sys.executable} -m tensorboard.main"
    absolute = found.absolute()
    try:
        return str(absolute.relative_to(Path.cwd()))
    except ValueError:
        return str(absolute)


def _new_run_folder() -> str:
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%d-%H%M%S")
    path = Path(RUNS) / stamp
    suffix = 1
    while path.exists():
        path = Path(RUNS) / f"{stamp}-{suffix}"
        suffix += 1
    return str(path)


def _link_latest(out: Path) -> None:
    """Point ``runs/latest`` at ``out`` (atomically; only for folders under ``runs/``)."""
    runs = Path(RUNS)
    if out.resolve().parent != runs.resolve():
        return
    tmp = runs / f".latest-{os.getpid()}"
    with contextlib.suppress(FileNotFoundError):
        tmp.unlink()
    tmp.symlink_to(out.name)
    latest = runs / "latest"
    if latest.exists() and not latest.is_symlink():
        tmp.unlink()
        return  # a real folder named latest (an older layout): leave it alone
    os.replace(tmp, latest)


if __name__ == "__main__":
    sys.exit(main())
