"""Read RDMA devices from sysfs: the source the IB tools themselves read, and the cheapest.

Layout (`/sys/class/infiniband/<dev>/`): `hca_type`, `fw_ver`, `board_id`, `node_type`,
`device/numa_node`, `device` (a link to the PCI device, whose name is the PCI address) and
`ports/<n>/{state,phys_state,rate,link_layer}` (e.g. `4: ACTIVE`, `5: LinkUp`,
`200 Gb/sec (4X HDR)`, `InfiniBand`). Also read: the user-space verbs nodes in `/dev/infiniband`
(absent in a container started without `--device=/dev/infiniband`) and the GPUDirect RDMA markers NCCL
itself looks for.

Everything takes a root path so tests can build a tree under tmp_path. Values are kept raw (strings,
None when unreadable): the snapshot stores what was read, and `to_ib_status` normalizes.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Optional

from ddpdoctor.edge.json_shape import ListOf, Record, conform_fact
from ddpdoctor.edge.sources import define_fact
from ddpdoctor.parsers.ibstat import (
    IbStatus,
    normalize_link_layer,
    normalize_physical_state,
    normalize_state,
    parse_rate_gbps,
)

CLASS_DIR = "sys/class/infiniband"
DEV_DIR = "dev/infiniband"
# Where NCCL looks for a GPUDirect RDMA peer-memory client (src/transport/net_ib.cc, ncclIbGdrSupport).
GDR_MARKERS = (
    "sys/kernel/mm/memory_peers/nv_mem/version",
    "sys/kernel/mm/memory_peers/nv_mem_nc/version",
    "sys/module/nvidia_peermem/version",
)
# Bounds: a broken sysfs must not make the probe read forever.
MAX_DEVICES = 256
MAX_PORTS = 64

_PORT_SHAPE = Record({"port": int, "state": str, "phys_state": str, "rate": str, "link_layer": str})
_DEVICE_SHAPE = Record(
    {
        "name": str,
        "hca_type": str,
        "fw_ver": str,
        "board_id": str,
        "node_type": str,
        "numa_node": int,
        "pci_slot": str,
        "ports": ListOf(_PORT_SHAPE),
    },
    defaults={"ports": []},
)
IB_SYSFS_SHAPE = Record(
    {
        "class_dir": str,
        "class_dir_present": bool,
        "devices": ListOf(_DEVICE_SHAPE),
        "dev_infiniband": ListOf(str),  # None: /dev/infiniband absent
        "gdr_markers": ListOf(str),
    },
    defaults={"devices": [], "gdr_markers": []},
)

IB_SYSFS_FACT = define_fact(
    "infiniband-sysfs",
    "RDMA devices from /sys/class/infiniband (type, firmware, NUMA node, port state/rate/link layer), "
    "/dev/infiniband entries and GPUDirect RDMA markers",
    dict,  # the fields are conformed by load_infiniband_sysfs
)


def _read(path: Path) -> Optional[str]:
    try:
        return path.read_text(errors="replace").strip()
    except (OSError, ValueError):
        return None


def _numa(text: Optional[str]) -> Optional[int]:
    try:
        value = int(text) if text is not None else None
    except ValueError:
        return None
    # -1 means "no NUMA information" (single-node machines, many VMs).
    return value if value is not None and value >= 0 else None


def _listdir(path: Path, limit: int) -> Optional[list[str]]:
    try:
        return sorted(os.listdir(path))[:limit]
    except OSError:
        return None


def _pci_slot(device_dir: Path) -> Optional[str]:
    try:
        return os.path.basename(os.path.realpath(device_dir / "device")) or None
    except OSError:
        return None


def read_infiniband_sysfs(root: Path = Path("/")) -> dict[str, Any]:
    """Equivalent: `ls /sys/class/infiniband; cat /sys/class/infiniband/*/{hca_type,fw_ver,board_id}
    /sys/class/infiniband/*/ports/*/{state,phys_state,rate,link_layer}; ls /dev/infiniband`."""
    root = Path(root)
    class_dir = root / CLASS_DIR
    names = _listdir(class_dir, MAX_DEVICES)
    devices: list[dict[str, Any]] = []
    for name in names or []:
        d = class_dir / name
        ports: list[dict[str, Any]] = []
        for port in _listdir(d / "ports", MAX_PORTS) or []:
            if not port.isdigit():
                continue
            p = d / "ports" / port
            ports.append(
                {
                    "port": int(port),
                    "state": _read(p / "state"),
                    "phys_state": _read(p / "phys_state"),
                    "rate": _read(p / "rate"),
                    "link_layer": _read(p / "link_layer"),
                }
            )
        ports.sort(key=lambda x: x["port"])
        devices.append(
            {
                "name": name,
                "hca_type": _read(d / "hca_type"),
                "fw_ver": _read(d / "fw_ver"),
                "board_id": _read(d / "board_id"),
                "node_type": _read(d / "node_type"),
                "numa_node": _numa(_read(d / "device" / "numa_node")),
                "pci_slot": _pci_slot(d) if (d / "device").exists() else None,
                "ports": ports,
            }
        )
    return {
        "class_dir": str(class_dir),
        "class_dir_present": names is not None,
        "devices": devices,
        "dev_infiniband": _listdir(root / DEV_DIR, 1024),
        "gdr_markers": [m for m in GDR_MARKERS if (root / m).exists()],
    }


def load_infiniband_sysfs(value: Any) -> Optional[dict[str, Any]]:
    """The `infiniband-sysfs` fact (live, or read back from a snapshot) in the shape `read_infiniband_sysfs`
    writes; wrong-typed values become None, devices without a name and ports without a number are
    dropped. None when the value is not an object at all (as when the fact is absent)."""
    fact = conform_fact(value, IB_SYSFS_SHAPE)
    if fact is None:
        return None
    fact["devices"] = [d for d in fact["devices"] if d["name"]]
    for d in fact["devices"]:
        d["ports"] = [p for p in d["ports"] if p["port"] is not None]
    return fact


def to_ib_status(fact: Any) -> IbStatus:
    """The sysfs fact as the normalized devices/ports the tool parsers produce (garbage -> empty)."""
    out = IbStatus()
    for raw in (load_infiniband_sysfs(fact) or {}).get("devices", []):
        dev = out.device(raw["name"])
        dev.type = raw["hca_type"] or None
        dev.firmware = raw["fw_ver"] or None
        for rp in raw["ports"]:
            p = dev.port(rp["port"])
            p.state = normalize_state(rp["state"])
            p.physical_state = normalize_physical_state(rp["phys_state"])
            p.rate_gbps = parse_rate_gbps(rp["rate"])
            p.link_layer = normalize_link_layer(rp["link_layer"])
    return out
