"""The one registry type every extension point uses (alm_opacus.registry)."""

from __future__ import annotations

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
