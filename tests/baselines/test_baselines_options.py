"""The baselines' typed options: defaults, validation that names the bad value, and scoping."""

from __future__ import annotations

import dataclasses

import pytest

import baselines  # noqa: F401  (registers the baselines)
from alm_opacus.methods import create_method, method_options, validate_options
from alm_opacus.options import OptionError
from baselines.dperm import DPERMOptions
from baselines.dpsgd import TUNING_GRID, DPSGDOptions
from baselines.lu import LuOptions


@pytest.mark.parametrize(
    ("name", "cls"),
    [
        ("dpsgd", DPSGDOptions),
        ("dpsgd-full", DPSGDOptions),
        ("lu", LuOptions),
        ("dperm", DPERMOptions),
    ],
)
def test_every_baseline_declares_frozen_options_with_defaults(name, cls):
    method = create_method(name)
    assert isinstance(method.options, cls) and method.options == cls()
    with pytest.raises(dataclasses.FrozenInstanceError):
        method.options.tune = False  # type: ignore[misc]
    assert method.options.tune is True


@pytest.mark.parametrize(
    ("name", "options", "match"),
    [
        ("dpsgd", {"accountant": "moments"}, r"dpsgd\.accountant='moments'.*alm_pld, prv, rdp"),
        ("dpsgd", {"lr": 0.0}, "lr=0.0"),
        ("dpsgd", {"clip": "-1"}, "clip=-1.0"),
        ("dpsgd", {"epochs": 0}, "epochs=0"),
        ("dpsgd", {"batch_size": 1.5}, r"dpsgd\.batch_size=1\.5.*integer"),
        ("dpsgd", {"tune": "maybe"}, r"dpsgd\.tune='maybe'.*boolean"),
        ("dpsgd", {"momentum": 0.9}, r"unknown option dpsgd\.momentum"),
        ("dpsgd-full", {"clip": -2.0}, "clip=-2.0"),
        ("lu", {"noise": "cauchy"}, r"lu\.noise='cauchy'.*laplace, gaussian"),
        ("lu", {"queries": 0}, "queries=0"),
        ("lu", {"alpha": 0.0}, "alpha=0.0"),
        ("lu", {"steps": "ten"}, r"lu\.steps='ten'.*integer"),
        ("dperm", {"l2": -1.0}, "l2=-1.0"),
        ("dperm", {"clip_radius": "wide"}, r"dperm\.clip_radius='wide'.*number"),
    ],
)
def test_bad_values_are_named(name, options, match):
    with pytest.raises(OptionError, match=match):
        create_method(name, options)


def test_strings_from_the_command_line_are_converted():
    method = create_method(
        "dpsgd", {"lr": "2", "clip": "0.5", "epochs": "3", "tune": "false", "accountant": "rdp"}
    )
    assert method.options == DPSGDOptions(accountant="rdp", tune=False, lr=2.0, clip=0.5, epochs=3)
    assert create_method("lu", {"l2": "none"}).options.l2 is None


def test_scoped_keys_reach_one_method_and_shared_keys_every_declaring_one():
    values = {
        "accountant": "rdp",
        "tune": "false",
        "clip_radius": 2.0,
        "queries": 5,
        "dpsgd.lr": 1.0,
        "dpsgd.clip": 0.5,
        "dpsgd-full.epochs": 2,
        "lu.l2": 0.05,
        "dperm.l2": 1.0,
    }
    validate_options(values)
    dpsgd = method_options("dpsgd", values)
    full = method_options("dpsgd-full", values)
    assert dpsgd == DPSGDOptions(accountant="rdp", tune=False, lr=1.0, clip=0.5)
    # a fixed dpsgd lr never leaks into the full fine-tune
    assert full == DPSGDOptions(accountant="rdp", tune=False, epochs=2)
    assert method_options("lu", values) == LuOptions(
        queries=5, l2=0.05, clip_radius=2.0, tune=False
    )
    assert method_options("dperm", values) == DPERMOptions(l2=1.0, clip_radius=2.0, tune=False)
    with pytest.raises(OptionError, match=r"unknown option lu\.momentum"):
        method_options("lu", {"lu.momentum": 0.9})


@pytest.mark.parametrize(
    ("fixed", "expected"),
    [
        ({}, [(c["lr"], c["max_grad_norm"]) for c in TUNING_GRID]),
        ({"lr": 2.0}, [(2.0, 0.5), (2.0, 1.0)]),
        ({"clip": 0.25}, [(1.0, 0.25), (4.0, 0.25)]),
        ({"lr": 2.0, "clip": 0.25}, [(2.0, 0.25)]),
    ],
)
def test_fixed_lr_or_clip_narrows_the_grid(fixed, expected):
    candidates = DPSGDOptions(**fixed).candidates(TUNING_GRID, schedule=(7, 40))
    assert [(c.lr, c.max_grad_norm) for c in candidates] == expected
    assert {(c.epochs, c.batch_size) for c in candidates} == {(7, 40)}


def test_lu_config_follows_its_options():
    opts = LuOptions(hidden=32, alpha=2.0, steps=5, lr=0.1, clip_radius=0.5)
    config = opts.config()
    assert (config.hidden, config.alpha, config.steps, config.lr, config.clip_radius) == (
        32,
        2.0,
        5,
        0.1,
        0.5,
    )
    assert config.l2 == 0.0005 and opts.config(0.05).l2 == 0.05
    assert LuOptions(l2=0.5).config().l2 == 0.5
