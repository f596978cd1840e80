"""DP-SGD tuning on public data: linear heads score every candidate's tuning draws in one run
of the batched re-implementation of Opacus's algorithm, at the noise the Opacus run is
calibrated to; the release (and every other head) trains through Opacus."""

from __future__ import annotations

from typing import Any

import pytest
import torch

import baselines.dpsgd.loop as loop
import baselines.dpsgd.method as method_module
from alm_opacus.heads import HeadConfig
from alm_opacus.methods import MethodContext, ReleaseRequest, create_method
from baselines._common import TUNING_BUDGET, TUNING_DRAWS
from baselines.dpsgd import DPSGDMethod

BATCHED = "batched re-implementation of Opacus's algorithm"
N = 100  # members; the public split of 300 rows trains on 100 and validates on 200


def _request(x: torch.Tensor, y: torch.Tensor, ctx: MethodContext) -> ReleaseRequest:
    return ReleaseRequest(
        features=x[:N], labels=y[:N], epsilon=2.0, delta=1e-5, seed=0, draw=0, context=ctx
    )


def _dpsgd(name: str, options: dict[str, Any]) -> DPSGDMethod:
    method = create_method(name, options)
    assert isinstance(method, DPSGDMethod)
    return method


def _spy(monkeypatch: pytest.MonkeyPatch, name: str) -> list[dict[str, Any]]:
    """Record the keyword arguments of every call of ``method_module.<name>``."""
    calls: list[dict[str, Any]] = []
    real = getattr(method_module, name)

    def spy(*args: Any, **kwargs: Any) -> Any:
        calls.append(kwargs)
        return real(*args, **kwargs)

    monkeypatch.setattr(method_module, name, spy)
    return calls


@pytest.mark.parametrize("name", ["dpsgd", "dpsgd-alm", "dpsgd-laplace"])
def test_linear_heads_tune_batched_at_the_opacus_runs_noise_and_release_through_opacus(
    name: str, pixel_features, make_context, monkeypatch: pytest.MonkeyPatch
) -> None:
    x, y = pixel_features
    ctx = make_context()
    batched = _spy(monkeypatch, "dpsgd_linear_heads")
    opacus = _spy(monkeypatch, "train_dpsgd_head")
    method = _dpsgd(name, {"epochs": 2})
    prepared = method.prepare(features=x[:N], labels=y[:N], seed=0, context=ctx)
    release = method.release(prepared, _request(x, y, ctx))
    # one batched run per candidate, all tuning draws in it; Opacus trains the release only
    assert len(batched) == TUNING_BUDGET and len(opacus) == 1
    assert all(tuple(c["masks"].shape) == (TUNING_DRAWS, N) for c in batched)
    assert all(bool(c["masks"].all()) for c in batched)
    tuning = release.info["tuning"]
    assert BATCHED in tuning["note"] and "costs no privacy" in tuning["note"]
    # The public training rows are as many as the members, so the chosen candidate's batched
    # run and the release's Opacus run share q, steps, accountant, mechanism and dimension:
    # the same calibrated sigma and the same exact-step noise scale sigma * Δ'.
    chosen = next(c for c in batched if c["config"].to_dict() == release.chosen_config)
    assert chosen["sigma"] == release.info["noise_multiplier"] > 0
    assert chosen["noise_sensitivity"] == release.statement.grid_sensitivity
    assert chosen["mechanism"] == release.info["noise_mechanism"]
    assert chosen["noise_seed"] is not None and chosen["seed"] != chosen["noise_seed"]
    # the draws are independent noisy runs
    assert prepared.split is not None
    request = _request(x, y, ctx)
    config, _ = method.choose(prepared, request)
    answer = method.tuning_answers(prepared, config, split=prepared.split, request=request)
    assert not torch.equal(answer(0), answer(1))


