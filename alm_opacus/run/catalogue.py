"""What ``alm-opacus --help`` names, without importing torch.

``--help`` has to print in well under two seconds, and importing torch alone takes longer on
a loaded machine, so the parser lists the built-in methods and datasets and the defaults it
quotes from here. ``tests/test_cli.py`` checks every entry against the registries and the
dataclasses it mirrors, so the help cannot drift from the code; names registered by plugins
are checked at parse time against the real registries.

The methods' own flags (``cli_option`` fields of their ``Options``) are not named here: the
parser builds them from the registered methods at parse time, and ``--help`` prints them
from :data:`METHOD_FLAGS_FILE`, a snapshot of what the installed method plugins declare
(``tests/test_cli_method_flags.py`` checks it; ``python -m alm_opacus.run.catalogue``
rewrites it). When other plugins are installed than those it covers, ``--help`` loads them.
"""

from __future__ import annotations

import importlib.metadata
import json
from pathlib import Path
from typing import Any

from alm_opacus.options import MethodFlag

__all__ = [
    "CLUSTER_EXTRA",
    "DATASETS",
    "DEFAULTS",
    "EXECUTORS",
    "METHODS",
    "METHOD_FLAGS_FILE",
    "METHOD_PLUGIN_GROUP",
    "OPT_IN_METHODS",
    "PRIVATE_DIR",
    "REFERENCE_METHODS",
    "help_method_flags",
    "method_flags_snapshot",
]

#: The methods this package and ``baselines`` register (``available_methods()``), sorted.
METHODS: tuple[str, ...] = (
    "alm",
    "dperm",
    "dpsgd",
    "dpsgd-alm",
    "dpsgd-full",
    "dpsgd-laplace",
    "gaussian",
    "gaussian-classic",
    "laplace",
    "lu",
    "no-leak",
    "none",
)
#: The reference releases every run that attacks adds (``Method.reference``).
REFERENCE_METHODS: tuple[str, ...] = ("no-leak",)
#: The methods ``all`` leaves out (``Method.in_all`` false), references aside.
OPT_IN_METHODS: tuple[str, ...] = ("dpsgd-full",)
#: The datasets this package registers (``available_datasets()``).
DATASETS: tuple[str, ...] = ("digits", "mnist", "cifar10", "cifar100", "stl10")
#: The defaults ``--help`` quotes, by where they live in the code.
DEFAULTS: dict[str, object] = {
    "RunConfig.noise_draws": 5,
    "RunConfig.seeds": (0,),
    "RunConfig.split_seed": 0,
    "RunConfig.device": "cpu",
    "AttackConfig.num_reference": 64,
    "AttackConfig.shadow_model": "gbm",
}
#: Where a run's units may be computed (``alm_opacus.run.executors.available_executors()``).
EXECUTORS: tuple[str, ...] = ("in-process", "ray")
#: How to install Ray (``alm_opacus.run.executors.CLUSTER_EXTRA``).
CLUSTER_EXTRA = 'pip install -e ".[cluster]"'
#: The run folder's private part (``alm_opacus.run.rundir.PRIVATE_DIR``).
PRIVATE_DIR = "private"
#: The entry point group of method plugins (``alm_opacus.methods.PLUGIN_GROUP``).
METHOD_PLUGIN_GROUP = "alm_opacus.methods"
#: The flags the methods' options declare, as ``--help`` prints them.
METHOD_FLAGS_FILE = Path(__file__).with_name("method_flags.json")


def _installed_plugins() -> list[str]:
    # a set: a distribution found twice on the path lists its entry points twice
    return sorted({ep.name for ep in importlib.metadata.entry_points(group=METHOD_PLUGIN_GROUP)})


def help_method_flags() -> tuple[MethodFlag, ...]:
    """The methods' flags for ``--help``: from :data:`METHOD_FLAGS_FILE` (no torch) when it
    covers the installed method plugins, else from the registered methods (which loads them).

    Raises:
        OptionError: for two methods that declare one flag in ways that disagree.
    """
    snapshot = json.loads(METHOD_FLAGS_FILE.read_text(encoding="utf-8"))
    if snapshot["plugins"] == _installed_plugins():
        return tuple(MethodFlag.from_dict(flag) for flag in snapshot["flags"])
    from alm_opacus.methods import load_plugins, method_flags

    load_plugins()
    return method_flags()


def method_flags_snapshot() -> dict[str, Any]:
    """What :data:`METHOD_FLAGS_FILE` should hold: the installed plugins and the flags of
    every registered method (loads the plugins, and torch)."""
    from alm_opacus.methods import load_plugins, method_flags

    load_plugins()
    return {
        "plugins": _installed_plugins(),
        "flags": [flag.to_dict() for flag in method_flags()],
    }


if __name__ == "__main__":
    from alm_opacus.io import atomic_write_text

    text = json.dumps(method_flags_snapshot(), indent=2, ensure_ascii=False) + "\n"
    atomic_write_text(METHOD_FLAGS_FILE, text)
    print(f"wrote {METHOD_FLAGS_FILE}")
