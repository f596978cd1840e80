"""The command line's first minutes: ``--help`` without torch, and help text that agrees with
the code; ``import alm_opacus`` stays light and still registers the accountant."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest

from alm_opacus.run import catalogue

ROOT = Path(__file__).resolve().parents[1]


def _python(code: str) -> str:
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=True,
        timeout=600,
    )
    return done.stdout.strip()


def test_help_prints_without_importing_torch() -> None:
    out = _python(
        "import sys\n"
        "sys.argv = ['compare.py', '--help']\n"
        "from alm_opacus.run.cli import main\n"
        "try:\n    main()\nexcept SystemExit as exc:\n    code = exc.code\n"
        "print('torch' in sys.modules, 'opacus' in sys.modules, code)"
    )
    assert out.splitlines()[-1] == "False False 0"
    assert "--wide-table" in out and "--num-reference" in out
    # the methods' own flags, from the snapshot of their options (no torch)
    assert "--accountant {alm_pld,prv,rdp}" in out and "--sensitivity {sampled," in out


def test_import_alm_opacus_registers_the_accountant_in_either_order() -> None:
    first = _python(
        "import sys, alm_opacus\n"
        "light = 'torch' not in sys.modules\n"
        "import opacus\n"
        "print(light, type(opacus.PrivacyEngine(accountant='alm_pld').accountant).__name__)"
    )
    assert first.splitlines()[-1] == "True PipelineAccountant"
    second = _python(
        "import opacus, alm_opacus\n"
        "print(type(opacus.PrivacyEngine(accountant='alm_pld').accountant).__name__)"
    )
    assert second.splitlines()[-1] == "PipelineAccountant"


def test_lazy_names_resolve_to_their_modules() -> None:
    import alm_opacus
    from alm_opacus.protect import PrivacyStatement

    assert alm_opacus.PrivacyStatement is PrivacyStatement
    assert set(alm_opacus.__all__) <= set(dir(alm_opacus))
    with pytest.raises(AttributeError, match="no attribute 'nosuch'"):
        _ = alm_opacus.nosuch  # type: ignore[attr-defined]


def test_catalogue_names_what_the_registries_hold() -> None:
    from alm_opacus.data import available_datasets
    from alm_opacus.methods import available_methods, default_methods, reference_methods
    from alm_opacus.run.harness import load_plugins

    load_plugins()
    assert list(catalogue.METHODS) == available_methods()
    assert list(catalogue.REFERENCE_METHODS) == reference_methods()
    assert list(catalogue.OPT_IN_METHODS) == sorted(
        set(available_methods()) - set(default_methods()) - set(reference_methods())
    )
    assert set(catalogue.DATASETS) <= set(available_datasets())


def test_catalogue_names_the_executors_and_the_private_folder() -> None:
    from alm_opacus.run import executors, rundir

    assert list(catalogue.EXECUTORS) == executors.available_executors()
    assert catalogue.CLUSTER_EXTRA == executors.CLUSTER_EXTRA
    assert catalogue.PRIVATE_DIR == rundir.PRIVATE_DIR


def test_catalogue_defaults_are_the_code_defaults() -> None:
    from alm_opacus.attacks import AttackConfig
    from alm_opacus.run.config import RunConfig

    config, attacks = RunConfig(), AttackConfig()
    code = {
        "RunConfig.noise_draws": config.noise_draws,
        "RunConfig.seeds": config.seeds,
        "RunConfig.split_seed": config.split_seed,
        "RunConfig.device": config.device,
        "AttackConfig.num_reference": attacks.num_reference,
        "AttackConfig.shadow_model": attacks.shadow_model.value,
    }
    assert code == catalogue.DEFAULTS


def test_parsed_defaults_match_an_explicit_default_run(tmp_path: Path) -> None:
    """No flags and every flag at the help's stated default give the same RunConfig."""
    from alm_opacus.run.cli import parse_config

    base = ["--out", str(tmp_path / "a"), "--cache-dir", str(tmp_path / "c")]
    plain = parse_config(base)
    d = catalogue.DEFAULTS
    explicit = parse_config(
        [
            *base,
            "--noise-draws",
            str(d["RunConfig.noise_draws"]),
            "--seeds",
            "0",
            "--split-seed",
            "0",
            "--device",
            "cpu",
            "--methods",
            "none",
            "--attacks",
            "all",
        ]
    )
    assert dataclasses.asdict(plain) == dataclasses.asdict(explicit)


def test_help_states_no_default_twice() -> None:
    from alm_opacus.run.cli import build_parser

    text = build_parser().format_help()
    assert "(default: None)" not in text
    for action in build_parser()._actions:
        assert (action.help or "").count("default") <= 1, action.option_strings


