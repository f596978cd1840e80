"""`BufferedGradSampleModule`: Opacus's hooks, with per-sample gradients in reused buffers.

Opacus's ``GradSampleModule`` allocates every parameter's per-sample gradients afresh at each
backward pass, and three times over: the grad sampler's result, a ``torch.zeros`` tensor of
the batch's size, and a copy of the one into the other (``create_or_accumulate_grad_sample``).
On the CPU a fresh tensor of tens of megabytes is fresh pages from the kernel (glibc serves
it with ``mmap``), so each pass pays a page fault per 4 KiB: at 1M parameters and a batch of
64, 3 of every 4 milliseconds of Opacus's forward and backward pass went to zeroing and
faulting in the 3 × 274 MB, not to arithmetic (``scripts/bench_dpsgd.py``).

This module keeps one buffer per parameter, reused from step to step, and writes into it:
``nn.Linear``'s weight gradients (2-D inputs) directly (``torch.mul(bᵢ ⊗ aᵢ, out=...)``,
the same products Opacus's einsum computes, bit for bit), every other parameter's through a
copy from its grad sampler. The values are Opacus's; only where they live changes. What is
kept from Opacus: the samplers (and ``register_grad_sampler``), the loss reduction, zero rows
beyond a short batch, ``+=`` for a second pass through one module in one backward (tied or
recurrent layers), and stacking across backward passes. A buffer is reused only once the
optimizer has consumed it (``p.grad_sample`` is ``None`` again, as ``DPOptimizer.zero_grad``
leaves it); a backward pass that finds an unconsumed ``p.grad_sample`` gets a fresh tensor,
as in Opacus. So a reference to ``p.grad_sample`` kept past ``zero_grad`` sees the next
batch's values: clone it to keep it.

**Float32 rows for an exact optimizer.** An exact `MechanismDPOptimizer` clips in float32
tiles and rounds float64 per-sample gradients to float32 first (`fused_cell_sums`), so it
marks its parameters (``_float32_rows``). For such a float64 ``nn.Linear`` weight on the CPU,
the direct path writes fl32(bᵢ ⊗ aᵢ) in one compiled pass: each entry the float64 product
rounded to float64 and then to float32, exactly what Opacus's product followed by
``.to(torch.float32)`` gives (no float64 tensor of the batch is written, 3 of a 10⁴-member
head's 9 ms step). ``p.grad_sample`` then holds those float32 values, and the factors are
kept (``_float32_factors``): `widen_grad_sample` restores the float64 products, bit for bit,
for every other use (the optimizer's float64 path, a second pass through the layer, gradient
accumulation).
"""

from __future__ import annotations

import math
from typing import Any, cast

import numpy as np
import torch
from opacus.grad_sample import GradSampleModule
from opacus.grad_sample.functorch import ft_compute_per_sample_gradient
from opacus.grad_sample.grad_sample_module import promote_current_grad_sample
from opacus.grad_sample.linear import compute_linear_grad_sample
from opacus.utils.module_utils import trainable_parameters
from torch import nn

from alm_opacus.mechanisms.jit import NUMBA
from alm_opacus.mechanisms.jit import jit_uncontracted as _jit_uncontracted

__all__ = ["BufferedGradSampleModule", "widen_grad_sample"]

#: Where a parameter's buffer may still be referenced: stored in this backward pass but not
#: yet promoted (``_current_grad_sample``), or promoted but not consumed (``grad_sample``).
_IN_USE = ("_current_grad_sample", "grad_sample")


@_jit_uncontracted
def _outer_rows32(backprops: np.ndarray, activations: np.ndarray, out: np.ndarray) -> None:
    """out[i, c·D + j] = fl32(fl64(bᵢ꜀ · aᵢⱼ)): float64 factors, a float32 ``(B, C·D)`` out."""
    batch, classes = backprops.shape
    width = activations.shape[1]
    for i in range(batch):
        a = activations[i]
        for c in range(classes):
            b = backprops[i, c]
            row = out[i, c * width : (c + 1) * width]
            for j in range(width):
                row[j] = np.float32(b * a[j])


