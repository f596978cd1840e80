from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from alm_opacus.data import DataError, dataset_spec
from alm_opacus.data.split import PARTS, Split, SplitSizes, make_split


def test_default_digits_split_is_disjoint_sized_and_covers_the_pool(digits) -> None:  # type: ignore[no-untyped-def]
    split = make_split(digits, sizes=dataset_spec("digits").split, seed=0)
    sizes = split.sizes()
    assert sizes["members"] == sizes["nonmembers"] == 150
    assert sizes["attacker"] == 2 * sizes["members"]  # shadow halves match the victim
    assert sizes["public"] == 600
    union = np.concatenate([getattr(split, p) for p in PARTS])
    assert len(np.unique(union)) == len(union)


@pytest.mark.parametrize("part", PARTS)
def test_parts_are_class_stratified(digits, part: str) -> None:  # type: ignore[no-untyped-def]
    split = make_split(digits, sizes=dataset_spec("digits").split, seed=3)
    idx = getattr(split, part)
    pool = np.bincount(digits.labels, minlength=10) / len(digits.labels)
    counts = np.bincount(digits.labels[idx], minlength=10)
    # Largest-remainder rounding: each class is within one example of its exact share; the
    # public part takes what is left, so it carries the other three parts' rounding too.
    slack = 3.0 if part == "public" else 1.0
    assert np.all(np.abs(counts - pool * len(idx)) <= slack + 1e-9)


def test_split_is_seeded(digits) -> None:  # type: ignore[no-untyped-def]
    a = make_split(digits, sizes=dataset_spec("digits").split, seed=1)
    b = make_split(digits, sizes=dataset_spec("digits").split, seed=1)
    c = make_split(digits, sizes=dataset_spec("digits").split, seed=2)
    assert all(np.array_equal(getattr(a, p), getattr(b, p)) for p in PARTS)
    assert not np.array_equal(a.members, c.members)


def test_split_round_trips_through_json(digits, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    split = make_split(digits, sizes=SplitSizes(members=100, attacker=200, public=300), seed=0)
    split.save(tmp_path / "split.json")
    back = Split.load(tmp_path / "split.json")
    assert back.seed == 0
    assert all(np.array_equal(getattr(split, p), getattr(back, p)) for p in PARTS)


def test_oversized_split_names_the_sizes(digits) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(DataError, match="1797"):
        make_split(digits, sizes=SplitSizes(members=1000, attacker=10), seed=0)


def test_overlapping_parts_are_refused() -> None:
    idx = np.arange(3)
    with pytest.raises(ValueError, match="overlaps"):
        Split(public=idx, members=idx + 2, nonmembers=idx + 10, attacker=idx + 20, seed=0)
