"""The default `nvidia-smi` table (the box-drawing one) to a plain dict.

Two table generations are in the wild. Drivers up to R525 print 79 columns
(`GPU  Name        Persistence-M| Bus-Id        Disp.A | Volatile Uncorr. ECC |`); R530 and later widen it
to 87-91 columns, and R580 starts the column borders with `+` instead of `|`. From R450 a third row per
GPU carries `MIG M.`; on older drivers a GPU is two rows. The process table is `GPU  PID  Type  Process
name` before R450 and `GPU  GI  CI  PID  Type  Process name` after. The parser therefore splits rows on
`|` and reads cells by their content, never by column offsets, so widths, indentation (a paste in a
Markdown list) or a `# ` prefix do not matter. A value nvidia-smi could not read (`N/A`, `[N/A]`, `ERR!`,
`Unknown Error`) becomes None, and the lines in which nvidia-smi said it could not run at all go to
`errors` (the same detection as the `nvidia-smi -q` parser).
"""

from __future__ import annotations

import re
from typing import Any, Optional

from ddpdoctor.parsers.numbers import parse_float, parse_int
from ddpdoctor.parsers.nvidia_smi import ERROR_LINES, to_bool, to_compute_mode, value_or_none

_BOX = frozenset("-=+|")
_DRIVER = re.compile(r"Driver Version:\s*(\S+)")
_CUDA = re.compile(r"CUDA Version:\s*(\S+)")
# The number a value starts with (`72W`, `81559MiB`); parse_int bounds its digits.
_LEADING_INT = re.compile(r"-?[0-9]+")
_FLOAT = re.compile(r"^-?\d{1,18}(?:\.\d{1,18})?", re.ASCII)
# `72W /  700W`, `1MiB /  81559MiB`, `N/A /  N/A`: the slash between spaces, so the one in `N/A` is not it.
_PAIR = re.compile(r"^(?P<left>.*?\S)\s+/\s+(?P<right>\S+)$")
# Process rows. Memory is `1357MiB` or `N/A` (WDDM on Windows, and containers without PID visibility).
_MEM = r"(?P<mem>\d{1,18}\s*MiB|N/A|\[N/A\])"
_PROCESS_NEW = re.compile(
    r"^(?P<gpu>\d{1,9})\s+(?P<gi>\S+)\s+(?P<ci>\S+)\s+(?P<pid>\d{1,18})\s+(?P<type>[A-Z+]{1,5})\s+"
    r"(?P<name>.*?)\s+" + _MEM + r"$", re.ASCII
)
_PROCESS_OLD = re.compile(
    r"^(?P<gpu>\d{1,9})\s+(?P<pid>\d{1,18})\s+(?P<type>[A-Z+]{1,5})\s+(?P<name>.*?)\s+" + _MEM + r"$", re.ASCII
)
# Persistence-mode column values; on Windows the column shows the driver model (WDDM/TCC) instead.
_PERSISTENCE = {"on", "off", "n/a", "[n/a]", "err!", "wddm", "tcc", "mcdm"}


def _int(text: Optional[str]) -> Optional[int]:
    """`72W` -> 72, `81559MiB` -> 81559, `N/A` -> None: the unit dropped, the number read by parse_int."""
    text = value_or_none(text)
    m = _LEADING_INT.match(text.strip()) if text else None
    return parse_int(m.group(0), signed=True) if m else None


def _float(text: Optional[str]) -> Optional[float]:
    """`72.50W` -> 72.5, `N/A` -> None."""
    text = value_or_none(text)
    m = _FLOAT.match(text) if text else None
    return parse_float(m.group(0), signed=True) if m else None


def _table_part(line: str) -> Optional[str]:
    """The line from its first `|` or `+` on (dropping indentation or a `# ` prefix), or None."""
    starts = [i for i in (line.find("|"), line.find("+")) if i >= 0]
    if not starts:
        return None
    return line[min(starts) :].rstrip()


def _is_border(body: str) -> bool:
    """`+---+`, `|---+---|`, `|===+===|`: only box characters, with at least three dashes or equal signs
    so that a row of empty cells is not mistaken for one."""
    return set(body) <= _BOX and body.count("-") + body.count("=") >= 3


def _cells(body: str) -> list[str]:
    """The cells of a `| a | b | c |` row, unstripped."""
    inner = body[1:] if body.startswith("|") else body
    if inner.endswith("|"):
        inner = inner[:-1]
    return inner.split("|")


