"""`ddpdoctor explain [FILE...]`: the root cause of a failed distributed run, from its logs."""

from __future__ import annotations

import os
import sys
from typing import IO, Iterator, List, Optional

import typer

from ddpdoctor.cli.app import app, emit, format_option, json_option, pick_format, say, usage_error

EXPLAIN_EXIT_CODES = (
    "Exit codes: 0 nothing recognised (or only informational notes); 1 a failure seen (a root cause, or "
    "only its consequences: no cause found in these logs); 2 usage error (no input, stdin closed, "
    "unreadable file, a compressed log with nothing readable, binary data or a kernel/device file such as "
    "/proc/kmsg that is no log); 3 inconclusive: the input is empty (0 bytes), "
    "nothing to explain."
)


# A directory of a job's logs is read whole, up to this many files (the rest is named, not read).
MAX_DIRECTORY_FILES = 256


def _split_directory(path: str) -> tuple[list[str], bool]:
    """(log files, whether any Flight Recorder dump is there) of a directory, not recursing. A dump is a
    pickle or JSON (its first byte); anything else regular is a log (text, or .gz/.xz/... by its magic);
    the logs are read only where no dump is.
    Hidden files and links are skipped; past MAX_DIRECTORY_FILES the rest is left out, with a note."""
    from ddpdoctor.edge.files import in_kernel_dir, read_user_head
    from ddpdoctor.hang.fr import is_dump_head

    logs: list[str] = []
    dumps = False
    if in_kernel_dir(path):  # /proc/kmsg looks like a regular file; even a peek consumes its messages
        return [], False
    try:
        entries = sorted(
            (e for e in os.scandir(path) if not e.name.startswith(".") and e.is_file(follow_symlinks=False)),
            key=lambda e: e.name,
        )
    except OSError:
        return [], False
    for entry in entries[:MAX_DIRECTORY_FILES]:
        try:
            head = read_user_head(entry.path, 64)
        except (OSError, ValueError):
            continue
        if is_dump_head(head):
            dumps = True
        elif head:
            logs.append(entry.path)
    if len(entries) > MAX_DIRECTORY_FILES:
        say(f"note: {path}: read the first {MAX_DIRECTORY_FILES} of {len(entries)} files", err=True)
    return logs, dumps


def _streams(names: list[str]) -> Iterator[tuple[str, IO[bytes]]]:
    """Open each input lazily (hundreds of per-rank logs must not exhaust file descriptors)."""
    from ddpdoctor.edge.files import STDIN_LOG_LIMIT, open_log_stream
    from ddpdoctor.edge.redact import one_line
    from ddpdoctor.explain import open_log

    for name in names:
        if name == "-":
            # Checked not closed by explain() before scanning; bounded and sniffed (`< /dev/zero`).
            yield "<stdin>", open_log_stream(sys.stdin.buffer, "<stdin>", STDIN_LOG_LIMIT)
            continue
        stream = open_log(name)
        try:
            # The name labels every event ("first seen NAME"): a newline in it must not start a line.
            yield one_line(name), stream
        finally:
            stream.close()


