"""Message sizes as nccl-tests writes them: K/M/G suffixes are powers of 1024 (`4M` = 4194304)."""

from __future__ import annotations

import re

_UNITS = {"": 1, "K": 1024, "M": 1024**2, "G": 1024**3, "T": 1024**4}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*([KMGT]?)(?:I?B)?\s*$", re.IGNORECASE)


def parse_size(text: str) -> int:
    """`"8"` -> 8, `"1K"` -> 1024, `"4M"` -> 4194304, `"1G"`/`"1GiB"`/`"1gb"` -> 1073741824.

    Like nccl-tests, every suffix is binary (M means MiB). Raises ValueError on anything else,
    on negative or fractional-byte results.
    """
    m = _SIZE.match(text)
    if not m:
        raise ValueError(f"not a size: {text!r} (use bytes or a K/M/G suffix, e.g. 8, 64K, 4M, 1G)")
    number, unit = m.group(1), m.group(2).upper()
    if len(number) > 24:  # int() of thousands of digits is slow, then a ValueError of its own
        raise ValueError(f"not a size: {number[:12]}... ({len(number)} digits)")
    if "." not in number:
        return int(number) * _UNITS[unit]  # exact: a float would turn 2**53 + 1 into 2**53
    value = float(number) * _UNITS[unit]
    if value != int(value):
        raise ValueError(f"size {text!r} is not a whole number of bytes")
    return int(value)


def format_size(n: int) -> str:
    """Bytes as the shortest exact binary unit: 1024 -> "1K", 4194304 -> "4M", 1000 -> "1000"."""
    for unit in ("T", "G", "M", "K"):
        factor = _UNITS[unit]
        if n >= factor and n % factor == 0:
            return f"{n // factor}{unit}"
    return str(n)


def check_size_range(min_bytes: int, max_bytes: int | None) -> None:
    """ValueError (a usage error) for --min-bytes/--max-bytes no benchmark can run: below 1 byte, or a
    maximum under the minimum. (A size too large for memory is the bench.max_bytes.too_large refusal.)"""
    for flag, value in (("--min-bytes", min_bytes), ("--max-bytes", max_bytes)):
        if value is None:
            continue
        if value < 1:
            raise ValueError(f"{flag} must be at least 1 byte, not {value}")
    if max_bytes is not None and max_bytes < min_bytes:
        raise ValueError(f"--max-bytes ({max_bytes}) is smaller than --min-bytes ({min_bytes})")


def size_sequence(min_bytes: int, max_bytes: int, step_factor: int = 2) -> list[int]:
    """Sizes from min to max, multiplying by step_factor each time (nccl-tests `-b -e -f`)."""
    if min_bytes < 1:
        raise ValueError("--min-bytes must be at least 1")
    if max_bytes < min_bytes:
        raise ValueError(f"--max-bytes ({max_bytes}) is smaller than --min-bytes ({min_bytes})")
    if step_factor < 2:
        raise ValueError("--step-factor must be at least 2")
    sizes = []
    size = min_bytes
    while size <= max_bytes:
        sizes.append(size)
        size *= step_factor
    return sizes
