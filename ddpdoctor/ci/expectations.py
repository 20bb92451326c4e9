"""The expectations file of `check --expect` / `bench-nccl --expect`: one TOML table per area saying what
a healthy node of a kind looks like. parse_expectations() rejects what it does not know: a typo must
never turn an expectation into a silent pass. The format is documented in docs/ci.md."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Optional

from ddpdoctor.parsers.numbers import parse_int

FORMAT_VERSION = 1
BENCH_OPS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce", "all_to_all", "sendrecv")
LINK_LAYERS = {"infiniband": "InfiniBand", "ethernet": "Ethernet"}


class ExpectationsError(ValueError):
    """The expectations file cannot be used (syntax, unknown key, wrong type): a usage error."""


# --- the file ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Expectations:
    """What a healthy node of one type looks like; None means 'not expected, not judged'."""

    path: str = ""
    name: str = ""
    gpu_model: Optional[str] = None
    gpu_count: Optional[int] = None
    driver_min: Optional[str] = None
    cuda_min: Optional[str] = None
    nvlink_active_links_min: Optional[int] = None  # per GPU
    nccl_min: Optional[str] = None
    hca_count: Optional[int] = None
    hca_rate_gbps: Optional[float] = None
    hca_link_layer: Optional[str] = None
    kernel_modules: tuple[str, ...] = ()
    shm_min_bytes: Optional[int] = None
    busbw_min_gbps: Mapping[str, float] = field(default_factory=dict)

    @property
    def label(self) -> str:
        return self.name or Path(self.path).name or "expectations"


# Bounded digit runs: a 400-digit size is a typo, and as a float it is infinity (an OverflowError).
_SIZE = re.compile(r"^\s*(?P<num>\d{1,15}(?:\.\d{1,9})?)\s*(?P<unit>[KMGT]?)(?:i?B?)?\s*$", re.I)
_UNITS = {"": 1, "K": 1024, "M": 1024**2, "G": 1024**3, "T": 1024**4}


def parse_size(value: Any) -> int:
    """`16G`, `16GiB`, `512M`, `1.5G` or a number of bytes -> bytes (powers of 1024)."""
    if isinstance(value, bool):
        raise ValueError(f"not a size: {value!r}")
    if isinstance(value, int):
        if value < 0:
            raise ValueError(f"not a size: {value!r} (negative)")
        return value
    m = _SIZE.match(str(value))
    if not m:
        raise ValueError(f"not a size: {value!r} (use e.g. 16G, 512M or bytes)")
    return int(float(m.group("num")) * _UNITS[m.group("unit").upper()])


def format_size(n: int) -> str:
    """Exact size in the expectations file's syntax (`16G`, `1536M`): parse_size reads it back."""
    for unit in ("T", "G", "M", "K"):
        if n >= _UNITS[unit] and n % _UNITS[unit] == 0:
            return f"{n // _UNITS[unit]}{unit}"
    return str(n)


def human_size(n: int) -> str:
    """A size for people: `23.5 GiB`, `16 GiB`, `512 B` (one decimal, dropped when it is 0)."""
    for unit in ("T", "G", "M", "K"):
        if n >= _UNITS[unit]:
            value = f"{n / _UNITS[unit]:.1f}".removesuffix(".0")
            return f"{value} {unit}iB"
    return f"{n} B"


