"""The attack interface and the name -> class registry, with plugins from an entry point group.

An attack is fitted once on a :class:`~alm_opacus.attacks.context.ShadowContext` (the
attacker's pool, its trainer, and the banks of shadow/reference heads trained lazily from
them) and then scores any number of releases through :class:`TargetQuery`. ``fit`` has no
access to a target's membership.

Attacks are keyed by name (a string). The built-in names are the values of
:class:`~alm_opacus.attacks.base.AttackKind`; a package outside ``alm_opacus`` adds one by
registering a class, at import time with :func:`register_attack` or by declaring it in the
``alm_opacus.attacks`` entry point group (see ``docs/api.md``)::

    [project.entry-points."alm_opacus.attacks"]
    my-attack = "my_package.my_attack:MyAttack"
"""

from __future__ import annotations

import abc
import importlib.metadata
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar, TypeVar

import numpy as np
import numpy.typing as npt
from torch import Tensor

from alm_opacus.attacks.base import AttackConfig, AttackKind, BoolArray, FloatArray, Predictor
from alm_opacus.registry import Registry, load_entry_points

if TYPE_CHECKING:
    from alm_opacus.attacks.context import ShadowContext

PLUGIN_GROUP = "alm_opacus.attacks"
"""The entry point group attack plugins are loaded from."""

_NAME = re.compile(r"^[a-z0-9][a-z0-9_.-]*$")


class AttackPluginError(ValueError):
    """An entry point of :data:`PLUGIN_GROUP` failed to load or registered nothing usable."""


@dataclass(frozen=True)
class TargetQuery:
    """What an attack sees of one release: its probabilities on the evaluation examples.

    Attributes:
        proba: (q, C) the release's output probabilities (queried once).
        labels: (q,) the examples' labels.
        features: (q, d) the examples' features (to query the attacker's own reference heads).
        predict: the release's black box on features, for attacks that also query it on
            rows of their own (RMIA's population samples); ``None`` when the release is
            queried with other inputs than features (``AttackTarget.inputs``).
    """

    proba: FloatArray
    labels: npt.NDArray[np.int64]
    features: Tensor
    predict: Predictor | None = None


@dataclass(frozen=True)
class AttackScores:
    """An attack's output on one release.

    Attributes:
        scores: (q,) threshold-free scores, larger = more member-like.
        decisions: (q,) guesses at the threshold chosen on shadow data.
    """

    scores: FloatArray
    decisions: BoolArray


class Attack(abc.ABC):
    """A membership-inference attack: fitted on shadow data, then scores releases.

    Subclasses are registered with :func:`register_attack`, which sets :attr:`name`.

    Args:
        config: the attack configuration.
        seed: the attack's own seed.
    """

    name: ClassVar[str] = ""
    #: Whether :meth:`score` queries the release on rows of its own (``TargetQuery.predict``):
    #: such an attack is left out of releases queried with other inputs than features (e.g.
    #: ``dpsgd-full``'s images), whose ``predict`` is not given to attacks.
    queries_release: ClassVar[bool] = False
    #: The context's banks :meth:`fit` reads (``"shadow"``, ``"offline"``, ``"online"``;
    #: ``None``: unknown, e.g. a plugin's). When every attack of a preparation says, the banks
    #: are dropped as soon as their last reader is fitted (``runner.prepare_attacks``).
    banks: ClassVar[frozenset[str] | None] = None

    def __init__(self, *, config: AttackConfig, seed: int) -> None:
        self.config = config
        self.seed = int(seed)
        self.notes: tuple[str, ...] = ()

    @abc.abstractmethod
    def fit(self, context: ShadowContext) -> None:
        """Train whatever the attack needs on shadow data; never sees a target's membership."""

    def begin_fit(self, context: ShadowContext) -> Callable[[], None] | None:
        """:meth:`fit` in two parts: what reads ``context``, done now, and the rest, returned
        (reading only what the attack kept, never the context) or ``None``.
        ``runner.prepare_attacks`` may run the rest on a side thread beside the next attacks'
        fits, with the caller's intra-op thread count, so the fitted values are :meth:`fit`'s.
        Default: all of :meth:`fit`, now."""
        self.fit(context)
        return None

    @abc.abstractmethod
    def score(self, query: TargetQuery) -> AttackScores:
        """Scores and decisions for one release."""


