"""Releases keep their promises: noise nobody can replay, sensitivities that leak nothing,
statements that add up, files that never run code (issue 11)."""

from __future__ import annotations

import math
import pickle
from pathlib import Path

import pytest
import torch

from alm_opacus._hashing import derive_seed
from alm_opacus.heads import HeadConfig, train_head
from alm_opacus.mechanisms import make_generator
from alm_opacus.mechanisms.exact import Grid, discrete_noise
from alm_opacus.methods import MethodContext, NoisePolicy, ReleaseRequest, create_method
from alm_opacus.protect import PostTrainingPrivacyEngine, ProtectedModule, SensitivityInfo
from alm_opacus.statement import Guarantee, PrivacyStatement

FAST = HeadConfig(steps=60, lr=0.05)
ANALYTIC = SensitivityInfo(value=0.5, norm="l1", source="analytic")


@pytest.fixture(scope="module")
def data(pixel_features):  # type: ignore[no-untyped-def]
    x, y = pixel_features
    return x[:120], y[:120], x[200:500], y[200:500]


@pytest.fixture(scope="module")
def head(data):  # type: ignore[no-untyped-def]
    x, y, _, _ = data
    return train_head(x, y, num_classes=10, config=FAST, seed=0)


def _flat(module: torch.nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().flatten() for p in module.parameters()])


def _replay(noisy: torch.nn.Module, *, statement: PrivacyStatement, seed: int) -> torch.Tensor:
    """The attack: regenerate the grid noise from a guessed seed and subtract it (the engine
    draws every parameter in order from one generator); what remains is the clean weights
    rounded to the grid."""
    assert statement.grid is not None and statement.noise_scale is not None
    grid = Grid(exponent=math.frexp(statement.grid)[1] - 1, limit=2**53, bound=2**52)
    gen = make_generator(seed=seed)
    return torch.cat(
        [
            (
                p.detach()
                - statement.grid
                * discrete_noise(
                    tuple(p.shape),
                    mechanism=statement.mechanism,
                    scale=statement.noise_scale,
                    grid=grid,
                    generator=gen,
                ).to(p)
            ).flatten()
            for p in noisy.parameters()
        ]
    )


def test_a_seeded_release_is_replayed_and_a_secure_one_is_not(head) -> None:  # type: ignore[no-untyped-def]
    engine = PostTrainingPrivacyEngine(mechanism="alm")
    clean = _flat(head)
    seeded = engine.make_private(head, epsilon=1.0, sensitivity=ANALYTIC, seed=1234)
    scale, grid = seeded.statement.noise_scale, seeded.statement.grid
    assert scale is not None and grid is not None and seeded.statement.noise == "seeded"
    # Trying seeds 0..1999 finds it: the recovered weights are the clean ones on the grid.
    hits = [
        s
        for s in range(2000)
        if float((_replay(seeded, statement=seeded.statement, seed=s) - clean).abs().max())
        <= grid / 2
    ]
    assert hits == [1234]
    secure = engine.make_private(head, epsilon=1.0, sensitivity=ANALYTIC)
    assert secure.statement.noise == "secure" and "seeded" not in str(secure.statement)
    best = min(
        float((_replay(secure, statement=secure.statement, seed=s) - clean).abs().max())
        for s in range(2000)
    )
    assert best > scale  # no seed explains the noise: it came from the keystream


@pytest.mark.parametrize("reproducible", [True, False])
def test_harness_releases_replay_only_with_reproducible_noise(data, reproducible: bool) -> None:  # type: ignore[no-untyped-def]
    """The audit's attack: from the noisy weights, the statement and config.json's values
    (method, seed, draw, epsilon), regenerate the noise and subtract it."""
    x, y, px, py = data
    context = MethodContext(
        num_classes=10,
        head=FAST,
        public_features=px,
        public_labels=py,
        noise=NoisePolicy(reproducible=reproducible),
    )
    method = create_method("laplace", options={"sensitivity": "sampled", "m": 6})
    prepared = method.prepare(features=x, labels=y, seed=0, context=context)
    release = method.release(
        prepared,
        ReleaseRequest(
            features=x, labels=y, epsilon=2.0, delta=0.0, seed=0, draw=3, context=context
        ),
    )
    st = release.statement
    assert st.noise == ("seeded" if reproducible else "secure") and st.noise_scale is not None
    assert release.module is not None
    guess = _replay(release.module, statement=st, seed=derive_seed("laplace", 0, 3, 2.0))
    error = float((guess - _flat(prepared.head)).abs().max())
    if reproducible:
        assert st.grid is not None and error <= st.grid / 2
        assert any("seed stays secret" in note for note in st.notes)
    else:
        assert error > st.noise_scale


