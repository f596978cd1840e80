"""SimCLR view generators built from kornia, one per input resolution, in a name registry."""

from __future__ import annotations

from collections.abc import Callable

from torch import nn

from alm_opacus.registry import Registry

AugmentationFactory = Callable[[], nn.Module]
AUGMENTATIONS: Registry[AugmentationFactory] = Registry("augmentation")


def register_augmentation(
    name: str, *, force: bool = False
) -> Callable[[AugmentationFactory], AugmentationFactory]:
    """Register ``factory() -> nn.Module`` (a pipeline on (B, C, H, W) in [0, 1]) as ``name``.

    Raises:
        ValueError: if ``name`` is taken and ``force`` is false.
    """

    return AUGMENTATIONS.register(name, force=force)


# kornia is imported by the factories: every run checks the names, only pre-training builds
# the pipelines, and kornia's import is about 0.2 s of each start.


def _handwritten() -> nn.Module:
    import kornia.augmentation as K

    # No flips and mild rotation: a mirrored 2 or a rotated 6 is another digit. Translation,
    # scale and shear are fractions of the image, so one recipe suits 8x8 and 28x28.
    return nn.Sequential(
        K.RandomAffine(degrees=12.0, translate=(0.12, 0.12), scale=(0.85, 1.15), shear=8.0, p=1.0),
        K.RandomGaussianNoise(mean=0.0, std=0.08, p=0.5),
        K.RandomErasing(scale=(0.02, 0.12), ratio=(0.5, 2.0), p=0.3),
    )


def _natural(size: int) -> nn.Module:
    import kornia.augmentation as K

    # SimCLR's recipe (Chen et al. 2020, Appendix A): crop, flip, colour jitter, greyscale.
    return nn.Sequential(
        K.RandomResizedCrop((size, size), scale=(0.2, 1.0)),
        K.RandomHorizontalFlip(),
        K.ColorJitter(0.4, 0.4, 0.4, 0.1, p=0.8),
        K.RandomGrayscale(p=0.2),
    )


register_augmentation("digits")(_handwritten)
# 28x28 MNIST: the same handwriting recipe; measured in docs/datasets.md.
register_augmentation("mnist")(_handwritten)
register_augmentation("cifar")(lambda: _natural(32))
register_augmentation("stl10")(lambda: _natural(96))


def available_augmentations() -> list[str]:
    """Sorted names of the registered augmentations."""
    return AUGMENTATIONS.names()


def create_augmentation(name: str) -> nn.Module:
    """Build the view generator ``name`` (a kornia pipeline on (B, C, H, W) in [0, 1]).

    Raises:
        ValueError: for an unknown name.
    """
    return AUGMENTATIONS[name]()