@app.command(
    help="Explain a failed distributed run from its logs: the root cause first (signature, rank, host, "
    "first occurrence, evidence), then its consequences, each with cause and fix. FILEs may be plain, "
    "gzip/xz/bzip2/zstd-compressed or UTF-16 (told by their first bytes), one per rank or node; with no "
    "FILE (or '-') the log is read from stdin, e.g. `torchrun ... 2>&1 | ddpdoctor explain`. A directory "
    "(not recursing) of torch Flight Recorder dumps (one per rank) is aligned like `ddpdoctor hang --fr` "
    "(docs/hang.md); one without dumps is read as logs, as if each file were given. Knowledge base: "
    "docs/explain.md.\n\n"
    + EXPLAIN_EXIT_CODES
)
def explain(
    files: Optional[List[str]] = typer.Argument(
        None, help="Log files (plain, compressed or UTF-16); '-' for stdin; a directory of logs or of Flight "
        "Recorder dumps."
    ),
    json_out: bool = json_option("Print the explanation as JSON (same as --format json)."),
    output_format: str = format_option(),
    show_all: bool = typer.Option(
        False, "--all", help="Also show informational notes and every kept evidence line."
    ),
) -> None:
    from ddpdoctor.edge.sources import redact_data
    from ddpdoctor.explain import explain as explain_scan
    from ddpdoctor.explain import load_knowledge_base, scan_inputs
    from ddpdoctor.render import print_json
    from ddpdoctor.render.explain import render_explanation
    from ddpdoctor.render.formats import FORMATS, document_from_explain, render_document
    from ddpdoctor.render.progress import StderrProgress

    try:
        fmt = pick_format(json_out, output_format, FORMATS)
    except ValueError as exc:
        raise usage_error(str(exc)) from None
    # A directory holds logs (read like files given one by one) and/or Flight Recorder dumps
    # (docs/hang.md); with only directories given, stdin is not read.
    dirs = [name for name in files or [] if name != "-" and os.path.isdir(name)]
    dir_logs: list[str] = []
    fr_dirs = []
    for d in dirs:
        logs, dumps = _split_directory(d)
        if dumps or not logs:  # a directory with neither is refused below, naming why
            fr_dirs.append(d)  # a dump directory's other files (the job's source, notes) are no logs
        else:
            dir_logs += logs
    names = [name for name in files or [] if name not in dirs] + dir_logs or ([] if dirs else ["-"])
    if names.count("-") > 1:
        raise usage_error("stdin ('-') can be given only once")
    if "-" in names:
        # `explain <&-` leaves sys.stdin None: a usage error, not a traceback.
        if sys.stdin is None or getattr(sys.stdin, "buffer", None) is None:
            raise usage_error("no input: stdin is closed; give log FILEs or pipe a log into stdin")
        if not files and sys.stdin.isatty():
            raise usage_error("no input: give log FILEs or pipe a log into stdin (see --help)")
    from ddpdoctor.edge.files import log_path_refusal

    for name in names:
        if name == "-":
            continue
        refusal = log_path_refusal(name)
        if refusal is not None:
            raise usage_error(f"{name}: {refusal}")
        if not os.access(name, os.R_OK):
            raise usage_error(f"{name}: permission denied")

    kb = load_knowledge_base()
    try:
        with StderrProgress("explain", unit="bytes") as progress:

            def read(name: str, n: int) -> None:
                progress.describe(os.path.basename(name) if name != "-" else "stdin")
                progress.advance(n)

            scan = scan_inputs(kb, _streams(names), on_bytes=read)
    except OSError as exc:
        where = f"{exc.filename}: " if exc.filename else ""
        raise usage_error(f"cannot read input: {where}{exc.strerror or exc}") from None
    # A file that yielded nothing before a read error (a corrupt .gz) was not read at all: saying
    # "nothing recognised" (exit 0) would pass a log nobody looked at.
    unreadable = [s for s in scan.inputs if s.error and s.bytes == 0]
    if unreadable:
        raise usage_error(f"{unreadable[0].name}: nothing readable ({unreadable[0].error})")
    explanation = explain_scan(kb, scan)
    report = redact_data(explanation.to_dict(show_all))
    exit_code = int(explanation.exit_code)
    fr_findings: list = []
    if fr_dirs:
        from ddpdoctor.hang.probe_io import gather_fr_facts
        from ddpdoctor.hang.verdict import judge_flight_recorder

        fr_facts = gather_fr_facts(fr_dirs)
        if not fr_facts.dumps:
            reason = fr_facts.dump_errors[0] if fr_facts.dump_errors else "empty"
            raise usage_error(f"{', '.join(fr_dirs)}: not a file, and no Flight Recorder dump in it ({reason})")
        fr_data, fr_findings = judge_flight_recorder(fr_facts)
        report["flight_recorder"] = redact_data(fr_data)
        exit_code = max(exit_code, min(fr_data["exit_code"], 1))
        report["exit_code"] = exit_code
    if fmt == "json":
        print_json(report)
    elif fmt == "table":
        if names or not fr_dirs:  # with only dumps given there is no log to explain
            render_explanation(report, show_all=show_all)
        if fr_dirs:
            from ddpdoctor.render.hang import render_fr_text

            render_fr_text(report["flight_recorder"])
    else:
        doc = document_from_explain(report)
        if fr_findings:
            logs_found = bool(report.get("root_cause") or report.get("consequences") or report.get("notes"))
            doc.findings = fr_findings + (doc.findings if logs_found else [])
        emit(render_document(fmt, doc))
    raise typer.Exit(exit_code)
