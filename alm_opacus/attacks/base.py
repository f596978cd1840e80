"""Inputs, configuration and kinds shared by every membership-inference attack.

The threat model these types encode is written out in ``docs/threat_model.md``. In short:
the attacker queries the release black-box (output probabilities only), owns a data pool
disjoint from the members and the evaluation non-members, and can train heads with the
victim's recipe through a :data:`ShadowTrainer`, which the harness builds (and, for the
adaptive attacker, protects with the victim's mechanism and epsilon).
"""

from __future__ import annotations

import enum
import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import torch
from torch import Tensor

from alm_opacus._validation import check_delta

Predictor = Callable[[Tensor], Tensor]
"""``predict(features (q, d)) -> probabilities``: (q, C) for a release, (B, q, C) for a bank."""

ShadowTrainer = Callable[[Tensor, Tensor, Tensor, int], Predictor]
"""``trainer(features (n, d), labels (n,), masks (B, n) bool, seed) -> predict``.

``predict(features (q, d))`` returns the probabilities of the ``B`` heads, shape (B, q, C).
Head ``b`` is trained on the rows where ``masks[b]`` is true, with the victim's recipe and,
for the adaptive attacker, the victim's protection applied to its weights.
"""

BoolArray = npt.NDArray[np.bool_]
FloatArray = npt.NDArray[np.float64]


class AttackKind(str, enum.Enum):
    """The attacks; the values are the stable names used in ``results.csv``'s ``attack``."""

    SHADOW = "shadow"
    LOSS = "loss"
    CONFIDENCE = "confidence"
    ENTROPY = "entropy"
    MODIFIED_ENTROPY = "modified-entropy"
    CORRECTNESS = "correctness"
    LIRA_OFFLINE = "lira-offline"
    LIRA_ONLINE = "lira-online"


class ShadowDataSource(str, enum.Enum):
    """Where the shadow heads' data comes from (Shokri et al. 2017, Sec. IV-C)."""

    REAL = "real"  # the attacker's pool as is
    NOISY = "noisy"  # the pool with a fraction of each row's features reset
    SYNTHETIC = "synthetic"  # Shokri's Algorithm 1 (hill climbing), querying the target


class ThresholdScope(str, enum.Enum):
    """Metric-attack thresholds: one per class (Song & Mittal 2021) or one for all."""

    PER_CLASS = "per-class"
    GLOBAL = "global"


class EpsilonBoundMethod(str, enum.Enum):
    """How the threshold behind ``eps_lower_bound`` is kept apart from the data it is bound on.

    ``SPLIT_HALF``: the evaluation set is split (stratified, seeded) in halves; the threshold
    maximising the bound on one half is applied to the other, and only that half's counts enter
    the bound. ``SHADOW_THRESHOLD``: the attack's own threshold, chosen on shadow data, is
    applied to the whole evaluation set.
    """

    SPLIT_HALF = "split-half"
    SHADOW_THRESHOLD = "shadow-threshold"