def test_mlp_heads_tune_through_opacus(
    pixel_features, make_context, monkeypatch: pytest.MonkeyPatch
) -> None:
    x, y = pixel_features
    ctx = make_context(head=HeadConfig(kind="mlp", hidden=8))
    batched = _spy(monkeypatch, "dpsgd_linear_heads")
    opacus = _spy(monkeypatch, "train_dpsgd_head")
    method = create_method("dpsgd", {"epochs": 1})
    prepared = method.prepare(features=x[:N], labels=y[:N], seed=0, context=ctx)
    release = method.release(prepared, _request(x, y, ctx))
    assert batched == [] and len(opacus) == TUNING_BUDGET * TUNING_DRAWS + 1
    assert BATCHED not in release.info["tuning"]["note"]


class _FloatEngine:
    """``alm_opacus.training``'s engine with floating-point steps (``exact=False``): the step
    the batched trainer re-implements."""

    def __init__(self, accountant: str, *, seeded: bool) -> None:
        self._engine = loop.alm_engine(accountant, seeded=seeded)
        self.accountant = self._engine.accountant

    def make_private(self, **kwargs: Any) -> Any:
        return self._engine.make_private(exact=False, **kwargs)


FLOAT_STEPS = loop.TrainingBackend(
    engine=_FloatEngine, generators=loop.alm_generators, secure_note=loop.SECURE_NOTE
)


def _scores_and_answers(
    name: str,
    *,
    batched: bool,
    backend: loop.TrainingBackend,
    x: torch.Tensor,
    y: torch.Tensor,
    ctx: MethodContext,
    monkeypatch: pytest.MonkeyPatch,
) -> tuple[list[float], torch.Tensor]:
    """Every candidate's validation accuracy and the chosen one's answers (both draws)."""
    method = _dpsgd(name, {"epochs": 10, "batch_size": 1000})
    monkeypatch.setattr(method, "backend", backend)
    if not batched:
        monkeypatch.setattr(method, "_batched_tuning", lambda context: False)
    prepared = method.prepare(features=x[:N], labels=y[:N], seed=0, context=ctx)
    request = _request(x, y, ctx)
    config, result = method.choose(prepared, request)
    assert (BATCHED in result.note) is batched
    assert prepared.split is not None
    answer = method.tuning_answers(prepared, config, split=prepared.split, request=request)
    return (
        [t["validation_accuracy"] for t in result.tried],
        torch.stack([answer(draw) for draw in range(TUNING_DRAWS)]),
    )


@pytest.mark.parametrize("name", ["dpsgd", "dpsgd-alm"])
def test_without_noise_and_with_full_batches_batched_scores_equal_the_opacus_paths(
    name: str, pixel_features, make_context, monkeypatch: pytest.MonkeyPatch
) -> None:
    # sigma = 0 and q = 1 (a batch larger than the rows) make every path deterministic.
    def no_noise(**_: Any) -> tuple[float, bool]:
        return 0.0, True

    monkeypatch.setattr(method_module, "calibrated_sigma", no_noise)
    monkeypatch.setattr(loop, "calibrated_sigma", no_noise)
    # sigma = 0 spends infinite epsilon: the post-training check has nothing to check here
    monkeypatch.setattr(loop, "checked_epsilon", lambda history, **_: (0.0, 0))
    x, y = pixel_features
    ctx = make_context()
    run = {"x": x, "y": y, "ctx": ctx, "monkeypatch": monkeypatch}
    ours, our_answers = _scores_and_answers(name, batched=True, backend=loop.ALM_TRAINING, **run)
    # The engine's floating-point step, which the batched loop re-implements: the same heads
    # up to rounding, hence the same scores.
    floats, float_answers = _scores_and_answers(name, batched=False, backend=FLOAT_STEPS, **run)
    assert ours == floats and len(set(ours)) > 1  # and the candidates are told apart
    torch.testing.assert_close(our_answers, float_answers, atol=1e-6, rtol=0)
    # The released head's exact steps round each clipped gradient to a grid finer than
    # C 2^-7 / sqrt(p): the probabilities move by that rounding only.
    _, exact_answers = _scores_and_answers(name, batched=False, backend=loop.ALM_TRAINING, **run)
    torch.testing.assert_close(our_answers, exact_answers, atol=1e-3, rtol=0)
