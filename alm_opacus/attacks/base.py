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

#: The dtype the attackers' shadow and reference models compute in (a victim's own release
#: stays float64). Float32 halves the memory traffic and doubles the arithmetic per cycle of
#: the banks that dominate an attacked cell (DP-SGD heads, Lu's nets, post-training
#: predictions); its relative rounding (6e-8 per operation, ~1e-6 on the weights) is far below
#: the spread the attacks model: the noise each protection adds (sigma * C per coordinate and
#: step for DP-SGD, the released noise for post-training).
SHADOW_DTYPE = torch.float32

BoolArray = npt.NDArray[np.bool_]
FloatArray = npt.NDArray[np.float64]


class AttackKind(str, enum.Enum):
    """The built-in attacks; the values are their stable names in ``results.csv``'s ``attack``.

    The registry is keyed by name (a string), so packages can add attacks beyond these
    (``registry.register_attack``, or the ``alm_opacus.attacks`` entry point group).
    """

    SHADOW = "shadow"
    LOSS = "loss"
    CONFIDENCE = "confidence"
    ENTROPY = "entropy"
    MODIFIED_ENTROPY = "modified-entropy"
    CORRECTNESS = "correctness"
    LIRA_OFFLINE = "lira-offline"
    LIRA_ONLINE = "lira-online"
    #: offline LiRA whose references never trained on a candidate (pool only): stricter
    LIRA_OFFLINE_POOL = "lira-offline-pool"
    #: RMIA (Zarifzadeh et al. 2024) on LiRA's online references, Pr(x) over all of them
    RMIA_ONLINE = "rmia-online"
    #: RMIA on the references out for each candidate, Pr(x) by the linear approximation
    RMIA_OFFLINE = "rmia-offline"


#: Built-in attacks run only when named, left out of the default set
#: (``runner.DEFAULT_ATTACKS``). None today: both RMIA attacks are in it, because each is the
#: strongest of its kind on one of the embedded datasets with LiRA's references (online RMIA on
#: mnist, offline RMIA with its tuned ``a`` on digits; the ablation blocks of
#: docs/threat_model.md), and a cell reports its strongest attack.
OPT_IN_ATTACKS: frozenset[AttackKind] = frozenset()


class ShadowDataSource(str, enum.Enum):
    """Where the shadow heads' data comes from (Shokri et al. 2017, Sec. IV-C)."""

    REAL = "real"  # the attacker's pool as is
    NOISY = "noisy"  # the pool with a fraction of each row's features reset
    SYNTHETIC = "synthetic"  # Shokri's Algorithm 1 (hill climbing), querying the target


class ShadowModel(str, enum.Enum):
    """The shadow-model attack's classifier (see ``shadow.py``)."""

    MLP = "mlp"  # the ALM appendix's MLP with 5 ReLU hidden layers
    GBM = "gbm"  # scikit-learn's HistGradientBoostingClassifier
    AUTO = "auto"  # both, keeping the stronger on shadow examples held out of their training


class LiraLocation(str, enum.Enum):
    """How LiRA estimates the centre of each example's in/out Gaussian over references."""

    MEAN = "mean"  # the maximum-likelihood fit
    MEDIAN = "median"  # robust to a few outlying references (Carlini et al.'s code uses it)


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


#: The smallest attacker's pool the shadow and reference heads can be drawn from.
ATTACKER_POOL_MIN = 4