@dataclass(frozen=True)
class AttackConfig:
    """Knobs of the attacks. Defaults follow the papers where they give a value.

    Attributes:
        num_shadow: ``k``, shadow heads, each trained on a half of the shadow data.
        num_reference: ``N``, LiRA reference heads (even, >= 4). Offline LiRA trains them on
            halves of the pool; online LiRA on halves of the pool plus the candidates.
        heads_per_seed: heads trained by one trainer call; each call gets its own
            initialisation seed so that references vary in initialisation too.
        shadow_data: where shadow data comes from (shadow-model and metric attacks; LiRA
            always uses the real pool).
        noise_fraction: for ``NOISY``: the fraction of each row's features reset (Shokri uses
            0.1 and 0.2).
        shadow_per_class: one attack model per class (Shokri et al. 2017, Sec. IV-D).
        attack_pairs: balanced in/out pairs that train an attack model (ALM appendix: 2,000).
            Fewer are used when the shadow data holds fewer; the count is in the result notes.
        attack_hidden: width of the attack MLP's hidden layers (the ALM appendix gives no
            width). 32 matches 64 on the default digits head (shadow AUC 0.61-0.62 over 3
            seeds for both) at half the cost, which --methods all pays 42 times.
        attack_layers: number of ReLU hidden layers (ALM appendix: 5).
        attack_steps: full-batch Adam steps of the attack MLP.
        attack_lr: Adam learning rate of the attack MLP.
        threshold_scope: per-class or global thresholds for the metric attacks.
        lira_fixed_variance: LiRA with one pooled variance (in, out) instead of one per example;
            Carlini et al. (2022, Sec. IV-C) advise it for few references. On by default: with
            N = 16 it was the stronger variant on digits (online AUC 0.76 vs 0.70).
        epsilon_bound: see :class:`EpsilonBoundMethod`.
        confidence: joint confidence of the empirical epsilon lower bound.
        synth_per_class: records synthesised per class (``SYNTHETIC``).
        synth_k_max: ``k_max`` of Algorithm 1 (None: half the feature dimension).
        synth_k_min: ``k_min`` of Algorithm 1.
        synth_conf_min: ``conf_min`` of Algorithm 1.
        synth_rej_max: ``rej_max`` of Algorithm 1.
        synth_iter_max: ``iter_max`` of Algorithm 1.
    """

    num_shadow: int = 16
    num_reference: int = 16
    heads_per_seed: int = 4
    shadow_data: ShadowDataSource = ShadowDataSource.REAL
    noise_fraction: float = 0.1
    shadow_per_class: bool = False
    attack_pairs: int = 2000
    attack_hidden: int = 32
    attack_layers: int = 5
    attack_steps: int = 800
    attack_lr: float = 1e-3
    threshold_scope: ThresholdScope = ThresholdScope.PER_CLASS
    lira_fixed_variance: bool = True
    epsilon_bound: EpsilonBoundMethod = EpsilonBoundMethod.SPLIT_HALF
    confidence: float = 0.95
    synth_per_class: int = 50
    synth_k_max: int | None = None
    synth_k_min: int = 1
    synth_conf_min: float = 0.5
    synth_rej_max: int = 10
    synth_iter_max: int = 300

    def __post_init__(self) -> None:
        object.__setattr__(self, "shadow_data", ShadowDataSource(self.shadow_data))
        object.__setattr__(self, "threshold_scope", ThresholdScope(self.threshold_scope))
        object.__setattr__(self, "epsilon_bound", EpsilonBoundMethod(self.epsilon_bound))
        for name in ("num_shadow", "heads_per_seed", "attack_pairs", "attack_hidden"):
            _check_int(getattr(self, name), name=name, low=1)
        for name in ("attack_layers", "attack_steps", "synth_per_class", "synth_k_min"):
            _check_int(getattr(self, name), name=name, low=1)
        for name in ("synth_rej_max", "synth_iter_max"):
            _check_int(getattr(self, name), name=name, low=1)
        _check_int(self.num_reference, name="num_reference", low=4)
        if self.num_reference % 2:
            raise ValueError(
                f"num_reference={self.num_reference!r} is invalid: expected an even number, "
                "so that each candidate is in exactly half of the references"
            )
        if self.synth_k_max is not None:
            _check_int(self.synth_k_max, name="synth_k_max", low=self.synth_k_min)
        if not 0 < self.noise_fraction <= 1:
            raise ValueError(
                f"noise_fraction={self.noise_fraction!r} is invalid: expected a number in (0, 1]"
            )
        if not (math.isfinite(self.attack_lr) and self.attack_lr > 0):
            raise ValueError(f"attack_lr={self.attack_lr!r} is invalid: expected a number > 0")
        if not 0.5 <= self.confidence < 1:
            raise ValueError(
                f"confidence={self.confidence!r} is invalid: expected a number in [0.5, 1)"
            )
        if not 0 <= self.synth_conf_min < 1:
            raise ValueError(
                f"synth_conf_min={self.synth_conf_min!r} is invalid: expected a number in [0, 1)"
            )


