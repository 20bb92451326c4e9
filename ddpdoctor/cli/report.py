"""`ddpdoctor report [-o FILE.md] [--bench]`: a redacted markdown report to attach to a bug report."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from ddpdoctor.cli.app import app
from ddpdoctor.model import ExitCode

DEFAULT_TIMEOUT_S = 30.0
BENCH_TIMEOUT_S = 120.0


@app.command(
    help="Write a markdown report for a bug report: versions, check findings, GPU topology, RDMA summary, "
    "environment and raw probe outputs (collapsed), with secrets redacted. Exit 0 when written."
)
def report(
    output: Optional[Path] = typer.Option(None, "-o", "--output", help="Write to FILE.md instead of stdout."),
    bench: bool = typer.Option(
        False, "--bench", help="Add a short all_reduce benchmark (bench-nccl, 1 MiB to 64 MiB)."
    ),
    replay: Optional[Path] = typer.Option(
        None,
        "--replay",
        help="Build the report from a snapshot directory instead of this machine.",
        exists=True,
        file_okay=False,
        dir_okay=True,
    ),
    timeout: float = typer.Option(
        DEFAULT_TIMEOUT_S, "--timeout", min=0.1, help="Bound, in seconds, on each probe."
    ),
) -> None:
    from ddpdoctor.engine import load_environment
    from ddpdoctor.report import build_report_text, gather_report_inputs, run_short_bench, write_report
    from ddpdoctor.sources import LiveSources, ReplaySources

    if replay is not None and bench:
        typer.echo("error: --bench measures this machine; it cannot be combined with --replay", err=True)
        raise typer.Exit(ExitCode.USAGE)
    sources = ReplaySources(replay) if replay is not None else LiveSources()
    inputs = gather_report_inputs(
        sources,
        timeout=timeout,
        source_label=f"replay:{replay}" if replay is not None else "live",
        env=load_environment(sources),
        bench=(lambda: run_short_bench(BENCH_TIMEOUT_S)) if bench else None,
    )
    text = build_report_text(inputs)
    try:
        write_report(text, output)
    except OSError as exc:
        typer.echo(f"error: cannot write {output}: {exc.strerror or exc}", err=True)
        raise typer.Exit(ExitCode.USAGE) from None
    if output is not None:
        typer.echo(f"wrote {output}", err=True)
    raise typer.Exit(0)
