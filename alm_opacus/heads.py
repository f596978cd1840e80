"""Fine-tuning heads on frozen features, trained deterministically.

Training is full-batch, so there is no data order: the same features, mask and seed
give bit-identical weights, which the sensitivity sampler (ALM paper, Algorithm 2)
relies on. Every trainer here is batched over *heads*: ``train_heads(..., masks=M)``
trains ``len(M)`` heads at once, head ``b`` on the rows where ``M[b]`` is true, all from
the same initialisation. ``train_head`` is the one-head case of the same code.

The objective of head ``b`` is

    F_b(w) = (1 / n_b) * sum_{i : M[b, i]} CE(f_w(clip_R(x_i)), y_i) + (l2 / 2) * ||w||_2^2

with ``clip_R(x) = x * min(1, R / ||x||)`` and ``||w||`` over all parameters (biases too).

Solvers are registered by name (:func:`register_solver`): ``"adam"`` and ``"gd"`` (plain
full-batch gradient descent, whose sensitivity :mod:`alm_opacus.sensitivity.stability` proves)
here, ``"newton"`` (the convex head trained to its minimiser) by
:mod:`alm_opacus.sensitivity.convex`, and ``"keras"`` (the ALM paper's minibatch recipe) by
:mod:`alm_opacus.paper_head`; :data:`SOLVERS` imports those on first use.
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from alm_opacus._validation import check_features_labels, check_positive
from alm_opacus.registry import Registry
from alm_opacus.steppers import STEPPERS

Params = dict[str, Tensor]
#: ``solve(features, labels, *, masks, num_classes, config, seed, init) -> Params``: batched
#: head training (see :func:`train_heads`).
HeadSolver = Callable[..., Params]
#: The solvers a :class:`HeadConfig` may name.
SOLVER_NAMES = ("adam", "gd", "keras", "newton")
#: Solvers this package registers in modules that import this one (name -> module).
_BUILTIN_SOLVERS = {
    "newton": "alm_opacus.sensitivity.convex",
    "keras": "alm_opacus.paper_head",
}


def _check_solver(name: str, _solver: object) -> None:
    """The registry's check on every registration: only the names of :data:`SOLVER_NAMES`."""
    if name not in SOLVER_NAMES:
        raise ValueError(f"solver name {name!r} is invalid: expected one of {SOLVER_NAMES}")


def _load_builtin_solvers() -> None:
    # Registered on import of their module, which imports this one; a process that has not
    # imported it yet (a Ray worker, or a lazy `import alm_opacus`) imports it here.
    for module in _BUILTIN_SOLVERS.values():
        importlib.import_module(module)


#: Batched head solvers by name (:data:`SOLVER_NAMES`).
SOLVERS: Registry[HeadSolver] = Registry("solver", check=_check_solver, load=_load_builtin_solvers)


def register_solver(name: str, *, force: bool = False) -> Callable[[HeadSolver], HeadSolver]:
    """Decorator registering a batched head solver under one of :data:`SOLVER_NAMES`.

    Raises:
        ValueError: when the decorator is applied, for a name outside :data:`SOLVER_NAMES`, or
            one taken (without ``force``).
    """
    return SOLVERS.register(name, force=force)


