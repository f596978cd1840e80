#!/usr/bin/env python
"""Offline LiRA at full strength, checked against an independent implementation.

The independent attacker shares nothing with ``alm_opacus.attacks``: its reference models
are scikit-learn's ``LogisticRegression`` (the victim's objective, mean cross-entropy plus
``l2 / 2 * ||w||^2``, is sklearn's with ``C = 1 / (l2 * n)``), its statistic and Gaussian
fits are written out here with ``scipy.stats.norm``, and its AUC is scikit-learn's. It
follows Carlini et al. (S&P 2022), offline: the target trained on a random half of a
universe, and each of ``N`` references trains on another random half, drawn independently
(here the universe is the ``2n`` candidates, whose membership the attacker does not know; its
pool would fill a reference only if they were fewer); a candidate is scored by the one-sided
p-value of its logit-scaled confidence under the Gaussian of the references that did not
train on it, with one global variance (their advice for few references).

Both attack the same victim, the dataset's default unprotected head on the default split;
``alm_opacus``'s ``lira-offline`` (full strength) and ``lira-offline-pool`` (references on
the pool only: the stricter attacker) use ``N`` references too. The result goes into the
generated block ``lira-offline-check`` of docs/threat_model.md (``scripts/docblocks.py``)
with ``--update-docs``.

    .venv/bin/python scripts/check_lira_offline.py --dataset mnist [--update-docs]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from scipy import stats
from sklearn.exceptions import ConvergenceWarning
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import roc_auc_score

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "threat_model.md"
BLOCK = "lira-offline-check"
#: What the numbers depend on besides this script: the victim's features and head, the
#: attacks compared, and the pinned libraries (scikit-learn, scipy).
DEPS = (
    "alm_opacus/attacks",
    "alm_opacus/heads.py",
    "alm_opacus/steppers.py",
    "alm_opacus/run",
    "alm_opacus/ssl",
    "alm_opacus/data",
    "constraints.txt",
)


@dataclass(frozen=True)
class Reference:
    """An independent offline LiRA's scores on the candidates."""

    scores: np.ndarray
    out_counts: np.ndarray


