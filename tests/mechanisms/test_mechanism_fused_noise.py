"""The fused first pass (one compiled loop per tile, K finished into the output as it is made)
against the chunked reference pass it replaced: the same words give the same K, the same draws
in doubt and so the same noise, bit for bit, for every law, shape, grid and finish; noise summed
into cells and dequantized in one pass equals the separate steps it fuses."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

import alm_opacus.mechanisms.exact as exact
from alm_opacus.mechanisms import kernels, make_generator
from alm_opacus.mechanisms.exact import (
    Grid,
    dequantize,
    discrete_noise,
    noisy_cells,
    noisy_dequantized,
)
from alm_opacus.mechanisms.sampling import uniform_words
from alm_opacus.training import MechanismDPOptimizer

MECHANISMS = ("alm", "laplace", "gaussian")
UNIT = Grid(exponent=0, limit=2**53, bound=2**52)
#: Lengths around the tile (512) and the chunk, and the empty draw.
LENGTHS = (0, 1, 511, 512, 513, 5_770, 3 * exact._CHUNK // 2 + 5)


def _threshold(t: float) -> tuple[int, float]:
    """``small`` and ``threshold`` as `exact._draw_into` computes them at ``t``."""
    k = min(24, max(4, round((47 - np.log2(max(t, 1.0))) / 2)))
    return 1 << (63 - k), 0.5 - t * exact._FIRST_MARGIN - 2.0**-40 - t * 2.0 ** (k - 48)


@pytest.fixture
def forced(monkeypatch: pytest.MonkeyPatch) -> None:
    """Widen both float margins (as `test_the_slow_exact_paths_draw_the_same_law` does), so
    that most draws go through the second pass and about a tenth of those through interval
    arithmetic."""
    monkeypatch.setattr(exact, "_FIRST_MARGIN", 0.45 / 2.5)
    monkeypatch.setattr(exact, "_SECOND_MARGIN", 0.05 / 2.5)


@pytest.mark.parametrize("mechanism", MECHANISMS)
@pytest.mark.parametrize("t", [0.3, 3.7, 2.0**20, 1.35e8, 2.0**40])
@pytest.mark.parametrize("finish", kernels.FINISHES)
def test_the_fused_kernel_equals_the_chunked_one_bit_for_bit(
    mechanism: str, t: float, finish: str
) -> None:
    """Same words, same K (in every finish) and the same draws in doubt: at 2⁴⁰ cells per
    scale nearly every draw is in doubt, at 0.3 almost none."""
    fused = kernels.first_pass_kernel(mechanism)
    chunked = kernels.first_pass_kernel(mechanism, fused=False)
    assert fused is not None and chunked is not None
    small, threshold = _threshold(t)
    n = 20_003
    words = uniform_words(n, generator=make_generator(seed=int(t) % 1000 + n)).numpy()
    base = np.random.default_rng(0).integers(-(2**40), 2**40, n)
    dtypes = (np.float32, np.float64) if finish == "dequantize" else (np.int64,)
    for dtype in dtypes:
        got = []
        for kernel in (fused, chunked):
            out = np.full(n, 7, dtype)
            doubt = kernel(
                words,
                t,
                small,
                threshold,
                out,
                None if finish == "store" else base,
                finish,
                2.0**-30,
                2**35,
            ).copy()
            got.append((out, doubt))
        (a, da), (b, db) = got
        assert a.dtype == b.dtype == dtype
        np.testing.assert_array_equal(a, b)
        np.testing.assert_array_equal(da, db)
        # all in doubt where the margin passes ½ (t = 2⁴⁰), some where t is large, not all
        assert (len(da) == n) == (threshold <= 0)
        assert t < 1e7 or len(da) > 0
    if finish == "store":  # K is 0 on the draws in doubt, for the later passes to decide
        k, doubt = got[0]
        assert np.all(k[doubt] == 0)


@pytest.mark.parametrize("mechanism", MECHANISMS)
@pytest.mark.parametrize("n", LENGTHS)
def test_discrete_noise_is_the_reference_draw_bit_for_bit(
    mechanism: str, n: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    for t in (3.7, 1.35e8, 2.0**36):
        draws = []
        for fused in (True, False):
            monkeypatch.setattr(exact, "_FUSED", fused)
            draws.append(
                discrete_noise(
                    n, mechanism=mechanism, scale=t, grid=UNIT, generator=make_generator(seed=n)
                )
            )
        assert torch.equal(draws[0], draws[1])
        assert n < 1000 or int(draws[0].abs().max()) > t  # not a degenerate output


@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_forced_second_passes_are_the_reference_draw_bit_for_bit(
    mechanism: str, forced: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    draws = []
    for fused in (True, False):
        monkeypatch.setattr(exact, "_FUSED", fused)
        generator = make_generator(seed=3)
        draws.append(
            discrete_noise(
                (40, 101), mechanism=mechanism, scale=2.5, grid=UNIT, generator=generator
            )
        )
        # the generator is left where the reference leaves it: the same words were drawn
        draws.append(uniform_words(4, generator=generator))
    assert torch.equal(draws[0], draws[2]) and torch.equal(draws[1], draws[3])


@pytest.fixture(params=["fused", "chunked", "tensor"])
def first_pass(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """The fused compiled pass, the chunked compiled one and the tensor one (numba missing)."""
    monkeypatch.setattr(exact, "_FUSED", request.param == "fused")
    monkeypatch.setattr(exact, "_USE_KERNELS", request.param != "tensor")
    return str(request.param)


def _cells(seed: int) -> list[torch.Tensor]:
    """Clipped sums of three parameters (int64, int32, a 0-dim one), in cells."""
    rng = torch.Generator().manual_seed(seed)
    return [
        torch.randint(-(2**45), 2**45, (3, 700), generator=rng),
        torch.randint(-(2**20), 2**20, (513,), generator=rng, dtype=torch.int32),
        torch.tensor(12345, dtype=torch.int64),
    ]


@pytest.mark.parametrize("mechanism", MECHANISMS)
@pytest.mark.parametrize("slow", [False, True])
def test_noise_summed_into_cells_is_the_cells_plus_the_draw(
    mechanism: str, slow: bool, first_pass: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    if slow:
        monkeypatch.setattr(exact, "_FIRST_MARGIN", 0.45 / 2.5)
        monkeypatch.setattr(exact, "_SECOND_MARGIN", 0.05 / 2.5)
    cells = _cells(1)
    before = [c.clone() for c in cells]
    for t in (2.5, 1.35e8):
        got = noisy_cells(
            cells, mechanism=mechanism, scale=t, grid=UNIT, generator=make_generator(seed=9)
        )
        noise = discrete_noise(
            sum(c.numel() for c in cells),
            mechanism=mechanism,
            scale=t,
            grid=UNIT,
            generator=make_generator(seed=9),
        )
        flat = torch.cat([c.reshape(-1).to(torch.int64) for c in cells])
        assert got.dtype == torch.int64 and torch.equal(got, flat + noise)
    assert all(torch.equal(a, b) for a, b in zip(cells, before, strict=True))  # untouched
    empty = noisy_cells(
        [], mechanism=mechanism, scale=1.0, grid=UNIT, generator=make_generator(seed=0)
    )
    assert empty.shape == (0,)
    with pytest.raises(ValueError, match="expected integer cells"):
        noisy_cells(
            [torch.zeros(3)],
            mechanism=mechanism,
            scale=1.0,
            grid=UNIT,
            generator=make_generator(seed=0),
        )


@pytest.mark.parametrize("mechanism", MECHANISMS)
@pytest.mark.parametrize("slow", [False, True])
def test_noisy_floats_in_one_pass_are_the_dequantized_noisy_cells(
    mechanism: str, slow: bool, first_pass: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """float32 outputs round |cells| above 2²⁴, and the grid's limit clamps some of them."""
    if slow:
        monkeypatch.setattr(exact, "_FIRST_MARGIN", 0.45 / 2.5)
        monkeypatch.setattr(exact, "_SECOND_MARGIN", 0.05 / 2.5)
    grid = Grid(exponent=-21, limit=2**44 + 3, bound=2**40)
    cells = _cells(2)
    for dtypes in (
        (torch.float32, torch.float64, torch.float32),
        (torch.float16, torch.float32, torch.bfloat16),  # narrow dtypes: the tensor route
    ):
        got = noisy_dequantized(
            cells,
            dtypes=dtypes,
            mechanism=mechanism,
            scale=2.5 * 2.0**-21,
            grid=grid,
            generator=make_generator(seed=4),
        )
        noisy = noisy_cells(
            cells,
            mechanism=mechanism,
            scale=2.5 * 2.0**-21,
            grid=grid,
            generator=make_generator(seed=4),
        )
        pieces = noisy.split([c.numel() for c in cells])
        for g, p, c, d in zip(got, pieces, cells, dtypes, strict=True):
            expected = p.clamp(-grid.limit, grid.limit).to(torch.float64).mul_(grid.gamma).to(d)
            assert g.dtype == d and g.shape == c.shape
            assert torch.equal(g.reshape(-1), expected)
        if dtypes[0] == torch.float32:  # the clamp was reached, and rounded to float32
            top = float(np.float32(grid.limit * grid.gamma))
            assert float(got[0].abs().max()) == top == 2.0**23
    with pytest.raises(ValueError, match="expected one each"):
        noisy_dequantized(
            cells,
            dtypes=[torch.float32],
            mechanism=mechanism,
            scale=1.0,
            grid=grid,
            generator=make_generator(seed=4),
        )


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16])
def test_dequantize_in_one_pass_is_the_tensor_arithmetic(
    dtype: torch.dtype, monkeypatch: pytest.MonkeyPatch
) -> None:
    grid = Grid(exponent=-7, limit=2**40, bound=2**39)
    cells = torch.cat(
        [
            torch.randint(-(2**41), 2**41, (10_000,), generator=torch.Generator().manual_seed(5)),
            torch.tensor([0, 1, -1, 2**24 + 1, -(2**24) - 3, 2**40, -(2**40) - 1, 2**62]),
        ]
    ).reshape(2, -1)
    expected = cells.clamp(-grid.limit, grid.limit).to(torch.float64).mul_(grid.gamma).to(dtype)
    got = dequantize(cells, grid=grid, dtype=dtype)
    assert got.dtype == dtype and got.shape == cells.shape and torch.equal(got, expected)
    strided = dequantize(cells.t(), grid=grid, dtype=dtype)  # not contiguous
    assert torch.equal(strided, expected.t())
    monkeypatch.setattr("alm_opacus.mechanisms.grid.dequantize_kernel", lambda: None)
    assert torch.equal(dequantize(cells, grid=grid, dtype=dtype), expected)  # numba missing