@dataclass(frozen=True)
class HeadConfig:
    """The fine-tuning recipe. The attacker is assumed to know it (see docs/threat_model.md).

    Attributes:
        kind: ``"linear"`` (multinomial logistic regression) or ``"mlp"`` (one hidden layer).
        hidden: width of the MLP's hidden layer.
        steps: number of full-batch optimiser steps.
        lr: the learning rate (Adam's, or gradient descent's step size ``eta``).
        l2: the L2 regularisation coefficient ``lambda`` of the objective (module docstring).
        clip_radius: ``R``; features are clipped to L2 norm at most ``R`` (None: no clipping).
        dtype: ``"float64"`` (default: neighbouring heads differ by tiny amounts, and float32
            rounding would pollute sampled sensitivities) or ``"float32"``.
        solver: ``"adam"`` (``steps`` full-batch Adam steps from a seeded initialisation),
            ``"gd"`` (``steps`` full-batch gradient-descent steps ``w -= lr * grad`` from the
            same initialisation: for a linear head, ``--sensitivity stability`` proves its
            sensitivity, docs/sensitivity.md) or ``"newton"`` (linear heads with ``l2 > 0``
            only: the objective is strongly convex and Newton-CG reaches its unique minimiser
            to a certified gradient norm, so a sampled sensitivity measures the influence of
            one row, not where Adam stopped), or ``"keras"`` (the ALM paper's recipe:
            ``steps`` epochs of minibatch Adam in Keras's form, :mod:`alm_opacus.paper_head`).
        batch_size: rows per minibatch of ``solver="keras"`` (None: its 525); the other
            solvers are full-batch and refuse one.
    """

    kind: str = "linear"
    hidden: int = 64
    steps: int = 1000
    lr: float = 0.1
    l2: float = 0.0
    clip_radius: float | None = None
    dtype: str = "float64"
    solver: str = "adam"
    batch_size: int | None = None

    def __post_init__(self) -> None:
        if self.kind not in _INITS:
            raise ValueError(f"kind={self.kind!r} is invalid: expected one of {sorted(_INITS)}")
        if self.steps < 1:
            raise ValueError(f"steps={self.steps!r} is invalid: expected an integer >= 1")
        check_positive(self.lr, name="lr")
        if not self.l2 >= 0:
            raise ValueError(f"l2={self.l2!r} is invalid: expected a number >= 0")
        if self.clip_radius is not None:
            check_positive(self.clip_radius, name="clip_radius")
        if self.dtype not in ("float32", "float64"):
            raise ValueError(f"dtype={self.dtype!r} is invalid: expected 'float32' or 'float64'")
        if self.solver not in SOLVER_NAMES:
            raise ValueError(f"solver={self.solver!r} is invalid: expected one of {SOLVER_NAMES}")
        if self.batch_size is not None and (
            self.solver != "keras" or isinstance(self.batch_size, bool) or self.batch_size < 1
        ):
            raise ValueError(
                f"batch_size={self.batch_size!r} is invalid with solver={self.solver!r}: "
                "expected None (full batch), or an integer >= 1 with solver='keras'"
            )
        if self.solver == "newton" and (
            self.kind != "linear" or not self.l2 > 0 or self.dtype != "float64"
        ):
            raise ValueError(
                "solver='newton' needs a strongly convex objective: kind='linear', l2 > 0 and "
                f"dtype='float64'; got kind={self.kind!r}, l2={self.l2!r}, dtype={self.dtype!r}"
            )

    @property
    def torch_dtype(self) -> torch.dtype:
        return torch.float64 if self.dtype == "float64" else torch.float32

    def replace(self, **changes: object) -> HeadConfig:
        return dataclasses.replace(self, **changes)  # type: ignore[arg-type]


def clip_features(features: Tensor, radius: float | None) -> Tensor:
    """Scale each row to L2 norm at most ``radius`` (rows already inside are unchanged)."""
    if radius is None:
        return features
    norms = features.norm(dim=-1, keepdim=True).clamp_min(1e-12)
    return features * (radius / norms).clamp(max=1.0)


# --- parameter layouts: names follow the nn.Module below, so state_dicts line up -------------


def uniform_init(
    shape: tuple[int, ...],
    *,
    fan_in: int,
    generator: torch.Generator,
    dtype: torch.dtype = torch.float32,
) -> Tensor:
    """``nn.Linear``'s default law, U(-1/sqrt(fan_in), 1/sqrt(fan_in)), from a seeded generator.

    The one initialiser of every head, shadow model and baseline network in the project.
    """
    bound = 1.0 / fan_in**0.5
    return (torch.rand(shape, generator=generator, dtype=dtype) * 2 - 1) * bound


def linear_init(
    sizes: dict[str, tuple[int, int]], *, generator: torch.Generator, dtype: torch.dtype
) -> Params:
    """``{name.weight, name.bias}`` for layers ``name -> (out, in)``, in the given order."""
    out: Params = {}
    for name, (rows, cols) in sizes.items():
        out[f"{name}.weight"] = uniform_init(
            (rows, cols), fan_in=cols, generator=generator, dtype=dtype
        )
        out[f"{name}.bias"] = uniform_init((rows,), fan_in=cols, generator=generator, dtype=dtype)
    return out


def _init_linear(d: int, c: int, config: HeadConfig, g: torch.Generator) -> Params:
    return linear_init({"fc": (c, d)}, generator=g, dtype=config.torch_dtype)


def _init_mlp(d: int, c: int, config: HeadConfig, g: torch.Generator) -> Params:
    h = config.hidden
    return linear_init({"fc1": (h, d), "fc2": (c, h)}, generator=g, dtype=config.torch_dtype)


