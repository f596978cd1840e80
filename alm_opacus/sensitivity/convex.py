"""The convex head trained to its exact minimiser: batched Newton-CG in float64.

The objective is the one in :mod:`alm_opacus.heads` for ``kind="linear"`` with ``l2 > 0``:
multinomial logistic regression on clipped features, L2-regularised over weights and biases,
hence ``l2``-strongly convex with a unique minimiser ``w*``. The trainer stops only once
``||grad F(w)||_2 <= tol`` holds for every head (else it raises), which is what lets
:func:`~alm_opacus.sensitivity.analytic.analytic_sensitivity` cover the weights actually
returned and not only ``w*``. It starts from zero, so no seed is involved.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor
from torch.nn import functional as F

from alm_opacus._validation import check_positive
from alm_opacus.heads import HeadConfig, Params, check_head_inputs, clip_features

__all__ = ["DEFAULT_TOL", "ConvexFit", "train_convex_heads"]

#: Default gradient-norm tolerance. Far above float64 rounding of the gradient (~1e-15) and
#: far below any sensitivity: its contribution to the analytic bound is ``2 * tol / l2``.
DEFAULT_TOL = 1e-10

_ARMIJO = 1e-4


@dataclass(frozen=True)
class ConvexFit:
    """Heads trained by :func:`train_convex_heads`.

    Attributes:
        params: ``{"fc.weight": (B, C, d), "fc.bias": (B, C)}``, like ``train_heads``.
        grad_norms: (B,) ``||grad F_b||_2`` at the returned weights, each ``<= tol``.
        tol: the tolerance every head met.
        iterations: Newton iterations used (the slowest head).
    """

    params: Params
    grad_norms: Tensor
    tol: float
    iterations: int


class _Problem:
    """The batched objective, its gradient and Hessian-vector products.

    Weights are ``(B*C, d+1)`` with the bias as the last column and ``x~ = (x, 1)``.
    """

    def __init__(self, x: Tensor, y: Tensor, masks: Tensor, num_classes: int, l2: float) -> None:
        n = x.shape[0]
        self.b, self.c, self.n, self.l2 = masks.shape[0], num_classes, n, l2
        self.xt = torch.cat([x, x.new_ones(n, 1)], dim=1)
        self.xt_t = self.xt.t().contiguous()
        weight = masks.to(x.dtype)
        self.weight = (weight / weight.sum(1, keepdim=True)).unsqueeze(1)  # (B, 1, n)
        self.onehot = F.one_hot(y, num_classes).to(x.dtype).t().unsqueeze(0)  # (1, C, n)

    def _logits(self, w: Tensor) -> Tensor:
        return torch.mm(w, self.xt_t).view(self.b, self.c, self.n)

    def dot(self, u: Tensor, v: Tensor) -> Tensor:
        """Per-head inner product of two (B*C, d+1) tensors: (B,)."""
        return (u * v).view(self.b, -1).sum(1)

    def expand(self, per_head: Tensor) -> Tensor:
        """(B,) -> (B*C, 1), to scale each head's rows."""
        return per_head.repeat_interleave(self.c).unsqueeze(1)

    def value_and_proba(self, w: Tensor) -> tuple[Tensor, Tensor]:
        z = self._logits(w)
        lse = torch.logsumexp(z, dim=1, keepdim=True)  # (B, 1, n)
        ce = (lse - (z * self.onehot).sum(1, keepdim=True)) * self.weight
        value = ce.view(self.b, -1).sum(1) + 0.5 * self.l2 * self.dot(w, w)
        return value, torch.exp(z - lse)

    def grad(self, w: Tensor, proba: Tensor) -> Tensor:
        r = (proba - self.onehot) * self.weight
        return torch.mm(r.view(-1, self.n), self.xt) + self.l2 * w

    def hvp(self, v: Tensor, proba: Tensor) -> Tensor:
        # The Hessian of CE in the logits is diag(p) - p p^T per row; chain through x~.
        s = proba * self._logits(v)
        t = (s - proba * s.sum(1, keepdim=True)) * self.weight
        return torch.mm(t.view(-1, self.n), self.xt) + self.l2 * v


