"""The convex head trained to its exact minimiser: batched Newton-CG in float64.

The objective is the one in :mod:`alm_opacus.heads` for ``kind="linear"`` with ``l2 > 0``:
multinomial logistic regression on clipped features, L2-regularised over weights and biases,
hence ``l2``-strongly convex with a unique minimiser ``w*``. The trainer stops only once
``||grad F(w)||_2 <= tol`` holds for every head (else it raises), which is what lets
:func:`~alm_opacus.sensitivity.analytic.analytic_sensitivity` cover the weights actually
returned and not only ``w*``. It starts from zero (or a warm start), so no seed is involved.
It is the ``"newton"`` solver of :func:`alm_opacus.heads.train_heads`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor
from torch.nn import functional as F

from alm_opacus._validation import check_positive
from alm_opacus.heads import (
    HeadConfig,
    Params,
    check_head_inputs,
    clip_features,
    register_solver,
)

__all__ = [
    "DEFAULT_TOL",
    "ConvexFit",
    "FeatureBasis",
    "basis_peak_bytes",
    "feature_basis",
    "train_convex_heads",
]

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
        cg_steps: conjugate-gradient steps over all Newton iterations (each one
            Hessian-vector product of the heads still in the batch): the cost, with
            ``iterations``, in passes over the data.
    """

    params: Params
    grad_norms: Tensor
    tol: float
    iterations: int
    cg_steps: int = 0


class _Problem:
    """The batched objective, its gradient and Hessian-vector products.

    Weights are ``(B*C, d+1)`` with the bias as the last column and ``x~ = (x, 1)``. The value
    and gradient, which decide convergence, are float64; Hessian-vector products, which only
    steer conjugate gradients towards a Newton direction, are float32 (twice the speed): their
    relative error (~1e-6) stays below the forcing tolerance of every Newton step until the
    gradient is within a few orders of ``tol``, and a step that falls short costs one more
    iteration, never accuracy (the float64 gradient decides when to stop).
    """

    def __init__(self, xt: Tensor, y: Tensor, masks: Tensor, num_classes: int, l2: float) -> None:
        n = xt.shape[0]
        self.b, self.c, self.n, self.l2 = masks.shape[0], num_classes, n, l2
        self.xt = xt  # (n, d+1) float64: x~ = (x, 1)
        self.xt32 = self.xt.float()
        weight = masks.to(xt.dtype)
        self.weight = (weight / weight.sum(1, keepdim=True)).unsqueeze(1)  # (B, 1, n)
        self.weight32 = self.weight.float()
        self.onehot = F.one_hot(y, num_classes).to(xt.dtype).t().unsqueeze(0)  # (1, C, n)

    def subset(self, heads: Tensor) -> _Problem:
        """The problem of the heads ``heads`` (indices) only: shares the data, not the work."""
        sub = _Problem.__new__(_Problem)
        sub.__dict__.update(self.__dict__)
        sub.b, sub.weight, sub.weight32 = (
            int(heads.numel()),
            self.weight[heads],
            self.weight32[heads],
        )
        return sub

    def _logits(self, w: Tensor) -> Tensor:
        return torch.mm(w, self.xt.t()).view(self.b, self.c, self.n)

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

    def hvp(self, v: Tensor, proba32: Tensor) -> Tensor:
        """``H v`` at probabilities ``proba32`` (float32, (B, C, n)), in float32 (class doc)."""
        # The Hessian of CE in the logits is diag(p) - p p^T per row; chain through x~.
        z = torch.mm(v.float(), self.xt32.t()).view(self.b, self.c, self.n)
        s = proba32 * z
        t = (s - proba32 * s.sum(1, keepdim=True)) * self.weight32
        return torch.mm(t.view(-1, self.n), self.xt32).double() + self.l2 * v