@dataclass(frozen=True)
class AttackConfig:
    """Knobs of the attacks. Defaults follow the papers where they give a value, and
    measurements on the default digits run otherwise (``docs/threat_model.md``).

    Attributes:
        num_shadow: ``k``, shadow heads, each trained on ``n`` rows of the shadow data.
        num_reference: ``N``, LiRA and RMIA reference heads (even, >= 4), each on ``n`` rows:
            halves of the candidates (and pool rows where they are too few) for online LiRA and
            offline LiRA (which uses the ``N / 2`` references *out* for each candidate) and for
            RMIA; halves of the pool for the stricter ``lira-offline-pool``.
        heads_per_seed: heads trained by one trainer call; each call gets its own
            initialisation seed so that references vary in initialisation too.
        shadow_data: where shadow data comes from (shadow-model and metric attacks; LiRA
            always uses the real pool).
        noise_fraction: for ``NOISY``: the fraction of each row's features reset (Shokri uses
            0.1 and 0.2).
        shadow_model: the shadow-model attack's classifier (``--shadow-model``).
        shadow_per_class: one attack model per class (Shokri et al. 2017, Sec. IV-D).
        attack_pairs: balanced in/out pairs that train an attack model. ``None``: 2,000 for
            the MLP (the ALM appendix) and every balanced pair up to 2^19 for gradient
            boosting (``shadow.GBM_PAIRS``). Fewer are used when the shadow data holds fewer;
            the count is then in the result notes, as it is when the 2^19 cap binds.
        attack_hidden: width of the attack MLP's hidden layers (the ALM appendix gives none).
        attack_layers: number of ReLU hidden layers (ALM appendix: 5).
        attack_steps: full-batch Adam steps of the attack MLP.
        attack_lr: Adam learning rate of the attack MLP (ALM appendix: 0.001).
        threshold_scope: per-class or global thresholds for the metric attacks.
        lira_fixed_variance: LiRA with one pooled variance (in, out) instead of one per
            example; Carlini et al. (2022, Sec. IV-C) advise it for few references. ``None``:
            per example for online LiRA, pooled for offline LiRA (the stronger of each on the
            default digits run with 64 references, ``docs/threat_model.md``).
        lira_location: mean or median of each example's references.
        rmia_gamma: RMIA's ``γ``: ``z`` counts against ``x`` when ``LR(x, z) >= γ``. 1, as
            Privacy Meter's RMIA (``ratios > 1``); the paper's code uses 2 on a softmax at
            temperature 2. On the plain softmax used here ``Pr(x|θ)/Pr(x)`` stays close to
            1 for confident examples, so ``γ = 2`` leaves many candidates dominating no ``z``
            (tied at score 0; AUC 0.66 against 0.71 on the overfit digits head of the tests);
            for one target ``γ`` moves the ROC only through such ties.
        rmia_offline_a: offline RMIA's ``a`` in ``Pr(x) = ½((1 + a)·Pr_OUT(x) + (1 − a))``,
            in [0, 1] (1 gives ``Pr(x) = Pr_OUT(x)``); None (default): tuned by the attacker
            on its own references, as the RMIA paper does (``rmia.tune_offline_a``). A fixed
            value does not transfer: 0.3, the paper's code's value for CIFAR-10, is the best
            of the grid on digits and the worst on mnist (docs/threat_model.md).
        rmia_population: RMIA's population samples ``z``: at most this many rows of the
            attacker's pool (all of a smaller pool), drawn once per attacker. A score's
            resolution is ``1 / |Z|``; the release is queried on them once per scoring.
        epsilon_bound: see :class:`EpsilonBoundMethod`.
        confidence: joint confidence of the empirical epsilon lower bound.
        interval_level: coverage of the AUC and TPR-at-FPR intervals.
        interval_resamples: bootstrap resamples behind the TPR-at-FPR intervals.
        synth_per_class: records synthesised per class (``SYNTHETIC``).
        synth_k_max: ``k_max`` of Algorithm 1 (None: half the feature dimension).
        synth_k_min: ``k_min`` of Algorithm 1.
        synth_conf_min: ``conf_min`` of Algorithm 1.
        synth_rej_max: ``rej_max`` of Algorithm 1.
        synth_iter_max: ``iter_max`` of Algorithm 1.
    """

    num_shadow: int = 64
    num_reference: int = 64
    heads_per_seed: int = 16
    shadow_data: ShadowDataSource = ShadowDataSource.REAL
    noise_fraction: float = 0.1
    shadow_model: ShadowModel = ShadowModel.GBM
    shadow_per_class: bool = False
    attack_pairs: int | None = None
    attack_hidden: int = 32
    attack_layers: int = 5
    attack_steps: int = 800
    attack_lr: float = 1e-3
    threshold_scope: ThresholdScope = ThresholdScope.PER_CLASS
    lira_fixed_variance: bool | None = None
    lira_location: LiraLocation = LiraLocation.MEAN
    rmia_gamma: float = 1.0
    rmia_offline_a: float | None = None
    rmia_population: int = 10_000
    epsilon_bound: EpsilonBoundMethod = EpsilonBoundMethod.SPLIT_HALF
    confidence: float = 0.95
    interval_level: float = 0.95
    interval_resamples: int = 2000
    synth_per_class: int = 50
    synth_k_max: int | None = None
    synth_k_min: int = 1
    synth_conf_min: float = 0.5
    synth_rej_max: int = 10
    synth_iter_max: int = 300

    def __post_init__(self) -> None:
        for name, kind in _ENUM_FIELDS.items():
            value = getattr(self, name)
            try:
                object.__setattr__(self, name, kind(value))
            except ValueError:
                allowed = [k.value for k in kind]
                raise ValueError(
                    f"{name}={value!r} is invalid: expected one of {allowed}"
                ) from None
        for name in ("num_shadow", "heads_per_seed", "attack_hidden"):
            _check_int(getattr(self, name), name=name, low=1)
        if self.attack_pairs is not None:
            _check_int(self.attack_pairs, name="attack_pairs", low=2)
        for name in ("attack_layers", "attack_steps", "synth_per_class", "synth_k_min"):
            _check_int(getattr(self, name), name=name, low=1)
        for name in ("synth_rej_max", "synth_iter_max"):
            _check_int(getattr(self, name), name=name, low=1)
        _check_int(self.interval_resamples, name="interval_resamples", low=100)
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
        for name in ("confidence", "interval_level"):
            if not 0.5 <= getattr(self, name) < 1:
                raise ValueError(
                    f"{name}={getattr(self, name)!r} is invalid: expected a number in [0.5, 1)"
                )
        _check_number(self.rmia_gamma, name="rmia_gamma", expected="a finite number > 0")
        if not self.rmia_gamma > 0:
            raise ValueError(
                f"rmia_gamma={self.rmia_gamma!r} is invalid: expected a finite number > 0"
            )
        if self.rmia_offline_a is not None:  # None: tuned by the attacker
            _check_number(
                self.rmia_offline_a, name="rmia_offline_a", expected="None or a number in [0, 1]"
            )
            if not 0 <= self.rmia_offline_a <= 1:
                raise ValueError(
                    f"rmia_offline_a={self.rmia_offline_a!r} is invalid: expected None (tuned) "
                    "or a number in [0, 1]"
                )
        _check_int(self.rmia_population, name="rmia_population", low=1)
        if not 0 <= self.synth_conf_min < 1:
            raise ValueError(
                f"synth_conf_min={self.synth_conf_min!r} is invalid: expected a number in [0, 1)"
            )


