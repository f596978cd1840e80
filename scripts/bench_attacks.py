#!/usr/bin/env python
"""Attack cost and strength on the default digits run: preparation per attacker, and all
attacks on one release once prepared (target: <= 5 s, issue 14).

* ``clean``: the attacker of the unprotected baseline (shadow and reference heads trained
  without protection); it is also the clean-reference attacker of every protected release;
* ``noise-aware``: the adaptive attacker of one post-training release (``--method``, default
  ``alm`` at epsilon 1): shadow heads with the victim's recipe, noised at the released scale.

Times are wall-clock and process CPU seconds (CPU time is what a shared machine's load
inflates least). Each attacker is prepared once; scoring is repeated ``--repeats`` times.

    PYTHONPATH=. .venv/bin/python scripts/bench_attacks.py [--split-seed 0] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from alm_opacus.attacks import (
    CLEAN_SUFFIX,
    AttackConfig,
    AttackerKnowledge,
    AttackTarget,
    PreparedAttacks,
    ShadowContext,
    TargetQuery,
    attack_class,
    best_attack,
    prepare_attacks,
    recipe_trainer,
    roc_auc,
    roc_curve,
    tpr_at_fpr,
)
from alm_opacus.attacks.shadow import ShadowModelAttack
from alm_opacus.heads import train_head
from alm_opacus.methods import (
    Method,
    MethodContext,
    Release,
    ReleaseRequest,
    create_method,
    plain_shadow_trainer,
)
from alm_opacus.run.harness import RunConfig, plan_run, prepare, torch_threads
from docblocks import relative, write_block

TARGET_SECONDS = 5.0
#: Where the run folder (encoder and feature caches) goes without ``--cache-dir``.
RUNS = Path(__file__).resolve().parents[1] / "runs"


def _run_folder(cache_dir: str | None) -> str:
    """The bench's run folder: under ``cache_dir`` if given, else under ``runs/``."""
    return str((Path(cache_dir) if cache_dir else RUNS) / "bench-attacks")


def _timed(fn: Any) -> tuple[Any, float, float]:
    wall, cpu = time.perf_counter(), time.process_time()
    out = fn()
    return out, time.perf_counter() - wall, time.process_time() - cpu


@dataclass
class _Bench:
    """The default digits run's data, and what both attackers need from it."""

    split_seed: int
    seed: int
    repeats: int
    cache_dir: str | None

    def __post_init__(self) -> None:
        self.data = prepare(
            plan_run(
                RunConfig(
                    split_seed=self.split_seed,
                    cache_dir=self.cache_dir,
                    progress=False,
                    out=_run_folder(self.cache_dir),
                )
            )
        )
        self.context = MethodContext(
            num_classes=self.data.num_classes,
            head=RunConfig().recipe,
            cache_dir=Path(self.cache_dir) if self.cache_dir else None,
        )
        (self.x_in, self.y_in), (x_out, y_out) = (
            self.data.part("members"),
            self.data.part("nonmembers"),
        )
        self.features = torch.cat([self.x_in, x_out])
        self.labels = torch.cat([self.y_in, y_out])
        self.member = np.r_[np.ones(len(self.y_in), bool), np.zeros(len(y_out), bool)]

    def release(self, name: str, epsilon: float) -> tuple[Method, Release]:
        method = create_method(name)
        kw: dict[str, Any] = {"features": self.x_in, "labels": self.y_in, "seed": self.seed}
        prepared = method.prepare(**kw, context=self.context)
        request = ReleaseRequest(
            **kw, epsilon=epsilon, delta=self.data.delta, draw=0, context=self.context
        )
        release = method.release(prepared, request)
        return method, release

    def attacker(self, method: Method, release: Release, epsilon: float) -> PreparedAttacks:
        trainer = (
            plain_shadow_trainer(self.context) if release.attacker is None else release.attacker()
        )
        pool = self.data.part("attacker")
        knowledge = AttackerKnowledge(
            features=pool[0],
            labels=pool[1],
            trainer=trainer,
            num_classes=self.data.num_classes,
            train_size=len(self.y_in),
        )
        return prepare_attacks(
            knowledge=knowledge,
            seed=self.seed,
            candidate_features=self.features,
            candidate_labels=self.labels,
        )

    def score(
        self, prepared: PreparedAttacks, release: Release, suffix: str = ""
    ) -> dict[str, Any]:
        target = AttackTarget(
            predict=release.predict_proba,
            features=self.features,
            labels=self.labels,
            is_member=self.member,
            num_classes=self.data.num_classes,
            delta=release.statement.delta,
        )
        runs = [_timed(lambda: prepared.attack(target, suffix=suffix)) for _ in range(self.repeats)]
        results = runs[0][0]
        return {
            "attack_wall_s": min(r[1] for r in runs),
            "attack_cpu_s": min(r[2] for r in runs),
            "auc": {r.attack: round(r.mia_auc, 4) for r in results},
            "best": best_attack(results).attack,
        }


