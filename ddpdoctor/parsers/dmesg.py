"""Kernel log (`dmesg`, `journalctl -k`) lines that matter for GPUs: NVIDIA Xid events, GPUs that
fell off the bus (also the multi-line form without an Xid token) and PCIe links "limited by" a slower
upstream link.

Any prefix the kernel log tools put in front of a line is accepted: `[ 5123.456789]` (dmesg),
`<4>[ 5123.456789]` (dmesg -r, /dev/kmsg), `[Sun Feb 23 16:24:18 2025]` (dmesg -T),
`kern  :warn  : 2025-01-21T04:41:44,283302+00:00` (dmesg --decode --time-format=iso) and
`Jun  7 19:30:01 node12 kernel:` (journalctl -k, syslog). NVSwitch `SXid` lines are not Xids."""

from __future__ import annotations

import re
from collections import deque
from dataclasses import dataclass
from typing import Any, Iterator, Optional

from ddpdoctor.parsers.nvidia_smi import RECOVERY_ACTIONS


@dataclass(frozen=True)
class XidInfo:
    """What an Xid code usually means. `cause` is application, driver or hardware; `severity` is the
    ddpdoctor severity label a sighting gets (hardware faults fail, application faults only inform)."""

    code: int
    meaning: str
    cause: str
    severity: str
    action: str


