"""Imports deferred until they are needed, so that a start stays light.

``after_import("opacus", "alm_opacus.accounting.accountant")`` imports the accountant right
after ``opacus`` finishes executing (or at once when it already has), so that a registration
into Opacus happens whenever Opacus is used, while ``import alm_opacus`` alone stays light.
`lazy_exports` gives a package the module ``__getattr__`` and ``__dir__`` (PEP 562) that import
each public name's module on its first use.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
from collections.abc import Callable, Mapping, Sequence
from types import ModuleType
from typing import Any

__all__ = ["after_import", "lazy_exports"]


class _AfterImport(importlib.abc.MetaPathFinder):
    """A finder that wraps the loader of one module so that ``then`` is imported after it."""

    def __init__(self, name: str, then: str) -> None:
        self.name = name
        self.then = then

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != self.name:
            return None
        sys.meta_path.remove(self)  # once: the other finders locate the module
        spec = importlib.util.find_spec(fullname)
        loader = spec.loader if spec is not None else None
        if spec is None or loader is None or not hasattr(loader, "exec_module"):
            return spec
        run = loader.exec_module
        then = self.then

        def exec_module(module: ModuleType) -> None:
            run(module)
            importlib.import_module(then)

        loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


def after_import(name: str, then: str) -> None:
    """Import module ``then`` once module ``name`` has been imported (now, if it has).

    Args:
        name: a top-level module (e.g. ``"opacus"``).
        then: the module to import after it.
    """
    if name in sys.modules:
        importlib.import_module(then)
        return
    if not any(isinstance(f, _AfterImport) and f.name == name for f in sys.meta_path):
        sys.meta_path.insert(0, _AfterImport(name, then))


def lazy_exports(
    package: str, exports: Mapping[str, str]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """A package's ``__getattr__`` and ``__dir__`` (PEP 562) for names defined in submodules.

    Args:
        package: the package's ``__name__``.
        exports: public name -> the module that defines it, imported on the name's first use;
            the value is then kept in the package's namespace.

    Returns:
        ``(__getattr__, __dir__)``, to assign at the package's top level.
    """
    namespace = sys.modules[package].__dict__

    def __getattr__(name: str) -> Any:
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        namespace[name] = value  # resolved once
        return value

    def __dir__() -> list[str]:
        return sorted({*namespace, *exports})

    return __getattr__, __dir__
