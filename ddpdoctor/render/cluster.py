"""Human output of cluster mode: the hosts x key-facts table, cross-node and per-node findings, and
the pairwise bandwidth matrix."""

from __future__ import annotations

from typing import Any, Mapping, Optional, Sequence

from rich.markup import escape
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from ddpdoctor.cluster.facts import KEY_FACTS
from ddpdoctor.cluster.report import REPORTED, ClusterReport, NodeResult
from ddpdoctor.core.model import Finding, Severity
from ddpdoctor.render import console
from ddpdoctor.render.check import STYLES, findings_table, severity_text

STATUS_STYLES = {REPORTED: "green", "missing": "bold red", "lost": "bold red", "no-data": "magenta"}


def _flagged_cells(findings: Sequence[Finding]) -> dict[tuple[str, str], Severity]:
    """(node label, fact key) -> severity, from the data the cross-node findings carry."""
    cells: dict[tuple[str, str], Severity] = {}
    for f in findings:
        key = f.data.get("key")
        for label in f.data.get("outliers") or []:
            if key:
                cells[(str(label), str(key))] = f.severity
    return cells


def facts_table(report: ClusterReport) -> Table:
    """Hosts x key facts; a cell that differs from the majority is coloured by its finding's severity."""
    flagged = _flagged_cells(report.findings)
    table = Table(title="Nodes", title_justify="left", show_lines=False)
    table.add_column("node", no_wrap=True)
    table.add_column("status", no_wrap=True)
    table.add_column("worst", no_wrap=True)
    keys = [kf for kf in KEY_FACTS if any(n.facts.get(kf.key) is not None for n in report.nodes)]
    for kf in keys:
        table.add_column(kf.label)
    for node in report.nodes:
        worst = max((f.severity for f in node.findings), default=None)
        row: list[Text] = [
            Text(node.label),
            Text(node.status, style=STATUS_STYLES.get(node.status, "")),
            severity_text(worst) if worst is not None else Text("-", style="dim"),
        ]
        for kf in keys:
            value = node.facts.get(kf.key)
            sev = flagged.get((node.label, kf.key))
            text = "-" if value is None and not node.reported else ("?" if value is None else str(value))
            row.append(Text(text, style=STYLES[sev][1] if sev is not None else ""))
        table.add_row(*row)
    return table


def _node_panel(node: NodeResult, verbose: bool) -> Panel:
    worst = max((f.severity for f in node.findings), default=Severity.OK)
    if not node.reported:
        body = Table(show_header=False, box=None, pad_edge=False)
        body.add_column()
        body.add_row(Text(f"{node.status}: {node.detail}", style=STATUS_STYLES.get(node.status, "")))
        return Panel(body, title=escape(node.label), title_align="left", border_style="red")
    shown = node.findings if verbose else [f for f in node.findings if f.severity >= Severity.WARN]
    return Panel(
        findings_table(shown, verbose),
        title=escape(node.label),
        title_align="left",
        border_style=STYLES[worst][1],
    )


def render_cluster_report(report: ClusterReport, verbose: bool = False, strict: bool = False) -> None:
    con = console()
    reported = sum(1 for n in report.nodes if n.reported)
    con.print(
        Text(
            f"ddpdoctor cluster check: {reported} of {len(report.nodes)} nodes reported "
            f"(world size {report.world_size}, {report.launcher}, {report.duration_s:.1f}s)",
            style="bold",
        )
    )
    con.print(facts_table(report))
    worst = max((f.severity for f in report.findings), default=Severity.OK)
    con.print(
        Panel(
            # Few and all about the cluster: "N nodes agree" is shown too.
            findings_table(report.findings, verbose, show_ok=True),
            title="Across nodes",
            title_align="left",
            border_style=STYLES[worst][1],
        )
    )
    quiet: list[str] = []
    for node in report.nodes:
        # Without -v a healthy node is one name in a line: a 64-node report stays readable.
        if not verbose and node.reported and all(f.severity < Severity.WARN for f in node.findings):
            quiet.append(node.label)
            continue
        con.print(_node_panel(node, verbose))
    if quiet:
        con.print(
            Text(f"No warnings on {len(quiet)} node(s): {', '.join(quiet)} (-v to show)", style="green")
        )
    pairwise = report.extra.get("pairwise")
    if isinstance(pairwise, Mapping):
        render_pairwise(pairwise)
    counts = {s: 0 for s in Severity}
    for f in report.all_findings():
        counts[f.severity] += 1
    summary = ", ".join(f"{counts[s]} {s.label}" for s in reversed(Severity) if counts[s])
    con.print(
        Text(f"Summary: {summary or 'no findings'} -> exit {int(report.exit_code(strict))}", style="bold")
    )


def _rate(value: Optional[float]) -> str:
    if value is None:
        return "-"
    if value >= 1000:
        return f"{value / 1000:.2f} GB/s"
    return f"{value:.0f} MB/s"


def render_pairwise(result: Mapping[str, Any], findings: Sequence[Finding] = ()) -> None:
    """The node x node bandwidth matrix (MB/s both ways averaged), slow cells marked, compute column."""
    con = console()
    nodes: list[str] = list(result.get("nodes") or [])
    matrix: list[list[Optional[float]]] = result.get("matrix_mbps") or []
    slow = {tuple(p) for p in result.get("slow_pairs") or []}
    slow_nodes = set(result.get("slow_nodes") or [])
    compute: Mapping[str, Any] = result.get("compute_gflops") or {}
    slow_compute = set(result.get("slow_compute") or [])
    if len(nodes) < 2:
        # No pair, no matrix: a 1x1 table with "reference -" would read as a result. The finding says why.
        con.print(f"Pairwise send/recv bandwidth: {len(nodes)} node(s), no pair of nodes to measure")
        _print_pairwise_findings(con, findings)
        return
    table = Table(
        title=f"Pairwise send/recv bandwidth ({result.get('bytes', 0) / 2**20:.1f} MiB messages; "
        f"slow below {result.get('slow_fraction', 0):.0%} of the reference {_rate(result.get('reference_mbps'))})",
        title_justify="left",
    )
    table.add_column("node", no_wrap=True)
    for i in range(len(nodes)):
        table.add_column(str(i), justify="right", no_wrap=True)
    table.add_column("compute", justify="right", no_wrap=True)
    for i, name in enumerate(nodes):
        style = "bold red" if name in slow_nodes else ""
        row = [Text(f"{i} {name}", style=style)]
        for j in range(len(nodes)):
            if i == j:
                row.append(Text("·", style="dim"))
                continue
            value = matrix[i][j] if i < len(matrix) and j < len(matrix[i]) else None
            cell_slow = (min(i, j), max(i, j)) in slow
            row.append(
                Text(_rate(value), style="yellow" if cell_slow else ("magenta" if value is None else ""))
            )
        gf = compute.get(name)
        row.append(
            Text(
                f"{gf:.1f} GFLOP/s" if isinstance(gf, (int, float)) else "-",
                style="yellow" if name in slow_compute else "",
            )
        )
        table.add_row(*row)
    con.print(table)
    _print_pairwise_findings(con, findings)


def _print_pairwise_findings(con: Any, findings: Sequence[Finding]) -> None:
    if findings:
        worst = max(f.severity for f in findings)
        con.print(
            Panel(
                findings_table(findings, False),
                title="Pairwise",
                title_align="left",
                border_style=STYLES[worst][1],
            )
        )
