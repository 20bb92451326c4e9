"""Human and bug-report output of `ddpdoctor hang`: the verdict first, then the evidence of each source.

Takes the JSON-able report (already redacted) so that text, markdown and --json show the same facts.
"""

from __future__ import annotations

from typing import Any, Mapping

from ddpdoctor.render.formats import md_cell, md_code_block, md_details

_SEVERITY_STYLE = {"fail": "bold red", "error": "magenta", "warn": "yellow", "info": "cyan", "skip": "dim", "ok": "green"}


def _source_lines(report: Mapping[str, Any]) -> list[tuple[str, str, str]]:
    """(severity, title, summary) of each source finding, verdict excluded."""
    return [(f["severity"], f["title"], f["summary"]) for f in report["findings"] if f["id"] != "hang.verdict"]


def describe_divergence(div: Mapping[str, Any]) -> str:
    """One line per Flight Recorder divergence."""
    culprits = ", ".join(str(r) for r in div["culprit_ranks"])
    others = ", ".join(str(r) for r in div["other_ranks"])
    head = f"{div['kind']} at #{div['seq']} of pg {div['process_group']}: "
    if div["kind"] == "behind":
        return head + f"rank(s) {culprits} last issued {div['culprit'] or 'nothing'}; rank(s) {others} issued {div['others'] or '?'}"
    return head + f"rank(s) {culprits} issued {div['culprit'] or 'nothing'}; rank(s) {others} issued {div['others'] or 'nothing'}"


def _stack_lines(report: Mapping[str, Any]) -> list[str]:
    out = []
    for group in report.get("stack_groups") or []:
        ranks = group["ranks"]
        # `label` names processes of unknown rank by pid (mp.spawn ranks set RANK in code, not in environ).
        label = group.get("label") or ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(str(r) for r in ranks)
        out.append(f"{label}: {group['where']}")
    return out


def _verdict_detail_lines(report: Mapping[str, Any]) -> list[str]:
    """Under the verdict: each culprit's call chain (outermost first), what moved between snapshots,
    the stuck DataLoader workers."""
    verdict = report["verdict"]
    out = []
    for record in (verdict.get("culprits") or [])[:4]:
        chain = record.get("chain") or []
        # A tie names both sides: show each chain, even one frame long, so both calls can be compared.
        if len(chain) > 1 or (verdict.get("tie") and chain):
            who = f"rank {record['rank']}" if record.get("rank") is not None else f"pid {record.get('pid')}"
            out.append(f"call chain of {who} (outermost first):")
            out.extend(f"    {text}" for text in chain)
    progress = report.get("progress") or {}
    if progress.get("samples"):
        # What the snapshots saw, not a verdict: "nothing moved" can sit under "no sign of a hang" (every
        # rank waiting on its DataLoader workers), where "job hung" read as a contradiction.
        seen = _MOTION_WORDS.get(str(progress.get("state")), str(progress.get("state")))
        out.append(f"snapshots: {progress['samples']} over {progress.get('span_s', 0):.1f}s, {seen}")
    return out


_MOTION_WORDS = {
    "hung": "nothing moved between them",
    "progressing": "the job moved between them",
    "spinning": "a rank ran in place between them",
    "unknown": "too few to compare",
}


def render_hang_text(report: Mapping[str, Any]) -> None:
    """Print the verdict and the evidence behind it."""
    from rich.text import Text

    from ddpdoctor.render import console

    con = console()
    verdict = report["verdict"]
    head = report["findings"][0]
    line = Text()
    line.append(f"{head['severity'].upper():5} ", style=_SEVERITY_STYLE.get(head["severity"], ""))
    line.append("verdict: ", style="bold")
    line.append(verdict["summary"])
    con.print(line)
    if verdict.get("fix"):
        con.print(Text("  fix: ", style="bold").append(Text(verdict["fix"], style="")))
    for text in _verdict_detail_lines(report):
        con.print(Text("  " + text))
    con.print()
    for severity, title, summary in _source_lines(report):
        row = Text(f"{severity:5} ", style=_SEVERITY_STYLE.get(severity, ""))
        row.append(f"{title}: ", style="bold")
        row.append(summary)
        con.print(row)
    stacks = _stack_lines(report)
    if stacks:
        con.print(Text("\nstacks (grouped):", style="bold"))
        for text in stacks:
            con.print(Text("  " + text))
    fr = report.get("flight_recorder") or {}
    for div in fr.get("divergences") or []:
        con.print(Text("flight recorder: " + describe_divergence(div), style="dim"))
    con.print(Text(f"\n{report['host']}, {report['duration_s']:.2f}s, exit code {report['exit_code']}", style="dim"))


def render_hang_markdown(report: Mapping[str, Any]) -> str:
    """A bug-report section: verdict, sources table, stacks and divergences."""
    verdict = report["verdict"]
    out = [f"## ddpdoctor hang on `{report['host']}`", "", f"**Verdict ({verdict['kind']}):** {md_cell(verdict['summary'])}", ""]
    if verdict.get("fix"):
        out += [f"**Fix:** {verdict['fix']}", ""]
    details = _verdict_detail_lines(report)
    if details:
        out += [md_code_block("\n".join(details)), ""]
    out += ["| source | severity | summary |", "|---|---|---|"]
    for severity, title, summary in _source_lines(report):
        out.append(f"| {md_cell(title)} | {severity} | {md_cell(summary)} |")
    out.append("")
    stacks = _stack_lines(report)
    if stacks:
        out.append(md_details("Python stacks, grouped", md_code_block("\n".join(stacks))))
    for stack in report.get("stacks") or []:
        if stack.get("frames"):
            who = f"rank {stack['rank']}" if stack["rank"] is not None else "rank unknown"
            out.append(md_details(f"{who} (pid {stack['pid']})", md_code_block("\n".join(stack["frames"]))))
    fr = report.get("flight_recorder") or {}
    if fr.get("divergences"):
        rows = [describe_divergence(d) for d in fr["divergences"]]
        out.append(md_details("Flight Recorder divergences", md_code_block("\n".join(rows))))
    out.append(f"_ddpdoctor {report['tool']['version']}, {report['duration_s']:.2f}s, exit code {report['exit_code']}_")
    return "\n".join(out).rstrip() + "\n"


