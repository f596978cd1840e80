"""The post-training engine (ALM Algorithm 1) and the post-training methods."""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from scipy import stats

from alm_opacus.heads import HeadConfig, train_head, utility_loss
from alm_opacus.io import StaleCacheWarning, atomic_torch_save
from alm_opacus.methods import (
    MethodContext,
    NoisePolicy,
    ReleaseRequest,
    create_method,
    plain_shadow_trainer,
)
from alm_opacus.protect import (
    Guarantee,
    PostTrainingPrivacyEngine,
    ProtectedModule,
    SensitivityInfo,
)
from alm_opacus.statement import describe

FAST = HeadConfig(steps=60, lr=0.05)


@pytest.fixture(scope="module")
def small(pixel_features):  # type: ignore[no-untyped-def]
    x, y = pixel_features
    return x[:120], y[:120]


@pytest.fixture(scope="module")
def head(small):  # type: ignore[no-untyped-def]
    x, y = small
    return train_head(x, y, num_classes=10, config=FAST, seed=0)


def _flat(module: torch.nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().flatten() for p in module.parameters()])


@pytest.mark.parametrize(
    "mechanism,reference,norm",
    [
        ("alm", stats.logistic, "l1"),
        ("laplace", stats.laplace, "l1"),
        ("gaussian", stats.norm, "l2"),
    ],
)
def test_release_noise_follows_the_mechanism_law(head, mechanism, reference, norm) -> None:  # type: ignore[no-untyped-def]
    engine = PostTrainingPrivacyEngine(mechanism=mechanism)
    info = SensitivityInfo(value=0.5, norm=norm, source="analytic")
    delta = 1e-5 if norm == "l2" else 0.0
    release = engine.make_private(head, epsilon=2.0, delta=delta, sensitivity=info, seed=7)
    noise = (_flat(release.module) - _flat(head)).numpy()
    statement = release.statement
    scale, widened = statement.noise_scale, statement.grid_sensitivity
    assert scale is not None and widened is not None and statement.grid is not None
    # the noise is calibrated to the grid-rounded sensitivity Δ' = Δ + w(d)γ ≤ Δ(1 + 2⁻⁷)
    assert 0.5 < widened <= 0.5 * (1 + 2.0**-7)
    if mechanism in ("alm", "laplace"):
        assert scale == pytest.approx(widened / 2.0)  # ALM Theorem 4.1 / Laplace: Δ₁/ε
    # every shipped weight is a multiple of the grid
    shipped = _flat(release.module).numpy()
    assert np.all(np.round(shipped / statement.grid) * statement.grid == shipped)
    assert stats.kstest(noise, reference(scale=scale).cdf).pvalue > 1e-3


def test_statement_kinds_follow_the_sensitivity_source(head) -> None:  # type: ignore[no-untyped-def]
    engine = PostTrainingPrivacyEngine(mechanism="alm")
    analytic = SensitivityInfo(value=1.0, norm="l1", source="analytic")
    sampled = SensitivityInfo(
        value=1.0,
        norm="l1",
        source="sampled",
        m=200,
        gamma=0.05,
        confidence=0.99996,
        population="public rows",
    )
    pure = engine.make_private(head, epsilon=1.0, sensitivity=analytic, seed=0).statement
    rand = engine.make_private(head, epsilon=1.0, sensitivity=sampled, seed=0).statement
    assert pure.guarantee is Guarantee.PURE_DP and pure.delta == 0
    assert rand.guarantee is Guarantee.RANDOM_DP
    assert "gamma=0.05" in str(rand) and "confidence" in str(rand)
    gauss = (
        PostTrainingPrivacyEngine(mechanism="gaussian")
        .make_private(
            head,
            epsilon=1.0,
            delta=1e-5,
            sensitivity=SensitivityInfo(value=1.0, norm="l2", source="analytic"),
            seed=0,
        )
        .statement
    )
    assert gauss.guarantee is Guarantee.APPROX_DP and gauss.delta == 1e-5