def bench_attacks(
    *,
    split_seed: int = 0,
    seed: int = 0,
    method: str = "alm",
    epsilon: float = 1.0,
    repeats: int = 3,
    cache_dir: str | None = None,
) -> dict[str, Any]:
    """Prepare both attackers and attack one release of the unprotected and the protected head.

    Args:
        split_seed: the run's split seed (``compare.py --split-seed``).
        seed: the cell's seed (head training and attacker).
        method: the post-training method whose noise-aware attacker is measured.
        epsilon: its epsilon.
        repeats: scoring repetitions (the fastest is reported).
        cache_dir: encoder and feature cache (shared with ``compare.py --cache-dir``).

    Returns:
        A JSON-ready dict: per attacker the preparation time (wall and CPU), the time of all
        attacks on one release (the fastest of ``repeats``), and every attack's AUC.
    """
    bench = _Bench(split_seed=split_seed, seed=seed, repeats=repeats, cache_dir=cache_dir)
    report: dict[str, Any] = {
        "split_seed": split_seed,
        "seed": seed,
        "target_attack_seconds": TARGET_SECONDS,
    }
    with torch_threads(1):
        none, clean_release = bench.release("none", math.inf)
        clean, wall, cpu = _timed(lambda: bench.attacker(none, clean_release, math.inf))
        report["clean"] = {
            "prepare_wall_s": wall,
            "prepare_cpu_s": cpu,
            **bench.score(clean, clean_release),
        }
        post, release = bench.release(method, epsilon)
        aware, wall, cpu = _timed(lambda: bench.attacker(post, release, epsilon))
        report["noise-aware"] = {
            "method": method,
            "epsilon": epsilon,
            "prepare_wall_s": wall,
            "prepare_cpu_s": cpu,
            **bench.score(aware, release),
        }
        report["clean-on-protected"] = bench.score(clean, release, CLEAN_SUFFIX)
    return report


def _victim(
    split_seed: int, seed: int, cache_dir: str | None, dataset: str = "digits"
) -> dict[str, Any]:
    """The default run's unprotected head on ``dataset``, evaluation set and attacker's pool."""
    config = RunConfig(
        dataset=dataset,
        split_seed=split_seed,
        cache_dir=cache_dir,
        progress=False,
        out=_run_folder(cache_dir),
    )
    data = prepare(plan_run(config))
    (x_in, y_in), (x_out, y_out) = data.part("members"), data.part("nonmembers")
    head = train_head(x_in, y_in, num_classes=data.num_classes, config=config.recipe, seed=seed)
    features, labels = torch.cat([x_in, x_out]), torch.cat([y_in, y_out])
    with torch.no_grad():
        proba = head.predict_proba(features).double().numpy()
    return {
        "pool": data.part("attacker"),
        "num_classes": data.num_classes,
        "n": len(y_in),
        "query": TargetQuery(
            proba=proba,
            labels=labels.numpy().astype(np.int64),
            features=features,
            predict=head.predict_proba,  # RMIA queries the release on its population samples
        ),
        "member": np.r_[np.ones(len(y_in), bool), np.zeros(len(y_out), bool)],
        "trainer": recipe_trainer(config=config.recipe, num_classes=data.num_classes),
    }


