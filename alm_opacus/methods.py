"""The method registry: every protection turns member features into a :class:`Release`.

What a method is (:class:`Method`, :class:`Release`, the context) is defined in
:mod:`alm_opacus.method_base` and re-exported here. The registry holds the built-in methods,
registered below by name (``none``, ``no-leak``, and
:mod:`alm_opacus.posttraining.method`'s ``alm``, ``laplace``, ``gaussian``,
``gaussian-classic``), and every plugin that registers itself
with :func:`register_method` once :func:`load_plugins` has imported it.

``alm_opacus`` never imports ``baselines``; baselines register themselves here, through the
``alm_opacus.methods`` entry point group.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import torch
from torch import Tensor

from alm_opacus._hashing import derive_seed
from alm_opacus.attacks import recipe_trainer
from alm_opacus.attacks.base import ShadowTrainer
from alm_opacus.errors import InfeasibleRelease
from alm_opacus.heads import train_head
from alm_opacus.method_base import (
    INPUT_KINDS,
    AttackerFactory,
    InputKind,
    Method,
    MethodContext,
    NoisePolicy,
    Predict,
    Release,
    ReleaseRequest,
    RunMemo,
    TrainingNoise,
)
from alm_opacus.options import (
    MethodFlag,
    MethodOptions,
    NoOptions,
    OptionError,
    build_options,
    cli_option,
    collect_flags,
    option_fields,
    split_scoped,
)
from alm_opacus.registry import Registry, declare_builtins, load_entry_points
from alm_opacus.statement import PrivacyStatement

__all__ = [
    "INPUT_KINDS",
    "METHODS",
    "PLUGIN_GROUP",
    "AttackerFactory",
    "InfeasibleRelease",
    "InputKind",
    "Method",
    "MethodContext",
    "MethodFlag",
    "MethodOptions",
    "MethodPluginError",
    "NoOptions",
    "NoisePolicy",
    "Predict",
    "Release",
    "ReleaseRequest",
    "RunMemo",
    "ShadowTrainer",
    "TrainingNoise",
    "available_methods",
    "cli_option",
    "create_method",
    "default_methods",
    "load_plugins",
    "method_class",
    "method_flags",
    "method_options",
    "plain_shadow_trainer",
    "reference_methods",
    "register_method",
    "validate_options",
]

#: The entry point group of method plugins (``baselines`` registers through it).
PLUGIN_GROUP = "alm_opacus.methods"
# The post-training methods register through the same group as every plugin: the group
# imports them first, then the installed plugins (this module never imports them by name).
declare_builtins(PLUGIN_GROUP, "alm_opacus.posttraining.method")


def plain_shadow_trainer(context: MethodContext) -> ShadowTrainer:
    """Shadow heads trained with the victim's recipe, without protection."""
    return recipe_trainer(config=context.head, num_classes=context.num_classes)


_M = TypeVar("_M", bound=type[Method[Any, Any]])


class MethodPluginError(ImportError):
    """A method plugin (entry point of :data:`PLUGIN_GROUP`) that fails to import."""


def load_plugins() -> list[str]:
    """Import the packages that register methods through the ``alm_opacus.methods`` entry
    point group (e.g. ``baselines``), so ``alm_opacus`` never imports them by name. Once per
    process; lookups call it on a miss.

    Returns:
        The names of the entry points loaded by this call (empty after the first).

    Raises:
        MethodPluginError: naming an entry point that fails to import.
    """
    return load_entry_points(
        PLUGIN_GROUP,
        what="method",
        error=MethodPluginError,
        expected="a module that registers its methods on import",
    )


#: Method classes by name: the built-ins, then the plugins (loaded on the first miss).
METHODS: Registry[type[Method[Any, Any]]] = Registry("method", load=load_plugins)


def register_method(name: str, *, force: bool = False) -> Callable[[_M], _M]:
    """Decorator registering a method class under ``name``.

    Raises:
        ValueError: if ``name`` is taken and ``force`` is false.
    """
    return METHODS.register(name, force=force)


def available_methods() -> list[str]:
    """Registered method names, sorted (plugins included)."""
    return METHODS.names()


def default_methods() -> list[str]:
    """What ``all`` expands to: the registered methods that are not opt-in, sorted."""
    return [name for name, cls in METHODS.items() if cls.in_all]


def reference_methods() -> list[str]:
    """The reference releases every run that attacks adds (``Method.reference``), sorted."""
    return [name for name, cls in METHODS.items() if cls.reference]


def method_class(name: str) -> type[Method[Any, Any]]:
    """The class registered as ``name``.

    Raises:
        alm_opacus.registry.UnknownName: (a ValueError) for an unknown name, listing the
            registered ones.
    """
    return METHODS[name]


