"""Conform JSON facts read back from a snapshot to the shape the judges were written for.

A snapshot directory may be edited by hand, pasted together or written by another version: a fact can
hold a list where a dict belongs, a string where a number belongs, nulls, NaN. Each fact loader declares
its shape once and calls `conform_fact`; what comes out has every declared key, `None` (or the field's
default) wherever the value had the wrong type, and no list or map items of the wrong type. The judges
then never meet a type they were not written for, and no check needs its own isinstance guards.

Shapes: the scalar types `str`, `int`, `float` (an int is accepted; NaN and infinities are not) and
`bool` (never confused with int either way); `Record` (a dict with declared keys), `Nullable(Record)`
(a section that may be absent as a whole), `Maybe(shape)` (a value or null), `ListOf(shape)` and
`MapOf(shape)` (string keys). `find_mismatch` is the strict counterpart of `conform`: it says where a
value departs from its shape (used at the edge to refuse a malformed snapshot file with one finding).
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass, field
from typing import Any, Mapping, Optional, Union


@dataclass(frozen=True)
class Record:
    """A dict with these keys; `defaults` replace None (e.g. `{}` for a map that is never null)."""

    fields: Mapping[str, Any]
    defaults: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Nullable:
    """A Record that is None as a whole when absent or of the wrong type (not a record full of Nones)."""

    shape: Record


@dataclass(frozen=True)
class Maybe:
    """A value of `shape`, or null (a field the producer leaves None when it cannot tell)."""

    shape: Any


@dataclass(frozen=True)
class ListOf:
    item: Any
    limit: int = 100_000  # a damaged file must not make a judge loop for minutes


@dataclass(frozen=True)
class MapOf:
    value: Any


@dataclass(frozen=True)
class InRange:
    """An integer a reading can have (`low` to `high`): a GPU with -79 GiB of memory or a count below
    zero is a damaged or forged file, never a reading to judge (or to plan with)."""

    low: int
    high: int


@dataclass(frozen=True)
class Loose:
    """`shape`, checked only where the value has its kind (an object for a Record, an integer for an
    InRange): anything else fits, left to the reader that conforms it. For facts whose reader drops
    wrong-typed parts but whose impossible readings must still be refused."""

    shape: Any


Shape = Union[type, Record, Nullable, Maybe, ListOf, MapOf, InRange, Loose]


def _loose_applies(value: Any, shape: Any) -> bool:
    if isinstance(shape, InRange):
        return isinstance(value, int) and not isinstance(value, bool)
    if isinstance(shape, (Record, MapOf)):
        return isinstance(value, Mapping)
    if isinstance(shape, ListOf):
        return isinstance(value, list)
    return True


_KIND_NAMES = {
    str: "a string",
    int: "an integer",
    float: "a number",
    bool: "true or false",
    dict: "an object",
    list: "a list",
}


def _kind_of(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true or false"
    if isinstance(value, (int, float)):
        return "a number" if isinstance(value, float) else "an integer"
    return _KIND_NAMES.get(type(value), type(value).__name__)


def _wanted(shape: Any) -> str:
    if isinstance(shape, (Record, Nullable, MapOf)):
        return "an object"
    if isinstance(shape, ListOf):
        return "a list"
    if isinstance(shape, Maybe):
        return _wanted(shape.shape) + " or null"
    if isinstance(shape, InRange):
        return f"an integer from {shape.low} to {shape.high}"
    if isinstance(shape, Loose):
        return _wanted(shape.shape)
    return _KIND_NAMES.get(shape, getattr(shape, "__name__", str(shape)))


def find_mismatch(value: Any, shape: Shape, where: str = "") -> Optional[str]:
    """The first place where `value` does not have `shape`, said plainly ("`.vm`: a string where an
    object belongs"), or None when it fits. Strict, unlike `conform`: null fits only Maybe and
    Nullable; absent Record keys and extra keys fit (hand-built snapshots omit what they lack)."""
    if isinstance(shape, Maybe):
        return None if value is None else find_mismatch(value, shape.shape, where)
    if isinstance(shape, Loose):
        return find_mismatch(value, shape.shape, where) if _loose_applies(value, shape.shape) else None
    if isinstance(shape, Nullable):
        return None if value is None else find_mismatch(value, shape.shape, where)
    ok: bool
    if isinstance(shape, Record):
        ok = isinstance(value, Mapping)
    elif isinstance(shape, MapOf) or shape is dict:
        ok = isinstance(value, Mapping)
    elif isinstance(shape, ListOf) or shape is list:
        ok = isinstance(value, list)
    elif shape is bool:
        ok = isinstance(value, bool)
    elif shape is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif isinstance(shape, InRange):
        ok = isinstance(value, int) and not isinstance(value, bool)
        if ok and not shape.low <= value <= shape.high:
            shown = str(value) if abs(value) < 10**30 else f"a {len(str(abs(value)))}-digit number"
            return f"`{where or '(top level)'}`: {shown}, not a reading that can be ({_wanted(shape)})"
    elif shape is float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    else:
        ok = isinstance(value, shape)
    if not ok:
        return f"`{where or '(top level)'}`: {_kind_of(value)} where {_wanted(shape)} belongs"
    if isinstance(shape, Record):
        for key, sub in shape.fields.items():
            if key in value:
                found = find_mismatch(value[key], sub, f"{where}.{key}")
                if found:
                    return found
    elif isinstance(shape, MapOf):
        for key, item in value.items():
            found = find_mismatch(item, shape.value, f"{where}.{key}")
            if found:
                return found
    elif isinstance(shape, ListOf):
        for i, item in enumerate(value[: shape.limit]):
            found = find_mismatch(item, shape.item, f"{where}[{i}]")
            if found:
                return found
    return None


def describe_shape(shape: Any) -> str:
    """A shape in a compact JSON-like notation, for the docs: `{"name": string, "mtu": integer|null}`,
    `[string]`, `{<name>: ...}`."""
    if isinstance(shape, Record):
        return "{" + ", ".join(f'"{k}": {describe_shape(v)}' for k, v in shape.fields.items()) + "}"
    if isinstance(shape, (Nullable, Maybe)):
        return describe_shape(shape.shape) + "|null"
    if isinstance(shape, ListOf):
        return f"[{describe_shape(shape.item)}]"
    if isinstance(shape, MapOf):
        return "{<name>: " + describe_shape(shape.value) + "}"
    if isinstance(shape, InRange):
        return f"integer ({shape.low}..{shape.high})"
    if isinstance(shape, Loose):
        return describe_shape(shape.shape)
    names = {str: "string", int: "integer", float: "number", bool: "boolean", dict: "object", list: "list"}
    return names.get(shape, getattr(shape, "__name__", str(shape)))


def _fits(value: Any, shape: Any) -> bool:
    """Whether a list or map item has the container type its shape asks for (scalars always fit)."""
    if isinstance(shape, (Record, Nullable, MapOf)):
        return isinstance(value, Mapping)
    if isinstance(shape, ListOf):
        return isinstance(value, list)
    return True


def _scalar(value: Any, kind: Any) -> Any:
    if isinstance(kind, InRange):
        ok = isinstance(value, int) and not isinstance(value, bool) and kind.low <= value <= kind.high
        return value if ok else None
    if isinstance(value, bool):
        return value if kind is bool else None
    if kind is float:
        return value if isinstance(value, (int, float)) and math.isfinite(value) else None
    return value if isinstance(value, kind) else None


def conform(value: Any, shape: Shape) -> Any:
    """`value` in `shape`: wrong-typed values become None (or the Record default); never raises."""
    if isinstance(shape, Record):
        source = value if isinstance(value, Mapping) else {}
        out = {}
        for key, sub in shape.fields.items():
            item = conform(source.get(key), sub)
            out[key] = copy.deepcopy(shape.defaults.get(key)) if item is None else item
        return out
    if isinstance(shape, Nullable):
        return conform(value, shape.shape) if isinstance(value, Mapping) else None
    if isinstance(shape, Maybe):
        return None if value is None else conform(value, shape.shape)
    if isinstance(shape, Loose):
        return conform(value, shape.shape)
    if isinstance(shape, ListOf):
        if not isinstance(value, list):
            return None
        items = (conform(v, shape.item) for v in value[: shape.limit] if _fits(v, shape.item))
        return [v for v in items if v is not None]
    if isinstance(shape, MapOf):
        if not isinstance(value, Mapping):
            return None
        return {
            k: conform(v, shape.value)
            for k, v in value.items()
            if isinstance(k, str) and _fits(v, shape.value)
        }
    return _scalar(value, shape)


def conform_fact(value: Any, shape: Union[Record, ListOf]) -> Optional[Any]:
    """A fact in its shape, or None (not available) when the stored value is not even a dict / list."""
    container = list if isinstance(shape, ListOf) else Mapping
    return conform(value, shape) if isinstance(value, container) else None