# From NVIDIA's "Xid Errors" table (docs.nvidia.com/deploy/xid-errors) and field experience
# (stas00/ml-engineering, leptonai/gpud): the codes seen on training clusters.
XID_TABLE: dict[int, XidInfo] = {
    x.code: x
    for x in (
        XidInfo(
            8,
            "GPU stopped processing (channel timeout)",
            "driver",
            "warn",
            "Check for hung kernels; reset the GPU if it recurs.",
        ),
        XidInfo(
            13,
            "Graphics engine exception (illegal address, out-of-range access in a kernel)",
            "application",
            "info",
            "Usually a bug in a CUDA kernel; rerun with CUDA_LAUNCH_BLOCKING=1 or compute-sanitizer.",
        ),
        XidInfo(
            31,
            "GPU memory page fault (MMU fault)",
            "application",
            "info",
            "Usually an illegal memory access by the application; if it recurs without one, run dcgmi diag.",
        ),
        XidInfo(
            32,
            "Invalid or corrupted push buffer stream (often PCIe)",
            "hardware",
            "warn",
            "Check PCIe link health (replays, width); reseat if it recurs.",
        ),
        XidInfo(38, "Driver firmware error", "driver", "warn", "Update the driver; reset the GPU."),
        XidInfo(
            43,
            "GPU stopped processing (reset channel after a fault)",
            "application",
            "info",
            "Follows an application fault; nothing to do unless it recurs without one.",
        ),
        XidInfo(
            45,
            "Preemptive cleanup after a previous error (often a killed process)",
            "application",
            "info",
            "Usually follows a killed job; look for an earlier Xid.",
        ),
        XidInfo(
            48,
            "Double-bit ECC error (uncorrectable memory error)",
            "hardware",
            "fail",
            "Reset the GPU (`sudo nvidia-smi -r -i N`) or reboot; RMA if it recurs.",
        ),
        XidInfo(
            61,
            "Internal micro-controller breakpoint/warning",
            "driver",
            "warn",
            "Reset the GPU; update the driver if it recurs.",
        ),
        XidInfo(
            62,
            "Internal micro-controller halt",
            "hardware",
            "fail",
            "Reset the GPU or reboot; RMA if it recurs.",
        ),
        XidInfo(
            63,
            "ECC page retirement or row remapping recorded (pending until reset)",
            "hardware",
            "warn",
            "Reset the GPU (`sudo nvidia-smi -r -i N`) or reboot to apply the remap.",
        ),
        XidInfo(
            64,
            "ECC page retirement or row remapping failure",
            "hardware",
            "fail",
            "Drain the node and RMA the GPU.",
        ),
        XidInfo(68, "NVDEC/video processor exception", "hardware", "warn", "Reset the GPU if it recurs."),
        XidInfo(
            69,
            "Graphics engine class error",
            "driver",
            "warn",
            "Reset the GPU; update the driver if it recurs.",
        ),
        XidInfo(
            74,
            "NVLink error",
            "hardware",
            "fail",
            "Check `nvidia-smi nvlink -e`; reset the GPU; reseat or RMA if it recurs.",
        ),
        XidInfo(
            79,
            "GPU has fallen off the bus",
            "hardware",
            "fail",
            "Drain the node; check power, thermals, riser/slot and firmware; reboot; RMA if it recurs.",
        ),
        XidInfo(
            92,
            "High single-bit ECC error rate",
            "hardware",
            "warn",
            "Watch the ECC counters; run dcgmi diag -r 3; RMA if it keeps rising.",
        ),
        XidInfo(
            94,
            "Contained uncorrectable ECC error (only the affected application was stopped)",
            "hardware",
            "warn",
            "Reset the GPU to remap the row; RMA if it recurs.",
        ),
        XidInfo(
            95,
            "Uncontained uncorrectable ECC error (all applications on the GPU affected)",
            "hardware",
            "fail",
            "Reset the GPU or reboot; RMA if it recurs.",
        ),
        XidInfo(
            109,
            "Context switch timeout",
            "driver",
            "warn",
            "Check for hung kernels; reset the GPU if it recurs.",
        ),
        XidInfo(
            119,
            "GSP RPC timeout (GPU System Processor not responding)",
            "hardware",
            "fail",
            "Reset the GPU or reboot; update the driver/firmware; some sites disable GSP (NVreg_EnableGpuFirmware=0).",
        ),
        XidInfo(120, "GSP error", "hardware", "fail", "Reset the GPU or reboot; update the driver/firmware."),
        XidInfo(121, "C2C (chip-to-chip) link error", "hardware", "fail", "Reset the GPU; RMA if it recurs."),
        XidInfo(
            140, "Unrecovered ECC error", "hardware", "fail", "Reset the GPU or reboot; RMA if it recurs."
        ),
        XidInfo(
            145,
            "NVLink RLW error",
            "hardware",
            "warn",
            "Check `nvidia-smi nvlink -e`; reset the GPU if it recurs.",
        ),
        XidInfo(
            144,
            "NVLink SAW (switch access window) error",
            "hardware",
            "warn",
            "Check `nvidia-smi nvlink -e`; reset the GPU if it recurs; a Fatal one needs a reset.",
        ),
        XidInfo(
            146,
            "NVLink TLW (transaction layer) error",
            "hardware",
            "warn",
            "Check `nvidia-smi nvlink -e`; reset the GPU if it recurs; a Fatal one needs a reset.",
        ),
        XidInfo(
            147,
            "NVLink TREX error",
            "hardware",
            "warn",
            "Check `nvidia-smi nvlink -e`; reset the GPU if it recurs.",
        ),
        XidInfo(
            148,
            "NVLink NVLPW (power/link training) error",
            "hardware",
            "warn",
            "Check `nvidia-smi nvlink -e`; reset the GPU if it recurs.",
        ),
        XidInfo(
            149,
            "NVLink/NVSwitch fatal error",
            "hardware",
            "fail",
            "Reset the GPU and the NVSwitch fabric (restart nvidia-fabricmanager) or reboot.",
        ),
        XidInfo(
            150,
            "NVLink MSE error",
            "hardware",
            "warn",
            "Check `nvidia-smi nvlink -e`; reset the GPU if it recurs.",
        ),
        XidInfo(
            154,
            "GPU recovery action changed (reset or reboot required)",
            "hardware",
            "fail",
            "Do what `nvidia-smi -q` (GPU Reset Status) asks: reset the GPU or reboot.",
        ),
    )
}