def method_options(name: str, values: Mapping[str, Any] | None = None) -> MethodOptions:
    """The options of method ``name`` from run-config values.

    ``values`` holds shared keys (``"m"``: set in every method declaring ``m``; others
    ignore it) and scoped keys (``"dpsgd.lr"``: this method only, and it must declare it).

    Raises:
        ValueError: for an unknown method; OptionError for a bad key or value.
    """
    cls = method_class(name).Options
    values = dict(values or {})
    scoped = {k.split(".", 1)[1] for k in values if "." in k and k.split(".")[0] == name}
    unknown = sorted(scoped - set(option_fields(cls)))
    if unknown:
        known = ", ".join(sorted(option_fields(cls))) or "none"
        raise OptionError(f"unknown option {name}.{unknown[0]}: {name} declares {known}")
    return build_options(cls, split_scoped(values, method=name), method=name, strict=False)


def validate_options(values: Mapping[str, Any]) -> None:
    """Check run-config option values against every registered method.

    Raises:
        OptionError: for a scoped key of an unknown method or field, a shared key that no
            registered method declares, or a value that does not fit.
    """
    declared: set[str] = set()
    for name in available_methods():
        declared |= set(option_fields(method_class(name).Options))
    for key in values:
        if "." in key:
            scope = key.split(".")[0]
            if scope not in METHODS:
                raise OptionError(
                    f"option {key}: unknown method {scope!r}; expected one of "
                    f"{', '.join(available_methods())}"
                )
        elif key not in declared:
            raise OptionError(
                f"unknown option {key!r}: no registered method declares it (scope it as "
                "METHOD.KEY, or see --help for the shared ones)"
            )
    for name in available_methods():
        method_options(name, values)


def method_flags() -> tuple[MethodFlag, ...]:
    """The command-line flags the registered methods' options declare (``cli_option``),
    plugins included: one per distinct key, with the methods that read it.

    Raises:
        OptionError: for two methods that declare one flag in ways that disagree.
    """
    return collect_flags({name: method_class(name).Options for name in available_methods()})


def create_method(
    name: str, options: MethodOptions | Mapping[str, Any] | None = None
) -> Method[Any, Any]:
    """Instantiate the method ``name`` with its options (a mapping is validated strictly:
    every key must be one of the method's fields).

    Raises:
        ValueError: for an unknown name, listing the registered ones; OptionError for bad
            options.
    """
    cls = method_class(name)
    if options is None or isinstance(options, MethodOptions):
        return cls(options)
    return cls(build_options(cls.Options, options, method=name, strict=True))


class NoProtection(Method[NoOptions, Any]):
    """The unprotected head: the baseline every utility loss is measured against."""

    name = "none"
    post_training = True
    baseline = True

    def prepare(
        self, *, features: Tensor, labels: Tensor, seed: int, context: MethodContext
    ) -> Any:
        return train_head(
            features.to(context.device),
            labels.to(context.device),
            num_classes=context.num_classes,
            config=context.head,
            seed=seed,
        )

    def release(self, prepared: Any, request: ReleaseRequest) -> Release:
        head, context = prepared, request.context
        return Release(
            method=self.name,
            statement=PrivacyStatement.unprotected(),
            predict_proba=lambda x: head.predict_proba(x.to(context.device)).float().cpu(),
            module=head,
            baseline=True,
        )


class NoLeakReference(NoProtection):
    """The no-leak reference: the unprotected recipe trained on as many public rows as there
    are members, so the release never saw a member or a non-member.

    Attacked like every release, its strongest-attack figures are what the same
    max-over-attacks statistic reads when nothing leaks: the attacks' selection (the largest
    AUC of many) and the evaluation set's sampling noise, with no membership signal. Every
    protection is read against it; it is never offered as one (``in_all`` is false, and the
    harness adds it itself).
    """

    name = "no-leak"
    baseline = False
    reference = True
    in_all = False

    def prepare(
        self, *, features: Tensor, labels: Tensor, seed: int, context: MethodContext
    ) -> Any:
        if context.public_features is None or context.public_labels is None:
            raise ValueError("the no-leak reference needs the public split's features")
        public = len(context.public_features)
        # the seed picks which public rows: a fresh draw of a data set like the members'
        generator = torch.Generator().manual_seed(derive_seed("no-leak", seed))
        rows = torch.randperm(public, generator=generator)[: min(len(features), public)]
        return super().prepare(
            features=context.public_features[rows],
            labels=context.public_labels[rows],
            seed=seed,
            context=context,
        )

    def release(self, prepared: Any, request: ReleaseRequest) -> Release:
        statement = dataclasses.replace(
            PrivacyStatement.unprotected(),
            notes=(
                "reference, not a protection: trained on public rows only, it never saw the "
                "members; its attack figures are the no-leak floor",
            ),
        )
        unprotected = super().release(prepared, request)
        return dataclasses.replace(unprotected, statement=statement, baseline=False)


# The harness's own baseline and reference live with the registry; every protection,
# built-in or not, registers through PLUGIN_GROUP.
register_method(NoProtection.name)(NoProtection)
register_method(NoLeakReference.name)(NoLeakReference)