def test_the_verdict_is_printed_under_the_table(tmp_path: Path, monkeypatch, capsys) -> None:  # type: ignore[no-untyped-def]
    """``_run`` prints the table, then the verdict wrapped at 100 columns, then the paths
    (the harness is replaced by the rows of a finished run)."""
    import math
    import types

    import alm_opacus.run.harness as harness
    from alm_opacus.report.results import ResultRow
    from alm_opacus.run.cli import main

    def row(method: str, epsilon: float, kind: str, acc: float, auc: float) -> ResultRow:
        return ResultRow(
            dataset="digits",
            method=method,
            epsilon=epsilon,
            delta=0.0,
            guarantee=kind,
            sensitivity=1.0,
            noise_scale=1.0,
            seed=0,
            test_accuracy=acc,
            utility_loss=0.0,
            attack="loss",
            mia_auc=auc,
            mia_auc_ci_low=auc - 0.05,
            mia_auc_ci_high=auc + 0.05,
            neighbouring="replace-one",
        )

    rows = [
        row("none", math.inf, "none", 0.92, 0.70),
        row("laplace", 1.0, "pure-dp", 0.23, 0.54),
        row("laplace", 100.0, "pure-dp", 0.90, 0.66),
    ]
    result = types.SimpleNamespace(rows=rows, out=tmp_path, seconds=1.0, num_classes=10)
    monkeypatch.setattr(harness, "run", lambda *args, **kwargs: result)
    assert main(["--methods", "laplace", "--out", str(tmp_path / "run"), "--no-progress"]) == 0
    printed = capsys.readouterr().out
    table, rest = printed.split("\nVerdict: ", 1)
    assert "► laplace" in table  # the row the verdict cites is marked
    verdict = "Verdict: " + rest.split("\n\n", 1)[0]
    assert verdict.startswith("Verdict: At a meaningful guarantee (ε′ ≤ 10, δ′ ≤ 1/150) no")
    assert max(len(line) for line in verdict.splitlines()) <= 100
    assert rest.split("\n\n", 1)[1].startswith("results: ")


def _features_file(path: Path) -> Path:
    import numpy as np

    rng = np.random.default_rng(0)
    y = np.arange(60) % 3
    x = rng.standard_normal((60, 6)) + 2 * np.eye(3, 6)[y]
    np.savez(path, x=x.astype(np.float32), y=y)
    return path


@pytest.mark.parametrize("epsilons", ["1e-300", "1,1e-14"])
def test_an_epsilon_too_small_to_draw_exits_2_before_writing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], epsilons: str
) -> None:
    from alm_opacus.mechanisms.grid import smallest_epsilon
    from alm_opacus.run.cli import main

    data = _features_file(tmp_path / "f.npz")
    out = tmp_path / "run"
    argv = ["--dataset", f"features:{data}", "--methods", "laplace,gaussian-classic"]
    argv += ["--epsilons", epsilons, "--out", str(out), "--no-progress"]
    code = main([*argv, "--cache-dir", str(tmp_path / "cache")])
    assert code == 2
    err = capsys.readouterr().err.strip()
    # a linear head on 6-d features, 3 classes: 21 parameters; 12 members, delta = 1e-5
    floor = smallest_epsilon(dim=21, delta=1e-5)
    assert len(err.splitlines()) == 1 and "Traceback" not in err
    assert f"epsilon={float(epsilons.split(',')[-1])!r} is below {floor:.3g}" in err
    assert "21 parameters" in err and f"expected epsilons in [{floor:.3g}, 1e+86]" in err
    assert not out.exists()


def test_an_epsilon_too_large_to_calibrate_exits_2_before_writing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from alm_opacus.mechanisms.analysis import LARGEST_EPSILON, analytic_gaussian_scale
    from alm_opacus.run.cli import main

    for delta in (1e-300, 1e-5, 0.99):  # the cap calibrates at every delta ...
        assert analytic_gaussian_scale(epsilon=LARGEST_EPSILON, delta=delta, sensitivity=1) > 0
    with pytest.raises(ValueError, match="no Gaussian scale"):  # ... and 1e88 does not
        analytic_gaussian_scale(epsilon=1e88, delta=0.5, sensitivity=1.0)
    data = _features_file(tmp_path / "f.npz")
    out = tmp_path / "run"
    with pytest.raises(SystemExit) as info:
        main(["--dataset", f"features:{data}", "--epsilons", "1,1e300", "--out", str(out)])
    assert info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err
    assert "epsilon=1e+300 is too large: expected epsilons in (0, 1e+86]" in err
    assert not out.exists()


def test_features_too_wide_for_the_newton_basis_exit_2_before_writing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import numpy as np

    from alm_opacus.run import harness, limits
    from alm_opacus.run.cli import main, parse_command
    from alm_opacus.sensitivity.convex import basis_peak_bytes

    # 400 x 30,000 (the honest file of issue 36) needs about 34 GiB: five (d+1)^2 float64
    assert basis_peak_bytes(30_000) == 5 * 8 * 30_001**2
    monkeypatch.setattr(limits, "_machine_memory", lambda device: 10 * 2**20)  # 10 MiB
    rng = np.random.default_rng(0)
    y = np.arange(60) % 3
    np.savez(tmp_path / "wide.npz", x=rng.standard_normal((60, 600)).astype(np.float32), y=y)
    out = tmp_path / "run"
    argv = ["--dataset", f"features:{tmp_path / 'wide.npz'}", "--methods", "laplace"]
    argv += ["--epsilons", "1", "--out", str(out), "--no-progress"]
    argv += ["--cache-dir", str(tmp_path / "cache")]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    need = 40 * 601**2 / 2**20
    assert len(err.splitlines()) == 1 and "Traceback" not in err
    assert "features of 600 dimensions need a dense (601)^2 eigendecomposition" in err
    assert f"about {need:.0f} MiB at its peak, more than the 10 MiB of memory on cpu" in err
    assert not out.exists()
    # Adam needs no basis: the same file passes every check before the run
    harness.plan_run(parse_command([*argv, "--l2", "0", "--sensitivity", "sampled"]).config)
