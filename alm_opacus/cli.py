"""``alm-opacus`` / ``python scripts/compare.py``: the command-line entry.

Bad input exits with code 2 and a one-line message naming the flag and what was expected.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NoReturn

from alm_opacus.data import DataError, available_datasets
from alm_opacus.harness import DEFAULT_EPSILONS, RunConfig, check_out, load_plugins, run
from alm_opacus.heads import HeadConfig
from alm_opacus.methods import available_methods, default_methods
from alm_opacus.report.table import format_tradeoff_table


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


class _Parser(argparse.ArgumentParser):
    """Bad input: one line naming the flag and the expected form, then exit code 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="alm-opacus",
        description="Protect a fine-tuned head in several ways, attack every release with the "
        "same membership-inference attacks, and report privacy against utility.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    data = parser.add_argument_group("data")
    data.add_argument(
        "--dataset", default="digits", help=f"one of {', '.join(available_datasets())}"
    )
    data.add_argument(
        "--data-root", default=None, help="folder holding the dataset files (not needed for digits)"
    )
    data.add_argument("--split-seed", type=int, default=0, help="seeds the split and pre-training")

    privacy = parser.add_argument_group("protections")
    opt_in = sorted(set(available_methods()) - set(default_methods()))
    privacy.add_argument(
        "--methods",
        default="none",
        help=f"comma list of {', '.join(available_methods())}, or 'all' for every method"
        + (f" but the opt-in {', '.join(opt_in)} (e.g. all,{opt_in[0]})" if opt_in else ""),
    )
    privacy.add_argument(
        "--epsilons",
        type=_comma_list(
            "--epsilons", _positive_float, "a comma list of positive numbers, e.g. 0.1,1,10"
        ),
        default=",".join(f"{e:g}" for e in DEFAULT_EPSILONS),
        help="the privacy budgets of the grid",
    )
    privacy.add_argument(
        "--delta", type=_delta, default=None, help="default: min(1e-5, 1/(10 n)) for n members"
    )
    privacy.add_argument(
        "--noise-draws",
        type=_positive_int("--noise-draws"),
        default=5,
        help="independent noise draws per (method, epsilon, seed)",
    )
    privacy.add_argument(
        "--sensitivity",
        choices=("sampled", "analytic"),
        default="sampled",
        help="sensitivity source of the post-training mechanisms",
    )
    privacy.add_argument(
        "--m",
        type=_positive_int("--m"),
        default=200,
        help="neighbour pairs drawn by the sensitivity sampler",
    )
    privacy.add_argument(
        "--head", choices=("linear", "mlp"), default="linear", help="the fine-tuning head"
    )
    privacy.add_argument(
        "--l2", type=_non_negative_float, default=0.0,
        help="L2 coefficient of the shared head recipe (0: the overfit default); with "
        "--sensitivity analytic, the convex head's lambda (0 there means 0.1)",
    )  # fmt: skip
    privacy.add_argument(
        "--accountant", choices=("alm_pld", "prv", "rdp"), default="alm_pld",
        help="DP-SGD's accountant (alm_pld: this project's PLD accountant, registered in Opacus)",
    )  # fmt: skip
    privacy.add_argument(
        "--queries", type=_positive_int("--queries"), default=1,
        help="queries answered by per-query methods (lu); their total epsilon covers this many",
    )  # fmt: skip

    attack = parser.add_argument_group("attacks")
    attack.add_argument("--attacks", default="all", help="comma list of attack names, or 'all'")

    runopts = parser.add_argument_group("run")
    runopts.add_argument(
        "--seeds",
        type=_comma_list("--seeds", int, "a comma list of integers"),
        default="0",
        help="one cell per seed: head training, noise draws and attacks are seeded by it",
    )
    runopts.add_argument("--device", default="cpu", help="cpu or cuda")
    runopts.add_argument("--out", default="runs/latest", help="run folder")
    runopts.add_argument("--cache-dir", default=None, help="default: <out>/cache")
    runopts.add_argument("--resume", action="store_true", help="skip cells already in results.csv")
    runopts.add_argument(
        "--config", default=None, help="YAML file; every flag is a key, and the command line wins"
    )
    runopts.add_argument("--no-progress", action="store_true", help="hide progress bars")
    return parser


