"""The one integer reader: a value from outside text (a tool's output, an environment variable, another
process's environ) or an outside document (JSON, a Flight Recorder dump) to an int, or None.

The rule, everywhere:

- bools are not ints (`True` from JSON is no rank and no count);
- an int is taken as it is, a str after stripping surrounding whitespace; anything else is None;
- text is ASCII decimal: `[+-]?[0-9]+`. Python's int() also takes '٣', '1_0' and ' 7 ', and
  str.isdigit() takes '²', which int() then refuses: neither is a number any tool or launcher writes;
- at most `max_digits` digits (18 by default: every rank, size, port, id or counter fits, and an int64
  holds it). int() of a 5000-digit string raises ValueError (Python's digit limit) rather than
  answering, and a hostile value is as malformed as `abc`; an int past the bound is refused the same way;
- a negative value only with `signed=True` (a '+' is always allowed, as int() allows it);
- `0x`-prefixed hexadecimal only with `hex_ok=True` (ibv_devinfo's vendor ids);
- text at all only with `text_ok=True` (the default): a JSON reader whose format writes numbers as
  numbers passes `text_ok=False`, so that `"5"` is not silently a count.
"""

from __future__ import annotations

import re
from typing import Optional, overload

MAX_DIGITS = 18

# Unbounded on purpose, with the length checked first: a linear fullmatch, never int() on a huge string.
_DECIMAL = re.compile(r"([+-]?)([0-9]+)")
_HEX = re.compile(r"\+?0[xX]([0-9a-fA-F]+)")


@overload
def parse_int(
    value: object,
    default: None = None,
    *,
    signed: bool = ...,
    max_digits: int = ...,
    hex_ok: bool = ...,
    text_ok: bool = ...,
) -> Optional[int]: ...


@overload
def parse_int(
    value: object,
    default: int,
    *,
    signed: bool = ...,
    max_digits: int = ...,
    hex_ok: bool = ...,
    text_ok: bool = ...,
) -> int: ...


def parse_int(
    value: object,
    default: Optional[int] = None,
    *,
    signed: bool = False,
    max_digits: int = MAX_DIGITS,
    hex_ok: bool = False,
    text_ok: bool = True,
) -> Optional[int]:
    """`value` as an int under the module's rule, else `default` (None unless given). Never raises."""
    if isinstance(value, bool):
        return default
    if isinstance(value, int):
        number = value
        if abs(number) >= 10**max_digits:
            return default
    elif isinstance(value, str) and text_ok:
        text = value.strip()
        # A sign, max_digits digits, or (hex) a 0x prefix and as many hex digits: anything longer is refused
        # before any regex or int() sees it.
        if not text or len(text) > max_digits + 3:
            return default
        hexa = _HEX.fullmatch(text) if hex_ok else None
        if hexa:
            number = int(hexa.group(1), 16)
            if number >= 10**max_digits:
                return default
        else:
            m = _DECIMAL.fullmatch(text)
            if not m or len(m.group(2)) > max_digits:
                return default
            number = int(text)
    else:
        return default
    if number < 0 and not signed:
        return default
    return number


# ASCII decimal, an optional fraction and exponent: float() also takes '٣.٥', '1_0', 'nan' and 'inf'.
_FLOAT = re.compile(r"([+-]?)(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]{1,3})?")
MAX_FLOAT_CHARS = 40


def parse_float(value: object, default: Optional[float] = None, *, signed: bool = False) -> Optional[float]:
    """`value` (an ASCII decimal text, or an int/float) as a finite float, else `default`. The rule of
    parse_int: no bools, no other scripts' digits, no text past MAX_FLOAT_CHARS, negative only with
    `signed`, and never nan or infinity. Never raises."""
    import math

    if isinstance(value, bool):
        return default
    if isinstance(value, (int, float)):
        number = float(value) if abs(value) < 1e300 else math.inf
    elif isinstance(value, str):
        text = value.strip()
        if not text or len(text) > MAX_FLOAT_CHARS or not _FLOAT.fullmatch(text):
            return default
        number = float(text)
    else:
        return default
    if not math.isfinite(number) or (number < 0 and not signed):
        return default
    return number
