"""The SimCLR recipe as plain data (no torch import), shared by ``pretrain`` and dataset specs."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class SSLConfig:
    """The SimCLR recipe. Defaults suit 8x8 digits on a CPU.

    Attributes:
        encoder: name in the encoder registry (``alm_opacus.ssl.encoders``).
        augmentation: name in the augmentation registry (``alm_opacus.ssl.augment``).
        epochs: passes over the public data.
        batch_size: SimCLR batch (``2 * batch_size`` views per NT-Xent step).
        lr: AdamW learning rate (cosine-annealed over ``epochs``).
        weight_decay: AdamW weight decay.
        temperature: the NT-Xent temperature.
        projection_dim: output width of the projection head (discarded after pre-training).
    """

    encoder: str = "small-cnn"
    augmentation: str = "digits"
    epochs: int = 60
    batch_size: int = 256
    lr: float = 2e-3
    weight_decay: float = 1e-4
    temperature: float = 0.2
    projection_dim: int = 64

    def __post_init__(self) -> None:
        for name in ("encoder", "augmentation"):
            value = getattr(self, name)
            if not isinstance(value, str) or not value:
                raise ValueError(f"{name}={value!r} is invalid: expected a registry name")
        for name, low in (("epochs", 1), ("batch_size", 2), ("projection_dim", 1)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"{name}={value!r} is invalid: expected an integer >= {low}")
        for name in ("lr", "temperature"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise ValueError(f"{name}={value!r} is invalid: expected a finite number > 0")
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"{name}={value!r} is invalid: expected a finite number > 0")
        wd = self.weight_decay
        if isinstance(wd, bool) or not isinstance(wd, int | float) or not (0 <= wd < math.inf):
            raise ValueError(f"weight_decay={wd!r} is invalid: expected a finite number >= 0")

    def to_dict(self) -> dict[str, Any]:
        """The recipe as a JSON-able dict (what checkpoints and ``config.json`` store)."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SSLConfig:
        """Rebuild a recipe from :meth:`to_dict`'s output.

        Raises:
            ValueError: for unknown keys or invalid values.
        """
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"unknown SSLConfig keys {unknown}: expected some of {sorted(known)}")
        return cls(**data)
