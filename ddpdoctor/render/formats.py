"""Machine and CI formats for findings-like records: JUnit XML, GitHub workflow commands, markdown,
Slurm prolog lines, and the secret redaction and terminal-control neutralising every one of them goes through.

Every command that reports (check, bench-nccl, lint, explain) turns its result into a `Document`: a
list of `Finding`s plus context (host, duration, exit code). The renderers here only format; they never
decide severity. A finding may carry a source location for lint-like tools in
`data["location"] = {"file": str, "line": int, "col": int}`: GitHub annotations and markdown show it.

Mapping of severities (documented in docs/ci.md):

| severity | JUnit           | GitHub     | prolog line |
|----------|-----------------|------------|-------------|
| fail     | `<failure>`     | `::error`  | yes         |
| error    | `<error>`       | `::error`  | yes         |
| warn     | passed, or `<failure>` with --strict | `::warning` | only with --strict |
| skip     | `<skipped>`     | (`::notice` with -v) | no |
| info, ok | passed          | (`::notice` with -v) | no |
Over 600 lines as one module: the six output formats render one Document type and share its escaping and redaction; splitting them would split that contract.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import json
import os
import re
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Iterable, Mapping, Optional, Sequence

from ddpdoctor.core.model import CheckSpec, Evidence, Finding, Report, Severity, define, failing_findings
from ddpdoctor.edge.redact import neutralize_controls, one_line
from ddpdoctor.edge.sources import redact_data, redact_text
from ddpdoctor.parsers.numbers import parse_int

FORMATS = ("table", "json", "junit", "github", "markdown")

# The findings a bench-nccl document is made of besides its refusals (declared in bench/preflight.py):
# declared here, where they are built, so docs/checks.md documents every id a format can show.
BENCH_LAUNCH = define(
    "bench.launch",
    "Benchmark ranks",
    "A benchmark rank failed, hung past --timeout or was interrupted: no result of this run can be trusted. "
    "The summary names the root-cause rank (the earliest to fail), its host, operation and signal or "
    "exception.",
    "Run `ddpdoctor check`, then `NCCL_DEBUG=INFO ddpdoctor bench-nccl` to see the failing rank.",
)
BENCH_CORRECTNESS = define(
    "bench.correctness",
    "Benchmark results correct",
    "Every collective's result is compared with the value it must have. Wrong elements mean data is "
    "corrupted in transit (a bad NIC, cable, GPU or NVLink, or a broken NCCL/driver combination), whatever "
    "the bandwidth: training on such a node silently produces garbage.",
    "Find the bad component: rerun per node (`bench-nccl` on each host) and per GPU pair, check "
    "`ddpdoctor check` (ECC, Xid, PCIe errors), and drain the node until it passes.",
)
BENCH_MIN_BUSBW = define(
    "bench.min_busbw",
    "Bus bandwidth against --min-busbw",
    "The all_reduce peak bus bandwidth of this run compared with the floor given by --min-busbw; below it, "
    "the node or fabric is slower than the job was sized for.",
    "Look for a disabled transport (NCCL_P2P_DISABLE, NCCL_IB_DISABLE), a downgraded PCIe link, ACS on "
    "or an inactive NVLink/IB port with `ddpdoctor check`; compare with `NCCL_DEBUG=INFO`'s chosen transport.",
)
BENCH_BASELINE = define(
    "bench.baseline",
    "Bus bandwidth against --baseline",
    "Each op's peak bus bandwidth compared with an earlier `bench-nccl --json` run on the same points "
    "(op, size, dtype); a drop beyond --baseline-tolerance is a regression (driver, NCCL, firmware or "
    "hardware change).",
    "Diff the `environment` objects of both JSON files (driver, NCCL, torch versions) and run "
    "`ddpdoctor check` for a degraded link.",
)
BENCH_BUSBW = define(
    "bench.busbw.OP",
    "Bus bandwidth per op",
    "One info finding per benchmarked op (`bench.busbw.all_reduce`, `bench.busbw.all_gather`, ...): its "
    "peak bus bandwidth, the size it was reached at and the average; `OP` is the op name.",
)
BENCH_VERDICTS: dict[str, CheckSpec] = {s.id: s for s in (BENCH_CORRECTNESS, BENCH_MIN_BUSBW, BENCH_BASELINE)}

# Characters XML 1.0 cannot carry at all (NUL and most C0 controls): garbage tool output must not make
# the JUnit file unparsable, so they are replaced. Compiled on first use (only JUnit needs it).
_XML_INVALID = "[^\x09\x0a\x0d\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]"
_CONTROL = re.compile(r"[\x00-\x1f\x7f]+")
# A Slurm drain reason is shown by `sinfo -R` and `scontrol show node`; keep it to one readable line.
PROLOG_LINE_MAX = 160


@dataclass
class Document:
    """What one command produced, in the shape every machine format takes."""

    command: str  # "check", "bench-nccl", "lint", "explain"
    findings: list[Finding]
    host: str = ""
    duration_s: float = 0.0
    exit_code: int = 0
    meta: dict[str, Any] = field(default_factory=dict)  # shown in markdown, kept as JUnit properties

    @property
    def title(self) -> str:
        return f"ddpdoctor {self.command}" + (f" on {self.host}" if self.host else "")


# --- redaction -------------------------------------------------------------------------------------


def redact_finding(finding: Finding, env: Optional[Mapping[str, str]] = None) -> Finding:
    """The finding with secrets (values of secret-named variables, URL credentials) removed everywhere."""
    return dataclasses.replace(
        finding,
        title=redact_text(finding.title, env),
        summary=redact_text(finding.summary, env),
        fix=redact_text(finding.fix, env),
        evidence=tuple(
            Evidence(redact_text(e.source, env), redact_text(e.excerpt, env)) for e in finding.evidence
        ),
        data=redact_data(dict(finding.data), env),
    )


def redact_report(report: Report, env: Optional[Mapping[str, str]] = None) -> Report:
    """A copy of the report that is safe to print or upload."""
    return dataclasses.replace(
        report,
        host=redact_text(report.host, env),
        source=redact_text(report.source, env),
        findings=[redact_finding(f, env) for f in report.findings],
    )


# --- documents ---------------------------------------------------------------------------------------


def document_from_report(report: Report, strict: bool = False) -> Document:
    """A `ddpdoctor check` report as a Document."""
    from ddpdoctor import __version__

    return Document(
        command="check",
        findings=list(report.findings),
        host=report.host,
        duration_s=report.duration_s,
        exit_code=int(report.exit_code(strict)),
        meta={"ddpdoctor": __version__, "source": report.source, "areas": ", ".join(report.areas)},
    )


def counts_by_severity(findings: Iterable[Finding]) -> dict[str, int]:
    counts = {s.label: 0 for s in Severity}
    for f in findings:
        counts[f.severity.label] += 1
    return counts


def counts_text(doc: Document) -> str:
    counts = counts_by_severity(doc.findings)
    parts = [f"{counts[s.label]} {s.label}" for s in reversed(Severity) if counts[s.label]]
    return ", ".join(parts) or "no findings"


def summary_line(doc: Document) -> str:
    return f"{counts_text(doc)} -> exit {doc.exit_code}"


def group_by_id(findings: Iterable[Finding]) -> dict[str, list[Finding]]:
    """Findings grouped by id (several GPUs or ports give several findings with one id), first-seen order."""
    groups: dict[str, list[Finding]] = {}
    for f in findings:
        groups.setdefault(f.id, []).append(f)
    return groups


def _location(f: Finding) -> Optional[dict[str, Any]]:
    loc = f.data.get("location") if isinstance(f.data, Mapping) else None
    return loc if isinstance(loc, Mapping) and loc.get("file") else None


def _where(f: Finding) -> str:
    loc = _location(f)
    if not loc:
        return ""
    out = str(loc["file"])
    if loc.get("line"):
        out += f":{loc['line']}"
        if loc.get("col"):
            out += f":{loc['col']}"
    return out


def _one_line(text: str) -> str:
    return " ".join(neutralize_controls(text).split())


# --- converters: each command's JSON document to a Document --------------------------------------------
# They read the documented JSON (docs/schemas/), not the commands' internals, so a saved --json file
# converts the same way.


# ddpdoctor's JSON writes numbers as numbers; anything else reads as 0.
_json_int = partial(parse_int, default=0, signed=True, text_ok=False)


def _severity(value: Any) -> Severity:
    """A severity label from a JSON document; anything unknown counts as fail (never as a pass)."""
    try:
        return Severity.parse(str(value or "fail"))
    except KeyError:
        return Severity.FAIL


def _evidence(items: Any, default_source: str) -> tuple[Evidence, ...]:
    """Evidence objects of a JSON document (dicts with source and excerpt), skipping anything else."""
    return tuple(
        Evidence(str(e.get("source") or default_source), str(e.get("excerpt") or ""))
        for e in items or []
        if isinstance(e, Mapping)
    )


def _document(
    command: str, findings: list[Finding], data: Mapping[str, Any], clean: Finding, meta: dict[str, Any]
) -> Document:
    """A converted document: `clean` stands in for the findings when there are none (a passed test
    case in JUnit rather than an empty suite)."""
    return Document(
        command=command, findings=findings or [clean], exit_code=_json_int(data.get("exit_code")), meta=meta
    )


def document_from_lint(data: Mapping[str, Any]) -> Document:
    """`ddpdoctor lint --json` (ddpdoctor.lint/1) as a Document: one finding per diagnostic, located at its
    file, line and column; grouped by file (a JUnit suite per file, a test case per rule id)."""
    findings = []
    for d in data.get("diagnostics") or []:
        if not isinstance(d, Mapping):
            continue
        # A file name is outside text: a newline in it must not start a line (a JUnit body, a log).
        path, line, col = one_line(str(d.get("path") or "?")), _json_int(d.get("line")), _json_int(d.get("col"))
        findings.append(
            Finding(
                id=str(d.get("code") or "DDP"),
                severity=Severity.FAIL,
                title=str(d.get("name") or d.get("code") or "lint"),
                summary=str(d.get("message") or ""),
                fix=str(d.get("fix") or ""),
                evidence=(Evidence(f"{path}:{line}:{col}"),),
                area=path,
                data={"location": {"file": path, "line": line, "col": col}},
            )
        )
    checked = _json_int(data.get("files_checked"))
    clean = Finding(
        id="lint.clean",
        severity=Severity.OK,
        title="No DDP pitfalls found",
        summary=f"{checked} file(s) checked, no findings",
        area="lint",
    )
    return _document("lint", findings, data, clean, {"files checked": checked})


def _diagnosis_finding(d: Mapping[str, Any], role: str) -> Finding:
    first = d.get("first") if isinstance(d.get("first"), Mapping) else {}
    who = ", ".join(
        [f"rank {r}" for r in (d.get("ranks") or [])[:4]] + [str(h) for h in (d.get("hosts") or [])[:2]]
    )
    where = f" (first at {first.get('source')})" if first.get("source") else ""
    label = {"root_cause": "Root cause", "consequence": "Consequence"}.get(role, role.capitalize())
    summary = f"{label}{' on ' + who if who else ''}{where}: {d.get('cause') or d.get('title') or ''}"
    location = {"file": first.get("file"), "line": first.get("line")} if first.get("file") else None
    extra: dict[str, Any] = {"location": location} if location else {}
    if role != "root_cause":
        # One root cause is one error: what followed from it is annotated as a warning (a note as a
        # notice), whatever its own severity, so a CI run shows one error per failure, not three.
        extra["github_kind"] = "warning" if role == "consequence" else "notice"
    return Finding(
        id=str(d.get("id") or "explain.unknown"),
        severity=_severity(d.get("severity")),
        title=str(d.get("title") or d.get("id") or "diagnosis"),
        summary=summary,
        fix=str(d.get("fix") or ""),
        evidence=_evidence(d.get("evidence"), "log"),
        area=role,
        data=extra,
    )


def document_from_explain(data: Mapping[str, Any]) -> Document:
    """`ddpdoctor explain --json` (ddpdoctor.explain/1) as a Document: the root cause first, then the
    consequences and notes, each located at its first occurrence in the logs."""
    findings = []
    if isinstance(data.get("root_cause"), Mapping):
        findings.append(_diagnosis_finding(data["root_cause"], "root_cause"))
    no_cause = data.get("no_cause_found")
    if isinstance(no_cause, Mapping):
        # A failure was seen only through its consequences: say so first, with where to look next.
        fetch = [str(x) for x in no_cause.get("fetch_next") or []]
        findings.append(
            Finding(
                id="explain.no_cause",
                severity=Severity.WARN,
                title="No cause found in these logs",
                summary="Only consequences of the failure are in these logs; fetch next: " + "; ".join(fetch),
                fix="; ".join(fetch),
                area="root_cause",
            )
        )
    lead = data.get("lead")
    if not isinstance(data.get("root_cause"), Mapping) and isinstance(lead, Mapping):
        # With no root cause the lead is the report's explanation (it can set the exit code): not dropped.
        findings.append(_diagnosis_finding(lead, "lead"))
    findings += [
        _diagnosis_finding(d, "consequence") for d in data.get("consequences") or [] if isinstance(d, Mapping)
    ]
    findings += [_diagnosis_finding(d, "note") for d in data.get("notes") or [] if isinstance(d, Mapping)]
    inputs = [i for i in data.get("inputs") or [] if isinstance(i, Mapping)]
    if data.get("empty_input") and not findings:
        findings.append(
            Finding(
                id="explain.empty",
                severity=Severity.ERROR,
                title="Empty input",
                summary=f"The input is empty: {len(inputs)} input(s) of 0 bytes, nothing to explain",
                fix="Give the log of the failed run (e.g. `torchrun ... 2>&1 | tee run.log`).",
                area="root_cause",
            )
        )
    clean = Finding(
        id="explain.nothing",
        severity=Severity.OK,
        title="No known failure signature",
        summary=f"Nothing recognised in {len(inputs)} input(s)",
        area="root_cause",
    )
    return _document(
        "explain", findings, data, clean, {"inputs": ", ".join(str(i.get("name")) for i in inputs)}
    )


def _no_peak_reason(op: str, config: Mapping[str, Any], rows: Sequence[Mapping[str, Any]]) -> str:
    """Why an op has no busbw peak: one rank (nothing crosses an interconnect), every row implausible,
    or nothing measured."""
    from ddpdoctor.bench.limits import world_size_one_heading

    mine = [r for r in rows if r.get("op") == op and not r.get("skipped")]
    if config.get("world_size") == 1 and mine:
        return f"no busbw peak: {world_size_one_heading(config.get('backend'))}"
    if mine and all(r.get("implausible") is True for r in mine):
        return "no busbw peak: every row's algbw was above the GPU memory bandwidth (implausible)"
    return "not measured"


def document_from_bench(data: Mapping[str, Any], extra: Sequence[Finding] = ()) -> Document:
    """`ddpdoctor bench-nccl --json` (ddpdoctor.bench/1) as a Document: refusals, the launch outcome, the
    verdicts (correctness, --min-busbw, --baseline), peak busbw per op, plus `extra` findings (e.g. the
    --expect bandwidth expectations)."""
    from ddpdoctor.ci.expect import show_gbps

    findings: list[Finding] = []
    for r in data.get("refusals") or []:
        if isinstance(r, Mapping):
            findings.append(
                Finding(
                    id=str(r.get("id") or "bench.refused"),
                    severity=_severity(r.get("severity")),
                    title=str(r.get("title") or "Launch refused"),
                    summary=str(r.get("summary") or ""),
                    fix=str(r.get("fix") or ""),
                    evidence=_evidence(r.get("evidence"), "bench-nccl"),
                    area="launch",
                )
            )
    launch = data.get("launch") if isinstance(data.get("launch"), Mapping) else None
    if launch is not None and not launch.get("ok", True):
        root = launch.get("root_cause") if isinstance(launch.get("root_cause"), Mapping) else {}
        what = (
            "interrupted"
            if launch.get("interrupted")
            else "timed out"
            if launch.get("timed_out")
            else "failed"
        )
        detail = ", ".join(
            f"{k}={root[k]}"
            for k in ("rank", "host", "op", "size", "kind", "signal", "exc_type")
            if root.get(k) not in (None, "")
        )
        findings.append(
            Finding(
                id=BENCH_LAUNCH.id,
                severity=Severity.FAIL,
                title=BENCH_LAUNCH.title,
                summary=f"The benchmark {what}" + (f": root cause {detail}" if detail else ""),
                fix=BENCH_LAUNCH.fix,
                evidence=(
                    Evidence("bench-nccl launch", str(root.get("message") or root.get("stack") or "")[:2000]),
                ),
                area="launch",
            )
        )
    for v in data.get("verdicts") or []:
        if isinstance(v, Mapping):
            spec = BENCH_VERDICTS.get(str(v.get("id")))
            failed = bool(v.get("failed"))
            findings.append(
                Finding(
                    id=str(v.get("id") or "bench.verdict"),
                    severity=Severity.FAIL if failed else Severity.OK,
                    title=spec.title
                    if spec
                    else str(v.get("id") or "verdict").replace("bench.", "").replace("_", " "),
                    summary=str(v.get("summary") or ""),
                    fix=spec.fix if spec and failed else "",
                    area="verdicts",
                    data=dict(v.get("data") or {}),
                )
            )
    cfg = data.get("config") if isinstance(data.get("config"), Mapping) else {}
    rows = [r for r in data.get("rows") or [] if isinstance(r, Mapping)]
    for s in data.get("summary") or []:
        if isinstance(s, Mapping) and s.get("op"):
            peak = s.get("peak_busbw")
            text = (
                f"peak busbw {show_gbps(peak)} GB/s at {s.get('peak_size')} bytes, "
                f"average {show_gbps(float(s.get('avg_busbw') or 0))} GB/s"
                if isinstance(peak, (int, float))
                else _no_peak_reason(s["op"], cfg, rows)
            )
            findings.append(
                Finding(
                    id=BENCH_BUSBW.id.replace("OP", str(s["op"])),
                    severity=Severity.INFO,
                    title=f"{s['op']} bus bandwidth",
                    summary=text,
                    area="busbw",
                    data=dict(s),
                )
            )
    findings += list(extra)
    env = data.get("environment") if isinstance(data.get("environment"), Mapping) else {}
    config = data.get("config") if isinstance(data.get("config"), Mapping) else {}
    return Document(
        command="bench-nccl",
        findings=findings,
        host=str(env.get("host") or ""),
        exit_code=_json_int(data.get("exit_code")),
        meta={"backend": config.get("backend", ""), "world size": config.get("world_size", "")},
    )


# --- JUnit XML ---------------------------------------------------------------------------------------


def _xml_text(text: Any) -> str:
    # Controls first made visible (`\x1b`), as in every format; what XML still cannot carry is replaced.
    return re.sub(_XML_INVALID, "\ufffd", neutralize_controls(str(text)))


def _finding_text(f: Finding) -> str:
    lines = [f"[{f.severity.label.upper()}] {f.title}: {f.summary}"]
    if _where(f):
        lines.append(f"  at: {_where(f)}")
    if f.fix:
        lines.append(f"  fix: {f.fix}")
    for ev in f.evidence:
        lines.append(f"  evidence: {ev.source}")
        if ev.excerpt:
            lines.extend("    " + line for line in ev.excerpt.splitlines())
    return "\n".join(lines)


def _outcome(sev: Severity, strict: bool) -> Optional[str]:
    if sev == Severity.FAIL or (strict and sev == Severity.WARN):
        return "failure"
    if sev == Severity.ERROR:
        return "error"
    if sev == Severity.SKIP:
        return "skipped"
    return None


def render_junit(doc: Document, strict: bool = False) -> str:
    """JUnit XML: one <testsuite> per area, one <testcase> per finding id (the worst finding decides).

    The layout (testsuites > testsuite > testcase with failure/error/skipped and system-out) is the one
    Jenkins' JUnit plugin and GitLab's `artifacts:reports:junit` read.
    """
    import xml.etree.ElementTree as ET  # only JUnit needs it: kept off the start-up path of check

    suites: dict[str, dict[str, list[Finding]]] = {}
    for fid, group in group_by_id(doc.findings).items():
        area = group[0].area or fid.split(".", 1)[0]
        suites.setdefault(area, {})[fid] = group
    timestamp = _dt.datetime.now(_dt.timezone.utc).replace(microsecond=0).isoformat().replace("+00:00", "")
    root = ET.Element("testsuites", name=_xml_text(doc.title), time=f"{doc.duration_s:.3f}")
    totals = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
    for area, cases in suites.items():
        suite = ET.SubElement(
            root,
            "testsuite",
            name=_xml_text(f"ddpdoctor.{doc.command}.{area}"),
            timestamp=timestamp,
            hostname=_xml_text(doc.host or "unknown"),
            time="0",
        )
        props = ET.SubElement(suite, "properties")
        for key, value in [("command", doc.command), *sorted(doc.meta.items())]:
            ET.SubElement(props, "property", name=_xml_text(key), value=_xml_text(value))
        counts = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
        for fid, group in cases.items():
            worst = max(group, key=lambda f: f.severity)
            case = ET.SubElement(
                suite,
                "testcase",
                classname=_xml_text(f"ddpdoctor.{doc.command}.{area}"),
                name=_xml_text(fid),
                time="0",
            )
            loc = _location(worst)
            if loc:
                case.set("file", _xml_text(loc["file"]))
                if loc.get("line"):
                    case.set("line", str(loc["line"]))
            counts["tests"] += 1
            outcome = _outcome(worst.severity, strict)
            body = "\n\n".join(_finding_text(f) for f in sorted(group, key=lambda f: -f.severity))
            message = _one_line(f"{worst.title}: {worst.summary}")
            if len(group) > 1:
                message += f" (and {len(group) - 1} more)"
            if outcome == "skipped":
                counts["skipped"] += 1
                ET.SubElement(case, "skipped", message=_xml_text(message))
            elif outcome is not None:
                counts["failures" if outcome == "failure" else "errors"] += 1
                el = ET.SubElement(case, outcome, message=_xml_text(message), type=worst.severity.label)
                el.text = _xml_text(body)
            out = ET.SubElement(case, "system-out")
            out.text = _xml_text(body)
        for key, value in counts.items():
            suite.set(key, str(value))
            totals[key] += value
    for key, value in totals.items():
        root.set(key, str(value))
    ET.indent(root) if hasattr(ET, "indent") else None  # Python >= 3.9
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"


# --- GitHub workflow commands ------------------------------------------------------------------------




def escape_github_data(text: str) -> str:
    """Escape a workflow command's message as the runner expects (`%`, CR, LF)."""
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def escape_github_property(text: str) -> str:
    """Escape a workflow command's property value (also `:` and `,`, which delimit properties)."""
    return escape_github_data(text).replace(":", "%3A").replace(",", "%2C")


