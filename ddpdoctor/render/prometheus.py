"""`--format prometheus`: node_exporter's textfile-collector format (the Prometheus text exposition
format, version 0.0.4) for `check` and `bench-nccl`.

Every series carries `command="check"` or `command="bench-nccl"`: node_exporter merges every `*.prom`
file of its directory into one scrape, and a series repeated with the same labels is an error there
(node_exporter 1.5 logs "was collected before with the same name and label values" and serves only one
of the values); a file it cannot parse is dropped whole (`node_textfile_scrape_error 1`). The metric
list (docs/ci.md) is stable: dashboards and alerts use it.

Only formats: the severity of each finding and the exit code come from the command. No free text is
written (ids, severities, op names, sizes, the version), so nothing here needs redaction.
"""

from __future__ import annotations

import math
from typing import Any, Iterable, Mapping, Optional, Sequence

from ddpdoctor.core.model import Severity
from ddpdoctor.render.formats import Document, counts_by_severity

PROMETHEUS = "prometheus"
PREFIX = "ddpdoctor"
# nccl-tests' GB/s are 1e9 bytes/s; Prometheus wants base units, so busbw is exported in bytes/s.
GB = 1e9

# name -> (type, help); the order is the order in the file.
METRICS: dict[str, tuple[str, str]] = {
    "info": ("gauge", "Always 1; the version label says which ddpdoctor wrote the file."),
    "finding": (
        "gauge",
        "Number of findings with this id and severity in the last run (several GPUs or ports can give "
        "one id several findings).",
    ),
    "findings": ("gauge", "Number of findings of each severity in the last run."),
    "exit_code": ("gauge", "Exit code of the last run: 0 healthy, 1 failed, 2 usage error, 3 inconclusive."),
    "last_run_timestamp_seconds": ("gauge", "Unix time at which the last run ended."),
    "duration_seconds": ("gauge", "Wall-clock duration of the last run, in seconds."),
    "bench_busbw_bytes_per_second": (
        "gauge",
        "Bus bandwidth (nccl-tests' busbw) of the last bench-nccl run per op, message size, dtype and scope.",
    ),
    "bench_peak_busbw_bytes_per_second": (
        "gauge",
        "Peak bus bandwidth per op of the last bench-nccl run (whole world, plausible rows only).",
    ),
}


def escape_label_value(value: Any) -> str:
    r"""A label value as the exposition format requires: `\` as `\\`, `"` as `\"`, newline as `\n`."""
    return str(value).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def escape_help(text: str) -> str:
    r"""HELP text: `\` as `\\` and newline as `\n` (quotes stay as they are)."""
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def format_value(value: float) -> str:
    """A sample value: integers without a decimal point, NaN and infinities as Prometheus spells them."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if float(value).is_integer() and abs(value) < 1e15:
        return str(int(value))
    return repr(float(value))


Sample = tuple[Mapping[str, Any], float]


def _family(name: str, samples: Sequence[Sample]) -> list[str]:
    if not samples:
        return []
    kind, help_text = METRICS[name]
    full = f"{PREFIX}_{name}"
    lines = [f"# HELP {full} {escape_help(help_text)}", f"# TYPE {full} {kind}"]
    for labels, value in samples:
        body = ",".join(f'{key}="{escape_label_value(val)}"' for key, val in labels.items())
        lines.append(f"{full}{{{body}}} {format_value(value)}")
    return lines


def _finding_samples(doc: Document) -> list[Sample]:
    """One sample per (id, severity), valued with how many findings share them: a label set may appear
    only once in a scrape."""
    counts: dict[tuple[str, str], int] = {}
    for f in doc.findings:
        key = (f.id, f.severity.label)
        counts[key] = counts.get(key, 0) + 1
    return [({"command": doc.command, "id": i, "severity": s}, float(n)) for (i, s), n in counts.items()]


def _number(value: Any) -> Optional[float]:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)


def _bench_samples(command: str, data: Mapping[str, Any]) -> tuple[list[Sample], list[Sample]]:
    """busbw per (op, size, dtype, scope) row and the peak per op, from a bench-nccl JSON document.
    Rows without a busbw (skipped, one rank) or flagged implausible are left out: a number that is
    known to be wrong would only draw a spike."""
    rows: list[Sample] = []
    seen: set[tuple[str, ...]] = set()
    for r in data.get("rows") or []:
        if not isinstance(r, Mapping) or r.get("implausible") is True or r.get("skipped"):
            continue
        busbw = _number(r.get("busbw"))
        if busbw is None or not r.get("op"):
            continue
        labels = {
            "command": command,
            "op": str(r["op"]),
            "size_bytes": str(r.get("size")),
            "dtype": str(r.get("dtype") or ""),
            "scope": str(r.get("scope") or "world"),
        }
        key = tuple(labels.values())
        if key in seen:  # never two samples with one label set (the scrape would fail)
            continue
        seen.add(key)
        rows.append((labels, busbw * GB))
    peaks: list[Sample] = []
    for s in data.get("summary") or []:
        if isinstance(s, Mapping) and s.get("op"):
            peak = _number(s.get("peak_busbw"))
            if peak is not None:
                peaks.append(({"command": command, "op": str(s["op"])}, peak * GB))
    return rows, peaks


def render_prometheus(
    doc: Document,
    *,
    finished_at: float,
    duration_s: Optional[float] = None,
    json_data: Optional[Mapping[str, Any]] = None,
    version: str = "",
) -> str:
    """The textfile for `doc`: its findings, counts per severity, exit code, the end time (unix seconds,
    given by the caller) and duration; for bench-nccl also busbw per row and the peak per op, read from
    its JSON document `json_data`."""
    command = doc.command
    base = {"command": command}
    counts = counts_by_severity(doc.findings)
    families: list[tuple[str, list[Sample]]] = [
        ("info", [({**base, "version": version}, 1.0)] if version else []),
        ("finding", _finding_samples(doc)),
        ("findings", [({**base, "severity": s.label}, float(counts[s.label])) for s in Severity]),
        ("exit_code", [(base, float(doc.exit_code))]),
        ("last_run_timestamp_seconds", [(base, round(finished_at, 3))]),
        ("duration_seconds", [(base, round(doc.duration_s if duration_s is None else duration_s, 3))]),
    ]
    if command == "bench-nccl" and json_data is not None:
        rows, peaks = _bench_samples(command, json_data)
        families += [("bench_busbw_bytes_per_second", rows), ("bench_peak_busbw_bytes_per_second", peaks)]
    lines: list[str] = []
    for name, samples in families:
        lines += _family(name, samples)
    return "\n".join(lines) + "\n"


def metric_names() -> Iterable[str]:
    """Every metric this format can write (docs/ci.md lists them; tests/test_prometheus.py checks)."""
    return (f"{PREFIX}_{name}" for name in METRICS)
