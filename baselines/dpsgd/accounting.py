"""DP-SGD accounting: the noise multiplier for a target, its cache, and the check after training.

sigma is a deterministic function of (epsilon, delta, sample rate, epochs, accountant, noise
mechanism, noised dimension) and the Opacus version, so it is searched once per key and
reused: within a run through a :class:`SigmaCache` held in the run's memo (``context.memo``;
never a module-level cache), and across runs through
``<cache_dir>/dpsgd_noise_multipliers.json``. Each entry records the digest of the code
that computed it (:data:`CODE`) and of its own fields; an entry that fails either check is
dropped (and searched again), never used. Each training run still checks the accountant's
epsilon afterwards (:func:`checked_epsilon`).
"""

from __future__ import annotations

import functools
import importlib.metadata
import json
import warnings
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import alm_opacus  # noqa: F401  (registers the "alm_pld" accountant when Opacus loads)
from alm_opacus.methods import InfeasibleRelease, MethodContext
from alm_opacus.plugin import StaleCacheWarning, atomic_write_json, code_digest, content_digest
from alm_opacus.training import noise_multiplier_for, training_mechanism
from baselines.dpsgd.config import DPSGDConfig, check_accountant, sample_rate_for, steps_per_epoch

__all__ = [
    "GAUSSIAN",
    "SIGMA_CACHE_FILE",
    "NoiseStep",
    "SigmaCache",
    "accountant_epsilon",
    "calibrated_sigma",
    "checked_epsilon",
    "epochs_match_steps",
    "quiet_opacus",
]

SIGMA_CACHE_FILE = "dpsgd_noise_multipliers.json"
#: The modules whose code finds sigma: an entry written by other code is searched again.
CODE = (
    "alm_opacus.accounting",
    "alm_opacus.training",
    "baselines.dpsgd.accounting",
    "baselines.dpsgd.config",
)
#: The mechanism of Opacus's own DP-SGD steps (kept in an accountant's ``history``).
GAUSSIAN = "gaussian"
#: A logistic or Laplace step entry of the ``alm_pld`` accountant (its ``noise_steps``):
#: ``(mechanism, noise_multiplier, sample_rate, steps, dim)``.
NoiseStep = tuple[str, float, float, int, int | None]
# (epsilon, delta, sample rate, epochs, accountant, mechanism, dim): the mechanism and the
# noised dimension are part of the key, so a logistic sigma never answers a Gaussian query.
_Key = tuple[float, float, float, int, str, str, int | None]


# Opacus is imported by the searches and checks below, not here: registering the methods (a
# run's plan, a resume's checks) then does not pay its import.


@functools.cache
def _opacus_version() -> str:
    """The installed Opacus's version, read without importing it (a cache entry's stamp)."""
    return importlib.metadata.version("opacus")


@contextmanager
def quiet_opacus() -> Iterator[None]:
    """Silence Opacus's warnings that the statement's notes already cover."""
    with warnings.catch_warnings():
        # Opacus's secure_mode needs torchcsprng; the noise source is stated in the notes.
        warnings.filterwarnings("ignore", message=".*[Ss]ecure RNG turned off.*")
        warnings.filterwarnings(
            "ignore", message=".*[Oo]ptimal order is the (largest|smallest) alpha.*"
        )
        # Opacus's hooks on a first layer whose inputs need no gradient (frozen features).
        warnings.filterwarnings("ignore", message=".*Using a non-full backward hook.*")
        warnings.filterwarnings("ignore", message=".*Full backward hook is firing.*")
        yield


def epochs_match_steps(sample_rate: float, epochs: int) -> bool:
    """Whether Opacus's step count for ``epochs`` (``int(epochs / q)``) equals the
    ``epochs * int(1 / q)`` steps its Poisson loader runs (float rounding: 3 epochs at
    q = 1/75 account 224 of 225 steps)."""
    return int(epochs / sample_rate) == epochs * steps_per_epoch(sample_rate)


