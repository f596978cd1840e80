"""``RunPlan``: a :class:`~alm_opacus.run.config.RunConfig` resolved once, at the boundary.

:func:`plan_run` loads the data, draws the split, turns every method name into a method object
with validated options and every attack name into its class, lists the cells, and runs every
check that can fail before the run writes anything. Everything below it (the driver, the
units, the writer, the report) receives these objects and facts, never names to look up
again: a plugin's method is resolved here like a built-in one.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from alm_opacus._validation import default_delta
from alm_opacus.attacks import AttackConfig
from alm_opacus.attacks.base import ATTACKER_POOL_MIN
from alm_opacus.attacks.registry import Attack, attack_class
from alm_opacus.data import Dataset, load_dataset
from alm_opacus.data.split import Split, make_split
from alm_opacus.method_base import Method
from alm_opacus.methods import create_method, method_options, reference_methods
from alm_opacus.report.html_settings import RunFacts
from alm_opacus.run.cells import Cell
from alm_opacus.run.config import RunConfig
from alm_opacus.run.limits import check_epsilons, check_newton_memory
from alm_opacus.run.rundir import check_can_create
from alm_opacus.run.settings import run_hparams, run_settings

__all__ = ["RunPlan", "plan_run"]


@dataclass(frozen=True, eq=False)
class RunPlan:
    """A run, resolved: objects and facts, no names left to look up.

    Attributes:
        config: the run as given (its values; nothing below reads its names again).
        dataset: the loaded data.
        split: the drawn (or the data's own) split.
        methods: every method of the grid with its validated options, in plan order: the
            baselines, the protections, then the reference releases.
        baselines: the unprotected baselines (every utility loss is measured against them).
        references: the reference releases (``Method.reference``), released at epsilon inf.
        attacks: the attack classes the run fits (empty: no attacks).
        attack_config: the attacks' configuration.
        delta: the run's delta (``config.delta``, else min(1e-5, 1/(10 n))).
        cells: the grid, baseline first in each seed, then protections, then references.
        settings: what ``config.json`` records besides the chosen configurations.
        hparams: the run-wide hyperparameters of TensorBoard's HParams view.
        facts: what the views need besides the rows (members, classes, attacks).
    """

    config: RunConfig
    dataset: Dataset
    split: Split
    methods: Mapping[str, Method[Any, Any]]
    baselines: tuple[str, ...]
    references: tuple[str, ...]
    attacks: tuple[type[Attack], ...]
    attack_config: AttackConfig
    delta: float
    cells: tuple[Cell, ...]
    settings: dict[str, Any] = field(repr=False)
    hparams: dict[str, object] = field(repr=False)
    facts: RunFacts

    @property
    def out(self) -> Path:
        return Path(self.config.out)

    def method(self, name: str) -> Method[Any, Any]:
        """The resolved method ``name`` of this plan.

        Raises:
            KeyError: for a method the plan does not hold (a programming error: cells come
                from the plan).
        """
        return self.methods[name]


def plan_run(config: RunConfig) -> RunPlan:
    """Resolve ``config`` into a :class:`RunPlan`, checking everything that can fail before
    the run writes anything (it writes nothing).

    Raises:
        ValueError: for an unusable device or cache folder, split sizes the data or the run
            cannot use (naming ``--split``), ``delta = 0`` for a method that needs
            ``delta > 0``, an epsilon below what an exact release can draw, or features too
            wide for the Newton basis (``run.limits``); DataError for missing data.
    """
    _check_device(config.device)
    check_can_create(config.cache_path, flag="--cache-dir")
    if config.spec.ssl is not None:
        check_can_create(config.encoder_cache_path, flag="ALM_OPACUS_ENCODER_CACHE")
    dataset = load_dataset(config.dataset, root=config.data_root)  # missing/corrupt files fail
    try:
        split = make_split(dataset, sizes=config.split_sizes, seed=config.split_seed)
    except ValueError as exc:
        raise ValueError(f"--split: {exc}") from exc
    named = {m: create_method(m, method_options(m, config.options)) for m in config.methods}
    baselines = tuple(m for m, o in named.items() if o.baseline) or ("none",)
    attacks = tuple(attack_class(a) for a in config.attack_names)
    references = tuple(m for m in reference_methods() if attacks or m in named)
    protections = [m for m in named if m not in (*baselines, *references)]
    methods = {
        m: named[m] if m in named else create_method(m, method_options(m, config.options))
        for m in (*baselines, *protections, *references)
    }
    _check_inputs(config, dataset, named)
    _check_delta(config, named)
    _check_split(config, split.sizes(), methods=named, attacks=bool(attacks))
    members = split.sizes()["members"]
    delta = config.delta if config.delta is not None else default_delta(members)
    check_epsilons(
        dataset=dataset,
        grid=config.grid,
        recipe=config.recipe,
        encoder=None if config.spec.ssl is None else config.ssl_config.encoder,
        delta=delta,
    )
    check_newton_memory(dataset=dataset, methods=named, recipe=config.recipe, device=config.device)
    attack_config = AttackConfig(**config.attack_options)
    settings = run_settings(config=config, methods=methods, num_classes=dataset.num_classes)
    return RunPlan(
        config=config,
        dataset=dataset,
        split=split,
        methods=methods,
        baselines=baselines,
        references=references,
        attacks=attacks,
        attack_config=attack_config,
        delta=delta,
        cells=_cells(config, methods=methods, baselines=baselines, references=references),
        settings=settings,
        hparams=run_hparams(config=config, protections=named),
        facts=RunFacts.from_settings(
            settings,
            num_classes=dataset.num_classes,
            num_reference=attack_config.num_reference,
        ),
    )


def _cells(
    config: RunConfig,
    *,
    methods: Mapping[str, Method[Any, Any]],
    baselines: tuple[str, ...],
    references: tuple[str, ...],
) -> tuple[Cell, ...]:
    """The grid, baseline first in each seed (every utility loss is measured against it),
    then the protections, then the reference releases."""
    others = [m for m in methods if m not in (*baselines, *references)]
    cells = []
    for seed in config.seeds:
        cells += [Cell(m, math.inf, seed, 1) for m in baselines]
        cells += [Cell(m, e, seed, config.noise_draws) for m in others for e in config.grid]
        cells += [Cell(m, math.inf, seed, 1) for m in references]
    return tuple(cells)


def _check_device(device: str) -> None:
    if device.startswith("cuda"):
        index = int(device.partition(":")[2] or 0)
        if not torch.cuda.is_available() or index >= torch.cuda.device_count():
            raise ValueError(
                f"--device={device!r}: CUDA is not available here (torch "
                f"{torch.__version__}, {torch.cuda.device_count()} devices); use --device cpu"
            )


def _check_inputs(
    config: RunConfig, dataset: Dataset, methods: Mapping[str, Method[Any, Any]]
) -> None:
    """A dataset of features (``features:PATH``) has no images for a method to train on."""
    if dataset.images is not None:
        return
    for name, method in methods.items():
        if method.inputs != "features":
            raise ValueError(
                f"method {name!r} trains on images, but dataset {config.dataset!r} holds "
                "features only: choose methods that work on features (e.g. alm, gaussian, "
                "dpsgd, dperm)"
            )


def _check_delta(config: RunConfig, methods: Mapping[str, Method[Any, Any]]) -> None:
    """``delta = 0`` cannot be met by a method whose guarantee is approximate DP."""
    if config.delta != 0:
        return
    needy = [name for name, method in methods.items() if method.needs_delta]
    if needy:
        raise ValueError(
            f"--delta=0 cannot be met by {', '.join(needy)}: their guarantees are "
            "approximate DP (delta > 0); pass --delta > 0, or leave them out"
        )


def _check_split(
    config: RunConfig,
    sizes: dict[str, int],
    *,
    methods: Mapping[str, Method[Any, Any]],
    attacks: bool,
) -> None:
    """Split sizes too small for what the run does fail here, not after pre-training."""
    needs = [("members", 2, "a head, the sensitivity sampler and the attacks")]
    if attacks:
        needs.append(
            (
                "nonmembers",
                2,
                "the attacks' split-half epsilon bound (halves of members and non-members)",
            )
        )
        needs.append(("attacker", ATTACKER_POOL_MIN, "the attacker's shadow heads"))
    uses: dict[str, list[str]] = {}
    for name, method in methods.items():
        if (use := method.public_split_use) is not None:
            uses.setdefault(use, []).append(name)
    for use, names in uses.items():
        needs.append(("public", 2, f"{', '.join(names)}'s {use}"))
    for part, low, why in needs:
        if sizes[part] < low:
            raise ValueError(
                f"--split: {part}={sizes[part]} is too small: {why} need at least {low}; "
                f"expected e.g. --split {part}={2 * low}"
            )
