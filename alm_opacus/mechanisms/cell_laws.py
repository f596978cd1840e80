"""Cell-integrated noise laws: a symmetric continuous law rounded to the integers, its tails
in float64 (fast path) and as rigorous mpmath intervals (exact decisions), and its profiles.
"""

from __future__ import annotations

import abc
import contextlib
import math
import threading
from collections.abc import Iterator
from typing import ClassVar

import mpmath
import numpy as np
import torch
from numpy.typing import NDArray
from scipy import special

from alm_opacus.mechanisms.base import _load_noise_laws, create_mechanism
from alm_opacus.mechanisms.grid import Grid, cells_per_scale
from alm_opacus.registry import Registry

__all__ = [
    "CELL_LAWS",
    "CellLaw",
    "GaussianCells",
    "LaplaceCells",
    "LogisticCells",
    "cell_delta",
    "cell_law",
    "cell_log_pmf",
    "cell_pld",
]


class CellLaw(abc.ABC):
    """A symmetric continuous law Z of unit scale, rounded to the integers after scaling.

    At scale t (in cells), P(K = k) = P(|k| − ½ < |tZ| < |k| + ½)/(1 + [k ≠ 0]). Subclasses
    give the folded tail S(u) = P(|Z| > u): in float64 (and its inverse) for the fast path,
    rigorously as an mpmath interval for exact decisions, and its log for PMFs.
    """

    name: ClassVar[str]

    @abc.abstractmethod
    def inverse_tail_(self, v: torch.Tensor) -> torch.Tensor:
        """u ≥ 0 with S(u) = v for float64 v in (0, 1], computed in place (returns ``v``)."""

    def first_pass_(self, v: torch.Tensor, scale: float) -> torch.Tensor:
        """``scale`` times `inverse_tail_`, in place, as the first pass computes it (a faster
        form may err by up to 2⁻⁵²/V in absolute terms, which the first pass's margin
        covers)."""
        return self.inverse_tail_(v).mul_(scale)

    @abc.abstractmethod
    def log_tail(self, u: NDArray[np.float64]) -> NDArray[np.float64]:
        """ln S(u), float64, accurate in the far tail."""

    @abc.abstractmethod
    def tail_interval(self, u: mpmath.iv.mpf) -> mpmath.iv.mpf:
        """A rigorous enclosure of S(u) for an interval u ≥ 0 (at ``mpmath.iv``'s precision)."""


class LogisticCells(CellLaw):
    """Logistic: S(u) = 2/(1 + eᵘ), so u = ln((2 − v)/v)."""

    name = "alm"

    def inverse_tail_(self, v: torch.Tensor) -> torch.Tensor:
        return v.reciprocal_().mul_(2.0).sub_(1.0).log_()

    def log_tail(self, u: NDArray[np.float64]) -> NDArray[np.float64]:
        return np.asarray(math.log(2.0) - np.logaddexp(0.0, u), dtype=np.float64)

    def tail_interval(self, u: mpmath.iv.mpf) -> mpmath.iv.mpf:
        return 2 / (1 + mpmath.iv.exp(u))


class LaplaceCells(CellLaw):
    """Laplace: S(u) = e⁻ᵘ, so u = −ln v."""

    name = "laplace"

    def inverse_tail_(self, v: torch.Tensor) -> torch.Tensor:
        return v.log_().neg_()

    def first_pass_(self, v: torch.Tensor, scale: float) -> torch.Tensor:
        return v.log_().mul_(-scale)

    def log_tail(self, u: NDArray[np.float64]) -> NDArray[np.float64]:
        return np.asarray(-u, dtype=np.float64)

    def tail_interval(self, u: mpmath.iv.mpf) -> mpmath.iv.mpf:
        return mpmath.iv.exp(-u)


class GaussianCells(CellLaw):
    """Standard normal: S(u) = erfc(u/√2) = 2Φ(−u), so u = −Φ⁻¹(v/2)."""

    name = "gaussian"

    def inverse_tail_(self, v: torch.Tensor) -> torch.Tensor:
        return torch.special.ndtri(v.mul_(0.5), out=v).neg_()

    def first_pass_(self, v: torch.Tensor, scale: float) -> torch.Tensor:
        # √2·erfinv(1 − V): twice as fast as ndtri; 1 − V rounds by ≤ 2⁻⁵⁴, which moves u by
        # at most 2⁻⁵⁴ over the density (≥ V·√(2/π)): under 2⁻⁵²/V
        return torch.erfinv(torch.sub(1.0, v, out=v), out=v).mul_(math.sqrt(2.0) * scale)

    def log_tail(self, u: NDArray[np.float64]) -> NDArray[np.float64]:
        return np.asarray(math.log(2.0) + special.log_ndtr(-u), dtype=np.float64)

    def tail_interval(self, u: mpmath.iv.mpf) -> mpmath.iv.mpf:
        return _erfc_interval(u / mpmath.iv.sqrt(2))


_IV_LOCK = threading.RLock()


@contextlib.contextmanager
def _iv_precision(bits: int) -> Iterator[None]:
    """Set ``mpmath.iv``'s working precision (global state: serialised by a lock)."""
    with _IV_LOCK:
        old = mpmath.iv.prec
        mpmath.iv.prec = bits
        try:
            yield
        finally:
            mpmath.iv.prec = old


