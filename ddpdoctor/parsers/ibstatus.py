"""`ibstatus` output (the infiniband-diags script over sysfs) to the same devices and ports as ibstat.

Layout: `Infiniband device 'mlx5_0' port 1 status:` then indented `state: 4: ACTIVE`,
`phys state: 5: LinkUp`, `rate: 200 Gb/sec (4X HDR)`, `link_layer: InfiniBand`. It prints no CA type
or firmware (null). With no devices it prints `Fatal error:  No devices` and exits 255.
"""

from __future__ import annotations

import re
from typing import Any, Optional

from ddpdoctor.parsers.ibstat import (
    IbPort,
    IbStatus,
    is_error_line,
    normalize_link_layer,
    normalize_physical_state,
    normalize_state,
    parse_rate_gbps,
)

_HEADER = re.compile(r"^\s*Infiniband device\s+'(?P<name>[^']+)'\s+port\s+(?P<port>\d+)\s+status\s*:", re.I)
_KEY_VALUE = re.compile(r"^\s*(?P<key>[A-Za-z_][A-Za-z_ ]*?)\s*:\s*(?P<value>.*?)\s*$")


def parse_ibstatus(text: str) -> IbStatus:
    """Parse `ibstatus`; unknown lines are ignored, error lines kept in `errors`."""
    out = IbStatus()
    port: Optional[IbPort] = None
    for line in text.splitlines():
        if not line.strip():
            continue
        m = _HEADER.match(line)
        if m:
            port = out.device(m.group("name")).port(int(m.group("port")))
            continue
        m = _KEY_VALUE.match(line)
        if m is None or port is None:
            if is_error_line(line):
                out.errors.append(line.strip())
            continue
        key, value = m.group("key").strip().lower().replace("_", " "), m.group("value")
        if key == "state":
            port.state = normalize_state(value)
        elif key == "phys state":
            port.physical_state = normalize_physical_state(value)
        elif key == "rate":
            port.rate_gbps = parse_rate_gbps(value)
        elif key == "link layer":
            port.link_layer = normalize_link_layer(value)
        elif key.startswith("fatal") or key.startswith("failed"):
            out.errors.append(line.strip())
    return out


def to_json(text: str) -> dict[str, Any]:
    return parse_ibstatus(text).to_json()


PARSE_TOOLS = {"ibstatus": to_json}