ABLATION: dict[str, tuple[str, str, dict[str, Any]]] = {
    # row: (attack, bank, AttackConfig fields); bank "64" = 64 heads on n rows each,
    # "16" = 16 heads on n rows, "2n" = 64 heads on 2n rows (150 candidates + 150 pool rows,
    # the size the online references had before they were matched to the victim's n)
    "lira-online N=64 per-example mean": ("lira-online", "64", {"lira_fixed_variance": False}),
    "lira-online N=64 per-example median": (
        "lira-online",
        "64",
        {"lira_fixed_variance": False, "lira_location": "median"},
    ),
    "lira-online N=64 fixed mean": ("lira-online", "64", {"lira_fixed_variance": True}),
    "lira-online N=64 fixed median": (
        "lira-online",
        "64",
        {"lira_fixed_variance": True, "lira_location": "median"},
    ),
    "lira-online N=16 per-example mean": ("lira-online", "16", {"lira_fixed_variance": False}),
    "lira-online N=16 fixed mean": ("lira-online", "16", {"lira_fixed_variance": True}),
    "lira-online N=64 fixed mean, 2n rows": ("lira-online", "2n", {"lira_fixed_variance": True}),
    "lira-online N=64 per-example mean, 2n rows": (
        "lira-online",
        "2n",
        {"lira_fixed_variance": False},
    ),
    "lira-offline-pool N=64 fixed mean": (
        "lira-offline-pool",
        "64",
        {"lira_fixed_variance": True},
    ),
    "lira-offline-pool N=64 fixed median": (
        "lira-offline-pool",
        "64",
        {"lira_fixed_variance": True, "lira_location": "median"},
    ),
    "lira-offline-pool N=64 per-example mean": (
        "lira-offline-pool",
        "64",
        {"lira_fixed_variance": False},
    ),
    "lira-offline N=64 fixed mean": ("lira-offline", "64", {"lira_fixed_variance": True}),
    # RMIA on the same references as LiRA (the online bank), at equal reference counts
    "rmia-online N=64": ("rmia-online", "64", {}),
    "rmia-online N=16": ("rmia-online", "16", {}),
    "rmia-offline N=64 a=0.3": ("rmia-offline", "64", {"rmia_offline_a": 0.3}),
    "rmia-offline N=64 a=1": ("rmia-offline", "64", {"rmia_offline_a": 1.0}),
    "rmia-offline N=16 a=0.3": ("rmia-offline", "16", {"rmia_offline_a": 0.3}),
    "rmia-offline N=64 a tuned": ("rmia-offline", "64", {"rmia_offline_a": None}),
    "rmia-offline N=16 a tuned": ("rmia-offline", "16", {"rmia_offline_a": None}),
    "shadow gbm (all pairs)": ("shadow", "64", {"shadow_model": "gbm"}),
    "shadow mlp (2,000 pairs)": ("shadow", "64", {"shadow_model": "mlp"}),
    "shadow auto": ("shadow", "64", {"shadow_model": "auto"}),
}
"""The variants behind the defaults in ``docs/threat_model.md`` (--ablation)."""