@pytest.mark.parametrize("mechanism", MECHANISMS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16])
@pytest.mark.parametrize("noise_multiplier", [0.0, 1.0, 40.0])
def test_a_step_adds_the_noise_it_drew_before_the_fused_pass(
    mechanism: str, dtype: torch.dtype, noise_multiplier: float
) -> None:
    """``add_noise`` (noise summed into the cells and dequantized in one pass) gives the
    gradients of the separate steps it replaced, drawn from the same seed:
    ``cells_to_grad(cells + step_cell_noise(cells))``."""
    grads = []
    for fused in (True, False):
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(300, 20), nn.Linear(20, 7)).to(dtype)
        opt = MechanismDPOptimizer(
            torch.optim.SGD(model.parameters(), lr=1.0),
            noise_multiplier=noise_multiplier,
            max_grad_norm=0.7,
            expected_batch_size=4,
            noise_mechanism=mechanism,
            generator=torch.Generator().manual_seed(11),
        )
        rng = torch.Generator().manual_seed(1)
        for p in model.parameters():
            p.summed_grad = torch.randint(-(2**30), 2**30, p.shape, generator=rng)  # type: ignore[attr-defined]
        if fused:
            opt.add_noise()
            grads.append([p.grad for p in model.parameters()])
        else:
            parts = [p.summed_grad for p in model.parameters()]  # type: ignore[attr-defined]
            noise = opt.step_cell_noise(parts).split([t.numel() for t in parts])
            grads.append(
                [
                    opt.cells_to_grad(t.reshape(-1) + k, p)
                    for t, k, p in zip(parts, noise, model.parameters(), strict=True)
                ]
            )
    for a, b in zip(*grads, strict=True):
        assert a.dtype == b.dtype == dtype and torch.equal(a, b)
