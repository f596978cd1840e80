"""Synthetic results rows for the report tests: every value differs per (method, epsilon,
seed, attack), so a point lost or overwritten on the way to a view cannot go unnoticed."""

from __future__ import annotations

import functools
import io
import math
from collections.abc import Callable, Sequence

import pytest
from matplotlib.figure import Figure
from matplotlib.text import Text

from alm_opacus.report.results import ResultRow

EPSILONS = (0.1, 1.0, 10.0, 100.0, 1000.0, 10000.0)
SEEDS = (0, 1)
ATTACKS = ("loss", "lira-online", "lira-online-clean")
#: method -> (guarantee, neighbouring, noise std per unit sensitivity / epsilon, or None for
#: DP-SGD's gradient noise)
METHODS: dict[str, tuple[str, str, float | None]] = {
    "alm": ("random-dp", "replace-one", 1.81),
    "laplace": ("pure-dp", "replace-one", 1.41),
    "dpsgd": ("approx-dp", "add-remove", None),
}
DELTA = 1e-5
SENSITIVITY = 40.0


def _attack_rows(base: ResultRow, *, level: float, code: float) -> list[ResultRow]:
    out = []
    for k, attack in enumerate(ATTACKS):
        auc = min(0.5 + level * (0.10 + 0.03 * k) + code, 0.99)
        out.append(
            base.replace(
                attack=attack,
                mia_auc=auc,
                mia_accuracy=0.5 + (auc - 0.5) * (0.8 - 0.1 * k),
                mia_advantage=2 * (auc - 0.5),
                mia_auc_ci_low=auc - 0.04,
                mia_auc_ci_high=auc + 0.04,
                tpr_at_fpr_0_01=0.01 + level * (0.05 + 0.02 * (2 - k)) + code,
                tpr_at_fpr_0_01_ci_low=0.005,
                tpr_at_fpr_0_01_ci_high=0.2,
                tpr_at_fpr_0_001=0.001 + level * 0.01 * (1 + k) + code,
                tpr_at_fpr_0_001_ci_low=0.0,
                tpr_at_fpr_0_001_ci_high=0.1,
                eps_lower_bound=level * (1 + k),
                eps_lower_bound_ceiling=2.987,
                mia_auc_std=0.01,
                mia_accuracy_std=0.01,
            )
        )
    return out


def make_rows(
    *,
    row: Callable[..., ResultRow],
    methods: Sequence[str] = tuple(METHODS),
    seeds: Sequence[int] = SEEDS,
    epsilons: Sequence[float] = EPSILONS,
    infeasible: Sequence[tuple[str, float]] = (),
) -> list[ResultRow]:
    """The rows of a run, built with ``row`` (the ``result_row`` fixture): the baseline
    ``none`` per seed, then each method x epsilon x seed, one row per attack; ``infeasible``
    (method, epsilon) cells get one infeasible row."""
    rows: list[ResultRow] = []
    for seed in seeds:
        base = row(seed=seed, test_accuracy=0.93 - 0.01 * seed)
        rows += _attack_rows(base, level=1.0, code=0.001 * seed)
    for m_index, method in enumerate(methods):
        guarantee, relation, factor = METHODS[method]
        for e_index, epsilon in enumerate(epsilons):
            for seed in seeds:
                level = e_index / (len(epsilons) - 1)  # 0 at the smallest epsilon, 1 at the largest
                code = 0.0001 * (1 + m_index) + 0.001 * seed + 0.00001 * e_index
                accuracy = 0.1 + 0.8 * level + code
                base = row(
                    method=method,
                    epsilon=epsilon,
                    delta=DELTA,
                    guarantee=guarantee,
                    sensitivity=SENSITIVITY,
                    noise_scale=SENSITIVITY / epsilon,
                    seed=seed,
                    test_accuracy=accuracy,
                    utility_loss=1 - accuracy / 0.93,
                    test_accuracy_std=0.01,
                    utility_loss_std=0.01 / 0.93,
                    neighbouring=relation,
                    noise_draws=2,
                    statement=f"{method} eps={epsilon} seed={seed}",
                    status="ok",
                )
                if factor is None:  # DP-SGD: sigma * C, and its replace-one conversion
                    base = base.replace(
                        noise_multiplier=3.0 / (1 + e_index),
                        clip_norm=1.0,
                        noise_std=3.0 / (1 + e_index),
                        epsilon_replace_one=2 * epsilon,
                        delta_replace_one=(1 + math.exp(min(epsilon, 700))) * DELTA,
                    )
                else:
                    base = base.replace(
                        noise_std=factor * SENSITIVITY / epsilon,
                        epsilon_replace_one=epsilon,
                        delta_replace_one=DELTA,
                    )
                if (method, epsilon) in infeasible:
                    rows.append(
                        base.replace(
                            status="infeasible",
                            reason="no noise scale",
                            test_accuracy=math.nan,
                            utility_loss=math.nan,
                        )
                    )
                    continue
                rows += _attack_rows(base, level=level, code=code)
    return rows


@pytest.fixture
def synthetic_rows(result_row: Callable[..., ResultRow]) -> Callable[..., list[ResultRow]]:
    """:func:`make_rows`, as a fixture (tests cannot import conftest in importlib mode)."""
    return functools.partial(make_rows, row=result_row)


def smallest_text(fig: Figure, *, dpi: float, page_width: float = 1100.0) -> tuple[float, str]:
    """The smallest text of ``fig`` (its size in CSS px, and the text) as report.html shows
    it: the PNG saved as the writers save it (``dpi``, tight bounding box), displayed at
    ``max-width: 100%`` in a ``page_width`` px column, so scaled by
    min(1, page_width / PNG width)."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi, bbox_inches="tight")
    width = int.from_bytes(buf.getvalue()[16:20], "big")  # the PNG header's IHDR width
    scale = min(1.0, page_width / width)
    texts = [t for t in fig.findobj(Text) if t.get_visible() and t.get_text().strip()]
    return min((float(t.get_fontsize()) * dpi / 72 * scale, t.get_text()) for t in texts)


@pytest.fixture
def text_px() -> Callable[..., tuple[float, str]]:
    """:func:`smallest_text`, as a fixture."""
    return smallest_text
