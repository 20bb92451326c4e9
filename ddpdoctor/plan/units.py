"""Numbers as users write them: `7B` parameters, `80GiB` of memory. Pure parsing, no I/O."""

from __future__ import annotations

import math
import re

GIB = 1024**3

# Parameter counts are decimal (a "7B" model has 7e9 parameters), as model cards write them.
_COUNT_SUFFIX = {"": 1, "K": 10**3, "M": 10**6, "B": 10**9, "G": 10**9, "T": 10**12}
_COUNT = re.compile(r"^\s*(\d+(?:\.\d+)?|\.\d+)\s*([KMBGT]?)\s*$", re.IGNORECASE)
# Memory: binary units are exact (GPU memory is sized in GiB); decimal GB as vendors print them.
_BYTE_SUFFIX = {
    "": 1, "B": 1,
    "KIB": 1024, "MIB": 1024**2, "GIB": GIB, "TIB": 1024**4,
    "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
    "K": 1024, "M": 1024**2, "G": GIB, "T": 1024**4,
}  # fmt: skip
_BYTES = re.compile(r"^\s*(\d+(?:\.\d+)?|\.\d+)\s*([KMGT]?I?B?)\s*$", re.IGNORECASE)
# Nothing trained today comes near these; a bigger number is a typo, and floats lose integers past 2**53.
MAX_PARAMS = 10**15
MAX_BYTES = 2**50


def _shown(text: str) -> str:
    """The value as the error quotes it: a 4000-digit argument is named by its length, not echoed."""
    if len(text) <= 40:
        return repr(text)
    return f"{text[:12]!r}... ({len(text)} characters: too large)"


def parse_count(text: str) -> int:
    """`7B` -> 7_000_000_000; K, M, B (or G) and T are powers of 1000. ValueError when malformed."""
    m = _COUNT.match(text)
    if not m:
        raise ValueError(f"{_shown(text)} is not a parameter count (examples: 7B, 350M, 1.3B, 124439808)")
    value = float(m.group(1)) * _COUNT_SUFFIX[m.group(2).upper()]
    if not math.isfinite(value) or value < 1 or value > MAX_PARAMS:
        raise ValueError(f"{_shown(text)}: a parameter count must be between 1 and 1000T")
    return int(round(value))


def parse_bytes(text: str) -> int:
    """`80GiB` -> 85899345920. GiB/MiB are binary, GB/MB decimal, a bare G means GiB. ValueError if bad."""
    m = _BYTES.match(text)
    if not m or m.group(2).upper() not in _BYTE_SUFFIX:
        raise ValueError(f"{_shown(text)} is not a memory size (examples: 80GiB, 40GB, 24G, 16384MiB)")
    value = float(m.group(1)) * _BYTE_SUFFIX[m.group(2).upper()]
    if not math.isfinite(value) or value < 1 or value > MAX_BYTES:
        raise ValueError(f"{_shown(text)}: a memory size must be between 1 byte and 1 PiB")
    return int(value)


def to_gib(n_bytes: float) -> float:
    return n_bytes / GIB
