"""`ddpdoctor explain [FILE...]`: the root cause of a failed distributed run, from its logs."""

from __future__ import annotations

import os
import sys
from typing import IO, Iterator, List, Optional

import typer

from ddpdoctor.cli.app import app
from ddpdoctor.model import ExitCode

EXPLAIN_EXIT_CODES = (
    "Exit codes: 0 nothing recognised (or only informational notes); 1 a failure diagnosed; "
    "2 usage error (no input, unreadable file)."
)


def _streams(names: list[str]) -> Iterator[tuple[str, IO[bytes]]]:
    """Open each input lazily (hundreds of per-rank logs must not exhaust file descriptors)."""
    from ddpdoctor.explain import open_log

    for name in names:
        if name == "-":
            yield "<stdin>", sys.stdin.buffer
            continue
        stream = open_log(name)
        try:
            yield name, stream
        finally:
            stream.close()


@app.command(
    help="Explain a failed distributed run from its logs: the root cause first (signature, rank, host, "
    "first occurrence, evidence), then its consequences, each with cause and fix. FILEs may be plain or "
    ".gz, one per rank or node; with no FILE (or '-') the log is read from stdin, e.g. "
    "`torchrun ... 2>&1 | ddpdoctor explain`. Knowledge base: docs/explain.md.\n\n" + EXPLAIN_EXIT_CODES
)
def explain(
    files: Optional[List[str]] = typer.Argument(None, help="Log files (plain or .gz); '-' for stdin."),
    json_out: bool = typer.Option(
        False, "--json", help="Print the explanation as JSON (same as --format json)."
    ),
    output_format: str = typer.Option(
        "table",
        "--format",
        help="table, json, junit (JUnit XML), github (workflow annotations) or markdown. See docs/ci.md.",
    ),
    show_all: bool = typer.Option(
        False, "--all", help="Also show informational notes and every kept evidence line."
    ),
) -> None:
    from ddpdoctor.explain import explain as explain_scan
    from ddpdoctor.explain import load_knowledge_base, scan_inputs
    from ddpdoctor.render import print_json
    from ddpdoctor.render.explain import render_explanation
    from ddpdoctor.render.formats import FORMATS, document_from_explain, render_document
    from ddpdoctor.sources import redact_data

    fmt = "json" if json_out else output_format.lower()
    if fmt not in FORMATS:
        typer.echo(f"error: unknown --format {fmt!r}; known: {', '.join(FORMATS)}", err=True)
        raise typer.Exit(ExitCode.USAGE)
    names = list(files or ["-"])
    if names.count("-") > 1:
        typer.echo("error: stdin ('-') can be given only once", err=True)
        raise typer.Exit(ExitCode.USAGE)
    if "-" in names and not files and sys.stdin.isatty():
        typer.echo("error: no input: give log FILEs or pipe a log into stdin (see --help)", err=True)
        raise typer.Exit(ExitCode.USAGE)
    for name in names:
        if name == "-":
            continue
        if not os.path.isfile(name):
            typer.echo(f"error: {name}: not a file", err=True)
            raise typer.Exit(ExitCode.USAGE)
        if not os.access(name, os.R_OK):
            typer.echo(f"error: {name}: permission denied", err=True)
            raise typer.Exit(ExitCode.USAGE)

    kb = load_knowledge_base()
    try:
        scan = scan_inputs(kb, _streams(names))
    except OSError as exc:
        typer.echo(f"error: cannot read input: {exc.strerror or exc}", err=True)
        raise typer.Exit(ExitCode.USAGE) from None
    explanation = explain_scan(kb, scan)
    report = redact_data(explanation.to_dict(show_all))
    if fmt == "json":
        print_json(report)
    elif fmt == "table":
        render_explanation(report, show_all=show_all)
    else:
        typer.echo(render_document(fmt, document_from_explain(report)), nl=False)
    raise typer.Exit(int(explanation.exit_code))
