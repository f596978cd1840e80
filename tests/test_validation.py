from __future__ import annotations

import numpy as np
import pytest

from alm_opacus._validation import check_integer, default_delta


def test_check_integer_returns_the_value_unchanged() -> None:
    assert check_integer(3, name="m") == 3
    value = np.int64(5)
    assert check_integer(value, name="m", numpy=True) is value
    assert check_integer(2, name="chunk_size", minimum=2) == 2


@pytest.mark.parametrize(
    ("value", "minimum", "numpy"),
    [
        (0, 1, False),
        (True, 1, False),
        (2.0, 1, False),
        ("3", 1, False),
        (1, 2, False),
        (np.int64(3), 1, False),
        (np.int64(0), 1, True),
        (np.float64(3), 1, True),
    ],
)
def test_check_integer_names_the_value_and_the_bound(
    value: object, minimum: int, numpy: bool
) -> None:
    expected = f"k={value!r} is invalid: expected an integer >= {minimum}"
    with pytest.raises(ValueError) as info:
        check_integer(value, name="k", minimum=minimum, numpy=numpy)  # type: ignore[type-var]
    assert str(info.value) == expected


def test_default_delta_keeps_its_message() -> None:
    assert default_delta(10) == 1e-5 and default_delta(1000000) == 1e-7
    with pytest.raises(ValueError, match=r"^n=0 is invalid: expected an integer >= 1$"):
        default_delta(0)