def github_command(kind: str, message: str, **props: Any) -> str:
    """One workflow command line: `::kind prop=value,...::message`."""
    shown = [
        f"{k}={escape_github_property(neutralize_controls(str(v)))}"
        for k, v in props.items()
        if v not in (None, "")
    ]
    head = f"::{kind}" + (" " + ",".join(shown) if shown else "")
    # Control characters (garbage tool output, an attacker's escapes) are shown, never sent.
    return f"{head}::{escape_github_data(neutralize_controls(message))}"


_GITHUB_KIND = {
    Severity.FAIL: "error",
    Severity.ERROR: "error",
    Severity.WARN: "warning",
    Severity.SKIP: "notice",
    Severity.INFO: "notice",
    Severity.OK: "notice",
}


def render_github(doc: Document, strict: bool = False, verbose: bool = False) -> str:
    """GitHub Actions annotations: an error per fail/error finding, a warning per warn (an error with
    --strict), notices for the rest with -v, and a closing notice with the counts. A finding whose
    converter set `data["github_kind"]` (explain's consequences: "warning") is annotated so."""
    lines = []
    for f in sorted(doc.findings, key=lambda f: -f.severity):
        if f.severity < Severity.WARN and not verbose:
            continue
        kind = f.data.get("github_kind") or (
            "error" if strict and f.severity == Severity.WARN else _GITHUB_KIND[f.severity]
        )
        message = f.summary + (f"\nfix: {f.fix}" if f.fix else "")
        loc = _location(f) or {}
        lines.append(
            github_command(
                kind,
                message,
                title=f"{f.id}: {f.title}",
                file=loc.get("file"),
                line=loc.get("line"),
                col=loc.get("col"),
            )
        )
    lines.append(github_command("notice", summary_line(doc), title=doc.title))
    return "\n".join(lines) + "\n"


