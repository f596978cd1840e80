"""Additive noise mechanisms: ALM (logistic), Laplace, analytic and classic Gaussian.

``create_mechanism(name)`` returns an object with ``calibrate``, ``sample``, ``epsilon``,
``delta``, ``std`` and ``guarantee``; names: ``alm`` (alias ``logistic``), ``laplace``,
``gaussian``, ``gaussian-classic``. Stateless maths lives in `alm_opacus.mechanisms.analysis`.
"""

from __future__ import annotations

from alm_opacus.mechanisms import analysis
from alm_opacus.mechanisms.base import (
    AdditiveNoiseMechanism,
    PureAdditiveNoiseMechanism,
    available_mechanisms,
    create_mechanism,
    register_mechanism,
)
from alm_opacus.mechanisms.gaussian import ClassicGaussianMechanism, GaussianMechanism
from alm_opacus.mechanisms.laplace import LaplaceMechanism
from alm_opacus.mechanisms.logistic import LogisticMechanism
from alm_opacus.mechanisms.sampling import (
    NoiseGenerator,
    SecureGenerator,
    is_secure,
    make_generator,
)

__all__ = [
    "AdditiveNoiseMechanism",
    "ClassicGaussianMechanism",
    "GaussianMechanism",
    "LaplaceMechanism",
    "LogisticMechanism",
    "NoiseGenerator",
    "PureAdditiveNoiseMechanism",
    "SecureGenerator",
    "analysis",
    "available_mechanisms",
    "create_mechanism",
    "is_secure",
    "make_generator",
    "register_mechanism",
]
