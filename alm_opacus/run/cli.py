"""``alm-opacus`` / ``python scripts/compare.py``: the command-line entry.

Bad input exits with code 2 and a one-line message naming the flag and what was expected.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import importlib.util
import math
import os
import sys
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from alm_opacus.run.catalogue import (
    CLUSTER_EXTRA,
    DATASETS,
    DEFAULTS,
    EXECUTORS,
    METHODS,
    OPT_IN_METHODS,
    PRIVATE_DIR,
    REFERENCE_METHODS,
)
from alm_opacus.run.ray_address import (
    DEFAULT_CONNECT_TIMEOUT_S,
    check_connect_timeout,
    cluster_address,
)

if TYPE_CHECKING:
    from alm_opacus.run.config import RunConfig

# Everything else is imported where it is used: ``--help`` must not load torch.


def _comma_list(
    flag: str, item: Callable[[str], Any], what: str
) -> Callable[[str], tuple[Any, ...]]:
    def parse(text: str) -> tuple[Any, ...]:
        parts = [p.strip() for p in str(text).split(",") if p.strip()]
        if not parts:
            raise argparse.ArgumentTypeError(f"{flag} is empty: expected {what}")
        try:
            return tuple(item(p) for p in parts)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(f"{flag}={text!r}: expected {what}") from exc

    return parse


def _positive_float(text: str) -> float:
    value = float(text)
    if not (value > 0 and math.isfinite(value)):
        raise ValueError(text)
    return value


def _non_negative_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (value >= 0 and math.isfinite(value)):
        raise argparse.ArgumentTypeError(f"--l2={text!r}: expected a finite number >= 0")
    return value


def _delta(text: str) -> float:
    value = float(text)
    if not 0 <= value < 1:
        raise argparse.ArgumentTypeError(f"--delta={text!r}: expected a number in [0, 1)")
    return value


def _positive_int(flag: str) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = 0
        if value < 1:
            raise argparse.ArgumentTypeError(f"{flag}={text!r}: expected an integer >= 1")
        return value

    return parse


def _option(text: str) -> tuple[str, str]:
    key, sep, value = str(text).partition("=")
    if not sep or not key.strip() or key.strip() != key:
        raise argparse.ArgumentTypeError(
            f"--opt={text!r}: expected KEY=VALUE, e.g. dpsgd.lr=1 or m=100"
        )
    return key, value


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Appends ``(default: X)`` only where the help does not already say the default and X
    is a value (not ``None``: the help text then says what applies)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        default = action.default
        if "default" in text or default is None or default is False or default == []:
            return text
        return super()._get_help_string(action)


class _Parser(argparse.ArgumentParser):
    """Bad input: one line naming the flag and the expected form, then exit code 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="alm-opacus",
        description="Protect a fine-tuned head in several ways, attack every release with the "
        "same membership-inference attacks, and report privacy against utility. "
        "`alm-opacus export RUN DEST` copies what may be shared of a run folder.",
        formatter_class=_HelpFormatter,
    )
    data = parser.add_argument_group("data")
    data.add_argument(
        "--dataset",
        default="digits",
        help=f"one of {', '.join(DATASETS)} (or a plugin's), or features:PATH (your own "
        "encoder's features in an .npz: docs/own_features.md)",
    )
    data.add_argument(
        "--data-root", default=None, help="folder holding the dataset files (not needed for digits)"
    )
    data.add_argument(
        "--split-seed",
        type=int,
        default=DEFAULTS["RunConfig.split_seed"],
        help="seeds the split and pre-training",
    )
    data.add_argument(
        "--split",
        default=None,
        metavar="PART=N,...",
        help="split sizes, e.g. members=500,attacker=1000 (parts left out keep the dataset's "
        "default; parts: members, nonmembers, attacker, public)",
    )

    privacy = parser.add_argument_group("protections")
    opt_in = list(OPT_IN_METHODS)
    privacy.add_argument(
        "--methods",
        default="none",
        help=f"comma list of {', '.join(m for m in METHODS if m not in REFERENCE_METHODS)} "
        "(or a plugin's), or 'all' for every method"
        + (f" but the opt-in {', '.join(opt_in)} (e.g. all,{opt_in[0]})" if opt_in else "")
        + "; the unprotected baseline none always runs, and so does the no-leak reference (the "
        "same recipe on public rows only: what the attacks read when nothing leaks) whenever "
        "attacks run",
    )
    privacy.add_argument(
        "--epsilons",
        type=_comma_list(
            "--epsilons", _positive_float, "a comma list of positive numbers, e.g. 0.1,1,10"
        ),
        default=None,
        help="the privacy budgets of the grid (default: the dataset's grid)",
    )
    privacy.add_argument(
        "--delta", type=_delta, default=None, help="default: min(1e-5, 1/(10 n)) for n members"
    )
    privacy.add_argument(
        "--noise-draws",
        type=_positive_int("--noise-draws"),
        default=DEFAULTS["RunConfig.noise_draws"],
        help="independent noise draws per (method, epsilon, seed)",
    )
    privacy.add_argument(
        "--sensitivity",
        choices=("sampled", "sampled-members", "analytic"),
        default=None,
        help="sensitivity of the post-training mechanisms (default: "
        f"{DEFAULTS['PostTrainingOptions.sensitivity']}): sampled (neighbouring data "
        "sets drawn from the public split: random-DP), analytic (the convex head's proven "
        "bound: pure/approx DP), or sampled-members (the ALM paper's Algorithm 2 on the "
        "members: no guarantee, for reproducing the paper)",
    )
    privacy.add_argument(
        "--m",
        type=_positive_int("--m"),
        default=None,
        help="neighbour pairs drawn by the sensitivity sampler (default: "
        f"{DEFAULTS['PostTrainingOptions.m']})",
    )
    privacy.add_argument(
        "--head",
        choices=("linear", "mlp"),
        default=None,
        help="the fine-tuning head (default: the dataset's recipe, docs/recipes.md)",
    )
    privacy.add_argument(
        "--l2",
        type=_non_negative_float,
        default=None,
        help="L2 coefficient of the head recipe (default: the dataset's recipe); with "
        "--sensitivity analytic, also the convex head's lambda",
    )
    privacy.add_argument(
        "--accountant",
        choices=("alm_pld", "prv", "rdp"),
        default=None,
        help=f"DP-SGD's accountant (default: {DEFAULTS['DPSGD accountant']}, this project's PLD "
        "accountant, registered in Opacus)",
    )
    privacy.add_argument(
        "--queries",
        type=_positive_int("--queries"),
        default=None,
        help="queries answered by per-query methods (lu; default: "
        f"{DEFAULTS['LuOptions.queries']}); their total epsilon covers this many",
    )
    privacy.add_argument(
        "--opt",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        type=_option,
        help="a method option: METHOD.FIELD=VALUE for one method (e.g. dpsgd.lr=1, lu.noise="
        "gaussian), or FIELD=VALUE for every method that has that field; repeatable",
    )
    privacy.add_argument(
        "--reproducible-noise",
        action="store_true",
        help="seed release noise from public labels, for reproducible research only: such "
        "releases are private only while the seeds stay secret (default: the OS CSPRNG)",
    )

    attack = parser.add_argument_group("attacks")
    attack.add_argument("--attacks", default="all", help="comma list of attack names, or 'all'")
    attack.add_argument(
        "--shadow-model",
        choices=("gbm", "mlp", "auto"),
        default=None,
        help="the shadow attack's classifier (default: "
        f"{DEFAULTS['AttackConfig.shadow_model']}): gbm, gradient boosting (strongest on "
        "held-out shadow data, docs/threat_model.md), mlp, the ALM appendix's 5-layer MLP, or "
        "auto",
    )
    attack.add_argument(
        "--num-reference",
        type=_positive_int("--num-reference"),
        default=None,
        help=f"LiRA reference heads (default: {DEFAULTS['AttackConfig.num_reference']})",
    )

    runopts = parser.add_argument_group("run")
    runopts.add_argument(
        "--seeds",
        type=_comma_list("--seeds", int, "a comma list of integers"),
        default=",".join(map(str, DEFAULTS["RunConfig.seeds"])),  # type: ignore[call-overload]
        help="one cell per seed: head training, noise draws and attacks are seeded by it",
    )
    runopts.add_argument("--device", default=DEFAULTS["RunConfig.device"], help="cpu or cuda")
    runopts.add_argument(
        "--out",
        default=None,
        help=f"run folder (default: a new {RUNS}/<UTC time> folder, linked as {RUNS}/latest; "
        f"with --resume: {RUNS}/latest)",
    )
    runopts.add_argument(
        "--cache-dir",
        default=None,
        help=f"feature and head cache; it holds the clean heads, never share it "
        f"(default: {RUNS}/cache without --out, else $ALM_OPACUS_CACHE if set, else "
        f"<out>/{PRIVATE_DIR}/cache). The SimCLR encoder, trained on public data only, is "
        "cached per user ($ALM_OPACUS_ENCODER_CACHE, else ~/.cache/alm_opacus/encoders)",
    )
    runopts.add_argument(
        "--resume",
        action="store_true",
        help="continue the run in --out: skip its finished cells (its config must match)",
    )
    runopts.add_argument(
        "--overwrite",
        action="store_true",
        help="replace the run in --out (its results, curves, TensorBoard events and plots; "
        "caches are kept)",
    )
    runopts.add_argument(
        "--config", default=None, help="YAML file; every flag is a key, and the command line wins"
    )
    runopts.add_argument(
        "--executor",
        choices=EXECUTORS,
        default="in-process",
        help="where the run's units (cells, per-seed preparations, shadow and LiRA reference "
        "heads, sensitivity-sampler chunks) are computed: in this process, or as Ray tasks "
        f"(optional extra: {CLUSTER_EXTRA}); the table is the same",
    )
    runopts.add_argument(
        "--ray-address",
        default=None,
        metavar="HOST:PORT",
        help="the Ray cluster of --executor ray (default: $RAY_ADDRESS, else a local cluster "
        "on this machine, bound to 127.0.0.1)",
    )
    runopts.add_argument(
        "--ray-connect-timeout",
        type=float,
        default=None,
        metavar="SECONDS",
        help="seconds the cluster at --ray-address (or $RAY_ADDRESS) has to accept a "
        f"connection before the run gives up on it (default: {DEFAULT_CONNECT_TIMEOUT_S:g})",
    )
    runopts.add_argument("--no-progress", action="store_true", help="hide progress bars")
    runopts.add_argument(
        "--wide-table",
        action="store_true",
        help="print the side-by-side table (a column block per method) instead of one line per "
        "(method, epsilon) in at most 100 columns",
    )
    return parser


