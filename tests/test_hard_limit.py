"""The suite's guards for tests that start processes (``conftest.py``): a test marked
``hard_limit`` fails at its limit instead of hanging, and the process groups it started
through the ``processes`` fixture are killed with it."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

HERE = Path(__file__).resolve().parent

STUCK = """
import subprocess, sys, time
import pytest

@pytest.mark.hard_limit(2)
def test_stuck_in_a_sleep():
    time.sleep(3600)

@pytest.mark.hard_limit(2)
def test_stuck_waiting_for_a_child(processes, tmp_path):
    child = processes.popen([sys.executable, "-c", "import time; time.sleep(3600)"])
    (tmp_path.parent.parent / "child.pid").write_text(str(child.pid))
    child.wait()

def test_a_child_past_its_deadline_fails(processes):
    processes.run([sys.executable, "-c", "import time; time.sleep(3600)"], timeout=1)
"""


@pytest.mark.slow
@pytest.mark.hard_limit(300)
def test_a_stuck_test_fails_at_its_limit_and_its_children_end(
    tmp_path: Path, processes: Any
) -> None:
    shutil.copy(HERE / "conftest.py", tmp_path / "conftest.py")
    (tmp_path / "test_stuck.py").write_text(STUCK)
    env = {**os.environ, "ALM_OPACUS_TEST_TIME_SCALE": "1"}
    done = processes.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "--basetemp",
            str(tmp_path / "base"),
            str(tmp_path / "test_stuck.py"),
        ],
        timeout=240,
        check=False,
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    out = done.stdout
    assert done.returncode == 1, out
    assert "3 failed" in out, out
    assert out.count("ran past its hard limit") >= 2, out  # the sleep and the wait
    assert "did not finish in" in out and "killed with its process group" in out, out
    child = int((tmp_path / "child.pid").read_text())
    assert not Path(f"/proc/{child}").exists() or "zombie" in _state(child)


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/status").read_text().lower()
    except OSError:
        return "zombie"
