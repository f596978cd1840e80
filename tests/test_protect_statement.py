"""The statement contract: no constructor path may claim more than is proven."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from alm_opacus.mechanisms import create_mechanism
from alm_opacus.mechanisms.exact import plan_release
from alm_opacus.protect import (
    FLOAT_NOTE,
    Guarantee,
    PrivacyStatement,
    SensitivityInfo,
    statement_for,
)
from alm_opacus.statement import describe

SAMPLED = SensitivityInfo(
    value=0.3, norm="l1", source="sampled", m=200, gamma=0.02, confidence=0.98
)
ANALYTIC = SensitivityInfo(value=0.3, norm="l1", source="analytic")


def test_sampled_sensitivity_cannot_claim_pure_or_approx_dp() -> None:
    for g, delta in ((Guarantee.PURE_DP, 0.0), (Guarantee.APPROX_DP, 1e-5)):
        with pytest.raises(ValueError, match="random-dp"):
            PrivacyStatement(
                epsilon=1.0, delta=delta, guarantee=g, mechanism="alm", sensitivity=SAMPLED
            )


def test_random_dp_needs_a_sampled_sensitivity_and_shows_gamma_and_confidence() -> None:
    with pytest.raises(ValueError):
        PrivacyStatement(
            epsilon=1.0, delta=0.0, guarantee="random-dp", mechanism="alm", sensitivity=ANALYTIC
        )
    s = PrivacyStatement(
        epsilon=1.0,
        delta=0.0,
        guarantee="random-dp",
        mechanism="alm",
        noise_scale=0.3,
        sensitivity=SAMPLED,
    )
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
    [
        dict(value=math.nan),
        dict(value=0.0),
        dict(norm="l3"),
        dict(source="sampled"),
        dict(source="sampled", m=10, gamma=1.5, confidence=0.9),
    ],
)
def test_bad_sensitivity_info_is_refused(bad: dict) -> None:
    kwargs = dict(value=1.0, norm="l2", source="analytic") | bad
    with pytest.raises(ValueError):
        SensitivityInfo(**kwargs)


def test_statement_round_trips_through_dict() -> None:
    s = PrivacyStatement(
        epsilon=2.0,
        delta=0.0,
        guarantee="random-dp",
        mechanism="alm",
        noise_scale=0.15,
        sensitivity=SAMPLED,
        notes=("a note",),
    )
    assert PrivacyStatement.from_dict(s.to_dict()) == s
    none = PrivacyStatement.unprotected()
    assert none.guarantee is Guarantee.NONE and PrivacyStatement.from_dict(none.to_dict()) == none


# --- claims checked against the noise (issue 23, item 2) -------------------------------------

L2 = SensitivityInfo(value=0.5, norm="l2", source="analytic")


@pytest.mark.parametrize("mechanism", ["gaussian", "gaussian-classic", "dp-sgd (opacus, rdp)"])
def test_gaussian_noise_never_claims_pure_dp(mechanism: str) -> None:
    # Issue 23: PrivacyStatement accepted pure-dp for the Gaussian mechanism.
    with pytest.raises(ValueError, match=r"Gaussian noise.*delta=0 is never proven"):
        PrivacyStatement(
            epsilon=1.0,
            delta=0.0,
            guarantee="pure-dp",
            mechanism=mechanism,
            noise_scale=2.0,
            sensitivity=L2,
        )


@pytest.mark.parametrize("mechanism", ["laplace", "alm", "logistic"])
def test_a_pure_claim_below_sensitivity_over_scale_is_refused(mechanism: str) -> None:
    # Issue 23: a Laplace epsilon off its Delta_1 / b was accepted. Scale 0.5 at Delta_1 = 0.3
    # proves epsilon = 0.6 and no less.
    ok = PrivacyStatement(
        epsilon=0.6,
        delta=0.0,
        guarantee="pure-dp",
        mechanism=mechanism,
        noise_scale=0.5,
        sensitivity=ANALYTIC,
    )
    assert ok.epsilon == 0.6
    with pytest.raises(ValueError, match=r"Delta_1 / (b|s) .*gives epsilon >= 0\.6 "):
        PrivacyStatement(
            epsilon=0.59,
            delta=0.0,
            guarantee="pure-dp",
            mechanism=mechanism,
            noise_scale=0.5,
            sensitivity=ANALYTIC,
        )


@pytest.mark.parametrize("epsilon", [1e-3, 0.1, 1.0, 3.0, 10.0, 1e3, 1e5])
@pytest.mark.parametrize("sensitivity", [1e-3, 0.3, 7.0, 1e4])
def test_every_calibrated_laplace_claim_is_accepted(epsilon: float, sensitivity: float) -> None:
    # The tolerance covers the two roundings of b = Delta / epsilon and Delta / b, exactly.
    info = SensitivityInfo(value=sensitivity, norm="l1", source="analytic")
    scale = sensitivity / epsilon
    PrivacyStatement(
        epsilon=epsilon,
        delta=0.0,
        guarantee="pure-dp",
        mechanism="laplace",
        noise_scale=scale,
        sensitivity=info,
    )
    with pytest.raises(ValueError, match="claims more than the noise proves"):
        PrivacyStatement(
            epsilon=epsilon * (1 - 1e-15),
            delta=0.0,
            guarantee="pure-dp",
            mechanism="laplace",
            noise_scale=scale,
            sensitivity=info,
        )


@pytest.mark.parametrize("epsilon", [0.05, 1.0, 8.0, 300.0])
@pytest.mark.parametrize("delta", [1e-12, 1e-5, 0.1])
def test_gaussian_claims_are_checked_against_the_analytic_calibration(
    epsilon: float, delta: float
) -> None:
    sigma = create_mechanism("gaussian").calibrate(epsilon=epsilon, delta=delta, sensitivity=0.5)
    PrivacyStatement(
        epsilon=epsilon,
        delta=delta,
        guarantee="approx-dp",
        mechanism="gaussian",
        noise_scale=sigma,
        sensitivity=L2,
    )
    # 1% less noise is an over-claim at the same (epsilon, delta)
    with pytest.raises(ValueError, match=r"analytic Gaussian profile.*epsilon >= "):
        PrivacyStatement(
            epsilon=epsilon,
            delta=delta,
            guarantee="approx-dp",
            mechanism="gaussian",
            noise_scale=0.99 * sigma,
            sensitivity=L2,
        )


def test_a_random_dp_claim_is_checked_like_a_dp_claim() -> None:
    with pytest.raises(ValueError, match="claims more than the noise proves"):
        PrivacyStatement(
            epsilon=0.5,
            delta=0.0,
            guarantee="random-dp",
            mechanism="alm",
            noise_scale=0.3,
            sensitivity=SAMPLED,
        )


def test_an_l1_mechanism_needs_an_l1_sensitivity() -> None:
    with pytest.raises(ValueError, match="L1 sensitivity"):
        PrivacyStatement(
            epsilon=1.0,
            delta=0.0,
            guarantee="pure-dp",
            mechanism="laplace",
            noise_scale=0.5,
            sensitivity=L2,
        )


def test_a_total_is_never_stronger_than_its_release() -> None:
    with pytest.raises(ValueError, match="guarantee_spent='pure-dp' is stronger"):
        PrivacyStatement(
            epsilon=1.0,
            delta=0.0,
            guarantee="random-dp",
            mechanism="alm",
            noise_scale=0.3,
            sensitivity=SAMPLED,
            epsilon_spent=1.0,
            delta_spent=0.0,
            guarantee_spent="pure-dp",
        )
    with pytest.raises(ValueError, match="gamma_spent=None"):
        PrivacyStatement(
            epsilon=1.0,
            delta=0.0,
            guarantee="random-dp",
            mechanism="alm",
            noise_scale=0.3,
            sensitivity=SAMPLED,
            epsilon_spent=1.0,
            delta_spent=0.0,
            guarantee_spent="random-dp",
        )


def test_a_statement_with_its_total_round_trips() -> None:
    s = PrivacyStatement(
        epsilon=1.0,
        delta=0.0,
        guarantee="random-dp",
        mechanism="alm",
        noise_scale=0.3,
        sensitivity=SAMPLED,
        epsilon_spent=3.0,
        delta_spent=0.0,
        guarantee_spent="random-dp",
        gamma_spent=0.04,
        confidence_spent=0.96,
        neighbouring_spent="replace-one",
    )
    assert PrivacyStatement.from_dict(s.to_dict()) == s
    assert s.to_dict()["guarantee_spent"] == "random-dp"


# --- plain words (issue 23, item 3) ----------------------------------------------------------


@pytest.mark.parametrize(
    ("statement", "words"),
    [
        (
            PrivacyStatement(
                epsilon=1.0,
                delta=0.0,
                guarantee="pure-dp",
                mechanism="laplace",
                noise_scale=0.3,
                sensitivity=ANALYTIC,
            ),
            "1-DP (pure), replace-one",
        ),
        (
            PrivacyStatement(
                epsilon=1.0,
                delta=1e-5,
                guarantee="approx-dp",
                mechanism="dp-sgd",
                neighbouring="add-remove",
            ),
            "(1, 1e-05)-DP, add-remove",
        ),
        (PrivacyStatement.unprotected(), "no guarantee"),
    ],
)
def test_describe_says_the_guarantee_plainly(statement: PrivacyStatement, words: str) -> None:
    assert describe(statement) == words


def test_describe_says_random_dp_is_not_dp_and_why() -> None:
    s = PrivacyStatement(
        epsilon=1.0,
        delta=0.0,
        guarantee="random-dp",
        mechanism="alm",
        noise_scale=0.3,
        sensitivity=replace(SAMPLED, population="the public split"),
    )
    text = describe(s)
    assert text.startswith("random DP (epsilon=1, gamma=0.02, replace-one): not a DP guarantee")
    assert "sampled from the public split" in text and "exchangeable" in text


# --- hostile input (issue 36, item 8) --------------------------------------------------------


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        (dict(source="sampled", m=-5, gamma=0.02, confidence=0.98), r"m=-5 is invalid"),
        (dict(source="sampled", m=0, gamma=0.02, confidence=0.98), r"m=0 is invalid"),
        (dict(source="sampled", m=2.5, gamma=0.02, confidence=0.98), r"m=2\.5 is invalid"),
        (dict(source="sampled", m=True, gamma=0.02, confidence=0.98), r"m=True is invalid"),
        (dict(source="sampled", m=10, gamma="0.02", confidence=0.98), r"gamma='0\.02'"),
        (dict(source="sampled", m=10, gamma=0.02, confidence=1.0), r"confidence=1\.0"),
        (dict(m=-5), r"m=-5 given for a sensitivity of source 'analytic'"),
        (dict(gamma=0.02, confidence=0.98), r"gamma=0\.02, confidence=0\.98 given"),
        (dict(value="1.0"), r"sensitivity='1\.0' is invalid"),
        (dict(value=True), r"sensitivity=True is invalid"),
        (dict(source="proven"), r"source='proven' is invalid: expected one of \['analytic'"),
        (dict(adjacency=["replace-one"]), r"adjacency=\['replace-one'\] is invalid"),
        (dict(population=3), r"population=3 is invalid"),
    ],
)
def test_every_sensitivity_info_field_is_checked(bad: dict, message: str) -> None:
    kwargs = dict(value=1.0, norm="l2", source="analytic") | bad
    with pytest.raises(ValueError, match=message):
        SensitivityInfo(**kwargs)


def test_a_valid_sampled_sensitivity_still_builds() -> None:
    import numpy as np

    info = SensitivityInfo(
        value=np.float64(0.3),
        norm="l1",
        source="sampled",
        m=np.int64(200),
        gamma=0.02,
        confidence=0.98,
    )
    assert info.m == 200 and info.source.value == "sampled"


PURE = PrivacyStatement(
    epsilon=1.0,
    delta=0.0,
    guarantee="pure-dp",
    mechanism="laplace",
    noise_scale=0.3,
    sensitivity=ANALYTIC,
    noise="secure",
    epsilon_spent=1.0,
    delta_spent=0.0,
    guarantee_spent="pure-dp",
    neighbouring_spent="replace-one",
)
RANDOM = PrivacyStatement(
    epsilon=1.0,
    delta=0.0,
    guarantee="random-dp",
    mechanism="alm",
    noise_scale=0.3,
    sensitivity=SAMPLED,
)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ([1, 2], r"statement=\[1, 2\] is invalid: expected a mapping"),
        ("pure-dp", r"statement='pure-dp' is invalid: expected a mapping"),
        (None, r"statement=None is invalid"),
        ({1: 2}, r"expected a mapping of field names"),
    ],
)
def test_from_dict_refuses_what_is_not_a_statement(data: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        PrivacyStatement.from_dict(data)  # type: ignore[arg-type]


def _edited(statement: PrivacyStatement, path: tuple[str, ...], value: object) -> dict:
    data = statement.to_dict()
    target = data
    for key in path[:-1]:
        target = target[key]
    if value is _DELETE:
        del target[path[-1]]
    else:
        target[path[-1]] = value
    return data


_DELETE = object()


@pytest.mark.parametrize(
    ("statement", "path", "value", "message"),
    [
        (PURE, ("epsilon",), "1.0", r"epsilon='1\.0' is invalid: expected a number"),
        (PURE, ("epsilon",), True, r"epsilon=True is invalid"),
        (PURE, ("epsilon",), 0.5, r"pure claim|below|epsilon"),  # stronger than the noise
        (PURE, ("epsilon",), _DELETE, r"lacks the fields \['epsilon'\]"),
        (PURE, ("delta",), None, r"delta=None is invalid"),
        (PURE, ("guarantee",), "pure_dp", r"guarantee='pure_dp' is invalid: expected one of"),
        (PURE, ("guarantee",), ["pure-dp"], r"guarantee=\['pure-dp'\] is invalid"),
        (PURE, ("mechanism",), 7, r"mechanism=7 is invalid: expected a string"),
        (PURE, ("noise_scale",), "0.3", r"noise_scale='0\.3' is invalid"),
        (PURE, ("noise_scale",), 0.03, r"epsilon"),  # less noise than the claim needs
        (PURE, ("noise_scale",), -0.3, r"noise_scale=-0\.3 is invalid"),
        (PURE, ("notes",), "a note", r"notes='a note' is invalid: expected a list of strings"),
        (PURE, ("notes",), [1], r"notes=\(1,\) is invalid"),
        (PURE, ("unprotected_parameters",), {"a": 1}, r"unprotected_parameters="),
        (PURE, ("epsilon_spent",), 0.0, r"epsilon_spent=0\.0 is invalid"),
        (PURE, ("delta_spent",), -1e-5, r"delta_spent=-1e-05 is invalid"),
        (PURE, ("guarantee_spent",), "pure", r"guarantee_spent='pure' is invalid"),
        (PURE, ("neighbouring",), "add-remove", r"neighbouring='add-remove' but"),
        (PURE, ("sensitivity",), [0.3], r"statement's sensitivity=\[0\.3\] is invalid"),
        (PURE, ("sensitivity", "norm"), "l2", r"L2 sensitivity does not bound it"),
        (PURE, ("sensitivity", "value"), "0.3", r"sensitivity='0\.3' is invalid"),
        (PURE, ("sensitivity", "source"), _DELETE, r"sensitivity lacks the fields \['source'\]"),
        (PURE, ("sensitivity", "extra"), 1, r"sensitivity has unknown fields \['extra'\]"),
        (PURE, ("grid",), "2^-10", r"grid='2\^-10' is invalid"),
        # a random-DP statement flipped to a stronger kind is refused
        (RANDOM, ("guarantee",), "pure-dp", r"random-dp"),
        (
            RANDOM,
            ("sensitivity", "source"),
            "analytic",
            r"given for a sensitivity of source 'analytic'",
        ),
        (RANDOM, ("sensitivity", "m"), -5, r"m=-5 is invalid"),
    ],
)
def test_from_dict_refuses_every_edited_field(
    statement: PrivacyStatement, path: tuple[str, ...], value: object, message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        PrivacyStatement.from_dict(_edited(statement, path, value))


def test_valid_statements_still_round_trip() -> None:
    for statement in (PURE, RANDOM, PrivacyStatement.unprotected()):
        assert PrivacyStatement.from_dict(statement.to_dict()) == statement


@pytest.mark.parametrize("noise", ["secure", "seeded"])
def test_float_noise_and_member_sampled_sensitivity_claim_nothing(noise: str) -> None:
    laplace = create_mechanism("laplace")
    members = SensitivityInfo(
        value=0.3, norm="l1", source="sampled-members", m=200, gamma=0.02, confidence=0.98
    )
    plan = plan_release(mechanism=laplace, epsilon=2.0, delta=0.0, sensitivity=0.3, dim=50)
    floating = statement_for(
        mechanism=laplace, epsilon=2.0, delta=0.0, scale=0.15, sensitivity=ANALYTIC, noise=noise
    )
    sampled = statement_for(
        mechanism=laplace,
        epsilon=2.0,
        delta=0.0,
        scale=plan.scale,
        sensitivity=members,
        noise=noise,
        plan=plan,
    )
    seeded = ("seeded noise" in n for n in floating.notes)
    assert any(seeded) is (noise == "seeded")
    for statement, sensitivity in ((floating, ANALYTIC), (sampled, members)):
        assert statement.guarantee is Guarantee.NONE and statement.epsilon == math.inf
        assert statement.delta == 0.0 and statement.neighbouring == ""
        assert statement.nominal_epsilon == 2.0 and statement.sensitivity == sensitivity
        assert statement.noise == noise and len(statement.notes) == 1 + (noise == "seeded")
    assert floating.notes[-1] == FLOAT_NOTE and floating.grid is None
    assert floating.noise_scale == 0.15
    assert "sampled on the private members" in sampled.notes[-1]
    assert sampled.grid == plan.grid.gamma and sampled.grid_sensitivity == plan.sensitivity


def test_a_pure_claim_for_noise_that_is_not_pure_names_the_kind() -> None:
    from alm_opacus.claims import check_claim

    for mechanism in ("gaussian", "gaussian-classic"):
        with pytest.raises(ValueError, match=rf"mechanism='{mechanism}' is not pure DP"):
            check_claim(
                mechanism=mechanism,
                guarantee=Guarantee.PURE_DP,
                epsilon=1.0,
                delta=0.0,
                scale=1.0,
                sensitivity=1.0,
                norm="l2",
            )


def test_no_guarantee_claims_nothing_and_keeps_the_nominal_epsilon() -> None:
    s = PrivacyStatement.no_guarantee(
        nominal_epsilon=2, notes=["floating-point noise"], mechanism="laplace", noise_scale=0.5
    )
    assert (s.epsilon, s.delta, s.guarantee, s.neighbouring) == (
        math.inf,
        0.0,
        Guarantee.NONE,
        "",
    )
    assert s.nominal_epsilon == 2.0 and isinstance(s.nominal_epsilon, float)
    assert s.notes == ("floating-point noise",)
    assert (s.mechanism, s.noise_scale) == ("laplace", 0.5)