def _gpu_row1(cells: list[str], gpu: dict[str, Any]) -> bool:
    """`|   0  NVIDIA H100 80GB HBM3    On  |   00000000:19:00.0 Off |    0 |`; False if not such a row."""
    m = re.match(r"^\s*(\d{1,9})(?:\s+(.*?))?\s*$", cells[0], re.ASCII)
    if not m:
        return False
    gpu["index"] = parse_int(m.group(1))
    rest = (m.group(2) or "").split()
    if rest and rest[-1].lower() in _PERSISTENCE:
        gpu["persistence_mode"] = to_bool(rest[-1])
        rest = rest[:-1]
    gpu["name"] = " ".join(rest) or None
    bus = cells[1].split() if len(cells) > 1 else []
    if bus:
        gpu["bus_id"] = value_or_none(bus[0])
        gpu["display_active"] = to_bool(" ".join(bus[1:]))
    if len(cells) > 2:
        ecc = value_or_none(cells[2])
        # With MIG enabled the column shows `On`, not a count; only a plain number is a count.
        gpu["ecc_uncorrectable"] = parse_int(ecc)
    return True


def _gpu_row2(cells: list[str], gpu: dict[str, Any]) -> None:
    """`| N/A   27C    P0     72W /  700W |   1MiB /  81559MiB |   0%   Default |`."""
    left = cells[0]
    pair = _PAIR.match(left.strip())
    if pair:
        tokens = pair.group("left").split()
        gpu["power_cap_w"] = _float(pair.group("right"))
        gpu["power_draw_w"] = _float(tokens.pop()) if tokens else None
    else:
        tokens = left.split()
    fan = temp = perf = None
    for token in tokens:
        if re.fullmatch(r"\d{1,3}%", token, re.ASCII):
            fan = token
        elif re.fullmatch(r"-?\d{1,4}C", token, re.ASCII):
            temp = token
        elif re.fullmatch(r"P\d{1,2}", token, re.ASCII):
            perf = token
    if len(tokens) == 3:
        # Unreadable values (`ERR!`, `N/A`) carry no unit: fall back to the column order.
        fan, temp, perf = fan or tokens[0], temp or tokens[1], perf or tokens[2]
    gpu["fan_percent"] = _int(fan)
    gpu["temperature_c"] = _int(temp)
    gpu["perf_state"] = value_or_none(perf) if perf and re.fullmatch(r"P\d{1,2}", perf, re.ASCII) else None
    if len(cells) > 1:
        mem = _PAIR.match(cells[1].strip())
        if mem:
            gpu["memory_used_mib"] = _int(mem.group("left"))
            gpu["memory_total_mib"] = _int(mem.group("right"))
    if len(cells) > 2:
        parts = cells[2].split(None, 1)
        if parts:
            gpu["utilization_percent"] = _int(parts[0]) if parts[0].endswith("%") else None
            gpu["compute_mode"] = to_compute_mode(parts[1] if len(parts) > 1 else None)


def _gpu_row3(cells: list[str], gpu: dict[str, Any]) -> None:
    """`|   |   |   Disabled |`: the MIG mode; `Disabled*` means a change waits for a GPU reset."""
    if len(cells) > 2:
        mig = cells[2].strip()
        gpu["mig_mode"] = to_bool(mig.rstrip("*"))
        gpu["mig_mode_pending_reset"] = None if gpu["mig_mode"] is None else mig.endswith("*")


def _new_gpu() -> dict[str, Any]:
    return {
        "index": None,
        "name": None,
        "persistence_mode": None,
        "bus_id": None,
        "display_active": None,
        "ecc_uncorrectable": None,
        "fan_percent": None,
        "temperature_c": None,
        "perf_state": None,
        "power_draw_w": None,
        "power_cap_w": None,
        "memory_used_mib": None,
        "memory_total_mib": None,
        "utilization_percent": None,
        "compute_mode": None,
        "mig_mode": None,
        "mig_mode_pending_reset": None,
    }


def _parse_gpu(rows: list[list[str]]) -> Optional[dict[str, Any]]:
    """One GPU record (2 rows before R450, 3 after) between two borders; None if it is not one."""
    rows = [r for r in rows if len(r) >= 2]
    if not rows:
        return None
    gpu = _new_gpu()
    if not _gpu_row1(rows[0], gpu):
        return None
    if len(rows) > 1:
        _gpu_row2(rows[1], gpu)
    if len(rows) > 2:
        _gpu_row3(rows[2], gpu)
    return gpu


