"""nccl-tests `*_perf` output (all_reduce_perf, all_gather_perf, ...) to rows.

Handles the current layout (`size count type redop root | time algbw busbw #wrong | ...`), older ones
without `root` and with an `error` column instead of `#wrong`, single-group tables (ddpdoctor
bench-nccl prints one), interleaved NCCL INFO lines, and `N/A` cells. Column names come from the
header line, so a layout we have not seen still parses.

Real logs are not always the binary's own stdout: `mpirun --tag-output` prefixes every line with
`[1,0]<stdout>:`, `srun --label` with `0: `, and some log viewers drop the leading `#` of the header and
footer lines; all of these parse the same. A run that failed (`Test NCCL failure common.cu:959 '...'`,
`Test CUDA failure ...`) keeps those lines in `errors`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Optional

from ddpdoctor.parsers.numbers import parse_float, parse_int

_PARAMS = re.compile(r"^#?\s*nThread\b")
_DEVICE = re.compile(
    r"^#?\s*Rank\s+(?P<rank>\d+)(?:\s+Group\s+(?P<group>\d+))?\s+Pid\s+(?P<pid>\d+)\s+on\s+(?P<host>\S+)\s+"
    r"device\s+(?P<device>\d+)\s+\[(?P<bus>[^\]]*)\]\s*(?P<name>.*)$", re.ASCII
)
_AVG = re.compile(r"^#?\s*Avg bus bandwidth\s*:\s*(?P<v>[-+\d.eE]+)", re.ASCII)
_OOB = re.compile(r"^#?\s*Out of bounds values\s*:\s*(?P<n>\d{1,18})\s*(?P<status>\w+)?", re.ASCII)
_NCCL_VERSION = re.compile(r"NCCL version\s+(?P<v>\d+\.\d+\.\d+\S*)", re.ASCII)
_TEST_NAME = re.compile(r"^#?\s*Collective test(?: starting)?\s*:\s*(?P<name>\S+)")
# `# nccl-tests version 2.18.0 nccl-headers=22907 nccl-library=22907` (recent nccl-tests, 2.18 here).
_TESTS_VERSION = re.compile(
    r"^#?\s*nccl-tests version\s+(?P<v>\d+\.\d+\.\d+\S*)(?:.*\bnccl-library=(?P<lib>\d{4,6})\b)?", re.ASCII
)
# nccl-tests' TESTCHECK/NCCLCHECK/CUDACHECK messages: `host: Test NCCL failure common.cu:959 'internal
# error ...'`, ` .. host pid 3164639: Test failure common.cu:844`.
_FAILURE = re.compile(r"\bTest (?:NCCL |CUDA |CURAND )?failure\b")
# Launcher prefixes: OpenMPI `--tag-output` (`[1,0]<stdout>:`) and Slurm `srun --label` (`0: `, ` 12: `).
_PREFIX = re.compile(r"^(?:\[\d+,\d+\]<std(?:out|err)>:|\s*\d{1,6}: )", re.ASCII)
_NA = {"N/A", "[N/A]", "n/a", "-", "ERR!"}
_GROUP_FIELDS = {"time", "algbw", "busbw", "#wrong", "error", "wrong"}


@dataclass
class PerfTable:
    params: dict[str, Any] = field(default_factory=dict)
    devices: list[dict[str, Any]] = field(default_factory=list)
    nccl_version: Optional[str] = None
    columns: list[str] = field(default_factory=list)
    rows: list[dict[str, Any]] = field(default_factory=list)
    avg_busbw: Optional[float] = None
    out_of_bounds: Optional[int] = None
    ok: Optional[bool] = None
    nccl_tests_version: Optional[str] = None
    errors: list[str] = field(default_factory=list)


def _num(text: str) -> Any:
    if text in _NA:
        return None
    # The one number reader (parsers/numbers.py): no other script's digits, no negative size, time or
    # bandwidth, nothing past 18 digits.
    number = parse_int(text)
    return number if number is not None else parse_float(text)


def _parse_params(line: str) -> dict[str, Any]:
    """`# nThread 1 nGpus 2 minBytes 8 ... step: 2(factor) warmup iters: 5 iters: 20 ...`."""
    body = line.lstrip("#").strip()
    params: dict[str, Any] = {}
    for m in re.finditer(r"([A-Za-z][A-Za-z ]*?):?\s+(-?\d+)(?:\((\w+)\))?", body):
        key = m.group(1).strip().replace(" ", "_")
        value = parse_int(m.group(2))
        if value is None:
            continue
        params[key] = value
        if m.group(3):
            params[f"{key}_kind"] = m.group(3)
    return params


def _header_columns(line: str) -> Optional[list[str]]:
    tokens = line.lstrip("#").split()
    if len(tokens) < 4 or tokens[0] != "size" or "count" not in tokens or "time" not in tokens:
        return None
    return tokens


def _split_groups(columns: list[str]) -> tuple[list[str], list[list[str]]]:
    """Leading columns, then one group per repeat of time/algbw/busbw/#wrong (out-of-place, in-place)."""
    first = columns.index("time")
    lead = columns[:first]
    groups: list[list[str]] = []
    for name in columns[first:]:
        if name == "time" or not groups:
            groups.append([])
        groups[-1].append(name)
    return lead, groups