_A = TypeVar("_A", bound=type[Attack])
ATTACKS: Registry[type[Attack]] = Registry("attack", load=lambda: load_attack_plugins())


def _check_name(name: str | AttackKind) -> str:
    key = name.value if isinstance(name, AttackKind) else name
    if not isinstance(key, str) or not _NAME.match(key):
        raise ValueError(
            f"attack name {name!r} is invalid: expected lower-case letters, digits, '-', '_' "
            "or '.', starting with a letter or digit"
        )
    return key


def register_attack(name: str | AttackKind, *, force: bool = False) -> Callable[[_A], _A]:
    """Class decorator registering an :class:`Attack` under ``name`` (sets ``cls.name``).

    Args:
        name: the attack's stable name, as ``results.csv``'s ``attack`` column shows it.
        force: replace an attack already registered under ``name``.

    Raises:
        ValueError: on an invalid name, a class that is not an :class:`Attack`, or a name
            already registered when ``force`` is false.
    """
    key = _check_name(name)

    def decorator(cls: _A) -> _A:
        if not (isinstance(cls, type) and issubclass(cls, Attack)):
            raise ValueError(f"register_attack({key!r}) expects an Attack subclass; got {cls!r}")
        ATTACKS.add(key, cls, force=force)
        cls.name = key
        return cls

    return decorator


def load_attack_plugins() -> list[str]:
    """Import the attacks of the :data:`PLUGIN_GROUP` entry points (once per process).

    An entry point may name a module (which registers its attacks on import) or an
    :class:`Attack` subclass (registered under the entry point's name unless the class
    registered itself).

    Returns:
        The names of the entry points loaded by this call (empty after the first call).

    Raises:
        AttackPluginError: naming the entry point that failed to import or that names an
            object which is neither a module nor an Attack subclass.
    """
    return load_entry_points(
        PLUGIN_GROUP,
        what="attack",
        error=AttackPluginError,
        accept=_accept_attack_class,
        expected="a module or an Attack subclass",
    )


def _accept_attack_class(entry: importlib.metadata.EntryPoint, obj: object) -> bool:
    if not (isinstance(obj, type) and issubclass(obj, Attack)):
        return False
    if obj not in ATTACKS.values():
        register_attack(entry.name)(obj)
    return True


def available_attacks() -> list[str]:
    """Registered attack names: the built-ins in :class:`AttackKind` order, then the others
    in registration order (plugins are loaded first)."""
    load_attack_plugins()
    names = ATTACKS.names(sort=False)
    builtin = [k.value for k in AttackKind if k.value in names]
    return builtin + [name for name in names if name not in builtin]


def attack_class(name: str | AttackKind | type[Attack]) -> type[Attack]:
    """The class registered under ``name`` (a class, e.g. from a run plan, is its own).

    Raises:
        ValueError: naming the unknown attack and listing the registered ones.
    """
    if isinstance(name, type):
        return name
    key = name.value if isinstance(name, AttackKind) else name
    found = ATTACKS.get(key)
    if found is not None:
        return found
    raise ValueError(f"attack={name!r} is unknown: expected one of {available_attacks()}")


def parse_attack_names(names: Sequence[str | AttackKind | type[Attack]]) -> list[type[Attack]]:
    """Validate a list of attacks (names or classes: non-empty, registered, no repeats).

    Returns:
        The attack classes, in order.

    Raises:
        ValueError: on an empty list, an unknown name or a repeated one.
    """
    if isinstance(names, str) or not names:
        raise ValueError(f"names={names!r} is invalid: expected a non-empty list of attack names")
    kinds = [attack_class(n) for n in names]
    if len({kind.name for kind in kinds}) != len(kinds):
        raise ValueError(f"names={list(names)!r} repeats an attack")
    return kinds
