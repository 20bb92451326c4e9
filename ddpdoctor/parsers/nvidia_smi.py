"""`nvidia-smi -q` and `nvidia-smi --query-gpu=... --format=csv` to plain dicts.

The `-q` layout changed across driver generations: the key column is padded to 32 characters on old
drivers and 42 on newer ones, `Clocks Throttle Reasons` became `Clocks Event Reasons` (R535), ECC
counters moved from Single/Double Bit blocks to SRAM/DRAM Correctable/Uncorrectable and then split
SRAM uncorrectable into Parity and SEC-DED, `Pending` became `Pending Page Blacklist`, and old drivers
print no `CUDA Version`. The parser reads the indentation tree and looks fields up by name, so the
column width does not matter; a value it cannot read (`N/A`, `[N/A]`, `ERR!`, `Unknown Error`) is None.

Each GPU becomes a dict in the shape documented in docs/parse.md; `ddpdoctor.edge.nvml` builds the same
shape from NVML so that one set of checks judges both.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Optional

from ddpdoctor.parsers.numbers import parse_float, parse_int

# Values nvidia-smi prints when it cannot read a field.
_UNREADABLE = {
    "",
    "n/a",
    "[n/a]",
    "err!",
    "[err!]",
    "unknown error",
    "[unknown error]",
    "not supported",
    "[not supported]",
    "[insufficient permissions]",
    "insufficient permissions",
    "[requires root]",
    "[gpu is lost]",
    "gpu is lost",
    "unknown",
    # R570+ prints this for the Reset Status lines that `GPU Recovery Action` replaced.
    "requested functionality has been deprecated",
}
_TRUE = {"yes", "enabled", "active", "on", "supported", "true"}
_FALSE = {"no", "disabled", "not active", "off", "not supported", "false"}
# Digit runs are bounded: int() refuses strings of thousands of digits, and no reading has them.
_NUMBER = re.compile(r"^\s*(-?\d{1,19}(?:\.\d+)?)\s*(?:[a-zA-Z%()/.]+\s*)*$", re.ASCII)
# The key/value separator: a colon followed by a space or the end of line. Bus ids
# ("GPU 00000000:19:00.0") and clock times ("11:22:39") have colons followed by digits, so they
# stay whole.
_KV = re.compile(r"^(?P<key>[^:]*?)\s*:(?:\s+(?P<value>.*?))?\s*$")
_GPU_HEADER = re.compile(r"^GPU\s+(?P<bus>[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-9A-Fa-f])\s*$")
ERROR_LINES = re.compile(
    r"(Failed to initialize NVML:.*|NVML library version:.*|Unable to determine the device handle for GPU.*"
    r"|NVIDIA-SMI has failed because.*|No devices were found.*|Unable to load the NVIDIA.*"
    r"|GPU access blocked by the operating system.*|Insufficient Permissions.*)",
)


def value_or_none(text: Optional[str]) -> Optional[str]:
    """The text, or None when nvidia-smi printed one of its "cannot read" markers."""
    if text is None:
        return None
    text = text.strip()
    return None if text.lower() in _UNREADABLE else text


def to_signed_int(text: Optional[str]) -> Optional[int]:
    """to_int for the readings that may be below zero: temperatures (T.Limit margins are -2 C)."""
    text = value_or_none(text)
    m = re.match(r"^(-?\d{1,19})(?:\s+\S.*)?$", text, re.ASCII) if text is not None else None
    return parse_int(m.group(1), signed=True) if m else None


def to_int(text: Optional[str]) -> Optional[int]:
    """`16x` -> 16, `29 C` -> 29, `2560 bank(s)` -> 2560, `0x1900` -> 6400; None when unreadable."""
    text = value_or_none(text)
    if text is None:
        return None
    if re.fullmatch(r"0x[0-9a-fA-F]+", text):
        return int(text, 16)
    # ASCII digits only (re.ASCII) and the one integer reader: no reading is negative or 19 digits long.
    m = re.match(r"^(-?\d{1,19})\s*x?$", text, re.ASCII) or re.match(r"^(-?\d{1,19})(?:\s+\S.*)?$", text, re.ASCII)
    return parse_int(m.group(1)) if m else None


def to_float(text: Optional[str]) -> Optional[float]:
    """`67.74 W` -> 67.74, `26.562 GB/s` -> 26.562; None when unreadable."""
    text = value_or_none(text)
    if text is None:
        return None
    m = re.match(r"^(-?\d+(?:\.\d+)?)", text, re.ASCII)
    return parse_float(m.group(1)) if m else None


def to_bool(text: Optional[str]) -> Optional[bool]:
    """Yes/No, Enabled/Disabled, Active/Not Active, On/Off; None otherwise."""
    text = value_or_none(text)
    if text is None:
        return None
    low = text.lower()
    if low in _TRUE:
        return True
    if low in _FALSE:
        return False
    return None


@dataclass
class Node:
    """One line of `nvidia-smi -q`: `key : value`, or a section header (value None) with children."""

    key: str
    value: Optional[str] = None
    children: list[Node] = field(default_factory=list)

    def child(self, *names: str) -> Optional[Node]:
        """The first child whose key matches one of names (case-insensitive), in the order given."""
        for name in names:
            low = name.lower()
            for c in self.children:
                if c.key.lower() == low:
                    return c
        return None

    def get(self, *path: str) -> Optional[str]:
        """The value at a path of keys; each path element may list alternatives separated by '|'."""
        node: Optional[Node] = self
        for part in path:
            if node is None:
                return None
            node = node.child(*part.split("|"))
        return node.value if node is not None else None


def _indent(line: str) -> int:
    expanded = line.expandtabs(8)
    return len(expanded) - len(expanded.lstrip(" "))


def parse_tree(text: str) -> Node:
    """The indentation tree of `nvidia-smi -q` output; never raises."""
    root = Node("")
    stack: list[tuple[int, Node]] = [(-1, root)]
    for raw in text.splitlines():
        if not raw.strip() or raw.strip().startswith("====="):
            continue
        level = _indent(raw)
        line = raw.strip()
        header = _GPU_HEADER.match(line)
        if header:
            key, value = f"GPU {header.group('bus')}", None
        else:
            m = _KV.match(line)
            if m and m.group("key"):
                # `Key :` with nothing after it is a leaf with an empty (unreadable) value.
                key, value = m.group("key").strip(), m.group("value") or ""
            else:
                key, value = line, None
        node = Node(key, value)
        while stack and stack[-1][0] >= level:
            stack.pop()
        parent = stack[-1][1] if stack else root
        parent.children.append(node)
        stack.append((level, node))
    return root


def _sum(values: Iterable[Optional[int]]) -> Optional[int]:
    """Sum of the readable counters; None when none was readable."""
    seen = [v for v in values if v is not None]
    return sum(seen) if seen else None


def _ecc_counts(node: Optional[Node]) -> dict[str, Optional[int]]:
    """Correctable/uncorrectable totals of one Volatile or Aggregate block, in any layout."""
    out: dict[str, Optional[int]] = {
        "correctable": None,
        "uncorrectable": None,
        "sram_correctable": None,
        "sram_uncorrectable": None,
        "dram_correctable": None,
        "dram_uncorrectable": None,
    }
    if node is None:
        return out
    single = node.child("Single Bit")
    double = node.child("Double Bit")
    if single is not None or double is not None:
        # Legacy layout (Kepler..Volta drivers): Single Bit / Double Bit blocks with a Total line each.
        def total(block: Optional[Node]) -> Optional[int]:
            if block is None:
                return None
            t = to_int(block.get("Total"))
            if t is not None:
                return t
            return _sum(to_int(c.value) for c in block.children)

        out["correctable"] = total(single)
        out["uncorrectable"] = total(double)
        out["dram_correctable"] = to_int(single.get("Device Memory")) if single else None
        out["dram_uncorrectable"] = to_int(double.get("Device Memory")) if double else None
        return out
    out["sram_correctable"] = to_int(node.get("SRAM Correctable"))
    sram_unc = to_int(node.get("SRAM Uncorrectable"))
    if sram_unc is None:
        # R535+: SRAM uncorrectable split into parity and SEC-DED errors.
        sram_unc = _sum(
            [to_int(node.get("SRAM Uncorrectable Parity")), to_int(node.get("SRAM Uncorrectable SEC-DED"))]
        )
    out["sram_uncorrectable"] = sram_unc
    out["dram_correctable"] = to_int(node.get("DRAM Correctable"))
    out["dram_uncorrectable"] = to_int(node.get("DRAM Uncorrectable"))
    out["correctable"] = _sum([out["sram_correctable"], out["dram_correctable"]])
    out["uncorrectable"] = _sum([out["sram_uncorrectable"], out["dram_uncorrectable"]])
    # Some Ampere drivers print plain `Correctable` / `Uncorrectable` lines under Volatile.
    if out["correctable"] is None:
        out["correctable"] = to_int(node.get("Correctable|Total Correctable"))
    if out["uncorrectable"] is None:
        out["uncorrectable"] = to_int(node.get("Uncorrectable|Total Uncorrectable"))
    return out


def _snake(name: str) -> str:
    return re.sub(r"[^a-z0-9]+", "_", name.lower()).strip("_")


def _throttle_reasons(gpu: Node) -> dict[str, Optional[bool]]:
    section = gpu.child("Clocks Event Reasons", "Clocks Throttle Reasons", "Clocks Throttle Reason")
    reasons: dict[str, Optional[bool]] = {}
    if section is None:
        return reasons

    def walk(node: Node) -> None:
        for c in node.children:
            if c.value is not None:
                reasons[_snake(c.key)] = to_bool(c.value)
            walk(c)

    walk(section)
    return reasons


def _processes(gpu: Node) -> Optional[list[dict[str, Any]]]:
    node = gpu.child("Processes")
    if node is None:
        return None
    if not node.children:
        # `Processes : None` means none running; other values (N/A) mean unknown.
        return [] if (node.value or "").strip().lower() == "none" else None
    procs: list[dict[str, Any]] = []
    pending: dict[str, Any] = {}

    def flatten(n: Node) -> Iterable[Node]:
        for c in n.children:
            yield c
            yield from flatten(c)

    for c in flatten(node):
        key = c.key.lower()
        if key in ("gpu instance id", "compute instance id"):
            pending[_snake(c.key)] = to_int(c.value)
        elif key == "process id":
            procs.append(
                {"pid": to_int(c.value), "type": None, "name": None, "used_memory_mib": None, **pending}
            )
            pending = {}
        elif procs and key == "type":
            procs[-1]["type"] = value_or_none(c.value)
        elif procs and key == "name":
            procs[-1]["name"] = value_or_none(c.value)
        elif procs and key == "used gpu memory":
            procs[-1]["used_memory_mib"] = to_int(c.value)
    return procs


# nvmlDeviceGetGpuRecoveryAction values (NVML_GPU_RECOVERY_ACTION_*), as ddpdoctor names them; nvidia-smi
# prints "None", "Reset", "Reboot", "Drain P2P", "Drain and Reset" (and some builds the NVML names,
# "GPU_RESET", "NODE_REBOOT").
RECOVERY_ACTIONS = (
    "none",
    "reset",
    "reboot",
    "drain_p2p",
    "drain_and_reset",
    "recover_imex_domain",
    "bus_reset",
    "system_reboot",
)
_RECOVERY_ALIASES = {
    "gpu_reset": "reset",
    "node_reboot": "reboot",
    "drain_and_reset_recommended": "drain_and_reset",
}


def to_recovery_action(text: Optional[str]) -> Optional[str]:
    """`GPU Recovery Action` to one of RECOVERY_ACTIONS (an unknown action is kept, normalised); None when unreadable."""
    text = value_or_none(text)
    if text is None:
        return None
    low = re.sub(r"[^a-z0-9]+", "_", text.lower()).strip("_")
    return _RECOVERY_ALIASES.get(low, low) or None


def to_compute_mode(text: Optional[str]) -> Optional[str]:
    """Normalise to Default / Exclusive_Process / Exclusive_Thread / Prohibited."""
    text = value_or_none(text)
    if text is None:
        return None
    low = text.lower().replace(" ", "_").replace(".", "")
    if low.startswith("default"):
        return "Default"
    if "prohibited" in low:
        return "Prohibited"
    if "thread" in low:
        return "Exclusive_Thread"
    if low.startswith("e") and "process" in low:
        return "Exclusive_Process"
    return text


def _mode_pair(node: Optional[Node]) -> dict[str, Optional[bool]]:
    if node is None:
        return {"current": None, "pending": None}
    if node.value and not node.children:
        return {"current": to_bool(node.value), "pending": None}
    return {"current": to_bool(node.get("Current")), "pending": to_bool(node.get("Pending"))}


# Per-GPU sections read field by field: output key -> (converter, path under the GPU section). A path
# element may list alternatives separated by '|' (names changed across driver generations).
_Field = tuple[Callable[[Optional[str]], Any], tuple[str, ...]]
_SECTIONS: dict[str, dict[str, _Field]] = {
    "retired_pages": {
        "single_bit": (to_int, ("Retired Pages", "Single Bit ECC")),
        "double_bit": (to_int, ("Retired Pages", "Double Bit ECC")),
        "pending": (to_bool, ("Retired Pages", "Pending Page Blacklist|Pending|Pending Page Retirement")),
    },
    "remapped_rows": {
        "pending": (to_bool, ("Remapped Rows", "Pending")),
        "failure": (to_bool, ("Remapped Rows", "Remapping Failure Occurred")),
        "uncorrectable": (to_int, ("Remapped Rows", "Uncorrectable Error")),
        "correctable": (to_int, ("Remapped Rows", "Correctable Error")),
        "banks_max": (to_int, ("Remapped Rows", "Bank Remap Availability Histogram", "Max")),
        "banks_none": (to_int, ("Remapped Rows", "Bank Remap Availability Histogram", "None")),
    },
    "pcie": {
        "gen_current": (to_int, ("PCI", "GPU Link Info", "PCIe Generation", "Current")),
        "gen_max": (to_int, ("PCI", "GPU Link Info", "PCIe Generation", "Max")),
        "gen_device_max": (to_int, ("PCI", "GPU Link Info", "PCIe Generation", "Device Max")),
        "gen_host_max": (to_int, ("PCI", "GPU Link Info", "PCIe Generation", "Host Max")),
        "width_current": (to_int, ("PCI", "GPU Link Info", "Link Width", "Current")),
        "width_max": (to_int, ("PCI", "GPU Link Info", "Link Width", "Max")),
        "replays": (to_int, ("PCI", "Replays Since Reset|Replays since reset")),
        "replay_rollovers": (to_int, ("PCI", "Replay Number Rollovers")),
    },
    "temperature": {
        "gpu_c": (to_signed_int, ("Temperature", "GPU Current Temp")),
        "memory_c": (to_signed_int, ("Temperature", "Memory Current Temp")),
        "slowdown_c": (to_signed_int, ("Temperature", "GPU Slowdown Temp")),
        "shutdown_c": (to_signed_int, ("Temperature", "GPU Shutdown Temp")),
        "max_operating_c": (to_signed_int, ("Temperature", "GPU Max Operating Temp")),
        # R535+ prints T.Limit values: headroom (degrees below the limit), not absolute limits.
        "t_limit_c": (to_signed_int, ("Temperature", "GPU T.Limit Temp")),
        "slowdown_t_limit_c": (to_signed_int, ("Temperature", "GPU Slowdown T.Limit Temp")),
        "shutdown_t_limit_c": (to_signed_int, ("Temperature", "GPU Shutdown T.Limit Temp")),
    },
    "power": {
        "draw_w": (
            to_float,
            ("GPU Power Readings|Power Readings", "Power Draw|Average Power Draw|Instantaneous Power Draw"),
        ),
        "limit_w": (
            to_float,
            ("GPU Power Readings|Power Readings", "Current Power Limit|Enforced Power Limit|Power Limit"),
        ),
        "default_limit_w": (to_float, ("GPU Power Readings|Power Readings", "Default Power Limit")),
        "max_limit_w": (to_float, ("GPU Power Readings|Power Readings", "Max Power Limit")),
        # What the admin set; "Current" is what the platform enforces, lower when it caps the GPU.
        "requested_limit_w": (to_float, ("GPU Power Readings|Power Readings", "Requested Power Limit")),
        # Grace Hopper/Blackwell modules share one budget between CPU and GPU.
        "module_limit_w": (to_float, ("Module Power Readings", "Current Power Limit")),
    },
    "memory": {
        "total_mib": (to_int, ("FB Memory Usage", "Total")),
        "used_mib": (to_int, ("FB Memory Usage", "Used")),
        "free_mib": (to_int, ("FB Memory Usage", "Free")),
    },
    "utilization": {
        "gpu_percent": (to_int, ("Utilization", "Gpu|GPU")),
        "memory_percent": (to_int, ("Utilization", "Memory")),
    },
    "fabric": {
        "state": (value_or_none, ("Fabric", "State")),
        "status": (value_or_none, ("Fabric", "Status")),
    },
}
_FIELDS: dict[str, _Field] = {
    "name": (value_or_none, ("Product Name",)),
    "uuid": (value_or_none, ("GPU UUID",)),
    "serial": (value_or_none, ("Serial Number",)),
    "architecture": (value_or_none, ("Product Architecture",)),
    "vbios_version": (value_or_none, ("VBIOS Version",)),
    "minor_number": (to_int, ("Minor Number",)),
    "persistence_mode": (to_bool, ("Persistence Mode",)),
    "compute_mode": (to_compute_mode, ("Compute Mode",)),
    "reset_required": (to_bool, ("GPU Reset Status", "Reset Required")),
    "drain_and_reset_recommended": (to_bool, ("GPU Reset Status", "Drain and Reset Recommended")),
    "recovery_action": (to_recovery_action, ("GPU Recovery Action",)),
}


def _read(gpu: Node, fields: dict[str, _Field]) -> dict[str, Any]:
    return {key: convert(gpu.get(*path)) for key, (convert, path) in fields.items()}


def parse_gpu_section(gpu: Node, index: int) -> dict[str, Any]:
    """One `GPU <bus id>` section in the documented per-GPU shape."""
    ecc_errors = gpu.child("ECC Errors")
    return {
        "index": index,
        "bus_id": value_or_none(gpu.get("PCI", "Bus Id")) or gpu.key.split(" ", 1)[-1],
        **_read(gpu, _FIELDS),
        "mig_mode": _mode_pair(gpu.child("MIG Mode")),
        "ecc_mode": _mode_pair(gpu.child("ECC Mode", "Ecc Mode")),
        "ecc": {
            "volatile": _ecc_counts(ecc_errors.child("Volatile") if ecc_errors else None),
            "aggregate": _ecc_counts(ecc_errors.child("Aggregate") if ecc_errors else None),
            "sram_threshold_exceeded": to_bool(gpu.get("ECC Errors", "Aggregate", "SRAM Threshold Exceeded")),
        },
        **{name: _read(gpu, fields) for name, fields in _SECTIONS.items()},
        "throttle_reasons": _throttle_reasons(gpu),
        "processes": _processes(gpu),
        "lost": False,
        "error": None,
    }


def parse_nvidia_smi_q(text: str) -> dict[str, Any]:
    """`nvidia-smi -q` to `{driver_version, cuda_version, attached_gpus, gpus: [...], errors: [...]}`.

    Equivalent: nvidia-smi -q. Never raises; what is missing is None. `errors` holds the lines in which
    nvidia-smi said it could not talk to the driver or a GPU (e.g. `Unable to determine the device
    handle for GPU 0000:0B:00.0: Unknown Error`).
    """
    tree = parse_tree(text)
    gpus = [c for c in tree.children if _GPU_HEADER.match(c.key)]
    errors = [m.group(1).strip() for m in ERROR_LINES.finditer(text)]
    sections = [parse_gpu_section(g, i) for i, g in enumerate(gpus)]
    if not gpus and any(c.key.lower() in _GPU_SECTION_KEYS for c in tree.children):
        # A bug report's excerpt that starts inside one GPU's section (ECC, retired pages, temperature,
        # power) with no `GPU 0000:...` line above it: one GPU whose bus id is unknown.
        section = parse_gpu_section(tree, 0)
        section["bus_id"] = value_or_none(tree.get("PCI", "Bus Id"))
        sections = [section]
    return {
        "timestamp": value_or_none(tree.get("Timestamp")),
        "driver_version": value_or_none(tree.get("Driver Version")),
        "cuda_version": value_or_none(tree.get("CUDA Version")),
        "attached_gpus": to_int(tree.get("Attached GPUs")),
        "gpus": sections,
        "errors": errors,
    }


# Keys that only a GPU's own section holds (never the top of `nvidia-smi -q`).
_GPU_SECTION_KEYS = frozenset(
    k.lower()
    for k in (
        "Product Name", "Product Architecture", "GPU UUID", "Serial Number", "VBIOS Version", "PCI",
        "FB Memory Usage", "Compute Mode", "Utilization", "ECC Mode", "ECC Errors", "Retired Pages",
        "Remapped Rows", "Temperature", "GPU Power Readings", "Power Readings", "Module Power Readings",
        "Clocks", "Max Clocks", "Clocks Event Reasons", "Clocks Throttle Reasons", "Performance State",
        "Persistence Mode", "GPU Reset Status", "GPU Recovery Action", "Processes", "Fabric",
    )
)


_UNIT_IN_HEADER = re.compile(r"^(?P<name>.*?)\s*\[(?P<unit>[^\]]*)\]\s*$")


def _csv_value(text: str, numeric: bool) -> Any:
    value = value_or_none(text)
    if value is None or not numeric:
        return value
    m = _NUMBER.match(value)
    if not m:
        return value
    num = m.group(1)
    # The one number readers: another script's digits, a negative count or 19 digits are no reading.
    number = parse_float(num) if "." in num else parse_int(num)
    return value if number is None else number


def _looks_like_header(cells: list[str]) -> bool:
    # Field names are dotted lower-case identifiers (`pci.bus_id`, `memory.total [MiB]`).
    return bool(cells) and all(re.fullmatch(r"[a-z_][a-z0-9_.]*(\s*\[[^\]]*\])?", c.strip()) for c in cells)


def parse_nvidia_smi_csv(text: str, fields: Optional[list[str]] = None) -> dict[str, Any]:
    """`nvidia-smi --query-gpu=... --format=csv[,noheader][,nounits]` to rows.

    Equivalent: nvidia-smi --query-gpu=name,pci.bus_id --format=csv. With a header (or `fields`
    given) each row is also a `records` dict keyed by field name. Values are strings; a field whose
    header names a unit (`memory.total [MiB]`) or whose value carries one (`5934 MiB`) becomes a
    number. `N/A`-style values are None. Lines that are not rows (`[...]` elisions) are skipped.
    """
    header: Optional[list[str]] = None
    units: dict[str, str] = {}
    rows: list[list[Any]] = []
    names: Optional[list[str]] = list(fields) if fields else None
    for line in text.splitlines():
        if (
            not line.strip()
            or line.strip() in ("[...]", "...")
            or "," not in line
            and names
            and len(names) > 1
        ):
            continue
        cells = [c.strip() for c in line.split(",")]
        if header is None and names is None and not rows and _looks_like_header(cells):
            header = cells
            names = []
            for c in cells:
                m = _UNIT_IN_HEADER.match(c)
                if m:
                    names.append(m.group("name"))
                    units[m.group("name")] = m.group("unit")
                else:
                    names.append(c)
            continue
        row: list[Any] = []
        for i, c in enumerate(cells):
            name = names[i] if names and i < len(names) else None
            carries_unit = bool(re.fullmatch(r"-?\d+(\.\d+)?\s+\S+", c.strip(), re.ASCII))
            row.append(_csv_value(c, numeric=(name in units) or carries_unit))
        rows.append(row)
    if not fields and not _is_gpu_query(header, rows):
        # HTML, a traceback, another tool's CSV or JSON: every line would be a "row" (exit 3 in `parse`).
        return {"header": None, "fields": None, "units": {}, "rows": [], "records": None}
    records = [dict(zip(names, r)) for r in rows] if names else None
    return {"header": header, "fields": names, "units": units, "rows": rows, "records": records}


# The first part of every --query-gpu field name (`nvidia-smi --help-query-gpu`).
_QUERY_FIELDS = frozenset((
    "accounting", "addressing_mode", "clocks", "clocks_event_reasons", "clocks_throttle_reasons",
    "compute_cap", "compute_mode", "count", "display_active", "display_mode", "driver_model",
    "driver_version", "ecc", "encoder", "enforced", "fabric", "fan", "gom", "gpu_bus_id", "gpu_name",
    "gpu_serial", "gpu_uuid", "index", "inforom", "memory", "mig", "module_id", "name", "pci",
    "persistence_mode", "power", "protected_memory", "pstate", "reset_status", "retired_pages",
    "serial", "temperature", "timestamp", "utilization", "uuid", "vbios_version", "platform",
))
_BUS_ID = re.compile(r"[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-9A-Fa-f]")
_GPU_VALUE = re.compile(r"GPU-[0-9a-fA-F-]{8,}|(?:NVIDIA|Tesla|Quadro|GeForce|TITAN)\b.*")


def _is_gpu_query(header: Optional[list[str]], rows: list[list[Any]]) -> bool:
    """A header naming --query-gpu fields, or (noheader) a row holding a bus id, GPU uuid or GPU name."""
    if header is not None:
        return any(c.split(" [", 1)[0].split(".", 1)[0] in _QUERY_FIELDS for c in header)
    return any(
        isinstance(cell, str) and (_BUS_ID.fullmatch(cell) or _GPU_VALUE.fullmatch(cell))
        for row in rows for cell in row
    )


PARSE_TOOLS = {"nvidia-smi-q": parse_nvidia_smi_q, "nvidia-smi-csv": parse_nvidia_smi_csv}
