"""Human report of `ddpdoctor explain`: the root cause first, then consequences, then (--all) notes.

Takes the JSON-able report (already redacted) so that text and --json show the same facts.
"""

from __future__ import annotations

from typing import Any, Mapping

from rich.text import Text

from ddpdoctor.render import console

_SEVERITY_STYLE = {"fail": "bold red", "error": "magenta", "warn": "yellow", "info": "cyan"}


def _who(diag: Mapping[str, Any]) -> str:
    parts = []
    if diag.get("ranks"):
        parts.append("rank " + ", ".join(str(r) for r in diag["ranks"][:16]))
    elif diag.get("local_ranks"):
        parts.append("local rank " + ", ".join(str(r) for r in diag["local_ranks"][:16]))
    if diag.get("hosts"):
        parts.append("host " + ", ".join(diag["hosts"][:8]))
    return "; ".join(parts) or "rank unknown"


def _evidence(diag: Mapping[str, Any], indent: str, limit: int | None) -> list[Text]:
    out = []
    for ev in diag["evidence"][:limit]:
        line = Text(indent)
        line.append(ev["source"], style="dim")
        line.append("  " + ev["excerpt"])
        out.append(line)
    return out


def _labelled(indent: str, label: str, value: str, style: str = "bold") -> Text:
    line = Text(indent)
    line.append(label, style=style)
    line.append(value)
    return line


def _render_lead(con: Any, lead: Mapping[str, Any], show_all: bool) -> None:
    """The best-supported lead, marked as a lead (not a cause)."""
    head = Text("  LEAD (not a confirmed cause)  ", style="bold yellow")
    head.append(lead["title"], style="bold")
    head.append(f"  [{lead['id']}]", style="dim")
    con.print(head)
    first = lead.get("first") or {}
    where = _who(lead) + (f" · first seen {first['source']}" if first else "")
    con.print(_labelled("    ", "Where: ", where))
    if lead.get("reasoning"):
        con.print(_labelled("    ", "Why a lead: ", lead["reasoning"]))
    for line in _evidence(lead, "      ", None if show_all else 2):
        con.print(line)
    con.print(_labelled("    ", "Cause: ", lead["cause"]))
    con.print(_labelled("    ", "Fix: ", lead["fix"], style="bold green"))


def render_explanation(report: Mapping[str, Any], show_all: bool = False) -> None:
    """Print the explanation of a failed run."""
    con = console()
    inputs = report["inputs"]
    total = sum(i["bytes"] for i in inputs)
    lines = sum(i["lines"] for i in inputs)
    con.print(Text(f"Read {len(inputs)} input(s): {total:,} bytes, {lines:,} lines.", style="dim"))
    for i in inputs:
        if i.get("error"):
            con.print(Text(f"  {i['name']}: {i['error']}", style="yellow"))
        if i.get("long_lines"):
            con.print(
                Text(f"  {i['name']}: {i['long_lines']} over-long line(s) scanned in windows", style="dim")
            )
        if i.get("windows_capped"):
            from ddpdoctor.explain.scan import MAX_WINDOWS_PER_LINE

            con.print(
                Text(
                    f"  {i['name']}: {i['windows_capped']} line(s) longer than the window budget: read up to "
                    f"{MAX_WINDOWS_PER_LINE} keyword windows of each, the rest of the line skipped",
                    style="yellow",
                )
            )

    root = report["root_cause"]
    no_cause = report.get("no_cause_found")
    lead = report.get("lead")
    if root is None and (no_cause or lead):
        # Something failed (the consequences below), but these logs do not hold its cause.
        con.print()
        con.print(Text("ROOT CAUSE  no cause found in these logs", style="bold yellow"))
        if lead:
            _render_lead(con, lead, show_all)
        if no_cause:
            con.print(_labelled("  ", "Fetch next:", ""))
            for item in no_cause["fetch_next"]:
                con.print(Text(f"    - {item}"))
    elif root is None and report.get("empty_input"):
        con.print(Text("The input is empty: nothing to explain.", style="bold yellow"))
        con.print(
            Text(
                "Every log given was 0 bytes (an empty file, or nothing on stdin): give the log of the "
                "failed run, e.g. `torchrun ... 2>&1 | tee run.log`, then `ddpdoctor explain run.log`.",
                style="dim",
            )
        )
    elif root is None:
        # Not green: explain is given the logs of runs that went wrong, and a log it cannot read is not a
        # healthy run.
        con.print(Text("No known failure signature found (this does not say the run succeeded).", style="yellow"))
        con.print(
            Text(
                "Nothing in the knowledge base matched and no traceback, crash or test failure was seen "
                "(docs/explain.md lists what is recognised). If the run failed, its cause is in a log that was "
                "not given (every rank's output, the launcher's, dmesg) or in a message ddpdoctor does not "
                "know: rerun with NCCL_DEBUG=INFO and TORCH_DISTRIBUTED_DEBUG=DETAIL.",
                style="dim",
            )
        )
    else:
        con.print()
        head = Text("ROOT CAUSE  ", style=_SEVERITY_STYLE.get(root["severity"], "bold"))
        head.append(root["title"], style="bold")
        head.append(f"  [{root['id']}]", style="dim")
        con.print(head)
        first = root.get("first") or {}
        where = _who(root)
        if first:
            where += f" · first seen {first['source']}"
        con.print(_labelled("  ", "Where: ", where))
        if root.get("reasoning"):
            con.print(_labelled("  ", "Why this one: ", root["reasoning"]))
        con.print(_labelled("  ", "Evidence:", ""))
        for line in _evidence(root, "    ", None if show_all else 3):
            con.print(line)
        con.print(_labelled("  ", "Cause: ", root["cause"]))
        con.print(_labelled("  ", "Fix: ", root["fix"], style="bold green"))
        if root.get("references"):
            con.print(_labelled("  ", "See: ", ", ".join(root["references"]), style="dim"))

    cons = report["consequences"]
    if cons:
        con.print()
        con.print(Text(f"Consequences and other errors ({len(cons)})", style="bold"))
        for diag in cons:
            item = Text("  • ")
            item.append(diag["title"], style=_SEVERITY_STYLE.get(diag["severity"], ""))
            item.append(f"  [{diag['id']}]", style="dim")
            first = diag.get("first") or {}
            detail = f"    {_who(diag)} · {diag['count']}x"
            if first:
                detail += f" · first {first['source']}"
            con.print(item)
            con.print(Text(detail, style="dim"))
            for line in _evidence(diag, "      ", None if show_all else 1):
                con.print(line)
            con.print(_labelled("    ", "Cause: ", diag["cause"]))
            con.print(_labelled("    ", "Fix: ", diag["fix"], style="bold green"))

    notes = report.get("notes") or []
    if show_all and notes:
        con.print()
        con.print(Text(f"Notes ({len(notes)})", style="bold"))
        for diag in notes:
            item = Text("  · ")
            item.append(diag["title"], style="cyan")
            item.append(f"  [{diag['id']}]  {_who(diag)} · {diag['count']}x", style="dim")
            con.print(item)
            for line in _evidence(diag, "      ", None):
                con.print(line)
            con.print(_labelled("    ", "Fix: ", diag["fix"], style="bold green"))
