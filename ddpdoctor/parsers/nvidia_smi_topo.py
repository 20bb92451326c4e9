"""`nvidia-smi topo -m` and `nvidia-smi topo -p2p <r|w|n|a|p>` matrices to plain dicts.

Handles the old layout (NICs as `mlx5_N` columns, no legend), the new one (`NIC#` columns plus a
`NIC Legend:` block), CPU/NUMA affinity and `GPU NUMA ID` columns, tab- or space-aligned output, output
clipped at the terminal width (what is there is parsed; a cut cell is kept as printed), the ANSI
underline newer drivers put around the header row, and wide matrices whose adjacent cells lost their
separator (`NODENODE`, `PIXNODE` in pasted 36-NIC outputs).
"""

from __future__ import annotations

import re
from typing import Any, Optional

# Column names that are not devices.
_AFFINITY = {
    "cpu affinity": "cpu",
    "numa affinity": "numa",
    "gpu numa id": "gpu_numa_id",
}
_DEVICE = re.compile(r"^(GPU\d+|NIC\d+|mlx\d+_\d+|mlx5_\d+|[a-z]+\d*_\d+|NVS\d*)$")
_NIC_LEGEND_LINE = re.compile(r"^\s*(?P<nic>NIC\d+)\s*:\s*(?P<name>\S+)")
_LEGEND_LINE = re.compile(r"^\s*(?P<code>[A-Z#]+)\s*=\s*(?P<text>.+?)\s*$")
_NV = re.compile(r"^NV(\d{1,6})$")
# Terminal escape sequences: newer drivers underline the header row (`\x1b[4mGPU0 ... GPU NUMA ID\x1b[0m`).
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
# One matrix cell. Two of them with no separator between (`NODENODE`) are split back into two cells;
# affinity values (`0-55,112-167`, `N/A`) never match.
_CELL = r"(?:X|NV\d{1,3}|PIX|PXB|PHB|NODE|SYS|SOC|C2C|OK|NS|CNS|GNS|TNS|DR|U)"
_GLUED = re.compile(rf"{_CELL}{{2,}}")
_ONE_CELL = re.compile(_CELL)

# How far apart two devices are, best first: NVLink, then PCIe paths from shortest to longest.
LINK_RANK = {"X": 0, "NV": 1, "PIX": 2, "PXB": 3, "PHB": 4, "NODE": 5, "SYS": 6, "SOC": 6}


def link_rank(code: Optional[str]) -> int:
    """Order of a topology code (NV# < PIX < PXB < PHB < NODE < SYS); unknown codes sort last."""
    if code is None:
        return 99
    if _NV.match(code):
        return LINK_RANK["NV"]
    return LINK_RANK.get(code, 99)


def nvlink_count(code: Optional[str]) -> Optional[int]:
    """`NV12` -> 12; None for PCIe codes."""
    m = _NV.match(code or "")
    return int(m.group(1)) if m else None


def _split_header(line: str) -> list[str]:
    return [c.strip() for c in re.split(r"\t+|\s{2,}", line.strip()) if c.strip()]


def _split_cells(line: str) -> list[str]:
    """A matrix row's cells, with cells that lost their separator (`NODENODE`) split apart."""
    cells: list[str] = []
    for token in line.split():
        if _GLUED.fullmatch(token):
            cells.extend(_ONE_CELL.findall(token))
        else:
            cells.append(token)
    return cells


def _empty() -> dict[str, Any]:
    return {"gpus": [], "nics": [], "matrix": {}, "affinity": {}, "nic_names": {}, "legend": {}}


