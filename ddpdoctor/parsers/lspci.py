"""`lspci -vvv` output to PCI device records: ACS control, link capability vs status, bridge bus ranges.

Each record starts at an unindented `17:00.0 PCI bridge: ...` (or `0000:17:00.0 ...`) line. What is read:
`Bus: primary=.., secondary=.., subordinate=..` (bridges), `NUMA node:`, the PCIe capability's port type
(`Express (v2) Downstream Port`), `ACSCap:`/`ACSCtl:` flags (`SrcValid+ TransBlk- ...`), `LnkCap:`
and `LnkSta:` speed and width (lspci >= 3.6 adds `(downgraded)` / `(ok)` to LnkSta), `Kernel driver in
use:`. Without root, lspci prints `Capabilities: <access denied>` and none of the capability lines:
`capabilities_readable` is then false and ACS/link fields are null.

The bare `lspci -vvv | grep ACSCtl` form (ACSCtl lines and nothing else) gives one record per line
with a null slot.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Optional

from ddpdoctor.parsers import to_jsonable

_HEADER = re.compile(
    r"^(?P<slot>(?:[0-9a-fA-F]{4,}:)?[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7])\s+(?P<cls>[^:]+?)\s*:\s*(?P<desc>.*?)\s*$"
)
_KEY_VALUE = re.compile(r"^\s*(?P<key>[A-Za-z][A-Za-z0-9 /-]*?)\s*:\s*(?P<value>.*?)\s*$")
_FLAG = re.compile(r"\b(?P<name>[A-Za-z][A-Za-z0-9]*)(?P<sign>[+-])(?=\s|$|,)")
_SPEED = re.compile(r"Speed\s+(?P<speed>\d+(?:\.\d+)?)\s*GT/s(?:\s*\((?P<note>[^)]*)\))?", re.I)
_WIDTH = re.compile(r"Width\s+x(?P<width>\d{1,3})(?!\d)(?:\s*\((?P<note>[^)]*)\))?", re.I)
_BUS = re.compile(r"secondary=(?P<sec>[0-9a-fA-F]+),\s*subordinate=(?P<sub>[0-9a-fA-F]+)")
_EXPRESS = re.compile(r"Express\s*\((?:v\d+)\)\s*(?P<type>[^,(]+)")
# ACS controls that, when on, redirect peer-to-peer traffic up to the root complex (or block it).
ACS_REDIRECTING = ("SrcValid", "ReqRedir", "CmpltRedir")
GPU_CLASSES = ("3d controller", "vga compatible controller", "display controller")
RDMA_NIC_WORDS = re.compile(r"Mellanox|ConnectX|BlueField|Elastic Fabric|\bEFA\b|NVIDIA", re.I)


@dataclass
class LinkInfo:
    speed_gts: Optional[float] = None
    width: Optional[int] = None
    speed_downgraded: Optional[bool] = None
    width_downgraded: Optional[bool] = None


@dataclass
class PciDevice:
    slot: Optional[str]
    class_name: str = ""
    description: str = ""
    port_type: Optional[str] = None
    kernel_driver: Optional[str] = None
    numa_node: Optional[int] = None
    secondary_bus: Optional[int] = None
    subordinate_bus: Optional[int] = None
    capabilities_readable: bool = True
    acs_capability: Optional[dict[str, bool]] = None
    acs_control: Optional[dict[str, bool]] = None
    link_capability: Optional[LinkInfo] = None
    link_status: Optional[LinkInfo] = None

    @property
    def kind(self) -> str:
        """bridge, gpu, nic (an RDMA-class adapter), or other."""
        cls = self.class_name.lower()
        port = (self.port_type or "").lower()
        # An NVSwitch is class "Bridge" but a PCIe Endpoint: it bridges NVLink, not PCI buses.
        is_endpoint = port.endswith("endpoint")
        if not is_endpoint and (
            "bridge" in cls or port.endswith(("root port", "downstream port", "upstream port"))
        ):
            return "bridge"
        if cls in GPU_CLASSES and (cls == "3d controller" or "nvidia" in self.description.lower()):
            return "gpu"
        if "infiniband" in cls or (
            cls in ("ethernet controller", "network controller") and RDMA_NIC_WORDS.search(self.description)
        ):
            return "nic"
        return "other"

    @property
    def acs_redirecting(self) -> list[str]:
        """The ACS controls that are on and send P2P traffic through the root complex."""
        if not self.acs_control:
            return []
        return [name for name in ACS_REDIRECTING if self.acs_control.get(name)]

    @property
    def domain_bus(self) -> Optional[tuple[str, int]]:
        if not self.slot:
            return None
        parts = self.slot.split(":")
        domain = parts[0].lower() if len(parts) == 3 else "0000"
        try:
            return domain, int(parts[-2], 16)
        except ValueError:
            return None

    def is_above(self, other: PciDevice) -> bool:
        """True when `other` sits on a bus behind this bridge (secondary..subordinate)."""
        mine, theirs = self.domain_bus, other.domain_bus
        if mine is None or theirs is None or self.secondary_bus is None or self.subordinate_bus is None:
            return False
        return mine[0] == theirs[0] and self.secondary_bus <= theirs[1] <= self.subordinate_bus

    def to_json(self) -> dict[str, Any]:
        out = to_jsonable(self)
        return {"slot": out.pop("slot"), "class": out.pop("class_name"), "kind": self.kind, **out}


def _flags(text: str) -> dict[str, bool]:
    return {m.group("name"): m.group("sign") == "+" for m in _FLAG.finditer(text)}


def _link(text: str, status: bool) -> LinkInfo:
    info = LinkInfo()
    m = _SPEED.search(text)
    if m:
        info.speed_gts = float(m.group("speed"))
        if status and m.group("note"):
            info.speed_downgraded = "downgraded" in m.group("note").lower()
    m = _WIDTH.search(text)
    if m:
        info.width = int(m.group("width"))
        if status and m.group("note"):
            info.width_downgraded = "downgraded" in m.group("note").lower()
    return info


def _compare_links(dev: PciDevice) -> None:
    """Older lspci prints no (downgraded)/(ok): compare LnkSta with LnkCap ourselves."""
    cap, sta = dev.link_capability, dev.link_status
    if cap is None or sta is None:
        return
    if sta.speed_downgraded is None and cap.speed_gts is not None and sta.speed_gts is not None:
        sta.speed_downgraded = sta.speed_gts < cap.speed_gts
    if sta.width_downgraded is None and cap.width is not None and sta.width is not None:
        sta.width_downgraded = sta.width < cap.width


def parse_lspci(text: str) -> list[PciDevice]:
    """Parse `lspci -vvv` (or the output of `lspci -vvv | grep ACSCtl`); unknown lines are ignored."""
    devices: list[PciDevice] = []
    dev: Optional[PciDevice] = None
    for line in text.splitlines():
        if not line.strip():
            continue
        m = _HEADER.match(line)
        if m:
            dev = PciDevice(
                slot=m.group("slot"), class_name=m.group("cls").strip(), description=m.group("desc")
            )
            devices.append(dev)
            continue
        m = _KEY_VALUE.match(line)
        if m is None:
            continue
        key, value = m.group("key").strip(), m.group("value")
        if dev is None:
            if key == "ACSCtl":  # the grep form: no record headers at all
                devices.append(PciDevice(slot=None, acs_control=_flags(value)))
            continue
        if key == "ACSCtl":
            dev.acs_control = _flags(value)
        elif key == "ACSCap":
            dev.acs_capability = _flags(value)
        elif key == "LnkCap":
            dev.link_capability = _link(value, status=False)
        elif key == "LnkSta":
            dev.link_status = _link(value, status=True)
        elif key == "Bus":
            b = _BUS.search(value)
            if b:
                dev.secondary_bus, dev.subordinate_bus = int(b.group("sec"), 16), int(b.group("sub"), 16)
        elif key == "NUMA node":
            try:
                dev.numa_node = int(value)
            except ValueError:
                dev.numa_node = None
        elif key == "Kernel driver in use":
            dev.kernel_driver = value or None
        elif key.startswith("Capabilities"):
            if "access denied" in value.lower():
                dev.capabilities_readable = False
            e = _EXPRESS.search(value)
            if e and dev.port_type is None:
                dev.port_type = e.group("type").strip()
    for d in devices:
        _compare_links(d)
    return devices


def to_json(text: str) -> dict[str, Any]:
    return {"devices": [d.to_json() for d in parse_lspci(text)]}


PARSE_TOOLS = {"lspci": to_json}
