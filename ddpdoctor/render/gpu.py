"""GPU views: the compact topology matrix (plain text for evidence, a rich table for reports)."""

from __future__ import annotations

from typing import Any, Mapping, Optional

from rich.table import Table
from rich.text import Text

# How each link kind is drawn in reports: NVLink good, same-switch PCIe fine, crossing sockets slow.
LINK_STYLES = {"NV": "green", "PIX": "green", "PXB": "cyan", "PHB": "yellow", "NODE": "yellow", "SYS": "red"}


def _labels(topo: Mapping[str, Any], with_nics: bool) -> list[str]:
    labels = list(topo.get("gpus") or [])
    if with_nics:
        labels += list(topo.get("nics") or [])
    return labels


def _cell(topo: Mapping[str, Any], row: str, col: str) -> str:
    matrix = topo.get("matrix") or {}
    value = (matrix.get(row) or {}).get(col) or (matrix.get(col) or {}).get(row)
    return str(value) if value else "?"


def _short(label: str) -> str:
    # GPU12 -> G12, NIC3 -> N3, mlx5_10 -> mlx5_10: keeps 8+ GPU matrices within 80 columns.
    if label.startswith("GPU") and label[3:].isdigit():
        return "G" + label[3:]
    if label.startswith("NIC") and label[3:].isdigit():
        return "N" + label[3:]
    return label


def topology_text(topo: Optional[Mapping[str, Any]], with_nics: bool = True) -> str:
    """The `nvidia-smi topo -m` matrix in as few columns as possible, one line per device.

    `topo` is the dict of `ddpdoctor.parsers.nvidia_smi_topo.parse_topo_matrix`; self cells print `X`.
    """
    if not topo:
        return ""
    labels = _labels(topo, with_nics)
    if not labels:
        return ""
    short = [_short(x) for x in labels]
    cells = [[("X" if r == c else _cell(topo, r, c)) for c in labels] for r in labels]
    width = max([len(s) for s in short] + [len(v) for row in cells for v in row]) + 1
    head = " " * (max(len(s) for s in short) + 1)
    lines = [head + "".join(s.rjust(width) for s in short)]
    for s, row in zip(short, cells):
        lines.append(s.ljust(len(head)) + "".join(v.rjust(width) for v in row))
    names = topo.get("nic_names") or {}
    legend = [f"{_short(n)}={names[n]}" for n in labels if n in names and names[n] != n]
    if legend:
        lines.append("NICs: " + ", ".join(legend))
    return "\n".join(lines)


def _style(code: str) -> str:
    if code.startswith("NV"):
        return LINK_STYLES["NV"]
    return LINK_STYLES.get(code, "")


def topology_table(topo: Optional[Mapping[str, Any]], with_nics: bool = True) -> Optional[Table]:
    """The same matrix as a rich Table, link kinds coloured (NVLink green ... SYS red)."""
    if not topo:
        return None
    labels = _labels(topo, with_nics)
    if not labels:
        return None
    # Cells never wrap or shrink: a clipped "NODE" reads as a different link kind.
    width = max([len(_short(x)) for x in labels] + [len(_cell(topo, r, c)) for r in labels for c in labels])
    table = Table(box=None, pad_edge=False, show_edge=False, padding=(0, 0, 0, 1), collapse_padding=True)
    table.add_column("", no_wrap=True)
    for label in labels:
        table.add_column(_short(label), justify="right", no_wrap=True, min_width=width)
    for row in labels:
        cells = []
        for col in labels:
            code = "X" if row == col else _cell(topo, row, col)
            cells.append(Text(code, style="dim" if code == "X" else _style(code)))
        table.add_row(Text(_short(row), style="bold"), *cells)
    return table
