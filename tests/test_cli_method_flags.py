"""The methods' own flags come from their ``Options`` (``cli_option`` fields), not from the
core command line: a plugin's flag is parsed like a built-in's, the core parser names none of
them, and ``--help`` prints them from a snapshot that matches the registered methods."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import pytest

from alm_opacus.methods import (
    Method,
    MethodOptions,
    cli_option,
    method_flags,
    method_options,
    register_method,
)
from alm_opacus.options import OptionError, collect_flags
from alm_opacus.run import catalogue
from alm_opacus.run.cli import parse_config
from alm_opacus.run.cli_parser import build_parser

ROOT = Path(__file__).resolve().parents[1]
TOY = "toy-flags"


@dataclass(frozen=True)
class ToyOptions(MethodOptions):
    """A plugin's options: one shared flag, one scoped flag, one field without a flag."""

    width: int = cli_option(3, help="bins of the toy release")
    mode: Literal["coarse", "fine"] = cli_option("coarse", help="the toy's grid", shared=False)
    plain: float = 1.0

    def __post_init__(self) -> None:
        if self.width < 2:
            raise ValueError(f"width={self.width!r} is invalid: expected an integer >= 2")


class ToyMethod(Method[ToyOptions, None]):
    name = TOY
    Options = ToyOptions
    in_all = False


@pytest.fixture
def toy(isolated_registries: None) -> None:
    register_method(TOY)(ToyMethod)


def _parse(tmp_path: Path, *argv: str) -> dict[str, Any]:
    base = ["--out", str(tmp_path / "run"), "--cache-dir", str(tmp_path / "cache")]
    return parse_config([*argv, *base]).options


