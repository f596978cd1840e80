"""What ``alm-opacus --help`` names, without importing torch.

``--help`` has to print in well under two seconds, and importing torch alone takes longer on
a loaded machine, so the parser lists the built-in methods and datasets and the defaults it
quotes from here. ``tests/test_cli.py`` checks every entry against the registries and the
dataclasses it mirrors, so the help cannot drift from the code; names registered by plugins
are checked at parse time against the real registries.
"""

from __future__ import annotations

__all__ = [
    "CLUSTER_EXTRA",
    "DATASETS",
    "DEFAULTS",
    "EXECUTORS",
    "METHODS",
    "OPT_IN_METHODS",
    "PRIVATE_DIR",
    "REFERENCE_METHODS",
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
    "PostTrainingOptions.sensitivity": "sampled",
    "PostTrainingOptions.m": 200,
    "AttackConfig.num_reference": 64,
    "AttackConfig.shadow_model": "gbm",
    "DPSGD accountant": "alm_pld",
    "LuOptions.queries": 1,
}
#: Where a run's units may be computed (``alm_opacus.run.executors.available_executors()``).
EXECUTORS: tuple[str, ...] = ("in-process", "ray")
#: How to install Ray (``alm_opacus.run.executors.CLUSTER_EXTRA``).
CLUSTER_EXTRA = 'pip install -e ".[cluster]"'
#: The run folder's private part (``alm_opacus.run.rundir.PRIVATE_DIR``).
PRIVATE_DIR = "private"
