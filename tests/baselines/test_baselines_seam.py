"""State lives on the run's context, noise is secure by default, and infeasible cells say so."""

from __future__ import annotations

import json

import pytest
import torch

from alm_opacus.heads import HeadConfig
from alm_opacus.io import StaleCacheWarning
from alm_opacus.methods import InfeasibleRelease, NoisePolicy, ReleaseRequest, create_method
from baselines.dpsgd import SIGMA_CACHE_FILE, DPSGDConfig, SigmaCache, train_dpsgd_head

# rdp at q = 1/3 (90 members, expected batch 30) keeps Opacus's sigma search to about a
# second; at q = 1/2 and a tiny epsilon its rdp analysis takes minutes.
FIXED = {"accountant": "rdp", "epochs": 2, "batch_size": 30, "lr": 1.0, "clip": 0.5}


@pytest.fixture(scope="module")
def sigma_folder(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    """One cache folder, so that the parametrised runs below search sigma once."""
    return tmp_path_factory.mktemp("sigmas")


def _release(method, x, y, ctx, *, epsilon, draw=0):  # type: ignore[no-untyped-def]
    prepared = method.prepare(features=x, labels=y, seed=0, context=ctx)
    return method.release(
        prepared,
        ReleaseRequest(
            features=x, labels=y, epsilon=epsilon, delta=1e-5, seed=0, draw=draw, context=ctx
        ),
    )


@pytest.mark.slow
def test_sigma_lives_in_the_run_memo_not_in_the_module(pixel_features, make_context):
    # A module-level cache would hand the second run the first run's sigma; the memo does not.
    x, y = pixel_features
    first, second = make_context(), make_context()
    method = create_method("dpsgd", FIXED)
    assert not _release(method, x[:90], y[:90], first, epsilon=2.5).info["sigma_cached"]
    assert _release(method, x[:90], y[:90], first, epsilon=2.5, draw=1).info["sigma_cached"]
    assert not _release(method, x[:90], y[:90], second, epsilon=2.5).info["sigma_cached"]
    assert SigmaCache.of(first) is SigmaCache.of(first)
    assert SigmaCache.of(first) is not SigmaCache.of(second)


@pytest.mark.slow
def test_sigma_cache_file_is_shared_across_runs(tmp_path):
    key = dict(epsilon=2.0, delta=1e-5, sample_rate=1 / 3, epochs=2, accountant="rdp")
    sigma, known = SigmaCache(tmp_path).noise_multiplier(**key)
    assert not known
    entries = json.loads((tmp_path / SIGMA_CACHE_FILE).read_text())
    assert [e["noise_multiplier"] for e in entries] == [sigma]
    again = SigmaCache(tmp_path)  # a later run reads the folder's file
    assert again.cached(**key) == sigma and again.noise_multiplier(**key) == (sigma, True)
    (tmp_path / SIGMA_CACHE_FILE).write_text("{corrupt")  # a broken file only costs time
    assert SigmaCache(tmp_path).cached(**key) is None


def test_sigmas_live_in_the_public_cache_shared_by_runs(tmp_path, make_context) -> None:  # type: ignore[no-untyped-def]
    # A multiplier reads no member's data: runs with their own members' caches share it
    # through the public cache folder (the encoder's); without one, the members' cache.
    key = dict(epsilon=2.0, delta=1e-5, sample_rate=1 / 3, epochs=2, accountant="rdp")
    public = tmp_path / "public"
    first = make_context(cache_dir=tmp_path / "a", public_cache_dir=public)
    sigma, known = SigmaCache.of(first).noise_multiplier(**key)
    assert not known and (public / SIGMA_CACHE_FILE).exists()
    assert not (tmp_path / "a" / SIGMA_CACHE_FILE).exists()
    second = make_context(cache_dir=tmp_path / "b", public_cache_dir=public)
    assert SigmaCache.of(second).noise_multiplier(**key) == (sigma, True)
    alone = make_context(cache_dir=tmp_path / "c")
    assert SigmaCache.of(alone).noise_multiplier(**key) == (sigma, False)
    assert (tmp_path / "c" / SIGMA_CACHE_FILE).exists()


@pytest.mark.parametrize(
    ("tamper", "why"),
    [
        (lambda e: e.update(noise_multiplier=e["noise_multiplier"] / 2), "altered"),
        (lambda e: e.update(code="0123456789abcdef"), "other code"),
        (lambda e: [e.pop(k) for k in ("code", "digest")], "an entry of an older version"),
    ],
)
def test_an_altered_or_stale_sigma_is_searched_again_never_used(tmp_path, tamper, why) -> None:  # type: ignore[no-untyped-def]
    # A halved sigma would train with half the noise the target needs (caught only after
    # training, by checked_epsilon); a digest of each entry and of its code keeps it out.
    key = dict(epsilon=2.0, delta=1e-5, sample_rate=1 / 3, epochs=2, accountant="rdp")
    sigma, _ = SigmaCache(tmp_path).noise_multiplier(**key)
    path = tmp_path / SIGMA_CACHE_FILE
    entries = json.loads(path.read_text())
    tamper(entries[0])
    path.write_text(json.dumps(entries))
    with pytest.warns(StaleCacheWarning, match="1 entries written by other code, or altered"):
        cache = SigmaCache(tmp_path)
    assert cache.cached(**key) is None, why
    assert cache.noise_multiplier(**key) == (sigma, False)  # searched again
    assert SigmaCache(tmp_path).cached(**key) == sigma  # and the file is whole again


@pytest.mark.parametrize(
    ("name", "options"),
    [("dpsgd", FIXED), ("dperm", {"l2": 1.0}), ("lu", {"steps": 5, "hidden": 8, "tune": False})],
)
@pytest.mark.parametrize("reproducible", [False, True])
def test_secure_releases_differ_and_seeded_ones_repeat(
    pixel_features, make_context, sigma_folder, name, options, reproducible
):
    x, y = pixel_features
    ctx = make_context(noise=NoisePolicy(reproducible=reproducible), cache_dir=sigma_folder)
    method = create_method(name, options)
    releases = [_release(method, x[:90], y[:90], ctx, epsilon=5.0) for _ in range(2)]
    answers = [r.predict_proba(x[600:640]) for r in releases]
    assert torch.equal(answers[0], answers[1]) == reproducible
    statement = releases[0].statement
    assert statement.noise == ("seeded" if reproducible else "secure")


@pytest.mark.slow
def test_secure_dpsgd_runs_differ_and_seeded_runs_repeat(pixel_features):
    x, y = pixel_features
    args = dict(
        num_classes=10,
        head=HeadConfig(),
        config=DPSGDConfig(epochs=2, batch_size=30),
        epsilon=3.0,
        delta=1e-5,
        accountant="rdp",
        seed=0,
        sigmas=SigmaCache(),
    )
    weights = [
        train_dpsgd_head(x[:90], y[:90], noise_seed=s, **args).head.fc.weight
        for s in (None, None, 7, 7)
    ]
    assert not torch.equal(weights[0], weights[1])
    assert torch.equal(weights[2], weights[3])


def test_an_unreachable_epsilon_is_an_infeasible_release(pixel_features, make_context):
    x, y = pixel_features
    with pytest.raises(InfeasibleRelease, match=r"no noise multiplier reaches epsilon=1e-06"):
        _release(create_method("dpsgd", FIXED), x[:90], y[:90], make_context(), epsilon=1e-6)