def parse_topo_matrix(text: str) -> dict[str, Any]:
    """`nvidia-smi topo -m` to the documented dict (docs/parse.md); never raises.

    Equivalent: nvidia-smi topo -m. `matrix[row][column]` is the code as printed (`X`, `NV12`, `PIX`,
    `PXB`, `PHB`, `NODE`, `SYS`, and for `-p2p` `OK`, `NS`, `GNS`, ...).
    """
    out = _empty()
    lines = ANSI.sub("", text).splitlines()
    # The header names GPU0 but, unlike the rows, has no `X` (self) cell.
    header_at = next(
        (i for i, line in enumerate(lines) if "GPU0" in line.split() and "X" not in line.split()),
        None,
    )
    if header_at is None:
        return out
    columns = _split_header(lines[header_at])
    devices = [c for c in columns if c.lower() not in _AFFINITY]
    # Affinity column names in header order, as they appear after the devices.
    extra = [_AFFINITY[c.lower()] for c in columns if c.lower() in _AFFINITY]
    out["gpus"] = [d for d in devices if d.startswith("GPU")]
    out["nics"] = [d for d in devices if not d.startswith("GPU")]
    section = "matrix"
    for line in lines[header_at + 1 :]:
        stripped = line.strip()
        if not stripped:
            continue
        if stripped.rstrip(":").lower() == "nic legend":
            section = "nic_legend"
            continue
        if stripped.rstrip(":").lower() == "legend":
            section = "legend"
            continue
        if section == "nic_legend":
            m = _NIC_LEGEND_LINE.match(line)
            if m:
                out["nic_names"][m.group("nic")] = m.group("name")
            continue
        if section == "legend":
            m = _LEGEND_LINE.match(line)
            if m:
                out["legend"][m.group("code")] = m.group("text")
            continue
        cells = _split_cells(stripped)
        row = cells[0]
        if row not in devices and not _DEVICE.match(row):
            continue
        values = cells[1:]
        if row not in devices and not row.startswith("GPU"):
            # A header clipped at terminal width can lose the NIC columns while the NIC rows remain.
            out["nics"].append(row)
        out["matrix"][row] = {col: val for col, val in zip(devices, values)}
        rest = values[len(devices) :]
        if row.startswith("GPU") and rest:
            aff: dict[str, Optional[str]] = {}
            for name, val in zip(extra, rest):
                aff[name] = None if val.upper() in ("N/A", "[N/A]") else val
            out["affinity"][row] = aff
    for nic in out["nics"]:
        if nic not in out["nic_names"] and not nic.startswith("NIC"):
            # Old layout: the column is the device name itself.
            out["nic_names"][nic] = nic
    return out


def parse_topo_p2p(text: str) -> dict[str, Any]:
    """`nvidia-smi topo -p2p r` (or w/n/a/p) to `{gpus, matrix, legend}`; never raises.

    Equivalent: nvidia-smi topo -p2p r. `OK` means peer access works; `NS`, `CNS`, `GNS`, `TNS`, `DR`
    and `U` say why not (see `legend`).
    """
    parsed = parse_topo_matrix(text)
    return {"gpus": parsed["gpus"], "matrix": parsed["matrix"], "legend": parsed["legend"]}


def closest_nics(topo: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """For each GPU, the NICs at the shortest PCIe distance: `{"GPU0": {"nics": ["NIC0"], "link": "PIX"}}`."""
    result: dict[str, dict[str, Any]] = {}
    names = topo.get("nic_names") or {}
    for gpu in topo.get("gpus") or []:
        matrix = topo.get("matrix") or {}
        row = matrix.get(gpu) or {}
        links = []
        for nic in topo.get("nics") or []:
            # The matrix is symmetric; a clipped header may leave only the NIC's row.
            code = row.get(nic) or (matrix.get(nic) or {}).get(gpu)
            if code:
                links.append((nic, code))
        if not links:
            continue
        best = min(link_rank(code) for _, code in links)
        if best >= 99:
            continue
        nics = [nic for nic, code in links if link_rank(code) == best]
        result[gpu] = {
            "nics": nics,
            "names": [names.get(n, n) for n in nics],
            "link": next(code for _, code in links if link_rank(code) == best),
        }
    return result


PARSE_TOOLS = {"nvidia-smi-topo": parse_topo_matrix, "nvidia-smi-topo-p2p": parse_topo_p2p}
