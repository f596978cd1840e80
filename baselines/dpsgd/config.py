"""DP-SGD recipes: the configuration, the schedule, Opacus's sampling arithmetic, the options."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Literal

from alm_opacus.methods import MethodOptions, cli_option
from alm_opacus.plugin import check_positive

__all__ = [
    "ACCOUNTANTS",
    "DEFAULT_ACCOUNTANT",
    "TUNING_GRID",
    "AccountantName",
    "DPSGDConfig",
    "DPSGDOptions",
    "DPSGDRecipeOptions",
    "check_accountant",
    "default_schedule",
    "sample_rate_for",
    "steps_per_epoch",
]

AccountantName = Literal["alm_pld", "prv", "rdp"]
#: Accountants selectable with the ``accountant`` option.
ACCOUNTANTS: tuple[AccountantName, ...] = ("alm_pld", "prv", "rdp")
# alm_pld (dp_accounting PLD, pessimistic) agrees with Opacus's prv within 1% and finds a
# noise multiplier ~10x faster, which keeps the default digits run inside its time budget.
DEFAULT_ACCOUNTANT: AccountantName = "alm_pld"

#: The configurations tuned at each epsilon (lr x clip), on public data only. Linear heads on
#: unit-norm features have per-example gradient norms <= 2, so clips of 0.5 and 1 bracket it.
TUNING_GRID: tuple[dict[str, float], ...] = (
    {"lr": 1.0, "max_grad_norm": 0.5},
    {"lr": 1.0, "max_grad_norm": 1.0},
    {"lr": 4.0, "max_grad_norm": 0.5},
    {"lr": 4.0, "max_grad_norm": 1.0},
)


def _check_count(value: object, name: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name}={value!r} is invalid: expected an integer >= 1")


def check_accountant(name: str) -> str:
    """``name`` if it is one of :data:`ACCOUNTANTS`.

    Raises:
        ValueError: naming the accountant and the choices otherwise.
    """
    if name not in ACCOUNTANTS:
        raise ValueError(f"accountant={name!r} is invalid: expected one of {ACCOUNTANTS}")
    return name


@dataclass(frozen=True)
class DPSGDConfig:
    """One DP-SGD recipe.

    Attributes:
        lr: SGD learning rate (no momentum).
        max_grad_norm: per-example clipping norm ``C``.
        epochs: passes over the data; steps = epochs / sample rate.
        batch_size: expected batch size; the sample rate is ``1 / ceil(n / batch_size)``,
            as Opacus derives it from the data loader's length.
    """

    lr: float = 4.0
    max_grad_norm: float = 1.0
    epochs: int = 30
    batch_size: int = 75

    def __post_init__(self) -> None:
        check_positive(self.lr, name="lr")
        check_positive(self.max_grad_norm, name="max_grad_norm")
        _check_count(self.epochs, "epochs")
        _check_count(self.batch_size, "batch_size")

    def to_dict(self) -> dict[str, Any]:
        """JSON-able (for ``Release.chosen_config``)."""
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class DPSGDRecipeOptions(MethodOptions):
    """The recipe options every DP-SGD method shares (``dpsgd-alm``, ``dpsgd-laplace``: all
    their options, since only the ``alm_pld`` accountant accounts for their noise).

    Attributes:
        tune: tune lr and clip on public data at each epsilon (false: the grid's last entry).
        lr: fixes the learning rate (with ``clip`` too, tuning is skipped).
        clip: fixes the clipping norm ``C``.
        epochs: overrides the dataset's schedule.
        batch_size: overrides the dataset's expected batch size.
    """

    tune: bool = True
    lr: float | None = None
    clip: float | None = None
    epochs: int | None = None
    batch_size: int | None = None

    def __post_init__(self) -> None:
        for name in ("lr", "clip"):
            if getattr(self, name) is not None:
                check_positive(getattr(self, name), name=name)
        for name in ("epochs", "batch_size"):
            if getattr(self, name) is not None:
                _check_count(getattr(self, name), name)

    def candidates(
        self, grid: tuple[dict[str, float], ...], *, schedule: tuple[int, int]
    ) -> list[DPSGDConfig]:
        """The configurations to try: ``grid`` with a fixed ``lr`` or ``clip`` substituted
        (duplicates dropped; both fixed leaves one), at the schedule ``(epochs, batch)``."""
        points = [
            (
                c["lr"] if self.lr is None else self.lr,
                c["max_grad_norm"] if self.clip is None else self.clip,
            )
            for c in grid
        ]
        epochs, batch = schedule
        return [
            DPSGDConfig(lr=lr, max_grad_norm=clip, epochs=epochs, batch_size=batch)
            for lr, clip in dict.fromkeys(points)
        ]


@dataclass(frozen=True)
class DPSGDOptions(DPSGDRecipeOptions):
    """Options of ``dpsgd`` and ``dpsgd-full`` (scoped keys ``dpsgd.lr``, ``dpsgd-full.lr``):
    the recipe's (:class:`DPSGDRecipeOptions`) and the accountant.

    Attributes:
        accountant: ``"alm_pld"`` (this project's PLD accountant), ``"prv"`` or ``"rdp"``.
    """

    accountant: AccountantName = cli_option(
        DEFAULT_ACCOUNTANT,
        help="DP-SGD's accountant: alm_pld is this project's PLD accountant, registered in Opacus",
    )

    def __post_init__(self) -> None:
        check_accountant(self.accountant)
        super().__post_init__()


def default_schedule(*, n: int, schedule: tuple[int, int] | None = None) -> tuple[int, int]:
    """(epochs, expected batch size): the dataset's schedule, else one by member count ``n``.

    Few, large batches keep the noise multiplier low at small n (digits: 30 epochs at an
    expected batch of 75, i.e. 60 steps at q = 1/2 for 150 members).
    """
    if schedule is not None:
        epochs, batch = schedule
        _check_count(epochs, "schedule epochs")
        _check_count(batch, "schedule batch size")
        return int(epochs), int(batch)
    return (30 if n < 1000 else 20), max(1, min(256, n // 2))


def sample_rate_for(*, n: int, batch_size: int) -> float:
    """Opacus's sample rate, ``1 / len(data_loader)`` for a loader without ``drop_last``
    (whose length is the integer ``ceil(n / batch_size)``)."""
    return 1.0 / -(-n // batch_size)


def steps_per_epoch(sample_rate: float) -> int:
    """Batches per epoch of Opacus's Poisson loader (``UniformWithReplacementSampler``)."""
    return int(1 / sample_rate)