def _erfc_interval(x: mpmath.iv.mpf) -> mpmath.iv.mpf:
    """Rigorous erfc(x) for an interval x ≥ 0: the alternating Maclaurin series of erf with
    its remainder bounded by the first omitted term (terms decrease once n + 1 > x²), in
    interval arithmetic at a precision that absorbs the cancellation in 1 − erf."""
    iv = mpmath.iv
    x_hi = float(x.b)
    base = iv.prec
    extra = int(3.0 * x_hi * x_hi) + 32  # the largest term is ~e^{x²}; erfc is ~e^{-x²}
    with _iv_precision(base + extra):
        x2 = x * x
        power = iv.mpf(x)  # x^{2n+1}/n!
        total = iv.mpf(0)
        n = 0
        tiny = iv.mpf(2) ** (-(base + extra))
        while True:
            term = power / (2 * n + 1)
            if n + 1 > x_hi * x_hi and term.b < tiny.a:
                total += iv.mpf([-term.b, term.b])  # alternating remainder
                break
            total = total - term if n % 2 else total + term
            n += 1
            power = power * x2 / n
        out = 1 - 2 / iv.sqrt(iv.pi) * total
    return out


#: Cell laws by canonical mechanism name, each registered with its noise law
#: (`alm_opacus.noise_laws`; ``gaussian-classic`` draws the Gaussian's).
CELL_LAWS: Registry[CellLaw] = Registry("cell law", load=_load_noise_laws)


def cell_law(mechanism: object) -> CellLaw:
    """The cell law of a mechanism (an instance or a registry name).

    Raises:
        ValueError: for a mechanism without an exact cell law.
    """
    name = getattr(mechanism, "name", None) if not isinstance(mechanism, str) else None
    if name is None:
        name = create_mechanism(str(mechanism)).name
    law = CELL_LAWS.get(name)
    if law is None:
        raise ValueError(
            f"mechanism {name!r} has no exact cell law: expected one of {CELL_LAWS.names()}"
        )
    return law


# --------------------------------------------------------------------------------------------
# Profiles of the cell laws (scalar, exact by summation) and their PLDs.
# --------------------------------------------------------------------------------------------


def cell_log_pmf(mechanism: object, *, scale: float, grid: Grid, k: NDArray[np.int64]) -> NDArray:
    """ln P(K = k) of the cell law at ``scale`` on ``grid`` (float64, accurate in the tails)."""
    law = cell_law(mechanism)
    t = cells_per_scale(scale, grid)
    a = np.abs(np.asarray(k, dtype=np.float64))
    inner = law.log_tail(np.maximum(a - 0.5, 0.0) / t)
    outer = law.log_tail((a + 0.5) / t)
    with np.errstate(divide="ignore"):
        log_mass = inner + np.log(-np.expm1(outer - inner))
    return np.where(
        a == 0, np.log(-np.expm1(law.log_tail(np.full_like(a, 0.5 / t)))), log_mass - math.log(2.0)
    )


def _support(t: float, shift: int, tail: float) -> NDArray[np.int64]:
    width = math.ceil(tail * t) + abs(shift) + 2
    return np.arange(-width, width + 1, dtype=np.int64)


def cell_delta(
    mechanism: object, *, epsilon: float, scale: float, grid: Grid, shift: int, tail: float = 60.0
) -> float:
    """δ(ε) of the scalar pair (K, K + shift) by direct summation of max(0, p − e^ε q).

    The support is ±(tail·t + shift) cells; the mass beyond (below e^{-tail/…}) is added to
    the result, which therefore upper-bounds the exact sum.
    """
    t = cells_per_scale(scale, grid)
    k = _support(t, shift, tail)
    log_p = cell_log_pmf(mechanism, scale=scale, grid=grid, k=k)
    log_q = cell_log_pmf(mechanism, scale=scale, grid=grid, k=k - shift)
    p, q = np.exp(log_p), np.exp(log_q)
    missing = max(0.0, 1.0 - float(p.sum()))
    return float(np.maximum(p - math.exp(epsilon) * q, 0.0).sum()) + missing


def cell_pld(
    mechanism: object,
    *,
    scale: float,
    grid: Grid,
    shift: int,
    value_discretization_interval: float = 1e-4,
    tail: float = 60.0,
) -> object:
    """dp_accounting's PLD of the scalar pair (K, K + shift), built from the two PMFs."""
    from dp_accounting.pld import privacy_loss_distribution as pld

    t = cells_per_scale(scale, grid)
    k = _support(t, shift, tail)
    log_p = cell_log_pmf(mechanism, scale=scale, grid=grid, k=k)
    log_q = cell_log_pmf(mechanism, scale=scale, grid=grid, k=k - shift)
    upper = {int(i): float(v) for i, v in zip(k, log_p, strict=True) if np.isfinite(v)}
    lower = {int(i): float(v) for i, v in zip(k, log_q, strict=True) if np.isfinite(v)}
    return pld.from_two_probability_mass_functions(
        lower,
        upper,
        pessimistic_estimate=True,
        value_discretization_interval=value_discretization_interval,
    )
