"""Loaded kernel modules from `/proc/modules` or `lsmod` output.

`/proc/modules`: `name size refcount deps state offset`, e.g.
`nvidia_peermem 16384 0 - Live 0x0000000000000000`, deps a comma list ending in `,` or `-`.
`lsmod`: a `Module Size Used by` header, then `name size count [deps]`, e.g. `mlx5_ib 483328 0`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Optional

from ddpdoctor.parsers import to_jsonable
from ddpdoctor.parsers.numbers import parse_int


@dataclass
class KernelModule:
    name: str
    size: Optional[int] = None
    used_by_count: Optional[int] = None
    used_by: list[str] = field(default_factory=list)
    state: Optional[str] = None  # Live, Loading, Unloading (/proc/modules only)


def _deps(text: str) -> list[str]:
    return [d for d in text.strip(",").split(",") if d and d != "-"]


# A whole module line: a name with a letter in it, a size, a use count, deps, and (/proc/modules) the
# state, address and taint flags. Anything looser took df's `tmpfs 24684084 0 ...` or a matrix row `0 1 1`
# for modules, and `parse lsmod` passed on another tool's output (#26).
_MODULE_LINE = re.compile(
    r"^(?=[A-Za-z0-9_]*[A-Za-z])[A-Za-z0-9_]{1,64}\s+\d{1,12}\s+(?:\d{1,6}|-)"
    r"(?:\s+[A-Za-z0-9_,\-\[\]]+)?(?:\s+(?:Live|Loading|Unloading)(?:\s+0x[0-9a-fA-F]+)?(?:\s+\([A-Z]+\))?)?\s*$"
)


def parse_modules(text: str) -> list[KernelModule]:
    """Parse `/proc/modules` or `lsmod`; the header and malformed lines are skipped."""
    modules: list[KernelModule] = []
    for line in text.splitlines():
        parts = line.split()
        if not _MODULE_LINE.match(line):
            continue
        mod = KernelModule(name=parts[0], size=parse_int(parts[1]))
        if len(parts) >= 3:
            mod.used_by_count = parse_int(parts[2])
        if len(parts) >= 4:
            mod.used_by = _deps(parts[3])
        if len(parts) >= 5 and parts[4] in ("Live", "Loading", "Unloading"):
            mod.state = parts[4]
        modules.append(mod)
    return modules


def module_names(text: str) -> set[str]:
    return {m.name for m in parse_modules(text)}


def to_json(text: str) -> dict[str, Any]:
    return {"modules": [to_jsonable(m) for m in parse_modules(text)]}


PARSE_TOOLS = {"lsmod": to_json}