# --- markdown ------------------------------------------------------------------------------------------


def md_cell(text: Any) -> str:
    """Text safe inside a markdown table cell: no raw HTML, no column breaks, no line breaks."""
    out = neutralize_controls(str(text)).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    out = out.replace("|", "\\|").replace("\r", "").replace("\n", "<br>")
    return _CONTROL.sub(" ", out)


def md_code_block(text: str, lang: str = "") -> str:
    """A fenced block that the text cannot close early (the fence is longer than any backtick run)."""
    longest = max((len(m) for m in re.findall(r"`+", text)), default=0)
    fence = "`" * max(3, longest + 1)
    return f"{fence}{lang}\n{text.rstrip()}\n{fence}"


def md_details(summary: str, body: str) -> str:
    return f"<details><summary>{md_cell(summary)}</summary>\n\n{body.rstrip()}\n\n</details>"


_MD_LABEL = {
    Severity.FAIL: "**FAIL**",
    Severity.ERROR: "**ERROR**",
    Severity.WARN: "WARN",
    Severity.SKIP: "skip",
    Severity.INFO: "info",
    Severity.OK: "ok",
}


def render_markdown(doc: Document, strict: bool = False, heading_level: int = 2) -> str:
    """Markdown for an issue or a CI job summary: counts, a table of findings worst first, fixes, and the
    evidence collapsed in <details>."""
    h = "#" * heading_level
    out = [f"{h} {md_cell(doc.title)}", "", f"**{md_cell(counts_text(doc))} · exit {doc.exit_code}**"]
    if doc.meta:
        out += ["", " · ".join(f"{md_cell(k)}: `{md_cell(v)}`" for k, v in doc.meta.items() if v != "")]
    shown = sorted(
        (f for f in doc.findings if f.severity != Severity.OK), key=lambda f: (-f.severity, f.area, f.id)
    )
    passed = [f for f in doc.findings if f.severity == Severity.OK]
    if shown:
        out += ["", "| severity | id | title | summary |", "|---|---|---|---|"]
        for f in shown:
            where = f" ({md_cell(_where(f))})" if _where(f) else ""
            out.append(
                f"| {_MD_LABEL[f.severity]} | `{md_cell(f.id)}` | {md_cell(f.title)} | "
                f"{md_cell(f.summary)}{where} |"
            )
    fixes = [
        f
        for f in shown
        if f.fix and (f.severity >= Severity.ERROR or (strict or f.severity == Severity.WARN))
    ]
    if fixes:
        out += ["", f"{h}# Fixes", ""]
        seen: set[tuple[str, str]] = set()
        for f in fixes:
            if (f.id, f.fix) in seen:
                continue
            seen.add((f.id, f.fix))
            out.append(f"- `{md_cell(f.id)}`: {md_cell(f.fix)}")
    if passed:
        rows = "\n".join(f"- `{md_cell(f.id)}`: {md_cell(f.summary)}" for f in passed)
        out += ["", md_details(f"{len(passed)} check{'s' if len(passed) != 1 else ''} passed", rows)]
    with_evidence = [f for f in shown if f.evidence]
    if with_evidence:
        blocks = []
        for f in with_evidence:
            for ev in f.evidence:
                blocks.append(f"`{md_cell(f.id)}` from `{md_cell(ev.source)}`")
                if ev.excerpt:
                    blocks.append(md_code_block(ev.excerpt))
        out += ["", md_details("Evidence", "\n\n".join(blocks))]
    return "\n".join(out).rstrip() + "\n"


