"""CUDA samples' text output to plain dicts: `p2pBandwidthLatencyTest`.

p2pBandwidthLatencyTest prints its devices (`Device: 0, <name>, pciBusID: b4, pciDeviceID: 0,
pciDomainID:0`, all hex), whether each pair can use peer access (`Device=0 CAN|CANNOT Access Peer
Device=1`), then a series of titled square matrices: the P2P connectivity (1/0), bandwidth in GB/s with
P2P disabled and enabled, one way and both ways, and latency in microseconds measured by the GPU and by
the CPU. Matrix rows start with the row's device index; the header row names the column indices
(`D\\D 0 1`, `GPU 0 1`, `CPU 0 1`), so tab- or space-separated, trailing blanks or indentation (pastes in
issues) do not matter. Sections the parser does not know are skipped.
"""

from __future__ import annotations

import re
from typing import Any, Optional

_DEVICE = re.compile(
    r"^Device:\s*(?P<index>[0-9]{1,9}),\s*(?P<name>.*?),\s*pciBusID:\s*(?P<bus>[0-9a-fA-F]{1,8}),\s*"
    r"pciDeviceID:\s*(?P<dev>[0-9a-fA-F]{1,8}),\s*pciDomainID:\s*(?P<domain>[0-9a-fA-F]{1,8})"
)
_PEER = re.compile(r"^Device=(?P<a>[0-9]{1,9})\s+(?P<can>CAN|CANNOT)\s+Access Peer Device=(?P<b>[0-9]{1,9})")
_NUMBER = re.compile(r"^-?[0-9]{1,18}(?:\.[0-9]{1,18})?$")
_INDEX = re.compile(r"^[0-9]{1,9}$")

# Matrix titles -> output key. Latency sections hold two matrices (GPU, then CPU); their key is a
# template filled with `gpu`/`cpu`. `(P2P Reads)` variants (run with --p2p_read) get their own keys.
_SECTIONS: list[tuple[re.Pattern[str], str]] = [
    (re.compile(r"^P2P Connectivity Matrix"), "connectivity"),
    (re.compile(r"^Unidirectional P2P=Disabled Bandwidth.*Matrix"), "unidirectional_p2p_disabled_gbps"),
    (
        re.compile(r"^Unidirectional P2P=Enabled Bandwidth \(P2P Reads\)"),
        "unidirectional_p2p_enabled_reads_gbps",
    ),
    (re.compile(r"^Unidirectional P2P=Enabled Bandwidth.*Matrix"), "unidirectional_p2p_enabled_gbps"),
    (re.compile(r"^Bidirectional P2P=Disabled Bandwidth.*Matrix"), "bidirectional_p2p_disabled_gbps"),
    (re.compile(r"^Bidirectional P2P=Enabled Bandwidth.*Matrix"), "bidirectional_p2p_enabled_gbps"),
    (re.compile(r"^P2P=Disabled Latency.*Matrix"), "latency_{}_p2p_disabled_us"),
    (re.compile(r"^P2P=Enabled Latency \(P2P Reads\)"), "latency_{}_p2p_enabled_reads_us"),
    (re.compile(r"^P2P=Enabled Latency.*Matrix"), "latency_{}_p2p_enabled_us"),
]
MATRICES = (
    "unidirectional_p2p_disabled_gbps",
    "unidirectional_p2p_enabled_gbps",
    "bidirectional_p2p_disabled_gbps",
    "bidirectional_p2p_enabled_gbps",
    "latency_gpu_p2p_disabled_us",
    "latency_gpu_p2p_enabled_us",
    "latency_cpu_p2p_disabled_us",
    "latency_cpu_p2p_enabled_us",
)
# Lines in which the sample said it could not run or measure.
_ERROR = re.compile(
    r"^(Cuda failure.*|CUDA error.*|.*cudaError\w+.*|Two or more GPUs with .*|Waiving test.*)$"
)


def _value(token: str) -> Optional[float]:
    return float(token) if _NUMBER.match(token) else None


def parse_p2p_bandwidth_latency(text: str) -> dict[str, Any]:
    """`p2pBandwidthLatencyTest` output to `{devices, peer_access, connectivity, matrices, errors}`.

    Equivalent: ./p2pBandwidthLatencyTest (CUDA samples). Never raises. Matrices are
    `{"<row device>": {"<column device>": value}}`; a matrix the output does not hold is None, a cell
    that is not a number is None. When the same matrix appears twice (two runs pasted together) the first
    one is kept.
    """
    devices: list[dict[str, Any]] = []
    peer_access: dict[str, dict[str, bool]] = {}
    matrices: dict[str, Optional[dict[str, dict[str, Any]]]] = {key: None for key in MATRICES}
    connectivity: Optional[dict[str, dict[str, bool]]] = None
    errors: list[str] = []

    section: Optional[str] = None  # the output key being filled, or a latency key template
    target: Optional[dict[str, dict[str, Any]]] = None
    columns: list[str] = []

    def start(key: str) -> Optional[dict[str, dict[str, Any]]]:
        """A fresh matrix for `key`, or None when it was already read (keep the first run)."""
        nonlocal connectivity
        if key == "connectivity":
            if connectivity is not None:
                return None
            connectivity = {}
            return connectivity
        if matrices.get(key) is not None:
            return None
        fresh: dict[str, dict[str, Any]] = {}
        matrices[key] = fresh
        return fresh

    for raw in text.splitlines():
        line = raw.strip()
        if not line:
            continue
        m = _DEVICE.match(line)
        if m:
            devices.append(
                {
                    "index": int(m.group("index")),
                    "name": m.group("name").strip() or None,
                    "pci": "{:04x}:{:02x}:{:02x}".format(
                        int(m.group("domain"), 16), int(m.group("bus"), 16), int(m.group("dev"), 16)
                    ),
                }
            )
            continue
        m = _PEER.match(line)
        if m:
            peer_access.setdefault(m.group("a"), {})[m.group("b")] = m.group("can") == "CAN"
            continue
        if _ERROR.match(line):
            errors.append(line)
            continue
        title = next((key for pattern, key in _SECTIONS if pattern.match(line)), None)
        if title is not None:
            section, columns = title, []
            target = None if "{}" in title else start(title)
            continue
        tokens = line.split()
        if section is None:
            continue
        label = tokens[0]
        if label in ("D\\D", "GPU", "CPU"):
            columns = [t for t in tokens[1:] if _INDEX.match(t)]
            if "{}" in section:
                # Old samples print one latency matrix headed `D\D`: it is the GPU-measured one.
                target = start(section.format("cpu" if label == "CPU" else "gpu"))
            continue
        if not _INDEX.match(label) or not columns:
            if not _NUMBER.match(label):
                section, target = None, None  # prose: the section ended
            continue
        if target is None:
            continue
        row = target.setdefault(str(int(label)), {})
        for column, token in zip(columns, tokens[1:]):
            value = _value(token)
            if section == "connectivity":
                row[str(int(column))] = None if value is None else value != 0
            else:
                row[str(int(column))] = value
    out: dict[str, Any] = {
        "devices": devices,
        "peer_access": peer_access,
        "connectivity": connectivity,
        "matrices": matrices,
        "errors": errors,
    }
    return out


PARSE_TOOLS = {"p2pBandwidthLatencyTest": parse_p2p_bandwidth_latency}