def _check_int(value: object, *, name: str, low: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"{name}={value!r} is invalid: expected an integer >= {low}")


@dataclass(frozen=True)
class AttackTarget:
    """One release under attack, and the balanced evaluation set it is attacked on.

    Attributes:
        predict: the release's black-box output, ``inputs -> probabilities (q, C)``.
        features: (q, d) evaluation features: the members, then as many non-members (any order).
            The attacker's shadow and reference heads see these.
        labels: (q,) their labels.
        is_member: (q,) bool ground truth; used only to score the attacks, never to fit them.
        num_classes: ``C``.
        delta: the delta the release claims (0 for pure DP and for no claim); it enters the
            empirical epsilon lower bound.
        inputs: what ``predict`` is queried with, row for row the same examples as
            ``features`` (e.g. their images, for a release that fine-tuned the encoder);
            ``None``: the features.
    """

    predict: Predictor
    features: Tensor
    labels: Tensor
    is_member: BoolArray
    num_classes: int
    delta: float = 0.0
    inputs: Tensor | None = None

    @property
    def queries(self) -> Tensor:
        """What the release is queried with."""
        return self.features if self.inputs is None else self.inputs

    def __post_init__(self) -> None:
        is_member = np.asarray(self.is_member)
        object.__setattr__(self, "is_member", is_member)
        q = self.features.shape[0] if self.features.ndim == 2 else -1
        if q < 0 or tuple(self.labels.shape) != (q,) or is_member.shape != (q,):
            raise ValueError(
                f"features (q, d), labels (q,) and is_member (q,) expected; got "
                f"{tuple(self.features.shape)}, {tuple(self.labels.shape)} and {is_member.shape}"
            )
        if is_member.dtype != np.bool_:
            raise ValueError(f"is_member must be a bool array; got dtype {is_member.dtype}")
        members = int(is_member.sum())
        if members == 0 or 2 * members != q:
            raise ValueError(
                f"the evaluation set must be balanced: {members} members and "
                f"{q - members} non-members given"
            )
        if self.inputs is not None and self.inputs.shape[0] != q:
            raise ValueError(f"inputs must have q={q} rows; got {tuple(self.inputs.shape)}")
        _check_labels(self.labels, self.num_classes)
        check_delta(self.delta)


@dataclass(frozen=True)
class AttackerKnowledge:
    """What the attacker owns: a data pool disjoint from the evaluation set, and a trainer.

    Attributes:
        features: (n, d) the attacker's pool (encoded with the public encoder).
        labels: (n,) its labels.
        trainer: trains heads with the victim's recipe (and, adaptive, its protection).
        num_classes: ``C``.
    """

    features: Tensor
    labels: Tensor
    trainer: ShadowTrainer
    num_classes: int

    def __post_init__(self) -> None:
        n = self.features.shape[0] if self.features.ndim == 2 else -1
        if n < 0 or tuple(self.labels.shape) != (n,):
            raise ValueError(
                f"features (n, d) and labels (n,) expected; got {tuple(self.features.shape)} "
                f"and {tuple(self.labels.shape)}"
            )
        if n < 4:
            raise ValueError(f"the attacker's pool has {n} rows; expected at least 4")
        _check_labels(self.labels, self.num_classes)


def _check_labels(labels: Tensor, num_classes: int) -> None:
    if isinstance(num_classes, bool) or not isinstance(num_classes, int) or num_classes < 2:
        raise ValueError(f"num_classes={num_classes!r} is invalid: expected an integer >= 2")
    if labels.dtype in (torch.float16, torch.float32, torch.float64):
        raise ValueError(f"labels must be integers; got dtype {labels.dtype}")
    if labels.numel() and (int(labels.min()) < 0 or int(labels.max()) >= num_classes):
        raise ValueError(
            f"labels must lie in [0, {num_classes}); got min={int(labels.min())}, "
            f"max={int(labels.max())}"
        )
