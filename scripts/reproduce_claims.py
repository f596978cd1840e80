"""The claims that ``scripts/reproduce.py`` checks, and what checking them needs: the runs'
results with intervals over split seeds, one function per claim of the ALM paper (Yang, Gohari
& Topcu) and of Lu et al. (2022), the page they render to, and the command of each run.

Split from ``reproduce.py`` (its command line) so that ``reproduce_paper_scale.py`` can use
them without importing the command line that imports it.
"""

from __future__ import annotations

import json
import math
import os
import platform
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from scipy import stats

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from alm_opacus.report.results import ResultRow, read_results  # noqa: E402

POST = ("alm", "laplace", "gaussian")
HOLDS, FAILS, UNTESTABLE = "holds", "fails", "not testable here"
DOC = ROOT / "docs" / "results.md"
#: What the page's numbers depend on besides this script (scripts/docblocks.py).
DEPS = (
    "alm_opacus",
    "baselines",
    "scripts/compare.py",
    "scripts/reproduce_claims.py",
    "constraints.txt",
)
LEVEL = 0.95
#: Utility loss this close to 1 means accuracy at chance for every method: no difference shows.
AT_CHANCE_LOSS = 0.9


@dataclass(frozen=True)
class Interval:
    """A mean over split seeds with its 95% interval (see :func:`combine`)."""

    mean: float
    low: float
    high: float

    def __str__(self) -> str:
        if math.isnan(self.mean):
            return "—"
        return f"{self.mean:.3f} [{self.low:.3f}, {self.high:.3f}]"


def combine(values: Sequence[float], halfwidths: Sequence[float]) -> Interval:
    """One interval from ``S`` split seeds' estimates and their own 95% half-widths.

    The half-width is the larger of (a) the within-run intervals of the mean, ``sqrt(mean
    hw^2 / S)``, and (b) the between-seed t-interval ``t_{0.975, S-1} s / sqrt(S)`` (``s``:
    the sample standard deviation over seeds, which holds within-run noise and the split's
    own variation). With one seed only (a) applies.
    """
    v = np.asarray([x for x in values if not math.isnan(x)], dtype=float)
    if not len(v):
        return Interval(math.nan, math.nan, math.nan)
    h = np.asarray([x for x, y in zip(halfwidths, values, strict=True) if not math.isnan(y)])
    within = math.sqrt(float(np.mean(np.nan_to_num(h) ** 2)) / len(v))
    between = 0.0
    if len(v) > 1:
        t = float(stats.t.ppf(0.5 + LEVEL / 2, df=len(v) - 1))
        between = t * float(np.std(v, ddof=1)) / math.sqrt(len(v))
    half = max(within, between)
    mean = float(v.mean())
    return Interval(mean, mean - half, mean + half)


def _z() -> float:
    return float(stats.norm.ppf(0.5 + LEVEL / 2))


def proportion_halfwidth(p: float, n: int) -> float:
    """Half the Clopper–Pearson 95% interval of a proportion measured on ``n`` examples."""
    k = round(p * n)
    low = 0.0 if k == 0 else float(stats.beta.ppf(0.025, k, n - k + 1))
    high = 1.0 if k == n else float(stats.beta.ppf(0.975, k + 1, n - k))
    return (high - low) / 2


@dataclass(frozen=True)
class Estimate:
    """One run's value of a metric, its 95% half-width, and the attack it came from."""

    value: float
    halfwidth: float
    attack: str = ""