class SigmaCache:
    """Noise multipliers and post-training epsilons of one run.

    Args:
        cache_dir: where :data:`SIGMA_CACHE_FILE` is read and written; ``None``: memory only.
    """

    def __init__(self, cache_dir: str | Path | None = None) -> None:
        self.cache_dir = None if cache_dir is None else Path(cache_dir)
        self._sigmas: dict[_Key, float] = {}
        self._spent: dict[tuple[Any, ...], float] = {}
        self._load()

    @classmethod
    def of(cls, context: MethodContext) -> SigmaCache:
        """The run's cache (one per run and cache folder, held in ``context.memo``), in the
        public cache folder where there is one: a multiplier depends on ε, δ, the sampling
        rate, the steps and the mechanism only, never on a member's data."""
        where = context.public_cache_dir or context.cache_dir
        folder = None if where is None else str(where)
        return context.memo.get(("dpsgd-sigmas", folder), lambda: cls(folder))

    def __len__(self) -> int:
        return len(self._sigmas)

    def cached(
        self,
        *,
        epsilon: float,
        delta: float,
        sample_rate: float,
        epochs: int,
        accountant: str,
        mechanism: str = GAUSSIAN,
        dim: int | None = None,
    ) -> float | None:
        """The noise multiplier for this key, or None if not yet known."""
        key = _key(epsilon, delta, sample_rate, epochs, accountant, mechanism, dim)
        return self._sigmas.get(key)

    def noise_multiplier(
        self,
        *,
        epsilon: float,
        delta: float,
        sample_rate: float,
        epochs: int,
        accountant: str,
        mechanism: str = GAUSSIAN,
        dim: int | None = None,
    ) -> tuple[float, bool]:
        """sigma for ``epochs`` of Opacus's Poisson loader at ``sample_rate``, and whether it
        was known already.

        Gaussian: Opacus's own search (``get_noise_multiplier``, which
        ``make_private_with_epsilon`` calls with ``epochs``), given ``epochs`` where Opacus
        counts the steps right, else the true step count (:func:`epochs_match_steps`).
        Logistic (``alm``) and Laplace: ``alm_opacus.training.noise_multiplier_for`` (the
        ``alm_pld`` accountant's search, ``find_noise_multiplier``) over the
        ``epochs * int(1 / q)`` steps the loader runs, with the ``dim`` noised coordinates
        the optimizer's hook records. A new value is saved to the cache file.

        Args:
            mechanism: the steps' noise, ``"gaussian"``, ``"alm"`` or ``"laplace"``.
            dim: noised coordinates per step (the optimizer's ``noise_dim``); only
                non-Gaussian profiles depend on it.

        Raises:
            InfeasibleRelease: when no noise multiplier reaches the target.
            ValueError: for a non-Gaussian mechanism with an accountant other than
                ``alm_pld``.
        """
        key = _key(epsilon, delta, sample_rate, epochs, accountant, mechanism, dim)
        if key in self._sigmas:
            return self._sigmas[key], True
        if key[5] != GAUSSIAN:
            self._sigmas[key] = _mechanism_sigma(key)
            self._save()
            return self._sigmas[key], False
        by: dict[str, int] = (
            {"epochs": epochs}
            if epochs_match_steps(sample_rate, epochs)
            else {"steps": epochs * steps_per_epoch(sample_rate)}
        )
        from opacus.accountants.utils import get_noise_multiplier

        with quiet_opacus():
            try:
                sigma = get_noise_multiplier(
                    target_epsilon=epsilon,
                    target_delta=delta,
                    sample_rate=sample_rate,
                    accountant=accountant,
                    **by,
                )
            except ValueError as exc:  # Opacus: "The privacy budget is too low."
                raise InfeasibleRelease(
                    f"no noise multiplier reaches epsilon={epsilon:g} at delta={delta:g} with the "
                    f"{accountant} accountant over {epochs} epochs at Poisson rate "
                    f"{sample_rate:.4g}: {exc}"
                ) from exc
        self._sigmas[key] = float(sigma)
        self._save()
        return self._sigmas[key], False

    def spent(
        self,
        history: Sequence[Sequence[float]],
        *,
        delta: float,
        accountant: str,
        noise_steps: Sequence[NoiseStep] = (),
    ) -> float:
        """The accountant's epsilon at ``delta`` for an Opacus ``history`` of Gaussian
        ``(noise_multiplier, sample_rate, steps)`` and the ``alm_pld`` accountant's logistic
        or Laplace ``noise_steps`` (deterministic: computed once per key)."""
        entries = tuple((float(s), float(q), int(t)) for s, q, t in history)
        others = _noise_steps(noise_steps)
        key = (entries, others, float(delta), accountant)
        if key not in self._spent:
            self._spent[key] = _epsilon_of(
                entries, delta=delta, accountant=accountant, noise_steps=others
            )
        return self._spent[key]

    def _path(self) -> Path | None:
        return None if self.cache_dir is None else self.cache_dir / SIGMA_CACHE_FILE

    def _load(self, *, warn: bool = True) -> None:
        path = self._path()
        try:
            entries = json.loads(path.read_text()) if path is not None else []
        except (OSError, ValueError):
            return
        code, dropped = code_digest(*CODE), 0
        for e in entries if isinstance(entries, list) else []:
            if not _entry_checks(e, code=code):
                dropped += 1
                continue
            if isinstance(e, dict) and e.get("opacus") == _opacus_version():
                try:  # entries written before mechanisms were keyed are Gaussian
                    key = _key(
                        e["epsilon"],
                        e["delta"],
                        e["sample_rate"],
                        e["epochs"],
                        e["accountant"],
                        e.get("mechanism", GAUSSIAN),
                        e.get("dim"),
                    )
                    self._sigmas.setdefault(key, float(e["noise_multiplier"]))
                except (KeyError, TypeError, ValueError):
                    continue
        if dropped and warn:
            warnings.warn(
                f"{path}: {dropped} entries written by other code, or altered, are "
                "not used; searching them again",
                StaleCacheWarning,
                stacklevel=2,
            )

    def _save(self) -> None:
        """Write the multipliers (merged with the file's) atomically; a read-only cache only
        costs time."""
        path = self._path()
        if path is None:
            return
        self._load(warn=False)
        fields = ("epsilon", "delta", "sample_rate", "epochs", "accountant", "mechanism", "dim")
        code = code_digest(*CODE)
        entries = [
            _signed(
                {
                    "opacus": _opacus_version(),
                    **dict(zip(fields, k, strict=True)),
                    "noise_multiplier": v,
                    "code": code,
                }
            )
            for k, v in sorted(self._sigmas.items())
        ]
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            atomic_write_json(path, entries)
        except OSError:
            pass