def _culprit_lines(verdict: Mapping[str, Any]) -> list[str]:
    out = []
    for c in verdict.get("culprits") or []:
        where = f" at {c['where']}" if c.get("where") else ""
        pid = f" pid {c['pid']}" if c.get("pid") else ""
        who = f"rank {c['rank']}" if c.get("rank") is not None else "rank unknown"
        out.append(f"{who} on {c.get('node') or '?'} (host {c.get('host') or '?'}{pid}){where}")
    return out


def _node_lines(report: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(status, text) per node of a `hang --cluster` report."""
    out = []
    for node in report["nodes"]:
        if node["status"] == "reported":
            out.append((node["status"], f"{node['label']}: {node.get('verdict_kind')}: {node.get('summary') or ''}"))
        else:
            out.append((node["status"], f"{node['label']}: did not answer ({node['status']}) {node.get('detail') or ''}".rstrip()))
    return out


def render_hang_cluster_text(report: Mapping[str, Any]) -> None:
    """`hang --cluster` on rank 0: the verdict across nodes, then each node, then the merged stacks."""
    from rich.text import Text

    from ddpdoctor.render import console

    con = console()
    verdict = report["verdict"]
    head = report["findings"][0]
    line = Text(f"{head['severity'].upper():5} ", style=_SEVERITY_STYLE.get(head["severity"], ""))
    line.append("verdict: ", style="bold")
    line.append(verdict["summary"])
    con.print(line)
    for text in _culprit_lines(verdict):
        con.print(Text("  culprit: ", style="bold").append(text))
    if verdict.get("fix"):
        con.print(Text("  fix: ", style="bold").append(Text(verdict["fix"], style="")))
    answered = sum(1 for n in report["nodes"] if n["status"] == "reported")
    con.print(Text(f"\n{answered} of {len(report['nodes'])} nodes answered:", style="bold"))
    for status, text in _node_lines(report):
        con.print(Text("  ").append(text, style="" if status == "reported" else "bold red"))
    for finding in report["findings"][1:]:
        row = Text(f"{finding['severity']:5} ", style=_SEVERITY_STYLE.get(finding["severity"], ""))
        con.print(row.append(finding["summary"]))
    if report.get("stack_groups"):
        con.print(Text("\nstacks of every node (grouped):", style="bold"))
        for group in report["stack_groups"]:
            ranks = ", ".join(str(r) for r in group["ranks"])
            con.print(Text(f"  rank{'s' if len(group['ranks']) > 1 else ''} {ranks} ({', '.join(group['nodes'])}): {group['where']}"))
    job = report.get("job") or {}
    if job.get("ranks_unseen"):
        con.print(Text(f"ranks on no node that answered: {', '.join(str(r) for r in job['ranks_unseen'])}", style="yellow"))
    note = " (ddpdoctor's tasks exit 0 under torchrun: this is the status)" if report["launcher"] == "torchrun" else ""
    con.print(Text(f"\n{report['launcher']}, {report['duration_s']:.2f}s, exit code {report['exit_code']}{note}", style="dim"))


def render_hang_cluster_markdown(report: Mapping[str, Any]) -> str:
    """A bug-report section for `hang --cluster`: verdict, culprits, one row per node, merged stacks."""
    verdict = report["verdict"]
    out = [f"## ddpdoctor hang --cluster ({len(report['nodes'])} nodes)", "",
           f"**Verdict ({verdict['kind']}):** {md_cell(verdict['summary'])}", ""]
    out += [f"- culprit: {md_cell(text)}" for text in _culprit_lines(verdict)]
    if verdict.get("fix"):
        out += ["", f"**Fix:** {verdict['fix']}"]
    out += ["", "| node | status | local verdict |", "|---|---|---|"]
    for node in report["nodes"]:
        text = node.get("summary") if node["status"] == "reported" else node.get("detail")
        out.append(f"| {md_cell(node['label'])} | {node['status']} | {md_cell(text or '')} |")
    out.append("")
    if report.get("stack_groups"):
        rows = [f"ranks {', '.join(str(r) for r in g['ranks'])} ({', '.join(g['nodes'])}): {g['where']}"
                for g in report["stack_groups"]]
        out.append(md_details("Python stacks of every node, grouped", md_code_block("\n".join(rows))))
    out.append(f"_ddpdoctor {report['tool']['version']}, {report['duration_s']:.2f}s, exit code {report['exit_code']}_")
    return "\n".join(out).rstrip() + "\n"


def render_fr_text(fr: Mapping[str, Any]) -> None:
    """The Flight Recorder section `explain DIR` prints after the log explanation."""
    from rich.text import Text

    from ddpdoctor.render import console

    con = console()
    con.print(Text("\nFlight Recorder dumps", style="bold"))
    for finding in fr["findings"]:
        row = Text(f"  {finding['severity']:5} ", style=_SEVERITY_STYLE.get(finding["severity"], ""))
        row.append(finding["summary"])
        con.print(row)
        if finding.get("fix"):
            con.print(Text("        fix: " + finding["fix"], style="dim"))
