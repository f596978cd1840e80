"""``scripts/reproduce.py --paper-scale``: the ALM paper's claims at the paper's own scale,
under every sensitivity the harness offers.

On a synthetic ``features:PATH`` file of ``--paper-members`` members (default 10,000, the
paper's |d|; ``scripts/bench_scale.py``'s Gaussian mixture, d = 512, 10 classes, with roles: n
members, n non-members, 2n attacker's pool, n public) it runs, once per setting of
:data:`SETTINGS`, each into its own sub-folder of the reproduce folder,

    python scripts/compare.py --dataset features:PATH --methods alm,laplace,gaussian \\
        --reproducible-noise --epsilons GRID --sensitivity S [--head paper] [--m M] ...

and gives, per setting, the verdict of each ALM claim that ``reproduce.py`` checks (its
``CLAIMS``, the same interval tests; one split seed, so every interval is the within-run one),
and where a claim fails, what would make it hold, measured from the same runs
(:data:`REMEDIES`). The sensitivities each setting calibrated its noise to stand beside the
paper's Table 1 (:data:`PAPER_TABLE1`).

A setting whose run finished (its ``done`` marker, written after compare.py exits) is not run
again; one interrupted continues with ``compare.py --resume``; each run's wall time is
recorded in ``paper_scale.json`` (the sum of its parts). ``--update-docs`` writes the
``results-paper-scale`` block of docs/results.md, at 10,000 members or more only.
"""

from __future__ import annotations

import argparse
import datetime
import itertools
import json
import math
import shlex
import sys
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

import reproduce_claims as rc
from reproduce_claims import FAILS, POST, ROOT, Claim, Interval, Run, Runs

__all__ = [
    "BLOCK",
    "PAPER_TABLE1",
    "SETTINGS",
    "PaperSensitivity",
    "Sensitivities",
    "Setting",
    "Verdict",
    "add_arguments",
    "check_arguments",
    "commands",
    "main",
    "render",
    "run_settings",
    "sensitivities",
    "verdicts",
]

BLOCK = "results-paper-scale"
RECORD = "paper_scale.json"
METHODS = ",".join(POST)
DEFAULT_MEMBERS = 10_000
#: Smaller runs check the plumbing only; the docs block needs the paper's scale.
MIN_MEMBERS, DOC_MEMBERS = 100, 10_000
#: Finer than the features grid so that the epsilon a claim needs is read off within ~3x.
DEFAULT_EPSILONS = (0.1, 0.3, 1.0, 3.0, 10.0, 30.0, 100.0, 300.0, 1000.0, 10000.0)
#: Neighbour pairs of every sampled setting: the paper's Table 1 (m = 500).
DEFAULT_M = 500
#: What the block's numbers depend on besides scripts/reproduce.py.
DEPS = (
    "alm_opacus",
    "scripts/reproduce_claims.py",
    "scripts/reproduce_paper_scale.py",
    "scripts/compare.py",
    "scripts/bench_scale.py",
    "constraints.txt",
)
#: compare.py flags each setting sets itself: --compare-args may not override them.
OWN_FLAGS = (
    "--dataset",
    "--methods",
    "--epsilons",
    "--sensitivity",
    "--head",
    "--m",
    "--split-seed",
    "--out",
    "--resume",
    "--overwrite",
)


@dataclass(frozen=True)
class PaperSensitivity:
    """The ALM paper's Table 1 row we compare with (Yang, Gohari & Topcu, CIFAR-10).

    Attributes:
        members: |d|, the members Algorithm 2 ran on.
        m: its neighbour pairs.
        l1: the L1 sensitivity it reports.
        l2: the L2 sensitivity it reports.
        features: the width of the features its ``Dense(10)`` head reads (Keras's SimCLR
            example, which the paper follows).
        classes: the head's outputs.
    """

    members: int
    m: int
    l1: float
    l2: float
    features: int
    classes: int

    @property
    def parameters(self) -> int:
        """P: the head's kernel and bias."""
        return (self.features + 1) * self.classes


