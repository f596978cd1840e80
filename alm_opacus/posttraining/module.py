"""A released module: :class:`ProtectedModule` and its file (``save``/``load``).

The engine that makes one,
:class:`~alm_opacus.posttraining.engine.PostTrainingPrivacyEngine`, lives in
:mod:`alm_opacus.posttraining.engine`, which re-exports every public name here.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import torch
from torch import nn

from alm_opacus.io import atomic_torch_save
from alm_opacus.statement import PrivacyStatement

__all__ = ["RELEASE_KIND", "ProtectedModule"]


RELEASE_KIND = "alm_opacus.protected-module"


class ProtectedModule(nn.Module):
    """A released copy of a module whose selected parameters carry noise drawn once.

    Queries spend no budget: the noise is fixed at release time (ALM paper, Algorithm 1),
    so any number of forward passes is post-processing. Its ``state_dict()`` holds only the
    noisy weights; the clean weights stay with the owner.
    """

    def __init__(
        self, module: nn.Module, *, statement: PrivacyStatement, protected: tuple[str, ...]
    ) -> None:
        super().__init__()
        self.module = module
        self.statement = statement
        self.protected = protected

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self.module(*args, **kwargs)

    def save(self, path: str | Path, *, allow_seeded: bool = False) -> None:
        """Write the noisy weights and the statement, atomically.

        Args:
            path: the file to write.
            allow_seeded: write a release whose noise is seeded. Such a release is private
                only while its seed stays secret; refuse by default, since release files are
                exactly the files people exchange.

        Raises:
            ValueError: for a seeded release without ``allow_seeded``.
        """
        if self.statement.seeded and not allow_seeded:
            raise ValueError(
                f"{path}: refusing to save a release with seeded noise: anyone who learns the "
                "seed can subtract the noise; release with secure noise (seed=None), or pass "
                "allow_seeded=True for reproducible research"
            )
        atomic_torch_save(
            {
                "kind": RELEASE_KIND,
                "statement": self.statement.to_dict(),
                "protected": list(self.protected),
                "shapes": {k: list(v.shape) for k, v in self.module.state_dict().items()},
                "state_dict": self.module.state_dict(),
            },
            path,
        )

    @classmethod
    def load(cls, path: str | Path, *, module: nn.Module) -> ProtectedModule:
        """Load a saved release into ``module`` (an instance of the same architecture).

        Only tensors and plain data are read (``torch.load(weights_only=True)``): a file
        that would run code when unpickled is refused.

        Raises:
            ValueError: naming the file: if it is not a release, holds anything but plain
                data, lacks a key, its weights do not fit ``module``, a weight is NaN or
                infinite, or its statement is invalid.
        """
        try:
            state = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise ValueError(
                f"{path}: not a readable release file (only tensors and plain data are "
                f"loaded): {first}"
            ) from exc
        if not isinstance(state, dict) or state.get("kind") != RELEASE_KIND:
            raise ValueError(f"{path}: expected a file of kind {RELEASE_KIND!r}")
        missing = [k for k in _RELEASE_KEYS if k not in state]
        if missing:
            raise ValueError(
                f"{path}: the release lacks the keys {missing}: expected all of "
                f"{list(_RELEASE_KEYS)} (a truncated or altered file)"
            )
        expected = {k: list(v.shape) for k, v in module.state_dict().items()}
        if state["shapes"] != expected:
            if not isinstance(state["shapes"], dict):
                raise ValueError(f"{path}: expected 'shapes' to map names to shapes")
            diff = _shape_diff(state["shapes"], expected)
            raise ValueError(
                f"{path}: the release does not fit this architecture; mismatched "
                f"parameters (name: saved vs module): {'; '.join(diff)}"
            )
        weights = state["state_dict"]
        if not isinstance(weights, dict) or not all(
            isinstance(v, torch.Tensor) for v in weights.values()
        ):
            raise ValueError(f"{path}: expected a state_dict of tensors in the release")
        # the weights themselves must be what 'shapes' says (it is only a summary of them)
        held = {k: list(v.shape) for k, v in weights.items()}
        if held != expected:
            diff = _shape_diff(held, expected)
            raise ValueError(
                f"{path}: the release's weights do not fit this architecture; mismatched "
                f"parameters (name: saved vs module): {'; '.join(diff)}"
            )
        protected = state["protected"]
        if not isinstance(protected, list) or not all(isinstance(n, str) for n in protected):
            raise ValueError(f"{path}: expected 'protected' to be a list of parameter names")
        unknown = [n for n in protected if n not in expected]
        if unknown:
            raise ValueError(f"{path}: protected parameters {unknown} are not in the module")
        try:
            statement = PrivacyStatement.from_dict(state["statement"])
        except ValueError as exc:
            raise ValueError(f"{path}: the release's statement is invalid: {exc}") from None
        broken = [
            k
            for k, v in weights.items()
            if isinstance(v, torch.Tensor)
            and v.is_floating_point()
            and not bool(torch.isfinite(v).all())
        ]
        if broken:  # no statement covers NaN or infinite weights: they are no release
            raise ValueError(
                f"{path}: the release holds non-finite weights in {', '.join(broken[:5])}: "
                "expected finite numbers (a corrupt or altered file)"
            )
        target = copy.deepcopy(module)
        target.load_state_dict(weights)
        return cls(target, statement=statement, protected=tuple(protected))


#: The keys of a saved release (`ProtectedModule.save`).
_RELEASE_KEYS = ("kind", "statement", "protected", "shapes", "state_dict")


def _shape_diff(saved: dict[str, list[int]], module: dict[str, list[int]]) -> list[str]:
    return [
        f"{k}: {saved.get(k, 'absent')} vs {module.get(k, 'absent')}"
        for k in sorted(set(saved) | set(module))
        if saved.get(k) != module.get(k)
    ]