# `[ 5123.456789]`, optionally after the `<4>` priority of `dmesg -r` / /dev/kmsg.
_TIME = re.compile(r"^\s*(?:<\d{1,3}>)?\[\s*(?P<ts>\d{1,12}\.\d{1,9})\]")
# Wall-clock prefixes, kept as printed: `[Sun Feb 23 16:24:18 2025]` (dmesg -T / --ctime),
# `2025-01-21T04:41:44,283302+00:00` (--time-format=iso, after `kern  :warn  : ` with --decode) and
# `Jun  7 19:30:01` / `2026-09-14T19:58:20-0400` (journalctl, syslog).
_WALL_TIME = re.compile(
    r"^\s*(?:<\d{1,3}>)?(?:[a-z]{2,8}\s*:\s*[a-z]{2,8}\s*:\s*)?"
    r"(?:\[(?P<ctime>[A-Z][a-z]{2} [A-Z][a-z]{2} [ \d]\d \d{2}:\d{2}:\d{2} \d{4})\]"
    r"|(?P<iso>\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(?:[.,]\d{1,9})?(?:Z|[+-]\d{2}:?\d{2})?)"
    r"|(?P<syslog>[A-Z][a-z]{2} [ \d]\d \d{2}:\d{2}:\d{2}))"
)
# Xid 154's detail: "GPU recovery action changed from 0x0 (None) to 0x2 (Node Reboot Required)". The
# number is nvmlGpuRecoveryAction_t (RECOVERY_ACTIONS is indexed by it); the words in parentheses vary
# across drivers ("OS Reboot").
_RECOVERY_TO = re.compile(
    r"recovery action changed from\s+\S+(?:\s+\([^)]*\))?\s+to\s+(?P<code>0x[0-9a-fA-F]{1,8}|\d{1,8})"
)
# Xid 43/45 name the Xid that caused them: "Ch 00000001 caused by previous Xid 149".
_CAUSED_BY = re.compile(r"caused by previous Xid\s+(?P<code>\d{1,6})(?!\d)")
_XID = re.compile(
    r"NVRM: Xid \((?:PCI:)?(?P<bus>[0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}(?:\.[0-9a-fA-F])?)\)\s*:\s*"
    r"(?P<code>\d{1,6})(?!\d)\s*,?\s*(?P<detail>.*?)\s*$"
)
_BUS = re.compile(r"(?P<bus>[0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}(?:\.[0-9a-fA-F])?)")
_LIMITED = re.compile(
    r"(?P<dev>[0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-9a-fA-F]):\s*(?P<avail>\d+(?:\.\d+)?)\s*Gb/s available PCIe "
    r"bandwidth, limited by (?P<speed>\d+(?:\.\d+)?)\s*GT/s PCIe x(?P<width>\d{1,3}) link at "
    r"(?P<at>[0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-9a-fA-F])\s*"
    r"\(capable of (?P<cap>\d+(?:\.\d+)?)\s*Gb/s with (?P<cap_speed>\d+(?:\.\d+)?)\s*GT/s PCIe x(?P<cap_width>\d{1,3}) link\)"
)


def normalize_bus_id(bus: Optional[str]) -> Optional[str]:
    """`00000000:3B:00.0`, `0000:3b:00`, `PCI:0000:3b:00` -> `0000:3b:00` (domain:bus:device, lower case).

    The function number is dropped because Xid lines omit it; GPUs use function 0.
    """
    if not bus:
        return None
    m = re.search(r"([0-9a-fA-F]{4,8}):([0-9a-fA-F]{2}):([0-9a-fA-F]{2})", bus)
    if not m:
        return None
    return f"{m.group(1)[-4:]}:{m.group(2)}:{m.group(3)}".lower()


def _timestamp(line: str) -> Optional[float]:
    m = _TIME.match(line)
    return float(m.group("ts")) if m else None


def _wall_time(line: str) -> Optional[str]:
    m = _WALL_TIME.match(line)
    if not m:
        return None
    return m.group("ctime") or m.group("iso") or m.group("syslog")


def _recovery_action(detail: str) -> Optional[str]:
    """The action an Xid 154 line moved to (`none`, `reset`, `reboot`, ...), None when not stated."""
    m = _RECOVERY_TO.search(detail)
    if not m:
        return None
    code = int(m.group("code"), 16) if m.group("code").lower().startswith("0x") else int(m.group("code"))
    return RECOVERY_ACTIONS[code] if code < len(RECOVERY_ACTIONS) else f"unknown_{code}"


def _caused_by(detail: str) -> Optional[int]:
    m = _CAUSED_BY.search(detail)
    return int(m.group("code")) if m else None


# Events kept per list: the first and the last half of this many. A 64 MiB log of one repeated Xid is
# 700k events (3 GB as dicts); the first ones say when it began, the last ones what it is now, and
# `omitted` says how many were between.
MAX_EVENTS = 1000


