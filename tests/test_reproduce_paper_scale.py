"""``scripts/reproduce.py --paper-scale`` (scripts/reproduce_paper_scale.py): the command of each
setting, runs that are not redone and resume, the verdicts and their measured remedies on
constructed results, and bad arguments refused before anything is written."""

from __future__ import annotations

import importlib
import importlib.util
import json
import math
import sys
from pathlib import Path
from types import ModuleType

import pytest

from alm_opacus.report.results import ResultRow, write_results

ROOT = Path(__file__).resolve().parents[1]
#: Members and non-members of the constructed runs: narrow intervals (about +-0.01).
N = 10_000


@pytest.fixture(scope="module")
def reproduce() -> ModuleType:
    spec = importlib.util.spec_from_file_location("reproduce", ROOT / "scripts" / "reproduce.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["reproduce"] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def claims(reproduce: ModuleType) -> ModuleType:
    """The claims and run types (scripts/reproduce_claims.py), as reproduce.py imports them."""
    return sys.modules["reproduce_claims"]


@pytest.fixture(scope="module")
def paper(reproduce: ModuleType) -> ModuleType:
    sys.modules.pop("reproduce_paper_scale", None)  # bound to this test's reproduce module
    return importlib.import_module("reproduce_paper_scale")


def _flags(command: list[str]) -> dict[str, str]:
    """compare.py's ``--flag value`` pairs (a flag without a value maps to "")."""
    out, words = {}, command[2:]
    for i, word in enumerate(words):
        if word.startswith("--"):
            nxt = words[i + 1] if i + 1 < len(words) else ""
            out[word] = "" if nxt.startswith("--") else nxt
    return out


def test_each_setting_runs_its_own_sensitivity_head_and_pairs(
    paper: ModuleType, tmp_path: Path
) -> None:
    features = tmp_path / "data" / "f.npz"
    jobs = paper.commands(
        features, tmp_path, seed=3, epsilons=(0.1, 30.0), m=500, extra=["--attacks", "loss"]
    )
    expected = {  # name: (--sensitivity, --head, --m)
        "sampled": ("sampled", None, "500"),
        "analytic": ("analytic", None, None),
        "stability": ("stability", None, None),
        "sampled-members": ("sampled-members", None, "500"),
        "paper-sampled-members": ("sampled-members", "paper", "500"),
        "paper-sampled": ("sampled", "paper", "500"),
    }
    assert list(jobs) == list(expected)
    for name, command in jobs.items():
        flags = _flags(command)
        assert command[1].endswith("compare.py")
        assert (flags["--sensitivity"], flags.get("--head"), flags.get("--m")) == expected[name]
        assert flags["--dataset"] == f"features:{features}"
        assert flags["--methods"] == "alm,laplace,gaussian"
        assert flags["--epsilons"] == "0.1,30"
        assert flags["--split-seed"] == "3"
        assert flags["--out"] == str(tmp_path / name)
        assert flags["--attacks"] == "loss"
        assert "--reproducible-noise" in flags and "--resume" not in flags


_FAKE = (
    "import json, pathlib, sys; out = pathlib.Path(sys.argv[1]); out.mkdir(exist_ok=True); "
    "(out / 'argv.json').write_text(json.dumps(sys.argv[2:]))"
)


def test_a_finished_setting_is_not_run_again_and_an_interrupted_one_resumes(
    paper: ModuleType, tmp_path: Path
) -> None:
    for name in ("finished", "interrupted"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "results.csv").write_text("")
    (tmp_path / "finished" / "done").write_text("")
    jobs = {
        name: [sys.executable, "-c", _FAKE, str(tmp_path / name), "--x"]
        for name in ("finished", "interrupted", "new")
    }
    spent = paper.run_settings(jobs, tmp_path, workers=2)
    assert spent["finished"] == 0.0 and spent["interrupted"] > 0 and spent["new"] > 0
    assert not (tmp_path / "finished" / "argv.json").exists()  # not run again
    assert json.loads((tmp_path / "interrupted" / "argv.json").read_text()) == ["--x", "--resume"]
    assert json.loads((tmp_path / "new" / "argv.json").read_text()) == ["--x"]
    assert all((tmp_path / name / "done").exists() for name in jobs)
    again = paper.run_settings(jobs, tmp_path)  # all finished now: nothing runs
    assert again == dict.fromkeys(jobs, 0.0)


# --- constructed results ------------------------------------------------------------------------


def _rows(
    method: str,
    epsilon: float,
    *,
    loss: float,
    acc: float,
    auc: float,
    sensitivity: float = 10.0,
    std: float = math.nan,
) -> list[ResultRow]:
    norm = {"gaussian": "l2", "none": ""}.get(method, "l1")
    scale = sensitivity / epsilon if method != "none" else math.nan
    row = ResultRow(
        dataset="features:x.npz",
        method=method,
        epsilon=epsilon,
        delta=1e-5,
        guarantee="none" if method == "none" else "random-dp",
        sensitivity=sensitivity if method != "none" else math.nan,
        noise_scale=scale,
        seed=0,
        test_accuracy=0.9 * (1 - loss),
        utility_loss=loss,
        noise_draws=5,
        test_accuracy_std=0.001,
        noise_std=std if not math.isnan(std) else scale,
        sensitivity_norm=norm,
        sensitivity_source="" if method == "none" else "sampled",
        attack="loss",
        mia_accuracy=acc,
        mia_auc=auc,
        mia_auc_ci_low=auc - 0.01,
        mia_auc_ci_high=auc + 0.01,
    )
    return [row]


EPSILONS = (0.1, 1.0, 10.0, 100.0, 1000.0)


def _failing(folder: Path, *, gaussian_std: float = 0.25, laplace_at_10: float = 0.3) -> Path:
    """A run where every ALM claim fails: the MIA needs a 0.3 loss to reach chance, a 10%
    loss needs epsilon 100, the Gaussian (std ``gaussian_std`` times ALM's) loses half as much
    and has the lower AUC, and the unprotected head leaks at 0.58. Laplace loses as ALM, but
    ``laplace_at_10`` at epsilon 10."""
    loss = dict(zip(EPSILONS, (0.95, 0.6, 0.3, 0.05, 0.0), strict=True))
    mia = dict(zip(EPSILONS, (0.5, 0.5, 0.52, 0.58, 0.6), strict=True))
    rows = _rows("none", math.inf, loss=0.0, acc=0.58, auc=0.62)
    for e in EPSILONS:
        alm_std = 10.0 / e * math.pi / math.sqrt(3)
        rows += _rows("alm", e, loss=loss[e], acc=mia[e], auc=0.6, std=alm_std)
        other = laplace_at_10 if e == 10 else loss[e]
        rows += _rows("laplace", e, loss=other, acc=mia[e], auc=0.6)  # std: its scale
        gaussian = alm_std * gaussian_std
        rows += _rows(
            "gaussian", e, loss=loss[e] / 2, acc=0.5, auc=0.52, sensitivity=2.0, std=gaussian
        )
    return _write(folder, rows)


def _holding(folder: Path) -> Path:
    """A run where ALM keeps 2% loss at every epsilon and the MIA at chance."""
    rows = _rows("none", math.inf, loss=0.0, acc=0.65, auc=0.7)
    for e in EPSILONS:
        for method in ("alm", "laplace", "gaussian"):
            rows += _rows(method, e, loss=0.02, acc=0.5, auc=0.5)
    return _write(folder, rows)


def _write(folder: Path, rows: list[ResultRow]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    split = {"members": N, "nonmembers": N, "attacker": 2 * N, "public": N}
    config = {"dataset": "features:x.npz", "split_seed": 0, "split": split}
    (folder / "config.json").write_text(json.dumps(config))
    write_results(folder / "results.csv", rows)
    return folder


def _by_claim(verdicts: list) -> dict[str, object]:  # type: ignore[type-arg]
    names = {
        "an MIA on the unprotected": "unprotected",
        "ALM brings the MIA": "near_chance",
        "ALM reaches epsilon": "cheap",
        "utility loss: ALM": "figure1",
        "ALM has the best": "figure2",
    }
    out = {}
    for v in verdicts:
        key = next(k for prefix, k in names.items() if v.claim.claim.startswith(prefix))
        out[key] = v
    return out


def test_failing_claims_say_what_would_make_them_hold_measured(
    paper: ModuleType, reproduce: ModuleType, tmp_path: Path, claims: ModuleType
) -> None:
    runs = claims.Runs([claims.Run(_failing(tmp_path / "run"))])
    found = paper.verdicts({"sampled": runs})
    assert [v.setting for v in found] == ["sampled"] * 5  # the ALM claims only, no Lu
    v = _by_claim(found)
    assert {k: x.claim.verdict for k, x in v.items()} == dict.fromkeys(v, claims.FAILS)
    # near chance only at epsilon <= 10, where the loss is 0.3
    assert (
        "reaches 0.55 only at ε ≤ 10, where the utility loss is 0.300 [" in v["near_chance"].remedy
    )
    # a 10% loss first at epsilon 100; at 0.1 the same noise needs 10 * 0.1 / 100 = 0.01
    assert v["cheap"].remedy.startswith("the utility-loss interval first reaches 0.10 at ε = 100 ")
    assert "at ε = 0.1 needs an L1 sensitivity ≤ 0.01 (1,000 times below this head's 10;" in (
        v["cheap"].remedy
    )
    # the Gaussian loses less wherever ALM is above chance; its std is a quarter of ALM's
    assert v["figure1"].remedy == (
        "at ε = 1, 10, 100, 1000 ALM's noise std is 4 times the Gaussian's: the Gaussian would "
        "add as much only with an L2 sensitivity that many times its 2"
    )
    assert v["figure2"].remedy.startswith("ALM's AUC interval reaching down to 0.530 (it reaches")
    assert "leaks less" in v["unprotected"].remedy and "0.580" in v["unprotected"].remedy


def test_figure1_remedies_name_the_noise_each_mechanism_adds(
    paper: ModuleType, reproduce: ModuleType, tmp_path: Path, claims: ModuleType
) -> None:
    folder = _failing(tmp_path / "run", gaussian_std=2.0, laplace_at_10=0.5)
    runs = claims.Runs([claims.Run(folder)])
    remedy = _by_claim(paper.verdicts({"sampled": runs}))["figure1"].remedy
    # ALM's logistic noise has std pi/sqrt(3) = 1.81 times its scale, Laplace's here 1 times
    assert remedy.startswith("ALM's noise std is 1.81 times Laplace's where they differ (ε = 10)")
    assert "at ε = 1, 10, 100, 1000 the Gaussian's noise std is already at least ALM's" in remedy
    assert "would add as much" not in remedy


def test_holding_claims_have_no_remedy(
    paper: ModuleType, reproduce: ModuleType, tmp_path: Path, claims: ModuleType
) -> None:
    runs = claims.Runs([claims.Run(_holding(tmp_path / "run"))])
    v = _by_claim(paper.verdicts({"analytic": runs}))
    for key in ("unprotected", "near_chance", "cheap"):
        assert (v[key].claim.verdict, v[key].remedy) == (claims.HOLDS, "")


def test_the_sensitivity_table_stands_beside_the_papers(
    paper: ModuleType, reproduce: ModuleType, tmp_path: Path, claims: ModuleType
) -> None:
    run = claims.Run(_failing(tmp_path / "run"))
    assert paper.sensitivities(run) == paper.Sensitivities(
        l1=10.0, l2=2.0, guarantee="random-dp", source="sampled"
    )
    found = {"sampled": claims.Runs([run])}
    text = paper.render(
        members=N,
        seed=0,
        epsilons=EPSILONS,
        m=500,
        found=found,
        found_verdicts=paper.verdicts(found),
        seconds={"sampled": 61.0, "features": 2.0},
        machine="test machine",
        features=512,
        classes=10,
    )
    # 10 / 0.017492 = 571.7 and 2 / 0.013842 = 144.5
    assert "| `sampled` | default (512-d) | sampled | random-dp | 10 | 2 | 572 | 144 |" in text
    assert "| ALM paper, Table 1 | Keras `Dense(10)`, 128-d |" in text
    assert "| 0.017492 | 0.013842 | 1 | 1 |" in text
    assert "(P = 1,290 weights and biases); ours 512-d (P = 5,130, 3.98 times as many)" in text
    assert (
        "- `sampled` (default head; pairs drawn from the public split): 1 min 01 s" in text
        and "- total: 1 min 03 s" in text
    )
    assert text.count("**fails**") == 5


def test_main_runs_every_setting_and_records_times_and_verdicts(
    paper: ModuleType,
    reproduce: ModuleType,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    claims: ModuleType,
) -> None:
    calls: list[str] = []

    def fake_run(command: list[str], out: Path) -> float:
        calls.append(out.name)
        assert _flags(command)["--out"] == str(out)
        _failing(out)
        return 2.5

    monkeypatch.setattr(claims, "_run_one", fake_run)
    out = tmp_path / "paper"
    assert reproduce.main(["--paper-scale", "--paper-members", "100", "--out", str(out)]) == 0
    assert calls == [s.name for s in paper.SETTINGS]
    record = json.loads((out / "paper_scale.json").read_text())
    assert {k: v for k, v in record["seconds"].items() if k != "features"} == dict.fromkeys(
        calls, 2.5
    )
    assert record["members"] == 100 and len(record["verdicts"]) == 5 * len(calls)
    flags = _flags(record["commands"]["paper-sampled-members"])
    assert (flags["--head"], flags["--m"], flags["--epsilons"]) == (
        "paper",
        "500",
        ",".join(f"{e:g}" for e in paper.DEFAULT_EPSILONS),
    )
    assert (out / "data" / "mixture-n100-d512.npz").exists()
    # reusing the folder with other arguments would mix their runs: refused, nothing run
    calls.clear()
    again = ["--paper-scale", "--paper-members", "100", "--paper-m", "50", "--reuse", str(out)]
    assert reproduce.main(again) == 2
    assert calls == [] and json.loads((out / "paper_scale.json").read_text()) == record


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--paper-members", "300"], "--paper-members is a --paper-scale flag"),
        (
            ["--paper-scale", "--paper-members", "50"],
            "--paper-members='50': expected an integer >= 100",
        ),
        (
            ["--paper-scale", "--paper-members", "many"],
            "--paper-members='many': expected an integer",
        ),
        (["--paper-scale", "--paper-m", "0"], "--paper-m='0': expected an integer >= 1"),
        (["--paper-scale", "--datasets", "digits"], "--datasets='digits' with --paper-scale"),
        (["--paper-scale", "--methods", "alm"], "--methods='alm' with --paper-scale"),
        (["--paper-scale", "--split-seeds", "0,1"], "expected one split seed"),
        (["--paper-scale", "--paper-epsilons", "1,0.1"], "expected increasing positive numbers"),
        (["--paper-scale", "--paper-epsilons", "0,1"], "expected increasing positive numbers"),
        (
            ["--paper-scale", "--compare-args", "--sensitivity analytic"],
            "--compare-args sets --sensitivity, which --paper-scale sets per setting",
        ),
        (
            ["--paper-scale", "--paper-members", "300", "--update-docs"],
            "--update-docs with --paper-members=300",
        ),
    ],
)
def test_bad_arguments_exit_2_with_one_line_and_write_nothing(
    reproduce: ModuleType,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    argv: list[str],
    message: str,
) -> None:
    out = tmp_path / "never"
    with pytest.raises(SystemExit) as raised:
        reproduce.main([*argv, "--out", str(out)])
    assert raised.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "error: " in err and message in err
    assert not out.exists()


