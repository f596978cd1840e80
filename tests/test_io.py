from __future__ import annotations

from pathlib import Path

import pytest

from alm_opacus.io import atomic_open, atomic_write_text


def test_atomic_write_keeps_old_content_when_interrupted(tmp_path: Path) -> None:
    target = tmp_path / "results.csv"
    atomic_write_text(target, "old\n")
    with pytest.raises(KeyboardInterrupt), atomic_open(target) as handle:
        handle.write("half a ro")
        raise KeyboardInterrupt
    assert target.read_text() == "old\n"
    assert [p.name for p in tmp_path.iterdir()] == ["results.csv"]  # no temporary left behind
