"""One ``DatasetSpec`` per dataset: everything the harness needs to know about it, in one place.

A spec bundles the loader, the default split sizes, the SimCLR recipe (which names the encoder
and the augmentation; none for a dataset of features a user's own encoder made), the DP-SGD
schedule, the default epsilon grid, and whether the data is read from a ``--data-root``.
``register_dataset_spec`` registers the spec and its loader in one call; ``dataset_spec(name)``
returns it or raises a ``DataError`` naming the registered ones.
Every part is required: a dataset never silently borrows another dataset's recipe.
"""

from __future__ import annotations

import itertools
import math
import re
from dataclasses import dataclass, fields

from alm_opacus.data.registry import (
    DataError,
    DatasetLoader,
    dataset_families,
    is_family_member,
    load_dataset_plugins,
    register_dataset,
    resolve_dataset,
)
from alm_opacus.data.split import SplitSizes
from alm_opacus.heads import HeadConfig
from alm_opacus.registry import Registry
from alm_opacus.ssl.config import SSLConfig

SPECS: Registry[DatasetSpec] = Registry("dataset spec")

#: The grid every dataset starts from; each spec may set its own.
DEFAULT_EPSILON_GRID: tuple[float, ...] = (0.1, 0.5, 1.0, 2.0, 5.0, 10.0)


@dataclass(frozen=True)
class DPSGDSchedule:
    """DP-SGD's default schedule for a dataset, as plain data (``alm_opacus`` never imports
    ``baselines``; the DP-SGD baseline reads this).

    Attributes:
        epochs: passes over the members.
        batch_size: the expected batch size of Poisson sampling (sample rate = batch / n).
    """

    epochs: int
    batch_size: int

    def __post_init__(self) -> None:
        for name in ("epochs", "batch_size"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name}={value!r} is invalid: expected an integer >= 1")

    def as_tuple(self) -> tuple[int, int]:
        """``(epochs, batch_size)``, the form ``baselines.dpsgd`` uses."""
        return self.epochs, self.batch_size


@dataclass(frozen=True)
class DatasetSpec:
    """Everything that defines a dataset's default run.

    Attributes:
        name: registry name (``--dataset``).
        loader: ``loader(*, root: Path | None) -> Dataset``.
        split: default split sizes (``--split`` overrides them).
        ssl: the SimCLR recipe; it names the encoder and the augmentation. ``None`` for a
            dataset of features (``features:PATH``): its loader gives features, and nothing
            is pre-trained.
        dpsgd: DP-SGD's default schedule.
        epsilons: the default epsilon grid, increasing.
        needs_root: whether the loader reads files under ``--data-root``.
        head: the default fine-tuning recipe (chosen by measurement where one was made:
            ``scripts/choose_recipe.py``, docs/recipes.md).
        description: one line for ``--help`` and the docs.
    """

    name: str
    loader: DatasetLoader
    split: SplitSizes
    ssl: SSLConfig | None
    dpsgd: DPSGDSchedule
    epsilons: tuple[float, ...]
    needs_root: bool
    head: HeadConfig
    description: str = ""

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise DataError(f"DatasetSpec name={self.name!r} is invalid: expected a non-empty str")
        expected = {
            "split": SplitSizes,
            "ssl": SSLConfig,
            "dpsgd": DPSGDSchedule,
            "head": HeadConfig,
        }
        for part, kind in expected.items():
            value = getattr(self, part)
            if part == "ssl" and value is None:
                continue  # a dataset of features: nothing to pre-train
            if not isinstance(value, kind):
                raise DataError(
                    f"DatasetSpec {self.name!r}: {part}={value!r} is missing or invalid: "
                    f"expected a {kind.__name__}"
                )
        if not callable(self.loader):
            raise DataError(f"DatasetSpec {self.name!r}: loader={self.loader!r} is not callable")
        if not isinstance(self.needs_root, bool):
            raise DataError(
                f"DatasetSpec {self.name!r}: needs_root={self.needs_root!r}: expected a bool"
            )
        _check_grid(self.name, self.epsilons)


def _check_grid(name: str, epsilons: object) -> None:
    if not isinstance(epsilons, tuple) or not epsilons:
        raise DataError(
            f"DatasetSpec {name!r}: epsilons={epsilons!r} is invalid: "
            "expected a non-empty tuple of floats"
        )
    for value in epsilons:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise DataError(f"DatasetSpec {name!r}: epsilon {value!r} is not a number")
        if not (math.isfinite(value) and value > 0):
            raise DataError(f"DatasetSpec {name!r}: epsilon {value!r}: expected finite and > 0")
    if any(b <= a for a, b in itertools.pairwise(epsilons)):
        raise DataError(
            f"DatasetSpec {name!r}: epsilons={epsilons!r}: expected strictly increasing values"
        )