PAPER_TABLE1 = PaperSensitivity(
    members=10_000, m=500, l1=0.017492, l2=0.013842, features=128, classes=10
)


@dataclass(frozen=True)
class Setting:
    """One paper-scale run: a ``--sensitivity`` and the head recipe it applies to.

    Attributes:
        name: its sub-folder and its name in the tables.
        sensitivity: compare.py's ``--sensitivity``.
        head: compare.py's ``--head`` (``None``: the features default recipe).
        what: one line for the docs.
    """

    name: str
    sensitivity: str
    head: str | None
    what: str

    @property
    def sampled(self) -> bool:
        """Whether its sensitivity is sampled (it then takes ``--m``)."""
        return self.sensitivity.startswith("sampled")

    def flags(self, *, m: int) -> list[str]:
        """Its own compare.py flags."""
        head = ["--head", self.head] if self.head else []
        pairs = ["--m", str(m)] if self.sampled else []
        return ["--sensitivity", self.sensitivity, *head, *pairs]


SETTINGS: tuple[Setting, ...] = (
    Setting("sampled", "sampled", None, "default head; pairs drawn from the public split"),
    Setting("analytic", "analytic", None, "the convex head and its proven bound"),
    Setting("stability", "stability", None, "full-batch gradient descent and its proven bound"),
    Setting("sampled-members", "sampled-members", None, "default head; Algorithm 2 on members"),
    Setting(
        "paper-sampled-members",
        "sampled-members",
        "paper",
        "the paper's recipe and its Algorithm 2 as written",
    ),
    Setting("paper-sampled", "sampled", "paper", "the paper's recipe; pairs from the public split"),
)


# --- arguments -----------------------------------------------------------------------------------


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """reproduce.py's ``--paper-scale`` flags."""
    group = parser.add_argument_group("paper scale (scripts/reproduce_paper_scale.py)")
    group.add_argument(
        "--paper-scale",
        action="store_true",
        help="check the ALM claims on a features file of --paper-members members, once per "
        f"sensitivity setting ({', '.join(s.name for s in SETTINGS)}), instead of --datasets",
    )
    group.add_argument(
        "--paper-members",
        default=None,
        help=f"members of the synthetic features file (default {DEFAULT_MEMBERS:,}; at least "
        f"{MIN_MEMBERS}; --update-docs needs {DOC_MEMBERS:,} or more)",
    )
    group.add_argument(
        "--paper-epsilons",
        default=None,
        help=f"the epsilon grid (default {','.join(f'{e:g}' for e in DEFAULT_EPSILONS)})",
    )
    group.add_argument(
        "--paper-m",
        default=None,
        help=f"neighbour pairs of the sampled settings (default {DEFAULT_M}, the paper's Table 1)",
    )


def _int_at_least(parser: argparse.ArgumentParser, flag: str, text: str, low: int) -> int:
    try:
        value = int(text)
    except ValueError:
        value = low - 1
    if value < low:
        parser.error(f"{flag}={text!r}: expected an integer >= {low}")
    return value


def _grid(parser: argparse.ArgumentParser, text: str) -> tuple[float, ...]:
    try:
        values = tuple(float(p) for p in text.split(",") if p.strip())
    except ValueError:
        values = ()
    ok = bool(values) and all(v > 0 and math.isfinite(v) for v in values)
    if not ok or any(b <= a for a, b in itertools.pairwise(values)):
        parser.error(
            f"--paper-epsilons={text!r}: expected increasing positive numbers, e.g. 0.1,1,10"
        )
    return values