def render_findings_text(findings: Sequence[Finding]) -> str:
    """Plain lines `SEVERITY id: summary` (with the fix for warn and worse), e.g. under a benchmark table."""
    lines = []
    for f in findings:
        lines.append(f"{f.severity.label.upper():5} {f.id}: {_one_line(f.summary)}")
        if f.fix and f.severity >= Severity.WARN:
            lines.append(f"      fix: {_one_line(f.fix)}")
    return neutralize_controls("\n".join(lines) + ("\n" if lines else ""))


# --- Slurm prolog / NHC ------------------------------------------------------------------------------


def prolog_line(f: Finding) -> str:
    """One short line for a Slurm drain reason: `id: summary`, no newlines, no double quotes."""
    text = _one_line(f"{f.id}: {f.summary}").replace('"', "'")
    if len(text) > PROLOG_LINE_MAX:
        text = text[: PROLOG_LINE_MAX - 3].rstrip() + "..."
    return text


def render_prolog(findings: Sequence[Finding], strict: bool = False) -> list[str]:
    """The lines `check --prolog` prints: one per finding that makes the exit code non-zero, worst first;
    none when healthy."""
    return [prolog_line(f) for f in failing_findings(findings, strict)]


# --- dispatch ----------------------------------------------------------------------------------------


def render_document(
    fmt: str, doc: Document, *, json_data: Any = None, strict: bool = False, verbose: bool = False
) -> str:
    """Text of `doc` in a machine format: json (the command's own JSON, `json_data`), junit, github or
    markdown. Secrets are redacted from all of them."""
    env = os.environ
    if fmt == "json":
        text = json.dumps(redact_data(json_data, env), indent=2, default=str) + "\n"
        return text
    doc = dataclasses.replace(doc, findings=[redact_finding(f, env) for f in doc.findings])
    if fmt == "junit":
        text = render_junit(doc, strict)
    elif fmt == "github":
        text = render_github(doc, strict, verbose)
    elif fmt == "markdown":
        text = render_markdown(doc, strict)
    else:
        raise ValueError(f"unknown format {fmt!r}; known: {', '.join(FORMATS)}")
    # These formats write no control of their own: neutralising the whole text reaches every field
    # (findings, host, meta, file names in locations) whoever built it.
    return neutralize_controls(text)