class _Kept:
    """A list that keeps its first and last MAX_EVENTS // 2 items and counts the rest."""

    def __init__(self) -> None:
        self.head: list[dict[str, Any]] = []
        self.tail: deque[dict[str, Any]] = deque(maxlen=MAX_EVENTS - MAX_EVENTS // 2)
        self.seen = 0

    def append(self, item: dict[str, Any]) -> None:
        self.seen += 1
        if len(self.head) < MAX_EVENTS // 2:
            self.head.append(item)
        else:
            self.tail.append(item)

    @property
    def omitted(self) -> int:
        return self.seen - len(self.head) - len(self.tail)

    def items(self) -> list[dict[str, Any]]:
        return self.head + list(self.tail)


def parse_dmesg(text: str) -> dict[str, Any]:
    """Kernel log text to `{"xids": [...], "fallen_off_bus": [...], "pcie_limited": [...]}`; never raises.

    Equivalent: dmesg | grep -E 'NVRM: Xid|fallen off the bus|limited by'. Each Xid carries the code,
    the bus id, the detail text, the kernel timestamp (`[seconds]`) or wall-clock `time` when present,
    the table's meaning, `caused_by` (the earlier Xid an Xid 43/45 names) and, for Xid 154,
    `recovery_action` (the action the driver now asks for).
    """
    xids, fallen, limited = _Kept(), _Kept(), _Kept()
    fallen_buses: set[Optional[str]] = set()
    # The lines before this one (a multi-line message names its bus up to three lines back); the
    # text is walked line by line, never split into one list.
    recent: deque[str] = deque(maxlen=4)
    for line in _lines(text):
        recent.append(line)
        m = _XID.search(line)
        if m:
            code = int(m.group("code"))
            info = XID_TABLE.get(code)
            xids.append(
                {
                    "code": code,
                    "bus_id": normalize_bus_id(m.group("bus")),
                    "detail": m.group("detail")[:300],
                    "timestamp": _timestamp(line),
                    "time": _wall_time(line),
                    "meaning": info.meaning if info else None,
                    "cause": info.cause if info else None,
                    "severity": info.severity if info else "warn",
                    "line": line.strip()[:400],
                    "caused_by": _caused_by(m.group("detail")),
                    "recovery_action": _recovery_action(m.group("detail")) if code == 154 else None,
                }
            )
            if code == 79 or "fallen off the bus" in line:
                fallen_buses.add(normalize_bus_id(m.group("bus")))
                fallen.append(
                    {
                        "bus_id": normalize_bus_id(m.group("bus")),
                        "timestamp": _timestamp(line),
                        "time": _wall_time(line),
                        "line": line.strip()[:400],
                    }
                )
            continue
        if "fallen off the bus" in line:
            # Multi-line form: "NVRM: The NVIDIA GPU 0000:b3:00.0" / "NVRM: (PCI ID: ...) installed in this
            # system has" / "NVRM: fallen off the bus and is not responding to commands." The bus id is
            # on this line or one of the three before it; dmesg stamps only the first line of the
            # message (the others are indented continuations), so the time comes from where the bus was.
            bus = None
            first = line
            for back, earlier in enumerate(reversed(recent)):
                b = _BUS.search(earlier)
                if b and ("NVRM" in earlier or back == 0):
                    bus = normalize_bus_id(b.group("bus"))
                    first = earlier
                    break
            # The Xid 79 line and the plain line often report the same event: keep one per GPU.
            if bus is None or bus not in fallen_buses:
                fallen_buses.add(bus)
                stamp = _timestamp(line)
                fallen.append(
                    {
                        "bus_id": bus,
                        "timestamp": stamp if stamp is not None else _timestamp(first),
                        "time": _wall_time(line) or _wall_time(first),
                        "line": line.strip()[:400],
                    }
                )
            continue
        m2 = _LIMITED.search(line)
        if m2:
            limited.append(
                {
                    "device": m2.group("dev").lower(),
                    "available_gbps": float(m2.group("avail")),
                    "limited_speed_gts": float(m2.group("speed")),
                    "limited_width": int(m2.group("width")),
                    "limited_at": m2.group("at").lower(),
                    "capable_gbps": float(m2.group("cap")),
                    "capable_speed_gts": float(m2.group("cap_speed")),
                    "capable_width": int(m2.group("cap_width")),
                    "timestamp": _timestamp(line),
                    "time": _wall_time(line),
                    "line": line.strip()[:400],
                }
            )
    out: dict[str, Any] = {
        "xids": xids.items(),
        "fallen_off_bus": fallen.items(),
        "pcie_limited": limited.items(),
    }
    omitted = {k: v.omitted for k, v in (("xids", xids), ("fallen_off_bus", fallen), ("pcie_limited", limited))}
    if any(omitted.values()):
        # Only when the log was that long: the usual output keeps its three keys.
        out["omitted"] = {k: n for k, n in omitted.items() if n}
    return out


def _lines(text: str) -> Iterator[str]:
    """text.splitlines() one line at a time (\n, \r\n, \r), without holding them all."""
    for chunk in re.finditer(r"[^\r\n]*(?:\r\n|\r|\n)|[^\r\n]+$", text):
        yield chunk.group(0).rstrip("\r\n")


PARSE_TOOLS = {"dmesg": parse_dmesg}
