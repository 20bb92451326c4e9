"""`ddpdoctor hang`: which rank of a job hanging right now is stuck, where, and why."""

from __future__ import annotations

from typing import Optional

import typer

from ddpdoctor.cli.app import app, format_option, json_option, pick_format, seconds_option, usage_error

HANG_FORMATS = ("table", "json", "markdown")
HANG_EXIT_CODES = (
    "Exit codes: 0 no culprit found (a warning when every local rank waits in the same collective); 1 a culprit named; "
    "2 usage error; 3 nothing could be read (no job, no py-spy, no dump)."
)


@app.command(
    help="Diagnose a job that hangs right now: finds its ranks on this node (torchrun agents and workers), "
    "reads each rank's Python stack (py-spy), queries NCCL RAS and aligns Flight Recorder dumps (--fr), "
    "then names the rank that is behind or out of step, the line it is on, and what the others wait in. "
    "See docs/hang.md.\n\n" + HANG_EXIT_CODES
)
def hang(
    pid: Optional[int] = typer.Option(None, "--pid", min=1, help="The torchrun agent or any rank of the job."),
    fr: Optional[str] = typer.Option(
        None,
        "--fr",
        help="Flight Recorder dumps: a file, a directory, or a prefix (default: the job's TORCH_FR_DUMP_TEMP_FILE, "
        "when dumps are there).",
    ),
    ras_addr: Optional[str] = typer.Option(
        None, "--ras-addr", help="NCCL RAS host:port (default: the job's NCCL_RAS_ADDR, else 127.0.0.1:28028)."
    ),
    no_ras: bool = typer.Option(False, "--no-ras", help="Do not query NCCL RAS."),
    no_stacks: bool = typer.Option(False, "--no-stacks", help="Do not read the ranks' stacks with py-spy."),
    no_fr: bool = typer.Option(
        False, "--no-fr", help="Without --fr, do not read the dumps the job's TORCH_FR_DUMP_TEMP_FILE names."
    ),
    timeout: float = seconds_option(5.0, "--timeout", "Bound, in seconds, on each source (RAS, each py-spy)."),
    json_out: bool = json_option("Print the diagnosis as JSON (schema docs/schemas/hang.schema.json)."),
    output_format: str = format_option("table (text), json or markdown (for a bug report)."),
) -> None:
    from ddpdoctor.hang.probe_io import gather_facts
    from ddpdoctor.hang.verdict import judge_hang
    from ddpdoctor.sources import redact_data

    try:
        fmt = pick_format(json_out, output_format, HANG_FORMATS)
    except ValueError as exc:
        raise usage_error(str(exc)) from None
    if fr is not None and no_fr:
        raise usage_error("--fr and --no-fr contradict each other")
    facts = gather_facts(
        pid, fr, ras_addr, use_ras=not no_ras, use_stacks=not no_stacks, timeout_s=timeout, use_fr=not no_fr
    )
    report = judge_hang(facts)
    data = redact_data(report.to_dict())
    if fmt == "json":
        from ddpdoctor.render import print_json

        print_json(data)
    elif fmt == "markdown":
        from ddpdoctor.render.hang import render_hang_markdown

        typer.echo(render_hang_markdown(data), nl=False)
    else:
        from ddpdoctor.render.hang import render_hang_text

        render_hang_text(data)
    raise typer.Exit(report.exit_code())
