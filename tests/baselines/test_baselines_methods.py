"""The baselines as registered methods: registration, statements, tuning records, dpsgd-full."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

from alm_opacus.methods import ReleaseRequest, available_methods, create_method
from baselines.dpsgd import TUNING_GRID


def test_import_registers_every_baseline():
    import baselines

    assert set(baselines.METHODS) <= set(available_methods())
    grids = baselines.tuning_grids()
    json.dumps(grids)  # goes to config.json
    assert grids["budget"] == baselines.TUNING_BUDGET
    assert all(len(g) <= baselines.TUNING_BUDGET for g in grids["grids"].values())


def test_dpsgd_release_statement_info_and_adaptive_shadows(pixel_features, make_context):
    x, y = pixel_features
    ctx = make_context()
    method = create_method("dpsgd", {"accountant": "rdp", "epochs": 3})
    prepared = method.prepare(features=x[:150], labels=y[:150], seed=0, context=ctx)
    release = method.release(
        prepared,
        ReleaseRequest(
            features=x[:150], labels=y[:150], epsilon=2.0, delta=1e-5, seed=0, draw=0, context=ctx
        ),
    )
    s = release.statement
    assert s.guarantee.value == "approx-dp" and (s.epsilon, s.delta) == (2.0, 1e-5)
    info = release.info
    assert info["epsilon_spent"] <= 2.0 and info["accountant"] == "rdp"
    assert len(info["tuning"]["tried"]) == 4
    chosen = {k: release.chosen_config[k] for k in ("lr", "max_grad_norm")}
    assert chosen in [dict(c) for c in TUNING_GRID]
    json.dumps(info)
    json.dumps(release.chosen_config)
    # a second draw reuses the tuned config and sigma, and is an independent run
    again = method.release(
        prepared,
        ReleaseRequest(
            features=x[:150], labels=y[:150], epsilon=2.0, delta=1e-5, seed=0, draw=1, context=ctx
        ),
    )
    assert again.chosen_config == release.chosen_config and again.info["sigma_cached"]
    assert not torch.equal(release.predict_proba(x[600:610]), again.predict_proba(x[600:610]))
    assert "adaptive" in release.attacker_note
    assert release.attacker is not None
    trainer = release.attacker()
    masks = torch.zeros(4, 120, dtype=torch.bool)
    masks[:, 1::2] = True
    assert trainer(x[700:820], y[700:820], masks, 0)(x[:5]).shape == (4, 5, 10)


def test_dpsgd_statement_names_its_accountant_relation_and_noise(pixel_features, make_context):
    x, y = pixel_features
    ctx = make_context()
    method = create_method("dpsgd", {"accountant": "rdp", "epochs": 2, "lr": 1.0, "clip": 0.5})
    prepared = method.prepare(features=x[:100], labels=y[:100], seed=0, context=ctx)
    release = method.release(
        prepared,
        ReleaseRequest(
            features=x[:100], labels=y[:100], epsilon=3.0, delta=1e-5, seed=0, draw=0, context=ctx
        ),
    )
    s, training = release.statement, release.training
    assert s.neighbouring == "add-remove" and s.sensitivity is not None
    assert s.sensitivity.adjacency == "remove-one" and s.sensitivity.value == 0.5
    assert s.noise == "secure" and "keystream keyed from os.urandom" in " ".join(s.notes)
    assert "rdp accountant" in s.mechanism
    # every epsilon in the notes sits beside its accountant
    assert "epsilon=3 at delta=1e-05 by the rdp accountant" in s.notes[0]
    assert "the rdp accountant reports epsilon=" in s.notes[0]
    assert training is not None and training.accountant == "rdp"
    assert training.clip_norm == 0.5
    # exact steps: sigma times the grid-rounded clip C' in (C, C(1 + 2^-7)]
    assert s.grid_sensitivity is not None and 0.5 < s.grid_sensitivity <= 0.5 * (1 + 2.0**-7)
    scale = training.noise_multiplier * s.grid_sensitivity
    assert s.noise_scale == pytest.approx(scale, rel=1e-15)
    assert s.epsilon_spent == training.epsilon_spent <= 3.0
    assert release.noise_std == pytest.approx(scale, rel=1e-15)
    assert release.info["tuning"]["note"].startswith("not tuned: lr and clip fixed")


def test_dpsgd_bad_accountant_option_is_named():
    with pytest.raises(ValueError, match="accountant='moments'"):
        create_method("dpsgd", {"accountant": "moments"})


class _TinyEncoder(nn.Module):
    out_dim = 8

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Conv2d(1, 4, 3, padding=1),
            nn.BatchNorm2d(4),
            nn.ReLU(inplace=True),
            nn.AdaptiveAvgPool2d(2),
            nn.Flatten(),
            nn.Linear(16, 8),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.net(x)
        return out


def test_dpsgd_full_replaces_batchnorm_and_stays_within_epsilon(digits):
    from baselines.dpsgd import DPSGDConfig, dpsgd_full_finetune

    images = torch.from_numpy(digits.images[:60]).float()
    labels = torch.from_numpy(digits.labels[:60]).long()
    encoder = _TinyEncoder()
    run = dpsgd_full_finetune(
        encoder=encoder,
        images=images,
        labels=labels,
        num_classes=10,
        config=DPSGDConfig(lr=0.5, epochs=2, batch_size=20),
        epsilon=3.0,
        delta=1e-5,
        accountant="rdp",
        seed=0,
        noise_seed=0,
    )
    kinds = {type(m) for m in run.model.modules()}
    assert nn.BatchNorm2d not in kinds and nn.GroupNorm in kinds
    assert any(isinstance(m, nn.BatchNorm2d) for m in encoder.modules())  # original untouched
    assert 0 < run.epsilon_spent <= 3.0 and run.steps == 2 * 3
    assert run.model(images[:2]).shape == (2, 10)


def test_private_model_starts_groupnorm_from_the_batchnorm_affine_parameters():
    from baselines.dpsgd import private_model

    encoder = _TinyEncoder()
    bn = encoder.net[1]
    with torch.no_grad():
        bn.weight.copy_(torch.tensor([0.5, 2.0, -1.0, 3.0]))
        bn.bias.copy_(torch.tensor([0.1, -0.2, 0.3, 0.0]))
    model = private_model(encoder=encoder, num_classes=10, seed=0)
    gn = model[0].net[1]
    assert isinstance(gn, nn.GroupNorm)
    assert torch.equal(gn.weight, bn.weight) and torch.equal(gn.bias, bn.bias)
    assert not model[0].net[2].inplace and encoder.net[2].inplace


def _image_context(digits):  # type: ignore[no-untyped-def]
    from alm_opacus.heads import HeadConfig
    from alm_opacus.methods import MethodContext

    images = torch.from_numpy(digits.images).float()
    labels = torch.from_numpy(digits.labels).long()
    context = MethodContext(
        num_classes=10,
        head=HeadConfig(),
        public_features=torch.zeros(len(images), 2)[200:300],
        public_labels=labels[200:300],
        public_images=images[200:300],
        encoder=_TinyEncoder(),
    )
    return context, images, labels


def test_dpsgd_full_tunes_on_public_images_and_releases_an_image_predictor(digits):
    from alm_opacus.methods import method_options
    from baselines.dpsgd import FULL_TUNING_GRID

    context, images, labels = _image_context(digits)
    # scoped keys: dpsgd's fixed lr and clip must not reach the full fine-tune
    options = method_options(
        "dpsgd-full",
        {
            "accountant": "rdp",
            "dpsgd.lr": 4.0,
            "dpsgd.clip": 1.0,
            "dpsgd-full.epochs": 1,
            "dpsgd-full.batch_size": 20,
        },
    )
    method = create_method("dpsgd-full", options)
    assert method.inputs == "images" and not method.in_all
    assert method.tuning_grid == FULL_TUNING_GRID and len(FULL_TUNING_GRID) == 4
    prepared = method.prepare(features=images[:40], labels=labels[:40], seed=0, context=context)
    # the public images are split like the public features would be: 40 train, 60 validation
    assert prepared.split.train_features.shape == (40, 1, 8, 8)
    assert prepared.split.validation_features.shape == (60, 1, 8, 8)
    release = method.release(
        prepared,
        ReleaseRequest(
            features=images[:40],
            labels=labels[:40],
            epsilon=4.0,
            delta=1e-5,
            seed=0,
            draw=0,
            context=context,
        ),
    )
    tuning = release.info["tuning"]
    chosen = tuning["chosen"]
    assert len(tuning["tried"]) == 4
    assert chosen in [{k: t[k] for k in chosen} for t in tuning["tried"]]
    picked = {k: release.chosen_config[k] for k in ("lr", "max_grad_norm")}
    assert picked in [dict(c) for c in FULL_TUNING_GRID]
    assert release.statement.guarantee.value == "approx-dp"
    assert release.info["epsilon_spent"] <= 4.0 and release.info["steps"] == 2
    proba = release.predict_proba(images[100:103])
    assert proba.shape == (3, 10) and torch.allclose(proba.sum(1), torch.ones(3))
    assert "mis-specified" in release.attacker_note and release.attacker is None


def test_dpsgd_full_needs_the_encoder_and_images(digits):
    import dataclasses

    context, images, labels = _image_context(digits)
    method = create_method("dpsgd-full")
    with pytest.raises(ValueError, match=r"context\.encoder"):
        method.prepare(
            features=images[:40],
            labels=labels[:40],
            seed=0,
            context=dataclasses.replace(context, encoder=None),
        )
    with pytest.raises(ValueError, match=r"images \(n, C, H, W\)"):
        method.prepare(
            features=images[:40].reshape(40, -1), labels=labels[:40], seed=0, context=context
        )


def test_public_split_of_images_matches_the_split_of_features(make_context):
    from baselines._common import public_split

    context = make_context()
    feats = public_split(context=context, n=50, seed=3)
    rows = torch.arange(len(context.public_features)).float().reshape(-1, 1, 1, 1) * 10
    imgs = public_split(context=context, n=50, seed=3, inputs=rows)
    assert feats is not None and imgs is not None
    order = (imgs.train_features.flatten() / 10).long()
    assert torch.equal(feats.train_features, context.public_features[order])
    assert torch.equal(feats.validation_labels, imgs.validation_labels)
    with pytest.raises(ValueError, match="inputs has 3 rows"):
        public_split(context=context, n=50, seed=3, inputs=rows[:3])


@pytest.mark.parametrize("name", ["dpsgd", "dpsgd-alm", "dpsgd-laplace"])
def test_the_dpsgd_attacker_is_known_before_the_victim_trains(
    name, pixel_features, make_context, monkeypatch
):
    """``attacker_before_release`` gives, without training, the release's own adaptive
    attacker: the same shadow trainer with the noise multiplier, Poisson rate and mechanism
    the victim then trains with (``same_factory``); an MLP head's attacker is plain (none)."""
    import baselines.dpsgd.method as dpsgd_method
    from alm_opacus.heads import HeadConfig
    from alm_opacus.method_base import same_factory

    x, y = pixel_features
    ctx = make_context()
    method = create_method(name, {"epochs": 2, "tune": False})
    prepared = method.prepare(features=x[:150], labels=y[:150], seed=0, context=ctx)
    request = ReleaseRequest(
        features=x[:150], labels=y[:150], epsilon=2.0, delta=1e-5, seed=0, draw=0, context=ctx
    )
    trained: list[int] = []
    train = dpsgd_method.train_dpsgd_head
    monkeypatch.setattr(
        dpsgd_method, "train_dpsgd_head", lambda *a, **k: trained.append(1) or train(*a, **k)
    )
    early = method.attacker_before_release(prepared, request)
    assert early is not None and not trained
    release = method.release(prepared, request)
    assert trained and same_factory(early, release.attacker)
    info = release.info
    assert early.keywords["sigma"] == info["noise_multiplier"]
    assert early.keywords["sample_rate"] == info["sample_rate"]
    assert early.keywords["mechanism"] == info["noise_mechanism"]
    # a different budget is a different attacker
    other = method.attacker_before_release(
        prepared, ReleaseRequest(**{**vars(request), "epsilon": 4.0})
    )
    assert other is not None and not same_factory(other, release.attacker)
    mlp = make_context(head=HeadConfig(kind="mlp", hidden=16))
    prepared = method.prepare(features=x[:150], labels=y[:150], seed=0, context=mlp)
    assert (
        method.attacker_before_release(
            prepared, ReleaseRequest(**{**vars(request), "context": mlp})
        )
        is None
    )
