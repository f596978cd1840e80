"""The statement contract: no constructor path may claim more than is proven."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from alm_opacus.mechanisms import create_mechanism
from alm_opacus.protect import Guarantee, PrivacyStatement, SensitivityInfo
from alm_opacus.statement import describe

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


# --- claims checked against the noise (issue 23, item 2) -------------------------------------

L2 = SensitivityInfo(value=0.5, norm="l2", source="analytic")


@pytest.mark.parametrize("mechanism", ["gaussian", "gaussian-classic", "dp-sgd (opacus, rdp)"])
def test_gaussian_noise_never_claims_pure_dp(mechanism: str) -> None:
    # Issue 23: PrivacyStatement accepted pure-dp for the Gaussian mechanism.
    with pytest.raises(ValueError, match=r"Gaussian noise.*delta=0 is never proven"):
        PrivacyStatement(epsilon=1.0, delta=0.0, guarantee="pure-dp", mechanism=mechanism,
                         noise_scale=2.0, sensitivity=L2)  # fmt: skip


@pytest.mark.parametrize("mechanism", ["laplace", "alm", "logistic"])
def test_a_pure_claim_below_sensitivity_over_scale_is_refused(mechanism: str) -> None:
    # Issue 23: a Laplace epsilon off its Delta_1 / b was accepted. Scale 0.5 at Delta_1 = 0.3
    # proves epsilon = 0.6 and no less.
    ok = PrivacyStatement(epsilon=0.6, delta=0.0, guarantee="pure-dp", mechanism=mechanism,
                          noise_scale=0.5, sensitivity=ANALYTIC)  # fmt: skip
    assert ok.epsilon == 0.6
    with pytest.raises(ValueError, match=r"Delta_1 / (b|s) .*gives epsilon >= 0\.6 "):
        PrivacyStatement(epsilon=0.59, delta=0.0, guarantee="pure-dp", mechanism=mechanism,
                         noise_scale=0.5, sensitivity=ANALYTIC)  # fmt: skip


@pytest.mark.parametrize("epsilon", [1e-3, 0.1, 1.0, 3.0, 10.0, 1e3, 1e5])
@pytest.mark.parametrize("sensitivity", [1e-3, 0.3, 7.0, 1e4])
def test_every_calibrated_laplace_claim_is_accepted(epsilon: float, sensitivity: float) -> None:
    # The tolerance covers the two roundings of b = Delta / epsilon and Delta / b, exactly.
    info = SensitivityInfo(value=sensitivity, norm="l1", source="analytic")
    scale = sensitivity / epsilon
    PrivacyStatement(epsilon=epsilon, delta=0.0, guarantee="pure-dp", mechanism="laplace",
                     noise_scale=scale, sensitivity=info)  # fmt: skip
    with pytest.raises(ValueError, match="claims more than the noise proves"):
        PrivacyStatement(epsilon=epsilon * (1 - 1e-15), delta=0.0, guarantee="pure-dp",
                         mechanism="laplace", noise_scale=scale, sensitivity=info)  # fmt: skip


@pytest.mark.parametrize("epsilon", [0.05, 1.0, 8.0, 300.0])
@pytest.mark.parametrize("delta", [1e-12, 1e-5, 0.1])
def test_gaussian_claims_are_checked_against_the_analytic_calibration(
    epsilon: float, delta: float
) -> None:
    sigma = create_mechanism("gaussian").calibrate(epsilon=epsilon, delta=delta, sensitivity=0.5)
    PrivacyStatement(epsilon=epsilon, delta=delta, guarantee="approx-dp", mechanism="gaussian",
                     noise_scale=sigma, sensitivity=L2)  # fmt: skip
    # 1% less noise is an over-claim at the same (epsilon, delta)
    with pytest.raises(ValueError, match=r"analytic Gaussian profile.*epsilon >= "):
        PrivacyStatement(epsilon=epsilon, delta=delta, guarantee="approx-dp",
                         mechanism="gaussian", noise_scale=0.99 * sigma,
                         sensitivity=L2)  # fmt: skip


def test_a_random_dp_claim_is_checked_like_a_dp_claim() -> None:
    with pytest.raises(ValueError, match="claims more than the noise proves"):
        PrivacyStatement(epsilon=0.5, delta=0.0, guarantee="random-dp", mechanism="alm",
                         noise_scale=0.3, sensitivity=SAMPLED)  # fmt: skip


def test_an_l1_mechanism_needs_an_l1_sensitivity() -> None:
    with pytest.raises(ValueError, match="L1 sensitivity"):
        PrivacyStatement(epsilon=1.0, delta=0.0, guarantee="pure-dp", mechanism="laplace",
                         noise_scale=0.5, sensitivity=L2)  # fmt: skip


def test_a_total_is_never_stronger_than_its_release() -> None:
    with pytest.raises(ValueError, match="guarantee_spent='pure-dp' is stronger"):
        PrivacyStatement(epsilon=1.0, delta=0.0, guarantee="random-dp", mechanism="alm",
                         noise_scale=0.3, sensitivity=SAMPLED, epsilon_spent=1.0,
                         delta_spent=0.0, guarantee_spent="pure-dp")  # fmt: skip
    with pytest.raises(ValueError, match="gamma_spent=None"):
        PrivacyStatement(epsilon=1.0, delta=0.0, guarantee="random-dp", mechanism="alm",
                         noise_scale=0.3, sensitivity=SAMPLED, epsilon_spent=1.0,
                         delta_spent=0.0, guarantee_spent="random-dp")  # fmt: skip


def test_a_statement_with_its_total_round_trips() -> None:
    s = PrivacyStatement(epsilon=1.0, delta=0.0, guarantee="random-dp", mechanism="alm",
                         noise_scale=0.3, sensitivity=SAMPLED, epsilon_spent=3.0,
                         delta_spent=0.0, guarantee_spent="random-dp", gamma_spent=0.04,
                         confidence_spent=0.96, neighbouring_spent="replace-one")  # fmt: skip
    assert PrivacyStatement.from_dict(s.to_dict()) == s
    assert s.to_dict()["guarantee_spent"] == "random-dp"


# --- plain words (issue 23, item 3) ----------------------------------------------------------


@pytest.mark.parametrize(
    ("statement", "words"),
    [
        (PrivacyStatement(epsilon=1.0, delta=0.0, guarantee="pure-dp", mechanism="laplace",
                          noise_scale=0.3, sensitivity=ANALYTIC), "1-DP (pure), replace-one"),
        (PrivacyStatement(epsilon=1.0, delta=1e-5, guarantee="approx-dp", mechanism="dp-sgd",
                          neighbouring="add-remove"), "(1, 1e-05)-DP, add-remove"),
        (PrivacyStatement.unprotected(), "no guarantee"),
    ],
)  # fmt: skip
def test_describe_says_the_guarantee_plainly(statement: PrivacyStatement, words: str) -> None:
    assert describe(statement) == words


def test_describe_says_random_dp_is_not_dp_and_why() -> None:
    s = PrivacyStatement(epsilon=1.0, delta=0.0, guarantee="random-dp", mechanism="alm",
                         noise_scale=0.3, sensitivity=replace(SAMPLED, population="the public "
                                                              "split"))  # fmt: skip
    text = describe(s)
    assert text.startswith("random DP (epsilon=1, gamma=0.02, replace-one): not a DP guarantee")
    assert "sampled from the public split" in text and "exchangeable" in text
