"""TensorBoard output: per-method scalars against epsilon, statements as text."""

from __future__ import annotations

import math
from pathlib import Path

from torch.utils.tensorboard import SummaryWriter

from alm_opacus.report.results import ResultRow

#: TensorBoard steps are integers; epsilon is logged as round(epsilon * EPSILON_STEP).
EPSILON_STEP = 100
SCALARS = ("test_accuracy", "utility_loss", "mia_auc", "mia_accuracy", "tpr_at_fpr_0_01")


def epsilon_step(epsilon: float) -> int:
    return int(round(epsilon * EPSILON_STEP))


class TensorBoardReporter:
    """Writes one event stream under ``<out>/tb``; tags are ``<metric>/<method>[/<attack>]``."""

    def __init__(self, logdir: str | Path) -> None:
        self.logdir = Path(logdir)
        self.writer = SummaryWriter(log_dir=str(self.logdir))

    def add_row(self, row: ResultRow) -> None:
        """Log the scalars of a finished cell (``none`` has no epsilon axis: text only)."""
        if not math.isinf(row.epsilon):
            step = epsilon_step(row.epsilon)
            suffix = f"/{row.attack}" if row.attack else ""
            for name in SCALARS:
                value = getattr(row, name)
                if math.isnan(value):
                    continue
                if name in ("test_accuracy", "utility_loss"):
                    if row.attack not in ("", "best"):
                        continue  # identical across attacks: log once
                    tag = f"{name}/{row.method}"
                else:
                    tag = f"{name}/{row.method}{suffix}"
                self.writer.add_scalar(tag, value, global_step=step)

    def add_statement(self, *, method: str, epsilon: float, seed: int, statement: str) -> None:
        tag = f"statement/{method}/eps={epsilon:g}/seed={seed}"
        self.writer.add_text(tag, statement)

    def close(self) -> None:
        self.writer.flush()
        self.writer.close()
