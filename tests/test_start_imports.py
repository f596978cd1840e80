"""What a run's start imports: Opacus (about a second, sympy and scipy.signal with it) only
when something trains or accounts with it, never to register, plan or resume."""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

FreshPython = Callable[[str], subprocess.CompletedProcess[str]]


@pytest.mark.slow  # fresh interpreters import torch
def test_registering_and_planning_every_method_imports_no_opacus(
    tmp_path: Path, fresh_python: FreshPython
) -> None:
    code = f"""
import sys
from alm_opacus.methods import available_methods, load_plugins, method_class, method_options
from alm_opacus.run.config import RunConfig
from alm_opacus.run.plan import plan_run
load_plugins()
names = available_methods()
assert {{"dpsgd", "dpsgd-alm", "lu", "dperm", "alm"}} <= set(names), names
for name in names:
    method_class(name), method_options(name)
plan_run(RunConfig(methods=("alm", "dpsgd", "dpsgd-alm", "lu"), out={str(tmp_path / "run")!r}))
loaded = sorted(m for m in sys.modules if m.split(".")[0] in ("opacus", "sympy"))
assert not loaded, loaded
"""
    proc = fresh_python(code)
    assert proc.returncode == 0, proc.stderr


@pytest.mark.slow
@pytest.mark.parametrize("first", ["alm_opacus", "opacus"])
def test_the_alm_pld_accountant_is_registered_whichever_is_imported_first(
    first: str, fresh_python: FreshPython
) -> None:
    second = "opacus" if first == "alm_opacus" else "alm_opacus"
    code = f"""
import {first}, {second}
from opacus.accountants import create_accountant
from alm_opacus.accounting import PipelineAccountant
assert type(create_accountant("alm_pld")) is PipelineAccountant
"""
    proc = fresh_python(code)
    assert proc.returncode == 0, proc.stderr


def test_the_lazy_names_are_the_modules_names() -> None:
    # every name a package loads on first use is the defining module's own object
    import importlib

    from alm_opacus import accounting, training

    for package, exports in (
        (accounting, accounting._OPACUS_EXPORTS),
        (training, training._EXPORTS),
    ):
        assert set(exports) <= set(package.__all__)
        for name, module in exports.items():
            assert getattr(package, name) is getattr(importlib.import_module(module), name)
        assert set(exports) <= set(dir(package))
    with pytest.raises(AttributeError, match="no attribute 'nothing'"):
        training.nothing  # noqa: B018
