"""Human report of `ddpdoctor check`: findings grouped by area, worst first."""

from __future__ import annotations

from collections import defaultdict
from typing import Sequence

from rich.console import Group, RenderableType
from rich.markup import escape
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from ddpdoctor.core.model import Finding, Report, Severity
from ddpdoctor.edge.redact import clean_text
from ddpdoctor.render import console

STYLES = {
    Severity.OK: ("OK", "green"),
    Severity.INFO: ("INFO", "cyan"),
    Severity.SKIP: ("SKIP", "dim"),
    Severity.WARN: ("WARN", "yellow"),
    Severity.ERROR: ("ERROR", "magenta"),
    Severity.FAIL: ("FAIL", "bold red"),
}


def severity_text(sev: Severity) -> Text:
    label, style = STYLES[sev]
    return Text(label, style=style)


def _extra_view(f: Finding) -> RenderableType | None:
    """A finding whose data is best read as a picture (the GPU topology matrix) gets one below it."""
    if f.id == "gpu.topology" and f.data.get("topology"):
        from ddpdoctor.render.gpu import topology_table

        return topology_table(f.data["topology"])
    return None


def finding_body(f: Finding, verbose: bool, pictured: bool = False) -> Text:
    """Title and summary; the fix for warn and worse; with -v the evidence and the id.
    `pictured`: the finding's picture is drawn below it, so its evidence excerpt (the same matrix as
    printed) is not repeated."""
    body = Text.assemble((f.title, "bold"), ": ", f.summary)
    if f.fix and f.severity >= Severity.WARN:
        body.append("\n  fix: ", style="bold")
        body.append(f.fix)
    if verbose:
        for ev in f.evidence:
            body.append("\n  evidence: ", style="dim")
            body.append(ev.source, style="dim")
            if pictured:
                body.append(" (drawn below)", style="dim")
            elif ev.excerpt:
                body.append("\n    " + ev.excerpt.replace("\n", "\n    "), style="dim")
        body.append(f"\n  id: {f.id}", style="dim")
    return body


def findings_table(
    findings: Sequence[Finding], verbose: bool, show_ok: bool = False, pictures: bool = False
) -> Table:
    """Findings worst first, one row each; passing ones folded into a count unless -v (or show_ok).
    `pictures` adds the picture some findings carry (the GPU topology matrix) below them."""
    table = Table(show_header=False, box=None, pad_edge=False, expand=False)
    table.add_column(width=5, no_wrap=True)
    table.add_column(ratio=1)
    ordered = sorted(findings, key=lambda f: -f.severity)
    shown = [f for f in ordered if verbose or show_ok or f.severity != Severity.OK]
    for f in shown:
        extra = _extra_view(f) if pictures else None
        body = finding_body(f, verbose, pictured=extra is not None)
        table.add_row(severity_text(f.severity), Group(body, extra) if extra is not None else body)
    hidden = len(ordered) - len(shown)
    if hidden:
        table.add_row(
            Text("OK", style="green"),
            Text(f"{hidden} more check{'s' if hidden != 1 else ''} passed (-v to show)", style="dim"),
        )
    if not ordered:
        table.add_row(Text("-", style="dim"), Text("no findings", style="dim"))
    return table


def render_check_report(
    report: Report, verbose: bool = False, strict: bool = False, area_titles: dict[str, str] | None = None
) -> None:
    con = console()
    titles = area_titles or {}
    by_area: dict[str, list[Finding]] = defaultdict(list)
    for f in report.findings:
        by_area[f.area].append(f)
    order = report.areas + [a for a in by_area if a not in report.areas]
    con.print(
        Text(f"ddpdoctor check on {report.host} ({report.source}, {report.duration_s:.1f}s)", style="bold")
    )
    for area in order:
        findings = by_area.get(area, [])
        worst = max((f.severity for f in findings), default=Severity.OK)
        con.print(
            Panel(
                findings_table(findings, verbose, pictures=True),
                # A title may quote a user's file (the expectations' name): cleaned like every outside text.
                title=escape(clean_text(titles.get(area, area))),
                title_align="left",
                border_style=STYLES[worst][1],
            )
        )
    counts = {s: sum(1 for f in report.findings if f.severity == s) for s in Severity}
    summary = ", ".join(f"{counts[s]} {s.label}" for s in reversed(Severity) if counts[s])
    code = report.exit_code(strict)
    con.print(Text(f"Summary: {summary or 'no findings'} -> exit {int(code)}", style="bold"))