def _group_values(names: list[str], values: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, raw in zip(names, values):
        key = {"time": "time_us", "#wrong": "wrong"}.get(name, name)
        value = _num(raw)
        if key == "wrong" and isinstance(value, float) and value.is_integer():
            value = int(value)
        out[key] = value
    return out


def _nccl_version_from_code(code: int) -> str:
    """NCCL_VERSION_CODE to `2.29.7`: major*10000+minor*100+patch since 2.9, major*1000+... before."""
    if code >= 10000:
        return f"{code // 10000}.{code % 10000 // 100}.{code % 100}"
    return f"{code // 1000}.{code % 1000 // 100}.{code % 100}"


def _device(d: re.Match[str]) -> dict[str, Any]:
    return {
        "rank": parse_int(d.group("rank")),
        "group": parse_int(d.group("group")),
        "pid": parse_int(d.group("pid")),
        "host": d.group("host"),
        "device": parse_int(d.group("device")),
        "bus_id": d.group("bus"),
        "name": d.group("name").strip(),
    }


def _read_meta(table: PerfTable, line: str) -> bool:
    """Fill the table from a parameter, device, footer or version line; False for any other line."""
    if _PARAMS.match(line):
        table.params = _parse_params(line)
    elif (d := _DEVICE.match(line)) is not None:
        table.devices.append(_device(d))
    elif (a := _AVG.match(line)) is not None:
        table.avg_busbw = _num(a.group("v"))
    elif (o := _OOB.match(line)) is not None:
        table.out_of_bounds = parse_int(o.group("n"))
        if o.group("status"):
            table.ok = o.group("status").upper() == "OK"
    elif (v := _TESTS_VERSION.match(line)) is not None:
        table.nccl_tests_version = v.group("v")
        if v.group("lib") and table.nccl_version is None:
            table.nccl_version = _nccl_version_from_code(parse_int(v.group("lib"), 0))
    else:
        return False
    return True


def _row(columns: list[str], values: list[str], test_name: Optional[str]) -> Optional[dict[str, Any]]:
    """One data row by the header's columns; None for a line that only starts with a number."""
    if not values or parse_int(values[0]) is None:
        return None  # NCCL INFO lines and other noise between rows
    lead, groups = _split_groups(columns)
    if len(values) < len(lead) + len(groups[0]):
        return None
    if "type" in lead and _num(values[lead.index("type")]) is not None:
        return None  # a number where the data type's name goes: not a row of this table
    row: dict[str, Any] = {}
    for name, raw in zip(lead, values):
        # root is -1 for collectives without one (all_reduce); every other column is a size or count.
        row[name] = raw if name in ("type", "redop") else (parse_int(raw, signed=True) if name == "root" else _num(raw))
    rest = values[len(lead) :]
    if len(groups) == 1:
        labels = ["out_of_place"]
    elif len(groups) == 2:
        labels = ["out_of_place", "in_place"]
    else:
        labels = [f"group{i}" for i in range(len(groups))]
    for label, names in zip(labels, groups):
        if not rest:
            break
        row[label] = _group_values(names, rest[: len(names)])
        rest = rest[len(names) :]
    if test_name:
        row["test"] = test_name
    return row


def parse_nccl_tests(text: str) -> PerfTable:
    """Parse the output of an nccl-tests binary (or `ddpdoctor bench-nccl`); never raises."""
    table = PerfTable()
    columns: Optional[list[str]] = None
    test_name: Optional[str] = None
    for raw_line in text.splitlines():
        line = _PREFIX.sub("", raw_line, count=1).strip()
        if not line:
            continue
        m = _NCCL_VERSION.search(line)
        if m:
            # The library's own banner beats the code decoded from the nccl-tests version line.
            table.nccl_version = m.group("v")
        if _FAILURE.search(line):
            table.errors.append(line)
        elif _read_meta(table, line):
            pass
        elif (t := _TEST_NAME.match(line)) is not None:
            test_name = t.group("name")
        elif (cols := _header_columns(line)) is not None:
            columns = cols
            table.columns = cols
        elif columns is not None and not line.startswith("#"):
            row = _row(columns, line.split(), test_name)
            if row is not None:
                table.rows.append(row)
    return table


PARSE_TOOLS = {"nccl-tests": parse_nccl_tests}
