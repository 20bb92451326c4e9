"""`bench-nccl`'s output files: whether --json/--csv FILE can be written (asked before launch), and
writing the results document, the CSV rows and the --format outputs at the end."""

from __future__ import annotations

import csv
import io
import json
import sys
from pathlib import Path
from typing import Any, Optional, Sequence

from ddpdoctor.cli.app import emit, say, try_write_output


def write_outputs(
    options: dict[str, Any],
    *,
    rows: list[dict[str, Any]],
    env: dict[str, Any],
    config: dict[str, Any],
    summaries: list[Any],
    verdicts: list[Any],
    launch: Optional[dict[str, Any]],
    scope_summaries: Sequence[Any] = (),
    refusals: list[dict[str, Any]],
    code: int,
    expected: Optional[dict[str, Any]],
    ratios: list[Any],
    extra: Sequence[Any] = (),
    notes: Sequence[str] = (),
) -> bool:
    """Print or write the --json/--csv/--format outputs; False when a file could not be written."""
    from ddpdoctor import __version__
    from ddpdoctor.bench.results import JSON_SCHEMA, ROW_FIELDS, csv_rows, output_row
    from ddpdoctor.render import print_json

    json_file, csv_file = options.get("json_file"), options.get("csv_file")
    fmt = options.get("format", "table")
    if json_file or fmt not in ("table", "json"):
        data = {
            "schema": JSON_SCHEMA,
            "tool": {"name": "ddpdoctor", "version": __version__},
            "environment": env,
            "config": config,
            "rows": [
                {
                    **output_row(r),
                    **({"skipped": r["skipped"]} if r.get("skipped") else {}),
                    **({"timing_note": r["timing_note"]} if r.get("timing_note") else {}),
                }
                for r in rows
            ],
            "summary": [s.to_dict() for s in summaries],
            "scope_summary": [s.to_dict() for s in scope_summaries],
            "expected_all_reduce_busbw": expected,
            "baseline": [r.to_dict() for r in ratios],
            "verdicts": [v.to_dict() for v in verdicts],
            "launch": launch,
            "refusals": refusals,
            "expectations": [f.to_dict() for f in extra],
            "notes": list(notes),
            "exit_code": code,
        }
    written = True
    if fmt not in ("table", "json"):
        from ddpdoctor.render.formats import document_from_bench, render_document

        doc = document_from_bench(data, extra)
        if fmt == "prometheus":
            import time

            from ddpdoctor.render.prometheus import render_prometheus

            now = time.time()
            started = options.get("started")
            text = render_prometheus(
                doc,
                finished_at=now,
                duration_s=now - started if isinstance(started, float) else None,
                json_data=data,
                version=__version__,
            )
        else:
            text = render_document(fmt, doc)
        written = write_format_output(options.get("output"), text)
    if json_file:
        if json_file == "-":
            print_json(data)
        else:
            text = json.dumps(data, indent=2, default=str) + "\n"
            written = _write_file("--json", json_file, text, options.get("force", False)) and written
    if csv_file:
        flat = csv_rows(rows, env)
        fields = list(flat[0]) if flat else list(ROW_FIELDS)
        if csv_file == "-":
            buffer = io.StringIO()
            write_csv(buffer, fields, flat)
            emit(buffer.getvalue())
        else:
            buffer = io.StringIO(newline="")
            write_csv(buffer, fields, flat)
            written = _write_file("--csv", csv_file, buffer.getvalue(), options.get("force", False)) and written
    sys.stdout.flush()
    return written


def _write_file(flag: str, path: str, text: str, force: bool) -> bool:
    """--json/--csv FILE through the one writer (edge.files.write_output_file); False when refused or
    failed (said on stderr)."""
    from ddpdoctor.edge.files import shown_path, write_output_file

    try:
        write_output_file(path, text, force=force)
    except OSError as exc:
        say(f"error: cannot write {flag} {shown_path(path)}: {exc.strerror or exc}", err=True)
        return False
    return True


def write_format_output(path: Optional[Path], text: str) -> bool:
    """The --format output to stdout, or atomically to --output FILE; False when FILE could not be
    written (said on stderr)."""
    if path is None:
        emit(text)
        return True
    return try_write_output(path, text)


def write_csv(fh: Any, fields: list[str], rows: list[dict[str, Any]]) -> None:
    writer = csv.DictWriter(fh, fieldnames=fields)
    writer.writeheader()
    writer.writerows(rows)


def write_refusal_outputs(options: dict[str, Any], env: dict[str, Any], refusals: Sequence[Any]) -> bool:
    """The --json/--csv/--format outputs of a launch refused before start (exit 2): no rows, the
    refusals (Findings) and the environment as far as it is known."""
    from ddpdoctor.core.model import ExitCode

    return write_outputs(
        options,
        rows=[],
        env=env,
        config={},
        summaries=[],
        verdicts=[],
        launch=None,
        refusals=[f.to_dict() for f in refusals],
        code=int(ExitCode.USAGE),
        expected=None,
        ratios=[],
    )
