"""What ``report.html`` says of a run besides its rows: the facts the views need
(:class:`RunFacts`, from ``config.json``), the notes on the attacks' strength, and the
settings section with resolved values."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from alm_opacus.report.results import BASELINE, ResultRow
from alm_opacus.report.series import (
    NO_LEAK,
    format_epsilon,
)
from alm_opacus.report.table import TPR_LEVELS

__all__ = [
    "RunFacts",
    "attack_notes",
    "settings_section",
]


@dataclass(frozen=True)
class RunFacts:
    """What the views need of a run besides its rows, read from its ``config.json``."""

    dataset: str = ""
    members: int | None = None
    nonmembers: int | None = None
    num_classes: int | None = None
    attacks: tuple[str, ...] = ()
    num_reference: int | None = None

    @classmethod
    def from_settings(
        cls,
        settings: Mapping[str, Any],
        *,
        num_classes: int | None = None,
        num_reference: int | None = None,
    ) -> RunFacts:
        """The facts of a run's settings (``config.json``); ``nonmembers`` resolved to the
        member count where the split leaves it unset, ``num_classes`` from the argument or
        else the settings' ``num_classes`` (recorded by the run)."""
        split = settings.get("split") or {}
        members = split.get("members")
        nonmembers = split.get("nonmembers") or members
        options = settings.get("attack_options") or {}
        classes = num_classes if num_classes is not None else settings.get("num_classes")
        return cls(
            dataset=str(settings.get("dataset", "")),
            members=int(members) if members else None,
            nonmembers=int(nonmembers) if nonmembers else None,
            num_classes=int(classes) if classes else None,
            attacks=tuple(settings.get("attacks") or ()),
            num_reference=options.get("num_reference", num_reference),
        )


# -- attack notes and settings --------------------------------------------------------------


def attack_notes(rows: Sequence[ResultRow], facts: RunFacts) -> list[str]:
    attacks = sorted({r.attack for r in rows if r.attack})
    notes = [
        f"Attacks run: {', '.join(attacks) or 'none'}. Each number in the table is the "
        "strongest of them (the largest value over every attack and attacker), which errs on "
        "the attacker's side; a maximum over many attacks reads above 0.5 even where nothing "
        "leaks (the no-leak reference measures by how much, where the run has it).",
        "Where a method supplies a noise-aware attacker (the post-training mechanisms), "
        "unsuffixed attacks are its: its shadow and reference heads are protected like the "
        "release (same mechanism and ε), and names ending in -clean are the clean-reference "
        "attacker's, whose heads are unprotected. For the other methods the attacker's heads "
        "follow the victim's recipe, unprotected.",
        "LiRA (Carlini et al. 2022) uses "
        f"{facts.num_reference or 'its'} reference heads of the victim's size; lira-offline "
        "scores each candidate with the references that did not train on it (full strength), "
        "lira-offline-pool only with references that never saw a candidate (a stricter "
        "attacker, weaker).",
    ]
    if facts.nonmembers:
        levels = []
        for _, _, fpr in TPR_LEVELS:
            state = (
                "resolved"
                if facts.nonmembers * fpr >= 1
                else f"not (it needs {math.ceil(1 / fpr - 1e-9)} non-members)"
            )
            levels.append(f"TPR at {100 * fpr:g}% FPR is {state}")
        notes.append(
            f"The evaluation set has {facts.members} members and {facts.nonmembers} "
            f"non-members: the smallest false positive rate it resolves is 1/{facts.nonmembers}"
            f", so the ROC axes start there and a TPR is shown only at FPRs of at least that: "
            + "; ".join(levels)
            + "."
        )
    ceilings = [
        r.eps_lower_bound_ceiling for r in rows if not math.isnan(r.eps_lower_bound_ceiling)
    ]
    if ceilings:
        notes.append(
            "The empirical ε lower bound (ε_lb in the table, an audit of the claim) can never "
            f"exceed {max(ceilings):.2f} on an evaluation set this size at 95% confidence: a "
            "claimed ε′ above that cannot be refuted here, whatever the attack."
        )
    return notes


def _value(value: object) -> str:
    """A setting's value in words: ``not set`` for None, ``yes``/``no`` for booleans."""
    if value is None:
        return "not set"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return format_epsilon(value) if math.isinf(value) else f"{value:g}"
    if isinstance(value, dict):
        return ", ".join(f"{k}={_value(v)}" for k, v in value.items()) or "defaults"
    if isinstance(value, list | tuple):
        return ", ".join(_value(v) for v in value)
    return str(value)


