"""Registry, attributes, argument errors and the classic Gaussian's honest delta."""

from __future__ import annotations

import math

import pytest
from scipy import stats

from alm_opacus.mechanisms import (
    AdditiveNoiseMechanism,
    ClassicGaussianMechanism,
    GaussianMechanism,
    LaplaceMechanism,
    LogisticMechanism,
    available_mechanisms,
    create_mechanism,
    register_mechanism,
)
from alm_opacus.registry import Registry

NAMES = ["alm", "logistic", "laplace", "gaussian", "gaussian-classic"]
BAD_POSITIVE = [0.0, -1.0, math.nan, math.inf, -math.inf]


@pytest.fixture
def isolated_registry():
    with Registry.isolated():
        yield


def test_available_and_aliases():
    assert set(NAMES) <= set(available_mechanisms())
    assert create_mechanism("logistic").name == "alm"
    assert isinstance(create_mechanism("alm"), LogisticMechanism)


@pytest.mark.parametrize(
    ("name", "cls", "norm", "pure"),
    [
        ("alm", LogisticMechanism, "l1", True),
        ("laplace", LaplaceMechanism, "l1", True),
        ("gaussian", GaussianMechanism, "l2", False),
        ("gaussian-classic", ClassicGaussianMechanism, "l2", False),
    ],
)
def test_attributes(name, cls, norm, pure):
    mech = create_mechanism(name)
    assert type(mech) is cls
    assert (mech.name, mech.norm, mech.pure) == (name, norm, pure)
    assert mech.guarantee(delta=1e-5) == ("pure-dp" if pure else "approx-dp")


def test_duplicate_registration_raises_and_force_overrides(isolated_registry):
    with pytest.raises(ValueError, match="'alm' is already registered"):
        register_mechanism("alm", LaplaceMechanism)
    register_mechanism("alm", LaplaceMechanism, force=True)
    assert isinstance(create_mechanism("alm"), LaplaceMechanism)


def test_register_rejects_non_mechanisms(isolated_registry):
    with pytest.raises(TypeError, match="AdditiveNoiseMechanism"):
        register_mechanism("x", dict)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="name=''"):
        register_mechanism("", LaplaceMechanism)


def test_custom_mechanism_can_register(isolated_registry):
    class Doubled(LaplaceMechanism):
        name = "laplace-x2"

    register_mechanism("laplace-x2", Doubled)
    assert isinstance(create_mechanism("laplace-x2"), AdditiveNoiseMechanism)


def test_unknown_name_lists_the_known_ones():
    with pytest.raises(
        ValueError, match=r"mechanism='nope' is unknown: expected one of .*\bgaussian\b"
    ):
        create_mechanism("nope")


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("bad", [*BAD_POSITIVE])
def test_bad_epsilon_raises_naming_it(name, bad):
    mech = create_mechanism(name)
    with pytest.raises(ValueError, match=r"epsilon=.* is invalid"):
        mech.calibrate(epsilon=bad, delta=1e-5, sensitivity=1.0)
    with pytest.raises(ValueError, match=r"epsilon=.* is invalid"):
        mech.delta(epsilon=bad, scale=1.0, sensitivity=1.0)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("bad", [-1e-9, 1.0, 1.5, math.nan, math.inf])
def test_bad_delta_raises_naming_it(name, bad):
    mech = create_mechanism(name)
    with pytest.raises(ValueError, match=r"delta=.* is invalid"):
        mech.calibrate(epsilon=1.0, delta=bad, sensitivity=1.0)
    with pytest.raises(ValueError, match=r"delta=.* is invalid"):
        mech.epsilon(delta=bad, scale=1.0, sensitivity=1.0)


@pytest.mark.parametrize("name", ["gaussian", "gaussian-classic"])
def test_gaussian_refuses_delta_zero(name):
    mech = create_mechanism(name)
    with pytest.raises(ValueError, match=r"delta=0.0 is invalid"):
        mech.calibrate(epsilon=1.0, delta=0.0, sensitivity=1.0)
    with pytest.raises(ValueError, match=r"delta=0.0 is invalid"):
        mech.epsilon(delta=0.0, scale=1.0, sensitivity=1.0)
    with pytest.raises(ValueError, match=r"delta=0.0 is invalid"):
        mech.guarantee(delta=0.0)


@pytest.mark.parametrize("name", ["alm", "laplace"])
def test_pure_mechanisms_accept_delta_zero(name):
    mech = create_mechanism(name)
    assert mech.calibrate(epsilon=2.0, delta=0.0, sensitivity=1.0) == 0.5
    assert mech.guarantee(delta=0.0) == "pure-dp"


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("bad", BAD_POSITIVE)
def test_bad_sensitivity_and_scale_raise_naming_them(name, bad):
    mech = create_mechanism(name)
    with pytest.raises(ValueError, match=r"sensitivity=.* is invalid"):
        mech.calibrate(epsilon=1.0, delta=1e-5, sensitivity=bad)
    with pytest.raises(ValueError, match=r"sensitivity=.* is invalid"):
        mech.delta(epsilon=1.0, scale=1.0, sensitivity=bad)
    with pytest.raises(ValueError, match=r"scale=.* is invalid"):
        mech.epsilon(delta=1e-5, scale=bad, sensitivity=1.0)
    with pytest.raises(ValueError, match=r"scale=.* is invalid"):
        mech.std(bad)


@pytest.mark.parametrize("bad", [0, -2, 1.5, True, "3"])
def test_bad_dim_raises_naming_it(bad):
    with pytest.raises(ValueError, match=r"dim=.* is invalid"):
        create_mechanism("alm").delta(epsilon=1.0, scale=1.0, sensitivity=1.0, dim=bad)


@pytest.mark.parametrize(
    ("name", "dist"),
    [("alm", stats.logistic), ("laplace", stats.laplace), ("gaussian", stats.norm)],
)
def test_std_matches_scipy(name, dist):
    assert create_mechanism(name).std(2.5) == pytest.approx(dist(scale=2.5).std(), rel=1e-12)


def test_classic_gaussian_at_epsilon_10_misses_its_delta():
    mech = create_mechanism("gaussian-classic")
    assert isinstance(mech, ClassicGaussianMechanism)
    sigma = mech.calibrate(epsilon=10.0, delta=1e-5, sensitivity=1.0)
    assert sigma == pytest.approx(math.sqrt(2 * math.log(1.25 / 1e-5)) / 10.0)
    achieved = mech.achieved_delta(epsilon=10.0, scale=sigma, sensitivity=1.0)
    assert achieved > 1e-5
    assert achieved == pytest.approx(2.2654e-5, rel=1e-3)
    assert not mech.theorem_applies(epsilon=10.0)


@pytest.mark.parametrize("epsilon", [0.01, 0.1, 0.5, 0.9, 0.999])
@pytest.mark.parametrize("delta", [0.1, 1e-3, 1e-5, 1e-10])
def test_classic_gaussian_holds_below_epsilon_one(epsilon, delta):
    # Dwork & Roth (2014), Theorem A.1, checked against the exact profile.
    classic = create_mechanism("gaussian-classic")
    assert isinstance(classic, ClassicGaussianMechanism)
    assert classic.theorem_applies(epsilon=epsilon)
    sigma = classic.calibrate(epsilon=epsilon, delta=delta, sensitivity=1.0)
    assert classic.achieved_delta(epsilon=epsilon, scale=sigma, sensitivity=1.0) <= delta
    analytic = create_mechanism("gaussian").calibrate(epsilon=epsilon, delta=delta, sensitivity=1.0)
    assert analytic <= sigma
