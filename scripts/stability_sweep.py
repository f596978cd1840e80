#!/usr/bin/env python
"""The trade-off of T: utility against epsilon of the stability head (T full-batch gradient
descent steps and its proven sensitivity) beside the converged head (sampled and analytic
sensitivity) and DP-SGD at equal epsilon (issue 37, item 2).

For each data set and number of members n it prepares the harness's data once (``features``:
the synthetic mixture of ``scripts/bench_scale.py`` as a ``features:PATH`` file of 5n rows;
``mnist``: SimCLR features of the embedded rows, up to 1,000 members), then measures units,
each cached in ``--cache`` (JSON, written atomically) as it finishes so an interrupted sweep
resumes:

* ``gd T=.., eta=.., lambda=..``: the stability head (``--sensitivity stability``), its test
  accuracy, its proven L1 and L2 sensitivities, and the mean test accuracy of ``--draws``
  releases per mechanism (ALM, Laplace, Gaussian) and epsilon;
* ``converged, sampled`` / ``converged, analytic``: the dataset's default head with the
  public-split sampler's sensitivity (random-DP) and the convex head (lambda 0.1) with its
  proven bound (DP);
* ``dpsgd``: the dataset's DP-SGD head trained at each epsilon (no tuning).

Utility is test accuracy on the non-members. Noise is seeded (``reproducible_noise``): these
releases measure utility and are never published. ``--write`` puts the tables into the block
``stability-sweep`` of docs/sensitivity.md and the plot into docs/img/stability_sweep.png.

    python scripts/stability_sweep.py [--datasets features,mnist] [--sizes 1000,10000,50000]
        [--steps 10,30,100,300,1000] [--lrs 1] [--l2s 0,0.001] [--draws 3] [--write]
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from bench_scale import Cache, _ints, features_file
from tqdm import tqdm

from docblocks import ROOT, relative, write_block

EPSILONS = (0.1, 0.3, 1.0, 3.0, 10.0, 30.0, 100.0)
MECHANISMS = ("alm", "laplace", "gaussian")
#: mnist ships 5,000 rows: its harness split holds at most 1,000 members.
MNIST_MAX = 1000
DOC = ROOT / "docs" / "sensitivity.md"
PLOT = ROOT / "docs" / "img" / "stability_sweep.png"
DEPS = (
    "alm_opacus/heads.py",
    "alm_opacus/steppers.py",
    "alm_opacus/posttraining",
    "alm_opacus/sensitivity",
    "alm_opacus/mechanisms",
    "alm_opacus/training",
    "alm_opacus/ssl",
    "alm_opacus/data",
    "alm_opacus/run",
    "constraints.txt",
)


def _floats(text: str) -> tuple[float, ...]:
    return tuple(float(v) for v in text.split(",") if v.strip())


@dataclass
class Setup:
    """One data set at one size: the harness's prepared data and method context."""

    dataset: str
    n: int
    session: Any
    members: tuple[torch.Tensor, torch.Tensor]
    test: tuple[torch.Tensor, torch.Tensor]
    delta: float

    @classmethod
    def open(cls, dataset: str, n: int, *, folder: Path) -> Setup:
        from alm_opacus.data import SplitSizes
        from alm_opacus.run.config import RunConfig
        from alm_opacus.run.harness import Session, plan_run, prepare

        if dataset == "features":
            name, split = f"features:{features_file(folder / 'data', n)}", None
        else:
            name = dataset
            split = SplitSizes(members=n, nonmembers=n, attacker=2 * n, public=n)
        config = RunConfig(
            dataset=name,
            methods=("none",),
            progress=False,
            reproducible_noise=True,
            cache_dir=str(folder / "cache"),
            out=str(folder / "unused"),
            split=split,
        )
        plan = plan_run(config)
        data = prepare(plan)
        return cls(
            dataset=dataset,
            n=n,
            session=Session.open(plan, data),
            members=data.part("members"),
            test=data.part("nonmembers"),
            delta=float(data.delta),
        )

    def accuracy(self, predict: Callable[[torch.Tensor], torch.Tensor]) -> float:
        x, y = self.test
        with torch.no_grad():
            return float((predict(x).argmax(-1) == y).double().mean())

    def protect(self, name: str, options: dict[str, Any], epsilons: Sequence[float], draws: int):
        """The method's clean accuracy, sensitivities and mean release accuracy per epsilon."""
        from alm_opacus.heads import accuracy
        from alm_opacus.methods import ReleaseRequest, create_method

        method = create_method(name, options)
        context = self.session.context
        x, y = self.members
        prepared = method.prepare(features=x, labels=y, seed=0, context=context)
        out: dict[str, Any] = {}
        head = getattr(prepared, "head", None)
        if head is not None:
            out["clean"] = accuracy(head.predict_proba(self.test[0]), self.test[1])
            out["l1"] = prepared.sensitivity["l1"].value
            out["l2"] = prepared.sensitivity["l2"].value
            out["guarantee"] = None
        accs: dict[str, float] = {}
        for epsilon in epsilons:
            values = []
            for draw in range(draws if head is not None else 1):
                request = ReleaseRequest(
                    features=x,
                    labels=y,
                    epsilon=epsilon,
                    delta=self.delta,
                    seed=0,
                    draw=draw,
                    context=context,
                )
                release = method.release(prepared, request)
                out["guarantee"] = release.statement.guarantee.value
                values.append(self.accuracy(release.predict_proba))
            accs[f"{epsilon:g}"] = float(np.mean(values))
        out["accuracy"] = accs
        return out


