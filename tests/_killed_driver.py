"""The command line, killed (SIGKILL) by itself right after its N-th cell is written (not
collected by pytest): `test_executors_ray.py` uses it to kill a driver at a known point,
instead of polling ``results.csv`` from outside and racing the driver's writes.

    python tests/_killed_driver.py N [compare.py arguments ...]
"""

from __future__ import annotations

import os
import signal
import sys
from typing import Any

from alm_opacus.run import writer
from alm_opacus.run.cli import main


def _dies_after(cells: int) -> None:
    add = writer.RunWriter.add
    written = 0

    def add_then_die(self: Any, outcome: Any) -> None:
        nonlocal written
        add(self, outcome)  # results.csv is rewritten atomically inside
        written += 1
        if written >= cells:
            os.kill(os.getpid(), signal.SIGKILL)

    writer.RunWriter.add = add_then_die  # type: ignore[method-assign]


if __name__ == "__main__":
    _dies_after(int(sys.argv[1]))
    sys.exit(main(sys.argv[2:]))
