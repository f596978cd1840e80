"""Noise samples against scipy's distributions, and generator reproducibility."""

from __future__ import annotations

import math

import pytest
import torch
from scipy import stats

from alm_opacus.mechanisms import SecureGenerator, create_mechanism, is_secure, make_generator

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


def test_secure_mode_draws_from_a_keystream_keyed_by_the_os_csprng(monkeypatch):
    mech = create_mechanism("alm")
    gen = make_generator(secure_mode=True)
    assert isinstance(gen, SecureGenerator) and is_secure(gen)
    assert not is_secure(make_generator(seed=0))
    a = mech.sample(64, scale=1.0, generator=gen)
    b = mech.sample(64, scale=1.0, generator=make_generator(secure_mode=True))
    assert not torch.equal(a, b)
    # Every bit comes from a keystream keyed by os.urandom: fixing it fixes the noise, and no
    # torch seed matters.
    import alm_opacus.mechanisms.csprng as csprng

    monkeypatch.setattr(csprng.os, "urandom", lambda k: (bytes(range(256)) * (k // 256 + 1))[:k])
    torch.manual_seed(0)
    c = mech.sample(64, scale=1.0, generator=make_generator(secure_mode=True))
    torch.manual_seed(1)
    d = mech.sample(64, scale=1.0, generator=make_generator(secure_mode=True))
    assert torch.equal(c, d)


@pytest.mark.parametrize("name", sorted(SCIPY))
def test_secure_samples_follow_scipy_distribution(name):
    mech = create_mechanism(name)
    x = mech.sample((20_000,), scale=1.5, generator=make_generator(secure_mode=True))
    assert x.dtype == torch.float64 and torch.isfinite(x).all()
    # a fresh CSPRNG draw each run: a KS p-value below 1e-6 has probability 1e-6
    assert stats.kstest(x.numpy(), SCIPY[name](scale=1.5).cdf).pvalue > 1e-6


def test_secure_normal_is_exactly_symmetric_and_bounded():
    # a and 2^53 - a map to exactly opposite values: fold the uniform at 1/2.
    from alm_opacus.mechanisms import sampling

    class Fixed(SecureGenerator):
        def bits(self, shape, *, bits):  # k and 2^52 - 1 - k give a and 2^53 - a
            k = torch.tensor([0, 1, 12345, 2**52 - 12346, 2**52 - 2, 2**52 - 1])
            return k.reshape(shape)

    z = sampling.standard_normal((6,), generator=Fixed())
    assert torch.equal(z, -z.flip(0))
    assert float(z.abs().max()) == pytest.approx(-stats.norm.ppf(2.0**-53), rel=1e-12)


def test_uniform_open_never_hits_the_ends():
    from alm_opacus.mechanisms.sampling import uniform_open

    u = uniform_open((100_000,), generator=make_generator(secure_mode=True))
    assert float(u.min()) > 0 and float(u.max()) < 1
    assert stats.kstest(u.numpy(), stats.uniform.cdf).pvalue > 1e-6


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