def _logits_linear(p: Params, x: Tensor) -> Tensor:
    # p[...] carries a leading head dimension B; x is (n, d) shared or (B, n, d).
    return torch.matmul(x, p["fc.weight"].transpose(-1, -2)) + p["fc.bias"].unsqueeze(-2)


def _logits_mlp(p: Params, x: Tensor) -> Tensor:
    h = torch.relu(torch.matmul(x, p["fc1.weight"].transpose(-1, -2)) + p["fc1.bias"].unsqueeze(-2))
    return torch.matmul(h, p["fc2.weight"].transpose(-1, -2)) + p["fc2.bias"].unsqueeze(-2)


_INITS: dict[str, Callable[[int, int, HeadConfig, torch.Generator], Params]] = {
    "linear": _init_linear,
    "mlp": _init_mlp,
}
_LOGITS: dict[str, Callable[[Params, Tensor], Tensor]] = {
    "linear": _logits_linear,
    "mlp": _logits_mlp,
}


def batched_logits(
    params: Params, features: Tensor, *, config: HeadConfig, dtype: torch.dtype | None = None
) -> Tensor:
    """Logits of a batch of heads: ``params`` have a leading head dim ``B``; returns (B, n, C).

    ``dtype``: the features' dtype, which must be the parameters' (default: the recipe's).
    """
    x = clip_features(features.to(dtype or config.torch_dtype), config.clip_radius)
    return _LOGITS[config.kind](params, x)


def head_objective(
    params: Params, features: Tensor, labels: Tensor, masks: Tensor, *, config: HeadConfig
) -> Tensor:
    """Per-head objective ``F_b(w_b)`` of the module docstring, shape (B,). Pure function."""
    logits = batched_logits(params, features, config=config)
    ce = F.cross_entropy(
        logits.transpose(1, 2), labels.expand(logits.shape[0], -1), reduction="none"
    )
    w = masks.to(logits.dtype)
    data_term = (ce * w).sum(1) / w.sum(1)
    reg = sum(p.pow(2).flatten(1).sum(1) for p in params.values())
    return data_term + 0.5 * config.l2 * reg


def warm_start(
    features: Tensor, labels: Tensor, *, masks: Tensor, num_classes: int, config: HeadConfig
) -> Params | None:
    """A warm start for heads trained on parts of the rows that ``masks`` (B, n) select: the
    head on all of those rows (each part's minimiser is near it). ``None`` unless the solver
    reaches a unique minimiser from anywhere (``newton``), where a start changes only the cost.

    Returns:
        ``{"fc.weight": (C, d), "fc.bias": (C,)}``, or ``None``.
    """
    if config.solver != "newton":
        return None
    union = masks.to(torch.bool).any(0, keepdim=True)
    params = train_heads(
        features, labels, masks=union, num_classes=num_classes, config=config, seed=0
    )
    return {k: v[0] for k, v in params.items()}


def check_head_inputs(features: Tensor, labels: Tensor, masks: Tensor) -> None:
    """Shapes shared by every batched head trainer.

    Raises:
        ValueError: unless features are (n, d), labels (n,), masks (B, n) with no empty row.
    """
    check_features_labels(features, labels)
    if masks.ndim != 2 or masks.shape[1] != features.shape[0]:
        raise ValueError(f"masks must be (B, {features.shape[0]}); got {tuple(masks.shape)}")
    if masks.dtype != torch.bool and (masks.dtype.is_floating_point or bool((masks < 0).any())):
        raise ValueError(
            f"masks must be boolean or non-negative integer counts; got dtype {masks.dtype}"
        )
    if not bool(masks.any(1).all()):
        raise ValueError("every mask row must select at least one example")