def test_a_public_population_sensitivity_names_its_assumption(head) -> None:  # type: ignore[no-untyped-def]
    # Issue 23: the members are not drawn from the public split, so the random-DP bound
    # covers pairs containing them only if they are exchangeable with it; the statement
    # now says so, and so do its plain words.
    sampled = SensitivityInfo(
        value=1.0,
        norm="l1",
        source="sampled",
        m=200,
        gamma=0.05,
        confidence=0.99996,
        population="the public split",
    )
    st = (
        PostTrainingPrivacyEngine(mechanism="alm")
        .make_private(head, epsilon=1.0, sensitivity=sampled)
        .statement
    )
    assert "the members are exchangeable with that population" in str(st)
    assert "only if the members are exchangeable" in describe(st)


def test_classic_gaussian_states_its_actual_delta_beyond_its_theorem(head) -> None:  # type: ignore[no-untyped-def]
    engine = PostTrainingPrivacyEngine(mechanism="gaussian-classic")
    info = SensitivityInfo(value=1.0, norm="l2", source="analytic")
    small_eps = engine.make_private(head, epsilon=0.5, delta=1e-5, sensitivity=info, seed=0)
    assert small_eps.statement.delta == 1e-5
    assert not any("epsilon < 1" in note for note in small_eps.statement.notes)
    big = engine.make_private(head, epsilon=10.0, delta=1e-5, sensitivity=info, seed=0).statement
    sigma = math.sqrt(2 * math.log(1.25 / 1e-5)) / 10.0
    # Balle & Wang (2018) Thm 8: the exact delta of sigma at epsilon, computed here from scipy.
    exact = stats.norm.cdf(1 / (2 * sigma) - 10 * sigma) - math.exp(10) * stats.norm.cdf(
        -1 / (2 * sigma) - 10 * sigma
    )
    assert big.delta == pytest.approx(exact, rel=1e-6) and big.delta > 1e-5
    assert "epsilon < 1" in " ".join(big.notes)


def test_wrong_norm_and_bad_budgets_are_refused(head) -> None:  # type: ignore[no-untyped-def]
    engine = PostTrainingPrivacyEngine(mechanism="alm")
    with pytest.raises(ValueError, match="norm"):
        engine.make_private(
            head,
            epsilon=1.0,
            seed=0,
            sensitivity=SensitivityInfo(value=1.0, norm="l2", source="analytic"),
        )
    bads = [
        dict(epsilon=0.0, sensitivity=1.0),
        dict(epsilon=1.0, sensitivity=math.nan),
        dict(epsilon=-1.0, sensitivity=1.0),
        dict(epsilon=1.0, sensitivity=-2.0),
    ]
    for bad in bads:
        with pytest.raises(ValueError):
            engine.make_private(head, seed=0, **bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"fc\.nosuch"):
        engine.make_private(head, epsilon=1.0, sensitivity=1.0, seed=0, parameters=["fc.nosuch"])


