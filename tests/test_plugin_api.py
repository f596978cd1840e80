"""`baselines` is a plugin: it imports alm_opacus through public names only.

A name is public when the module it comes from is not private (no ``_`` component) and lists
it in ``__all__`` (``alm_opacus.plugin`` gathers what plugins need from modules without
one). The lint rule in ``baselines/ruff.toml`` bans the private modules; this test checks
every name, including imports inside functions.
"""

from __future__ import annotations

import ast
import importlib
import types
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def private_imports(source: str) -> list[tuple[int, str]]:
    """``(line, "module.name")`` of every alm_opacus import in ``source`` that is not public."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not (isinstance(node, ast.ImportFrom) and node.module):
            continue
        if node.module.split(".")[0] != "alm_opacus":
            continue
        if any(part.startswith("_") for part in node.module.split(".")):
            found.extend((node.lineno, f"{node.module}.{a.name}") for a in node.names)
            continue
        module = importlib.import_module(node.module)
        public = set(getattr(module, "__all__", ()))
        for alias in node.names:
            if isinstance(getattr(module, alias.name, None), types.ModuleType):
                continue  # a public submodule
            if alias.name not in public:
                found.append((node.lineno, f"{node.module}.{alias.name}"))
    return found


def test_the_rule_tells_public_from_private() -> None:
    source = (
        "from alm_opacus.plugin import derive_seed\n"
        "from alm_opacus import mechanisms\n"
        "def f():\n"
        "    from alm_opacus._hashing import derive_seed\n"
        "    from alm_opacus.heads import clip_features\n"
        "    from alm_opacus.methods import _builtin_methods\n"
    )
    assert private_imports(source) == [
        (4, "alm_opacus._hashing.derive_seed"),
        (5, "alm_opacus.heads.clip_features"),  # heads has no __all__: not public
        (6, "alm_opacus.methods._builtin_methods"),
    ]


@pytest.mark.parametrize(
    "path",
    sorted(ROOT.joinpath("baselines").rglob("*.py")),
    ids=lambda p: p.relative_to(ROOT).as_posix(),
)
def test_baselines_import_only_public_names(path: Path) -> None:
    found = private_imports(path.read_text())
    assert not found, f"{path.relative_to(ROOT)} imports non-public names: " + ", ".join(
        f"line {line}: {name}" for line, name in found
    )


def test_the_plugin_module_exports_what_it_imports() -> None:
    plugin = importlib.import_module("alm_opacus.plugin")
    assert sorted(plugin.__all__) == sorted(
        n for n, v in vars(plugin).items() if not n.startswith("_") and n != "annotations"
    )


def test_built_in_methods_register_through_the_plugin_group() -> None:
    """The post-training methods are loaded by the same entry point group as ``baselines``:
    ``alm_opacus.methods`` never imports them by name."""
    from alm_opacus import registry
    from alm_opacus.methods import METHODS, PLUGIN_GROUP
    from alm_opacus.posttraining.method import POST_TRAINING_METHODS

    source = (ROOT / "alm_opacus" / "methods.py").read_text()
    imported = {
        node.module
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.ImportFrom) and node.module
    }
    assert not any(m.startswith("alm_opacus.posttraining") for m in imported), imported
    assert "alm_opacus.posttraining.method" in registry._BUILTINS[PLUGIN_GROUP]
    for cls in POST_TRAINING_METHODS:
        assert METHODS[cls.name] is cls
