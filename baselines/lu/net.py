"""Lu et al.'s network, its convexified loss, and the per-query answer (their Algorithm 1)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor
from torch.nn import functional as F

from alm_opacus.mechanisms import NoiseGenerator, create_mechanism
from alm_opacus.mechanisms.exact import Grid, dequantize, discrete_noise, grid_for, quantize
from alm_opacus.mechanisms.sampling import SecureGenerator, uniform_open
from alm_opacus.plugin import (
    Params,
    check_features_labels,
    check_positive,
    clip_features,
    uniform_init,
)
from baselines._common import single_thread
from baselines.lu.chain import (
    LuBudget,
    LuSensitivity,
    _check_count,
    budget_split,
    default_weight_radius,
    lipschitz_bound,
    sensitivity_chain,
)

__all__ = [
    "LuConfig",
    "LuMechanism",
    "answer_grid",
    "convexified_loss",
    "exact_logits",
    "lu_logits",
    "lu_query",
    "network_chain",
    "noise_scale",
    "sample_categorical",
    "train_lu_net",
    "train_lu_nets",
]


def convexified_loss(losses: Tensor, masks: Tensor, *, alpha: float) -> Tensor:
    """``(1/alpha) ln((1/n_b) sum_{i in b} exp(alpha l_i))`` per head, computed stably (their
    Eq. 23).

    Args:
        losses: (B, n) per-example losses.
        masks: (B, n) boolean; head b averages over its true entries.
        alpha: tilt > 0 (alpha -> 0 gives the mean, alpha -> inf the max).

    Returns:
        (B,) values.
    """
    a = check_positive(alpha, name="alpha")
    tilted = torch.where(masks, a * losses, torch.full_like(losses, -math.inf))
    count = masks.sum(1).to(losses.dtype)
    return (torch.logsumexp(tilted, dim=1) - torch.log(count)) / a


@dataclass(frozen=True)
class LuConfig:
    """The network and its training (defaults: their architecture on our features).

    Attributes:
        hidden: hidden width (128 in the paper).
        l2: ``lambda`` of ``2 lambda ||W||^2``.
        alpha: the tilt of the convexified loss.
        steps: full-batch Adam steps.
        lr: Adam learning rate.
        clip_radius: features are clipped to this L2 norm.
        weight_radius: iterates are projected onto ``||W|| <= weight_radius``; None means
            :func:`~baselines.lu.chain.default_weight_radius`.
    """

    hidden: int = 128
    l2: float = 0.0005
    alpha: float = 1.0
    steps: int = 200
    lr: float = 0.01
    clip_radius: float = 1.0
    weight_radius: float | None = None

    def __post_init__(self) -> None:
        _check_count(self.hidden, "hidden")
        _check_count(self.steps, "steps")
        for name in ("l2", "alpha", "lr", "clip_radius"):
            check_positive(getattr(self, name), name=name)
        if self.weight_radius is not None:
            check_positive(self.weight_radius, name="weight_radius")

    def radius(self, num_classes: int) -> float:
        """``B``: the weight ball the training projects onto."""
        if self.weight_radius is not None:
            return self.weight_radius
        return default_weight_radius(l2=self.l2, num_classes=num_classes)


def network_chain(config: LuConfig, *, n: int, d: int, num_classes: int) -> LuSensitivity:
    """The chain the method calibrates with: our proven rho on the config's ball, then the
    paper's Eq. 18 and Eq. 19 (see :mod:`baselines.lu.chain`)."""
    rho = lipschitz_bound(
        hidden=config.hidden,
        weight_radius=config.radius(num_classes),
        clip_radius=config.clip_radius,
    )
    return sensitivity_chain(
        lipschitz=rho, n=n, l2=config.l2, input_dim=d, hidden=config.hidden, num_classes=num_classes
    )


def lu_logits(params: Params, x: Tensor) -> Tensor:
    """Logits of a batch of networks: ``x`` (q, d) shared by the B heads; returns (B, q, C)."""
    h = torch.sigmoid(torch.matmul(x, params["fc1.weight"].transpose(-1, -2)))
    return torch.matmul(h, params["fc2.weight"].transpose(-1, -2))


