"""The fused float32 clipping of exact DP-SGD steps (compiled kernels): every example's
rounded cells within the radius (checked exactly, in Python integers), exact batch sums
(within float32's exact integers and beyond), agreement with the float64 reference path, and
the cases it hands back to that path."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest
import torch

from alm_opacus.mechanisms import cell_clipping
from alm_opacus.mechanisms.cell_clipping import _norm_bound, fused_cell_sums
from alm_opacus.mechanisms.clip_kernels import cell_sum_kernel
from alm_opacus.mechanisms.exact import (
    cell_radius,
    enforce_radius,
    scaled_cells,
    step_grid,
)

if cell_sum_kernel() is None:  # pragma: no cover - numba is a dependency
    pytest.skip("numba does not import here", allow_module_level=True)


def _fits(cells: list[int], *, norm: str, radius: float) -> bool:
    """‖cells‖ ≤ radius, exactly (integers against the float radius as a fraction)."""
    if norm == "l1":
        return sum(abs(c) for c in cells) <= Fraction(radius)
    return sum(c * c for c in cells) <= Fraction(radius) ** 2


def _gradients(batch: int, sizes: tuple[int, ...], *, norm: str, seed: int) -> list[torch.Tensor]:
    """Per-sample gradients, half of them scaled exactly onto the clip bound 1 in float32
    (the float error then sits on the boundary, where a loose bound would fail)."""
    g = torch.Generator().manual_seed(seed)
    rows = [torch.randn(batch, k, generator=g) * 3 for k in sizes]
    flat = torch.cat(rows, dim=1).double()
    size = flat.abs().sum(1) if norm == "l1" else flat.norm(dim=1)
    on_bound = (1.0 / size).float().view(-1, 1)
    half = batch // 2
    return [torch.cat([r[:half] * on_bound[:half], r[half:]]) for r in rows]


@pytest.mark.parametrize("norm", ["l1", "l2"])
@pytest.mark.parametrize("per_layer", [False, True])
def test_each_example_fits_the_radius_and_the_batch_sum_is_exact(
    norm: str, per_layer: bool
) -> None:
    sizes = (300, 4097, 7)  # more than one tile, and a ragged last tile
    dim = sum(sizes)
    grid = step_grid(max_grad_norm=1.0, norm=norm, dim=dim)
    radius = cell_radius(max_grad_norm=1.0, norm=norm, dim=dim, grid=grid)
    budgets = None
    if per_layer:  # budgets whose norm is 1 in the clipping norm
        budgets = [0.5, 0.3, 0.2] if norm == "l1" else [0.6, 0.64, 0.48]
    rows = _gradients(16, sizes, norm=norm, seed=1)
    kwargs = {
        "budgets": budgets,
        "max_grad_norm": 1.0,
        "norm": norm,
        "grid": grid,
        "radius": radius,
    }
    batch_sums = fused_cell_sums(rows, **kwargs)
    assert batch_sums is not None
    singles = [fused_cell_sums([r[i : i + 1] for r in rows], **kwargs) for i in range(16)]
    for example in singles:
        assert example is not None
        assert _fits(torch.cat(example).tolist(), norm=norm, radius=radius)
    for k, total in enumerate(batch_sums):
        assert total.dtype == torch.int64
        assert torch.equal(total, sum(example[k] for example in singles))  # type: ignore[index]


@pytest.mark.parametrize("norm", ["l1", "l2"])
def test_fused_sums_agree_with_the_float64_reference(norm: str) -> None:
    sizes = (500, 120)
    dim = sum(sizes)
    grid = step_grid(max_grad_norm=1.0, norm=norm, dim=dim)
    radius = cell_radius(max_grad_norm=1.0, norm=norm, dim=dim, grid=grid)
    rows = _gradients(32, sizes, norm=norm, seed=2)
    fused = fused_cell_sums(
        rows, budgets=None, max_grad_norm=1.0, norm=norm, grid=grid, radius=radius
    )
    assert fused is not None
    flat = torch.cat(rows, dim=1).double()
    size = flat.abs().sum(1) if norm == "l1" else flat.norm(dim=1)
    factors = (1.0 / (size + 1e-6)).clamp(max=1.0)
    reference = enforce_radius(
        [scaled_cells(r, factors, grid=grid) for r in rows], norm=norm, radius=radius
    )
    for ours, theirs in zip(fused, reference, strict=True):
        # the two differ only by float roundings of the factor (≤ 2⁻¹⁹ relative: ≤ R·2⁻¹⁹
        # cells) and a rounding to the other neighbour (1 cell), per example
        gap = (ours.double() - theirs.sum(0)).abs().max()
        assert gap <= 32 * (1 + radius * 2.0**-19)


def test_the_wide_range_sums_exactly() -> None:
    # L1 over 200,000 weights: R > 2^24 cells, so even one cell may leave float32's exact
    # integers and every cell is summed in float64
    dim, batch = 200_000, 16
    grid = step_grid(max_grad_norm=1.0, norm="l1", dim=dim)
    radius = cell_radius(max_grad_norm=1.0, norm="l1", dim=dim, grid=grid)
    assert radius >= 2**24
    g = torch.Generator().manual_seed(3)
    rows = [torch.zeros(batch, dim)]
    rows[0][:, :3] = torch.rand(batch, 3, generator=g) + 5  # mass on a few coordinates
    kwargs = {"budgets": None, "max_grad_norm": 1.0, "norm": "l1", "grid": grid, "radius": radius}
    (total,) = fused_cell_sums(rows, **kwargs)  # type: ignore[misc]
    singles = [fused_cell_sums([rows[0][i : i + 1]], **kwargs)[0] for i in range(batch)]  # type: ignore[index]
    assert torch.equal(total, sum(singles))
    assert int(total.abs().max()) > 2**24  # the sums are beyond float32's exact range


@pytest.mark.parametrize("dim", [3_000, 20_000])
def test_runs_of_examples_sum_exactly(dim: int) -> None:
    # L1 at thousands of weights: one cell fits float32's exact integers, the batch's sum
    # may not (R < 2^24 ≤ B·R), so the accumulator is flushed within the batch
    grid = step_grid(max_grad_norm=1.0, norm="l1", dim=dim)
    radius = cell_radius(max_grad_norm=1.0, norm="l1", dim=dim, grid=grid)
    assert radius < 2**24 <= 200 * radius
    g = torch.Generator().manual_seed(4)
    rows = [torch.zeros(200, dim)]
    rows[0][:, :2] = torch.rand(200, 2, generator=g) + 1  # mass on two coordinates
    kwargs = {"budgets": None, "max_grad_norm": 1.0, "norm": "l1", "grid": grid, "radius": radius}
    (total,) = fused_cell_sums(rows, **kwargs)  # type: ignore[misc]
    singles = [fused_cell_sums([rows[0][i : i + 1]], **kwargs)[0] for i in range(200)]  # type: ignore[index]
    assert torch.equal(total, sum(singles))
    assert int(total.abs().max()) > 2**24  # beyond float32's exact integers


@pytest.mark.parametrize("bad", ["nan", "inf", "float64", "empty"])
def test_fused_path_hands_back_what_it_cannot_prove(bad: str) -> None:
    grid = step_grid(max_grad_norm=1.0, norm="l2", dim=10)
    radius = cell_radius(max_grad_norm=1.0, norm="l2", dim=10, grid=grid)
    rows = torch.randn(4, 10)
    if bad == "nan":
        rows[1, 2] = float("nan")
    elif bad == "inf":
        rows[0, 0] = 3e38  # finite, but its square overflows float32
    elif bad == "float64":
        rows = rows.double()
    else:
        rows = rows[:0]
    assert (
        fused_cell_sums(
            [rows], budgets=None, max_grad_norm=1.0, norm="l2", grid=grid, radius=radius
        )
        is None
    )


@pytest.mark.parametrize(("spread", "runs"), [(4096, "whole batch"), (8, "runs")])
def test_wide_range_cells_sum_in_float32_when_they_are_small(spread: int, runs: str) -> None:
    # L1 over 200,000 weights: R > 2^24, so the radius alone would send every cell to
    # float64; the mass spread over `spread` coordinates keeps each cell small enough for
    # float32 sums of the whole batch (4096) or of runs of a few examples (8)
    dim, batch = 200_000, 64
    grid = step_grid(max_grad_norm=1.0, norm="l1", dim=dim)
    radius = cell_radius(max_grad_norm=1.0, norm="l1", dim=dim, grid=grid)
    assert radius >= 2**24
    g = torch.Generator().manual_seed(5)
    rows = [torch.zeros(batch, dim)]
    rows[0][:, :spread] = torch.rand(batch, spread, generator=g) + 1
    scale = radius / spread  # the largest cell of an example on the clip bound
    assert (runs == "whole batch") == (batch * 2 * scale < 2**24)
    kwargs = {"budgets": None, "max_grad_norm": 1.0, "norm": "l1", "grid": grid, "radius": radius}
    (total,) = fused_cell_sums(rows, **kwargs)  # type: ignore[misc]
    singles = [fused_cell_sums([rows[0][i : i + 1]], **kwargs)[0] for i in range(batch)]  # type: ignore[index]
    assert torch.equal(total, sum(singles))
    # Python integers: the exact column sums of every example's cells
    exact = [sum(int(s[j]) for s in singles) for j in range(spread)]
    assert total[:spread].tolist() == exact


@pytest.mark.parametrize("held", [1.0, 2.0**18, 2.0**20, 2.0**21, 2.0**23, 2.0**30])
def test_the_compiled_sums_round_as_torch_rounds_ties_included(held: float) -> None:
    # the bounds set when the accumulator is flushed: in groups of 8 rows, after 64 rows
    # (2^18), after every other group (2^20); one row at a time where a group's bounds
    # pass 2^24 (2^21), flushed after every other row (2^23), or (a bound of 2^30 alone
    # passes 2^24) at once after each row. 300 rows: a last short group too
    kernel = cell_sum_kernel()
    if kernel is None:
        pytest.skip("numba does not import here")
    g = torch.Generator().manual_seed(6)
    rows = torch.randn(300, 5000, generator=g)
    # exact ties (round half to even) and cells beyond 2^22, where y + 1.5·2^23 − 1.5·2^23
    # would no longer round
    rows[:4, :6] = torch.tensor([2.5, -2.5, 3.5, 0.5, -0.5, 1_000_000.5])
    rows[4, 0] = 2.0**22 + 0.5
    rows[5, 0] = -(2.0**23 - 0.5)
    scale = torch.ones(300)
    scale[6:] = 2.0**14  # cells up to ~2^16
    rows[6:, 10] = 4.0 + 2.0**-14  # 294 cells of 65,537: a column sum far past 2^24
    expected = torch.round(rows * scale[:, None]).double().sum(0).to(torch.int64)
    # a valid bound on every cell of the row, never smaller than the one being tested
    bounds = (rows.abs() * scale[:, None]).amax(1, keepdim=True).double() + 0.5
    bounds = bounds.clamp(min=held)
    total = np.zeros(5000, dtype=np.int64)
    kernel(rows.numpy(), scale.numpy(), bounds.numpy(), 5000, 2048, total)
    assert torch.equal(torch.from_numpy(total), expected)


def _exact_norms(rows: torch.Tensor, *, norm: str) -> list[Fraction]:
    """Each row's L1 norm, or its squared L2 norm, exactly (Python fractions)."""
    power = 1 if norm == "l1" else 2
    return [sum((abs(Fraction(x)) ** power for x in row.tolist()), Fraction(0)) for row in rows]


