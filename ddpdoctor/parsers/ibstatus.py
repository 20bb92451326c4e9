"""`ibstatus` output (the infiniband-diags script over sysfs) to the same devices and ports as ibstat.

Layout: `Infiniband device 'mlx5_0' port 1 status:` then indented `state: 4: ACTIVE`,
`phys state: 5: LinkUp`, `rate: 200 Gb/sec (4X HDR)`, `link_layer: InfiniBand`. It prints no CA type
or firmware (null). With no devices it prints `Fatal error:  No devices` and exits 255.
"""

from __future__ import annotations

import re
from typing import Any, Optional

from ddpdoctor.parsers.ibstat import IbPort, IbStatus

_HEADER = re.compile(
    r"^\s*Infiniband device\s+'(?P<name>[^']+)'\s+port\s+(?P<port>\d{1,6})\s+status\s*:", re.I | re.ASCII
)
_KEY_VALUE = re.compile(r"^\s*(?P<key>[A-Za-z_][A-Za-z_ ]*?)\s*:\s*(?P<value>.*?)\s*$")
_PORT_KEYS = {
    "state": "state",
    "phys state": "physical_state",
    "rate": "rate_gbps",
    "link layer": "link_layer",
}


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
        kv = out.key_value(line, _KEY_VALUE, port is not None)
        if kv is None or port is None:
            continue
        key, value = kv[0].replace("_", " "), kv[1]
        if key in _PORT_KEYS:
            port.set(_PORT_KEYS[key], value)
        elif key.startswith("fatal") or key.startswith("failed"):
            out.errors.append(line.strip())
    return out


def to_json(text: str) -> dict[str, Any]:
    return parse_ibstatus(text).to_json()


PARSE_TOOLS = {"ibstatus": to_json}
