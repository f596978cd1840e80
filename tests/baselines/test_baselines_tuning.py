"""The baselines' tuning template (``baselines._common.TunedMethod``) and the release request."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import Tensor

from alm_opacus.heads import HeadConfig
from alm_opacus.mechanisms import is_secure
from alm_opacus.methods import MethodContext, NoisePolicy, NoOptions, ReleaseRequest
from alm_opacus.plugin import derive_seed
from baselines._common import (
    TUNING_DRAWS,
    PreparedData,
    PublicSplit,
    TunedMethod,
    TuningSpace,
)

#: Validation accuracy of each candidate per tuning draw (4 validation rows: 0.25 steps).
ACCURACY = {"a": (0.5, 0.5), "b": (1.0, 0.25), "c": (0.75, 0.75), "d": (0.75, 0.5)}


class _Toy(TunedMethod[NoOptions, PreparedData, str]):
    """Candidates answer the validation rows right in the fraction :data:`ACCURACY` gives."""

    name = "toy-tuned"

    def __init__(self, *, fixed: str | None = None, tune: bool = True) -> None:
        super().__init__()
        self.fixed, self.tune = fixed, tune
        self.calls: list[tuple[str, Any]] = []

    def tuning_space(self, prepared: PreparedData, request: ReleaseRequest) -> TuningSpace[str]:
        return TuningSpace(
            key=float(request.epsilon),
            candidates=list(ACCURACY),
            default="a",
            describe=lambda c: {"name": c},
            fixed=self.fixed,
            tune=self.tune,
        )

    def tuning_answers(
        self, prepared: PreparedData, candidate: str, *, split: PublicSplit, request: ReleaseRequest
    ) -> Callable[[int], Tensor]:
        self.calls.append(("fit", candidate))
        labels = split.validation_labels

        def answer(draw: int) -> Tensor:
            self.calls.append(("draw", (candidate, draw)))
            right = round(ACCURACY[candidate][draw] * len(labels))
            guess = torch.where(torch.arange(len(labels)) < right, labels, (labels + 1) % 2)
            return torch.nn.functional.one_hot(guess, 2).double()

        return answer


def _setup(public: int = 28) -> tuple[PreparedData, MethodContext]:
    """4 members; the public split trains on 4 rows and validates on the rest (>= 20)."""
    x = torch.randn(public, 3, generator=torch.Generator().manual_seed(0))
    y = torch.arange(public) % 2
    context = MethodContext(num_classes=2, head=HeadConfig(), public_features=x, public_labels=y)
    prepared = PreparedData.build(features=x[:4], labels=y[:4], seed=0, context=context)
    return prepared, context


def _request(context: MethodContext, *, epsilon: float = 1.0, draw: int = 0) -> ReleaseRequest:
    x = torch.zeros(4, 3)
    return ReleaseRequest(
        features=x,
        labels=torch.zeros(4),
        epsilon=epsilon,
        delta=0.0,
        seed=0,
        draw=draw,
        context=context,
    )


def test_the_best_mean_accuracy_over_the_tuning_draws_wins_once_per_key() -> None:
    prepared, context = _setup()
    assert prepared.split is not None and len(prepared.split.validation_labels) == 24
    method = _Toy()
    chosen, result = method.choose(prepared, _request(context))
    # means: a 0.5, b 0.625, c 0.75, d 0.625: c wins although b has the best single draw
    assert TUNING_DRAWS == 2 and chosen == "c"
    assert [t["validation_accuracy"] for t in result.tried] == [0.5, 0.625, 0.75, 0.625]
    assert result.to_info()["chosen"] == {"name": "c"} and "costs no privacy" in result.note
    # each candidate fitted once, its draws answered in order
    assert method.calls[:3] == [("fit", "a"), ("draw", ("a", 0)), ("draw", ("a", 1))]
    assert len(method.calls) == 4 * (1 + TUNING_DRAWS)
    # another draw at the same epsilon reuses the choice; another epsilon tunes again
    assert method.choose(prepared, _request(context, draw=1)) == (chosen, result)
    assert len(method.calls) == 12
    method.choose(prepared, _request(context, epsilon=2.0))
    assert len(method.calls) == 24 and set(prepared.tuned) == {1.0, 2.0}


@pytest.mark.parametrize(
    ("toy", "public", "reason"),
    [
        (_Toy(fixed="name"), 28, "not tuned: name fixed by options"),
        (_Toy(tune=False), 28, "not tuned: tune=false"),
        (_Toy(), 23, "not tuned: no public data large enough for a validation split"),
    ],
)
def test_tuning_is_skipped_for_the_default_with_its_reason(
    toy: _Toy, public: int, reason: str
) -> None:
    prepared, context = _setup(public)
    chosen, result = toy.choose(prepared, _request(context))
    assert chosen == "a" and result.note == reason and result.tried == ({"name": "a"},)
    assert toy.calls == []


def test_a_request_seeds_its_noise_from_method_seed_draw_and_epsilon() -> None:
    _, context = _setup()
    seeded = MethodContext(num_classes=2, head=HeadConfig(), noise=NoisePolicy(reproducible=True))
    request = ReleaseRequest(
        features=torch.zeros(1, 3),
        labels=torch.zeros(1),
        epsilon=2,
        delta=0.0,
        seed=5,
        draw=3,
        context=seeded,
    )
    assert request.noise_seed("m") == derive_seed("m", 5, 3, 2.0)
    first, again = request.noise_generator("m"), request.noise_generator("m")
    assert isinstance(first, torch.Generator) and isinstance(again, torch.Generator)
    assert torch.equal(torch.rand(4, generator=first), torch.rand(4, generator=again))
    assert not is_secure(first)
    secure = ReleaseRequest(
        features=torch.zeros(1, 3),
        labels=torch.zeros(1),
        epsilon=math.inf,
        delta=0.0,
        seed=5,
        draw=3,
        context=context,
    )
    assert secure.noise_seed("m") is None and is_secure(secure.noise_generator("m"))
