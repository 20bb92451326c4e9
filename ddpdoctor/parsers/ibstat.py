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
from typing import Any, Callable, Optional, TypeVar, Union

from ddpdoctor.parsers import to_jsonable

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
# Digit runs are bounded: int() refuses strings of thousands of digits, and no state code or port has them.
_CODE = re.compile(r"^\s*(\d{1,6})\s*:|\((\d{1,6})\)\s*$", re.ASCII)
_NUMBER = re.compile(r"(\d+(?:\.\d+)?)", re.ASCII)
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


# ...and that speak of IB: another tool's "Correctable Error : 0" (nvidia-smi) or "Assertion failed"
# (dmesg) is not an IB tool's failure, and counting it made `parse ibstat` pass on that output (#26).
_IB_WORDS = re.compile(
    r"^\s*(?:ibpanic|ibwarn|iberror|ibstat|ibstatus|ibv_\w+|libibverbs|libibumad)\b|\bIB\b|infiniband|verbs|umad"
    r"|\bno (?:\w+ )?devices\b|\bHCA\b|\bmlx\d|\bport\b|\brdma",
    re.IGNORECASE | re.ASCII,
)


def is_error_line(line: str) -> bool:
    return bool(_ERROR_LINE.search(line)) and bool(_IB_WORDS.search(line))


T = TypeVar("T")


def _find_or_add(items: list[T], matches: Callable[[T], bool], make: Callable[[], T]) -> T:
    found = next((item for item in items if matches(item)), None)
    if found is None:
        found = make()
        items.append(found)
    return found


@dataclass
class IbPort:
    port: int
    state: Optional[str] = None
    physical_state: Optional[str] = None
    rate_gbps: Optional[Number] = None
    link_layer: Optional[str] = None

    def set(self, name: str, text: Optional[str]) -> None:
        """Set a field from the tool's text, normalized (state words, rate number, link layer)."""
        setattr(self, name, PORT_FIELDS[name](text))


# How each port field is read from any tool's text.
PORT_FIELDS: dict[str, Callable[[Optional[str]], Any]] = {
    "state": normalize_state,
    "physical_state": normalize_physical_state,
    "rate_gbps": parse_rate_gbps,
    "link_layer": normalize_link_layer,
}


@dataclass
class IbDevice:
    name: str
    type: Optional[str] = None
    firmware: Optional[str] = None
    ports: list[IbPort] = field(default_factory=list)

    def port(self, number: int) -> IbPort:
        """The port with this number, created when first seen."""
        return _find_or_add(self.ports, lambda p: p.port == number, lambda: IbPort(port=number))


@dataclass
class IbStatus:
    """What one IB tool reported: devices with their ports, and the error lines it printed."""

    devices: list[IbDevice] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def device(self, name: str) -> IbDevice:
        """The device with this name, created when first seen."""
        return _find_or_add(self.devices, lambda d: d.name == name, lambda: IbDevice(name=name))

    def key_value(self, line: str, pattern: re.Pattern[str], in_block: bool) -> Optional[tuple[str, str]]:
        """(lower-case key, value) of a `key: value` line inside a device or port block; any other line
        that reports a failure (`Failed to get IB devices list`, `Fatal error`) is kept in `errors`."""
        m = pattern.match(line)
        if m is None or not in_block:
            if is_error_line(line):
                self.errors.append(line.strip())
            return None
        return m.group("key").strip().lower(), m.group("value")

    def to_json(self) -> dict[str, Any]:
        return to_jsonable(self)


# "CA 'mlx5_0'" (also Switch/Router/iWARP RNIC/???); "CA: 'mlx5_0'" when one port was asked for.
_DEVICE = re.compile(r"^(?P<kind>[A-Za-z?][A-Za-z ?]*?):?\s+'(?P<name>[^']+)'\s*$")
_PORT = re.compile(r"^\s*Port\s+(?P<port>\d{1,6})\s*:\s*$", re.ASCII)
_KEY_VALUE = re.compile(r"^\s*(?P<key>[A-Za-z][A-Za-z ]*?)\s*:\s*(?P<value>.*?)\s*$")
_IBSTAT_PORT_KEYS = {
    "state": "state",
    "physical state": "physical_state",
    "rate": "rate_gbps",
    "link layer": "link_layer",
}


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
        kv = out.key_value(line, _KEY_VALUE, device is not None)
        if kv is None or device is None:
            continue
        key, value = kv
        if port is not None and key in _IBSTAT_PORT_KEYS:
            port.set(_IBSTAT_PORT_KEYS[key], value)
        elif key.endswith(" type") and key != "port type":
            device.type = value or None
        elif key == "firmware version":
            device.firmware = value or None
    return out


def to_json(text: str) -> dict[str, Any]:
    return parse_ibstat(text).to_json()


PARSE_TOOLS = {"ibstat": to_json}
