"""`nvidia-smi nvlink -s` (link speeds, `<inactive>`) and `nvidia-smi nvlink -e` (error counters)."""

from __future__ import annotations

import re
from typing import Any, Optional

_GPU = re.compile(r"^\s*GPU\s+(?P<index>\d{1,6})\s*:\s*(?P<name>.*?)\s*(?:\(UUID:\s*(?P<uuid>[^)]+)\))?\s*$")
_LINK = re.compile(r"^\s*Link\s+(?P<link>\d+)\s*:\s*(?P<rest>.*?)\s*$")
_SPEED = re.compile(r"^(?P<num>\d+(?:\.\d+)?)\s*(?P<unit>[GM]B/s)$", re.I)
_COUNTER = re.compile(r"^(?P<name>[A-Za-z][A-Za-z /-]*?)\s*(?:Errors?)?\s*:\s*(?P<value>\S+)$")


def _snake(name: str) -> str:
    return re.sub(r"[^a-z0-9]+", "_", name.lower()).strip("_")


def _link(gpu: dict[str, Any], index: str) -> dict[str, Any]:
    return gpu["links"].setdefault(index, {"active": None, "speed_gbps": None, "errors": {}})


def parse_nvlink(text: str) -> dict[str, Any]:
    """`nvidia-smi nvlink -s` and/or `-e` output to `{"gpus": [{index, name, uuid, links: {...}}]}`.

    Equivalent: nvidia-smi nvlink -s; nvidia-smi nvlink -e. Each link is
    `{"active": bool|null, "speed_gbps": float|null, "errors": {"replay": int, "recovery": int, "crc": int}}`;
    `<inactive>` is `active: false`. Never raises; lines it does not know are ignored.
    """
    gpus: list[dict[str, Any]] = []
    notes: list[str] = []
    for line in text.splitlines():
        m = _GPU.match(line)
        if m:
            gpus.append(
                {
                    "index": int(m.group("index")),
                    "name": m.group("name") or None,
                    "uuid": (m.group("uuid") or "").strip() or None,
                    "links": {},
                }
            )
            continue
        m = _LINK.match(line)
        if m and gpus:
            link = _link(gpus[-1], m.group("link"))
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