def test_sampled_sensitivity_does_not_depend_on_the_members(data) -> None:  # type: ignore[no-untyped-def]
    """Issue 11: the members-sampled estimate told neighbouring data sets apart; the one drawn
    from public data is the same for every member set of the same size."""
    x, y, px, py = data
    context = MethodContext(num_classes=10, head=FAST, public_features=px, public_labels=py)
    replaced = x.clone()
    replaced[7] = px[-1]  # one member replaced
    values = {}
    for variant in ("sampled", "sampled-members"):
        method = create_method("alm", options={"sensitivity": variant, "m": 8})
        for name, members in (("D", x), ("D'", replaced)):
            prepared = method.prepare(features=members, labels=y, seed=0, context=context)
            values[variant, name] = prepared.sensitivity["l1"].value
    assert values["sampled", "D"] == values["sampled", "D'"]
    assert values["sampled-members", "D"] != values["sampled-members", "D'"]


def test_a_missing_public_split_is_named(data) -> None:  # type: ignore[no-untyped-def]
    x, y, _, _ = data
    context = MethodContext(num_classes=10, head=FAST)
    method = create_method("alm", options={"sensitivity": "sampled", "m": 4})
    with pytest.raises(ValueError, match=r"n=120 from the public split, which has 0 rows"):
        method.prepare(features=x, labels=y, seed=0, context=context)


def test_the_ledger_adds_up_per_clean_head(head, data) -> None:  # type: ignore[no-untyped-def]
    x, y, _, _ = data
    engine = PostTrainingPrivacyEngine(mechanism="alm")
    first = engine.make_private(head, epsilon=1.0, sensitivity=ANALYTIC).statement
    second = engine.make_private(head, epsilon=0.5, sensitivity=ANALYTIC).statement
    assert (first.epsilon_spent, second.epsilon_spent) == (1.0, 1.5)
    assert "spent on this model so far: epsilon=1.5" in str(second)
    other = train_head(x, y, num_classes=10, config=FAST, seed=1)
    assert (
        engine.make_private(other, epsilon=2.0, sensitivity=ANALYTIC).statement.epsilon_spent == 2
    )
    assert engine.spent(head).releases == 2 and engine.spent(head).epsilon == 1.5
    gauss = PostTrainingPrivacyEngine(mechanism="gaussian")
    info = SensitivityInfo(value=0.5, norm="l2", source="analytic")
    gauss.make_private(head, epsilon=1.0, delta=1e-6, sensitivity=info)
    last = gauss.make_private(head, epsilon=1.0, delta=2e-6, sensitivity=info).statement
    # the accountant composes the two Gaussians more tightly than basic composition's 2
    # (tests/test_ledger.py checks the value against the exact one-Gaussian composition)
    assert last.epsilon_spent is not None and 1.0 < last.epsilon_spent < 2.0
    assert last.delta_spent == pytest.approx(3e-6)


def test_a_partial_release_must_declare_the_rest_public(head) -> None:  # type: ignore[no-untyped-def]
    engine = PostTrainingPrivacyEngine(mechanism="alm")
    with pytest.raises(ValueError, match=r"\['fc.bias'\] would be released without noise"):
        engine.make_private(head, epsilon=1.0, sensitivity=ANALYTIC, parameters=["fc.weight"])
    release = engine.make_private(
        head, epsilon=1.0, sensitivity=ANALYTIC, parameters=["fc.weight"], public=["fc.bias"]
    )
    assert release.statement.unprotected_parameters == ("fc.bias",)
    assert "released without noise (declared public): fc.bias" in str(release.statement)
    assert torch.equal(release.module.fc.bias, head.fc.bias)  # type: ignore[union-attr]


def test_a_bare_number_is_recorded_as_caller_supplied(head) -> None:  # type: ignore[no-untyped-def]
    st = (
        PostTrainingPrivacyEngine(mechanism="alm")
        .make_private(head, epsilon=1.0, sensitivity=0.5)
        .statement
    )
    assert st.sensitivity is not None and st.sensitivity.source.value == "caller"
    assert st.guarantee is Guarantee.PURE_DP
    assert any("supplied by the caller" in note for note in st.notes)