def check_arguments(args: argparse.Namespace, parser: argparse.ArgumentParser) -> None:
    """Check the paper-scale flags (``parser.error``: exit 2, one line) and resolve them in
    ``args``: ``paper_members``, ``paper_epsilons``, ``paper_m`` and ``paper_seed``."""
    given = [
        f
        for f, v in (
            ("--paper-members", args.paper_members),
            ("--paper-epsilons", args.paper_epsilons),
            ("--paper-m", args.paper_m),
        )
        if v is not None
    ]
    if not args.paper_scale:
        if given:
            parser.error(f"{given[0]} is a --paper-scale flag: add --paper-scale or drop it")
        return
    for flag, value in (("--datasets", args.datasets), ("--methods", args.methods)):
        if value is not None:
            parser.error(
                f"{flag}={value!r} with --paper-scale: it runs its own features file and "
                f"--methods {METHODS}; drop {flag}"
            )
    seeds = [s.strip() for s in (args.split_seeds or "0").split(",") if s.strip()]
    if len(seeds) != 1:
        parser.error(
            f"--split-seeds={args.split_seeds!r} with --paper-scale: expected one split seed"
        )
    args.paper_seed = _int_at_least(parser, "--split-seeds", seeds[0], 0)
    args.paper_members = _int_at_least(
        parser, "--paper-members", args.paper_members or str(DEFAULT_MEMBERS), MIN_MEMBERS
    )
    args.paper_m = _int_at_least(parser, "--paper-m", args.paper_m or str(DEFAULT_M), 1)
    args.paper_epsilons = (
        _grid(parser, args.paper_epsilons) if args.paper_epsilons else DEFAULT_EPSILONS
    )
    for word in shlex.split(args.compare_args):
        if word.split("=")[0] in OWN_FLAGS:
            parser.error(
                f"--compare-args sets {word.split('=')[0]}, which --paper-scale sets per "
                f"setting: expected other compare.py flags (its own: {', '.join(OWN_FLAGS)})"
            )
    if args.update_docs and args.paper_members < DOC_MEMBERS:
        parser.error(
            f"--update-docs with --paper-members={args.paper_members}: the docs block is the "
            f"paper's scale, expected {DOC_MEMBERS} or more (run without --update-docs)"
        )


# --- runs ----------------------------------------------------------------------------------------


def commands(
    features: Path,
    folder: Path,
    *,
    seed: int,
    epsilons: Sequence[float],
    m: int,
    extra: Sequence[str] = (),
) -> dict[str, list[str]]:
    """Each setting's compare.py command, by setting name, into ``folder / name``."""
    grid = ["--epsilons", ",".join(f"{e:g}" for e in epsilons)]
    return {
        s.name: rc._compare_command(
            f"features:{features}",
            seed,
            folder / s.name,
            methods=METHODS,
            cache=folder / "cache",
            extra=[*grid, *s.flags(m=m), *extra],
        )
        for s in SETTINGS
    }


def run_settings(
    jobs: dict[str, list[str]],
    folder: Path,
    *,
    workers: int = 1,
    run_one: Callable[[list[str], Path], float] | None = None,
) -> dict[str, float]:
    """Run (or finish) each setting's command into ``folder / name``; a finished one (its
    ``done`` marker) is skipped, an interrupted one resumes (``reproduce_claims._run_one``).

    Returns:
        the seconds each setting spent in this call (0 for one already done).
    """
    runner = run_one or rc._run_one
    with ThreadPoolExecutor(max_workers=max(workers, 1)) as pool:
        futures = {name: pool.submit(runner, cmd, folder / name) for name, cmd in jobs.items()}
        return {name: future.result() for name, future in futures.items()}


# --- what the runs say ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Sensitivities:
    """The sensitivities one setting's noise was calibrated to, read from ``results.csv``.

    Attributes:
        l1: ALM's and Laplace's (L1; NaN if they differ or are missing).
        l2: the Gaussian's (L2).
        guarantee: the statements' kind(s).
        source: where the sensitivity came from (statement.SensitivitySource).
    """

    l1: float
    l2: float
    guarantee: str
    source: str


def _one(values: set[float]) -> float:
    return values.pop() if len(values) == 1 else math.nan


