"""`ibstat` output (infiniband-diags) to devices and ports, plus the types shared by the IB parsers.

`ibstat` prints one `CA 'mlx5_0'` block per device with `Port N:` sub-blocks, indented with tabs (the
tool itself) or spaces (pasted copies). When a device vanishes while it lists them it prints
`ibpanic: [pid] main: stat of IB device 'mlx5_8' failed: ...` and exits 255.

State words are normalized to ibstat's spelling whichever tool produced them (ibv_devinfo's
`PORT_ACTIVE (4)`, sysfs/ibstatus's `4: ACTIVE`): Active, Down, Init, Armed; physical states Sleep,
Polling, Disabled, PortConfigurationTraining, LinkUp, LinkErrorRecovery, PhyTest. ibstat itself prints
`Initializing` for state 2; it is normalized to `Init` like the other tools' `PORT_INIT` / `2: INIT`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Optional, Union

Number = Union[int, float]

# Port states (IBTA PortState) and physical states (PortPhysicalState), by their numeric codes.
PORT_STATES = {1: "Down", 2: "Init", 3: "Armed", 4: "Active", 5: "ActiveDefer"}
PHYS_STATES = {
    1: "Sleep",
    2: "Polling",
    3: "Disabled",
    4: "PortConfigurationTraining",
    5: "LinkUp",
    6: "LinkErrorRecovery",
    7: "PhyTest",
}
# Words as the tools spell them, squashed to lower-case letters only -> the normalized word.
_STATE_WORDS = {
    "down": "Down",
    "portdown": "Down",
    "init": "Init",
    "initializing": "Init",
    "portinit": "Init",
    "armed": "Armed",
    "portarmed": "Armed",
    "active": "Active",
    "portactive": "Active",
    "activedefer": "ActiveDefer",
    "portactivedefer": "ActiveDefer",
}
_PHYS_WORDS = {
    "sleep": "Sleep",
    "polling": "Polling",
    "disabled": "Disabled",
    "portconfigurationtraining": "PortConfigurationTraining",
    "portconfigurationtrainning": "PortConfigurationTraining",  # ibv_devinfo's spelling
    "linkup": "LinkUp",
    "linkerrorrecovery": "LinkErrorRecovery",
    "phytest": "PhyTest",
}
_LINK_LAYERS = {"infiniband": "InfiniBand", "ethernet": "Ethernet"}
_CODE = re.compile(r"^\s*(\d+)\s*:|\((\d+)\)\s*$")
_NUMBER = re.compile(r"(\d+(?:\.\d+)?)")
# Lines that report a failure of the tool rather than data (ibpanic/ibwarn, libibverbs, ibstatus).
_ERROR_LINE = re.compile(
    r"^\s*(?:ibpanic|ibwarn|iberror)\b|\b(?:fail(?:ed|ure)?|fatal|panic|error|can'?t|cannot|no such|"
    r"no (?:\w+ )?devices|not found|wasn'?t found)\b",
    re.IGNORECASE,
)


def _squash(text: str) -> str:
    return re.sub(r"[^a-z]", "", text.lower())


def _normalize(text: Optional[str], words: dict[str, str], codes: dict[int, str]) -> Optional[str]:
    if text is None:
        return None
    raw = text.strip()
    if not raw:
        return None
    m = _CODE.search(raw)
    # Drop the numeric code ("4: ACTIVE", "PORT_ACTIVE (4)") before looking the word up.
    word = _squash(_CODE.sub("", raw))
    if word in words:
        return words[word]
    if m:
        code = int(m.group(1) or m.group(2))
        if code in codes:
            return codes[code]
    # Unknown words ("???", "invalid state") are kept as printed: they are never Active.
    return raw


def normalize_state(text: Optional[str]) -> Optional[str]:
    """`PORT_ACTIVE (4)`, `4: ACTIVE`, `Active` -> `Active`; unknown text is kept as printed."""
    return _normalize(text, _STATE_WORDS, PORT_STATES)


def normalize_physical_state(text: Optional[str]) -> Optional[str]:
    """`LINK_UP (5)`, `5: LinkUp`, `LinkUp` -> `LinkUp`; unknown text is kept as printed."""
    return _normalize(text, _PHYS_WORDS, PHYS_STATES)


def normalize_link_layer(text: Optional[str]) -> Optional[str]:
    if text is None or not text.strip():
        return None
    raw = text.strip()
    return _LINK_LAYERS.get(raw.lower(), raw)


def as_number(value: float) -> Number:
    """200.0 -> 200, 2.5 -> 2.5 (JSON shows rates the way the tools do)."""
    return int(value) if value.is_integer() else value


def parse_rate_gbps(text: Optional[str]) -> Optional[Number]:
    """`200`, `2.5`, `40 (FDR10)`, `200 Gb/sec (4X HDR)` -> a number of Gb/s; None when absent."""
    if text is None:
        return None
    m = _NUMBER.search(text)
    if not m:
        return None
    try:
        value = float(m.group(1))
    except ValueError:  # pragma: no cover - the regex only matches numbers
        return None
    return as_number(value)


def is_error_line(line: str) -> bool:
    return bool(_ERROR_LINE.search(line))


@dataclass
class IbPort:
    port: int
    state: Optional[str] = None
    physical_state: Optional[str] = None
    rate_gbps: Optional[Number] = None
    link_layer: Optional[str] = None


@dataclass
class IbDevice:
    name: str
    type: Optional[str] = None
    firmware: Optional[str] = None
    ports: list[IbPort] = field(default_factory=list)

    def port(self, number: int) -> IbPort:
        """The port with this number, created when first seen."""
        for p in self.ports:
            if p.port == number:
                return p
        p = IbPort(port=number)
        self.ports.append(p)
        return p


@dataclass
class IbStatus:
    """What one IB tool reported: devices with their ports, and the error lines it printed."""

    devices: list[IbDevice] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def device(self, name: str) -> IbDevice:
        for d in self.devices:
            if d.name == name:
                return d
        d = IbDevice(name=name)
        self.devices.append(d)
        return d

    def to_json(self) -> dict[str, Any]:
        return {
            "devices": [
                {
                    "name": d.name,
                    "type": d.type,
                    "firmware": d.firmware,
                    "ports": [
                        {
                            "port": p.port,
                            "state": p.state,
                            "physical_state": p.physical_state,
                            "rate_gbps": p.rate_gbps,
                            "link_layer": p.link_layer,
                        }
                        for p in d.ports
                    ],
                }
                for d in self.devices
            ],
            "errors": list(self.errors),
        }


# "CA 'mlx5_0'" (also Switch/Router/iWARP RNIC/???); "CA: 'mlx5_0'" when one port was asked for.
_DEVICE = re.compile(r"^(?P<kind>[A-Za-z?][A-Za-z ?]*?):?\s+'(?P<name>[^']+)'\s*$")
_PORT = re.compile(r"^\s*Port\s+(?P<port>\d+)\s*:\s*$")
_KEY_VALUE = re.compile(r"^\s*(?P<key>[A-Za-z][A-Za-z ]*?)\s*:\s*(?P<value>.*?)\s*$")


def parse_ibstat(text: str) -> IbStatus:
    """Parse `ibstat` (all devices, or `ibstat DEV [PORT]`); unknown lines are ignored."""
    out = IbStatus()
    device: Optional[IbDevice] = None
    port: Optional[IbPort] = None
    for line in text.splitlines():
        if not line.strip():
            continue
        if line.lstrip().lower().startswith(("ibpanic", "ibwarn", "iberror")):
            out.errors.append(line.strip())
            continue
        m = _DEVICE.match(line)
        if m and not line[0].isspace():
            device, port = out.device(m.group("name")), None
            continue
        m = _PORT.match(line)
        if m:
            if device is not None:
                port = device.port(int(m.group("port")))
            continue
        m = _KEY_VALUE.match(line)
        if m is None or device is None:
            if is_error_line(line):
                out.errors.append(line.strip())
            continue
        key, value = m.group("key").lower(), m.group("value")
        if port is not None and key in ("state", "physical state", "rate", "link layer"):
            if key == "state":
                port.state = normalize_state(value)
            elif key == "physical state":
                port.physical_state = normalize_physical_state(value)
            elif key == "rate":
                port.rate_gbps = parse_rate_gbps(value)
            else:
                port.link_layer = normalize_link_layer(value)
        elif key.endswith(" type") and key != "port type":
            device.type = value or None
        elif key == "firmware version":
            device.firmware = value or None
    return out


def to_json(text: str) -> dict[str, Any]:
    return parse_ibstat(text).to_json()


PARSE_TOOLS = {"ibstat": to_json}