def gd_key(steps: int, lr: float, l2: float) -> str:
    return f"gd T={steps}, eta={lr:g}, lambda={l2:g}"


def units(args: argparse.Namespace) -> list[tuple[str, int, str, str, dict[str, Any]]]:
    """``(dataset, n, recipe, method, options)`` in the order they run."""
    out = []
    for dataset in args.datasets:
        for n in args.sizes:
            if dataset == "mnist" and n > MNIST_MAX:
                continue
            for steps in args.steps:
                for lr in args.lrs:
                    for l2 in args.l2s:
                        options = {
                            "sensitivity": "stability",
                            "stability_steps": steps,
                            "stability_lr": lr,
                            "stability_l2": l2,
                        }
                        for mech in MECHANISMS:
                            out.append((dataset, n, gd_key(steps, lr, l2), mech, options))
            for source in ("sampled", "analytic"):
                for mech in MECHANISMS:
                    options = {"sensitivity": source, "m": args.m}
                    out.append((dataset, n, f"converged, {source}", mech, options))
            out.append((dataset, n, "dpsgd", "dpsgd", {"tune": False}))
    return out


def measure(args: argparse.Namespace, cache: Cache) -> None:
    todo = [u for u in units(args) if args.force or "|".join(map(str, u[:4])) not in cache.data]
    setups: dict[tuple[str, int], Setup] = {}
    for dataset, n, recipe, mech, options in tqdm(todo, desc="units", disable=not todo):
        if (dataset, n) not in setups:
            setups.clear()  # one size in memory at a time
            setups[(dataset, n)] = Setup.open(dataset, n, folder=args.cache.parent)
        setup = setups[(dataset, n)]
        start = time.perf_counter()
        epsilons = EPSILONS if mech != "dpsgd" else args.dpsgd_epsilons
        torch.manual_seed(0)
        value = setup.protect(mech, options, epsilons, args.draws)
        value["seconds"] = time.perf_counter() - start
        cache.put(f"{dataset}|{n}|{recipe}|{mech}", value)


def _rows(cache: Cache) -> dict[tuple[str, int], dict[str, dict[str, Any]]]:
    grouped: dict[tuple[str, int], dict[str, dict[str, Any]]] = {}
    for key, value in cache.data.items():
        dataset, n, recipe, mech = key.split("|")
        grouped.setdefault((dataset, int(n)), {}).setdefault(recipe, {})[mech] = value
    return grouped


def _best_gd(recipes: dict[str, dict[str, Any]], mech: str, epsilon: str) -> str | None:
    gd = [r for r in recipes if r.startswith("gd ") and mech in recipes[r]]
    if not gd:
        return None
    return max(gd, key=lambda r: recipes[r][mech]["accuracy"].get(epsilon, -1.0))


def table(cache: Cache, *, argv: Sequence[str]) -> str:
    """One table per (data set, n): test accuracy of each recipe and mechanism at each
    epsilon, the best stability recipe at each epsilon marked."""
    lines = [
        f"Measured by `python scripts/stability_sweep.py {' '.join(argv)}` (test accuracy on "
        "the non-members, mean of the seeded noise draws; `clean`: the head before noise; "
        "sensitivities: L1 for ALM and Laplace, L2 for the Gaussian; DP-SGD: one head per "
        "epsilon, the dataset's schedule, untuned).",
    ]
    for (dataset, n), recipes in sorted(_rows(cache).items()):
        eps = sorted(
            {e for r in recipes.values() for v in r.values() for e in v["accuracy"]}, key=float
        )
        lines += ["", f"**{dataset}, n = {n:,}**", ""]
        lines.append(
            "| recipe | mechanism | claim | clean | sensitivity | "
            + " | ".join(f"ε = {e}" for e in eps)
            + " |"
        )
        lines.append("|---|---|---|---:|---:|" + "---:|" * len(eps))
        for recipe in sorted(recipes, key=_recipe_order):
            for mech, v in sorted(recipes[recipe].items(), key=lambda kv: _mech_order(kv[0])):
                sens = "" if "l1" not in v else f"{v['l2' if mech == 'gaussian' else 'l1']:.3g}"
                clean = "" if "clean" not in v else f"{v['clean']:.3f}"
                cells = []
                for e in eps:
                    acc = v["accuracy"].get(e)
                    best = _best_gd(recipes, mech, e) == recipe
                    text = "" if acc is None else f"{acc:.3f}"
                    cells.append(f"**{text}**" if best and text else text)
                lines.append(
                    f"| {recipe} | {mech} | {v.get('guarantee', '')} | {clean} | {sens} | "
                    + " | ".join(cells)
                    + " |"
                )
    seconds = sum(v.get("seconds", 0.0) for v in cache.data.values())
    lines += [
        "",
        f"Bold: the stability recipe with the best accuracy at that epsilon and "
        f"mechanism. Measured in {seconds / 60:.1f} min of units on "
        f"{torch.get_num_threads()} torch thread(s).",
    ]
    return "\n".join(lines)