def _apply_config_file(parser: argparse.ArgumentParser, argv: Sequence[str]) -> None:
    """Use a YAML file's keys as defaults, each value through the same parser as its flag."""
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--config")
    known, _ = pre.parse_known_args(argv)
    if not known.config:
        return
    import yaml

    path = Path(known.config)
    try:
        loaded = yaml.safe_load(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError as exc:
        parser.error(
            f"--config={known.config!r}: not UTF-8 text (byte {exc.start}): expected a YAML file"
        )
    except (OSError, yaml.YAMLError) as exc:
        parser.error(
            f"--config={known.config!r}: cannot read a YAML mapping ({' '.join(str(exc).split())})"
        )
    if not isinstance(loaded, dict):
        parser.error(f"--config={known.config!r}: expected a YAML mapping of flag names to values")
    dests = {a.dest: a for a in parser._actions}
    defaults = {}
    for key, value in loaded.items():
        dest = str(key).replace("-", "_")
        if dest not in dests or dest in ("help", "config"):
            parser.error(f"--config: unknown key {key!r}; expected one of the flag names")
        try:
            defaults[dest] = _yaml_value(dests[dest], value)
        except (argparse.ArgumentTypeError, ValueError) as exc:
            parser.error(f"--config key {key!r}: {exc}")
    parser.set_defaults(**defaults)


def _yaml_value(action: argparse.Action, value: Any) -> Any:
    """A YAML value parsed exactly as the command line would parse its flag."""
    flag = action.option_strings[0] if action.option_strings else action.dest
    if isinstance(action, argparse._StoreTrueAction):
        if not isinstance(value, bool):
            raise ValueError(f"{flag}: expected true or false, got {value!r}")
        return value
    if isinstance(action, argparse._AppendAction):
        items = value.items() if isinstance(value, dict) else value
        if isinstance(value, dict):
            return [(str(k), str(v)) for k, v in items]
        if not isinstance(value, list):
            raise ValueError(f"{flag}: expected a list of KEY=VALUE or a mapping")
        return [_option(str(v)) for v in value]
    if isinstance(value, bool) or value is None or isinstance(value, dict):
        raise ValueError(f"{flag}: expected {action.metavar or 'a value'}, got {value!r}")
    text = ",".join(str(v) for v in value) if isinstance(value, list) else str(value)
    if action.choices is not None and text not in action.choices:
        raise ValueError(f"{flag}={text!r}: expected one of {', '.join(map(str, action.choices))}")
    return action.type(text) if action.type is not None else text  # type: ignore[operator]


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
    from alm_opacus.methods import load_plugins
    from alm_opacus.run.config import RunConfig
    from alm_opacus.run.rundir import check_can_create

    load_plugins()
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
    shared = {
        "sensitivity": args.sensitivity,
        "m": args.m,
        "accountant": args.accountant,
        "queries": args.queries,
        "analytic_l2": args.l2 if args.l2 is not None and args.l2 > 0 else None,
    }
    try:
        split = None if args.split is None else parse_split_sizes(args.split, default=spec.split)
    except ValueError as exc:
        parser.error(str(exc))
    head = None
    if args.head is not None or args.l2 is not None:
        kind = args.head or spec.head.kind
        l2 = spec.head.l2 if args.l2 is None else args.l2
        # the dataset's solver where it still applies (Newton needs a convex objective)
        solver = spec.head.solver if kind == "linear" and l2 > 0 else "adam"
        head = spec.head.replace(kind=kind, l2=l2, solver=solver)
    options: dict[str, Any] = {k: v for k, v in shared.items() if v is not None}
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


def export_main(argv: Sequence[str]) -> int:
    """``alm-opacus export RUN DEST``: copy what may be shared of a finished run folder, with
    a report page without the per-member section (:mod:`alm_opacus.run.export`)."""
    parser = _Parser(
        prog="alm-opacus export",
        description="Copy what may be shared of a finished run folder (results, ROC curves, "
        "figures, TensorBoard events, config.json without the split seed) into a new folder, "
        "with a report page without the per-member section; never "
        f"{PRIVATE_DIR}/ (member indices, clean weights), a cache, or the owner's report.html.",
    )
    parser.add_argument("run", help="the run folder")
    parser.add_argument("dest", help="a new folder for the shareable copy")
    args = parser.parse_args(list(argv))
    # not rundir: it imports the run's config, and with it torch
    from alm_opacus.run.export import default_seed_note, export_run

    try:
        done = export_run(Path(args.run), Path(args.dest))
    except ValueError as exc:
        print(f"alm-opacus export: error: {_one_line(str(exc))}", file=sys.stderr)
        return 2
    except OSError as exc:
        where = f"{exc.filename}: " if exc.filename else ""
        print(f"alm-opacus export: error: {where}{exc.strerror or exc}", file=sys.stderr)
        return 2
    strays = f", {len(done.left_out)} other files (README.txt names them)" if done.left_out else ""
    print(
        f"exported {len(done.copied)} files and the shareable report to "
        f"{Path(args.dest) / 'report.html'} (left out: {PRIVATE_DIR}/, caches, the split "
        f"seed, the per-member section{strays})"
    )
    if done.default_split_seed:
        print(f"alm-opacus export: note: {default_seed_note()}", file=sys.stderr)
    return 0


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
    from alm_opacus.run.harness import run

    try:
        result = run(
            config,
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


#: Where runs go when ``--out`` is not given.
RUNS = "runs"


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


def _one_line(text: str) -> str:
    return " ".join(text.split())


if __name__ == "__main__":
    sys.exit(main())