def _cg(prob: _Problem, g: Tensor, proba: Tensor, forcing: Tensor, max_iter: int) -> Tensor:
    """Batched conjugate gradients for ``H d = -g``; head b stops at ``||r_b|| <= forcing_b``."""
    x = torch.zeros_like(g)
    r = -g
    p = r.clone()
    rs = prob.dot(r, r)
    target = forcing**2
    active = rs > target
    for _ in range(max_iter):
        if not bool(active.any()):
            break
        hp = prob.hvp(p, proba)
        alpha = torch.where(active, rs / torch.where(active, prob.dot(p, hp), 1.0), 0.0)
        x.add_(prob.expand(alpha) * p)
        r.sub_(prob.expand(alpha) * hp)
        rs_new = prob.dot(r, r)
        beta = torch.where(active, rs_new / torch.where(active, rs, 1.0), 0.0)
        p = torch.where(prob.expand(active), r + prob.expand(beta) * p, p)
        rs = torch.where(active, rs_new, rs)
        active = active & (rs > target)
    return x


def train_convex_heads(
    features: Tensor,
    labels: Tensor,
    *,
    masks: Tensor,
    num_classes: int,
    config: HeadConfig,
    tol: float = DEFAULT_TOL,
    max_iter: int = 100,
    max_cg: int = 500,
) -> ConvexFit:
    """Train ``B = len(masks)`` convex heads to ``||grad F_b|| <= tol`` with Newton-CG.

    Newton directions come from conjugate gradients on Hessian-vector products (inexact
    Newton, forcing term ``min(0.5, sqrt||g||) ||g||``: Nocedal & Wright, *Numerical
    Optimization*, 2nd ed., Algorithm 7.1), globalised by Armijo backtracking. Converged heads
    are frozen, so each head's result does not depend on the others in the batch. ``steps``
    and ``lr`` of ``config`` are unused.

    Args:
        features: (n, d) features (clipped to ``config.clip_radius`` here).
        labels: (n,) int64 labels.
        masks: (B, n) boolean; each row must select at least one example.
        num_classes: number of classes.
        config: must have ``kind="linear"``, ``l2 > 0`` and ``dtype="float64"``.
        tol: gradient-norm tolerance every head must reach.
        max_iter: Newton iterations before giving up.
        max_cg: conjugate-gradient iterations per Newton step.

    Returns:
        A :class:`ConvexFit`.

    Raises:
        ValueError: on a config that is not the convex head, bad shapes or an empty mask row.
        RuntimeError: if some head has not reached ``tol`` after ``max_iter`` iterations.
    """
    if config.kind != "linear" or not config.l2 > 0 or config.dtype != "float64":
        raise ValueError(
            f"the convex trainer needs kind='linear', l2 > 0 and dtype='float64'; got "
            f"kind={config.kind!r}, l2={config.l2!r}, dtype={config.dtype!r}"
        )
    tol = check_positive(tol, name="tol")
    check_head_inputs(features, labels, masks)
    device = features.device
    x = clip_features(features.to(torch.float64), config.clip_radius)
    y = labels.to(device=device, dtype=torch.long)
    prob = _Problem(x, y, masks.to(device=device), num_classes, config.l2)
    n_heads, d = masks.shape[0], x.shape[1]
    w = x.new_zeros(n_heads * num_classes, d + 1)
    value, proba = prob.value_and_proba(w)
    g = prob.grad(w, proba)
    gnorm = prob.dot(g, g).sqrt()
    iterations = 0
    while bool((gnorm > tol).any()):
        if iterations == max_iter:
            raise RuntimeError(
                f"Newton-CG did not reach tol={tol:g} in max_iter={max_iter} iterations: "
                f"largest gradient norm {float(gnorm.max()):.3g}"
            )
        iterations += 1
        # Converged heads get no CG work and a zero step: frozen, independent of the batch.
        forcing = torch.where(gnorm > tol, torch.clamp(gnorm.sqrt(), max=0.5) * gnorm, torch.inf)
        step = _cg(prob, g, proba, forcing, max_cg)
        slope = prob.dot(g, step)
        alpha = torch.ones_like(value)
        # A predicted decrease near float64 resolution of F makes the Armijo test noise:
        # there (the quadratic-convergence region) the full step is taken.
        tiny = -slope <= 1e-13 * value.abs().clamp_min(1.0)
        for _ in range(60):
            trial = w + prob.expand(alpha) * step
            new_value, new_proba = prob.value_and_proba(trial)
            ok = (new_value <= value + _ARMIJO * alpha * slope) | tiny
            if bool(ok.all()):
                break
            alpha = torch.where(ok, alpha, alpha / 2)
        else:
            raise RuntimeError("Newton-CG line search failed: the objective did not decrease")
        w, value, proba = trial, new_value, new_proba
        g = prob.grad(w, proba)
        gnorm = prob.dot(g, g).sqrt()
    w3 = w.view(n_heads, num_classes, d + 1)
    params = {"fc.weight": w3[..., :d].contiguous(), "fc.bias": w3[..., d].contiguous()}
    return ConvexFit(params=params, grad_norms=gnorm, tol=tol, iterations=iterations)