def _options(method: str, options: object) -> str:
    """One method's options: ``not set`` reads ``tuned`` where the method tunes them."""
    if not isinstance(options, dict) or not options:
        return f"{method}: no options"
    unset = "tuned (below)" if options.get("tune") is True else "default"
    shown = ", ".join(f"{k}={unset if v is None else _value(v)}" for k, v in options.items())
    return f"{method}: {shown}"


def _delta_lines(
    settings: Mapping[str, Any], rows: Sequence[ResultRow], members: int | None
) -> list[str]:
    """δ as resolved: the value the rows used, and where it came from."""
    used: dict[str, set[float]] = {}
    for r in rows:
        if r.method not in (BASELINE, NO_LEAK) and r.status == "ok":
            used.setdefault(r.method, set()).add(r.delta)
    positive = sorted({d for ds in used.values() for d in ds if d > 0})
    asked = settings.get("delta")
    if asked is None:
        n = f"n = {members} members" if members else "n members"
        source = f"the default, min(1e-5, 1/(10 n)) for {n}"
    else:
        source = "as set (--delta)"
    lines = [f"{', '.join(f'{d:g}' for d in positive) or '0'} ({source})"]
    none_needed = sorted(m for m, ds in used.items() if ds == {0.0})
    if none_needed:
        lines.append(f"0 for {', '.join(none_needed)}: its guarantee needs no δ")
    return lines


def settings_section(
    settings: Mapping[str, Any], facts: RunFacts, rows: Sequence[ResultRow], *, shareable: bool
) -> list[tuple[str, list[str]]]:
    out: list[tuple[str, list[str]]] = []

    def add(name: str, *lines: str) -> None:
        out.append((name, list(lines)))

    if "dataset" in settings:
        add("dataset", str(settings["dataset"]))
    if facts.num_classes:
        add("classes", f"{facts.num_classes} (chance accuracy {1 / facts.num_classes:.3g})")
    if "methods" in settings:
        # a resume with fewer methods keeps the earlier rows of the others (config.json's
        # methods_kept): listed apart, not as methods of this run
        methods, kept = settings["methods"], settings.get("methods_kept") or []
        if isinstance(methods, list):
            methods = [m for m in methods if m not in kept]
        add("methods", _value(methods))
        if kept:
            add("kept from an earlier run", _value(kept))
    if "epsilons" in settings:
        add("ε grid", _value(settings["epsilons"]) + " (each under its method's own relation)")
    if "delta" in settings or rows:
        add("δ", *_delta_lines(settings, rows, facts.members))
    for key, name in (("seeds", "seeds"), ("noise_draws", "noise draws per release")):
        if key in settings:
            add(name, _value(settings[key]))
    split = settings.get("split")
    if isinstance(split, dict):
        members = split.get("members")
        nonmembers = split.get("nonmembers")
        shown = f"{members} (= members, the default)" if nonmembers is None else str(nonmembers)
        add(
            "split",
            f"members {_value(members)}, non-members {shown}, attacker "
            f"{_value(split.get('attacker'))}, public {_value(split.get('public'))}",
        )
    if not shareable and "split_seed" in settings:
        add("split seed", _value(settings["split_seed"]))
    if "attacks" in settings:
        add("attacks", _value(settings["attacks"]))
    if "attack_options" in settings:
        add("attack options", _value(settings["attack_options"]) or "defaults")
    for key in ("head", "ssl"):
        if isinstance(settings.get(key), dict):
            add(key, _value(settings[key]))
    options = settings.get("method_options")
    if isinstance(options, dict):
        add("method options", *(_options(m, o) for m, o in options.items()))
    chosen = settings.get("chosen_configs") or []
    if chosen:
        add(
            "chosen by tuning",
            *(
                f"{c.get('method')} ε = {_value(c.get('epsilon'))} (seed {c.get('seed')}): "
                f"{_value(c.get('config'))}"
                for c in chosen
            ),
        )
    if "reproducible_noise" in settings:
        add(
            "noise",
            "seeded (reproducible: private only while the seed is secret)"
            if settings["reproducible_noise"]
            else "secure (OS randomness, cannot be replayed)",
        )
    for key in ("device", "environment"):
        if key in settings:
            add(key, _value(settings[key]))
    return out
