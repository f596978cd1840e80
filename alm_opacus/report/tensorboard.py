"""TensorBoard output under ``<out>/tb``.

* scalars ``<metric>/<method>`` (test accuracy, utility loss) and
  ``<metric>/<method>/<attack>`` (MIA metrics), against ``step = round(100 * epsilon)``;
* ``best_mia_auc/<method>``, ``best_mia_accuracy/<method>``: the strongest attack per cell;
* ``mia_accuracy_vs_utility_loss/<method>`` against ``step = round(1000 * utility loss)``;
* a custom-scalars layout "trade-off" overlaying the methods in multi-line charts;
* the hparams plugin (one session per cell), ROC figures, and every release's statement.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path

from torch.utils.tensorboard import SummaryWriter

from alm_opacus.report.plots import RocMap, roc_figure
from alm_opacus.report.results import ResultRow

#: TensorBoard steps are integers; epsilon is logged as round(epsilon * EPSILON_STEP).
EPSILON_STEP = 100
#: ... and utility loss (in the accuracy-vs-utility chart) as round(loss * UTILITY_STEP).
UTILITY_STEP = 1000
ATTACK_SCALARS = ("mia_auc", "mia_accuracy", "tpr_at_fpr_0_01", "eps_lower_bound")
LAYOUT_NAME = "trade-off"


def epsilon_step(epsilon: float) -> int:
    return round(epsilon * EPSILON_STEP)


class TensorBoardReporter:
    """Writes one event stream (plus one hparams session per cell) under ``logdir``."""

    def __init__(self, logdir: str | Path) -> None:
        self.logdir = Path(logdir)
        self.writer = SummaryWriter(log_dir=str(self.logdir))

    def add_cell(self, rows: Sequence[ResultRow], *, hparams: Mapping[str, object]) -> None:
        """Log one finished (method, epsilon, seed) cell: one row per attack (or one row)."""
        first = rows[0]
        best = max(rows, key=lambda r: -1.0 if math.isnan(r.mia_auc) else r.mia_auc)
        if not math.isinf(first.epsilon):
            step = epsilon_step(first.epsilon)
            w = self.writer
            w.add_scalar(f"test_accuracy/{first.method}", first.test_accuracy, step)
            w.add_scalar(f"utility_loss/{first.method}", first.utility_loss, step)
            for row in rows:
                if not row.attack:
                    continue
                for name in ATTACK_SCALARS:
                    value = getattr(row, name)
                    if not math.isnan(value):
                        w.add_scalar(f"{name}/{row.method}/{row.attack}", value, step)
            if best.attack:
                w.add_scalar(f"best_mia_auc/{first.method}", best.mia_auc, step)
                w.add_scalar(f"best_mia_accuracy/{first.method}", best.mia_accuracy, step)
                w.add_scalar(
                    f"mia_accuracy_vs_utility_loss/{first.method}", best.mia_accuracy,
                    round(first.utility_loss * UTILITY_STEP),
                )  # fmt: skip
        metrics = {"hparam/test_accuracy": first.test_accuracy,
                   "hparam/utility_loss": first.utility_loss}  # fmt: skip
        if best.attack:
            metrics |= {"hparam/best_mia_auc": best.mia_auc,
                        "hparam/best_mia_accuracy": best.mia_accuracy}  # fmt: skip
        params = {k: (v if isinstance(v, int | float | str | bool) else str(v))
                  for k, v in hparams.items()}  # fmt: skip
        params |= {"method": first.method, "epsilon": first.epsilon, "seed": first.seed}
        run = f"hparams/{first.method}/eps={first.epsilon:g}/seed={first.seed}"
        self.writer.add_hparams(params, metrics, run_name=run)
        self.writer.add_text(
            f"statement/{first.method}/eps={first.epsilon:g}/seed={first.seed}", first.statement
        )

    def add_layout(self, methods: Sequence[str]) -> None:
        """The custom-scalars layout "trade-off": multi-line charts overlaying the methods."""
        protected = [m for m in methods if m != "none"]

        def lines(prefix: str) -> list[str]:
            return [f"{prefix}/{m}" for m in protected]

        self.writer.add_custom_scalars(
            {
                LAYOUT_NAME: {
                    "utility loss vs epsilon (x = 100 epsilon)": [
                        "Multiline", lines("utility_loss")],
                    "MIA AUC vs epsilon (x = 100 epsilon)": ["Multiline", lines("best_mia_auc")],
                    "MIA accuracy vs epsilon (x = 100 epsilon)": [
                        "Multiline", lines("best_mia_accuracy")],
                    "MIA accuracy vs utility loss (x = 1000 utility loss)": [
                        "Multiline", lines("mia_accuracy_vs_utility_loss")],
                }
            }
        )  # fmt: skip

    def add_rocs(self, rocs: RocMap) -> None:
        """ROC figures (log-log) per epsilon, as images in TensorBoard."""
        for epsilon in sorted({e for (_, e, _) in rocs if not math.isinf(e)}):
            self.writer.add_figure(f"roc/epsilon={epsilon:g}", roc_figure(rocs, epsilon=epsilon))

    def close(self) -> None:
        self.writer.flush()
        self.writer.close()