def _signed(entry: dict[str, Any]) -> dict[str, Any]:
    return {**entry, "digest": content_digest(entry)}


def _entry_checks(entry: Any, *, code: str) -> bool:
    """Whether a cache entry was written by this code and is unaltered since."""
    if not isinstance(entry, dict) or entry.get("code") != code:
        return False
    fields = {k: v for k, v in entry.items() if k != "digest"}
    try:
        return bool(entry.get("digest") == content_digest(fields))
    except TypeError:
        return False


def _key(
    epsilon: Any,
    delta: Any,
    sample_rate: Any,
    epochs: Any,
    accountant: Any,
    mechanism: Any = GAUSSIAN,
    dim: Any = None,
) -> _Key:
    name = training_mechanism(str(mechanism)).name
    # Gaussian profiles are the same in every dimension: dim is not part of their key.
    d = None if dim is None or name == GAUSSIAN else int(dim)
    return (float(epsilon), float(delta), float(sample_rate), int(epochs), str(accountant), name, d)


def _mechanism_sigma(key: _Key) -> float:
    """sigma of a logistic or Laplace key, by the ``alm_pld`` accountant's own search."""
    from opacus.accountants import create_accountant

    epsilon, delta, q, epochs, accountant, mechanism, dim = key
    with quiet_opacus():
        return float(
            noise_multiplier_for(
                accountant=create_accountant(check_accountant(accountant)),
                target_epsilon=epsilon,
                target_delta=delta,
                sample_rate=q,
                steps=epochs * steps_per_epoch(q),
                noise_mechanism=mechanism,
                dim=dim,
            )
        )


