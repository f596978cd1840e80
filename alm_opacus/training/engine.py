"""`PrivacyEngine`: Opacus's engine with a choice of noise mechanism and one budget.

Switching an Opacus training loop to logistic noise takes two changed lines::

    from alm_opacus.training import PrivacyEngine            # was: from opacus import ...
    model, optimizer, loader = engine.make_private(..., noise_mechanism="alm")

What differs from ``opacus.PrivacyEngine``:

- the optimizer is `MechanismDPOptimizer` (clipping in the mechanism's norm, noise from the
  mechanism's sampler); the default mechanism is ``gaussian``, so a loop that passes no
  ``noise_mechanism`` keeps Opacus's Gaussian DP-SGD;
- the default accountant is ``alm_pld`` (`PipelineAccountant`), which accounts for
  logistic, Laplace and Gaussian steps and for post-training releases in one budget;
- noise and Poisson batch membership come from `SecureGenerator` (``os.urandom``) unless a
  seeded generator is passed explicitly, which requires ``secure_mode=False`` (as in Opacus,
  secure mode refuses seeds); Opacus's ``secure_mode`` needs ``torchcsprng``, which does not
  exist for current PyTorch, and is not used;
- `make_private_with_epsilon` calibrates against the budget already in the accountant, and
  refuses (`InfeasibleBudget`) when the target cannot be met;
- Poisson sampling is required (the accounting assumes it); flat or per-layer clipping
  (per-layer budgets add up to C in the mechanism's norm: the same accounting); ghost
  clipping, adaptive clipping and FSDP are refused, with the reason, before anything is
  modified; keyword arguments the engine does not know are refused (Opacus passes them on
  to the optimizer, which ignores them, so a misspelt ``noise_mechanism`` would silently
  train with Gaussian noise);
- a module wrapped in ``DifferentiallyPrivateDistributedDataParallel`` or
  ``DistributedDataParallel`` trains on several processes
  (`DistributedMechanismDPOptimizer`, `alm_opacus.training.distributed`): the noise of a
  step is drawn once, on rank 0, and every rank takes the same step;
- checkpoints record the noise mechanism, its clipping norm and bound and σ beside the
  accountant's entries, are written atomically, and loading one into an engine whose
  mechanism differs is refused, naming both.
"""

from __future__ import annotations

import os
import warnings
from dataclasses import asdict
from typing import IO, Any, BinaryIO

import torch
from opacus import PrivacyEngine as OpacusPrivacyEngine
from opacus.accountants import create_accountant
from opacus.grad_sample import AbstractGradSampleModule
from opacus.optimizers import DPOptimizer
from opacus.optimizers.utils import params
from torch import nn, optim
from torch.utils.data import DataLoader

from alm_opacus.io import atomic_torch_save
from alm_opacus.mechanisms.sampling import NoiseGenerator
from alm_opacus.training.calibration import (
    DEFAULT_ACCOUNTANT,
    check_epochs,
    l1_clip,
    noise_multiplier_for,
)
from alm_opacus.training.checkpoint import (
    CheckpointMismatch,
    TrainingRecord,
    check_same_mechanism,
    saved_training,
)
from alm_opacus.training.distributed import DistributedMechanismDPOptimizer
from alm_opacus.training.grad_sample import BufferedGradSampleModule
from alm_opacus.training.optimizer import MechanismDPOptimizer
from alm_opacus.training.requests import MAKE_PRIVATE_ARGUMENTS, check_request
from alm_opacus.training.sampler import SecureDPDataLoader

__all__ = [
    "DEFAULT_ACCOUNTANT",
    "CheckpointMismatch",
    "PrivacyEngine",
    "TrainingRecord",
    "l1_clip",
    "noise_multiplier_for",
]


#: The optimizer of a single-process and of a distributed (DPDDP / DDP) module.
_OPTIMIZERS: dict[bool, type[MechanismDPOptimizer]] = {
    False: MechanismDPOptimizer,
    True: DistributedMechanismDPOptimizer,
}