class Run:
    """One dataset and split seed: its results and split sizes."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        config = json.loads((folder / "config.json").read_text())
        self.dataset = str(config["dataset"])
        self.split_seed = int(config["split_seed"])
        split = config["split"]
        self.members = int(split["members"])
        self.nonmembers = int(split["nonmembers"] or split["members"])
        self.rows = [r for r in read_results(folder / "results.csv") if r.status == "ok"]

    def cell(self, method: str, epsilon: float) -> list[ResultRow]:
        return [r for r in self.rows if r.method == method and r.epsilon == epsilon]

    def epsilons(self, method: str) -> list[float]:
        return sorted({r.epsilon for r in self.rows if r.method == method})

    def estimate(self, method: str, epsilon: float, metric: str) -> Estimate:
        """``metric`` of a cell: utility_loss, or the strongest attack's mia_auc or
        mia_accuracy (every attacker, ``-clean`` included), with its half-width."""
        cell = self.cell(method, epsilon)
        if not cell:
            return Estimate(math.nan, math.nan)
        if metric == "utility_loss":
            row = cell[0]
            reference = row.test_accuracy / (1 - row.utility_loss) if row.utility_loss < 1 else 1
            draws = max(row.noise_draws, 1)
            spread = 0.0 if math.isnan(row.test_accuracy_std) else row.test_accuracy_std
            sampling = row.test_accuracy * (1 - row.test_accuracy) / self.nonmembers
            se = math.sqrt(spread**2 / draws + sampling) / max(reference, 1e-12)
            return Estimate(row.utility_loss, _z() * se)
        best = max(cell, key=lambda r: _num(getattr(r, metric)))
        value = getattr(best, metric)
        if metric == "mia_auc":
            half = (best.mia_auc_ci_high - best.mia_auc_ci_low) / 2
        else:
            half = proportion_halfwidth(value, self.members + self.nonmembers)
        return Estimate(value, half, best.attack)


class Runs:
    """One dataset over its split seeds."""

    def __init__(self, runs: Sequence[Run]) -> None:
        self.runs = sorted(runs, key=lambda r: r.split_seed)
        self.dataset = self.runs[0].dataset

    @property
    def seeds(self) -> list[int]:
        return [r.split_seed for r in self.runs]

    def epsilons(self, method: str) -> list[float]:
        """The epsilons every split seed finished for ``method``."""
        found = [set(r.epsilons(method)) for r in self.runs]
        return sorted(set.intersection(*found)) if found else []

    def interval(self, method: str, epsilon: float, metric: str) -> Interval:
        found = [r.estimate(method, epsilon, metric) for r in self.runs]
        return combine([e.value for e in found], [e.halfwidth for e in found])

    def difference(self, a: str, b: str, epsilon: float, metric: str) -> Interval:
        """``metric(a) - metric(b)`` per split seed (independent noise: half-widths add in
        quadrature), combined over seeds."""
        pairs = [
            (r.estimate(a, epsilon, metric), r.estimate(b, epsilon, metric)) for r in self.runs
        ]
        return combine(
            [x.value - y.value for x, y in pairs],
            [math.hypot(x.halfwidth, y.halfwidth) for x, y in pairs],
        )

    def attacks(self, method: str, epsilon: float, metric: str) -> str:
        names = sorted({r.estimate(method, epsilon, metric).attack for r in self.runs} - {""})
        return "/".join(names)


@dataclass(frozen=True)
class Claim:
    """One row of docs/results.md."""

    paper: str
    where: str
    claim: str
    verdict: str
    numbers: str
    why: str


def _num(value: float) -> float:
    return -math.inf if math.isnan(value) else value


def unprotected_vulnerable(runs: Runs) -> Claim:
    """ALM Sec. 1, 6.2: an MIA on the unprotected head reaches 61-71% accuracy.
    Test: the MIA accuracy interval meets [0.61, 0.71]."""
    acc = runs.interval("none", math.inf, "mia_accuracy")
    auc = runs.interval("none", math.inf, "mia_auc")
    if acc.high < 0.61:
        verdict, why = FAILS, "the interval lies below 0.61: the attack is weaker here"
    elif acc.low > 0.71:
        verdict, why = FAILS, "the interval lies above 0.71: the attack is stronger here"
    else:
        verdict, why = HOLDS, "the interval meets the paper's range"
    return Claim(
        "ALM",
        "Sec. 1 and 6.2",
        "an MIA on the unprotected fine-tuned head reaches 61-71% accuracy (CIFAR-10/100, STL-10)",
        verdict,
        f"MIA accuracy {acc} ({runs.attacks('none', math.inf, 'mia_accuracy')}); "
        f"AUC {auc} ({runs.attacks('none', math.inf, 'mia_auc')})",
        why,
    )


def protected_near_chance(runs: Runs) -> Claim:
    """ALM abstract: the MIA drops to ~50% accuracy with utility loss below 5%.
    Tests: the smallest epsilon whose utility-loss interval lies below 0.05; there, the MIA
    accuracy interval reaches down to 0.55 or below."""
    claim = "ALM brings the MIA to ~50% accuracy with utility loss below 5%"
    kept = [e for e in runs.epsilons("alm") if runs.interval("alm", e, "utility_loss").high < 0.05]
    if not kept:
        losses = "; ".join(
            f"ε={e:g}: {runs.interval('alm', e, 'utility_loss')}" for e in runs.epsilons("alm")
        )
        return Claim(
            "ALM",
            "Abstract; Sec. 6.2",
            claim,
            FAILS,
            f"utility loss {losses}",
            "no epsilon's utility-loss interval lies below 0.05",
        )
    epsilon = min(kept)
    acc = runs.interval("alm", epsilon, "mia_accuracy")
    near = acc.low <= 0.55
    return Claim(
        "ALM",
        "Abstract; Sec. 6.2",
        claim,
        HOLDS if near else FAILS,
        f"smallest ε with utility loss surely below 0.05: {epsilon:g} (utility loss "
        f"{runs.interval('alm', epsilon, 'utility_loss')}); there MIA accuracy {acc} "
        f"({runs.attacks('alm', epsilon, 'mia_accuracy')})",
        "the MIA accuracy interval reaches 0.55"
        if near
        else "the MIA accuracy interval lies above 0.55: clearly above chance",
    )


def strong_privacy_cheap(runs: Runs) -> Claim:
    """ALM Sec. 1: epsilon < 1 with utility loss below 10%.
    Test: some epsilon < 1 whose utility-loss interval reaches 0.10 or below."""
    claim = "ALM reaches epsilon < 1 with utility loss below 10%"
    small = [e for e in runs.epsilons("alm") if e < 1]
    if not small:
        return Claim(
            "ALM",
            "Sec. 1",
            claim,
            UNTESTABLE,
            "no grid epsilon below 1",
            "the grid has no epsilon below 1",
        )
    losses = {e: runs.interval("alm", e, "utility_loss") for e in small}
    ok = [e for e, i in losses.items() if i.low <= 0.10]
    numbers = "; ".join(f"ε={e:g}: utility loss {i}" for e, i in losses.items())
    return Claim(
        "ALM",
        "Sec. 1",
        claim,
        HOLDS if ok else FAILS,
        numbers,
        "a utility-loss interval reaches 0.10"
        if ok
        else "every utility-loss interval below ε = 1 lies above 0.10",
    )


def figure1(runs: Runs) -> Claim:
    """ALM Fig. 1: ALM's utility loss ~ Laplace's; the Gaussian's significantly higher.
    Tests: at every epsilon the (alm − laplace) interval contains 0; the (gaussian − alm)
    interval lies above 0 wherever ALM is not at chance (utility loss < 0.9)."""
    claim = "utility loss: ALM ~ Laplace at each epsilon; Gaussian significantly higher"
    shared = sorted(set.intersection(*(set(runs.epsilons(m)) for m in POST)))
    if not shared:
        return Claim(
            "ALM",
            "Fig. 1, Sec. 6.1",
            claim,
            UNTESTABLE,
            "no shared epsilons",
            "the three mechanisms share no epsilon",
        )
    al = {e: runs.difference("alm", "laplace", e, "utility_loss") for e in shared}
    ga = {e: runs.difference("gaussian", "alm", e, "utility_loss") for e in shared}
    live = [e for e in shared if runs.interval("alm", e, "utility_loss").mean < AT_CHANCE_LOSS]
    differ = [e for e in shared if not al[e].low <= 0 <= al[e].high]
    not_worse = [e for e in live if not ga[e].low > 0]
    numbers = "; ".join(f"ε={e:g}: alm−laplace {al[e]}, gaussian−alm {ga[e]}" for e in shared)
    parts = [
        "ALM and Laplace: every difference interval contains 0"
        if not differ
        else f"ALM and Laplace differ at ε = {', '.join(f'{e:g}' for e in differ)}",
        "the Gaussian loses more wherever ALM is above chance"
        if not not_worse
        else f"the Gaussian does not lose significantly more at ε = "
        f"{', '.join(f'{e:g}' for e in not_worse)} (it is calibrated to the L2 sensitivity, "
        "far smaller than the L1 one the others pay)",
    ]
    verdict = HOLDS if not differ and not not_worse else FAILS
    return Claim("ALM", "Fig. 1, Sec. 6.1", claim, verdict, numbers, "; ".join(parts))


def figure2_trade_off(runs: Runs) -> Claim:
    """ALM Fig. 2: ALM has the best MIA-vs-utility trade-off.
    Per mechanism, among epsilons whose utility-loss interval lies below 0.10, the one with the
    least AUC; test: no other mechanism's AUC interval lies entirely below ALM's."""
    claim = "ALM has the best protection-utility trade-off"
    best: dict[str, tuple[float, Interval]] = {}
    for method in POST:
        usable = [
            e for e in runs.epsilons(method) if runs.interval(method, e, "utility_loss").high < 0.10
        ]
        if usable:
            found = {e: runs.interval(method, e, "mia_auc") for e in usable}
            epsilon = min(found, key=lambda e: found[e].mean)
            best[method] = (epsilon, found[epsilon])
    numbers = "least AUC with utility loss surely below 0.1: " + (
        "; ".join(f"{m} {i} at ε={e:g}" for m, (e, i) in best.items()) or "none"
    )
    if "alm" not in best or len(best) < 2:
        return Claim(
            "ALM",
            "Fig. 2, Sec. 6.2",
            claim,
            UNTESTABLE,
            numbers,
            "fewer than two mechanisms keep utility loss surely below 0.1",
        )
    alm = best["alm"][1]
    better = [m for m, (_, i) in best.items() if m != "alm" and i.high < alm.low]
    return Claim(
        "ALM",
        "Fig. 2, Sec. 6.2",
        claim,
        FAILS if better else HOLDS,
        numbers,
        f"{', '.join(better)}: an AUC interval entirely below ALM's"
        if better
        else "no other mechanism's AUC interval lies entirely below ALM's",
    )


def lu_vs_dpsgd(runs: Runs) -> Claim:
    """Lu et al.: their framework beats DP-SGD. Not testable: lu proves no finite epsilon
    for C >= 3 classes, so equal nominal epsilons compare nothing."""
    shared = sorted(set(runs.epsilons("lu")) & set(runs.epsilons("dpsgd")))
    numbers = "; ".join(
        f"ε={e:g}: lu {runs.interval('lu', e, 'utility_loss')} vs dpsgd "
        f"{runs.interval('dpsgd', e, 'utility_loss')}"
        for e in shared
    )
    return Claim(
        "Lu et al.",
        "Abstract; Sec. 5.4",
        "their framework (one noisy logit per query) beats DP-SGD on the privacy-utility trade-off",
        UNTESTABLE,
        f"utility loss at equal nominal epsilon, one query: {numbers or 'no shared epsilons'}",
        "with C >= 3 classes no finite epsilon is proven for lu (its statement is 'none'), so "
        "its epsilons are not comparable with DP-SGD's proven ones",
    )


def lu_table6() -> Claim:
    from baselines.lu.paper import TABLE6, paper_chain

    mnist = TABLE6["MNIST"]
    chain = paper_chain(n=mnist.n, input_dim=mnist.input_dim, num_classes=mnist.num_classes)
    return Claim(
        "Lu et al.",
        "Eq. 21, Table 6 (MNIST)",
        "rho = 2.2274, Delta_omega = 0.0028, Delta_z_T = 0.3577",
        HOLDS,
        f"derived from Eq. 21 and the architecture: rho {chain.rho:.4f}, Delta_omega "
        f"{chain.delta_omega:.4f}, Delta_z_T {chain.delta_z:.4f}, Delta_p {chain.delta_p:.4f}",
        "the arithmetic reproduces, but Eq. 21 is not a Lipschitz bound (a gradient of norm "
        "10.73 exists on their domain: tests/baselines), so no guarantee rests on it",
    )


CLAIMS: tuple[Callable[[Runs], Claim], ...] = (
    unprotected_vulnerable,
    protected_near_chance,
    strong_privacy_cheap,
    figure1,
    figure2_trade_off,
    lu_vs_dpsgd,
)


def claims(datasets: Sequence[Runs]) -> list[tuple[str, Claim]]:
    """Every claim per dataset, then the arithmetic one."""
    out = [(runs.dataset, make(runs)) for runs in datasets for make in CLAIMS]
    return [*out, ("(arithmetic)", lu_table6())]


def _duration(seconds: float) -> str:
    minutes, secs = divmod(round(seconds), 60)
    return f"{minutes} min {secs:02d} s" if minutes else f"{secs} s"


def render(
    datasets: Sequence[Runs], found: Sequence[tuple[str, Claim]], timing: dict[str, object]
) -> str:
    """docs/results.md."""
    seconds: dict[str, float] = timing["seconds"]  # type: ignore[assignment]
    cost = [
        f"- `{runs.dataset}`, split seeds {', '.join(map(str, runs.seeds))}: "
        + ", ".join(_duration(seconds.get(r.folder.name, math.nan)) for r in runs.runs)
        for runs in datasets
    ]
    total = sum(v for v in seconds.values() if not math.isnan(v))
    lines = [
        "# The papers' claims, checked on this project's runs",
        "",
        "Generated by `python scripts/reproduce.py --update-docs` (do not edit by hand). It "
        "runs, per dataset D and split seed S,",
        "",
        "    python scripts/compare.py --dataset D --methods all --split-seed S "
        "--reproducible-noise --out runs/reproduce-<time>/D-split<S>",
        "",
        "and reads the `results.csv` files. Each number is the mean over the split seeds with a "
        "95% interval that holds the variation between split seeds: the larger of the "
        "within-run interval of the mean (DeLong for AUCs, Clopper–Pearson for attack "
        "accuracies on the balanced evaluation set, noise draws and test-set sampling for "
        "utility loss) and the t-interval over split seeds. Each verdict is decided by the "
        "interval tests named in its claim's function in `scripts/reproduce.py`, and the "
        "sentence on why names the test that decided it. The papers' own experiments use "
        "CIFAR-10/100 and STL-10 with 5,000-10,000 members; ours are the embedded datasets "
        "(docs/datasets.md), so a claim that fails here may hold at their scale: the "
        "section below checks the ALM claims at 10,000 members (docs/reproduce.md runs the "
        "papers' datasets on a GPU).",
        "",
        f"Measured cost of the runs behind this page ({timing['machine']}; the run is "
        "CPU-bound, so a shared or busier machine takes longer):",
        "",
        *cost,
        f"- total: {_duration(total)}",
        "",
        "| paper | where | claim | dataset | verdict | numbers | why |",
        "|---|---|---|---|---|---|---|",
        *[
            f"| {c.paper} | {c.where} | {c.claim} | {d} | **{c.verdict}** | {c.numbers} | {c.why} |"
            for d, c in found
        ],
    ]
    return "\n".join(lines) + "\n"


def _compare_command(
    dataset: str, seed: int, out: Path, *, methods: str, cache: Path, extra: Sequence[str]
) -> list[str]:
    return [
        sys.executable,
        str(ROOT / "scripts" / "compare.py"),
        "--dataset",
        dataset,
        "--methods",
        methods,
        "--split-seed",
        str(seed),
        "--reproducible-noise",
        "--out",
        str(out),
        "--cache-dir",
        str(cache),
        "--no-progress",
        *extra,
    ]


def _run_one(command: list[str], out: Path) -> float:
    """Run (or finish) one comparison; returns its wall time (0 when it was done)."""
    table = out / "results.csv"
    if (out / "done").exists():
        return 0.0
    start = time.perf_counter()
    resume = ["--resume"] if table.exists() else []
    with open(out.parent / f"{out.name}.log", "a") as log:
        subprocess.run([*command, *resume], check=True, stdout=log, stderr=subprocess.STDOUT)
    (out / "done").write_text("")
    return time.perf_counter() - start


def machine() -> str:
    return f"{platform.machine()}, {os.cpu_count()} CPU cores, Python {platform.python_version()}"