def parse_version(value: Any) -> Optional[tuple[int, ...]]:
    """`535.104.05`, `12.2`, `2.18.1`, (2, 18, 1), or an NCCL version code (21801) -> a tuple; None if
    unreadable."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, (list, tuple)):
        try:
            return tuple(int(x) for x in value)
        except (TypeError, ValueError):
            return None
    if isinstance(value, int):
        # NCCL_VERSION_CODE: major*10000+minor*100+patch since 2.9, major*1000+minor*100+patch before.
        if value >= 20900:
            return (value // 10000, value // 100 % 100, value % 100)
        if value >= 1000:
            return (value // 1000, value // 100 % 10, value % 100)
        return (value,)
    parts = re.findall(r"\d+", str(value).split("+")[0])
    return tuple(int(p) for p in parts) if parts else None


def show_version(v: Optional[tuple[int, ...]]) -> str:
    return ".".join(str(x) for x in v) if v else "?"


# Where each key of the file goes: table -> key -> (field, converter).
def _str(v: Any) -> str:
    if not isinstance(v, str) or not v.strip():
        raise ValueError("must be a non-empty string")
    if v != v.strip():
        # "Ethernet " or "H100 " is a typo in a file people copy between clusters: say so, do not guess.
        raise ValueError(f"{v!r} has leading or trailing spaces")
    return v


def _version(v: Any) -> str:
    text = str(v) if isinstance(v, (str, int, float)) and not isinstance(v, bool) else ""
    if not parse_version(text):
        raise ValueError('must be a version such as "535.104.05"')
    return text


def _count(v: Any) -> int:
    # TOML already typed it: text ("8") is refused, as are bools, negatives and absurd sizes.
    n = parse_int(v, text_ok=False)
    if n is None:
        raise ValueError("must be a whole number >= 0")
    return n


def _positive(v: Any) -> float:
    # nan compares false with everything: `rate_gbps = nan` would pass every port. inf is no rate either.
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
        raise ValueError("must be a number > 0 (finite: not nan or inf)")
    return float(v)


def _link_layer(v: Any) -> str:
    key = _str(v).lower()
    if key not in LINK_LAYERS:
        raise ValueError(f"must be one of {', '.join(LINK_LAYERS.values())}")
    return LINK_LAYERS[key]


def _modules(v: Any) -> tuple[str, ...]:
    if not isinstance(v, list) or not all(isinstance(x, str) and x.strip() for x in v):
        raise ValueError('must be a list of module names, e.g. ["nvidia_peermem"]')
    return tuple(_str(x) for x in v)


_SCHEMA: dict[str, dict[str, tuple[str, Callable[[Any], Any]]]] = {
    "gpu": {
        "model": ("gpu_model", _str),
        "count": ("gpu_count", _count),
        "driver_min": ("driver_min", _version),
        "cuda_min": ("cuda_min", _version),
        "nvlink_active_links_min": ("nvlink_active_links_min", _count),
    },
    "nccl": {"version_min": ("nccl_min", _version)},
    "rdma": {
        "hca_count": ("hca_count", _count),
        "rate_gbps": ("hca_rate_gbps", _positive),
        "link_layer": ("hca_link_layer", _link_layer),
    },
    "kernel": {"modules": ("kernel_modules", _modules)},
    "system": {"shm_min": ("shm_min_bytes", parse_size)},
}


def parse_expectations(data: Mapping[str, Any], path: str = "") -> Expectations:
    """Validate a parsed TOML document; raises ExpectationsError naming the offending key."""
    values: dict[str, Any] = {"path": path}
    for key, value in data.items():
        where = f"{path or 'expectations'}: {key}"
        if key == "format":
            if value != FORMAT_VERSION:
                raise ExpectationsError(f"{where} = {value!r}: this ddpdoctor reads format {FORMAT_VERSION}")
        elif key == "name":
            values["name"] = str(value)
        elif key == "busbw_min_gbps":
            if not isinstance(value, Mapping):
                raise ExpectationsError(f"{where} must be a table of op = GB/s")
            busbw = {}
            for op, gbps in value.items():
                if op not in BENCH_OPS:
                    raise ExpectationsError(f"{where}.{op}: unknown op; known: {', '.join(BENCH_OPS)}")
                try:
                    busbw[op] = _positive(gbps)
                except ValueError as exc:
                    raise ExpectationsError(f"{where}.{op} {exc}") from None
            values["busbw_min_gbps"] = busbw
        elif key in _SCHEMA:
            if not isinstance(value, Mapping):
                raise ExpectationsError(f"{where} must be a table ([{key}])")
            for sub, sub_value in value.items():
                if sub not in _SCHEMA[key]:
                    known = ", ".join(_SCHEMA[key])
                    raise ExpectationsError(f"{where}.{sub}: unknown key; known in [{key}]: {known}")
                name, convert = _SCHEMA[key][sub]
                try:
                    values[name] = convert(sub_value)
                except ValueError as exc:
                    raise ExpectationsError(f"{where}.{sub} {exc}") from None
        else:
            known = ", ".join(["format", "name", "busbw_min_gbps", *_SCHEMA])
            raise ExpectationsError(f"{where}: unknown key; known: {known}")
    return Expectations(**values)


def load_expectations(path: Path) -> Expectations:
    """Read and validate an expectations TOML file; raises ExpectationsError on any problem."""
    from ddpdoctor.edge.files import TOML_FILE_LIMIT, load_toml_text, read_user_bytes

    try:
        data = load_toml_text(read_user_bytes(path, TOML_FILE_LIMIT).decode("utf-8"))
    except OSError as exc:
        raise ExpectationsError(f"cannot read {path}: {exc.strerror or exc}") from None
    except ValueError as exc:  # TOMLDecodeError, UnicodeDecodeError, nesting
        raise ExpectationsError(f"{path} is not valid TOML: {exc}") from None
    return parse_expectations(data, str(path))