def _refused(tmp_path: Path, capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    with pytest.raises(SystemExit) as exc:
        _parse(tmp_path, *argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1, err
    return err


def test_a_plugins_options_declare_its_flags(toy: None) -> None:
    flags = {flag.flag: flag for flag in method_flags()}
    assert flags["--width"].key == "width" and flags["--width"].methods == (TOY,)
    assert flags["--width"].choices is None
    assert flags[f"--{TOY}-mode"].key == f"{TOY}.mode"
    assert flags[f"--{TOY}-mode"].choices == ("coarse", "fine")
    assert not any(flag.endswith("plain") for flag in flags)
    text = " ".join(build_parser(method_flags=tuple(flags.values())).format_help().split())
    assert "bins of the toy release (default: 3; option width of toy-flags)" in text
    assert f"--{TOY}-mode {{coarse,fine}}" in text


def test_a_plugin_flag_lands_in_the_run_options_typed(
    toy: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    options = _parse(tmp_path, "--methods", TOY, "--width", "7", f"--{TOY}-mode", "fine")
    assert options == {"width": 7, f"{TOY}.mode": "fine"}
    assert type(options["width"]) is int
    assert method_options(TOY, options) == ToyOptions(width=7, mode="fine")
    # the flag is checked by the options that read it, before anything runs
    assert "--width='x': expected an integer" in _refused(tmp_path, capsys, "--width", "x")
    assert "--width='1': expected an integer >= 2" in _refused(tmp_path, capsys, "--width", "1")
    err = _refused(tmp_path, capsys, f"--{TOY}-mode", "medium")
    assert f"--{TOY}-mode='medium': expected one of coarse, fine" in err


def test_a_plugin_flag_is_a_config_file_key(toy: None, tmp_path: Path) -> None:
    config = tmp_path / "run.yaml"
    config.write_text(f"methods: {TOY}\nwidth: 9\n", encoding="utf-8")
    assert _parse(tmp_path, "--config", str(config)) == {"width": 9}
    # the command line wins
    assert _parse(tmp_path, "--config", str(config), "--width", "4") == {"width": 4}


def test_the_builtin_flags_fill_the_same_options_as_before(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["--sensitivity", "analytic", "--m", "500", "--accountant", "rdp", "--queries", "3"]
    options = _parse(tmp_path, "--methods", "alm,dpsgd,lu", *argv, "--opt", "dpsgd.lr=1")
    assert options == {
        "sensitivity": "analytic",
        "m": 500,
        "accountant": "rdp",
        "queries": 3,
        "dpsgd.lr": "1",
    }
    assert options == _parse(
        tmp_path, "--methods", "alm,dpsgd,lu", "--opt", "dpsgd.lr=1", *argv
    )  # order of flags does not matter
    assert "--m='x': expected an integer" in _refused(tmp_path, capsys, "--m", "x")
    assert "--m='1': expected an integer >= 2" in _refused(tmp_path, capsys, "--m", "1")
    assert "--queries='0': expected an integer >= 1" in _refused(tmp_path, capsys, "--queries", "0")
    err = _refused(tmp_path, capsys, "--accountant", "exact")
    assert "--accountant='exact': expected one of alm_pld, prv, rdp" in err


def test_the_core_parser_names_no_method_option() -> None:
    run = ROOT / "alm_opacus" / "run"
    for module in ("cli_parser.py", "catalogue.py", "cli.py"):
        source = (run / module).read_text(encoding="utf-8")
        for name in ("sensitivity", "m", "accountant", "queries"):
            assert f'"--{name}"' not in source, (module, name)
            assert f'"{name}"' not in source, (module, name)
            assert not re.search(rf"args\.{name}\b", source), (module, name)


def test_the_help_snapshot_is_what_the_registered_methods_declare() -> None:
    """``--help`` prints the methods' flags from ``method_flags.json`` (without torch); it
    must equal what the registered methods declare (rewrite it with
    ``python -m alm_opacus.run.catalogue``)."""
    stored = json.loads(catalogue.METHOD_FLAGS_FILE.read_text(encoding="utf-8"))
    assert stored == catalogue.method_flags_snapshot()
    assert [flag.flag for flag in catalogue.help_method_flags()] == [
        "--sensitivity",
        "--m",
        "--stability-steps",
        "--stability-lr",
        "--stability-l2",
        "--accountant",
        "--queries",
    ]


def test_help_loads_the_plugins_the_snapshot_does_not_cover(
    toy: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    snapshot = [flag.flag for flag in catalogue.help_method_flags()]
    assert "--width" not in snapshot
    monkeypatch.setattr(catalogue, "_installed_plugins", lambda: ["baselines", "another"])
    live = [flag.flag for flag in catalogue.help_method_flags()]
    assert live == [flag.flag for flag in method_flags()] and "--width" in live


def test_flags_that_disagree_are_refused() -> None:
    @dataclass(frozen=True)
    class Wide(MethodOptions):
        width: float = cli_option(1.0, help="a width of another type")

    @dataclass(frozen=True)
    class Renamed(MethodOptions):
        width: int = cli_option(3, help="the same key under another flag", flag="--bins")

    @dataclass(frozen=True)
    class BadName(MethodOptions):
        width: int = cli_option(3, help="a flag without its dashes", flag="width")

    with pytest.raises(OptionError, match="flag --width is declared twice"):
        collect_flags({"a": ToyOptions, "b": Wide})
    with pytest.raises(OptionError, match="option width has two flags, --width"):
        collect_flags({"a": ToyOptions, "b": Renamed})
    with pytest.raises(OptionError, match="flag 'width' is invalid: expected --lowercase"):
        collect_flags({"a": BadName})
    with pytest.raises(ValueError, match="help is empty"):
        cli_option(1, help=" ")


def test_a_plugin_flag_that_takes_a_core_flags_name_is_refused(
    isolated_registries: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    @dataclass(frozen=True)
    class Clash(MethodOptions):
        seeds: int = cli_option(1, help="a field named like a core flag")

    class ClashMethod(Method[Clash, None]):
        name = "clash"
        Options = Clash

    register_method("clash")(ClashMethod)
    err = _refused(tmp_path, capsys, "--methods", "none")
    assert "--seeds, declared by the options of clash, is a core flag" in err


def test_help_with_plugins_whose_flags_disagree_exits_2(
    toy: None, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    @dataclass(frozen=True)
    class Wide(MethodOptions):
        width: float = cli_option(1.0, help="a width of another type")

    class WideMethod(Method[Wide, None]):
        name = "wide"
        Options = Wide

    register_method("wide")(WideMethod)
    monkeypatch.setattr(catalogue, "_installed_plugins", lambda: ["another"])
    with pytest.raises(SystemExit) as exc:
        build_parser()
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip()
    assert "flag --width is declared twice" in err and len(err.splitlines()) == 1