def widen_grad_sample(p: torch.Tensor) -> None:
    """Put back the float64 per-sample gradients wherever ``p`` holds float32 rows (module
    docstring): ``torch.mul`` of the kept factors, Opacus's values bit for bit."""
    held = getattr(p, "_float32_factors", None)
    if held is None:
        return
    rows, backprops, activations = held
    p._float32_factors = None  # type: ignore[attr-defined]
    for attr in _IN_USE:
        value = getattr(p, attr, None)
        if isinstance(value, list):
            setattr(p, attr, [_product(backprops, activations) if v is rows else v for v in value])
        elif value is rows:
            setattr(p, attr, _product(backprops, activations))


def _product(
    backprops: torch.Tensor, activations: torch.Tensor, *, out: torch.Tensor | None = None
) -> torch.Tensor:
    # bᵢ ⊗ aᵢ: each entry one rounded product, as Opacus's einsum (a batched GEMM with an
    # inner dimension of 1) computes it
    return torch.mul(backprops[:, :, None], activations[:, None, :], out=out)


class BufferedGradSampleModule(GradSampleModule):
    """Opacus's ``GradSampleModule`` (``grad_sample_mode="hooks"`` or ``"functorch"``) whose
    per-sample gradients live in one reused buffer per parameter (module docstring)."""

    def __init__(self, m: nn.Module, **kwargs: Any) -> None:
        """Args:
        m: the module; ``**kwargs`` as ``GradSampleModule`` (``batch_first``,
            ``loss_reduction``, ``strict``, ``force_functorch``).
        """
        super().__init__(m, **kwargs)
        self._grad_sample_buffers: dict[int, torch.Tensor] = {}

    def remove_hooks(self) -> None:
        """Opacus's ``remove_hooks``; the buffers are released with the hooks."""
        self._grad_sample_buffers.clear()
        super().remove_hooks()

    def capture_backprops_hook(
        self,
        module: nn.Module,
        _forward_input: torch.Tensor,
        forward_output: torch.Tensor,
        loss_reduction: str,
        batch_first: bool,
    ) -> None:
        """Opacus's backward hook (same samplers, reduction and accumulation rules), storing
        each per-sample gradient in the parameter's buffer."""
        if not self.hooks_enabled:
            return
        for _, p in trainable_parameters(module):
            widen_grad_sample(p)  # float32 rows never mix with another pass's gradients
        activations, backprops = self.rearrange_grad_samples(
            module=module,
            backprops=forward_output[0].detach(),
            loss_reduction=loss_reduction,
            batch_first=batch_first,
        )
        batch: int = module.max_batch_len  # type: ignore[assignment]
        samples = self._grad_samples(module, activations, backprops, batch=batch)
        for param, grad_sample in samples.items():
            self._store(param, grad_sample, batch=batch)
        for _, p in trainable_parameters(module):
            p._forward_counter -= 1
            if p._forward_counter == 0:
                promote_current_grad_sample(p)
            if (
                not self.grad_accumulation_allowed
                and isinstance(p.grad_sample, list)
                and len(p.grad_sample) > 1
            ):
                raise ValueError(
                    "Poisson sampling is not compatible with gradient accumulation: call "
                    "optimizer.step() after every forward and backward pass (or use Opacus's "
                    "BatchMemoryManager)"
                )
        if not module.activations and hasattr(module, "max_batch_len"):
            del module.max_batch_len

    def _grad_samples(
        self,
        module: nn.Module,
        activations: list[torch.Tensor],
        backprops: torch.Tensor,
        *,
        batch: int,
    ) -> dict[torch.Tensor, torch.Tensor]:
        """Per-sample gradients of ``module``'s parameters from its registered sampler; a
        plain ``nn.Linear`` with 2-D inputs writes its weight's straight into the buffer."""
        module_type = self._get_module_type(module)
        if self.force_functorch or module_type not in self.GRAD_SAMPLERS:
            return ft_compute_per_sample_gradient(module, activations, backprops)
        sampler = self.GRAD_SAMPLERS[module_type]
        linear = sampler is compute_linear_grad_sample and module_type is nn.Linear
        direct = activations[0].dim() == 2 and backprops.dim() == 2 and len(backprops) == batch
        if not (linear and direct):
            return sampler(module, activations, backprops)
        samples: dict[torch.Tensor, torch.Tensor] = {}
        layer = cast(nn.Linear, module)
        weight = layer.weight
        if weight.requires_grad:
            shape, b_device = (batch, *weight.shape), backprops.device
            if self._float32_rows(weight, backprops, activations[0]):
                out = self._buffer(weight, shape=shape, dtype=torch.float32, device=b_device)
                b, a = backprops.contiguous(), activations[0].contiguous()
                _outer_rows32(b.numpy(), a.numpy(), out.view(batch, weight.numel()).numpy())
                weight._float32_factors = (out, b, a)  # type: ignore[attr-defined]
                samples[weight] = out
            else:
                out = self._buffer(weight, shape=shape, dtype=backprops.dtype, device=b_device)
                samples[weight] = _product(backprops, activations[0], out=out)
        if layer.bias is not None and layer.bias.requires_grad:
            samples[layer.bias] = backprops
        return samples

    @staticmethod
    def _float32_rows(weight: torch.Tensor, backprops: torch.Tensor, act: torch.Tensor) -> bool:
        """Whether ``weight``'s rows may be written in float32 (module docstring): marked by an
        exact optimizer, float64 CPU factors, compiled kernels, and no rows in use."""
        return (
            getattr(weight, "_float32_rows", False)
            and NUMBA is not None
            and backprops.dtype == act.dtype == torch.float64
            and backprops.device.type == act.device.type == "cpu"
            and not _in_use(weight)
        )

    def _buffer(
        self,
        param: torch.Tensor,
        *,
        shape: tuple[int, ...],
        dtype: torch.dtype,
        device: torch.device,
    ) -> torch.Tensor:
        """``param``'s buffer viewed as ``shape``, never while it is in use: a fresh tensor
        while this backward pass has already stored into it (a second pass through a tied
        layer adds to it) or while the optimizer has not consumed it (accumulation)."""
        if _in_use(param):
            return torch.empty(shape, dtype=dtype, device=device)
        size = math.prod(shape)
        buffer = self._grad_sample_buffers.get(id(param))
        kept = buffer is not None and (buffer.dtype, buffer.device) == (dtype, device)
        if buffer is None or not kept or buffer.numel() < size:
            buffer = torch.empty(size, dtype=dtype, device=device)
            self._grad_sample_buffers[id(param)] = buffer
        return buffer[:size].view(shape)

    def _store(self, param: torch.Tensor, grad_sample: torch.Tensor, *, batch: int) -> None:
        """Opacus's ``create_or_accumulate_grad_sample`` into ``param``'s buffer: rows past
        the sampler's batch stay zero; a second pass in one backward adds in place."""
        if not param.requires_grad:
            return
        current = getattr(param, "_current_grad_sample", None)
        if current is not None:
            current[: len(grad_sample)] += grad_sample
            return
        shape = (batch, *grad_sample.shape[1:])
        target = self._buffer(
            param, shape=shape, dtype=grad_sample.dtype, device=grad_sample.device
        )
        if target.data_ptr() == grad_sample.data_ptr() and target.shape == grad_sample.shape:
            target = grad_sample  # written in place: the same tensor (`widen_grad_sample`)
        else:
            target[: len(grad_sample)].copy_(grad_sample)
            target[len(grad_sample) :].zero_()
        param._current_grad_sample = target  # type: ignore[attr-defined]


def _in_use(param: torch.Tensor) -> bool:
    """Whether ``param``'s per-sample gradients are still referenced (`_IN_USE`)."""
    return any(getattr(param, attr, None) is not None for attr in _IN_USE)
