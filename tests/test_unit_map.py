"""Independent units (issue 20, item 2): the sampler's and the banks' chunks give the same
result however a :class:`~alm_opacus.unit_map.UnitMap` runs them (here: in reverse order, each
unit on its own copy of its inputs, as a worker would get them)."""

from __future__ import annotations

import copy
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pytest
import torch

from alm_opacus.attacks import recipe_trainer
from alm_opacus.attacks.shadow_data import sized_masks, train_bank
from alm_opacus.heads import HeadConfig
from alm_opacus.sensitivity import sample_population_sensitivity, sample_sensitivity
from alm_opacus.unit_map import ThreadMap, serial_map


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


def _small_bank(x: torch.Tensor, y: torch.Tensor) -> dict[str, Any]:
    """The inputs of a bank of 12 heads in chunks of 4."""
    masks = sized_masks(12, len(y), size=30, rng=np.random.default_rng(0))
    trainer = recipe_trainer(config=HeadConfig(steps=30), num_classes=10)
    return {
        "features": x,
        "labels": y,
        "masks": masks,
        "trainer": trainer,
        "heads_per_seed": 4,
        "seed": 5,
    }


def test_bank_chunks_are_independent_units(data) -> None:  # type: ignore[no-untyped-def]
    x, y, _, _ = data
    common = _small_bank(x, y)
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


def test_a_thread_map_gives_the_serial_maps_bank_and_sampler(data) -> None:  # type: ignore[no-untyped-def]
    """ThreadMap (the in-process map of a large run's cells) returns serial_map's values, in
    the units' order, for a bank and for the sampler; the caller's thread count survives."""
    x, y, px, py = data
    common = _small_bank(x, y)
    before = torch.get_num_threads()
    serial, threaded = train_bank(**common), train_bank(**common, map_units=ThreadMap(workers=2))
    np.testing.assert_array_equal(serial.proba, threaded.proba)
    sampler: dict[str, Any] = {"num_classes": 10, "config": HeadConfig(steps=30), "seed": 3}
    sampled = {
        name: sample_population_sensitivity(
            px, py, n=len(y), population="test", m=12, chunk_size=6, map_units=mapper, **sampler
        )
        for name, mapper in (("serial", serial_map), ("threads", ThreadMap(workers=2)))
    }
    np.testing.assert_array_equal(sampled["serial"].l2, sampled["threads"].l2)
    assert torch.get_num_threads() == before


def test_a_thread_map_runs_units_beside_each_other_with_the_callers_thread_count() -> None:
    """Two units run at once (each waits for the other to start), each with the caller's
    intra-op thread count (not the count a new thread starts from); an error in a unit
    reaches the caller, and the units not yet started never run."""
    barrier = threading.Barrier(2, timeout=30)
    seen: list[tuple[str, int]] = []

    def unit(shared: None, k: int) -> int:
        if k < 2:
            barrier.wait()  # both first units must be running together
        seen.append((threading.current_thread().name, torch.get_num_threads()))
        return k * k

    before = torch.get_num_threads()
    try:
        torch.set_num_threads(3)  # the count new threads start from
        torch.set_num_threads(2)  # the caller's own
        assert ThreadMap(workers=2)(unit, [0, 1, 2, 3], shared=None) == [0, 1, 4, 9]
    finally:
        torch.set_num_threads(before)
    assert len(seen) == 4
    assert all(name.startswith("units") and threads == 2 for name, threads in seen)

    ran: list[int] = []

    def failing(shared: None, k: int) -> int:
        ran.append(k)
        if k == 0:
            raise RuntimeError("unit 0 failed")
        time.sleep(0.2)
        return k

    with pytest.raises(RuntimeError, match="unit 0 failed"):
        ThreadMap(workers=2)(failing, list(range(20)), shared=None)
    assert len(ran) < 20


def _bank(trainer: Any, x: torch.Tensor, y: torch.Tensor, *, threads: int, map_units: Any) -> Any:
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        masks = sized_masks(8, len(y), size=len(y) // 2, rng=np.random.default_rng(2))
        return train_bank(
            features=x,
            labels=y,
            masks=masks,
            trainer=trainer,
            heads_per_seed=4,
            seed=1,
            map_units=map_units,
        )
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("kind", ["convex", "dpsgd"])
def test_a_thread_maps_bank_is_the_serial_one_at_two_intra_op_threads(kind: str) -> None:
    """At a size where torch splits the products and reductions over its threads (as at 10^4
    members), a bank of the plain attacker's Newton-CG heads and of the DP-SGD attacker's
    batched heads from ThreadMap is serial_map's, bit for bit, at two intra-op threads. (With
    one thread per unit it was not, on this project's CI machine: the Newton-CG heads differed
    by ~1e-13, so ThreadMap keeps the caller's count.)"""
    from baselines.dpsgd.batched import dpsgd_shadow_trainer
    from baselines.dpsgd.config import DPSGDConfig

    g = torch.Generator().manual_seed(0)
    n, d = 8192, 128
    x = torch.randn(n, d, generator=g, dtype=torch.float64)
    x /= x.norm(dim=1, keepdim=True)
    y = torch.randint(0, 10, (n,), generator=g)
    head = HeadConfig(l2=3e-4, solver="newton")  # the recipe of features and mnist
    trainer = (
        recipe_trainer(config=head, num_classes=10)
        if kind == "convex"
        else dpsgd_shadow_trainer(
            head=HeadConfig(),
            num_classes=10,
            config=DPSGDConfig(lr=4.0, max_grad_norm=1.0, epochs=2, batch_size=256),
            sigma=1.0,
            sample_rate=256 / n,
        )
    )
    serial = _bank(trainer, x, y, threads=2, map_units=serial_map)
    threaded = _bank(trainer, x, y, threads=2, map_units=ThreadMap(workers=2))
    np.testing.assert_array_equal(serial.proba, threaded.proba)
