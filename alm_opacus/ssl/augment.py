"""SimCLR view generators built from kornia, one per input resolution."""

from __future__ import annotations

from collections.abc import Callable

import kornia.augmentation as K
from torch import nn

_AUGMENTS: dict[str, Callable[[], nn.Module]] = {}


def _register(name: str) -> Callable[[Callable[[], nn.Module]], Callable[[], nn.Module]]:
    def decorator(factory: Callable[[], nn.Module]) -> Callable[[], nn.Module]:
        _AUGMENTS[name] = factory
        return factory

    return decorator


@_register("digits")
def digits_views() -> nn.Module:
    # No flips and mild rotation: a mirrored 2 or a rotated 6 is another digit.
    return nn.Sequential(
        K.RandomAffine(degrees=12.0, translate=(0.12, 0.12), scale=(0.85, 1.15), shear=8.0, p=1.0),
        K.RandomGaussianNoise(mean=0.0, std=0.08, p=0.5),
        K.RandomErasing(scale=(0.02, 0.12), ratio=(0.5, 2.0), p=0.3),
    )


def _natural(size: int) -> nn.Module:
    # SimCLR's recipe (Chen et al. 2020, Appendix A): crop, flip, colour jitter, greyscale.
    return nn.Sequential(
        K.RandomResizedCrop((size, size), scale=(0.2, 1.0)),
        K.RandomHorizontalFlip(),
        K.ColorJitter(0.4, 0.4, 0.4, 0.1, p=0.8),
        K.RandomGrayscale(p=0.2),
    )


_register("cifar")(lambda: _natural(32))
_register("stl10")(lambda: _natural(96))


def create_augmentation(name: str) -> nn.Module:
    """Build the view generator ``name`` (a kornia pipeline on (B, C, H, W) in [0, 1]).

    Raises:
        ValueError: for an unknown name.
    """
    if name not in _AUGMENTS:
        raise ValueError(
            f"unknown augmentation {name!r}: expected one of {', '.join(sorted(_AUGMENTS))}"
        )
    return _AUGMENTS[name]()