def _noise_steps(noise_steps: Sequence[NoiseStep]) -> tuple[NoiseStep, ...]:
    return tuple(
        (str(m), float(s), float(q), int(t), None if d is None else int(d))
        for m, s, q, t, d in noise_steps
    )


def accountant_epsilon(
    *, noise_multiplier: float, sample_rate: float, steps: int, delta: float, accountant: str
) -> float:
    """Epsilon of ``steps`` DP-SGD steps from a fresh Opacus accountant (an independent check)."""
    return _epsilon_of([(noise_multiplier, sample_rate, steps)], delta=delta, accountant=accountant)


def _epsilon_of(
    history: Sequence[tuple[float, float, int]],
    *,
    delta: float,
    accountant: str,
    noise_steps: Sequence[NoiseStep] = (),
) -> float:
    from opacus.accountants import create_accountant

    from alm_opacus.accounting import PipelineAccountant

    acc = create_accountant(check_accountant(accountant))
    acc.history = list(history)
    if noise_steps and not isinstance(acc, PipelineAccountant):
        raise ValueError(
            f"accountant={accountant!r} accounts for Gaussian steps only; logistic or Laplace "
            "steps need accountant='alm_pld'"
        )
    for mechanism, sigma, q, steps, dim in noise_steps:
        acc.step(
            noise_multiplier=sigma, sample_rate=q, mechanism=mechanism, dim=dim, num_steps=steps
        )
    with quiet_opacus():
        return float(acc.get_epsilon(delta=delta))


def checked_epsilon(
    history: Sequence[Sequence[float]],
    *,
    epsilon: float,
    delta: float,
    accountant: str,
    cache: SigmaCache | None = None,
    noise_steps: Sequence[NoiseStep] = (),
) -> tuple[float, int]:
    """The accountant's epsilon at ``delta`` after training, and the steps it counted.

    Args:
        history: the engine accountant's Gaussian ``(noise_multiplier, sample_rate, steps)``
            entries.
        epsilon: the target.
        delta: the target delta.
        accountant: the accountant's name.
        cache: reuses the value for an identical history (default: computed afresh).
        noise_steps: the ``alm_pld`` accountant's logistic or Laplace steps.

    Raises:
        RuntimeError: if it exceeds the target ``epsilon`` (the model is never released).
    """
    spent = (cache or SigmaCache()).spent(
        history, delta=delta, accountant=accountant, noise_steps=noise_steps
    )
    steps = sum(int(h[2]) for h in history) + sum(int(s[3]) for s in noise_steps)
    if not spent <= epsilon:
        raise RuntimeError(
            f"the {accountant} accountant reports epsilon={spent:.6g} > target {epsilon:g} "
            f"after {steps} steps; refusing to release"
        )
    return spent, steps


def calibrated_sigma(
    *,
    n: int,
    config: DPSGDConfig,
    epsilon: float,
    delta: float,
    accountant: str,
    mechanism: str,
    dim: int,
    sigmas: SigmaCache,
) -> tuple[float, bool]:
    """The noise multiplier :func:`~baselines.dpsgd.loop.fit_private` trains ``n`` rows with,
    and whether it was known already: the accountant's search at Opacus's sample rate
    ``1 / ceil(n / batch)`` for ``config.epochs`` of its Poisson loader (``dim``: the noised
    coordinates). Anything that must train with the same sigma as a run of ``fit_private``
    asks here.
    """
    return sigmas.noise_multiplier(
        epsilon=epsilon,
        delta=delta,
        sample_rate=sample_rate_for(n=n, batch_size=config.batch_size),
        epochs=config.epochs,
        accountant=accountant,
        mechanism=training_mechanism(mechanism).name,
        dim=dim,
    )
