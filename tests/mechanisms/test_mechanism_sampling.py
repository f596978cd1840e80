"""Noise samples against scipy's distributions, and generator reproducibility."""

from __future__ import annotations

import math

import pytest
import torch
from scipy import stats

from alm_opacus.mechanisms import create_mechanism, make_generator

SCIPY = {
    "alm": stats.logistic,
    "logistic": stats.logistic,
    "laplace": stats.laplace,
    "gaussian": stats.norm,
    "gaussian-classic": stats.norm,
}


@pytest.mark.parametrize("name", sorted(SCIPY))
@pytest.mark.parametrize("scale", [0.3, 2.0])
def test_samples_follow_scipy_distribution(name, scale):
    mech = create_mechanism(name)
    x = mech.sample((20_000,), scale=scale, generator=make_generator(seed=20240601))
    assert x.dtype == torch.float64 and x.shape == (20_000,)
    result = stats.kstest(x.numpy(), SCIPY[name](scale=scale).cdf)
    assert result.pvalue > 1e-3
    assert x.std().item() == pytest.approx(mech.std(scale), rel=0.05)


@pytest.mark.parametrize("name", ["alm", "laplace", "gaussian"])
def test_same_seed_same_noise(name):
    mech = create_mechanism(name)
    a = mech.sample((4, 5), scale=1.0, generator=make_generator(seed=7))
    b = mech.sample((4, 5), scale=1.0, generator=make_generator(seed=7))
    c = mech.sample((4, 5), scale=1.0, generator=make_generator(seed=8))
    assert torch.equal(a, b)
    assert not torch.equal(a, c)


def test_secure_mode_seeds_from_os_entropy():
    mech = create_mechanism("alm")
    a = mech.sample(64, scale=1.0, generator=make_generator(secure_mode=True))
    b = mech.sample(64, scale=1.0, generator=make_generator(secure_mode=True))
    assert not torch.equal(a, b)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"seed": 1, "secure_mode": True}, "seed=1 is invalid"),
        ({}, "seed=None is invalid"),
        ({"seed": -3}, "seed=-3 is invalid"),
        ({"seed": 1.5}, "seed=1.5 is invalid"),
    ],
)
def test_make_generator_errors(kwargs, match):
    with pytest.raises(ValueError, match=match):
        make_generator(**kwargs)


@pytest.mark.parametrize("name", ["alm", "laplace"])
def test_pure_noise_is_finite_and_bounded(name):
    x = create_mechanism(name).sample(200_000, scale=1.0, generator=make_generator(seed=3))
    assert torch.isfinite(x).all()
    assert x.abs().max().item() <= 53 * math.log(2) + 1e-9


def test_dtype_and_shape_arguments():
    mech = create_mechanism("gaussian")
    x = mech.sample(
        torch.Size([2, 3]), scale=1.0, generator=make_generator(seed=0), dtype=torch.float32
    )
    assert x.dtype == torch.float32 and x.shape == (2, 3)
    with pytest.raises(ValueError, match="shape="):
        mech.sample((2, -1), scale=1.0, generator=make_generator(seed=0))
    with pytest.raises(ValueError, match="scale="):
        mech.sample(3, scale=0.0, generator=make_generator(seed=0))