class PrivacyEngine(OpacusPrivacyEngine):
    """Opacus's `PrivacyEngine` with ``noise_mechanism`` in ``alm``, ``laplace``, ``gaussian``.

    Example:
        >>> engine = PrivacyEngine()  # accountant="alm_pld", secure noise and sampling
        >>> model, optimizer, loader = engine.make_private(
        ...     module=model, optimizer=optimizer, data_loader=loader,
        ...     noise_multiplier=1.0, max_grad_norm=1.0, noise_mechanism="alm")
    """

    def __init__(self, *, accountant: str = DEFAULT_ACCOUNTANT, secure_mode: bool = True) -> None:
        """Args:
            accountant: an Opacus registry name; ``alm_pld`` (default) for every mechanism and
                for post-training releases, ``prv``/``rdp``/``gdp`` for Gaussian noise only.
            secure_mode: as in Opacus, refuse seeded generators (``noise_generator``, and
                the data loader's ``generator``). Noise and batches come from a
                `SecureGenerator` whenever no seeded generator is passed, in either mode.

        Raises:
            ValueError: if ``accountant`` is not registered.
        """
        # Not Opacus's __init__: its secure_mode imports torchcsprng; its warning would be false.
        self.accountant = create_accountant(mechanism=accountant)
        self.secure_mode = bool(secure_mode)
        self.secure_rng = None
        self.dataset: Any = None
        #: How this engine's optimizer noises its steps (set by `make_private`, or by
        #: `load_checkpoint` before it), so that a checkpoint can be checked against it.
        self.training: TrainingRecord | None = None

    def make_private(
        self,
        *,
        module: nn.Module,
        optimizer: optim.Optimizer,
        data_loader: DataLoader[Any],
        noise_multiplier: float,
        max_grad_norm: float | list[float],
        noise_mechanism: str = "gaussian",
        criterion: nn.Module | None = None,
        poisson_sampling: bool = True,
        clipping: str = "flat",
        noise_generator: NoiseGenerator | None = None,
        grad_sample_mode: str = "hooks",
        exact: bool = True,
        **kwargs: Any,
    ) -> tuple[Any, MechanismDPOptimizer, SecureDPDataLoader]:
        """Opacus's ``make_private`` with the noise of ``noise_mechanism``.

        A ``module`` wrapped in ``DifferentiallyPrivateDistributedDataParallel`` or
        ``DistributedDataParallel`` (after ``torch.distributed.init_process_group``) trains
        on every rank of the process group: the loader samples this rank's shard, the
        optimizer is a `DistributedMechanismDPOptimizer` (noise once per step, on rank 0),
        and every rank's accountant records the same steps at the global rate.

        Args:
            module, optimizer, data_loader, noise_multiplier, criterion, grad_sample_mode,
            **kwargs: as in ``opacus.PrivacyEngine.make_private``; ``**kwargs`` may be
                ``batch_first``, ``loss_reduction``, ``wrap_model`` or ``rand_on_empty``.
            max_grad_norm: the clipping bound C in the mechanism's norm (L1 for ``alm`` and
                ``laplace``: move an L2 clip c to that scale with `l1_clip`, √p·c); with
                ``clipping="per_layer"`` a list of budgets, one per trainable parameter.
            noise_mechanism: ``"gaussian"`` (default, Opacus's noise), ``"alm"`` (alias
                ``"logistic"``) or ``"laplace"``; L1 clipping for the latter two.
            poisson_sampling: must be ``True``: the accounting assumes Poisson sampling.
            clipping: ``"flat"`` or ``"per_layer"``.
            noise_generator: a seeded ``torch.Generator`` for reproducible research (needs
                ``secure_mode=False``); ``None`` for a `SecureGenerator`.
            exact: exact steps on a grid (default; `MechanismDPOptimizer`); ``False`` keeps
                floating-point noise, open to a floating-point adversary (comparisons only).

        Returns:
            (module, optimizer, data_loader): the optimizer a `MechanismDPOptimizer` (a
            `DistributedMechanismDPOptimizer` for a distributed module), the loader a
            `SecureDPDataLoader`.

        Raises:
            ValueError: on an unsupported option, mechanism, accountant or keyword
                argument, checked before the module, optimizer or loader are touched.
            CheckpointMismatch: if a checkpoint loaded into this engine first was trained
                with another mechanism.

        Warns:
            UserWarning: when an L1 clip is the size of an L2 clip for a model of many
                parameters (p ≥ 100 and C / √p < 0.1), and when ``torch.distributed`` runs several
                processes but ``module`` is not wrapped for them.
        """
        mechanism = check_request(
            accountant=self.accountant,
            training=self.training,
            module=module,
            optimizer=optimizer,
            noise_mechanism=noise_mechanism,
            max_grad_norm=max_grad_norm,
            poisson_sampling=poisson_sampling,
            clipping=clipping,
            grad_sample_mode=grad_sample_mode,
            extra=kwargs,
        )
        if criterion is not None:
            kwargs["criterion"] = criterion
        private = super().make_private(
            module=module,
            optimizer=optimizer,
            data_loader=data_loader,
            noise_multiplier=noise_multiplier,
            max_grad_norm=max_grad_norm,
            poisson_sampling=True,
            clipping=clipping,
            noise_generator=noise_generator,
            grad_sample_mode=grad_sample_mode,
            noise_mechanism=mechanism,
            exact=exact,
            **kwargs,
        )
        self.training = TrainingRecord.of(private[1])
        return private

    def make_private_with_epsilon(
        self,
        *,
        module: nn.Module,
        optimizer: optim.Optimizer,
        data_loader: DataLoader[Any],
        target_epsilon: float,
        target_delta: float,
        epochs: int,
        max_grad_norm: float | list[float],
        noise_mechanism: str = "gaussian",
        epsilon_tolerance: float = 0.01,
        **kwargs: Any,
    ) -> tuple[Any, MechanismDPOptimizer, SecureDPDataLoader]:
        """`make_private` with σ chosen so that the TOTAL budget ends at ``target_epsilon``.

        The total counts everything the accountant already holds (earlier training, a
        post-training release recorded with ``record_release``) plus ``epochs`` epochs of
        the new steps, ``epochs * int(1 / q)`` steps at ``q = 1 / len(data_loader)``, exactly
        the steps the Poisson loader runs and the rate the accountant hook records.

        Args:
            target_epsilon: ε of everything recorded, after training, > 0.
            target_delta: δ in (0, 1).
            epochs: passes over the data, ≥ 1.
            noise_mechanism: as in `make_private`.
            epsilon_tolerance: how far below the target the σ search may stop.
            module, optimizer, data_loader, max_grad_norm, **kwargs: as in `make_private`.

        Returns:
            As `make_private`.

        Raises:
            InfeasibleBudget: if the budget already spent leaves no σ meeting the target;
                its message names the spent budget.
            ValueError: on bad input or an accountant that cannot count the prior budget.
        """
        passed = {k: v for k, v in kwargs.items() if k not in MAKE_PRIVATE_ARGUMENTS}
        mechanism = check_request(
            accountant=self.accountant,
            training=self.training,
            module=module,
            optimizer=optimizer,
            noise_mechanism=noise_mechanism,
            max_grad_norm=max_grad_norm,
            poisson_sampling=kwargs.get("poisson_sampling", True),
            clipping=kwargs.get("clipping", "flat"),
            grad_sample_mode=kwargs.get("grad_sample_mode", "hooks"),
            extra=passed,
            warn=False,  # make_private below warns
        )
        steps_per_epoch = int(1 / (1 / len(data_loader)))  # as the Poisson sampler computes it
        sigma = noise_multiplier_for(
            accountant=self.accountant,
            target_epsilon=target_epsilon,
            target_delta=target_delta,
            sample_rate=1 / steps_per_epoch,
            steps=check_epochs(epochs) * steps_per_epoch,
            noise_mechanism=mechanism,
            dim=sum(p.numel() for p in params(optimizer)),
            epsilon_tolerance=epsilon_tolerance,
        )
        return self.make_private(
            module=module,
            optimizer=optimizer,
            data_loader=data_loader,
            noise_multiplier=sigma,
            max_grad_norm=max_grad_norm,
            noise_mechanism=mechanism,
            **kwargs,
        )

    def save_checkpoint(
        self,
        *,
        path: str | os.PathLike[str] | BinaryIO | IO[bytes],
        module: nn.Module,
        optimizer: DPOptimizer | None = None,
        noise_scheduler: Any = None,
        grad_clip_scheduler: Any = None,
        checkpoint_dict: dict[str, Any] | None = None,
        module_state_dict_kwargs: dict[str, Any] | None = None,
        torch_save_kwargs: dict[str, Any] | None = None,
    ) -> None:
        """Opacus's ``save_checkpoint``, recording how the steps were noised, atomically.

        Beside Opacus's entries (module, accountant with its entries, optimizer, schedulers)
        the checkpoint holds ``"training"``: the `TrainingRecord` (mechanism, clipping norm
        and bound, σ) of ``optimizer``, or of this engine's `make_private` when no
        `MechanismDPOptimizer` is given. A path is written through a temporary file and
        renamed, so an interrupted save leaves the previous checkpoint whole. On several
        processes, save from rank 0 only: every rank holds the same state.

        Args:
            path, module, optimizer, noise_scheduler, grad_clip_scheduler, checkpoint_dict,
            module_state_dict_kwargs, torch_save_kwargs: as in
                ``opacus.PrivacyEngine.save_checkpoint``.
        """
        checkpoint = dict(checkpoint_dict or {})
        checkpoint["module_state_dict"] = module.state_dict(**(module_state_dict_kwargs or {}))
        checkpoint["privacy_accountant_state_dict"] = self.accountant.state_dict()
        if optimizer is not None:
            checkpoint["optimizer_state_dict"] = optimizer.state_dict()
        for key, scheduler in (
            ("noise_scheduler", noise_scheduler),
            ("grad_clip_scheduler", grad_clip_scheduler),
        ):
            if scheduler is not None:
                checkpoint[f"{key}_state_dict"] = scheduler.state_dict()
        record = self._training_of(optimizer)
        if record is not None:
            checkpoint["training"] = asdict(record)
        if isinstance(path, str | os.PathLike) and not torch_save_kwargs:
            atomic_torch_save(checkpoint, path)
        else:
            torch.save(checkpoint, path, **(torch_save_kwargs or {}))

    def load_checkpoint(
        self,
        *,
        path: str | os.PathLike[str] | BinaryIO | IO[bytes],
        module: nn.Module,
        optimizer: DPOptimizer | None = None,
        **kwargs: Any,
    ) -> dict[str, Any]:
        """Opacus's ``load_checkpoint`` with ``torch.load(..., weights_only=True)``, refusing
        a checkpoint trained with another noise mechanism than this engine's.

        Opacus loads with ``weights_only=False``, which runs any code a crafted checkpoint
        holds; every state saved by `save_checkpoint` here is plain data, so nothing is lost.
        The engine's mechanism is ``optimizer``'s (a `MechanismDPOptimizer`), else that of
        this engine's `make_private`; when neither exists yet, the checkpoint's record is
        kept and `make_private` with another mechanism is refused instead.

        Raises:
            CheckpointMismatch: if the checkpoint's mechanism (its ``"training"`` record, or
                for a checkpoint without one, the only DP-SGD mechanism its accountant
                entries hold) differs from the engine's; nothing is loaded then.
            ValueError: if ``torch_load_kwargs`` asks for ``weights_only``, or on a record
                that is not one.
            pickle.UnpicklingError: if the file holds anything but tensors and plain data.
        """
        torch_load_kwargs = dict(kwargs.pop("torch_load_kwargs", None) or {})
        if "weights_only" in torch_load_kwargs:
            raise ValueError("torch_load_kwargs['weights_only'] is not allowed: it is always True")
        checkpoint: dict[str, Any] = torch.load(path, weights_only=True, **torch_load_kwargs)
        saved = saved_training(checkpoint)
        current = self._training_of(optimizer)
        if saved is not None and current is not None:
            check_same_mechanism(saved=saved, current=current, what=f"checkpoint {path!r}")
        accountant_state = checkpoint["privacy_accountant_state_dict"]
        type(self.accountant)().load_state_dict(accountant_state)  # validate before any change
        module.load_state_dict(
            checkpoint["module_state_dict"], **(kwargs.pop("module_load_dict_kwargs", None) or {})
        )
        self.accountant.load_state_dict(accountant_state)
        optimizer_state = checkpoint.pop("optimizer_state_dict", {})
        if optimizer is not None and optimizer_state:
            optimizer.load_state_dict(optimizer_state)
        elif (optimizer is not None) != bool(optimizer_state):
            warnings.warn(
                f"optimizer_state_dict has {len(optimizer_state)} items but optimizer is "
                f"{'' if optimizer is not None else 'not '}provided",
                stacklevel=2,
            )
        for key in ("noise_scheduler", "grad_clip_scheduler"):
            state = checkpoint.pop(f"{key}_state_dict", {})
            scheduler = kwargs.get(key)
            if scheduler is not None and state:
                scheduler.load_state_dict(state)
        if current is None and saved is not None:
            self.training = saved
        return checkpoint

    def _training_of(self, optimizer: Any) -> TrainingRecord | None:
        """The record of ``optimizer`` if it is ours, else of this engine's `make_private`."""
        if isinstance(optimizer, MechanismDPOptimizer):
            return TrainingRecord.of(optimizer)
        return self.training

    def _prepare_model(
        self,
        module: nn.Module,
        *,
        batch_first: bool = True,
        max_grad_norm: float | list[float] = 1.0,
        loss_reduction: str = "mean",
        grad_sample_mode: str = "hooks",
        wrap_model: bool = True,
    ) -> Any:
        """Opacus's wrapping, with `BufferedGradSampleModule` for the hooks modes: the same
        per-sample gradients in buffers reused from step to step (`alm_opacus.training.
        grad_sample`). A module Opacus already wrapped, ``wrap_model=False`` and the
        ``ew`` mode go to Opacus unchanged."""
        buffered = wrap_model and grad_sample_mode in _BUFFERED_MODES
        functorch = grad_sample_mode == "functorch"
        if isinstance(module, BufferedGradSampleModule) and buffered:
            kept = (module.batch_first, module.loss_reduction, module.force_functorch)
            if kept == (batch_first, loss_reduction, functorch):
                return module
        if not buffered or isinstance(module, AbstractGradSampleModule):
            return super()._prepare_model(
                module,
                batch_first=batch_first,
                max_grad_norm=max_grad_norm,
                loss_reduction=loss_reduction,
                grad_sample_mode=grad_sample_mode,
                wrap_model=wrap_model,
            )
        self.validate(module=module, optimizer=None, data_loader=None)
        return BufferedGradSampleModule(
            module,
            batch_first=batch_first,
            loss_reduction=loss_reduction,
            force_functorch=functorch,
        )

    def _prepare_data_loader(
        self,
        data_loader: DataLoader[Any],
        *,
        poisson_sampling: bool,
        distributed: bool,
        batch_first: bool = True,
        rand_on_empty: bool = False,
    ) -> SecureDPDataLoader:
        if self.dataset is None:
            self.dataset = data_loader.dataset
        elif self.dataset != data_loader.dataset:
            warnings.warn(
                "PrivacyEngine detected a new dataset object; accounting is per dataset, so "
                "create a new engine for another data set",
                stacklevel=3,
            )
        generator = data_loader.generator
        if generator is not None and self.secure_mode:
            generator = None  # Opacus's secure mode likewise replaces the loader's generator
        return SecureDPDataLoader.from_data_loader(
            data_loader,
            generator=generator,
            batch_first=batch_first,
            rand_on_empty=rand_on_empty,
            distributed=distributed,
        )

    def _prepare_optimizer(
        self,
        *,
        optimizer: optim.Optimizer,
        noise_multiplier: float,
        max_grad_norm: float | list[float],
        expected_batch_size: float,
        loss_reduction: str = "mean",
        noise_generator: NoiseGenerator | None = None,
        noise_mechanism: str = "gaussian",
        exact: bool = True,
        distributed: bool = False,
        **kwargs: Any,
    ) -> MechanismDPOptimizer:
        if isinstance(optimizer, DPOptimizer):
            optimizer = optimizer.original_optimizer
        return _OPTIMIZERS[distributed](
            optimizer,
            noise_multiplier=noise_multiplier,
            max_grad_norm=max_grad_norm,
            expected_batch_size=expected_batch_size,
            loss_reduction=loss_reduction,
            noise_mechanism=noise_mechanism,
            generator=noise_generator,
            exact=exact,
        )


#: Opacus's grad sample modes whose ``GradSampleModule`` `BufferedGradSampleModule` extends.
_BUFFERED_MODES = frozenset({"hooks", "functorch"})