def _parse_mig_device(rows: list[list[str]]) -> Optional[dict[str, Any]]:
    """`|  0    2   0   0  |  142MiB / 20096MiB | 56      0 |  4   0    2    0    0 |` (+ BAR1 row)."""
    rows = [r for r in rows if len(r) >= 3]
    if not rows:
        return None
    ids = rows[0][0].split()
    if len(ids) < 4 or not all(re.fullmatch(r"\d{1,9}", i, re.ASCII) for i in ids[:4]):
        return None
    dev: dict[str, Any] = {
        "gpu": int(ids[0]),
        "gi_id": int(ids[1]),
        "ci_id": int(ids[2]),
        "mig_dev": int(ids[3]),
        "memory_used_mib": None,
        "memory_total_mib": None,
        "bar1_used_mib": None,
        "bar1_total_mib": None,
        "sm_count": None,
        "ecc_uncorrectable": None,
    }
    mem = _PAIR.match(rows[0][1].strip())
    if mem:
        dev["memory_used_mib"], dev["memory_total_mib"] = _int(mem.group("left")), _int(mem.group("right"))
    sm = rows[0][2].split()
    if sm:
        dev["sm_count"] = _int(sm[0])
        dev["ecc_uncorrectable"] = _int(sm[1]) if len(sm) > 1 else None
    if len(rows) > 1:
        bar1 = _PAIR.match(rows[1][1].strip())
        if bar1:
            dev["bar1_used_mib"], dev["bar1_total_mib"] = _int(bar1.group("left")), _int(bar1.group("right"))
    return dev


def _parse_process(text: str, with_instances: bool) -> Optional[dict[str, Any]]:
    """One process row, in the layout the header announced (the other layout as a fallback)."""
    text = text.strip()
    first, second = (_PROCESS_NEW, _PROCESS_OLD) if with_instances else (_PROCESS_OLD, _PROCESS_NEW)
    m = first.match(text) or second.match(text)
    if not m:
        return None
    groups = m.groupdict()
    return {
        "gpu": int(groups["gpu"]),
        "gi_id": _int(groups.get("gi")),
        "ci_id": _int(groups.get("ci")),
        "pid": int(groups["pid"]),
        "type": groups["type"],
        # Long names are cut by nvidia-smi (`...-token=3E0E...`); kept as printed.
        "name": value_or_none(groups["name"]),
        "used_memory_mib": _int(groups["mem"]),
    }


def parse_nvidia_smi_table(text: str) -> dict[str, Any]:
    """The default `nvidia-smi` table to `{driver_version, cuda_version, gpus, processes, mig_devices, errors}`.

    Equivalent: nvidia-smi. Never raises. `processes` is `[]` for `No running processes found` and None
    when the process table is absent or says `Not Supported`; `mig_devices` is None without a `MIG
    devices:` table. Only the first table of a file holding several snapshots is read.
    """
    out: dict[str, Any] = {
        "driver_version": None,
        "cuda_version": None,
        "gpus": [],
        "processes": None,
        "mig_devices": None,
        "errors": [m.group(1).strip() for m in ERROR_LINES.finditer(text)],
    }
    state: Optional[str] = None
    record: list[list[str]] = []
    with_instances = False
    processes_unsupported = False
    seen_header = False

    def flush() -> None:
        if state == "gpu" and record:
            gpu = _parse_gpu(record)
            if gpu is not None:
                out["gpus"].append(gpu)
        elif state == "mig" and record:
            dev = _parse_mig_device(record)
            if dev is not None:
                out["mig_devices"].append(dev)
        record.clear()

    for raw in text.splitlines():
        body = _table_part(raw)
        if body is None:
            if raw.strip():
                # Text outside a table ends the current one; blank lines do not (double-spaced pastes).
                flush()
                state = None
            continue
        if not body.strip("|+ "):
            continue  # a row of empty cells
        if _is_border(body):
            flush()
            if "=" in body and state in ("gpu_head", "mig_head", "proc_head"):
                state = state[: -len("_head")]
            continue
        cells = _cells(body)
        first = cells[0].strip()
        if first.startswith("NVIDIA-SMI"):
            if seen_header:
                break  # a second snapshot in the same file
            seen_header = True
            driver, cuda = _DRIVER.search(body), _CUDA.search(body)
            out["driver_version"] = value_or_none(driver.group(1)) if driver else None
            out["cuda_version"] = value_or_none(cuda.group(1)) if cuda else None
        elif re.match(r"GPU\s+Name\b", first):
            flush()
            state = "gpu_head"
        elif first.startswith("MIG devices:"):
            flush()
            state = "mig_head"
            out["mig_devices"] = []
        elif first.startswith("Processes:"):
            flush()
            state = "proc_head"
            out["processes"] = []
        elif state == "proc_head":
            if re.search(r"\bGI\b", first):
                with_instances = True
        elif state in ("gpu", "mig"):
            record.append(cells)
        elif state == "proc":
            row = " ".join(c.strip() for c in cells)
            if "not supported" in row.lower():
                processes_unsupported = True
                continue
            proc = _parse_process(row, with_instances)
            if proc is not None:
                out["processes"].append(proc)
    flush()
    if processes_unsupported and not out["processes"]:
        out["processes"] = None
    return out


PARSE_TOOLS = {"nvidia-smi": parse_nvidia_smi_table}