def sensitivities(run: Run) -> Sensitivities:
    """The sensitivity of each norm in ``run``'s post-training rows (one per norm: every
    epsilon of a setting shares the head and its sensitivity)."""
    post = [r for r in run.rows if r.method in POST]
    l1 = {r.sensitivity for r in post if r.sensitivity_norm == "l1"}
    l2 = {r.sensitivity for r in post if r.sensitivity_norm == "l2"}
    return Sensitivities(
        l1=_one(l1),
        l2=_one(l2),
        guarantee="/".join(sorted({r.guarantee for r in post})),
        source="/".join(sorted({r.sensitivity_source for r in post} - {""})),
    )


def _mean(runs: Runs, method: str, epsilon: float, column: str) -> float:
    values = [getattr(r, column) for run in runs.runs for r in run.cell(method, epsilon)[:1]]
    return sum(values) / len(values) if values else math.nan


def _loss(runs: Runs, method: str, epsilon: float) -> Interval:
    return runs.interval(method, epsilon, "utility_loss")


def _least_loss(runs: Runs) -> str:
    found = {e: _loss(runs, "alm", e) for e in runs.epsilons("alm")}
    if not found:
        return "ALM finished no epsilon"
    best = min(found, key=lambda e: found[e].mean)
    return f"the least is {found[best]} at ε = {best:g}"


def _times(value: float) -> str:
    """A ratio in words: 3 significant digits, without exponents."""
    return f"{value:,.0f}" if value >= 100 else f"{value:.3g}"


def _span(values: Sequence[float]) -> str:
    low, high = _times(min(values)), _times(max(values))
    return low if low == high else f"{low}-{high}"


def remedy_unprotected(runs: Runs, claim: Claim) -> str:
    acc = runs.interval("none", math.inf, "mia_accuracy")
    side = "less" if acc.high < 0.61 else "more"
    return (
        f"a head whose best MIA accuracy lies in 0.61-0.71; this one's is {acc}: it leaks {side} "
        "than the paper's heads"
    )


def remedy_near_chance(runs: Runs, claim: Claim) -> str:
    eps = runs.epsilons("alm")
    if not [e for e in eps if _loss(runs, "alm", e).high < 0.05]:
        return f"no grid ε keeps the utility loss surely below 0.05 ({_least_loss(runs)})"
    near = [e for e in eps if runs.interval("alm", e, "mia_accuracy").low <= 0.55]
    if not near:
        acc = {e: runs.interval("alm", e, "mia_accuracy") for e in eps}
        low = min(acc, key=lambda e: acc[e].mean)
        return f"no grid ε brings the MIA accuracy to 0.55 (the least is {acc[low]} at ε = {low:g})"
    e = max(near)
    return (
        f"the MIA accuracy interval reaches 0.55 only at ε ≤ {e:g}, where the utility loss is "
        f"{_loss(runs, 'alm', e)}: near chance costs that much here"
    )


def remedy_cheap(runs: Runs, claim: Claim) -> str:
    eps = runs.epsilons("alm")
    small = [e for e in eps if e < 1]
    if not small:
        return "a grid epsilon below 1 (--paper-epsilons)"
    ok = [e for e in eps if _loss(runs, "alm", e).low <= 0.10]
    if not ok:
        return f"no grid ε brings the utility-loss interval to 0.10 ({_least_loss(runs)})"
    first, target = min(ok), max(small)
    l1 = _mean(runs, "alm", first, "sensitivity")
    # every mechanism's noise scale is linear in its sensitivity at a fixed epsilon, so the
    # noise of `first` at `target` needs the sensitivity scaled by the two scales' ratio
    needed = (
        l1 * _mean(runs, "alm", first, "noise_scale") / _mean(runs, "alm", target, "noise_scale")
    )
    return (
        f"the utility-loss interval first reaches 0.10 at ε = {first:g} "
        f"({_loss(runs, 'alm', first)}); the same noise at ε = {target:g} needs an L1 "
        f"sensitivity ≤ {needed:.4g} ({_times(l1 / needed)} times below this head's {l1:.4g}; "
        f"the paper's Table 1: {PAPER_TABLE1.l1:g})"
    )