@dataclass(frozen=True)
class FeatureBasis:
    """The eigendecomposition ``S = V diag(s) V^T`` of the clipped features' second moment
    ``S = mean_i x~_i x~_i^T`` (``x~ = (x, 1)``): the fixed factor of Newton-CG's
    preconditioner. It depends on the rows only, so every Newton-CG call on the same features
    (every chunk of a sampler) may share one (:func:`feature_basis`); plain data, a unit of
    work can carry it.

    Attributes:
        values: (d+1,) float64 eigenvalues ``s`` (clamped at 0).
        vectors: (d+1, d+1) float32 eigenvectors ``V`` (a preconditioner needs no more).
    """

    values: Tensor
    vectors: Tensor


def basis_peak_bytes(dim: int) -> int:
    """The memory :func:`feature_basis` needs at its peak for ``dim``-dimensional features.

    The second moment is a dense (d+1) x (d+1) float64 matrix, and its eigendecomposition
    holds the matrix, the eigenvectors and LAPACK's workspace (about 2 (d+1)^2 values) at
    once: about 4.5 such matrices measured, 5 counted here, whatever the number of rows. It
    cannot be chunked: the preconditioner is the full eigenbasis. A run refuses features whose
    basis would not fit before it writes anything (``run.harness.preflight``).

    Args:
        dim: the features' dimension d, >= 1.

    Returns:
        ``5 * 8 * (d + 1)**2`` bytes.
    """
    return 40 * (int(dim) + 1) ** 2


def feature_basis(features: Tensor, *, clip_radius: float | None) -> FeatureBasis:
    """The :class:`FeatureBasis` of ``features`` (n, d) clipped to ``clip_radius``."""
    return _basis(_augmented(features, clip_radius))


def _augmented(features: Tensor, clip_radius: float | None) -> Tensor:
    """``x~ = (x, 1)``, float64, of the clipped rows: (n, d+1)."""
    x = clip_features(features.to(torch.float64), clip_radius)
    return torch.cat([x, x.new_ones(x.shape[0], 1)], dim=1)


def _basis(xt: Tensor) -> FeatureBasis:
    values, vectors = torch.linalg.eigh(xt.t() @ xt / xt.shape[0])
    return FeatureBasis(values=values.clamp_min(0.0), vectors=vectors.float())


class _Kronecker:
    """The preconditioner ``M_b = A_b (x) S + l2 I`` of each head's Hessian.

    ``H_b = sum_i w_bi A(p_bi) (x) x~_i x~_i^T + l2 I`` with ``A(p) = diag(p) - p p^T``. Taking
    ``A_b = sum_i w_bi A(p_bi)`` (the head's own weighted mean, from its current probabilities)
    and ``S = mean_i x~_i x~_i^T`` (all rows, shared by every head) replaces the mean of a
    Kronecker product by the Kronecker product of the means: exact where ``A(p_i)`` does not
    vary with ``x_i`` (at ``w = 0`` for instance), and on trained heads a few times better
    conditioned than ``H_b`` alone would be than the identity (Martens & Grosse 2015 make the
    same approximation for K-FAC). Its inverse is two eigendecompositions: ``S = V s V^T``
    once, ``A_b = U_b a_b U_b^T`` per head and Newton step, and
    ``M_b^{-1} R = U_b [(U_b^T R V) / (a_b s^T + l2)] V^T``, a few (C, d+1) products.
    """

    def __init__(self, basis: FeatureBasis) -> None:
        self.s = basis.values
        self.v, self.v_t = basis.vectors, basis.vectors.t().contiguous()

    def at(self, proba: Tensor, prob: _Problem) -> _KroneckerAt:
        """The preconditioner of ``prob``'s heads at probabilities ``proba`` (B, C, n)."""
        wp = proba * prob.weight
        a = torch.diag_embed(wp.sum(-1)) - torch.bmm(wp, proba.transpose(1, 2))
        a_vals, a_vecs = torch.linalg.eigh(a)
        scale = a_vals.clamp_min(0.0).unsqueeze(-1) * self.s + prob.l2  # (B, C, d+1)
        return _KroneckerAt(self, a_vecs.float(), scale.float(), prob)


