"""DP-SGD on several processes (``torch.distributed``) with any of the three noise mechanisms.

`DistributedMechanismDPOptimizer` is to `MechanismDPOptimizer` what Opacus's
``DistributedDPOptimizer`` is to its ``DPOptimizer``. With W ranks, each holding the part
``S_t^r`` of the step's Poisson batch that its shard drew (`SecureDistributedPoissonSampler`),
one step releases

    g̃_t = ( Σ_r Σ_{i ∈ S_t^r} clip(g_i)  +  Z_t ) / B,

exactly the single-process release (Abadi et al. 2016, Algorithm 1), where:

- every rank clips its own examples in the mechanism's norm (L1 for ``alm`` and ``laplace``,
  L2 for ``gaussian``), so one example still moves the sum by at most C in that norm;
- ``Z_t`` is drawn ONCE per step, on rank 0, from rank 0's noise source (`SecureGenerator`
  unless a seeded generator was passed); the other ranks draw nothing. Drawing it on every
  rank would add W independent copies, W times the variance the accountant assumes;
- the noisy partial sums are all-reduced (SUM), so every rank holds the same g̃_t and, its
  optimizer state being the same, takes the same step: the parameters stay identical;
- ``B`` is the expected GLOBAL batch size, W times Opacus's per-rank ``expected_batch_size``.

The accounting is unchanged: one step at the global rate q, with the mechanism and noised
dimension of a single-process step; every rank's accountant records it, so ``get_epsilon``
agrees on every rank.

`DistributedMechanismDPOptimizer.noisy_global_sum` is the only place where ranks exchange
anything. In an exact step (the default) each rank's partial sum is already int64 grid cells
(every example rounded and bounded as in one process), rank 0 adds the step's exact integer
noise (`MechanismDPOptimizer.cell_noise`), the all-reduce sums int64 exactly (integer
addition is associative, so the total does not depend on the reduction order and every rank
holds the same integers), and each rank turns the total into γ·cells. A float step
(``exact=False``) all-reduces float partial sums plus float noise drawn on rank 0.
"""

from __future__ import annotations

from typing import Any

import torch
from opacus.optimizers.optimizer import _check_processed_flag, _mark_as_processed
from torch import distributed as dist
from torch.optim import Optimizer

from alm_opacus.mechanisms.sampling import NoiseGenerator
from alm_opacus.training.optimizer import MechanismDPOptimizer

__all__ = ["DistributedMechanismDPOptimizer", "distributed_world"]


def distributed_world() -> tuple[int, int]:
    """This process's ``(rank, world_size)`` in the default process group.

    Raises:
        ValueError: if ``torch.distributed`` is unavailable or not initialised.
    """
    if not dist.is_available() or not dist.is_initialized():
        raise ValueError(
            "torch.distributed is not initialised: call torch.distributed.init_process_group "
            "(torchrun sets its environment) before making a distributed module private"
        )
    return dist.get_rank(), dist.get_world_size()


