"""The forecast on a run's first line: a rough figure, but one that moves the right way."""

from __future__ import annotations

from alm_opacus.run.estimate import Forecast, forecast

GRID = [("none", 1), *[("alm", 5)] * 6, *[("dpsgd", 5)] * 6, ("no-leak", 1)]


def test_it_grows_with_the_work_and_drops_with_the_cache() -> None:
    small = forecast(cells=GRID, members=150)
    assert forecast(cells=GRID, members=1000).seconds > small.seconds
    assert forecast(cells=GRID[:3], members=150).seconds < small.seconds
    cold = forecast(cells=GRID, members=150, public_images=600, epochs=60, encoder_cached=False)
    assert cold.pretraining > 0 and cold.seconds == small.seconds + cold.pretraining
    # fewer members than the measured 150 cost no less than 150 (fixed costs dominate there)
    assert forecast(cells=GRID, members=10).seconds == small.seconds
    assert small.cells == len(GRID)


def test_an_unknown_method_is_assumed_dear() -> None:
    known = forecast(cells=[("alm", 5)] * 6, members=150).seconds
    assert forecast(cells=[("someone-elses", 5)] * 6, members=150).seconds > known


def test_it_is_said_as_a_forecast_is() -> None:
    assert Forecast(seconds=42.0, pretraining=0.0, cells=1).text() == "about 40 s"
    assert Forecast(seconds=200.0, pretraining=0.0, cells=1).text() == "about 3 min"
    assert Forecast(seconds=3 * 3600.0, pretraining=0.0, cells=1).text() == "about 3.0 h"