def register_dataset_spec(spec: DatasetSpec, *, force: bool = False) -> DatasetSpec:
    """Register ``spec`` and its loader under ``spec.name``.

    The encoder and augmentation named by ``spec.ssl`` must already be registered, so that a
    typo fails here and not after a run has started.

    Args:
        spec: the dataset's spec.
        force: replace an existing registration of the same name.

    Returns:
        ``spec``, unchanged.

    Raises:
        DataError: if ``spec`` is not a DatasetSpec, or names an unknown encoder or
            augmentation.
        ValueError: if the name is taken and ``force`` is false.
    """
    from alm_opacus.ssl.augment import available_augmentations
    from alm_opacus.ssl.encoders import available_encoders

    if not isinstance(spec, DatasetSpec):
        raise DataError(f"expected a DatasetSpec, got {type(spec).__name__}")
    parts = (("encoder", available_encoders()), ("augmentation", available_augmentations()))
    for part, known in parts if spec.ssl is not None else ():
        value = getattr(spec.ssl, part)
        if value not in known:
            raise DataError(
                f"DatasetSpec {spec.name!r}: unknown {part} {value!r} in its SSLConfig: "
                f"expected one of {', '.join(known)}"
            )
    if SPECS.get(spec.name) not in (None, spec) and not force:
        raise ValueError(f"dataset spec {spec.name!r} is already registered; pass force=True")
    register_dataset(spec.name, force=force)(spec.loader)
    SPECS.add(spec.name, spec, force=True)
    return spec


def dataset_spec(name: str) -> DatasetSpec:
    """The registered spec of dataset ``name``.

    Raises:
        DataError: for a name without a spec (the message lists the registered ones), or a
            family's name whose argument is bad (``features:PATH`` with a bad file).
    """
    resolve_dataset(name)
    if name not in SPECS:
        families = "".join(f", or {p}:..." for p in dataset_families())
        raise DataError(
            f"no DatasetSpec for dataset {name!r}: expected one of "
            f"{', '.join(available_dataset_specs())}{families} (register one with "
            "register_dataset_spec)"
        )
    return SPECS[name]


def available_dataset_specs() -> list[str]:
    """Sorted names of the datasets that have a spec (plugins included; not a family's
    members, e.g. a resolved ``features:PATH``)."""
    load_dataset_plugins()
    return [n for n in SPECS.names() if not is_family_member(n)]


_SPLIT_KEYS = tuple(f.name for f in fields(SplitSizes))
_SPLIT_FORM = "members=1000,nonmembers=1000,attacker=2000,public=1000"
# Words allowed in place of a number, and the SplitSizes value they stand for.
_SPLIT_WORDS = {"nonmembers": ("members", None), "public": ("rest", None)}


def parse_split_sizes(text: str, *, default: SplitSizes | None = None) -> SplitSizes:
    """Parse a ``--split`` value such as ``members=1000,attacker=2000,public=1000``.

    Keys are ``members``, ``nonmembers``, ``attacker`` and ``public``, each at most once.
    Values are integers >= 0 (``members`` and ``nonmembers`` >= 1); ``nonmembers=members``
    makes the holdout the members' size and ``public=rest`` gives the public part what the
    others leave. A key left out keeps its value in ``default`` (the dataset's default split);
    without a ``default``, ``members`` is required and the others keep ``SplitSizes``'s
    defaults.

    Args:
        text: the option's value.
        default: the sizes that keys left out keep.

    Returns:
        The split sizes.

    Raises:
        ValueError: naming the bad key or value and the expected form.
    """
    where = f"--split={text!r}"
    given: dict[str, int | None] = {}
    for item in text.split(","):
        key, sep, raw = (s.strip() for s in item.partition("="))
        if not sep or not key:
            raise ValueError(
                f"{where}: {item.strip()!r} is not key=value; expected e.g. {_SPLIT_FORM}"
            )
        if key not in _SPLIT_KEYS:
            raise ValueError(
                f"{where}: unknown key {key!r}: expected some of {', '.join(_SPLIT_KEYS)}"
            )
        if key in given:
            raise ValueError(f"{where}: key {key!r} is given twice")
        given[key] = _split_value(where, key, raw)
    if default is None and "members" not in given:
        raise ValueError(f"{where}: members is required here; expected e.g. {_SPLIT_FORM}")
    base = {f: getattr(default, f) for f in _SPLIT_KEYS} if default is not None else {}
    try:
        return SplitSizes(**{**base, **given})
    except ValueError as exc:
        raise ValueError(f"{where}: {exc}") from exc


def _split_value(where: str, key: str, raw: str) -> int | None:
    word, meaning = _SPLIT_WORDS.get(key, (None, None))
    if word is not None and raw == word:
        return meaning
    low = 1 if key in ("members", "nonmembers") else 0
    also = f" or {word!r}" if word is not None else ""
    if not re.fullmatch(r"[0-9]+", raw) or int(raw) < low:
        raise ValueError(f"{where}: {key}={raw!r} is invalid: expected an integer >= {low}{also}")
    return int(raw)


def format_split_sizes(sizes: SplitSizes) -> str:
    """The ``--split`` text for ``sizes``; ``parse_split_sizes`` reads it back unchanged."""
    words = {key: word for key, (word, _) in _SPLIT_WORDS.items()}
    values = {key: getattr(sizes, key) for key in _SPLIT_KEYS}
    return ",".join(f"{k}={words[k] if v is None else v}" for k, v in values.items())
