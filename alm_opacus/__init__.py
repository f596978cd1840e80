"""alm_opacus: post-training and during-training privacy protections, attacked alike."""

from __future__ import annotations

__version__ = "0.1.0"
