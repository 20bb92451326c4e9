"""`ddpdoctor report [-o FILE.md] [--bench]`: a redacted markdown report to attach to a bug report."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from ddpdoctor.cli.app import app, replay_option, say, timeout_option, usage_error

BENCH_TIMEOUT_S = 120.0


@app.command(
    help="Write a markdown report for a bug report: versions, check findings, GPU topology, RDMA summary, "
    "environment and raw probe outputs (collapsed), with secrets redacted. Exit 0 when written."
)
def report(
    output: Optional[str] = typer.Option(
        None, "-o", "--output", help="Write to FILE.md instead of stdout ('-': stdout)."
    ),
    bench: bool = typer.Option(
        False, "--bench", help="Add a short all_reduce benchmark (bench-nccl, 1 MiB to 16 MiB)."
    ),
    replay: Optional[Path] = replay_option(
        "Build the report from a snapshot directory instead of this machine."
    ),
    force: bool = typer.Option(
        False, "--force", help="Overwrite FILE.md if it exists (never through a link)."
    ),
    timeout: float = timeout_option(),
) -> None:
    from ddpdoctor.ci.report import gather_report_inputs, run_short_bench, write_report
    from ddpdoctor.core.engine import load_environment
    from ddpdoctor.edge.sources import LiveSources, ReplaySources
    from ddpdoctor.render.report import build_report_text

    if replay is not None and bench:
        raise usage_error("--bench measures this machine; it cannot be combined with --replay")
    if output == "-":
        output = None  # as `bench-nccl --json -`: '-' is stdout, never a file named '-'
    # Before any probe runs: a refusal must not cost a full run (write_report checks again).
    if output is not None:
        from ddpdoctor.edge.files import output_target_problem, shown_path

        problem = output_target_problem(output, force=force)
        if problem is not None:
            raise usage_error(f"cannot write {shown_path(output)}: {problem}")
    # Leaving the block kills any probe still running (a hung tool, or Ctrl-C): nothing is orphaned.
    with ReplaySources(replay) if replay is not None else LiveSources() as sources:
        inputs = gather_report_inputs(
            sources,
            timeout=timeout,
            source_label=f"replay:{replay}" if replay is not None else "live",
            env=load_environment(sources),
            bench=(lambda: run_short_bench(BENCH_TIMEOUT_S)) if bench else None,
        )
    text = build_report_text(inputs)
    try:
        write_report(text, None if output is None else Path(output), force=force)
    except BrokenPipeError:
        raise  # standard output closed: cli.main says so (exit 2)
    except OSError as exc:
        raise usage_error(f"cannot write {output}: {exc.strerror or exc}") from None
    if output is not None:
        say(f"wrote {output}", err=True)
    raise typer.Exit(0)