def test_defaults_are_the_papers_scale(
    paper: ModuleType, reproduce: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen = {}

    def fake_main(args: object, *, folder: Path) -> int:
        seen.update(vars(args), folder=folder)
        return 0

    monkeypatch.setattr(paper, "main", fake_main)
    assert reproduce.main(["--paper-scale", "--out", str(tmp_path / "p")]) == 0
    assert (seen["paper_members"], seen["paper_m"], seen["paper_seed"]) == (10_000, 500, 0)
    assert seen["paper_epsilons"] == paper.DEFAULT_EPSILONS
    assert seen["folder"] == tmp_path / "p"


def test_update_docs_rewrites_the_results_block_and_keeps_the_paper_scale_section(
    reproduce: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, claims: ModuleType
) -> None:
    doc = tmp_path / "results.md"
    doc.write_text(
        "<!-- generated results by scripts/reproduce.py; deps ; inputs 00; output 00 -->\n"
        "old\n<!-- end generated results -->\n\n## kept prose\n\n"
        "<!-- generated results-paper-scale -->\n<!-- end generated results-paper-scale -->\n"
    )
    monkeypatch.setattr(claims, "DOC", doc)
    monkeypatch.setattr(claims, "_run_one", lambda command, out: _holding(out) and 1.0)
    argv = ["--datasets", "digits", "--split-seeds", "0", "--update-docs"]
    assert reproduce.main([*argv, "--out", str(tmp_path / "runs")]) == 0
    text = doc.read_text()
    assert "\nold\n" not in text and "# The papers' claims, checked" in text
    assert "## kept prose" in text and "<!-- generated results-paper-scale -->" in text
