"""The statement contract: no constructor path may claim more than is proven."""

from __future__ import annotations

import math

import pytest

from alm_opacus.protect import Guarantee, PrivacyStatement, SensitivityInfo

SAMPLED = SensitivityInfo(value=0.3, norm="l1", source="sampled", m=200, gamma=0.02,
                          confidence=0.98)  # fmt: skip
ANALYTIC = SensitivityInfo(value=0.3, norm="l1", source="analytic")


def test_sampled_sensitivity_cannot_claim_pure_or_approx_dp() -> None:
    for g, delta in ((Guarantee.PURE_DP, 0.0), (Guarantee.APPROX_DP, 1e-5)):
        with pytest.raises(ValueError, match="random-dp"):
            PrivacyStatement(epsilon=1.0, delta=delta, guarantee=g, mechanism="alm",
                             sensitivity=SAMPLED)  # fmt: skip


def test_random_dp_needs_a_sampled_sensitivity_and_shows_gamma_and_confidence() -> None:
    with pytest.raises(ValueError):
        PrivacyStatement(epsilon=1.0, delta=0.0, guarantee="random-dp", mechanism="alm",
                         sensitivity=ANALYTIC)  # fmt: skip
    s = PrivacyStatement(epsilon=1.0, delta=0.0, guarantee="random-dp", mechanism="alm",
                         noise_scale=0.3, sensitivity=SAMPLED)  # fmt: skip
    text = str(s)
    assert "random-DP" in text and "gamma=0.02" in text and "confidence 0.98" in text


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(epsilon=1.0, delta=1e-5, guarantee="pure-dp"),
        dict(epsilon=1.0, delta=0.0, guarantee="approx-dp"),
        dict(epsilon=0.0, delta=0.0, guarantee="pure-dp"),
        dict(epsilon=-1.0, delta=0.0, guarantee="pure-dp"),
        dict(epsilon=math.nan, delta=0.0, guarantee="pure-dp"),
        dict(epsilon=1.0, delta=1.0, guarantee="approx-dp"),
        dict(epsilon=math.inf, delta=0.0, guarantee="pure-dp"),
        dict(epsilon=1.0, delta=0.0, guarantee="none"),
    ],
)
def test_inconsistent_statements_are_refused(kwargs: dict) -> None:
    with pytest.raises(ValueError):
        PrivacyStatement(mechanism="x", **kwargs)


@pytest.mark.parametrize(
    "bad",
    [dict(value=math.nan), dict(value=0.0), dict(norm="l3"),
     dict(source="sampled"), dict(source="sampled", m=10, gamma=1.5, confidence=0.9)],
)  # fmt: skip
def test_bad_sensitivity_info_is_refused(bad: dict) -> None:
    kwargs = dict(value=1.0, norm="l2", source="analytic") | bad
    with pytest.raises(ValueError):
        SensitivityInfo(**kwargs)


def test_statement_round_trips_through_dict() -> None:
    s = PrivacyStatement(epsilon=2.0, delta=0.0, guarantee="random-dp", mechanism="alm",
                         noise_scale=0.15, sensitivity=SAMPLED, notes=("a note",))  # fmt: skip
    assert PrivacyStatement.from_dict(s.to_dict()) == s
    none = PrivacyStatement.unprotected()
    assert none.guarantee is Guarantee.NONE and PrivacyStatement.from_dict(none.to_dict()) == none
