"""`ulimit -a` output (bash 4/5 and dash layouts) to a mapping of limit flag -> value."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Optional

from ddpdoctor.parsers.numbers import parse_int

# bash: "max locked memory       (kbytes, -l) 64"; bash >= 5.1 adds "(microseconds, -R)" lines.
_BASH_LINE = re.compile(
    r"^(?P<name>.+?)\s*\((?:(?P<unit>[^,)]*),\s*)?-(?P<flag>[A-Za-z])\)\s+(?P<value>\S+)\s*$"
)
# dash/busybox: "locked memory(kbytes) 64", "nofiles              1024"
_DASH_NAMES = {
    "locked memory": "l",
    "nofiles": "n",
    "open files": "n",
    "stack": "s",
    "coredump": "c",
    "memory": "m",
    "process": "u",
    "virtual memory": "v",
}
_DASH_LINE = re.compile(r"^(?P<name>[a-z ]+?)(?:\((?P<unit>[^)]*)\))?\s+(?P<value>\S+)\s*$")


@dataclass(frozen=True)
class Limit:
    flag: str
    name: str
    unit: str
    value: Optional[int]  # None means unlimited

    @property
    def unlimited(self) -> bool:
        return self.value is None

    def bytes(self) -> Optional[int]:
        if self.value is None:
            return None
        scale = {"kbytes": 1024, "blocks": 512, "bytes": 1, "512 bytes": 512}.get(self.unit, 1)
        return self.value * scale


@dataclass
class Ulimits:
    limits: dict[str, Limit] = field(default_factory=dict)

    def get(self, flag: str) -> Optional[Limit]:
        return self.limits.get(flag)


def _value(text: str) -> Optional[int]:
    """None for unlimited; ValueError for anything the one integer reader refuses (another script's
    digits, a negative limit, more than 18 digits)."""
    if text == "unlimited":
        return None
    number = parse_int(text)
    if number is None:
        raise ValueError(f"not a limit: {text[:40]!r}")
    return number


def parse_ulimit(text: str) -> Ulimits:
    """Parse `ulimit -a`; lines that match neither layout are ignored."""
    out = Ulimits()
    for line in text.splitlines():
        line = line.rstrip()
        m = _BASH_LINE.match(line)
        if m:
            try:
                value = _value(m.group("value"))
            except ValueError:
                continue
            flag = m.group("flag")
            out.limits[flag] = Limit(flag, m.group("name").strip(), (m.group("unit") or "").strip(), value)
            continue
        m = _DASH_LINE.match(line)
        if m and m.group("name").strip() in _DASH_NAMES:
            try:
                value = _value(m.group("value"))
            except ValueError:
                continue
            flag = _DASH_NAMES[m.group("name").strip()]
            out.limits[flag] = Limit(flag, m.group("name").strip(), (m.group("unit") or "").strip(), value)
    return out


def to_json(text: str) -> dict[str, object]:
    parsed = parse_ulimit(text)
    return {
        "limits": {
            flag: {"name": lim.name, "unit": lim.unit, "value": lim.value, "unlimited": lim.unlimited}
            for flag, lim in sorted(parsed.limits.items())
        }
    }


PARSE_TOOLS = {"ulimit": to_json}
