"""`nvidia-smi nvlink -s` (link speeds, `<inactive>`), `nvidia-smi nvlink -e` (error counters) and
`nvidia-smi nvlink -c` (per-link capabilities), alone or concatenated."""

from __future__ import annotations

import re
from typing import Any, Optional

_GPU = re.compile(r"^\s*GPU\s+(?P<index>\d{1,6})\s*:\s*(?P<name>.*?)\s*(?:\(UUID:\s*(?P<uuid>[^)]+)\))?\s*$", re.ASCII)
_LINK = re.compile(r"^\s*Link\s+(?P<link>\d+)\s*:\s*(?P<rest>.*?)\s*$", re.ASCII)
_SPEED = re.compile(r"^(?P<num>\d+(?:\.\d+)?)\s*(?P<unit>[GM]B/s)$", re.I | re.ASCII)
_COUNTER = re.compile(r"^(?P<name>[A-Za-z][A-Za-z /-]*?)\s*(?:Errors?)?\s*:\s*(?P<value>\S+)$")
# `nvidia-smi nvlink -c`: "Link 0, P2P is supported: true".
_CAPABILITY = re.compile(
    r"^\s*Link\s+(?P<link>\d+)\s*,\s*(?P<name>[A-Za-z0-9][A-Za-z0-9 /-]*?)\s*:\s*(?P<value>true|false)\s*$",
    re.I | re.ASCII,
)


def _snake(name: str) -> str:
    return re.sub(r"[^a-z0-9]+", "_", name.lower()).strip("_")


def _link(gpu: dict[str, Any], index: str) -> dict[str, Any]:
    return gpu["links"].setdefault(index, {"active": None, "speed_gbps": None, "errors": {}})


def _capability_name(text: str) -> str:
    """`P2P is supported` -> `p2p`, `Access to system memory supported` -> `access_to_system_memory`."""
    return re.sub(r"_(is_)?supported$", "", _snake(text)) or _snake(text)


def parse_nvlink(text: str) -> dict[str, Any]:
    """`nvidia-smi nvlink -s` and/or `-e` output to `{"gpus": [{index, name, uuid, links: {...}}]}`.

    Equivalent: nvidia-smi nvlink -s; nvidia-smi nvlink -e. Each link is
    `{"active": bool|null, "speed_gbps": float|null, "errors": {"replay": int, "recovery": int, "crc": int}}`,
    plus `capabilities` (`{"p2p": true, ...}`) when `nvidia-smi nvlink -c` output is given;
    `<inactive>` is `active: false`. Outputs may be concatenated: a GPU listed again (each command
    prints its own `GPU N:` header) adds to the same record. Never raises; unknown lines are ignored.
    """
    gpus: list[dict[str, Any]] = []
    by_index: dict[int, dict[str, Any]] = {}
    current: Optional[dict[str, Any]] = None
    notes: list[str] = []
    for line in text.splitlines():
        m = _GPU.match(line)
        if m:
            index = int(m.group("index"))
            current = by_index.get(index)
            if current is None:
                current = {
                    "index": index,
                    "name": m.group("name") or None,
                    "uuid": (m.group("uuid") or "").strip() or None,
                    "links": {},
                }
                by_index[index] = current
                gpus.append(current)
            elif current["uuid"] is None:
                current["uuid"] = (m.group("uuid") or "").strip() or None
            continue
        cap = _CAPABILITY.match(line)
        if cap and current is not None:
            link = _link(current, cap.group("link"))
            link.setdefault("capabilities", {})[_capability_name(cap.group("name"))] = (
                cap.group("value").lower() == "true"
            )
            continue
        m = _LINK.match(line)
        if m and current is not None:
            link = _link(current, m.group("link"))
            rest = m.group("rest")
            speed = _SPEED.match(rest)
            if speed:
                value = float(speed.group("num"))
                link["speed_gbps"] = value / 1000 if speed.group("unit").upper().startswith("M") else value
                link["active"] = True
                continue
            if "inactive" in rest.lower():
                link["active"] = False
                continue
            counter = _COUNTER.match(rest)
            if counter:
                value: Optional[int]
                try:
                    value = int(counter.group("value"))
                except ValueError:
                    value = None
                name = _snake(counter.group("name"))
                if name.endswith("_errors"):
                    name = name[: -len("_errors")]
                link["errors"][name] = value
            continue
        if "nvlink" in line.lower() and ("unable" in line.lower() or "not supported" in line.lower()):
            notes.append(line.strip())
    return {"gpus": gpus, "notes": notes}


def link_summary(gpu: dict[str, Any]) -> dict[str, Optional[int]]:
    """Counts of active, inactive and unknown links of one parsed GPU."""
    links = list((gpu.get("links") or {}).values())
    return {
        "total": len(links),
        "active": sum(1 for x in links if x.get("active") is True),
        "inactive": sum(1 for x in links if x.get("active") is False),
    }


PARSE_TOOLS = {"nvidia-smi-nvlink": parse_nvlink}