@pytest.mark.parametrize("norm", ["l1", "l2"])
@pytest.mark.parametrize("length", [10, 1500, 20_000])
def test_the_norm_bound_is_an_upper_bound_and_tight(norm: str, length: int) -> None:
    # rows over 60 binades (float32 sums of them round at every step), one row of equal
    # terms (the worst case for a sequential sum's drift), one of zeros, one of subnormals
    g = torch.Generator().manual_seed(8)
    rows = torch.randn(6, length, generator=g) * torch.exp2(
        torch.randint(-30, 30, (6, length), generator=g).float()
    )
    rows[1] = 0.1
    rows[2] = 0.0
    rows[3] = 1e-40
    bound = _norm_bound(rows, norm=norm)
    # the bound inflates the float32 sums by their worst case (γ_T for a tile, three
    # roundings), so it is at most that factor squared above the exact norm, plus 2^-126 a term
    tile = min(8192, length)
    gamma = tile * 2.0**-24 / (1 - tile * 2.0**-24)
    slack = Fraction((1 + 2.0**-39) / ((1 - 2.0**-24) ** 3 * (1 - gamma))) ** 2
    for value, exact in zip(bound.tolist(), _exact_norms(rows, norm=norm), strict=True):
        assert Fraction(value) >= exact
        assert Fraction(value) <= exact * slack + Fraction(length) * Fraction(2) ** -125