class DistributedMechanismDPOptimizer(MechanismDPOptimizer):
    """`MechanismDPOptimizer` for one rank of several: noise once per step, sums all-reduced.

    Use it with ``DifferentiallyPrivateDistributedDataParallel`` or
    ``DistributedDataParallel`` and a ``SecureDPDataLoader(distributed=True)``; the engine
    (`alm_opacus.training.PrivacyEngine.make_private` on such a module) sets up all three.
    Clipping, the noise law, virtual steps and the accountant hook are `MechanismDPOptimizer`'s.

    Attributes:
        rank, world_size: this process's place in the default process group.
        noise_draws: how many steps this rank drew noise for (rank 0: every step; others: 0).
    """

    def __init__(
        self,
        optimizer: Optimizer,
        *,
        noise_multiplier: float,
        max_grad_norm: float | list[float],
        expected_batch_size: float | None,
        loss_reduction: str = "mean",
        noise_mechanism: str = "alm",
        generator: NoiseGenerator | None = None,
        secure_mode: bool = False,
        exact: bool = True,
        **kwargs: Any,
    ) -> None:
        """Args:
            expected_batch_size: the expected batch size PER RANK, as Opacus's
                ``DistributedDPOptimizer`` takes it (its engine passes ``q·N / W``); the
                noisy global sum is divided by W times it.
            optimizer, noise_multiplier, max_grad_norm, loss_reduction, noise_mechanism,
            generator, secure_mode, exact, **kwargs: as in `MechanismDPOptimizer`; only rank 0
                draws from ``generator``.

        Raises:
            ValueError: as `MechanismDPOptimizer`, or if ``torch.distributed`` is not
                initialised.
        """
        self.rank, self.world_size = distributed_world()
        super().__init__(
            optimizer,
            noise_multiplier=noise_multiplier,
            max_grad_norm=max_grad_norm,
            expected_batch_size=expected_batch_size,
            loss_reduction=loss_reduction,
            noise_mechanism=noise_mechanism,
            generator=generator,
            secure_mode=secure_mode,
            exact=exact,
            **kwargs,
        )
        self.noise_draws = 0

    def add_noise(self) -> None:
        """Replace each rank's clipped partial sum by the noisy global sum (`noisy_global_sum`),
        identical on every rank; the result goes to ``p.grad``."""
        partials = []
        for p in self.params:
            _check_processed_flag(p.summed_grad)
            partials.append(p.summed_grad)
            self.check_summed(p.summed_grad)
        for p, total in zip(self.params, self.noisy_global_sum(partials), strict=True):
            p.grad = self.cells_to_grad(total, p) if self.exact else total.view_as(p)
            _mark_as_processed(p.summed_grad)

    def scale_grad(self) -> None:
        """Divide by the expected GLOBAL batch size (``loss_reduction="mean"``)."""
        if self.loss_reduction == "mean":
            divisor = self.expected_batch_size * self.world_size * self.accumulated_iterations
            for p in self.params:
                p.grad /= divisor

    def noisy_global_sum(self, partials: list[torch.Tensor]) -> list[torch.Tensor]:
        """``Σ_ranks partial + Z`` per parameter, with ``Z`` drawn once (on rank 0).

        Every rank calls it with its clipped partial sums (one tensor per parameter, in
        ``self.params`` order) and gets the same totals back. Parameters are flattened into
        one buffer per (dtype, device), so a step costs one all-reduce per buffer, not one
        per parameter.

        Args:
            partials: this rank's clipped sums.

        Returns:
            The noisy global sums, shaped as ``partials``.
        """
        totals: list[torch.Tensor] = [torch.empty(0)] * len(partials)
        for positions in _buffers(partials):
            parts = [partials[i] for i in positions]
            encoded = torch.cat([t.reshape(-1) for t in parts])
            if self.rank == 0:
                encoded = encoded + self.step_noise(parts, like=encoded)
            dist.all_reduce(encoded, op=dist.ReduceOp.SUM)
            pieces = encoded.split([t.numel() for t in parts])
            for i, piece in zip(positions, pieces, strict=True):
                totals[i] = piece.view_as(partials[i])
        if self.rank == 0:
            self.noise_draws += 1
        return totals

    def step_noise(self, parts: list[torch.Tensor], *, like: torch.Tensor) -> torch.Tensor:
        """The step's noise, flattened as the buffer ``like``, drawn on rank 0 only.

        Drawn exactly as the single-process `MechanismDPOptimizer.add_noise` draws it: int64
        cells for every parameter in one call (`step_cell_noise`) in an exact step, floats
        per parameter (`float_noise`) otherwise. When every
        parameter has one dtype and device (one buffer), a run on W ranks with a seeded
        generator adds the noise a one-process run with that seed adds.
        """
        if self.exact:
            return self.step_cell_noise(parts).to(like.device)
        return torch.cat([self.float_noise(t).reshape(-1) for t in parts]).to(like.device)


def _buffers(tensors: list[torch.Tensor]) -> list[list[int]]:
    """Positions of ``tensors`` grouped by (dtype, device), in first-seen order."""
    groups: dict[tuple[torch.dtype, torch.device], list[int]] = {}
    for i, t in enumerate(tensors):
        groups.setdefault((t.dtype, t.device), []).append(i)
    return list(groups.values())
