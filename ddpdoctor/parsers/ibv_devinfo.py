"""`ibv_devinfo` / `ibv_devinfo -v` output (rdma-core) to the same devices and ports as ibstat.

Layout (tabs as printed; pasted copies may use spaces): `hca_id:\tmlx5_0`, device keys such as
`fw_ver:`, `vendor_id:`, `vendor_part_id:`, `board_id:`, then per port `port:\t1` followed by
`state:\t\tPORT_ACTIVE (4)` and `link_layer:\tInfiniBand`. Only `-v` prints `phys_state:` (IB transport
only), `active_width: 4X (2)` and `active_speed: 50.0 Gbps (64)`; the rate is their product, so without
`-v` it is null. Errors such as `Failed to get IB devices list: ...` and `No IB devices found` are kept.
`ibv_devinfo -l` (`2 HCAs found:` then one tab-indented name per line) gives the devices without ports.
"""

from __future__ import annotations

import re
from typing import Any, Optional

from ddpdoctor.parsers.ibstat import IbDevice, IbPort, IbStatus, as_number
from ddpdoctor.parsers.numbers import parse_int

_HCA = re.compile(r"^\s*hca_id\s*:\s*(?P<name>\S+)")
_PORT = re.compile(r"^\s*port\s*:\s*(?P<port>\d{1,6})\s*$", re.ASCII)
# `ibv_devinfo -l`: devinfo.c prints "%d HCA%s found:\n" then "\t%s\n" per device.
_LIST_HEADER = re.compile(r"^\s*\d{1,6}\s+HCAs?\s+found:\s*$", re.ASCII)
_LIST_NAME = re.compile(r"^\s+(?P<name>[A-Za-z0-9_.-]+)\s*$")
_KEY_VALUE = re.compile(r"^\s*(?P<key>[A-Za-z_][A-Za-z0-9_ ]*?)\s*:\s*(?P<value>.*?)\s*$")
_PORT_KEYS = {"state": "state", "phys_state": "physical_state", "link_layer": "link_layer"}
_WIDTH = re.compile(r"(?<!\d)(\d{1,4})\s*X", re.IGNORECASE | re.ASCII)
_SPEED = re.compile(r"(\d+(?:\.\d+)?)\s*Gbps", re.IGNORECASE | re.ASCII)
# Mellanox/NVIDIA's verbs vendor id: their sysfs hca_type (and ibstat's CA type) is "MT<part id>".
MELLANOX_VENDOR_IDS = {0x02C9, 0x119F}


def _rate(width: Optional[str], speed: Optional[str]) -> Optional[float]:
    if not width or not speed:
        return None
    w, s = _WIDTH.search(width), _SPEED.search(speed)
    if not w or not s:
        return None
    return as_number(int(w.group(1)) * float(s.group(1)))


def _finish_port(port: Optional[IbPort], width: Optional[str], speed: Optional[str]) -> None:
    if port is not None:
        port.rate_gbps = _rate(width, speed)


def _device_type(vendor_id: Optional[int], part_id: Optional[int]) -> Optional[str]:
    if part_id is None or (part_id == 0 and vendor_id in (0, None)):
        return None  # software devices (rxe, siw) report vendor 0x0000 / part 0: no hardware model
    if vendor_id in MELLANOX_VENDOR_IDS:
        return f"MT{part_id}"
    return str(part_id)


def parse_ibv_devinfo(text: str) -> IbStatus:
    """Parse `ibv_devinfo [-v]`; unknown lines (capability flag lists, GIDs) are ignored."""
    out = IbStatus()
    device: Optional[IbDevice] = None
    port: Optional[IbPort] = None
    width: Optional[str] = None
    speed: Optional[str] = None
    vendor_id: Optional[int] = None
    part_id: Optional[int] = None

    def close_device() -> None:
        if device is not None and device.type is None:
            device.type = _device_type(vendor_id, part_id)

    listing = False
    for line in text.splitlines():
        if not line.strip():
            listing = False
            continue
        if _LIST_HEADER.match(line):
            listing = True
            continue
        if listing:
            m = _LIST_NAME.match(line)
            if m:
                out.device(m.group("name"))
                continue
            listing = False
        m = _HCA.match(line)
        if m:
            _finish_port(port, width, speed)
            close_device()
            device, port, width, speed, vendor_id, part_id = (
                out.device(m.group("name")),
                None,
                None,
                None,
                None,
                None,
            )
            continue
        m = _PORT.match(line)
        if m and device is not None:
            _finish_port(port, width, speed)
            port, width, speed = device.port(int(m.group("port"))), None, None
            continue
        kv = out.key_value(line, _KEY_VALUE, device is not None)
        if kv is None or device is None:
            continue
        key, value = kv
        if key.startswith(("failed", "no ib")):
            out.errors.append(line.strip())
            continue
        if port is not None:
            if key in _PORT_KEYS:
                port.set(_PORT_KEYS[key], value)
            elif key == "active_width":
                width = value
            elif key == "active_speed":
                speed = value
            continue
        if key == "fw_ver":
            device.firmware = value or None
        elif key == "vendor_id":
            # `0x02c9`: hexadecimal, as ibv_devinfo prints vendor ids
            vendor_id = parse_int(value.split()[0] if value.split() else "", hex_ok=True)
        elif key == "vendor_part_id":
            part_id = parse_int(value.split()[0] if value.split() else "", hex_ok=True)
    _finish_port(port, width, speed)
    close_device()
    return out


def parse_board_ids(text: str) -> dict[str, str]:
    """`board_id` per hca_id (ibv_devinfo is the tool that prints it; ibstat does not)."""
    boards: dict[str, str] = {}
    name: Optional[str] = None
    for line in text.splitlines():
        m = _HCA.match(line)
        if m:
            name = m.group("name")
            continue
        m = _KEY_VALUE.match(line)
        if m and name is not None and m.group("key").strip().lower() == "board_id" and m.group("value"):
            boards.setdefault(name, m.group("value"))
    return boards


def to_json(text: str) -> dict[str, Any]:
    return parse_ibv_devinfo(text).to_json()


PARSE_TOOLS = {"ibv_devinfo": to_json}