def test_seeded_releases_are_not_saved_without_an_override(head, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    engine = PostTrainingPrivacyEngine(mechanism="alm")
    seeded = engine.make_private(head, epsilon=1.0, sensitivity=ANALYTIC, seed=0)
    with pytest.raises(ValueError, match="seeded noise"):
        seeded.save(tmp_path / "seeded.pt")
    assert not (tmp_path / "seeded.pt").exists()
    seeded.save(tmp_path / "seeded.pt", allow_seeded=True)
    secure = engine.make_private(head, epsilon=1.0, sensitivity=ANALYTIC)
    secure.save(tmp_path / "secure.pt")
    loaded = ProtectedModule.load(tmp_path / "secure.pt", module=head)
    assert loaded.statement == secure.statement


class _Payload:
    """Unpickling this calls ``os.system``-like code: here it writes a marker file."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):  # type: ignore[no-untyped-def]
        return (Path.write_text, (self.marker, "pwned"))


@pytest.mark.filterwarnings("ignore:Detected pickle protocol")
def test_a_release_file_that_would_run_code_is_refused(head, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    marker = tmp_path / "marker"
    path = tmp_path / "evil.pt"
    state = {
        "kind": "alm_opacus.protected-module",
        "statement": _Payload(marker),
        "protected": [],
        "shapes": {},
        "state_dict": {},
    }
    torch.save(state, path)
    assert not marker.exists()
    with pytest.raises(ValueError, match="only tensors and plain data"):
        ProtectedModule.load(path, module=head)
    assert not marker.exists()  # the payload never ran
    with open(tmp_path / "plain.pkl", "wb") as handle:  # and a bare pickle, not a torch file
        pickle.dump(_Payload(marker), handle)
    with pytest.raises(ValueError):
        ProtectedModule.load(tmp_path / "plain.pkl", module=head)
    assert not marker.exists()


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"neighbouring": "replace-two"}, "neighbouring="),
        ({"noise": "quantum"}, "noise="),
        (
            {
                "sensitivity": SensitivityInfo(
                    value=1.0, norm="l1", source="analytic", adjacency="remove-one"
                )
            },
            "remove-one bound",
        ),
        (
            {
                "sensitivity": SensitivityInfo(
                    value=1.0, norm="l1", source="sampled-members", m=5, gamma=0.1, confidence=0.5
                )
            },
            "private members",
        ),
    ],
)
def test_statements_refuse_claims_that_do_not_add_up(kwargs, match: str) -> None:  # type: ignore[no-untyped-def]
    base = {"epsilon": 1.0, "delta": 0.0, "guarantee": "pure-dp", "mechanism": "alm"}
    with pytest.raises(ValueError, match=match):
        PrivacyStatement(**{**base, **kwargs})


def test_statements_round_trip_and_old_ones_still_load() -> None:
    st = PrivacyStatement(
        epsilon=2.0,
        delta=1e-5,
        guarantee="approx-dp",
        mechanism="gaussian",
        neighbouring="add-remove",
        noise="secure",
        epsilon_spent=3.0,
        delta_spent=2e-5,
        unprotected_parameters=("fc.bias",),
    )
    assert PrivacyStatement.from_dict(st.to_dict()) == st
    old = {
        "epsilon": 1.0,
        "delta": 0.0,
        "guarantee": "pure-dp",
        "mechanism": "alm",
        "noise_scale": 1.0,
        "sensitivity": None,
        "notes": [],
    }
    assert PrivacyStatement.from_dict(old).neighbouring == "replace-one"
    with pytest.raises(ValueError, match="unknown fields"):
        PrivacyStatement.from_dict({**old, "trust_me": True})
    none = PrivacyStatement.unprotected()
    assert PrivacyStatement.from_dict(none.to_dict()) == none and math.isinf(none.epsilon)


def test_make_private_records_itself_in_an_opacus_accountant(head) -> None:  # type: ignore[no-untyped-def]
    """Issue 15, item 4: one budget; the release is recorded by the engine, with its relation,
    and a release without a DP guarantee is refused before any noise is drawn."""
    from alm_opacus.accounting import PipelineAccountant

    accountant = PipelineAccountant()
    engine = PostTrainingPrivacyEngine(mechanism="alm")
    remove_one = SensitivityInfo(value=0.5, norm="l1", source="analytic", adjacency="remove-one")
    release = engine.make_private(head, epsilon=1.0, sensitivity=remove_one, accountant=accountant)
    assert release.statement.neighbouring == "add-remove"
    (record,) = accountant.releases
    assert record["dim"] == sum(p.numel() for p in head.parameters())
    assert accountant.get_epsilon(0.0) == pytest.approx(1.0)  # pure DP composes by summation
    accountant.step(noise_multiplier=1.0, sample_rate=0.1)
    with pytest.raises(ValueError, match="replace-one"):  # one relation per budget
        engine.make_private(head, epsilon=1.0, sensitivity=ANALYTIC, accountant=accountant)
    sampled = SensitivityInfo(
        value=0.5,
        norm="l1",
        source="sampled",
        m=10,
        gamma=0.1,
        confidence=0.6,
        population="public",
        adjacency="remove-one",
    )
    with pytest.raises(ValueError, match="random-dp release cannot be recorded"):
        engine.make_private(head, epsilon=1.0, sensitivity=sampled, accountant=accountant)
    assert len(accountant.releases) == 1
