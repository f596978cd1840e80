"""DP-SGD on many linear heads at once: the adaptive attacker's shadow heads.

The victim trains through Opacus (:mod:`baselines.dpsgd.loop`); the attacker needs dozens of
heads trained the same way, which this batched re-implementation of Opacus's algorithm gives
in one loop (equal to Opacus's run to 1e-12 at sigma = 0 and q = 1; tested). The noise
mechanism is a parameter: Gaussian with L2 clipping (``dpsgd``), or logistic / Laplace with
L1 clipping and noise from ``alm_opacus.mechanisms`` (``dpsgd-alm``, ``dpsgd-laplace``, as
``alm_opacus.training.MechanismDPOptimizer`` does).
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import Tensor
from torch.nn import functional as F

from alm_opacus.mechanisms import AdditiveNoiseMechanism
from alm_opacus.mechanisms.jit import NUMBA, jit_uncontracted
from alm_opacus.methods import Predict, ShadowTrainer
from alm_opacus.plugin import SHADOW_DTYPE, HeadConfig, Params, clip_features
from alm_opacus.training import training_mechanism
from alm_opacus.training.clipping import CLIP_NORM_ORDERS
from baselines._common import derive_seed
from baselines.dpsgd.config import DPSGDConfig, sample_rate_for, steps_per_epoch
from baselines.dpsgd.head import init_params

__all__ = ["dpsgd_linear_heads", "dpsgd_shadow_trainer"]


def _check_masks(masks: Tensor, n: int) -> int:
    sizes = masks.sum(1)
    if masks.ndim != 2 or masks.shape[1] != n or not bool((sizes == sizes[0]).all()):
        raise ValueError("masks must be (B, n) with the same number of rows selected in each")
    return int(sizes[0])


def dpsgd_linear_heads(
    features: Tensor,
    labels: Tensor,
    *,
    masks: Tensor,
    num_classes: int,
    head: HeadConfig,
    config: DPSGDConfig,
    sigma: float,
    seed: int,
    sample_rate: float | None = None,
    mechanism: str = "gaussian",
    noise_seed: int | None = None,
    noise_sensitivity: float | None = None,
    dtype: torch.dtype = torch.float64,
) -> Params:
    """DP-SGD on ``B = len(masks)`` linear heads at once: Opacus's algorithm, batched.

    Head ``b`` trains on the rows where ``masks[b]`` holds, exactly as
    :func:`~baselines.dpsgd.head.train_dpsgd_head` would: the same initialisation law,
    Poisson sampling at ``1 / ceil(n_b / batch_size)``, flat clipping with Opacus's factor
    ``min(1, C / (||g_i|| + 1e-6))``, noise ``N(0, (sigma C)^2)`` on the clipped sum, and
    division by Opacus's expected batch size ``int(n_b q)``. For a linear head the
    per-example gradient is the rank-one ``(p_i - e_{y_i}) x~_i^T``, so its L1 or L2 norm is
    ``||p_i - e_{y_i}|| ||x~_i||`` in that norm (an outer product's entrywise Lp norm is the
    product of its factors' Lp norms) and no per-example tensor is formed. With ``alm`` or
    ``laplace`` the clipping is in L1 and the noise is that mechanism's at scale ``sigma C``
    (``MechanismDPOptimizer``'s step). Used for the
    adaptive attacker's shadow heads and for scoring tuning candidates on public data
    (cheap), not for the victim (which runs Opacus).

    Args:
        features: (n, d).
        labels: (n,).
        masks: (B, n) boolean; all rows must select the same number ``n_b`` of examples.
        num_classes: ``C``.
        head: must have ``kind="linear"``.
        config: the recipe.
        sigma: the noise multiplier.
        seed: seeds initialisation (shared), Poisson sampling and noise.
        sample_rate: Poisson rate q; default ``1 / ceil(n_b / batch_size)`` as Opacus derives
            it. Steps are ``epochs * int(1 / q)``.
        mechanism: ``"gaussian"`` (L2 clipping), ``"alm"`` or ``"laplace"`` (L1 clipping).
        noise_seed: seeds Poisson sampling and noise apart from the initialisation (default:
            derived from ``seed``).
        noise_sensitivity: Δ', the noise scale is ``sigma Δ'`` (default: the clip ``C``, as
            Opacus's float step; an exact step's grid-rounded clip to match its scale).
        dtype: the arithmetic (default float64, which the equality tests with Opacus need;
            the attacker's shadows use float32, see :func:`dpsgd_shadow_trainer`).

    Returns:
        ``{"fc.weight": (B, C, d), "fc.bias": (B, C)}`` in ``dtype``.

    Raises:
        ValueError: for a non-linear head, masks of unequal sizes or an unknown mechanism.
    """
    noise_law = training_mechanism(mechanism)
    order = CLIP_NORM_ORDERS[noise_law.norm]
    if head.kind != "linear":
        raise ValueError(f"head.kind={head.kind!r}: the batched DP-SGD supports 'linear' only")
    n_b = _check_masks(masks, int(features.shape[0]))
    n_heads, (n, d), dev, dt = masks.shape[0], features.shape, features.device, dtype
    x = clip_features(features.to(dt), head.clip_radius)
    xt = torch.cat([x, x.new_ones(n, 1)], dim=1)  # (n, d+1)
    xnorm = xt.norm(order, dim=1)  # (n,)
    onehot = F.one_hot(labels.long(), num_classes).to(dt).t()  # (C, n)
    init = init_params(d=d, num_classes=num_classes, head=head.replace(dtype="float64"), seed=seed)
    w = torch.cat([init["fc.weight"], init["fc.bias"].unsqueeze(1)], dim=1).to(dt)
    w = w.unsqueeze(0).repeat(n_heads, 1, 1).to(dev)  # (B, C, d+1)
    q = sample_rate_for(n=n_b, batch_size=config.batch_size) if sample_rate is None else sample_rate
    expected = max(1, int(n_b * q))
    stream = derive_seed("shadow-dpsgd", seed) if noise_seed is None else noise_seed
    g = torch.Generator(device=dev).manual_seed(stream)
    member = masks.to(device=dev, dtype=torch.bool).nonzero()[:, 1].view(n_heads, n_b)
    clip = config.max_grad_norm
    scale = sigma * (clip if noise_sensitivity is None else noise_sensitivity)
    # The gathered batch (B x L x (d+1) floats, 150 MB at 128 heads of 25,000 rows and d =
    # 512) goes into one buffer kept across steps: a fresh tensor of that size is fresh
    # pages from the kernel each step, and faulting them in cost more than the matmuls.
    buffer = torch.empty(0, d + 1, dtype=dt, device=dev)
    for _ in range(config.epochs * steps_per_epoch(q)):
        # Each step touches its Poisson batch only (O(batch), not O(n): a pass over all n
        # rows per step made the run quadratic in n), gathered per head and padded.
        rows, valid = _poisson_batches(n_heads, n_b, q, generator=g)
        idx = torch.gather(member, 1, rows)  # (B, L) row numbers
        if buffer.shape[0] < idx.numel():
            buffer = torch.empty(idx.numel(), d + 1, dtype=dt, device=dev)
        gathered = buffer[: idx.numel()]
        torch.index_select(xt, 0, idx.reshape(-1), out=gathered)
        xb = gathered.view(n_heads, -1, d + 1)  # (B, L, d+1): xt[idx], the same values
        r = torch.softmax(torch.bmm(w, xb.transpose(1, 2)), dim=1) - onehot[:, idx].transpose(0, 1)
        factor = (clip / (_class_norms(r, order) * xnorm[idx] + 1e-6)).clamp(max=1.0) * valid.to(dt)
        grad = torch.bmm(r * factor.unsqueeze(1), xb)  # (B, C, d+1)
        grad += _noise(noise_law, w.shape, scale=scale, generator=g, dtype=dt)
        w = w - config.lr * grad / expected
    return {"fc.weight": w[..., :d].contiguous(), "fc.bias": w[..., d].contiguous()}


def _class_norms(r: Tensor, order: float) -> Tensor:
    """``r.norm(order, dim=1)`` of a (B, C, L) tensor: for float32 on the CPU compiled
    (`_float32_norms`), elsewhere torch's. torch's strided reduction took 0.9 ms of a 6 ms
    step of 16 heads at 10^4 members; the kernel takes 0.03 ms."""
    if r.dtype != torch.float32 or r.device.type != "cpu" or NUMBA is None:
        return r.norm(order, dim=1)
    out = torch.empty((r.shape[0], r.shape[2]), dtype=torch.float32)
    _float32_norms(r.contiguous().numpy(), int(order), out.numpy())
    return out


@jit_uncontracted
def _float32_norms(r: np.ndarray, order: int, out: np.ndarray) -> None:
    """out[b, l] = ‖r[b, :, l]‖ in L1 (``order`` 1) or L2: float32 terms (|x|, or x·x rounded
    once) added in float32 in class order, then for L2 the square root in float64 rounded to
    float32, i.e. the correctly rounded float32 root. That is how torch 2.x's CPU reduction
    over a strided dimension adds (each output a vector lane running through the classes):
    where L > 1, the norms were torch's bit for bit on every case tried here."""
    heads, classes, length = r.shape
    for b in range(heads):
        acc = out[b]
        acc[:] = np.float32(0.0)
        for c in range(classes):
            row = r[b, c]
            if order == 1:
                for j in range(length):
                    acc[j] += abs(row[j])
            else:
                for j in range(length):
                    acc[j] += row[j] * row[j]
        if order != 1:
            for j in range(length):
                acc[j] = np.float32(np.sqrt(np.float64(acc[j])))


def _poisson_batches(
    heads: int, rows: int, rate: float, *, generator: torch.Generator
) -> tuple[Tensor, Tensor]:
    """Poisson sampling of ``rows`` rows at ``rate`` for each head, in O(batch) work.

    Each row is taken independently with probability ``rate``: the gaps between taken rows are
    i.i.d. geometric, ``1 + floor(log U / log(1 - rate))`` for uniform ``U`` (the inverse of
    the geometric law's CDF), so only as many draws as taken rows (and a margin) are made.

    Returns:
        ``(positions, valid)``: (B, L) positions in ``range(rows)``, padded with 0 where
        ``valid`` (a (B, L) float 0/1 mask) is 0.
    """
    dev = generator.device
    if rate >= 1.0:
        everything = torch.arange(rows, device=dev).expand(heads, rows)
        return everything, torch.ones(heads, rows, dtype=torch.float64, device=dev)
    log_keep = math.log1p(-rate)
    width = int(rows * rate + 6 * math.sqrt(rows * rate) + 16)
    gaps = torch.empty(heads, 0, dtype=torch.int64, device=dev)
    while gaps.shape[1] == 0 or bool((gaps.sum(1) < rows).any()):  # until every head passed
        u = torch.rand(heads, width, generator=generator, device=dev, dtype=torch.float64)
        more = 1 + torch.floor(torch.log(u) / log_keep).clamp(max=rows).to(torch.int64)
        gaps = torch.cat([gaps, more], dim=1)
    positions = gaps.cumsum(1) - 1
    taken = positions < rows
    length = max(1, int(taken.sum(1).max()))
    positions, taken = positions[:, :length], taken[:, :length]
    return torch.where(taken, positions, 0), taken.to(torch.float64)


def _noise(
    law: AdditiveNoiseMechanism,
    shape: torch.Size,
    *,
    scale: float,
    generator: torch.Generator,
    dtype: torch.dtype,
) -> Tensor:
    dev = generator.device
    if law.name == "gaussian":  # torch's normal sampler, as the shadows have always drawn it
        return scale * torch.randn(shape, generator=generator, device=dev, dtype=dtype)
    if scale == 0.0:  # sigma = 0 (tests): the mechanism's sampler needs a positive scale
        return torch.zeros(shape, dtype=dtype, device=dev)
    return law.sample(tuple(shape), scale=scale, generator=generator, dtype=dtype).to(dev)


def _grouped_heads(
    features: Tensor,
    labels: Tensor,
    *,
    masks: Tensor,
    seed: int,
    num_classes: int,
    head: HeadConfig,
    config: DPSGDConfig,
    sigma: float,
    sample_rate: float,
    mechanism: str,
) -> Params:
    # Heads are grouped by size only because the batched trainer needs equal sizes.
    sizes = masks.sum(1)
    parts: list[tuple[Tensor, Params]] = []
    for size in sorted({int(s) for s in sizes}):
        rows = (sizes == size).nonzero().flatten()
        # the caller's threads: one in a small run's cells, every core in a large one's
        params = dpsgd_linear_heads(
            features,
            labels,
            masks=masks[rows],
            num_classes=num_classes,
            head=head,
            config=config,
            sigma=sigma,
            seed=seed,
            sample_rate=sample_rate,
            mechanism=mechanism,
            dtype=SHADOW_DTYPE,
        )
        parts.append((rows, params))
    out = {
        k: torch.empty((len(masks), *v.shape[1:]), dtype=v.dtype, device=v.device)
        for k, v in parts[0][1].items()
    }
    for rows, params in parts:
        for k, v in params.items():
            out[k][rows.to(v.device)] = v
    return out


def dpsgd_shadow_trainer(
    *,
    head: HeadConfig,
    num_classes: int,
    config: DPSGDConfig,
    sigma: float,
    sample_rate: float,
    mechanism: str = "gaussian",
) -> ShadowTrainer:
    """The adaptive attacker of a DP-SGD head: shadow heads trained with the victim's recipe,
    noise mechanism, noise multiplier, Poisson rate and step count (a shadow set of the
    members' size is then trained exactly like the victim; other sizes keep the victim's
    per-step noise and rate).

    Raises:
        ValueError: for a non-linear head (use the plain attacker there) or an unknown
            mechanism.
    """
    training_mechanism(mechanism)  # a bad name fails here, not in the attack
    if head.kind != "linear":
        raise ValueError(f"head.kind={head.kind!r}: the DP-SGD shadow trainer is for 'linear'")

    def trainer(features: Tensor, labels: Tensor, masks: Tensor, seed: int) -> Predict:
        params = _grouped_heads(
            features,
            labels,
            masks=masks,
            seed=seed,
            num_classes=num_classes,
            head=head,
            config=config,
            sigma=sigma,
            sample_rate=sample_rate,
            mechanism=mechanism,
        )

        def predict(x: Tensor) -> Tensor:
            xc = clip_features(x.to(features.device, SHADOW_DTYPE), head.clip_radius)
            z = torch.matmul(xc, params["fc.weight"].transpose(-1, -2))
            return torch.softmax(z + params["fc.bias"].unsqueeze(-2), -1).float()

        return predict

    return trainer