def ablation(
    *,
    split_seeds: tuple[int, ...] = (0, 1, 2),
    attacker_seeds: tuple[int, ...] = (1, 2, 3),
    cache_dir: str | None = None,
    dataset: str = "digits",
    variants: tuple[str, ...] | None = None,
) -> dict[str, Any]:
    """AUC and TPR at 1% FPR of each :data:`ABLATION` variant against the unprotected head,
    per split seed (mean over attacker seeds), and the shadow classifiers' held-out AUCs.

    The held-out AUC is the one ``shadow_model="auto"`` chooses by: pairs of a quarter of the
    shadow examples, never the evaluation set. The evaluation AUCs are reported, not used.
    ``variants`` keeps the rows whose name contains one of the given strings (all: None);
    banks are trained only for the rows kept.

    Raises:
        ValueError: if ``variants`` keeps no row.
    """
    chosen = {
        row: spec
        for row, spec in ABLATION.items()
        if variants is None or any(v in row for v in variants)
    }
    if not chosen:
        raise ValueError(f"variants={variants!r} match no row of {list(ABLATION)}")
    rows: dict[str, dict[int, list[tuple[float, float]]]] = {k: {} for k in chosen}
    held: dict[str, dict[int, list[float]]] = {"mlp": {}, "gbm": {}}
    with torch_threads(1):
        for split_seed in split_seeds:
            victim = _victim(split_seed, 0, cache_dir, dataset)
            for seed in attacker_seeds:
                contexts = _ablation_contexts(victim, seed)
                for row, (name, bank, fields) in chosen.items():
                    attack = attack_class(name)(config=AttackConfig(**fields), seed=seed)
                    attack.fit(contexts[bank])
                    roc = roc_curve(
                        scores=attack.score(victim["query"]).scores, is_member=victim["member"]
                    )
                    rows[row].setdefault(split_seed, []).append(
                        (roc_auc(roc), tpr_at_fpr(roc, fpr=0.01))
                    )
                    if isinstance(attack, ShadowModelAttack) and attack.held_out_auc:
                        for k, v in attack.held_out_auc.items():
                            held[k].setdefault(split_seed, []).append(v)
    return {
        "dataset": dataset,
        "split_seeds": list(split_seeds),
        "attacker_seeds": list(attacker_seeds),
        "auc": {
            r: {s: float(np.mean([a for a, _ in v])) for s, v in d.items()} for r, d in rows.items()
        },
        "tpr_at_fpr_0.01": {
            r: {s: float(np.mean([t for _, t in v])) for s, v in d.items()} for r, d in rows.items()
        },
        "shadow_held_out_auc": {
            k: {s: float(np.mean(v)) for s, v in d.items()} for k, d in held.items()
        },
    }


def _ablation_contexts(victim: dict[str, Any], seed: int) -> dict[str, ShadowContext]:
    def context(heads: int, train_size: int) -> ShadowContext:
        k = AttackerKnowledge(
            features=victim["pool"][0],
            labels=victim["pool"][1],
            trainer=victim["trainer"],
            num_classes=victim["num_classes"],
            train_size=train_size,
        )
        q = victim["query"]
        return ShadowContext(
            knowledge=k,
            config=AttackConfig(num_shadow=heads, num_reference=heads),
            seed=seed,
            candidates=(q.features, torch.from_numpy(q.labels)),
        )

    n = victim["n"]
    return {"64": context(64, n), "16": context(16, n), "2n": context(64, 2 * n)}


def format_ablation(report: dict[str, Any]) -> str:
    """A text table: one row per variant, AUC (TPR at 1% FPR) per split seed, and the mean."""
    seeds = report["split_seeds"]
    lines = [
        f"{'variant':46s} "
        + " ".join(f"{'split ' + str(s):>14s}" for s in seeds)
        + f" {'mean':>14s}"
    ]
    for row, per in report["auc"].items():
        tpr = report["tpr_at_fpr_0.01"][row]
        cells = [f"{per[s]:.3f} ({tpr[s]:.3f})" for s in seeds]
        mean = f"{np.mean([per[s] for s in seeds]):.3f} ({np.mean([tpr[s] for s in seeds]):.3f})"
        lines.append(f"{row:46s} " + " ".join(f"{c:>14s}" for c in cells) + f" {mean:>14s}")
    for k, per in report["shadow_held_out_auc"].items():
        if not per:  # no shadow row was run (--variants)
            continue
        cells = [f"{per[s]:.3f}" for s in seeds]
        lines.append(
            f"{'shadow held-out AUC, ' + k:46s} "
            + " ".join(f"{c:>14s}" for c in cells)
            + f" {np.mean([per[s] for s in seeds]):>14.3f}"
        )
    return "\n".join(lines)


#: What the ablation depends on besides this script (a change makes the doc's block stale).
ABLATION_DEPS = (
    "alm_opacus/attacks",
    "alm_opacus/heads.py",
    "alm_opacus/steppers.py",
    "alm_opacus/run",
    "alm_opacus/ssl",
    "alm_opacus/data",
    "constraints.txt",
)


