"""The ALM paper's fine-tuning recipe, as closely as its text allows (``solver="keras"``).

Yang, Gohari & Topcu build their classifiers "using Keras library" following Keras's SimCLR
example "with default hyperparameters" (Sec. 6 and Appendix A.1): a ``Dense(10)`` layer on the
encoder's output, Keras's ``Adam()`` (learning rate 1e-3, beta_1 0.9, beta_2 0.999,
epsilon 1e-7), sparse categorical cross-entropy on logits, batches of 525 rows and 20 epochs,
the kernel initialised Glorot-uniform and the bias at zero; Algorithm 2 retrains that recipe on
``d \\ d_i`` and ``d \\ d_j``. What the text does not say is fixed here and named:

* the initialisation is seeded (the paper's "fixed initialisation": every retraining of
  Algorithm 2 starts from the same weights);
* each epoch visits the rows in an order drawn from a generator seeded by ``(seed, epoch)``,
  shared by every head of the same size (Keras shuffles each epoch; with an unseeded shuffle
  the retrained pairs would also differ by their orders, which Algorithm 2 would then count as
  sensitivity);
* the last batch of an epoch is the remainder (Keras does not drop it); no regularisation
  (``l2`` adds the objective's penalty if set);
* float64, as every head here (Keras trains in float32): neighbouring heads differ by tiny
  amounts, which float32 rounding would pollute.

``HeadConfig(solver="keras", steps=EPOCHS, lr=1e-3, batch_size=525)`` is the recipe
(:data:`PAPER_RECIPE`); its sensitivity is sampled (``sampled-members`` is the paper's Algorithm
2 as written, ``sampled`` draws the pairs from the public split), never proven: minibatch Adam
is not covered by the stability bound (:mod:`alm_opacus.sensitivity.stability`).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor
from torch.nn import functional as F

from alm_opacus._hashing import derive_seed
from alm_opacus.heads import HeadConfig, Params, clip_features, register_solver

__all__ = ["KERAS_BATCH", "KERAS_EPOCHS", "PAPER_RECIPE", "epoch_generator", "glorot_uniform"]

#: Keras's SimCLR example: ``num_epochs = 20``, ``batch_size = 525``.
KERAS_EPOCHS = 20
KERAS_BATCH = 525
#: Heads trained together: their (heads, batch, d) gathers stay near 100 MB at d = 512.
_HEADS_PER_CHUNK = 48
#: ``keras.optimizers.Adam()``'s defaults.
_LR, _BETA1, _BETA2, _EPSILON = 1e-3, 0.9, 0.999, 1e-7
#: The paper's fine-tuning recipe on frozen features.
PAPER_RECIPE = HeadConfig(
    kind="linear", solver="keras", steps=KERAS_EPOCHS, lr=_LR, batch_size=KERAS_BATCH
)


def glorot_uniform(
    rows: int, cols: int, *, generator: torch.Generator, dtype: torch.dtype
) -> Tensor:
    """Keras's default kernel initialiser: U(-l, l), ``l = sqrt(6 / (fan_in + fan_out))``."""
    limit = math.sqrt(6.0 / (rows + cols))
    return (torch.rand(rows, cols, generator=generator, dtype=dtype) * 2 - 1) * limit


def epoch_generator(seed: int, epoch: int) -> torch.Generator:
    """The generator of one epoch's order: a function of the seed and the epoch only, so every
    head of the same size visits its rows in the same order."""
    return torch.Generator().manual_seed(derive_seed("keras-epoch", int(seed), int(epoch)))


def _rows_of(masks: Tensor) -> list[Tensor]:
    """Each head's rows, a row drawn k times listed k times (masks of counts)."""
    counts = masks.to(torch.long)
    return [torch.arange(masks.shape[1]).repeat_interleave(c) for c in counts.cpu()]


@register_solver("keras")
def _train_keras(
    features: Tensor,
    labels: Tensor,
    *,
    masks: Tensor,
    num_classes: int,
    config: HeadConfig,
    seed: int,
    init: Params | None,
) -> Params:
    """Minibatch Adam in Keras's form (module docstring), batched over heads of equal size."""
    del init  # train_heads refuses a start for this solver
    if config.kind != "linear":
        raise ValueError(f"solver='keras' trains the paper's Dense layer: kind={config.kind!r}")
    dtype, device = config.torch_dtype, features.device
    x = features.to(dtype)
    x = clip_features(x, config.clip_radius)
    y = labels.to(device=device, dtype=torch.long)
    g = torch.Generator().manual_seed(int(seed))
    d = x.shape[1]
    kernel = glorot_uniform(d, num_classes, generator=g, dtype=dtype).to(device)  # Keras (in, out)
    batch = int(config.batch_size or KERAS_BATCH)
    rows = _rows_of(masks)
    out_w = torch.empty(len(rows), num_classes, d, dtype=dtype, device=device)
    out_b = torch.empty(len(rows), num_classes, dtype=dtype, device=device)
    by_size: dict[int, list[int]] = {}
    for b, r in enumerate(rows):
        by_size.setdefault(len(r), []).append(b)
    # heads of one size share each epoch's order; chunks bound the (H, batch, d) gathers
    chunks = [
        (size, heads[i : i + _HEADS_PER_CHUNK])
        for size, heads in by_size.items()
        for i in range(0, len(heads), _HEADS_PER_CHUNK)
    ]
    for size, heads in chunks:
        idx = torch.stack([rows[b] for b in heads]).to(device)  # (H, size)
        w = kernel.t().expand(len(heads), -1, -1).clone()  # (H, C, d)
        bias = torch.zeros(len(heads), num_classes, dtype=dtype, device=device)
        state = [torch.zeros_like(w), torch.zeros_like(w), torch.zeros_like(bias)]
        state.append(torch.zeros_like(bias))
        t = 0
        for epoch in range(config.steps):
            order = torch.randperm(size, generator=epoch_generator(seed, epoch)).to(device)
            for start in range(0, size, batch):
                pick = idx[:, order[start : start + batch]]  # (H, b): each head's own rows
                xb, yb = x[pick], y[pick]
                logits = torch.einsum("hbd,hcd->hbc", xb, w) + bias[:, None, :]
                resid = torch.softmax(logits, -1) - F.one_hot(yb, num_classes).to(dtype)
                resid /= pick.shape[1]  # the batch mean of the loss
                t += 1
                # the objective's penalty (l2 / 2) ||w||^2 over kernel and bias (0: Keras's)
                grad_w = torch.einsum("hbc,hbd->hcd", resid, xb) + config.l2 * w
                grad_b = resid.sum(1) + config.l2 * bias
                _keras_adam(w, grad_w, state[0], state[1], t=t, lr=config.lr)
                _keras_adam(bias, grad_b, state[2], state[3], t=t, lr=config.lr)
        out_w[heads], out_b[heads] = w, bias
    return {"fc.weight": out_w, "fc.bias": out_b}


def _keras_adam(param: Tensor, grad: Tensor, m: Tensor, v: Tensor, *, t: int, lr: float) -> None:
    """``tf.keras.optimizers.Adam``'s update: the bias corrections fold into the step size
    and epsilon is added to ``sqrt(v)`` uncorrected."""
    m.mul_(_BETA1).add_(grad, alpha=1 - _BETA1)
    v.mul_(_BETA2).addcmul_(grad, grad, value=1 - _BETA2)
    lr_t = lr * math.sqrt(1 - _BETA2**t) / (1 - _BETA1**t)
    param.sub_(lr_t * m / (v.sqrt() + _EPSILON))
