"""The one registry type every extension point uses (alm_opacus.registry)."""

from __future__ import annotations

import importlib
import importlib.metadata
import types

import pytest

from alm_opacus.registry import Registry, UnknownName, load_entry_points


def test_add_lookup_and_refusals() -> None:
    with Registry.isolated():
        reg: Registry[int] = Registry("widget")
        assert reg.add("b", 2) == 2
        reg.register("a")(1)
        assert reg["a"] == 1 and "b" in reg and "c" not in reg and 3 not in reg
        assert reg.names() == ["a", "b"] and reg.names(sort=False) == ["b", "a"]
        assert reg.items() == [("a", 1), ("b", 2)]
        reg.add("a", 1)  # the same object again (a re-imported module) is no conflict
        with pytest.raises(ValueError, match="widget 'a' is already registered; pass force"):
            reg.add("a", 5)
        reg.add("a", 5, force=True)
        assert reg["a"] == 5
        with pytest.raises(UnknownName, match="widget='z' is unknown: expected one of a, b"):
            reg["z"]
        with pytest.raises(ValueError, match="name='' is invalid"):
            reg.add("", 0)


def test_check_load_and_replace_hooks() -> None:
    replaced: list[str] = []

    def check(name: str, obj: int) -> None:
        if obj < 0:
            raise TypeError(f"{name}: negative")

    def load() -> None:
        if not loading:
            loading.append(True)
            reg.add("builtin", 7)

    loading: list[bool] = []
    reg: Registry[int] = Registry("gadget", check=check, load=load, on_replace=replaced.append)
    with pytest.raises(TypeError, match="x: negative"):
        reg.add("x", -1)
    assert reg["builtin"] == 7  # loaded on the first miss
    reg.add("builtin", 8, force=True)
    assert replaced == ["builtin"]


def test_isolated_restores_every_registry() -> None:
    reg: Registry[str] = Registry("thing")
    reg.add("kept", "k")
    with Registry.isolated():
        reg.add("toy", "t")
        reg.add("kept", "other", force=True)
    assert reg.items() == [("kept", "k")]


def test_entry_points_load_once_and_name_a_broken_plugin(monkeypatch: pytest.MonkeyPatch) -> None:
    module = types.ModuleType("plugin_mod")
    entries = {
        "ok": importlib.metadata.EntryPoint(name="ok", value="plugin_mod", group="g.test"),
        "obj": importlib.metadata.EntryPoint(name="obj", value="plugin_mod:X", group="g.test"),
    }
    objects = {"plugin_mod": module, "plugin_mod:X": 42}
    monkeypatch.setattr(importlib.metadata.EntryPoint, "load", lambda self: objects[self.value])
    chosen = ["ok"]
    monkeypatch.setattr(
        importlib.metadata,
        "entry_points",
        lambda *, group: [entries[n] for n in chosen] if group == "g.test" else [],
    )
    with Registry.isolated(reload=["g.test"]):
        assert load_entry_points("g.test", what="toy", error=RuntimeError) == ["ok"]
        assert load_entry_points("g.test", what="toy", error=RuntimeError) == []  # once
    chosen.append("obj")
    with Registry.isolated(reload=["g.test"]):
        with pytest.raises(RuntimeError, match=r"toy plugin 'obj' \(plugin_mod:X\) names 42"):
            load_entry_points("g.test", what="toy", error=RuntimeError, expected="a module")
        # a failure leaves the group unloaded: the next call reports it again, or accepts
        taken: list[object] = []

        def accept(entry: importlib.metadata.EntryPoint, obj: object) -> bool:
            taken.append(obj)
            return True

        found = load_entry_points("g.test", what="toy", error=RuntimeError, accept=accept)
        assert found == ["ok", "obj"] and taken == [42]


def test_an_unknown_method_is_named_with_the_registered_ones() -> None:
    from alm_opacus.methods import METHODS, method_class

    with pytest.raises(UnknownName) as caught:
        method_class("nosuch")
    assert str(caught.value) == (
        f"method='nosuch' is unknown: expected one of {', '.join(METHODS.names())}"
    )
    assert {"none", "alm"} <= set(METHODS.names())


def test_a_solver_outside_the_solver_names_is_refused_and_not_registered() -> None:
    from alm_opacus.heads import SOLVER_NAMES, SOLVERS, register_solver

    def solve(*args: object, **kwargs: object) -> None:
        raise AssertionError("never called")

    with pytest.raises(ValueError, match=r"solver name 'sgd' is invalid: expected one of"):
        register_solver("sgd")(solve)  # type: ignore[arg-type]
    assert "sgd" not in SOLVERS and set(SOLVERS.names()) == set(SOLVER_NAMES)


def test_declared_builtins_load_first_and_a_lookup_may_skip_loading(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from alm_opacus import registry as registry_module

    seen: list[str] = []
    entry = importlib.metadata.EntryPoint(name="plug", value="plug_mod", group="g.built")
    real_load, real_entry_points = (
        importlib.metadata.EntryPoint.load,
        importlib.metadata.entry_points,
    )

    def load(self: importlib.metadata.EntryPoint) -> object:
        if self.value != "plug_mod":
            return real_load(self)
        seen.append(self.value)
        return types.ModuleType(self.value)

    monkeypatch.setattr(importlib.metadata.EntryPoint, "load", load)
    monkeypatch.setattr(
        importlib.metadata,
        "entry_points",
        lambda **select: (
            [entry] if select.get("group") == "g.built" else real_entry_points(**select)
        ),
    )

    real_import = importlib.import_module

    def import_module(name: str) -> types.ModuleType:
        if name == "broken_mod":
            raise ImportError("no such module")
        if not name.startswith("builtin_"):
            return real_import(name)  # what Registry.isolated loads
        seen.append(name)
        return types.ModuleType(name)

    monkeypatch.setattr(registry_module.importlib, "import_module", import_module)
    monkeypatch.setitem(registry_module._BUILTINS, "g.built", ())
    registry_module.declare_builtins("g.built", "builtin_a", "builtin_b")
    with Registry.isolated(reload=["g.built"]):
        assert load_entry_points("g.built", what="toy", error=RuntimeError) == ["plug"]
        assert seen == ["builtin_a", "builtin_b", "plug_mod"]  # the package's own first
    monkeypatch.setitem(registry_module._BUILTINS, "g.built", ("broken_mod",))
    broken = pytest.raises(RuntimeError, match="toy module 'broken_mod' failed to load")
    with Registry.isolated(reload=["g.built"]), broken:
        load_entry_points("g.built", what="toy", error=RuntimeError)

    loads: list[int] = []
    reg: Registry[int] = Registry("gizmo", load=lambda: loads.append(1))
    assert reg.get("x", load=False) is None and loads == []
    assert reg.get("x") is None and loads == [1]
