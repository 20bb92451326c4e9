"""Pure text parsers, one module per tool. Each module that backs `ddpdoctor parse` exposes
`PARSE_TOOLS = {"tool-name": function(text) -> JSON-able}`; they are discovered here."""

from __future__ import annotations

import dataclasses
import importlib
import pkgutil
from typing import Any, Callable


def load_parse_tools() -> dict[str, Callable[[str], Any]]:
    tools: dict[str, Callable[[str], Any]] = {}
    for info in pkgutil.iter_modules(__path__):
        module = importlib.import_module(f"{__name__}.{info.name}")
        tools.update(getattr(module, "PARSE_TOOLS", {}))
    return dict(sorted(tools.items()))


def recognised_nothing(value: Any) -> bool:
    """True when a parser's JSON holds no data at all: every leaf is None, empty or an empty container
    (`{"devices": [], "errors": []}` from another tool's output). False, 0 and other values count as
    data; so does an error the parser recognised (`"errors": ["No IB devices found"]`)."""
    if isinstance(value, dict):
        return all(recognised_nothing(v) for v in value.values())
    if isinstance(value, list):
        return all(recognised_nothing(v) for v in value)
    return value is None or value == ""


def to_jsonable(value: Any) -> Any:
    """Dataclasses, tuples and nested containers to plain JSON types."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: to_jsonable(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, dict):
        return {str(k): to_jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_jsonable(v) for v in value]
    return value
