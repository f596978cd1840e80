"""The update rules of the first-order head solvers (``alm_opacus.heads``), in place on one
tensor, in a fixed order of operations (same inputs, same bits)."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

__all__ = ["STEPPERS", "Adam", "GradientDescent"]


class GradientDescent:
    """``w -= lr * grad`` on one tensor, in place (one multiply and one add per coordinate,
    or one fused multiply-add: the rounding that :mod:`alm_opacus.sensitivity.stability`
    bounds)."""

    def __init__(self, param: Tensor, lr: float) -> None:
        self.param, self.lr = param, lr

    def step(self, grad: Tensor) -> None:
        self.param.add_(grad, alpha=-self.lr)


class Adam:
    """Adam (Kingma & Ba 2015, Algorithm 1) on one tensor, in place, in a fixed op order."""

    beta1, beta2, tiny = 0.9, 0.999, 1e-8

    def __init__(self, param: Tensor, lr: float) -> None:
        self.param, self.lr, self.t = param, lr, 0
        self.first = torch.zeros_like(param)
        self.second = torch.zeros_like(param)

    def step(self, grad: Tensor) -> None:
        self.t += 1
        b1, b2 = self.beta1, self.beta2
        self.first.mul_(b1).add_(grad, alpha=1 - b1)
        self.second.mul_(b2).addcmul_(grad, grad, value=1 - b2)
        denom = (self.second / (1 - b2**self.t)).sqrt_().add_(self.tiny)
        self.param.addcdiv_(self.first, denom, value=-self.lr / (1 - b1**self.t))


#: The first-order solvers' update rules, by solver name.
STEPPERS: dict[str, Callable[[Tensor, float], Adam | GradientDescent]] = {
    "adam": Adam,
    "gd": GradientDescent,
}
