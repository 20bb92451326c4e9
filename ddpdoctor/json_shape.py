"""Conform JSON facts read back from a snapshot to the shape the judges were written for.

A snapshot directory may be edited by hand, pasted together or written by another version: a fact can
hold a list where a dict belongs, a string where a number belongs, nulls, NaN. Each fact loader declares
its shape once and calls `conform_fact`; what comes out has every declared key, `None` (or the field's
default) wherever the value had the wrong type, and no list or map items of the wrong type. The judges
then never meet a type they were not written for, and no check needs its own isinstance guards.

Shapes: the scalar types `str`, `int`, `float` (an int is accepted; NaN and infinities are not) and
`bool` (never confused with int either way); `Record` (a dict with declared keys), `Nullable(Record)`
(a section that may be absent as a whole), `ListOf(shape)` and `MapOf(shape)` (string keys).
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
class ListOf:
    item: Any
    limit: int = 100_000  # a damaged file must not make a judge loop for minutes


@dataclass(frozen=True)
class MapOf:
    value: Any


Shape = Union[type, Record, Nullable, ListOf, MapOf]


def _fits(value: Any, shape: Any) -> bool:
    """Whether a list or map item has the container type its shape asks for (scalars always fit)."""
    if isinstance(shape, (Record, Nullable, MapOf)):
        return isinstance(value, Mapping)
    if isinstance(shape, ListOf):
        return isinstance(value, list)
    return True


def _scalar(value: Any, kind: type) -> Any:
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