class _KroneckerAt:
    def __init__(self, base: _Kronecker, vecs: Tensor, scale: Tensor, prob: _Problem) -> None:
        self.base, self.vecs, self.scale, self.prob = base, vecs, scale, prob

    def solve(self, r: Tensor) -> Tensor:
        """``M_b^{-1} r_b`` for every head, (B*C, d+1)."""
        prob, base = self.prob, self.base
        t = torch.mm(r.float(), base.v).view(prob.b, prob.c, -1)  # (U^T R V): (R V), then U^T
        t = torch.bmm(self.vecs.transpose(1, 2), t) / self.scale
        return torch.mm(torch.bmm(self.vecs, t).view(prob.b * prob.c, -1), base.v_t).double()


def _cg(
    prob: _Problem,
    g: Tensor,
    proba: Tensor,
    forcing: Tensor,
    max_iter: int,
    precondition: _KroneckerAt,
) -> tuple[Tensor, int]:
    """Preconditioned conjugate gradients for ``H d = -g``; head b stops at
    ``||r_b|| <= forcing_b`` (Nocedal & Wright, Algorithm 5.3).

    Returns:
        ``(d, iterations)``.
    """
    proba = proba.float()
    x = torch.zeros_like(g)
    r = -g
    z = precondition.solve(r)
    p = z.clone()
    rz = prob.dot(r, z)
    target = forcing**2
    active = prob.dot(r, r) > target
    done = 0
    for done in range(1, max_iter + 1):
        if not bool(active.any()):
            done -= 1
            break
        hp = prob.hvp(p, proba)
        alpha = torch.where(active, rz / torch.where(active, prob.dot(p, hp), 1.0), 0.0)
        x.add_(prob.expand(alpha) * p)
        r.sub_(prob.expand(alpha) * hp)
        z = precondition.solve(r)
        rz_new = prob.dot(r, z)
        beta = torch.where(active, rz_new / torch.where(active, rz, 1.0), 0.0)
        p = torch.where(prob.expand(active), z + prob.expand(beta) * p, p)
        rz = torch.where(active, rz_new, rz)
        active = active & (prob.dot(r, r) > target)
    return x, done


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
    init: Params | None = None,
    basis: FeatureBasis | None = None,
) -> ConvexFit:
    """Train ``B = len(masks)`` convex heads to ``||grad F_b|| <= tol`` with Newton-CG.

    Newton directions come from preconditioned conjugate gradients on Hessian-vector products
    (inexact Newton, forcing term ``min(0.5, sqrt||g||) ||g||``: Nocedal & Wright, *Numerical
    Optimization*, 2nd ed., Algorithm 7.1), globalised by Armijo backtracking; the
    preconditioner is :class:`_Kronecker`. Converged heads are frozen and leave the batch, so
    each head's result does not depend on the others in it. ``steps`` and ``lr`` of ``config``
    are unused. The minimiser is unique, so where the iteration starts (``init``) changes the
    cost, not the result: every start ends within ``tol / l2`` of it.

    Args:
        features: (n, d) features (clipped to ``config.clip_radius`` here).
        labels: (n,) int64 labels.
        masks: (B, n) boolean, or non-negative integer counts (a row drawn k times weighs k);
            each row must select at least one example.
        num_classes: number of classes.
        config: must have ``kind="linear"``, ``l2 > 0`` and ``dtype="float64"``.
        tol: gradient-norm tolerance every head must reach.
        max_iter: Newton iterations before giving up.
        max_cg: conjugate-gradient iterations per Newton step.
        init: a warm start, ``{"fc.weight": (C, d) or (B, C, d), "fc.bias": (C,) or (B, C)}``
            (one start for every head, or one each); default zero.
        basis: :func:`feature_basis` of these features and clip radius, when the caller
            shares one across calls (default: computed here, a pass of n (d+1)^2).

    Returns:
        A :class:`ConvexFit`.

    Raises:
        ValueError: on a config that is not the convex head, bad shapes, an empty mask row or
            an ``init`` of the wrong shape.
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
    # x~ once, shared by the objective and the preconditioner's basis: each float64 copy is
    # n (d+1) values (400 MB at 10^5 rows of d = 512), and the basis used to make its own two.
    xt = _augmented(features, config.clip_radius)
    y = labels.to(device=device, dtype=torch.long)
    prob = _Problem(xt, y, masks.to(device=device), num_classes, config.l2)
    n_heads, d = masks.shape[0], xt.shape[1] - 1
    w = _start(init, n_heads=n_heads, num_classes=num_classes, d=d, like=xt)
    kronecker = _Kronecker(basis or _basis(xt))
    value, proba = prob.value_and_proba(w.view(-1, d + 1))
    g = prob.grad(w.view(-1, d + 1), proba).view(n_heads, num_classes, d + 1)
    gnorm = g.flatten(1).norm(dim=1)
    iterations = cg_steps = 0
    while bool((gnorm > tol).any()):
        if iterations == max_iter:
            raise RuntimeError(
                f"Newton-CG did not reach tol={tol:g} in max_iter={max_iter} iterations: "
                f"largest gradient norm {float(gnorm.max()):.3g}"
            )
        iterations += 1
        # Converged heads leave the batch: no work, and no effect on the others.
        heads = torch.nonzero(gnorm > tol).squeeze(1)
        sub = prob.subset(heads) if len(heads) < n_heads else prob
        w_a, g_a, proba_a = w[heads].view(-1, d + 1), g[heads].view(-1, d + 1), proba[heads]
        norm_a, value_a = gnorm[heads], value[heads]
        forcing = torch.clamp(norm_a.sqrt(), max=0.5) * norm_a
        step, used = _cg(sub, g_a, proba_a, forcing, max_cg, kronecker.at(proba_a, sub))
        cg_steps += used
        trial, value_a, proba_a = _line_search(sub, w_a, value_a, g_a, step)
        g_a = sub.grad(trial, proba_a)
        w[heads] = trial.view(-1, num_classes, d + 1)
        value[heads], proba[heads] = value_a, proba_a
        g[heads] = g_a.view(-1, num_classes, d + 1)
        gnorm[heads] = sub.dot(g_a, g_a).sqrt()
    params = {"fc.weight": w[..., :d].contiguous(), "fc.bias": w[..., d].contiguous()}
    return ConvexFit(
        params=params, grad_norms=gnorm, tol=tol, iterations=iterations, cg_steps=cg_steps
    )


def _start(init: Params | None, *, n_heads: int, num_classes: int, d: int, like: Tensor) -> Tensor:
    """The first iterate, (B, C, d+1): zero, or ``init`` (one start, or one per head)."""
    if init is None:
        return like.new_zeros(n_heads, num_classes, d + 1)
    weight, bias = init.get("fc.weight"), init.get("fc.bias")
    if (
        weight is None
        or bias is None
        or weight.shape[-2:] != (num_classes, d)
        or (
            bias.shape[-1:] != (num_classes,)
            or weight.ndim - bias.ndim != 1
            or weight.ndim not in (2, 3)
            or (weight.ndim == 3 and len(weight) != n_heads)
        )
    ):
        shapes = {k: tuple(v.shape) for k, v in init.items()}
        raise ValueError(
            f"init={shapes} is invalid: expected fc.weight ({num_classes}, {d}) and fc.bias "
            f"({num_classes},), or ({n_heads}, ...) of each"
        )
    start = torch.cat([weight, bias.unsqueeze(-1)], dim=-1).to(like)
    return start.expand(n_heads, num_classes, d + 1).clone()


def _line_search(
    prob: _Problem, w: Tensor, value: Tensor, g: Tensor, step: Tensor
) -> tuple[Tensor, Tensor, Tensor]:
    """Armijo backtracking per head: ``(w + alpha step, its value, its probabilities)``."""
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
            return trial, new_value, new_proba
        alpha = torch.where(ok, alpha, alpha / 2)
    raise RuntimeError("Newton-CG line search failed: the objective did not decrease")


@register_solver("newton")
def _newton(
    features: Tensor,
    labels: Tensor,
    *,
    masks: Tensor,
    num_classes: int,
    config: HeadConfig,
    seed: int,
    init: Params | None,
) -> Params:
    del seed  # one minimiser: nothing is drawn
    return train_convex_heads(
        features, labels, masks=masks, num_classes=num_classes, config=config, init=init
    ).params