def remedy_figure1(runs: Runs, claim: Claim) -> str:
    shared = sorted(set.intersection(*(set(runs.epsilons(m)) for m in POST)))
    parts = []
    differ = [
        e
        for e in shared
        if not (d := runs.difference("alm", "laplace", e, "utility_loss")).low <= 0 <= d.high
    ]
    if differ:
        than = [
            _mean(runs, "alm", e, "noise_std") / _mean(runs, "laplace", e, "noise_std")
            for e in differ
        ]
        parts.append(
            f"ALM's noise std is {_span(than)} times Laplace's where they "
            f"differ (ε = {', '.join(f'{e:g}' for e in differ)}): equal losses need equal noise"
        )
    live = [e for e in shared if _loss(runs, "alm", e).mean < rc.AT_CHANCE_LOSS]
    not_worse = [
        e for e in live if not runs.difference("gaussian", "alm", e, "utility_loss").low > 0
    ]
    ratio = {
        e: _mean(runs, "alm", e, "noise_std") / _mean(runs, "gaussian", e, "noise_std")
        for e in not_worse
    }
    less = [e for e in not_worse if ratio[e] > 1]  # the Gaussian adds less noise than ALM
    if less:
        l2 = _mean(runs, "gaussian", less[0], "sensitivity")
        parts.append(
            f"at ε = {', '.join(f'{e:g}' for e in less)} ALM's noise std is "
            f"{_span([ratio[e] for e in less])} times the Gaussian's: the Gaussian would add as "
            f"much only with an L2 sensitivity that many times its {l2:.4g}"
        )
    if already := [e for e in not_worse if ratio[e] <= 1]:
        parts.append(
            f"at ε = {', '.join(f'{e:g}' for e in already)} the Gaussian's noise std is already "
            "at least ALM's, yet its loss is not significantly higher: narrower intervals (more "
            "noise draws, more non-members) would be needed to tell them apart"
        )
    return "; ".join(parts)


def remedy_figure2(runs: Runs, claim: Claim) -> str:
    best = {}
    for method in POST:  # as figure2_trade_off: the least AUC at utility loss surely < 0.1
        usable = [e for e in runs.epsilons(method) if _loss(runs, method, e).high < 0.10]
        if usable:
            found = [runs.interval(method, e, "mia_auc") for e in usable]
            best[method] = min(found, key=lambda i: i.mean)
    if "alm" not in best or len(best) < 2:
        return ""
    below = min(i.high for m, i in best.items() if m != "alm")
    return (
        f"ALM's AUC interval reaching down to {below:.3f} (it reaches {best['alm'].low:.3f}) at "
        "utility loss surely below 0.1"
    )


#: What would make each ALM claim hold, measured, by the claim function's name.
REMEDIES: dict[str, Callable[[Runs, Claim], str]] = {
    "unprotected_vulnerable": remedy_unprotected,
    "protected_near_chance": remedy_near_chance,
    "strong_privacy_cheap": remedy_cheap,
    "figure1": remedy_figure1,
    "figure2_trade_off": remedy_figure2,
}


@dataclass(frozen=True)
class Verdict:
    """One ALM claim under one setting.

    Attributes:
        setting: the setting's name.
        claim: reproduce.py's verdict, numbers and reason.
        remedy: where it fails, what would make it hold, measured (else empty).
    """

    setting: str
    claim: Claim
    remedy: str


def verdicts(found: dict[str, Runs]) -> list[Verdict]:
    """Every ALM claim of ``reproduce_claims.CLAIMS`` under each setting, with its remedy."""
    out = []
    for name, runs in found.items():
        for make in rc.CLAIMS:
            claim = make(runs)
            if claim.paper != "ALM":
                continue
            fix = REMEDIES.get(make.__name__)
            remedy = fix(runs, claim) if fix and claim.verdict == FAILS else ""
            out.append(Verdict(name, claim, remedy))
    return out


