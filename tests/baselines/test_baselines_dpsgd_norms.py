"""The batched DP-SGD heads' per-example class norms (`baselines.dpsgd.batched._class_norms`):
float32 terms added in class order, checked against a plain float32 loop in that order (the
same IEEE additions, so equal bit for bit), against float64 within the float32 sum's error
bound, and torch's own norm wherever the kernel does not apply."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from baselines.dpsgd.batched import _class_norms


def _in_order(r: torch.Tensor, order: int) -> np.ndarray:
    """The norms by a Python loop over the classes, one float32 addition at a time."""
    x = r.numpy()
    acc = np.zeros((x.shape[0], x.shape[2]), dtype=np.float32)
    for c in range(x.shape[1]):
        term = np.abs(x[:, c]) if order == 1 else x[:, c] * x[:, c]
        acc = (acc + term).astype(np.float32)
    if order == 1:
        return acc
    return np.sqrt(acc.astype(np.float64)).astype(np.float32)


def _residuals(shape: tuple[int, int, int], scale: float, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(shape, generator=g) * scale
    onehot = (torch.rand(shape, generator=g) < 0.1).float()
    return torch.softmax(logits, dim=1) - onehot  # what the heads' clipping reads


@pytest.mark.parametrize("order", [1, 2])
@pytest.mark.parametrize(
    ("shape", "scale"),
    [((16, 10, 300), 1.0), ((3, 2, 7), 30.0), ((1, 100, 5), 1e-3), ((4, 10, 1), 1.0)],
)
def test_norms_are_float32_sums_in_class_order(
    order: int, shape: tuple[int, int, int], scale: float
) -> None:
    r = _residuals(shape, scale, seed=sum(shape))
    got = _class_norms(r, float(order))
    assert got.dtype == torch.float32 and got.shape == (shape[0], shape[2])
    assert np.array_equal(got.numpy(), _in_order(r, order))
    exact = torch.linalg.vector_norm(r.double(), ord=order, dim=1)
    # a float32 sum of C non-negative terms (each rounded once) is within γ_{C+1}; the root
    # halves it and adds half an ulp; a square below float32's subnormals rounds to zero
    # (≤ 2⁻¹⁵⁰ each), which after the root is at most √(C·2⁻¹⁵⁰)
    classes = shape[1]
    gamma = (classes + 1) * 2.0**-24 / (1 - (classes + 1) * 2.0**-24)
    floor = math.sqrt(classes * 2.0**-150) if order == 2 else 0.0
    assert torch.all((got.double() - exact).abs() <= (gamma + 2.0**-23) * exact + floor)


def test_non_finite_terms_stay_non_finite() -> None:
    r = torch.rand(2, 4, 5)
    r[0, 1, 2] = float("inf")
    r[1, 3, 4] = float("nan")
    for order in (1.0, 2.0):
        got = _class_norms(r, order)
        assert torch.isinf(got[0, 2]) and torch.isnan(got[1, 4])
        assert torch.isfinite(got[0, :2]).all()


def test_other_dtypes_and_layouts_get_torch_norms() -> None:
    r = _residuals((3, 5, 8), 1.0, seed=1)
    wide = r.double()
    assert torch.equal(_class_norms(wide, 2.0), wide.norm(2, dim=1))
    strided = r.transpose(0, 2).contiguous().transpose(0, 2)  # not contiguous: copied first
    assert np.array_equal(_class_norms(strided, 1.0).numpy(), _in_order(r, 1))
