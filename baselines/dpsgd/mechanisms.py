"""``dpsgd-alm`` and ``dpsgd-laplace``: ``dpsgd`` with logistic or Laplace noise.

The same recipe, tuning budget (:data:`~baselines.dpsgd.config.TUNING_GRID`'s learning rates,
its clips scaled by sqrt(p) to the L1 scale; chosen on public data), schedule and attacks as
``dpsgd``; what differs is one DP-SGD step (Abadi et al. 2016, Algorithm 1, with another
noise):

* the engine is ``alm_opacus.training.PrivacyEngine`` with ``noise_mechanism="alm"`` or
  ``"laplace"``: per-example clipping in L1 (the norm of the logistic and Laplace
  guarantees, ALM paper Theorem 4.1; Dwork & Roth 2014, Theorem 3.6) and i.i.d. noise of
  scale ``sigma C`` per coordinate (``MechanismDPOptimizer``, ``docs/dpsgd_noise.md``);
* the accountant is ``alm_pld`` (``alm_opacus.accounting.PipelineAccountant``), the only one
  that accounts for these steps; sigma is its search (``noise_multiplier_for``) for the
  target (epsilon, delta) under add/remove neighbours, with the model's trainable
  coordinates as the noised dimension;
* Poisson sampling and noise come from the AES-CTR keystream (``SecureGenerator``) unless
  the harness asks for reproducible noise, when they are seeded as ``dpsgd``'s are; steps are
  exact on a grid, as ``dpsgd``'s are (``docs/mechanisms.md``).
"""

from __future__ import annotations

from typing import Any, ClassVar

from alm_opacus import accounting
from alm_opacus.methods import MethodContext, register_method
from alm_opacus.training import l1_clip  # re-exported
from baselines.dpsgd.config import DPSGDRecipeOptions
from baselines.dpsgd.head import head_size
from baselines.dpsgd.loop import (
    ALM_TRAINING,
    SECURE_NOTE,
    TrainingBackend,
    alm_engine,
    alm_generators,
)
from baselines.dpsgd.method import DPSGDMethod

__all__ = [
    "ALM_TRAINING",
    "SECURE_NOTE",
    "DPSGDALMMethod",
    "DPSGDLaplaceMethod",
    "DPSGDMechanismMethod",
    "alm_engine",
    "alm_generators",
    "l1_clip",
]

_FLOAT_NOTE = (
    "floating-point {law} noise (exact=False; Mironov 2012): the guarantee is for the ideal "
    "mechanism, not for the floats computed"
)


class DPSGDMechanismMethod(DPSGDMethod):
    """``dpsgd`` with the noise of ``noise_mechanism``, through ``alm_opacus.training``'s
    engine and the ``alm_pld`` accountant (its options: the recipe's, no accountant)."""

    Options: ClassVar[type[DPSGDRecipeOptions]] = DPSGDRecipeOptions
    backend: ClassVar[TrainingBackend] = ALM_TRAINING

    @property
    def accountant(self) -> str:
        """``alm_pld``: the only accountant of logistic and Laplace steps."""
        return accounting.ACCOUNTANT_NAME

    def grid(self, prepared: Any, *, context: MethodContext) -> tuple[dict[str, Any], ...]:
        """``dpsgd``'s grid with each clip scaled by sqrt(p), p the head's trainable numbers.

        The same budget (4 configurations), on the L1 scale: a dense gradient of L2 norm c
        has L1 norm up to sqrt(p) c, so the scaled L1 clip cuts about as much of a gradient
        as ``dpsgd``'s L2 clip does; unscaled, every example is clipped far below its norm and
        the step is as if the learning rate were divided by about sqrt(p).
        """
        params = head_size(
            d=int(prepared.features.shape[1]), num_classes=context.num_classes, head=context.head
        )
        return tuple(
            {**c, "max_grad_norm": l1_clip(c["max_grad_norm"], params=params)}
            for c in self.tuning_grid
        )


@register_method("dpsgd-alm")
class DPSGDALMMethod(DPSGDMechanismMethod):
    """DP-SGD with logistic (ALM) noise and L1 clipping."""

    name: ClassVar[str] = "dpsgd-alm"
    noise_mechanism: ClassVar[str] = "alm"
    mechanism: ClassVar[str] = "dp-sgd with logistic noise"
    float_note: ClassVar[str] = _FLOAT_NOTE.format(law="logistic")
    notes: ClassVar[tuple[str, ...]] = (
        "accounting profile: the Poisson-subsampled scalar logistic PLD, valid for the "
        "head's gradient in every dimension under L1 clipping (docs/accounting.md, Theorem 3: "
        "the one-coordinate shift dominates)",
    )


@register_method("dpsgd-laplace")
class DPSGDLaplaceMethod(DPSGDMechanismMethod):
    """DP-SGD with Laplace noise and L1 clipping."""

    name: ClassVar[str] = "dpsgd-laplace"
    noise_mechanism: ClassVar[str] = "laplace"
    mechanism: ClassVar[str] = "dp-sgd with laplace noise"
    float_note: ClassVar[str] = _FLOAT_NOTE.format(law="Laplace")
    notes: ClassVar[tuple[str, ...]] = (
        "accounting profile: dp_accounting's Poisson-subsampled scalar Laplace PLD, valid for "
        "the head's gradient in every dimension under L1 clipping (docs/accounting.md, "
        "Theorem 1: the one-coordinate shift dominates)",
    )
