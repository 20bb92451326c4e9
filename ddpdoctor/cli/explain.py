"""`ddpdoctor explain [FILE...]`: the root cause of a failed distributed run, from its logs."""

from __future__ import annotations

import os
import sys
from typing import IO, Iterator, List, Optional

import typer

from ddpdoctor.cli.app import app, format_option, json_option, pick_format, usage_error

EXPLAIN_EXIT_CODES = (
    "Exit codes: 0 nothing recognised (or only informational notes); 1 a failure seen (a root cause, or "
    "only its consequences: no cause found in these logs); 2 usage error (no input, stdin closed, "
    "unreadable file, a .gz with nothing readable)."
)


def _streams(names: list[str]) -> Iterator[tuple[str, IO[bytes]]]:
    """Open each input lazily (hundreds of per-rank logs must not exhaust file descriptors)."""
    from ddpdoctor.explain import open_log

    for name in names:
        if name == "-":
            yield "<stdin>", sys.stdin.buffer  # checked not closed by explain() before scanning
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
    json_out: bool = json_option("Print the explanation as JSON (same as --format json)."),
    output_format: str = format_option(),
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

    try:
        fmt = pick_format(json_out, output_format, FORMATS)
    except ValueError as exc:
        raise usage_error(str(exc)) from None
    names = list(files or ["-"])
    if names.count("-") > 1:
        raise usage_error("stdin ('-') can be given only once")
    if "-" in names:
        # `explain <&-` leaves sys.stdin None: a usage error, not a traceback.
        if sys.stdin is None or getattr(sys.stdin, "buffer", None) is None:
            raise usage_error("no input: stdin is closed; give log FILEs or pipe a log into stdin")
        if not files and sys.stdin.isatty():
            raise usage_error("no input: give log FILEs or pipe a log into stdin (see --help)")
    for name in names:
        if name == "-":
            continue
        if not os.path.isfile(name):
            raise usage_error(f"{name}: not a file")
        if not os.access(name, os.R_OK):
            raise usage_error(f"{name}: permission denied")

    kb = load_knowledge_base()
    try:
        scan = scan_inputs(kb, _streams(names))
    except OSError as exc:
        raise usage_error(f"cannot read input: {exc.strerror or exc}") from None
    # A file that yielded nothing before a read error (a corrupt .gz) was not read at all: saying
    # "nothing recognised" (exit 0) would pass a log nobody looked at.
    unreadable = [s for s in scan.inputs if s.error and s.bytes == 0]
    if unreadable:
        raise usage_error(f"{unreadable[0].name}: nothing readable ({unreadable[0].error})")
    explanation = explain_scan(kb, scan)
    report = redact_data(explanation.to_dict(show_all))
    if fmt == "json":
        print_json(report)
    elif fmt == "table":
        render_explanation(report, show_all=show_all)
    else:
        typer.echo(render_document(fmt, document_from_explain(report)), nl=False)
    raise typer.Exit(int(explanation.exit_code))
