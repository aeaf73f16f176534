"""Sizes for people: never "0 GiB", never rounded."""

from __future__ import annotations

import re
from fractions import Fraction

import pytest
from hypothesis import given
from hypothesis import strategies as st

from app.units import format_mib


@pytest.mark.parametrize(
    ("mib", "text"),
    [
        (0, "0 MiB"),
        (1, "1 MiB"),
        (512, "512 MiB"),  # below 1 GiB: MiB, not "0 GiB"
        (1023, "1023 MiB"),
        (1024, "1 GiB"),
        (1536, "1.5 GiB"),  # one decimal is exact
        (2560, "2.5 GiB"),
        (1300, "1300 MiB"),  # 1.3 GiB would be rounded: MiB instead
        (1126, "1126 MiB"),
        (81920, "80 GiB"),
        (1024 * 1024, "1024 GiB"),
        (-512, "-512 MiB"),
        (-1536, "-1.5 GiB"),
    ],
)
def test_sizes_print_in_the_largest_exact_unit(mib: int, text: str) -> None:
    assert format_mib(mib) == text


_SIZE = re.compile(r"^(-?\d+(?:\.\d)?) (MiB|GiB)$")


@given(st.integers(min_value=-(2**40), max_value=2**40))
def test_a_printed_size_reads_back_exactly(mib: int) -> None:
    text = format_mib(mib)
    found = _SIZE.match(text)
    assert found is not None, text
    number, unit = Fraction(found.group(1)), found.group(2)
    assert number * (1024 if unit == "GiB" else 1) == mib
    if unit == "GiB":
        assert abs(number) >= 1
