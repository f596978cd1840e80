"""Per-example membership signals computed from output probabilities (pure functions).

Every function takes probabilities ``(..., q, C)`` and labels ``(q,)`` and returns ``(..., q)``
scores oriented so that *larger means more member-like*; the leading dimensions let a bank of
``B`` heads be scored at once. Probabilities are clipped at the smallest positive double, so a
release that rounds a probability to 0 or 1 gives a large finite score, not ``inf``.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import numpy.typing as npt

from alm_opacus.attacks.base import FloatArray

_TINY = float(np.finfo(np.float64).tiny)

#: A signal: (..., q, C) probabilities and (q,) labels -> (..., q) scores.
Signal = Callable[[FloatArray, npt.NDArray[np.int64]], FloatArray]
#: Rows per block of :func:`in_blocks`: a (4096, 10) float64 temporary is 320 KiB, so a
#: signal's few temporaries stay in a core's L2 cache whatever the number of rows.
BLOCK_ROWS = 4096


def in_blocks(signal: Signal, proba: FloatArray, labels: npt.NDArray[np.int64]) -> FloatArray:
    """``signal(proba, labels)`` for (q, C) ``proba``, computed :data:`BLOCK_ROWS` rows at a
    time (the same values: every signal is computed row by row).

    On a shadow bank's pairs (heads x pool rows, e.g. 1.6 million at 50,000 members) each
    whole-array temporary was ~100 MB and every pass went to memory, so the cost per row grew
    with n (scripts/bench_scale.py, ``metric-attacks``).
    """
    if proba.ndim != 2 or proba.shape[0] <= BLOCK_ROWS:
        return signal(proba, labels)
    out = np.empty(proba.shape[0], dtype=np.float64)
    for start in range(0, proba.shape[0], BLOCK_ROWS):
        stop = start + BLOCK_ROWS
        out[start:stop] = signal(proba[start:stop], labels[start:stop])
    return out


def _true_class(proba: FloatArray, labels: npt.NDArray[np.int64]) -> FloatArray:
    idx = np.broadcast_to(labels, proba.shape[:-1])[..., None]
    return np.take_along_axis(proba, idx, axis=-1)[..., 0]


def _true_and_rest(
    proba: FloatArray, labels: npt.NDArray[np.int64]
) -> tuple[FloatArray, FloatArray, FloatArray]:
    """``(p_y, 1 - p_y, log p_y)`` with ``1 - p_y`` summed from the other classes.

    When ``p_y`` rounds to 1, the other entries still hold the distance to 1: summing them,
    and taking ``log p_y = log1p(-(1 - p_y))``, keeps confident examples apart instead of
    tying them all at ``p_y = 1`` (ties flatten the ROC).
    """
    py = _true_class(proba, labels)
    is_true = np.arange(proba.shape[-1]) == np.asarray(labels)[..., None]
    rest = np.where(is_true, 0.0, proba).sum(-1)
    log_py = np.where(
        rest < 0.5, np.log1p(-np.minimum(rest, 0.5)), np.log(np.clip(py, _TINY, None))
    )
    return py, rest, log_py


def correctness_score(proba: FloatArray, labels: npt.NDArray[np.int64]) -> FloatArray:
    """``1[argmax_i p_i = y]`` (Yeom et al. 2018; Song & Mittal 2021, I_corr)."""
    return (proba.argmax(-1) == labels).astype(np.float64)


def confidence_score(proba: FloatArray, labels: npt.NDArray[np.int64]) -> FloatArray:
    """``p_y`` (Song & Mittal 2021, I_conf: member iff ``p_y >= tau_y``), on a logit scale.

    Returned as ``log(p_y / (1 - p_y))``, strictly increasing in ``p_y``: the same ROC and the
    same decisions as thresholding ``p_y``, without float ties at ``p_y = 1``.
    """
    return logit_confidence(proba, labels)


def loss_score(proba: FloatArray, labels: npt.NDArray[np.int64]) -> FloatArray:
    """``-CE = log p_y`` (Yeom et al. 2018: member iff the loss is below a threshold)."""
    return _true_and_rest(proba, labels)[2]


def entropy_score(proba: FloatArray, labels: npt.NDArray[np.int64]) -> FloatArray:
    """``-H(p) = sum_i p_i log p_i`` (Song & Mittal 2021, I_entr: member iff H <= tau_y).

    The top class's term is computed from the other entries' sum (see ``_true_and_rest``).
    """
    top = proba.argmax(-1)
    _, rest, log_top = _true_and_rest(proba, top)
    is_top = np.arange(proba.shape[-1]) == top[..., None]
    p = np.clip(proba, _TINY, 1.0)
    others = np.where(is_top, 0.0, p * np.log(p)).sum(-1)
    return (1.0 - rest) * log_top + others


def modified_entropy_score(proba: FloatArray, labels: npt.NDArray[np.int64]) -> FloatArray:
    """``-Mentr(p, y)`` (Song & Mittal 2021, Sec. 3.2, the modified prediction entropy).

    ``Mentr(p, y) = -(1 - p_y) log p_y - sum_{i != y} p_i log(1 - p_i)``: unlike the entropy it
    grows when the model is confidently *wrong*, so it uses the label.
    """
    _, rest, log_py = _true_and_rest(proba, labels)
    is_true = np.arange(proba.shape[-1]) == np.asarray(labels)[..., None]
    p = np.clip(proba, 0.0, 1.0)
    log_q = np.log(np.clip(1.0 - p, _TINY, 1.0))
    others = np.where(is_true, 0.0, p * log_q).sum(-1)
    return rest * log_py + others


def logit_confidence(proba: FloatArray, labels: npt.NDArray[np.int64]) -> FloatArray:
    """Logit-scaled confidence ``phi = log(p_y / (1 - p_y))`` (Carlini et al. 2022, Sec. IV-A).

    ``1 - p_y`` is summed from the other classes' probabilities rather than subtracted from 1,
    which keeps confident examples apart where ``p_y`` rounds to 1.
    """
    py, rest, _ = _true_and_rest(proba, labels)
    return np.log(np.clip(py, _TINY, None)) - np.log(np.clip(rest, _TINY, None))