def train_lu_nets(
    features: Tensor,
    labels: Tensor,
    *,
    masks: Tensor,
    num_classes: int,
    config: LuConfig,
    seed: int,
    dtype: torch.dtype = torch.float64,
) -> Params:
    """Train ``B = len(masks)`` bias-free sigmoid networks on the convexified loss at once.

    Full-batch Adam, then projection of each head's weights onto the ball of radius
    ``config.radius(C)``, so the Lipschitz bound of
    :func:`~baselines.lu.chain.lipschitz_bound` holds at every iterate. Deterministic for a
    given seed.

    Args:
        features: (n, d).
        labels: (n,).
        masks: (B, n) boolean, no empty row.
        num_classes: ``C``.
        config: the recipe.
        seed: seeds the initialisation (shared by the heads).
        dtype: the arithmetic; the weights are returned in float64 either way. The released
            network trains in float64; the adaptive attacker's shadows in float32.

    Returns:
        ``{"fc1.weight": (B, H, d), "fc2.weight": (B, C, H)}``, float64.

    Raises:
        ValueError: on bad shapes or an empty mask row.
    """
    check_features_labels(features, labels)
    if masks.ndim != 2 or masks.shape[1] != features.shape[0] or not bool(masks.any(1).all()):
        raise ValueError(f"masks must be (B, {features.shape[0]}) with no empty row")
    n_heads, d, hdim = masks.shape[0], features.shape[1], config.hidden
    device, dt = features.device, dtype
    x = clip_features(features.to(dt), config.clip_radius)
    m = masks.to(device=device, dtype=torch.bool)
    g = torch.Generator().manual_seed(int(seed))
    w1 = uniform_init((hdim, d), fan_in=d, generator=g, dtype=torch.float64).to(dt)
    w2 = uniform_init((num_classes, hdim), fan_in=hdim, generator=g, dtype=torch.float64).to(dt)
    params = {
        "fc1.weight": w1.to(device).unsqueeze(0).repeat(n_heads, 1, 1).requires_grad_(True),
        "fc2.weight": w2.to(device).unsqueeze(0).repeat(n_heads, 1, 1).requires_grad_(True),
    }
    targets = labels.to(device=device, dtype=torch.long).unsqueeze(0).expand(n_heads, -1)
    sizes = m.sum(1)
    if bool((sizes == sizes[0]).all()):  # equal sizes: compute on each head's own rows only
        rows = torch.argsort((~m).to(torch.int8), dim=1, stable=True)[:, : int(sizes[0])]
        x, targets = x[rows], torch.gather(targets, 1, rows)  # (B, k, d), (B, k)
        m = torch.ones_like(rows, dtype=torch.bool)
    with single_thread():
        _adam_on_the_ball(params, x, targets, m, config=config, radius=config.radius(num_classes))
    return {k: v.detach().to(torch.float64) for k, v in params.items()}


def _adam_on_the_ball(
    params: Params,
    x: Tensor,
    targets: Tensor,
    masks: Tensor,
    *,
    config: LuConfig,
    radius: float,
) -> None:
    opt = torch.optim.Adam(list(params.values()), lr=config.lr)
    w1, w2 = params["fc1.weight"], params["fc2.weight"]
    onehot = F.one_hot(targets, w2.shape[1]).to(x.dtype)  # (B, n, C)
    for _ in range(config.steps):
        with torch.no_grad():
            w1.grad, w2.grad = _gradients(w1, w2, x, onehot, masks, config=config)
        opt.step()
        with torch.no_grad():
            norm = torch.stack([p.pow(2).flatten(1).sum(1) for p in params.values()]).sum(0)
            scale = (radius / norm.sqrt().clamp_min(1e-300)).clamp(max=1.0)
            for p in params.values():
                p.mul_(scale.view(-1, 1, 1))


def _gradients(
    w1: Tensor, w2: Tensor, x: Tensor, onehot: Tensor, masks: Tensor, *, config: LuConfig
) -> tuple[Tensor, Tensor]:
    """The convexified objective's gradient in closed form (no autograd: the nets are tiny and
    autograd's bookkeeping dominated the adaptive attacker's cost).

    With ``l_i`` the cross-entropy of example i, the tilted loss's gradient is
    ``sum_i pi_i grad l_i``, ``pi = softmax(alpha l)`` over the head's examples; for
    ``z = W2 h``, ``h = sigmoid(W1 x)``: ``dz = pi (p - e_y)``, ``dW2 = dz^T h``,
    ``dW1 = ((dz W2) h (1 - h))^T x``; the regulariser ``2 lambda ||W||^2`` adds ``4 lambda W``.
    """
    h = torch.sigmoid(torch.matmul(x, w1.transpose(-1, -2)))  # (B, n, H)
    z = torch.matmul(h, w2.transpose(-1, -2))  # (B, n, C)
    logp = torch.log_softmax(z, dim=-1)
    ce = -(logp * onehot).sum(-1)  # (B, n)
    tilted = torch.where(masks, config.alpha * ce, torch.full_like(ce, -math.inf))
    pi = torch.softmax(tilted, dim=1)  # (B, n); zero off the mask
    dz = pi.unsqueeze(-1) * (logp.exp() - onehot)  # (B, n, C)
    grad2 = torch.matmul(dz.transpose(-1, -2), h) + 4 * config.l2 * w2
    da = torch.matmul(dz, w2) * h * (1 - h)  # (B, n, H)
    grad1 = torch.matmul(da.transpose(-1, -2), x) + 4 * config.l2 * w1
    return grad1, grad2