def _logit_confidence(proba: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """phi = log p_y - log(1 - p_y), with 1 - p_y summed from the other classes."""
    p = np.clip(proba, 1e-300, None)
    p_y = p[np.arange(len(labels)), labels]
    rest = p.sum(1) - p_y
    return np.log(p_y) - np.log(np.clip(rest, 1e-300, None))


def _with_bias(x: np.ndarray) -> np.ndarray:
    """A constant column, so that the bias is penalised like the other weights (the victim's
    objective penalises every parameter; sklearn's intercept would not be)."""
    return np.hstack([x, np.ones((len(x), 1))])


def _fit_reference(
    x: np.ndarray, y: np.ndarray, *, l2: float, num_classes: int
) -> LogisticRegression:
    model = LogisticRegression(C=1.0 / (l2 * len(y)), fit_intercept=False, max_iter=1000, tol=1e-6)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        model.fit(_with_bias(x), y)
    if len(model.classes_) != num_classes:
        raise ValueError("a reference subset missed a class; use more rows")
    return model


def independent_offline_lira(
    *,
    target_proba: np.ndarray,
    candidates: tuple[np.ndarray, np.ndarray],
    pool: tuple[np.ndarray, np.ndarray],
    train_size: int,
    num_reference: int,
    l2: float,
    num_classes: int,
    seed: int,
) -> Reference:
    """Carlini et al.'s offline LiRA (one-sided test, global variance), from scratch.

    Args:
        target_proba: (q, C) the victim's probabilities on the candidates.
        candidates: (q, d) features and (q,) labels whose membership is asked.
        pool: the attacker's own labelled data.
        train_size: ``n``, the victim's training-set size (each reference's size).
        num_reference: ``N`` references.
        l2: the victim's L2 coefficient (its objective: mean CE + l2 / 2 ||w||^2).
        num_classes: ``C``.
        seed: seeds the references' subsets.

    Returns:
        ``log Pr[Z <= phi]`` per candidate (larger: more member-like) and how many
        references were out for it.
    """
    xc, yc = candidates
    # Carlini et al. train the target on a random half of a universe and each reference on
    # another random half of it. Here the victim trained on n of the q = 2n candidates, so the
    # universe is the candidates (the pool fills a reference only when they are too few).
    xa = np.concatenate([xc, pool[0]])
    ya = np.concatenate([yc, pool[1]])
    universe = max(len(yc), min(len(ya), 2 * train_size))
    rng = np.random.default_rng(seed)
    phis = np.empty((num_reference, len(yc)))
    out = np.zeros((num_reference, len(yc)), dtype=bool)
    for k in range(num_reference):
        take = rng.choice(universe, size=train_size, replace=False)
        model = _fit_reference(xa[take], ya[take], l2=l2, num_classes=num_classes)
        phis[k] = _logit_confidence(model.predict_proba(_with_bias(xc)), yc)
        inside = np.zeros(len(ya), dtype=bool)
        inside[take] = True
        out[k] = ~inside[: len(yc)]
    counts = out.sum(0)
    if (counts < 2).any():
        raise ValueError("a candidate has fewer than two out-references; raise num_reference")
    masked = np.where(out, phis, np.nan)
    mean = np.nanmean(masked, axis=0)
    std = float(np.sqrt(np.nansum((masked - mean) ** 2) / counts.sum()))  # one global spread
    phi = _logit_confidence(target_proba, yc)
    return Reference(scores=stats.norm.logcdf(phi, loc=mean, scale=std), out_counts=counts)


def check(*, dataset: str, num_reference: int, seed: int, cache: str | None) -> dict[str, object]:
    """Train the default victim and attack it three ways; returns the AUCs."""
    import torch

    from alm_opacus.attacks import (
        AttackConfig,
        AttackerKnowledge,
        AttackTarget,
        prepare_attacks,
        recipe_trainer,
    )
    from alm_opacus.heads import train_head
    from alm_opacus.run.harness import RunConfig, plan_run, prepare

    config = RunConfig(
        dataset=dataset, out=str(ROOT / "runs" / "check-lira"), cache_dir=cache, progress=False
    )
    data = prepare(plan_run(config))
    recipe = config.recipe
    x_in, y_in = data.part("members")
    x_out, y_out = data.part("nonmembers")
    pool = data.part("attacker")
    victim = train_head(x_in, y_in, num_classes=data.num_classes, config=recipe, seed=seed)
    features, labels = torch.cat([x_in, x_out]), torch.cat([y_in, y_out])
    is_member = np.r_[np.ones(len(y_in), bool), np.zeros(len(y_out), bool)]
    target = AttackTarget(
        predict=victim.predict_proba,
        features=features,
        labels=labels,
        is_member=is_member,
        num_classes=data.num_classes,
    )
    knowledge = AttackerKnowledge(
        features=pool[0],
        labels=pool[1],
        num_classes=data.num_classes,
        train_size=len(y_in),
        trainer=recipe_trainer(config=recipe, num_classes=data.num_classes),
    )
    start = time.perf_counter()
    prepared = prepare_attacks(
        names=["lira-offline", "lira-offline-pool"],
        knowledge=knowledge,
        seed=seed,
        config=AttackConfig(num_reference=num_reference, num_shadow=num_reference),
        candidate_features=features,
        candidate_labels=labels,
    )
    ours = {r.attack: r.mia_auc for r in prepared.attack(target)}
    ours_s = time.perf_counter() - start
    with torch.no_grad():
        proba = victim.predict_proba(features).double().numpy()
    start = time.perf_counter()
    reference = independent_offline_lira(
        target_proba=proba,
        candidates=(features.numpy(), labels.numpy()),
        pool=(pool[0].numpy(), pool[1].numpy()),
        train_size=len(y_in),
        num_reference=num_reference,
        l2=recipe.l2,
        num_classes=data.num_classes,
        seed=seed,
    )
    return {
        "dataset": dataset,
        "num_reference": num_reference,
        "seed": seed,
        "lira-offline": ours["lira-offline"],
        "lira-offline-pool": ours["lira-offline-pool"],
        "independent": float(roc_auc_score(is_member, reference.scores)),
        "independent_out_refs": float(reference.out_counts.mean()),
        "seconds_ours": ours_s,
        "seconds_independent": time.perf_counter() - start,
    }


def render(result: dict[str, object]) -> str:
    r = result
    gap = float(r["lira-offline"]) - float(r["independent"])  # type: ignore[arg-type]
    return "\n".join(
        [
            f"On `{r['dataset']}` (default split and head, victim seed {r['seed']}, N = "
            f"{r['num_reference']} references for each attacker; "
            "`scripts/check_lira_offline.py`):",
            "",
            "| attacker | AUC |",
            "|---|---|",
            f"| `lira-offline` (full strength: references on halves of the candidates, each "
            f"candidate scored with the N/2 that did not train on it) | {r['lira-offline']:.3f} |",
            f"| independent offline LiRA (scikit-learn references, each on an independent random "
            f"half of the candidates, ~{r['independent_out_refs']:.0f} out per candidate; scipy "
            f"Gaussians) | {r['independent']:.3f} |",
            f"| `lira-offline-pool` (the stricter attacker: references on the pool only) | "
            f"{r['lira-offline-pool']:.3f} |",
            "",
            f"Difference, ours − independent: {gap:+.3f} AUC.",
        ]
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", default="mnist")
    parser.add_argument("--num-reference", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--cache-dir", default=None)
    parser.add_argument(
        "--update-docs",
        action="store_true",
        help=f"write the result into docs/threat_model.md ({BLOCK})",
    )
    args = parser.parse_args(argv)
    result = check(
        dataset=args.dataset, num_reference=args.num_reference, seed=args.seed, cache=args.cache_dir
    )
    print(json.dumps(result, indent=1))
    text = render(result)
    print(text)
    if args.update_docs:
        from docblocks import write_block

        shown = [
            "--dataset",
            args.dataset,
            "--num-reference",
            str(args.num_reference),
            "--seed",
            str(args.seed),
            "--update-docs",
        ]
        write_block(DOC, name=BLOCK, script=__file__, args=shown, deps=DEPS, body=text)
        print(f"written: {DOC}")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    sys.exit(main())