def train_heads(
    features: Tensor,
    labels: Tensor,
    *,
    masks: Tensor,
    num_classes: int,
    config: HeadConfig,
    seed: int,
    init: Params | None = None,
) -> Params:
    """Train ``B = len(masks)`` heads at once, from one seeded initialisation.

    Head ``b`` sees exactly the rows where ``masks[b]`` is true. Adam's update is
    elementwise, so each head's trajectory is the one it would have alone, up to float64
    rounding. (Near a stationary point Adam divides by ``sqrt(v) ~ |grad|``, which
    amplifies rounding: implementations that sum in another order agree to ~1e-6 relative,
    not ~1e-15. Same inputs and seed always give the same bits.)

    Args:
        features: (n, d) features.
        labels: (n,) int64 labels.
        masks: (B, n) boolean, or integer counts (a row drawn k times weighs k: data sets
            drawn with replacement); each row must select at least one example.
        num_classes: number of output classes.
        config: the recipe.
        seed: seeds the initialisation (shared by all heads).
        init: a warm start for ``solver="newton"`` only (one start, or one per head): its
            objective has one minimiser, reached from anywhere, so a start changes the cost and
            not the result; Adam's result depends on where it starts, so it takes none.

    Returns:
        Parameters with a leading head dimension ``B``, detached.

    Raises:
        ValueError: on shape mismatches, an empty mask row, or ``init`` for a solver other
            than ``"newton"``.
    """
    check_head_inputs(features, labels, masks)
    if init is not None and config.solver != "newton":  # one minimiser: a start changes no result
        raise ValueError(
            f"init is for solver='newton': {config.solver!r} heads start from the seeded init"
        )
    solve = SOLVERS.get(config.solver)
    if solve is None:
        raise ValueError(
            f"solver {config.solver!r} is not registered: expected one of "
            f"{SOLVERS.names()}, or a solver registered with register_solver"
        )
    return solve(
        features, labels, masks=masks, num_classes=num_classes, config=config, seed=seed, init=init
    )


@register_solver("adam")
@register_solver("gd")
def _train_first_order(
    features: Tensor,
    labels: Tensor,
    *,
    masks: Tensor,
    num_classes: int,
    config: HeadConfig,
    seed: int,
    init: Params | None,
) -> Params:
    device = features.device
    x = features.to(config.torch_dtype)
    y = labels.to(device=device, dtype=torch.long)
    m = masks.to(device=device)  # boolean, or counts: a row present k times weighs k
    g = torch.Generator().manual_seed(int(seed))
    init = _INITS[config.kind](x.shape[1], num_classes, config, g)
    init = {k: v.to(device) for k, v in init.items()}
    if config.kind == "linear":
        return _train_linear(x, y, m, init, config)
    return _train_autograd(x, y, m, init, config)


def train_heads_autograd(
    features: Tensor,
    labels: Tensor,
    *,
    masks: Tensor,
    num_classes: int,
    config: HeadConfig,
    seed: int,
) -> Params:
    """:func:`train_heads` with gradients by autograd for every kind: the reference the
    closed-form linear path is tested and benchmarked against. Same arguments and result
    (up to float64 rounding)."""
    if masks.ndim != 2 or masks.shape[1] != features.shape[0] or not bool(masks.any(1).all()):
        raise ValueError(f"masks must be (B, {features.shape[0]}) with no empty row")
    g = torch.Generator().manual_seed(int(seed))
    x = features.to(config.torch_dtype)
    init = _INITS[config.kind](x.shape[1], num_classes, config, g)
    init = {k: v.to(features.device) for k, v in init.items()}
    y = labels.to(device=features.device, dtype=torch.long)
    return _train_autograd(x, y, masks.to(device=features.device, dtype=torch.bool), init, config)


def _train_autograd(x: Tensor, y: Tensor, m: Tensor, init: Params, config: HeadConfig) -> Params:
    """Generic path (any head kind): gradients of :func:`head_objective` by autograd."""
    n_heads = m.shape[0]
    x = clip_features(x, config.clip_radius)
    plain = config.replace(clip_radius=None)  # clipped once here, not at every step
    params = {
        k: v.unsqueeze(0).repeat(n_heads, *([1] * v.ndim)).requires_grad_(True)
        for k, v in init.items()
    }
    with torch.no_grad():
        steppers = {k: STEPPERS[config.solver](p, config.lr) for k, p in params.items()}
    for _ in range(config.steps):
        loss = head_objective(params, x, y, m, config=plain).sum()
        grads = torch.autograd.grad(loss, list(params.values()))
        with torch.no_grad():
            for k, grad in zip(params, grads, strict=True):
                steppers[k].step(grad)
    return {k: v.detach() for k, v in params.items()}


