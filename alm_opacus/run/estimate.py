"""A rough forecast of a run's wall time, for the first line a run prints.

The forecast is a sum of per-cell costs measured once on 2 idle cores (digits, 150 members,
the default recipe and attacks, ``compare.py --methods all``), scaled by the square root of
the number of members over 150 (fitted to the same run on mnist, 1,000 members: about 10 min,
where a linear scale said 31), plus pre-training when the encoder is not cached. It is
meant to tell a user "two minutes" from "two hours" before anything runs; the progress bar
refines it. It never decides anything.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["Forecast", "forecast"]

#: Seconds per cell at :data:`_MEMBERS` members, by method (2 cores; measured with
#: ``compare.py --methods all --no-progress`` on digits, per-cell times from the progress
#: log). A method's first cell adds :data:`_FIRST_CELL` (its tuning, the sensitivity
#: sampler, the adaptive attacker's banks).
_CELL_SECONDS = {
    "none": 2.0,
    "no-leak": 2.0,
    "alm": 1.2,
    "laplace": 1.2,
    "gaussian": 1.2,
    "dperm": 1.5,
    "dpsgd": 6.5,
    "dpsgd-alm": 7.0,
    "dpsgd-laplace": 7.0,
    "lu": 8.0,
}
#: A method the table does not know: assume DP-SGD's cost (the dearest common one).
_UNKNOWN_CELL = 6.5
_FIRST_CELL = {"alm": 9.0, "laplace": 9.0, "gaussian": 9.0, "dperm": 5.0}
_MEMBERS = 150
#: How a cell's cost grows with the members (see the module docstring).
_EXPONENT = 0.5
#: Seconds per SimCLR epoch per 1,000 public images (small CNN, 2 cores: digits' 600
#: public images take 10 s for 60 epochs).
_EPOCH_PER_1000 = 0.28
#: Start-up (imports, data, split) and the views at the end (plots, TensorBoard, report).
_FIXED = 25.0


@dataclass(frozen=True)
class Forecast:
    """A run's forecast wall time, in seconds, and what it assumed."""

    seconds: float
    pretraining: float
    cells: int

    def text(self) -> str:
        """``about 2 min`` / ``about 40 s`` / ``about 3.5 h``, rounded as a forecast should be."""
        s = self.seconds
        if s < 90:
            return f"about {10 * round(s / 10):.0f} s"
        if s < 90 * 60:
            return f"about {max(2, round(s / 60)):.0f} min"
        return f"about {s / 3600:.1f} h"


def forecast(
    *,
    cells: Sequence[tuple[str, int]],
    members: int,
    public_images: int = 0,
    epochs: int = 0,
    encoder_cached: bool = True,
) -> Forecast:
    """The forecast wall time of a run on 2 cores.

    Args:
        cells: ``(method, noise_draws)`` per cell still to run.
        members: members in the private split (the cost of a cell grows with them).
        public_images: images the encoder pre-trains on (0 for a dataset of features).
        epochs: SimCLR epochs.
        encoder_cached: whether the encoder is already in its cache (no pre-training).

    Returns:
        The :class:`Forecast`.
    """
    scale = max(1.0, members / _MEMBERS) ** _EXPONENT
    seen: set[str] = set()
    total = 0.0
    for method, _draws in cells:
        total += _CELL_SECONDS.get(method, _UNKNOWN_CELL) * scale
        if method not in seen:
            seen.add(method)
            total += _FIRST_CELL.get(method, 0.0) * scale
    pretraining = 0.0 if encoder_cached else _EPOCH_PER_1000 * epochs * public_images / 1000
    return Forecast(seconds=_FIXED + total + pretraining, pretraining=pretraining, cells=len(cells))
