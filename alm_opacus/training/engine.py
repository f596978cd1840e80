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
- Poisson sampling is required (the accounting assumes it); flat clipping only, no
  distributed or ghost-clipping modes, which are refused before anything is modified.
"""

from __future__ import annotations

import os
import warnings
from typing import IO, Any, BinaryIO

import torch
from opacus import PrivacyEngine as OpacusPrivacyEngine
from opacus.accountants import create_accountant
from opacus.accountants.utils import get_noise_multiplier
from opacus.distributed import DifferentiallyPrivateDistributedDataParallel as DPDDP
from opacus.optimizers import DPOptimizer
from opacus.optimizers.utils import params
from torch import nn, optim
from torch.distributed._composable.fsdp import FSDPModule
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader

from alm_opacus._validation import check_delta, check_epsilon
from alm_opacus.accounting import PipelineAccountant, find_noise_multiplier
from alm_opacus.mechanisms.sampling import NoiseGenerator
from alm_opacus.training.optimizer import (
    MechanismDPOptimizer,
    _check_max_grad_norm,
    training_mechanism,
)
from alm_opacus.training.sampler import SecureDPDataLoader

__all__ = ["DEFAULT_ACCOUNTANT", "PrivacyEngine", "noise_multiplier_for"]

DEFAULT_ACCOUNTANT = "alm_pld"
_UNSUPPORTED_GRAD_SAMPLE_MODES = ("ghost", "ghost_fsdp")


def _check_epochs(epochs: Any) -> int:
    if isinstance(epochs, bool) or not isinstance(epochs, int) or epochs < 1:
        raise ValueError(f"epochs={epochs!r} is invalid: expected an integer ≥ 1")
    return epochs


def noise_multiplier_for(
    *,
    accountant: Any,
    target_epsilon: float,
    target_delta: float,
    sample_rate: float,
    steps: int,
    noise_mechanism: str = "gaussian",
    dim: int | None = None,
    epsilon_tolerance: float = 0.01,
) -> float:
    """The noise multiplier for ``steps`` more steps, given what ``accountant`` holds.

    With a `PipelineAccountant` the search composes the new steps with everything already
    recorded (DP-SGD steps and releases), via `find_noise_multiplier(prior=accountant)`.
    Opacus's own accountants account for Gaussian noise only and cannot add a prior to
    Opacus's search, so they are accepted only empty and only for ``gaussian``.

    Args:
        accountant: the engine's accountant.
        target_epsilon: total ε after the new steps, > 0.
        target_delta: δ in (0, 1).
        sample_rate: Poisson rate the accountant will record.
        steps: number of new steps ≥ 1.
        noise_mechanism: the mechanism of the new steps.
        dim: noised coordinates per step (the optimizer's ``noise_dim``), as the hook
            records them.
        epsilon_tolerance: how far below the target the search may stop.

    Returns:
        σ (noise scale over ``max_grad_norm``).

    Raises:
        InfeasibleBudget: if the recorded budget leaves no σ that meets the target.
        ValueError: on an accountant that cannot account for the request, or bad input.
    """
    mechanism = training_mechanism(noise_mechanism).name
    epsilon, delta = check_epsilon(target_epsilon), check_delta(target_delta)
    if isinstance(accountant, PipelineAccountant):
        return float(
            find_noise_multiplier(
                target_epsilon=epsilon,
                target_delta=delta,
                sample_rate=sample_rate,
                steps=steps,
                mechanism=mechanism,
                prior=accountant,
                epsilon_tolerance=epsilon_tolerance,
                dim=dim,
            )
        )
    name = accountant.mechanism()
    if mechanism != "gaussian":
        raise ValueError(
            f"accountant={name!r} accounts for Gaussian noise only; noise_mechanism="
            f"{noise_mechanism!r} needs accountant={DEFAULT_ACCOUNTANT!r}"
        )
    if len(accountant) > 0:
        raise ValueError(
            f"accountant={name!r} already holds {len(accountant)} steps, and Opacus's search "
            f"cannot count them; use accountant={DEFAULT_ACCOUNTANT!r} to calibrate the total"
        )
    return float(
        get_noise_multiplier(
            target_epsilon=epsilon,
            target_delta=delta,
            sample_rate=sample_rate,
            steps=steps,
            accountant=name,
            epsilon_tolerance=epsilon_tolerance,
        )
    )


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

    def make_private(
        self,
        *,
        module: nn.Module,
        optimizer: optim.Optimizer,
        data_loader: DataLoader[Any],
        noise_multiplier: float,
        max_grad_norm: float,
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

        Args:
            module, optimizer, data_loader, noise_multiplier, max_grad_norm, criterion,
            clipping, grad_sample_mode, **kwargs: as in ``opacus.PrivacyEngine.make_private``
                (``batch_first``, ``loss_reduction``, ``wrap_model``, ``rand_on_empty``).
            noise_mechanism: ``"gaussian"`` (default, Opacus's noise), ``"alm"`` (alias
                ``"logistic"``) or ``"laplace"``; L1 clipping for the latter two.
            poisson_sampling: must be ``True``: the accounting assumes Poisson sampling.
            noise_generator: a seeded ``torch.Generator`` for reproducible research (needs
                ``secure_mode=False``); ``None`` for a `SecureGenerator`.
            exact: exact steps on a grid (default; `MechanismDPOptimizer`); ``False`` keeps
                floating-point noise, open to a floating-point adversary (comparisons only).

        Returns:
            (module, optimizer, data_loader): the optimizer a `MechanismDPOptimizer`, the
            loader a `SecureDPDataLoader`.

        Raises:
            ValueError: on an unsupported option, mechanism or accountant, checked before
                the module, optimizer or loader are touched.
        """
        mechanism = self._check_request(
            module=module,
            noise_mechanism=noise_mechanism,
            max_grad_norm=max_grad_norm,
            poisson_sampling=poisson_sampling,
            clipping=clipping,
            grad_sample_mode=grad_sample_mode,
        )
        if criterion is not None:
            kwargs["criterion"] = criterion
        return super().make_private(
            module=module,
            optimizer=optimizer,
            data_loader=data_loader,
            noise_multiplier=noise_multiplier,
            max_grad_norm=max_grad_norm,
            poisson_sampling=True,
            clipping="flat",
            noise_generator=noise_generator,
            grad_sample_mode=grad_sample_mode,
            noise_mechanism=mechanism,
            exact=exact,
            **kwargs,
        )

    def make_private_with_epsilon(
        self,
        *,
        module: nn.Module,
        optimizer: optim.Optimizer,
        data_loader: DataLoader[Any],
        target_epsilon: float,
        target_delta: float,
        epochs: int,
        max_grad_norm: float,
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
        mechanism = self._check_request(
            module=module,
            noise_mechanism=noise_mechanism,
            max_grad_norm=max_grad_norm,
            poisson_sampling=kwargs.pop("poisson_sampling", True),
            clipping=kwargs.pop("clipping", "flat"),
            grad_sample_mode=kwargs.get("grad_sample_mode", "hooks"),
        )
        steps_per_epoch = int(1 / (1 / len(data_loader)))  # as the Poisson sampler computes it
        sigma = noise_multiplier_for(
            accountant=self.accountant,
            target_epsilon=target_epsilon,
            target_delta=target_delta,
            sample_rate=1 / steps_per_epoch,
            steps=_check_epochs(epochs) * steps_per_epoch,
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

    def load_checkpoint(
        self,
        *,
        path: str | os.PathLike[str] | BinaryIO | IO[bytes],
        module: nn.Module,
        optimizer: DPOptimizer | None = None,
        **kwargs: Any,
    ) -> dict[str, Any]:
        """Opacus's ``load_checkpoint`` with ``torch.load(..., weights_only=True)``.

        Opacus loads with ``weights_only=False``, which runs any code a crafted checkpoint
        holds; every state saved by `save_checkpoint` here is plain data, so nothing is lost.

        Raises:
            ValueError: if ``torch_load_kwargs`` asks for ``weights_only``.
            pickle.UnpicklingError: if the file holds anything but tensors and plain data.
        """
        torch_load_kwargs = dict(kwargs.pop("torch_load_kwargs", None) or {})
        if "weights_only" in torch_load_kwargs:
            raise ValueError("torch_load_kwargs['weights_only'] is not allowed: it is always True")
        checkpoint: dict[str, Any] = torch.load(path, weights_only=True, **torch_load_kwargs)
        module.load_state_dict(
            checkpoint["module_state_dict"], **(kwargs.pop("module_load_dict_kwargs", None) or {})
        )
        self.accountant.load_state_dict(checkpoint["privacy_accountant_state_dict"])
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
        return checkpoint

    def _check_request(
        self,
        *,
        module: nn.Module,
        noise_mechanism: str,
        max_grad_norm: Any,
        poisson_sampling: bool,
        clipping: str,
        grad_sample_mode: str,
    ) -> str:
        """Validate a request before anything is modified; return the canonical mechanism."""
        mechanism = training_mechanism(noise_mechanism).name
        _check_max_grad_norm(max_grad_norm)
        if mechanism != "gaussian" and not isinstance(self.accountant, PipelineAccountant):
            raise ValueError(
                f"accountant={self.accountant.mechanism()!r} accounts for Gaussian noise only; "
                f"noise_mechanism={noise_mechanism!r} needs accountant={DEFAULT_ACCOUNTANT!r}"
            )
        if poisson_sampling is not True:
            raise ValueError(
                f"poisson_sampling={poisson_sampling!r} is invalid: the accounting assumes "
                "Poisson sampling, so it must be True"
            )
        if clipping != "flat":
            raise ValueError(f"clipping={clipping!r} is invalid: expected 'flat'")
        if grad_sample_mode in _UNSUPPORTED_GRAD_SAMPLE_MODES:
            raise ValueError(
                f"grad_sample_mode={grad_sample_mode!r} is invalid: ghost clipping computes L2 "
                "norms only; expected 'hooks', 'ew' or 'functorch'"
            )
        if isinstance(module, DPDDP | DDP | FSDPModule):
            raise ValueError(f"module of type {type(module).__name__} is invalid: not distributed")
        return mechanism

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
            data_loader, generator=generator, batch_first=batch_first, rand_on_empty=rand_on_empty
        )

    def _prepare_optimizer(
        self,
        *,
        optimizer: optim.Optimizer,
        noise_multiplier: float,
        max_grad_norm: float,
        expected_batch_size: int,
        loss_reduction: str = "mean",
        noise_generator: NoiseGenerator | None = None,
        noise_mechanism: str = "gaussian",
        exact: bool = True,
        **kwargs: Any,
    ) -> MechanismDPOptimizer:
        if isinstance(optimizer, DPOptimizer):
            optimizer = optimizer.original_optimizer
        return MechanismDPOptimizer(
            optimizer,
            noise_multiplier=noise_multiplier,
            max_grad_norm=max_grad_norm,
            expected_batch_size=expected_batch_size,
            loss_reduction=loss_reduction,
            noise_mechanism=noise_mechanism,
            generator=noise_generator,
            exact=exact,
        )