def test_reprotect_needs_no_retraining_and_never_leaks_clean_weights(head, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    clean = {k: v.clone() for k, v in head.state_dict().items()}
    engine = PostTrainingPrivacyEngine(mechanism="alm")
    a = engine.make_private(head, epsilon=1.0, sensitivity=0.2, seed=1)
    b = engine.make_private(head, epsilon=4.0, sensitivity=0.2, seed=2)
    assert all(torch.equal(v, head.state_dict()[k]) for k, v in clean.items())  # owner's copy
    for release in (a, b):
        for key, value in release.state_dict().items():
            assert not any(torch.equal(value, c) for c in clean.values()), key
    # More budget, less noise: the epsilon=4 release sits 4x closer in expectation.
    assert float((_flat(b) - _flat(head)).abs().mean()) < float(
        (_flat(a) - _flat(head)).abs().mean()
    )
    a.save(tmp_path / "release.pt", allow_seeded=True)
    loaded = ProtectedModule.load(tmp_path / "release.pt", module=head)
    assert loaded.statement == a.statement
    assert torch.equal(_flat(loaded), _flat(a))
    other = train_head(
        torch.randn(20, 5), torch.randint(0, 10, (20,)), num_classes=10, config=FAST, seed=0
    )
    with pytest.raises(ValueError, match=r"fc.weight: \[10, 64\] vs \[10, 5\]"):
        ProtectedModule.load(tmp_path / "release.pt", module=other)


def test_utility_loss_is_definition_6_1() -> None:
    assert utility_loss(protected=0.45, unprotected=0.9) == pytest.approx(0.5)
    assert utility_loss(protected=0.9, unprotected=0.9) == 0.0
    with pytest.raises(ValueError):
        utility_loss(protected=0.5, unprotected=0.0)


def _context(pixel_features, **kwargs) -> MethodContext:  # type: ignore[no-untyped-def]
    x, y = pixel_features
    return MethodContext(
        num_classes=10,
        head=FAST,
        public_features=x[200:500],
        public_labels=y[200:500],
        dataset="digits",
        **kwargs,
    )


@pytest.mark.parametrize(
    "source,expected",
    [
        ("analytic", "pure-dp"),
        ("stability", "pure-dp"),
        ("sampled", "random-dp"),
        ("sampled-members", "none"),
    ],
)
def test_alm_method_at_epsilon_1(small, pixel_features, source: str, expected: str) -> None:  # type: ignore[no-untyped-def]
    x, y = small
    context = _context(pixel_features, noise=NoisePolicy(reproducible=True))
    method = create_method("alm", options={"sensitivity": source, "m": 12})
    prepared = method.prepare(features=x, labels=y, seed=0, context=context)
    release = method.release(
        prepared,
        ReleaseRequest(
            features=x, labels=y, epsilon=1.0, delta=1e-5, seed=0, draw=0, context=context
        ),
    )
    st = release.statement
    assert st.guarantee.value == expected and st.delta == 0.0
    assert st.epsilon == (math.inf if expected == "none" else 1.0)
    assert st.sensitivity is not None and st.sensitivity.norm == "l1"
    # calibrated to the grid-rounded sensitivity, at most 2⁻⁷ above the sampled one
    assert st.grid_sensitivity is not None
    assert st.sensitivity.value < st.grid_sensitivity <= st.sensitivity.value * (1 + 2.0**-7)
    assert st.noise_scale == pytest.approx(st.grid_sensitivity / 1.0)
    if source.startswith("sampled"):
        assert st.sensitivity.gamma is not None and 0 < st.sensitivity.confidence < 1
    if source == "sampled":  # neighbours drawn from the public rows, never the members
        assert "(300 rows of digits, drawn with replacement)" in str(st)
        assert st.neighbouring == "replace-one"
    if expected == "none":
        assert st.nominal_epsilon == 1.0 and "private members" in str(st)
    proba = release.predict_proba(x)
    assert proba.shape == (len(x), 10)
    assert torch.allclose(proba.sum(1), torch.ones(len(x)), atol=1e-5)
    # Draws differ, and a repeat of the same draw is the same release.
    again = method.release(
        prepared,
        ReleaseRequest(
            features=x, labels=y, epsilon=1.0, delta=1e-5, seed=0, draw=0, context=context
        ),
    )
    other = method.release(
        prepared,
        ReleaseRequest(
            features=x, labels=y, epsilon=1.0, delta=1e-5, seed=0, draw=1, context=context
        ),
    )
    assert torch.equal(_flat(release.module), _flat(again.module))
    assert not torch.equal(_flat(release.module), _flat(other.module))


def test_adaptive_shadow_trainer_adds_the_released_noise_scale(
    small, pixel_features, monkeypatch
) -> None:  # type: ignore[no-untyped-def]
    x, y = small
    context = _context(pixel_features)
    method = create_method("laplace", options={"sensitivity": "sampled", "m": 8})
    prepared = method.prepare(features=x, labels=y, seed=0, context=context)
    release = method.release(
        prepared,
        ReleaseRequest(
            features=x, labels=y, epsilon=0.01, delta=0.0, seed=0, draw=0, context=context
        ),
    )
    assert release.attacker is not None and not release.baseline
    trainer = release.attacker()
    masks = torch.ones(3, len(y), dtype=torch.bool)
    proba = trainer(x, y, masks, 0)(x)
    assert proba.shape == (3, len(x), 10)
    plain = plain_shadow_trainer(context)(x, y, masks, 0)(x)
    # At epsilon=0.01 the noise swamps the weights: shadow predictions move far from plain ones.
    assert float((proba - plain).abs().mean()) > 0.05
    assert np.isfinite(proba.numpy()).all()
    # The shadows predict in float32 (their probabilities are handed on in float32): the
    # same noisy heads in float64 give the same probabilities to float32 rounding.
    assert proba.dtype == torch.float32
    moderate = method.release(
        prepared,
        ReleaseRequest(
            features=x, labels=y, epsilon=10.0, delta=0.0, seed=0, draw=0, context=context
        ),
    )
    assert moderate.attacker is not None
    import alm_opacus.posttraining.method as posthoc

    wide: list[torch.Tensor] = []
    logits = posthoc.batched_logits

    def spy(params, features, *, config, dtype=None):  # type: ignore[no-untyped-def]
        as64 = {k: v.double() for k, v in params.items()}
        wide.append(torch.softmax(logits(as64, features, config=config), -1))
        return logits(params, features, config=config, dtype=dtype)

    monkeypatch.setattr(posthoc, "batched_logits", spy)
    narrow = moderate.attacker()(x, y, masks, 0)(x)
    torch.testing.assert_close(narrow.double(), wide[0], rtol=0, atol=1e-5)


def test_prepared_head_and_sensitivity_are_cached_on_disk(
    small, pixel_features, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    import alm_opacus.posttraining.method as posthoc

    x, y = small
    options = posthoc.PostTrainingOptions(m=6)
    context = _context(pixel_features, cache_dir=tmp_path)
    first = posthoc.prepare_head(features=x, labels=y, seed=3, context=context, options=options)
    (path,) = tmp_path.glob("posthoc-head-*.pt")
    context = _context(pixel_features, cache_dir=tmp_path)  # a new run: only the disk is left
    stamp = path.stat().st_mtime_ns
    again = posthoc.prepare_head(features=x, labels=y, seed=3, context=context, options=options)
    assert path.stat().st_mtime_ns == stamp  # read, not recomputed
    assert again.sensitivity == first.sensitivity and again.details == first.details
    for a, b in zip(
        first.head.state_dict().values(), again.head.state_dict().values(), strict=True
    ):
        assert torch.equal(a, b)
    context = _context(pixel_features, cache_dir=tmp_path)
    path.write_bytes(b"garbage")
    with pytest.warns(StaleCacheWarning, match="not a readable cache file"):
        redone = posthoc.prepare_head(
            features=x, labels=y, seed=3, context=context, options=options
        )
    assert redone.sensitivity == first.sensitivity


def _scale_sensitivity(record: dict[str, Any]) -> None:
    # The hostile input of issue 23: sensitivity x 1e-6, kind, key and digest kept.
    for info in record["payload"]["sensitivity"].values():
        info["value"] *= 1e-6


@pytest.mark.parametrize(
    ("tamper", "reason"),
    [
        (_scale_sensitivity, "does not match its content digest"),
        (lambda r: [r.pop(k) for k in ("format", "code", "digest")], "older format"),
        (lambda r: r.update(code="0123456789abcdef"), "written by other code"),
        (lambda r: r.update(key=r["key"] + " "), "other inputs"),
        (
            lambda r: r.update(kind="alm_opacus.shadow-heads"),
            "expected a 'alm_opacus.posttraining.method-head'",
        ),
    ],
    ids=["sensitivity-x1e-6", "legacy-no-digest", "other-code", "other-key", "other-kind"],
)
def test_an_altered_or_stale_head_cache_is_recomputed_never_used(
    small,
    pixel_features,
    tmp_path: Path,
    tamper: Callable[[dict[str, Any]], object],
    reason: str,
) -> None:  # type: ignore[no-untyped-def]
    import alm_opacus.posttraining.method as posthoc

    x, y = small
    options = posthoc.PostTrainingOptions(m=6)

    def prepare() -> posthoc.PreparedHead:  # a new run each time: only the disk is shared
        context = _context(pixel_features, cache_dir=tmp_path)
        return posthoc.prepare_head(features=x, labels=y, seed=3, options=options, context=context)

    first = prepare()
    (path,) = tmp_path.glob("posthoc-head-*.pt")
    record = torch.load(path, weights_only=True)
    tamper(record)
    atomic_torch_save(record, path)
    with pytest.warns(StaleCacheWarning, match=reason) as seen:
        again = prepare()
    assert str(path) in str(seen[0].message)
    # The true sensitivity, not the altered one; and the file is whole again.
    assert again.sensitivity == first.sensitivity
    with warnings.catch_warnings():
        warnings.simplefilter("error", StaleCacheWarning)
        third = prepare()
    assert third.sensitivity == first.sensitivity


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_a_release_with_non_finite_weights_is_refused(head, tmp_path: Path, bad: float) -> None:  # type: ignore[no-untyped-def]
    # Issue 23: a pure-DP release whose weights were replaced by NaN loaded as if protected.
    engine = PostTrainingPrivacyEngine(mechanism="laplace")
    release = engine.make_private(
        head,
        epsilon=1.0,
        seed=0,
        sensitivity=SensitivityInfo(value=0.2, norm="l1", source="analytic"),
    )
    assert release.statement.guarantee.value == "pure-dp"
    path = tmp_path / "release.pt"
    release.save(path, allow_seeded=True)
    assert torch.equal(_flat(ProtectedModule.load(path, module=head)), _flat(release))
    state = torch.load(path, weights_only=True)
    state["state_dict"]["fc.weight"][0, 0] = bad
    atomic_torch_save(state, path)
    with pytest.raises(ValueError, match=r"non-finite weights in fc\.weight"):
        ProtectedModule.load(path, module=head)


# --- hostile input (issue 36, item 8) --------------------------------------------------------


def _linear(dtype: torch.dtype, value: float, shape: tuple[int, int] = (3, 20)) -> torch.nn.Module:
    module = torch.nn.Linear(shape[1], shape[0]).to(dtype)
    with torch.no_grad():
        for p in module.parameters():
            p.fill_(value)
    return module


def test_integer_or_no_parameters_are_refused_by_name() -> None:
    engine = PostTrainingPrivacyEngine(mechanism="laplace")
    module = _linear(torch.float64, 0.1)
    module.steps = torch.nn.Parameter(torch.zeros(3, dtype=torch.int8), requires_grad=False)
    with pytest.raises(ValueError, match=r"\['steps \(torch\.int8\)'\] are not floating-point"):
        engine.make_private(module, epsilon=1.0, sensitivity=1.0, seed=0)
    with pytest.raises(ValueError, match=r"parameters=\[\]: expected at least one parameter"):
        engine.make_private(module, epsilon=1.0, sensitivity=1.0, seed=0, parameters=[])
    with pytest.raises(ValueError, match=r"parameters='weight' is invalid: expected a list"):
        engine.make_private(module, epsilon=1.0, sensitivity=1.0, seed=0, parameters="weight")
    with pytest.raises(ValueError, match="the module has no parameters"):
        engine.make_private(torch.nn.ReLU(), epsilon=1.0, sensitivity=1.0, seed=0)
    # declared public, the integer parameter is left as it is
    release = engine.make_private(
        module,
        epsilon=1.0,
        sensitivity=1.0,
        seed=0,
        parameters=["weight", "bias"],
        public=["steps"],
    )
    assert torch.equal(release.module.steps, module.steps)


def test_a_bfloat16_head_is_released_in_float32_and_rounded_not_clamped(tmp_path: Path) -> None:
    # Issue 36: bfloat16 holds 2^8 exact grid steps; planned in its own range, the noise
    # did not fit and every weight came back clamped to ±2^8·γ.
    engine = PostTrainingPrivacyEngine(mechanism="laplace")
    module = _linear(torch.bfloat16, 10.0, shape=(50, 40))
    release = engine.make_private(module, epsilon=1.0, sensitivity=1.0, seed=0)
    noisy = torch.cat([p.detach().flatten() for p in release.parameters()]).double()
    assert release.module.weight.dtype == torch.bfloat16
    scale = release.statement.noise_scale
    assert scale is not None and 1.0 < scale < 1.02  # Δ'/ε: Δ plus its grid inflation
    # Laplace noise of scale b around 10: mean 10, mean absolute deviation b (2050 draws)
    assert abs(float(noisy.mean()) - 10.0) < 0.15
    assert float((noisy - 10.0).abs().mean()) == pytest.approx(scale, rel=0.1)
    assert "released in torch.bfloat16" in " ".join(release.statement.notes)
    release.save(tmp_path / "bf16.pt", allow_seeded=True)
    assert torch.equal(
        ProtectedModule.load(tmp_path / "bf16.pt", module=module).module.weight,
        release.module.weight,
    )


def test_a_float16_release_never_ships_inf(tmp_path: Path) -> None:
    # Issue 36: a widened float16 grid passed float16's range and shipped ±inf.
    engine = PostTrainingPrivacyEngine(mechanism="laplace")
    module = _linear(torch.float16, 1.0, shape=(10, 40))
    release = engine.make_private(module, epsilon=0.01, sensitivity=100.0, seed=0)
    weights = release.module.weight.detach()
    assert bool(torch.isfinite(weights).all())
    assert float(weights.abs().max()) == float(torch.finfo(torch.float16).max)  # clamped there
    release.save(tmp_path / "f16.pt", allow_seeded=True)
    loaded = ProtectedModule.load(tmp_path / "f16.pt", module=module)
    assert torch.equal(loaded.module.weight, weights)


def test_clean_values_beyond_the_grid_clamp_are_refused_not_clamped() -> None:
    engine = PostTrainingPrivacyEngine(mechanism="laplace")
    with pytest.raises(ValueError, match=r"parameter 'weight' holds \|value\|=1e\+30 beyond"):
        engine.make_private(_linear(torch.float32, 1e30), epsilon=1.0, sensitivity=1.0, seed=0)


def _saved(head, tmp_path: Path) -> tuple[Path, dict]:  # type: ignore[no-untyped-def]
    release = PostTrainingPrivacyEngine(mechanism="laplace").make_private(
        head, epsilon=1.0, sensitivity=0.2, seed=0
    )
    path = tmp_path / "release.pt"
    release.save(path, allow_seeded=True)
    return path, torch.load(path, weights_only=True)


@pytest.mark.parametrize("key", ["statement", "protected", "shapes", "state_dict"])
def test_a_release_missing_a_key_is_refused_by_name(head, tmp_path: Path, key: str) -> None:  # type: ignore[no-untyped-def]
    path, state = _saved(head, tmp_path)
    del state[key]
    atomic_torch_save(state, path)
    with pytest.raises(ValueError, match=rf"release\.pt: the release lacks the keys \['{key}'\]"):
        ProtectedModule.load(path, module=head)


def test_a_mismatched_release_is_refused_naming_the_file(head, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    path, state = _saved(head, tmp_path)
    # 'shapes' fits, but the weights under it do not
    edited = dict(state, state_dict={**state["state_dict"], "fc.bias": torch.zeros(3)})
    atomic_torch_save(edited, path)
    with pytest.raises(
        ValueError, match=r"release's weights do not fit.*fc\.bias: \[3\] vs \[10\]"
    ):
        ProtectedModule.load(path, module=head)
    atomic_torch_save(dict(state, protected=["fc.nosuch"]), path)
    with pytest.raises(ValueError, match=r"protected parameters \['fc\.nosuch'\] are not in"):
        ProtectedModule.load(path, module=head)
    atomic_torch_save(dict(state, statement=[1, 2]), path)
    with pytest.raises(ValueError, match=r"release\.pt: the release's statement is invalid"):
        ProtectedModule.load(path, module=head)
    flipped = dict(state, statement={**state["statement"], "epsilon": 0.1})
    atomic_torch_save(flipped, path)
    with pytest.raises(ValueError, match=r"release\.pt: the release's statement is invalid"):
        ProtectedModule.load(path, module=head)


@pytest.mark.parametrize("solver", ["adam", "newton"])
def test_the_head_cache_records_the_solver_that_trained_the_head(  # type: ignore[no-untyped-def]
    small, pixel_features, tmp_path: Path, solver: str
) -> None:
    """Issue 36: a sampled-sensitivity head trained by Newton was recorded as ``adam``."""
    import alm_opacus.posttraining.method as posthoc

    x, y = small
    recipe = FAST.replace(kind="linear", l2=1e-3, solver=solver)
    context = MethodContext(
        num_classes=10,
        head=recipe,
        public_features=pixel_features[0][200:500],
        public_labels=pixel_features[1][200:500],
        dataset="digits",
        cache_dir=tmp_path,
    )
    options = posthoc.PostTrainingOptions(m=6)
    prepared = posthoc.prepare_head(features=x, labels=y, seed=3, context=context, options=options)
    (path,) = tmp_path.glob("posthoc-head-*.pt")
    record = torch.load(path, weights_only=True)
    assert record["payload"]["solver"] == prepared.solver == solver
    assert record["payload"]["config"]["solver"] == solver