# --- the docs block ------------------------------------------------------------------------------


def _ratio(ours: float, paper: float) -> str:
    return "—" if math.isnan(ours) else _times(ours / paper)


def _number(value: float) -> str:
    return "—" if math.isnan(value) else f"{value:.4g}"


def render(
    *,
    members: int,
    seed: int,
    epsilons: Sequence[float],
    m: int,
    found: dict[str, Runs],
    found_verdicts: Sequence[Verdict],
    seconds: dict[str, float],
    machine: str,
    features: int,
    classes: int,
) -> str:
    """The ``results-paper-scale`` block of docs/results.md."""
    by_name = {s.name: s for s in SETTINGS}
    sens = {name: sensitivities(runs.runs[0]) for name, runs in found.items()}
    params = (features + 1) * classes
    paper = PAPER_TABLE1
    total = sum(seconds.get(n, 0.0) for n in found) + seconds.get("features", 0.0)
    claims = list(dict.fromkeys(v.claim.claim for v in found_verdicts))
    cell = {(v.setting, v.claim.claim): v.claim.verdict for v in found_verdicts}
    lines = [
        f"{members:,} members (and as many non-members, {2 * members:,} in the attacker's pool, "
        f"{members:,} public), {features}-d features of {classes} classes, split seed {seed} "
        "(one split seed: each interval is the within-run one, without the split's variation); "
        f"ε in {', '.join(f'{e:g}' for e in epsilons)}; m = {m} pairs in every sampled "
        "setting.",
        "",
        f"Measured cost ({machine}; CPU-bound, a busier machine takes longer):",
        "",
        *[
            f"- `{name}` ({by_name[name].what}): {rc._duration(seconds.get(name, math.nan))}"
            for name in found
        ],
        f"- the features file: {rc._duration(seconds.get('features', 0.0))}",
        f"- total: {rc._duration(total)}",
        "",
        "**Sensitivities** the noise is calibrated to (ALM and Laplace: L1; the Gaussian: L2), "
        "beside the ALM paper's Table 1 (CIFAR-10, |d| = "
        f"{paper.members:,}, m = {paper.m}). The paper's head reads {paper.features}-d features "
        f"(P = {paper.parameters:,} weights and biases); ours {features}-d (P = {params:,}, "
        f"{params / paper.parameters:.2f} times as many): at equal movement per coordinate an "
        "L1 norm grows with P, an L2 norm with its square root.",
        "",
        "| setting | head | `--sensitivity` | guarantee | L1 | L2 | L1 / paper's | L2 / paper's |",
        "|---|---|---|---|---|---|---|---|",
        f"| ALM paper, Table 1 | Keras `Dense(10)`, {paper.features}-d | Algorithm 2 on the "
        f"members | none stated | {paper.l1:g} | {paper.l2:g} | 1 | 1 |",
        *[
            f"| `{name}` | {'paper' if by_name[name].head else 'default'} ({features}-d) | "
            f"{by_name[name].sensitivity} | {s.guarantee} | {_number(s.l1)} | {_number(s.l2)} | "
            f"{_ratio(s.l1, paper.l1)} | {_ratio(s.l2, paper.l2)} |"
            for name, s in sens.items()
        ],
        "",
        "**Verdicts** of the ALM claims per setting (the interval tests of "
        "`scripts/reproduce.py`):",
        "",
        "| claim | " + " | ".join(f"`{name}`" for name in found) + " |",
        "|---|" + "---|" * len(found),
        *[
            f"| {c} | " + " | ".join(cell.get((name, c), "—") for name in found) + " |"
            for c in claims
        ],
        "",
        "| setting | claim | verdict | numbers | why | what would make it hold (measured) |",
        "|---|---|---|---|---|---|",
        *[
            f"| `{v.setting}` | {v.claim.claim} | **{v.claim.verdict}** | {v.claim.numbers} | "
            f"{v.claim.why} | {v.remedy or '—'} |"
            for v in found_verdicts
        ],
    ]
    return "\n".join(lines) + "\n"


