"""Independent units (issue 20, item 2): the sampler's and the banks' chunks give the same
result however a :class:`~alm_opacus.unit_map.UnitMap` runs them (here: in reverse order, each
unit on its own copy of its inputs, as a worker would get them)."""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pytest
import torch

from alm_opacus.attacks import recipe_trainer
from alm_opacus.attacks.shadow_data import sized_masks, train_bank
from alm_opacus.heads import HeadConfig
from alm_opacus.sensitivity import sample_population_sensitivity, sample_sensitivity
from alm_opacus.unit_map import serial_map


def shuffled_map(
    fn: Callable[[Any, Any], Any], units: Sequence[Any], *, shared: Any, desc: str | None = None
) -> list[Any]:
    """Units last to first, each on its own deep copy of ``shared``."""
    calls.append(len(units))
    out = {i: fn(copy.deepcopy(shared), units[i]) for i in reversed(range(len(units)))}
    return [out[i] for i in range(len(units))]


calls: list[int] = []


@pytest.fixture
def data(pixel_features):  # type: ignore[no-untyped-def]
    x, y = pixel_features
    return x[:60], y[:60], x[200:300], y[200:300]


@pytest.mark.parametrize("kind", ["members", "population"])
def test_sampler_chunks_are_independent_units(data, kind: str) -> None:  # type: ignore[no-untyped-def]
    x, y, px, py = data
    config = HeadConfig(steps=30)
    common: dict[str, Any] = {
        "num_classes": 10,
        "config": config,
        "seed": 3,
        "m": 12,
        "chunk_size": 6,
    }
    if kind == "members":
        run = lambda mapper: sample_sensitivity(x, y, map_units=mapper, **common)  # noqa: E731
    else:
        run = lambda mapper: sample_population_sensitivity(  # noqa: E731
            px, py, n=len(y), population="test", map_units=mapper, **common
        )
    calls.clear()
    serial, shuffled = run(serial_map), run(shuffled_map)
    assert calls and calls[0] >= 2  # several chunks really went through the map
    np.testing.assert_array_equal(serial.l1, shuffled.l1)
    np.testing.assert_array_equal(serial.l2, shuffled.l2)
    np.testing.assert_array_equal(serial.pairs, shuffled.pairs)


def test_bank_chunks_are_independent_units(data) -> None:  # type: ignore[no-untyped-def]
    x, y, _, _ = data
    masks = sized_masks(12, len(y), size=30, rng=np.random.default_rng(0))
    trainer = recipe_trainer(config=HeadConfig(steps=30), num_classes=10)
    common: dict[str, Any] = {
        "features": x,
        "labels": y,
        "masks": masks,
        "trainer": trainer,
        "heads_per_seed": 4,
        "seed": 5,
    }
    calls.clear()
    serial, shuffled = train_bank(**common), train_bank(**common, map_units=shuffled_map)
    assert calls == [3]
    np.testing.assert_array_equal(serial.proba, shuffled.proba)
    q = torch.randn(7, x.shape[1], dtype=x.dtype)
    np.testing.assert_array_equal(serial.predict(q), shuffled.predict(q))


def test_a_bank_holds_its_chunks_probabilities_in_order_and_checks_their_shapes(data) -> None:  # type: ignore[no-untyped-def]
    """The chunks are copied one by one into one array (each let go once copied): the same
    array np.concatenate gives, in the units' order; a predictor of the wrong shape fails."""
    x, y, _, _ = data
    masks = sized_masks(10, len(y), size=30, rng=np.random.default_rng(1))
    trainer = recipe_trainer(config=HeadConfig(steps=20), num_classes=10)
    bank = train_bank(features=x, labels=y, masks=masks, trainer=trainer, heads_per_seed=4, seed=3)
    assert bank.proba.shape == (10, len(y), 10) and len(bank.predictors) == 3  # 4 + 4 + 2
    with torch.no_grad():
        chunks = [np.asarray(p(x)) for p in bank.predictors]
    assert bank.proba.dtype == chunks[0].dtype
    np.testing.assert_array_equal(bank.proba, np.concatenate(chunks))

    def flat(features, labels, chunk, seed):  # type: ignore[no-untyped-def]
        return lambda q: torch.zeros(len(q), 10)  # one (n, C) for a chunk of heads

    with pytest.raises(ValueError, match=r"expected \(10, \d+, C\) in all"):
        train_bank(features=x, labels=y, masks=masks, trainer=flat, heads_per_seed=4, seed=3)
