"""The ``alm-opacus`` argument parser: its flags, their type converters, and ``--config``.

Imports nothing heavy (``--help`` must not load torch): what the help names comes from
:mod:`alm_opacus.run.catalogue`. The core flags are written here; the methods' own flags
are built from their ``Options`` (``cli_option`` fields), so this module names none. A bad
value exits with code 2 and a one-line message naming the flag and what was expected.
:mod:`alm_opacus.run.cli` turns the parsed flags into a run.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NoReturn

from alm_opacus.options import MethodFlag, OptionError
from alm_opacus.run.catalogue import (
    CLUSTER_EXTRA,
    DATASETS,
    DEFAULTS,
    EXECUTORS,
    METHODS,
    OPT_IN_METHODS,
    PRIVATE_DIR,
    REFERENCE_METHODS,
    help_method_flags,
)
from alm_opacus.run.ray_address import DEFAULT_CONNECT_TIMEOUT_S

#: Where runs go when ``--out`` is not given.
RUNS = "runs"


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


def build_parser(*, method_flags: Sequence[MethodFlag] | None = None) -> argparse.ArgumentParser:
    """The parser: the core flags, then one flag per key the methods' options declare.

    Args:
        method_flags: the methods' flags (``alm_opacus.methods.method_flags()``, which
            converts and checks their values); default: the snapshot ``--help`` prints
            (:func:`~alm_opacus.run.catalogue.help_method_flags`), which parses nothing.
    """
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
        "--head",
        choices=("linear", "mlp", "paper"),
        default=None,
        help="the fine-tuning head (default: the dataset's recipe, docs/recipes.md); paper: "
        "the ALM paper's recipe, a linear head trained by 20 epochs of Keras-style minibatch "
        "Adam from a fixed start (alm_opacus.paper_head)",
    )
    privacy.add_argument(
        "--l2",
        type=_non_negative_float,
        default=None,
        help="L2 coefficient of the head recipe (default: the dataset's recipe); for the "
        "post-training methods' analytic sensitivity, also the convex head's lambda",
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

    methods = parser.add_argument_group(
        "method options",
        "flags the methods' options declare; --opt sets any option, these included",
    )

    attack = parser.add_argument_group("attacks")
    attack.add_argument(
        "--attacks",
        default="all",
        help="comma list of attack names, or 'all' (the default set)",
    )
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
    # last, so that a method flag that takes a core flag's name is refused by name
    if method_flags is None:
        try:  # the snapshot, or the plugins it does not cover, loaded
            method_flags = help_method_flags()
        except OptionError as exc:
            parser.error(str(exc))
    _add_method_flags(parser, methods, method_flags)
    return parser


def _add_method_flags(
    parser: argparse.ArgumentParser,
    group: argparse._ArgumentGroup,
    flags: Sequence[MethodFlag],
) -> None:
    """One flag per key the methods' options declare (``cli_option``); its value goes to the
    run config's options under that key (:func:`method_options_of`)."""
    for flag in flags:
        if flag.flag in parser._option_string_actions:
            parser.error(
                f"{flag.flag}, declared by the options of {', '.join(flag.methods)}, is a core "
                "flag: expected another name (cli_option(flag=...))"
            )
        # the help snapshot has no readers: it parses nothing, so its flags take plain text
        group.add_argument(
            flag.flag,
            dest=flag.dest,
            type=_flag_parser(flag) if flag.readers else str,
            choices=flag.choices,
            default=None,
            metavar=flag.metavar,
            help=flag.help,
        )


def _flag_parser(flag: MethodFlag) -> Callable[[str], Any]:
    def parse(text: str) -> Any:
        try:
            return flag.parse(text)
        except OptionError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    return parse


def method_options_of(args: argparse.Namespace, flags: Sequence[MethodFlag]) -> dict[str, Any]:
    """``{key: value}`` of the methods' flags given (on the command line or in ``--config``)."""
    given = {flag.key: getattr(args, flag.dest, None) for flag in flags}
    return {key: value for key, value in given.items() if value is not None}


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


def _one_line(text: str) -> str:
    return " ".join(text.split())