def _apply_config_file(parser: argparse.ArgumentParser, argv: Sequence[str]) -> None:
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--config")
    known, _ = pre.parse_known_args(argv)
    if not known.config:
        return
    import yaml

    path = Path(known.config)
    try:
        loaded = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        parser.error(f"--config={known.config!r}: cannot read a YAML mapping ({exc})")
    if not isinstance(loaded, dict):
        parser.error(f"--config={known.config!r}: expected a YAML mapping of flag names to values")
    dests = {a.dest: a for a in parser._actions}
    defaults = {}
    for key, value in loaded.items():
        dest = str(key).replace("-", "_")
        if dest not in dests or dest in ("help", "config"):
            parser.error(f"--config: unknown key {key!r}; expected one of the flag names")
        if isinstance(value, list):
            value = ",".join(str(v) for v in value)
        action = dests[dest]
        if (
            action.type is not None
            and isinstance(value, str | int | float)
            and not isinstance(value, bool)
        ):
            try:
                value = action.type(str(value))  # type: ignore[operator]
            except (argparse.ArgumentTypeError, ValueError) as exc:
                parser.error(f"--config key {key!r}: {exc}")
        defaults[dest] = value
    parser.set_defaults(**defaults)


def parse_config(argv: Sequence[str] | None = None) -> RunConfig:
    """Parse the command line into a :class:`RunConfig`; exits with code 2 on bad input."""
    load_plugins()
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    _apply_config_file(parser, argv)
    args = parser.parse_args(argv)
    if isinstance(args.epsilons, str):
        args.epsilons = _comma_list("--epsilons", _positive_float, "")(args.epsilons)
    if isinstance(args.seeds, str):
        args.seeds = _comma_list("--seeds", int, "")(args.seeds)
    methods = [m.strip() for m in str(args.methods).split(",") if m.strip()]
    if not methods:
        parser.error("--methods is empty: expected a comma list of method names, or 'all'")
    if "all" in methods:  # "all" expands in place; the opt-in methods join when named
        at = methods.index("all")
        rest = [m for m in methods if m != "all"]
        methods = list(dict.fromkeys([*rest[:at], *default_methods(), *rest[at:]]))
    unknown = [m for m in methods if m not in available_methods()]
    if unknown:
        parser.error(
            f"--methods: unknown method {unknown[0]!r}; registered: "
            f"{', '.join(available_methods())}"
        )
    if args.dataset not in available_datasets():
        parser.error(
            f"--dataset: unknown dataset {args.dataset!r}; registered: "
            f"{', '.join(available_datasets())}"
        )
    if args.data_root is not None and not Path(args.data_root).is_dir():
        parser.error(f"--data-root={args.data_root!r}: expected an existing folder")
    if args.device not in ("cpu", "cuda") and not str(args.device).startswith("cuda:"):
        parser.error(f"--device={args.device!r}: expected cpu or cuda")
    try:
        check_out(Path(args.out))
    except ValueError:
        parser.error(f"--out={args.out!r}: expected a folder that can be created and written")
    attacks = tuple(a.strip() for a in str(args.attacks).split(",") if a.strip())
    if not attacks:
        parser.error("--attacks is empty: expected a comma list of attack names, or 'all'")
    try:
        return RunConfig(
            dataset=args.dataset, data_root=args.data_root, methods=tuple(methods),
            epsilons=tuple(args.epsilons), delta=args.delta, seeds=tuple(args.seeds),
            split_seed=args.split_seed, device=args.device, out=args.out,
            cache_dir=args.cache_dir, noise_draws=args.noise_draws,
            options={"sensitivity": args.sensitivity, "m": args.m,
                     "accountant": args.accountant, "queries": args.queries,
                     **({"l2": args.l2} if args.l2 > 0 else {})},
            attacks=attacks,
            resume=args.resume, head=HeadConfig(kind=args.head, l2=args.l2),
            progress=not args.no_progress,
        )  # fmt: skip
    except ValueError as exc:
        parser.error(str(exc))
    raise AssertionError("unreachable")


def main(argv: Sequence[str] | None = None) -> int:
    """Run the comparison; return the process exit code."""
    config = parse_config(argv)
    try:
        result = run(config)
    except (ValueError, DataError) as exc:
        print(f"alm-opacus: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(
            f"\ninterrupted; finished cells are in {Path(config.out) / 'results.csv'}; "
            "re-run with --resume to continue",
            file=sys.stderr,
        )
        return 130
    print()
    print(format_tradeoff_table(result.rows))
    print()
    print(f"results: {result.out / 'results.csv'}  ({result.seconds:.1f} s)")
    print(f"TensorBoard: tensorboard --logdir {result.out / 'tb'}")
    plots = result.out / "plots"
    if plots.exists():
        print(f"plots: {plots}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