def _train_linear(x: Tensor, y: Tensor, m: Tensor, init: Params, config: HeadConfig) -> Params:
    """Linear heads with the closed-form gradient, no autograd.

    With the bias folded in as a constant feature, x~ = (x, 1) and W~ = [W, b], head b's
    gradient is ((softmax(W~ x~) - onehot(y)) * w_b)^T x~ + l2 * W~, w_b = masks[b] / n_b.
    All heads share x~, so the logits of every head come from one (B*C, d+1) @ (d+1, n)
    product and the gradients from one (B*C, n) @ (n, d+1) product: large GEMMs instead of
    B small ones. In the (B, C, n) layout the softmax reductions over C run along rows of
    n contiguous values (a (n, B, C) layout, reducing over 10 values at a time, was 4x slower).
    """
    n_heads, n = m.shape
    c, d = init["fc.weight"].shape
    xt = torch.cat([clip_features(x, config.clip_radius), x.new_ones(n, 1)], dim=1)
    xt_t = xt.t().contiguous()
    weight = m.to(x.dtype)
    weight = (weight / weight.sum(1, keepdim=True)).unsqueeze(1)  # (B, 1, n)
    onehot = F.one_hot(y, c).to(x.dtype).t().unsqueeze(0)  # (1, C, n)
    w = torch.cat([init["fc.weight"], init["fc.bias"].unsqueeze(1)], dim=1)
    w = w.unsqueeze(0).repeat(n_heads, 1, 1).reshape(n_heads * c, d + 1).contiguous()
    stepper = STEPPERS[config.solver](w, config.lr)
    for _ in range(config.steps):
        z = torch.mm(w, xt_t).view(n_heads, c, n)
        z.sub_(z.amax(1, keepdim=True)).exp_()
        z.div_(z.sum(1, keepdim=True)).sub_(onehot).mul_(weight)
        grad = torch.addmm(w, z.view(n_heads * c, n), xt, beta=config.l2)  # + l2 * w
        stepper.step(grad)
    w = w.view(n_heads, c, d + 1)
    return {"fc.weight": w[..., :d].contiguous(), "fc.bias": w[..., d].contiguous()}


class Head(nn.Module):
    """A trained head as a module: feature clipping, then a linear layer or a one-hidden MLP."""

    def __init__(self, *, in_features: int, num_classes: int, config: HeadConfig) -> None:
        super().__init__()
        self.config = config
        self.in_features = in_features
        self.num_classes = num_classes
        dt = config.torch_dtype
        if config.kind == "linear":
            self.fc = nn.Linear(in_features, num_classes, dtype=dt)
        else:
            self.fc1 = nn.Linear(in_features, config.hidden, dtype=dt)
            self.fc2 = nn.Linear(config.hidden, num_classes, dtype=dt)

    def forward(self, features: Tensor) -> Tensor:
        params = {k: v.unsqueeze(0) for k, v in self.named_parameters()}
        return batched_logits(params, features, config=self.config)[0]

    @torch.no_grad()
    def predict_proba(self, features: Tensor) -> Tensor:
        return torch.softmax(self(features), dim=-1)

    @classmethod
    def from_params(
        cls, params: Params, *, index: int = 0, num_classes: int, config: HeadConfig
    ) -> Head:
        """Build the module for head ``index`` of a batch returned by :func:`train_heads`."""
        first = next(iter(params.values()))
        key = "fc.weight" if config.kind == "linear" else "fc1.weight"
        head = cls(in_features=params[key].shape[-1], num_classes=num_classes, config=config)
        head.load_state_dict({k: v[index].clone() for k, v in params.items()})
        return head.to(first.device)


def train_head(
    features: Tensor, labels: Tensor, *, num_classes: int, config: HeadConfig, seed: int
) -> Head:
    """Train one head on all of ``features``. Deterministic: same inputs and seed, same bits."""
    masks = torch.ones(1, features.shape[0], dtype=torch.bool, device=features.device)
    params = train_heads(
        features, labels, masks=masks, num_classes=num_classes, config=config, seed=seed
    )
    return Head.from_params(params, num_classes=num_classes, config=config)


def flat_params(params: Params) -> Tensor:
    """Concatenate a batch of parameters into (B, P), in a fixed key order."""
    return torch.cat([params[k].flatten(1) for k in sorted(params)], dim=1)


def accuracy(proba: Tensor, labels: Tensor) -> float:
    """Top-1 accuracy of predicted probabilities (or logits)."""
    return float((proba.argmax(-1) == labels.to(proba.device)).double().mean())


def utility_loss(*, protected: float, unprotected: float) -> float:
    """ALM paper, Definition 6.1: ``1 - M(protected) / M(unprotected)``."""
    if unprotected <= 0:
        raise ValueError(f"unprotected={unprotected!r} is invalid: expected a metric > 0")
    return 1.0 - protected / unprotected