def _recipe_order(recipe: str) -> tuple[int, str]:
    if recipe.startswith("gd "):
        steps = int(recipe.split("T=")[1].split(",")[0])
        return (0, f"{steps:08d}{recipe}")
    return (1 if recipe.startswith("converged") else 2, recipe)


def _mech_order(mech: str) -> int:
    return (*MECHANISMS, "dpsgd").index(mech)


def plot(cache: Cache, path: Path) -> None:
    """Accuracy against epsilon per (data set, n): the best stability recipe per epsilon,
    the converged head (sampled, analytic) and DP-SGD, for ALM and the Gaussian."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = sorted(_rows(cache).items())
    fig, axes = plt.subplots(1, len(groups), figsize=(4.2 * len(groups), 3.4), squeeze=False)
    for ax, ((dataset, n), recipes) in zip(axes[0], groups, strict=True):
        for mech, style in (("alm", "-"), ("gaussian", "--")):
            eps = [float(e) for e in EPSILONS]
            best = [
                max(
                    (
                        recipes[r][mech]["accuracy"].get(f"{e:g}", math.nan)
                        for r in recipes
                        if r.startswith("gd ") and mech in recipes[r]
                    ),
                    default=math.nan,
                )
                for e in eps
            ]
            ax.plot(eps, best, style, color="C0", label=f"stability, best T ({mech})")
            for colour, recipe in (("C1", "converged, sampled"), ("C2", "converged, analytic")):
                if mech in recipes.get(recipe, {}):
                    acc = recipes[recipe][mech]["accuracy"]
                    ax.plot(
                        eps,
                        [acc.get(f"{e:g}", math.nan) for e in eps],
                        style,
                        color=colour,
                        label=f"{recipe} ({mech})",
                    )
        sampled = recipes.get("converged, sampled", {}).get("alm", {})
        if "clean" in sampled:  # the default head before noise: the ceiling of every curve
            ax.axhline(sampled["clean"], color="grey", lw=0.8, label="unprotected (default head)")
        if "dpsgd" in recipes:
            acc = recipes["dpsgd"]["dpsgd"]["accuracy"]
            e = sorted(acc, key=float)
            ax.plot([float(v) for v in e], [acc[v] for v in e], ":o", color="C3", label="DP-SGD")
        ax.set_xscale("log")
        ax.set_title(f"{dataset}, n = {n:,}")
        ax.set_xlabel("epsilon")
        ax.set_ylim(0, 1)
    axes[0][0].set_ylabel("test accuracy")
    axes[0][-1].legend(fontsize=6, loc="lower right")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--datasets", type=lambda s: tuple(s.split(",")), default=("features", "mnist")
    )
    parser.add_argument("--sizes", type=_ints, default=(1000, 10000, 50000))
    parser.add_argument("--steps", type=_ints, default=(10, 30, 100, 300, 1000))
    parser.add_argument("--lrs", type=_floats, default=(1.0,))
    parser.add_argument("--l2s", type=_floats, default=(0.0, 1e-3))
    parser.add_argument("--dpsgd-epsilons", type=_floats, default=(0.3, 1.0, 3.0, 10.0))
    parser.add_argument("--m", type=int, default=200, help="sampler pairs of `converged, sampled`")
    parser.add_argument("--draws", type=int, default=3)
    parser.add_argument("--cache", type=Path, default=Path("runs/stability-sweep/cache.json"))
    parser.add_argument("--force", action="store_true", help="measure cached units again")
    parser.add_argument("--write", action="store_true", help="write the doc block and plot")
    args = parser.parse_args(argv)
    unknown = set(args.datasets) - {"features", "mnist"}
    if unknown:
        parser.error(f"--datasets: {sorted(unknown)} unknown: expected features and/or mnist")
    torch.set_num_threads(1)
    cache = Cache(args.cache)
    measure(args, cache)
    shown = _decisive(argv if argv is not None else sys.argv[1:])
    body = table(cache, argv=shown)
    print(body)
    if args.write:
        write_block(
            DOC,
            name="stability-sweep",
            script=relative(Path(__file__)),
            args=shown,
            deps=DEPS,
            body=body,
        )
        plot(cache, PLOT)
    return 0


def _decisive(argv: Sequence[str]) -> list[str]:
    """The arguments that decide the numbers (not the cache path, --force or --write)."""
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
            continue
        if a == "--cache":
            skip = True
            continue
        if a.startswith("--cache=") or a in ("--force",):
            continue
        out.append(a)
    return out


if __name__ == "__main__":
    sys.exit(main())