_ENUM_FIELDS: dict[str, type[enum.Enum]] = {
    "shadow_data": ShadowDataSource,
    "shadow_model": ShadowModel,
    "threshold_scope": ThresholdScope,
    "lira_location": LiraLocation,
    "epsilon_bound": EpsilonBoundMethod,
}


def _check_number(value: object, *, name: str, expected: str) -> None:
    """A finite real number (not a bool), else a ValueError naming ``expected``."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{name}={value!r} is invalid: expected {expected}")


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
        claimed_epsilon: the epsilon the release claims, on the replace-one relation the
            audit tests (``inf`` for no claim). Where the evaluation set cannot produce a
            bound that large, the results' notes say that it cannot see a violation.
    """

    predict: Predictor
    features: Tensor
    labels: Tensor
    is_member: BoolArray
    num_classes: int
    delta: float = 0.0
    inputs: Tensor | None = None
    claimed_epsilon: float = math.inf

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
        if not self.claimed_epsilon > 0:  # also rejects NaN
            raise ValueError(
                f"claimed_epsilon={self.claimed_epsilon!r} is invalid: expected a number > 0 "
                "(inf for no claim)"
            )


@dataclass(frozen=True)
class AttackerKnowledge:
    """What the attacker owns: a data pool disjoint from the evaluation set, and a trainer.

    Attributes:
        features: (P, d) the attacker's pool (encoded with the public encoder).
        labels: (P,) its labels.
        trainer: trains heads with the victim's recipe (and, adaptive, its protection).
        num_classes: ``C``.
        train_size: ``n``, the number of rows the victim trained on (part of its recipe);
            every shadow and reference head trains on as many. ``None``: half the pool.
    """

    features: Tensor
    labels: Tensor
    trainer: ShadowTrainer
    num_classes: int
    train_size: int | None = None

    def __post_init__(self) -> None:
        n = self.features.shape[0] if self.features.ndim == 2 else -1
        if n < 0 or tuple(self.labels.shape) != (n,):
            raise ValueError(
                f"features (n, d) and labels (n,) expected; got {tuple(self.features.shape)} "
                f"and {tuple(self.labels.shape)}"
            )
        if n < ATTACKER_POOL_MIN:
            raise ValueError(
                f"the attacker's pool has {n} rows; expected at least {ATTACKER_POOL_MIN}"
            )
        if self.train_size is not None:
            _check_int(self.train_size, name="train_size", low=1)
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