@pytest.mark.parametrize("norm", ["l1", "l2"])
def test_the_norm_bound_hands_back_non_finite_gradients(norm: str) -> None:
    rows = torch.ones(4, 3000)
    rows[1, 17] = float("nan")
    rows[2, 2999] = float("inf")
    rows[3, 5] = -float("inf")
    bound = _norm_bound(rows, norm=norm)
    assert bool(torch.isfinite(bound[0]))
    assert bool(torch.isnan(bound[1]))
    assert bound[2].item() == float("inf") and bound[3].item() == float("inf")


def test_the_norm_bound_of_a_strided_view_is_the_bound_of_its_copy() -> None:
    g = torch.Generator().manual_seed(9)
    rows = torch.randn(3000, 8, generator=g).t()
    assert not rows.is_contiguous()
    bound = _norm_bound(rows, norm="l1")
    assert torch.equal(bound, _norm_bound(rows.contiguous(), norm="l1"))
    exact = _exact_norms(rows, norm="l1")
    assert all(Fraction(v) >= e for v, e in zip(bound.tolist(), exact, strict=True))


def test_a_strided_batch_sums_as_its_copy() -> None:
    grid = step_grid(max_grad_norm=1.0, norm="l2", dim=3000)
    radius = cell_radius(max_grad_norm=1.0, norm="l2", dim=3000, grid=grid)
    rows = torch.randn(3000, 8, generator=torch.Generator().manual_seed(10)).t()
    strided, copied = (
        fused_cell_sums([r], budgets=None, max_grad_norm=1.0, norm="l2", grid=grid, radius=radius)
        for r in (rows, rows.contiguous())
    )
    assert strided is not None and copied is not None
    assert torch.equal(strided[0], copied[0])


def test_without_numba_the_float64_path_takes_the_step(monkeypatch: pytest.MonkeyPatch) -> None:
    grid = step_grid(max_grad_norm=1.0, norm="l1", dim=10)
    radius = cell_radius(max_grad_norm=1.0, norm="l1", dim=10, grid=grid)
    rows = [torch.randn(4, 10)]

    def fused() -> list[torch.Tensor] | None:
        return fused_cell_sums(
            rows, budgets=None, max_grad_norm=1.0, norm="l1", grid=grid, radius=radius
        )

    assert fused() is not None
    monkeypatch.setattr(cell_clipping, "cell_sum_kernel", lambda: None)
    assert fused() is None