def markdown_ablation(report: dict[str, Any]) -> str:
    """The ablation as a markdown table: AUC (TPR at 1% FPR) per split seed and the mean, then
    the shadow classifiers' AUC on held-out shadow examples (what chooses between them)."""
    seeds = report["split_seeds"]
    lines = [
        "| variant | " + " | ".join(f"split {s}" for s in seeds) + " | mean |",
        "|---|" + "---|" * (len(seeds) + 1),
    ]
    for row, per in report["auc"].items():
        tpr = report["tpr_at_fpr_0.01"][row]
        cells = [f"{per[s]:.3f} ({tpr[s]:.3f})" for s in seeds]
        mean = f"{np.mean([per[s] for s in seeds]):.3f} ({np.mean([tpr[s] for s in seeds]):.3f})"
        lines.append(f"| {row} | " + " | ".join(cells) + f" | {mean} |")
    for k, per in report["shadow_held_out_auc"].items():
        if not per:  # no shadow row was run (--variants)
            continue
        cells = [f"{per[s]:.3f}" for s in seeds]
        mean = f"{np.mean([per[s] for s in seeds]):.3f}"
        lines.append(
            f"| shadow {k}: AUC on held-out shadow examples | " + " | ".join(cells) + f" | {mean} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--split-seed", type=int, default=0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--method", default="alm")
    parser.add_argument("--epsilon", type=float, default=1.0)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--cache-dir", default=None)
    parser.add_argument("--out", default=None, help="also write the report as JSON here")
    parser.add_argument(
        "--ablation",
        action="store_true",
        help="the attack variants behind the defaults, instead of the cost",
    )
    parser.add_argument("--split-seeds", default="0,1,2", help="--ablation: split seeds")
    parser.add_argument("--attacker-seeds", default="1,2,3", help="--ablation: attacker seeds")
    parser.add_argument("--dataset", default="digits", help="--ablation: the run's dataset")
    parser.add_argument(
        "--variants",
        default=None,
        help="--ablation: comma-separated substrings; only the rows containing one are run",
    )
    parser.add_argument(
        "--write",
        type=Path,
        default=None,
        help="--ablation: replace the generated block attack-ablation (the full digits table) "
        "or attack-ablation:DATASET (another data set or --variants) of this doc",
    )
    args = parser.parse_args(argv)
    if args.ablation:
        # the full digits table is the block `attack-ablation`; another data set, or a subset
        # of the variants, has its own (`attack-ablation:mnist`)
        full = args.dataset == "digits" and not args.variants
        block = "attack-ablation" if full else f"attack-ablation:{args.dataset}"
        result = ablation(
            split_seeds=tuple(int(s) for s in args.split_seeds.split(",")),
            attacker_seeds=tuple(int(s) for s in args.attacker_seeds.split(",")),
            cache_dir=args.cache_dir,
            dataset=args.dataset,
            variants=tuple(args.variants.split(",")) if args.variants else None,
        )
        print(format_ablation(result))
        if args.out:
            Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
        if args.write is not None:
            shown = [
                "--ablation",
                *([] if args.dataset == "digits" else ["--dataset", args.dataset]),
                *([] if not args.variants else ["--variants", args.variants]),
                "--split-seeds",
                args.split_seeds,
                "--attacker-seeds",
                args.attacker_seeds,
                "--write",
                relative(args.write),
            ]
            write_block(
                args.write,
                name=block,
                script=__file__,
                args=shown,
                deps=ABLATION_DEPS,
                body=markdown_ablation(result),
            )
        return 0
    report = bench_attacks(
        split_seed=args.split_seed,
        seed=args.seed,
        method=args.method,
        epsilon=args.epsilon,
        repeats=args.repeats,
        cache_dir=args.cache_dir,
    )
    text = json.dumps(report, indent=2)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    worst = max(report[k]["attack_wall_s"] for k in ("clean", "noise-aware", "clean-on-protected"))
    print(f"\nall attacks on one release: {worst:.2f} s wall (target <= {TARGET_SECONDS:g} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