def sample_categorical(weights: Tensor, *, generator: NoiseGenerator) -> Tensor:
    """One index per row of ``weights`` (R, C), drawn with probability proportional to it.

    A seeded ``torch.Generator`` goes through ``torch.multinomial`` (so seeded runs repeat
    earlier ones); a :class:`SecureGenerator` through the inverse CDF of a uniform from its
    AES-CTR keystream (keyed from ``os.urandom``).

    Returns:
        (R, 1) int64 indices.
    """
    if not isinstance(generator, SecureGenerator):
        return torch.multinomial(weights, 1, generator=generator)
    cdf = torch.cumsum(weights.to(torch.float64), dim=-1)
    u = uniform_open((weights.shape[0], 1), generator=generator).to(cdf.device) * cdf[:, -1:]
    index = torch.searchsorted(cdf, u, right=True)
    return index.clamp(max=weights.shape[-1] - 1)


def noise_scale(*, chain: LuSensitivity, budget: LuBudget, noise: str) -> float:
    """The scale of the noise on the selected logit: ``Delta_z_T`` at ``budget.logit``."""
    mech = create_mechanism(noise)
    return mech.calibrate(epsilon=budget.logit, delta=budget.delta, sensitivity=chain.delta_z)


def lu_query(
    params: Params,
    x: Tensor,
    *,
    chain: LuSensitivity,
    budget: LuBudget,
    noise: str,
    clip_radius: float,
    generator: NoiseGenerator,
    exact: bool = True,
) -> Tensor:
    """Answer queries the paper's way (their Algorithm 1): per query, sample T by the
    exponential mechanism on the softmax outputs, add noise to logit T only, return the
    softmax.

    With ``exact`` (the default) the noisy logit is released on a grid with exact noise
    (:func:`exact_logits`); otherwise floating-point noise is added to logit T (no guarantee
    on the floats: Mironov 2012).

    Args:
        params: a batch of B networks (from :func:`train_lu_nets`).
        x: (q, d) queries, each answered with fresh randomness.
        chain: the sensitivities.
        budget: the split.
        noise: ``"laplace"`` or ``"gaussian"``.
        clip_radius: features are clipped to this norm, as in training.
        generator: randomness (seeded or secure); advances with every call.
        exact: grid release of the noisy logit (default) or floating-point noise.

    Returns:
        (B, q, C) probabilities.
    """
    with torch.no_grad():
        z = lu_logits(params, clip_features(x.to(torch.float64), clip_radius))
        b, q, c = z.shape
        p = torch.softmax(z, dim=-1)
        # McSherry & Talwar (2007): Pr[T = i] proportional to exp(eps_sel * u_i / (2 Delta_u)).
        weights = torch.softmax(budget.selection * p / (2.0 * chain.delta_p), dim=-1)
        t = sample_categorical(weights.reshape(b * q, c), generator=generator).view(b, q, 1)
        scale = noise_scale(chain=chain, budget=budget, noise=noise)
        t = t.to(z.device)
        if exact:
            return torch.softmax(
                exact_logits(
                    z,
                    t,
                    noise=noise,
                    scale=scale,
                    grid=answer_grid(scale=scale, noise=noise),
                    generator=generator,
                ),
                dim=-1,
            )
        eta = create_mechanism(noise).sample((b, q, 1), scale=scale, generator=generator)
        return torch.softmax(z.scatter_add(-1, t, eta.to(z)), dim=-1)


def answer_grid(*, scale: float, noise: str) -> Grid:
    """The grid of the noisy logit: γ ≤ scale·2⁻⁷ (float64 range), so rounding is far below
    the noise, and a C = 2 sensitivity S ≥ scale inflates by at most 2⁻⁷ (S + γ)."""
    return grid_for(sensitivity=scale, norm=create_mechanism(noise).norm, dim=1)


