"""The no-leak reference: a release that never saw the members, attacked like the others."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

import pytest
import torch

from alm_opacus.heads import HeadConfig, train_head
from alm_opacus.methods import (
    ReleaseRequest,
    create_method,
    default_methods,
    method_class,
    reference_methods,
)
from alm_opacus.report.results import ResultRow
from alm_opacus.report.series import NO_LEAK, methods, no_leak, points
from alm_opacus.statement import Guarantee


def test_it_is_a_reference_never_a_protection() -> None:
    assert reference_methods() == [NO_LEAK]
    assert NO_LEAK not in default_methods()  # `--methods all` never offers it
    cls = method_class(NO_LEAK)
    assert cls.reference and not cls.baseline and not cls.in_all


def test_it_trains_on_public_rows_only(make_context) -> None:  # type: ignore[no-untyped-def]
    context = make_context(head=HeadConfig(steps=30))
    method = create_method(NO_LEAK)
    # members whose every value is NaN: a head that touched them would not be finite
    members = torch.full((150, context.public_features.shape[1]), math.nan, dtype=torch.float64)
    labels = torch.zeros(150, dtype=torch.int64)
    head = method.prepare(features=members, labels=labels, seed=3, context=context)
    weights = torch.cat([p.detach().flatten() for p in head.parameters()])
    assert torch.isfinite(weights).all()
    # as many public rows as members, drawn by the seed: another seed, other rows
    other = method.prepare(features=members, labels=labels, seed=4, context=context)
    probe = context.public_features
    assert not torch.equal(head.predict_proba(probe), other.predict_proba(probe))
    release = method.release(
        head,
        ReleaseRequest(
            features=members,
            labels=labels,
            epsilon=math.inf,
            delta=0.0,
            seed=3,
            draw=0,
            context=context,
        ),
    )
    assert release.statement.guarantee is Guarantee.NONE
    assert any("never saw the members" in note for note in release.statement.notes)
    assert not release.baseline  # utility is measured against `none`, never against it


def test_it_uses_every_public_row_when_there_are_fewer_than_members(make_context) -> None:  # type: ignore[no-untyped-def]
    context = make_context(head=HeadConfig(steps=30))
    x, y = context.public_features[:40], context.public_labels[:40]
    small = dataclasses.replace(context, public_features=x, public_labels=y)
    members = torch.zeros((150, x.shape[1]), dtype=x.dtype)
    head = create_method(NO_LEAK).prepare(
        features=members, labels=torch.zeros(150, dtype=torch.int64), seed=0, context=small
    )
    # the seed only permutes the 40 rows: the same rows in another order train the same head
    expected = train_head(x, y, num_classes=10, config=small.head, seed=0)
    assert torch.allclose(head.predict_proba(x), expected.predict_proba(x), atol=1e-6)


def test_views_read_it_apart_from_the_methods(result_row: Callable[..., ResultRow]) -> None:
    def row(method: str, epsilon: float, auc: float) -> ResultRow:
        return result_row(
            method=method,
            epsilon=epsilon,
            attack="loss",
            mia_auc=auc,
            mia_auc_ci_low=auc - 0.05,
            mia_auc_ci_high=auc + 0.05,
        )

    rows = [row("none", math.inf, 0.6), row("alm", 1.0, 0.52), row(NO_LEAK, math.inf, 0.53)]
    assert [p.method for p in points(rows)] == ["alm", "none"]
    assert methods(rows) == ["none", "alm"]
    reference = no_leak(rows)
    assert reference is not None and reference.method == NO_LEAK
    assert (reference.mia_auc.low, reference.mia_auc.high) == pytest.approx((0.48, 0.58))
    assert no_leak(rows[:2]) is None
