"""parsers.numbers.parse_int: the one integer reader, its rule and hostile values."""

from __future__ import annotations

import re
from typing import Optional

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ddpdoctor.parsers.numbers import MAX_DIGITS, parse_int


@pytest.mark.parametrize(
    "value,kwargs,expected",
    [
        ("7", {}, 7),
        (" 7\n", {}, 7),
        ("+7", {}, 7),
        ("007", {}, 7),
        ("-7", {}, None),
        ("-7", {"signed": True}, -7),
        ("", {}, None),
        ("   ", {}, None),
        ("7.0", {}, None),
        ("1_0", {}, None),
        ("٣", {}, None),  # Arabic-Indic three: int() takes it, no launcher or tool writes it
        ("²", {}, None),  # str.isdigit() takes it, int() refuses it
        ("9" * 18, {}, 10**18 - 1),
        ("9" * 19, {}, None),
        ("9" * 5000, {}, None),  # int() would raise ValueError (the digit limit)
        ("123", {"max_digits": 2}, None),
        ("0x02c9", {}, None),
        ("0x02c9", {"hex_ok": True}, 0x02C9),
        ("0X1F", {"hex_ok": True}, 31),
        ("4123", {"hex_ok": True}, 4123),
        ("0x" + "f" * 40, {"hex_ok": True}, None),
        ("-0x1", {"hex_ok": True, "signed": True}, None),
        (7, {}, 7),
        (-7, {}, None),
        (-7, {"signed": True}, -7),
        (10**18, {}, None),
        (True, {}, None),  # bools are not ints
        (False, {"signed": True}, None),
        (7.0, {}, None),
        (None, {}, None),
        ([7], {}, None),
        ("7", {"text_ok": False}, None),
        (7, {"text_ok": False}, 7),
    ],
)
def test_parse_int(value: object, kwargs: dict, expected: Optional[int]) -> None:
    assert parse_int(value, **kwargs) == expected


def test_default_is_returned_for_anything_unreadable_but_not_for_zero() -> None:
    assert parse_int("abc", -1) == -1 and parse_int(True, default=0) == 0
    assert parse_int("0", -1) == 0 and parse_int(0, 5) == 0


_REFERENCE = re.compile(r"[+-]?[0-9]{1,18}")


@settings(max_examples=500, deadline=None)
@given(
    st.one_of(
        st.text(max_size=30),
        st.from_regex(r"\s?[+-]?[0-9]{1,22}\s?", fullmatch=True),
        st.integers(),
        st.booleans(),
        st.none(),
        st.floats(allow_nan=False),
    ),
    st.booleans(),
)
def test_matches_its_definition(value: object, signed: bool) -> None:
    result = parse_int(value, signed=signed)
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        expected = None
    elif isinstance(value, int):
        expected = value if abs(value) < 10**MAX_DIGITS else None
    else:
        text = value.strip()
        expected = int(text) if _REFERENCE.fullmatch(text) else None
    if expected is not None and expected < 0 and not signed:
        expected = None
    assert result == expected