def exact_logits(
    z: Tensor, t: Tensor, *, noise: str, scale: float, grid: Grid, generator: NoiseGenerator
) -> Tensor:
    """Logits whose softmax is the exact answer: logit T released as γ·(round(·/γ) + K), K the
    exact grid-rounded noise (``alm_opacus.mechanisms.exact``).

    * C = 2: N = round(clamp_B(z_T − z_other)/γ) + K and the logits are (γ·s_T·N, 0) with
      s_T = +1 for T = 0, −1 for T = 1. Rounding and clamping are odd and K is symmetric, so
      s_T·N has the law of round(clamp_B(z_1 − z_2)/γ) + K whatever T is: the answer is a
      function of that grid value only (the real-valued proof's bijection, on the grid).
    * C ≥ 3: z_T is replaced by γ·(round(clamp_B(z_T)/γ) + K); the other logits are released
      as they are, so no guarantee holds anyway (``docs/baselines.md``, "Gaps").

    Args:
        z: (B, q, C) float64 logits.
        t: (B, q, 1) int64 selected indices, on ``z``'s device.
        noise: ``"laplace"`` or ``"gaussian"``.
        scale: the continuous noise scale.
        grid: :func:`answer_grid`.
        generator: randomness for K.

    Returns:
        (B, q, C) float64 logits.
    """
    selected = z.gather(-1, t)
    k = discrete_noise(tuple(t.shape), mechanism=noise, scale=scale, grid=grid, generator=generator)
    if z.shape[-1] == 2:
        other = z.gather(-1, 1 - t)
        sign = (1 - 2 * t).cpu()
        cells = (quantize(selected - other, grid=grid) + k) * sign
        logit = dequantize(cells, grid=grid, dtype=torch.float64).to(z.device)
        return torch.cat([logit, torch.zeros_like(logit)], dim=-1)
    cells = quantize(selected, grid=grid) + k
    return z.scatter(-1, t, dequantize(cells, grid=grid, dtype=torch.float64).to(z))


def train_lu_net(
    features: Tensor, labels: Tensor, *, num_classes: int, config: LuConfig, seed: int
) -> Params:
    """One network on every row: :func:`train_lu_nets` with a single all-true mask."""
    ones = torch.ones(1, len(labels), dtype=torch.bool, device=features.device)
    return train_lu_nets(
        features,
        labels.to(features.device),
        masks=ones,
        num_classes=num_classes,
        config=config,
        seed=seed,
    )


@dataclass(frozen=True)
class LuMechanism:
    """How answers are drawn at one epsilon: the chain, the paper's budget split, the noise.

    Attributes:
        chain: the sensitivities the noise is calibrated to.
        budget: the per-query split of the target epsilon.
        noise: ``"laplace"`` or ``"gaussian"``.
        clip_radius: queries are clipped to this norm, as in training.
        exact: noisy logit on a grid with exact noise (default); False: floating-point
            noise, whose statement is ``none``.
    """

    chain: LuSensitivity
    budget: LuBudget
    noise: str
    clip_radius: float
    exact: bool = True

    @classmethod
    def build(
        cls,
        config: LuConfig,
        *,
        n: int,
        d: int,
        num_classes: int,
        epsilon: float,
        delta: float,
        noise: str,
        exact: bool = True,
    ) -> LuMechanism:
        """The mechanism of a network trained with ``config`` on ``n`` rows of dimension ``d``."""
        return cls(
            chain=network_chain(config, n=n, d=d, num_classes=num_classes),
            budget=budget_split(epsilon=epsilon, num_classes=num_classes, noise=noise, delta=delta),
            noise=noise,
            clip_radius=config.clip_radius,
            exact=exact,
        )

    @property
    def scale(self) -> float:
        """The scale of the noise on the selected logit."""
        return noise_scale(chain=self.chain, budget=self.budget, noise=self.noise)

    @property
    def grid(self) -> Grid | None:
        """The grid of the noisy logit (``None`` for floating-point noise)."""
        return answer_grid(scale=self.scale, noise=self.noise) if self.exact else None

    def answer(self, params: Params, x: Tensor, *, generator: NoiseGenerator) -> Tensor:
        """:func:`lu_query` with this mechanism: (B, q, C) probabilities."""
        return lu_query(
            params,
            x,
            chain=self.chain,
            budget=self.budget,
            noise=self.noise,
            clip_radius=self.clip_radius,
            generator=generator,
            exact=self.exact,
        )