# --- main ----------------------------------------------------------------------------------------


def main(args: argparse.Namespace, *, folder: Path) -> int:
    """Run the settings into ``folder`` (arguments checked by :func:`check_arguments`), print
    the verdicts, record them, and with ``--update-docs`` write the docs block."""
    from bench_scale import CLASSES, DIM, features_file

    from alm_opacus.io import atomic_write_json

    record_path = folder / RECORD
    record = json.loads(record_path.read_text()) if record_path.exists() else {}
    arguments = {
        "members": args.paper_members,
        "epsilons": list(args.paper_epsilons),
        "m": args.paper_m,
        "split_seed": args.paper_seed,
        "compare_args": args.compare_args,
    }
    if record.get("arguments", arguments) != arguments:  # finished runs would be reused
        print(
            f"reproduce.py: error: --reuse={str(folder)!r} holds runs of {record['arguments']}, "
            f"not {arguments}: expected a new --out",
            file=sys.stderr,
        )
        return 2
    seconds: dict[str, float] = dict(record.get("seconds", {}))
    start = time.perf_counter()
    features = features_file(folder / "data", args.paper_members).resolve()
    if "features" not in seconds:
        seconds["features"] = time.perf_counter() - start
    jobs = commands(
        features,
        folder,
        seed=args.paper_seed,
        epsilons=args.paper_epsilons,
        m=args.paper_m,
        extra=shlex.split(args.compare_args),
    )
    for name, spent in run_settings(jobs, folder, workers=args.jobs).items():
        if spent:
            seconds[name] = seconds.get(name, 0.0) + spent
    found = {name: Runs([Run(folder / name)]) for name in jobs}
    found_verdicts = verdicts(found)
    machine = str(record.get("machine", rc.machine()))
    atomic_write_json(
        record_path,
        {
            "arguments": arguments,
            "seconds": seconds,
            "machine": machine,
            "members": args.paper_members,
            "finished": datetime.datetime.now(datetime.timezone.utc).isoformat(),
            "commands": jobs,
            "sensitivities": {n: asdict(sensitivities(r.runs[0])) for n, r in found.items()},
            "verdicts": [
                {"setting": v.setting, "remedy": v.remedy, **asdict(v.claim)}
                for v in found_verdicts
            ],
        },
    )
    for v in found_verdicts:
        print(f"{v.setting:22s} {v.claim.verdict:17s} {v.claim.where}: {v.claim.claim}")
    print(f"runs and verdicts: {folder}")
    if args.update_docs:
        _write_doc(args, found, found_verdicts, seconds, machine, DIM, CLASSES)
    return 0


def _write_doc(
    args: argparse.Namespace,
    found: dict[str, Runs],
    found_verdicts: Sequence[Verdict],
    seconds: dict[str, float],
    machine: str,
    features: int,
    classes: int,
) -> None:
    from docblocks import write_block

    body = render(
        members=args.paper_members,
        seed=args.paper_seed,
        epsilons=args.paper_epsilons,
        m=args.paper_m,
        found=found,
        found_verdicts=found_verdicts,
        seconds=seconds,
        machine=machine,
        features=features,
        classes=classes,
    )
    write_block(
        rc.DOC,
        name=BLOCK,
        script=str(ROOT / "scripts" / "reproduce.py"),
        deps=DEPS,
        body=body,
        args=[
            "--paper-scale",
            "--paper-members",
            str(args.paper_members),
            "--paper-epsilons",
            ",".join(f"{e:g}" for e in args.paper_epsilons),
            "--paper-m",
            str(args.paper_m),
            "--split-seeds",
            str(args.paper_seed),
            "--compare-args",
            args.compare_args,
            "--update-docs",
        ],
    )
    print(f"written: {rc.DOC}")
