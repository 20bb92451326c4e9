"""`ddpdoctor check` and `ddpdoctor snapshot`."""

from __future__ import annotations

import time
from pathlib import Path
from typing import List, Optional

import typer

from ddpdoctor.cli.app import app
from ddpdoctor.model import EXIT_CODES_HELP, ExitCode

DEFAULT_TIMEOUT_S = 30.0


def split_names(values: Optional[List[str]]) -> list[str]:
    """`--only gpu,net --only system` -> ["gpu", "net", "system"]."""
    out: list[str] = []
    for v in values or []:
        out.extend(x.strip() for x in v.split(",") if x.strip())
    return out


def build_report(
    *,
    replay: Optional[Path],
    only: list[str],
    skip: list[str],
    timeout: float,
    options: dict,
):
    """Run the selected areas against the live machine or a snapshot; raises ValueError on bad area names."""
    from ddpdoctor.checks import load_areas
    from ddpdoctor.engine import run_checks, select_areas
    from ddpdoctor.sources import LiveSources, ReplaySources

    areas = select_areas(load_areas(), only, skip)
    if replay is not None:
        sources = ReplaySources(replay)
        label = f"replay:{replay}"
    else:
        sources = LiveSources()
        label = "live"
    return run_checks(sources, areas, timeout_s=timeout, options=options, source_label=label), areas


@app.command(
    help="Preflight this node: system, torch/NCCL, launch environment, network and ports, GPUs, RDMA.\n\n"
    + EXIT_CODES_HELP
)
def check(
    json_out: bool = typer.Option(
        False, "--json", help="Print the report as JSON (schema in docs/checks.md)."
    ),
    only: Optional[List[str]] = typer.Option(None, "--only", help="Only these areas (comma-separated)."),
    skip: Optional[List[str]] = typer.Option(None, "--skip", help="Skip these areas (comma-separated)."),
    strict: bool = typer.Option(False, "--strict", help="Exit 1 on warnings too."),
    verbose: bool = typer.Option(False, "-v", "--verbose", help="Show evidence and passing checks."),
    timeout: float = typer.Option(
        DEFAULT_TIMEOUT_S, "--timeout", min=0.1, help="Bound, in seconds, on each probe."
    ),
    replay: Optional[Path] = typer.Option(
        None,
        "--replay",
        help="Run every check from a snapshot directory instead of this machine.",
        exists=True,
        file_okay=False,
        dir_okay=True,
    ),
    smoke: Optional[bool] = typer.Option(
        None, "--smoke/--no-smoke", help="NCCL smoke test: forced on (gloo on CPU without GPUs) or off."
    ),
) -> None:
    from ddpdoctor.render import print_json
    from ddpdoctor.render.check import render_check_report

    options = {"smoke": smoke, "timeout": timeout}
    try:
        report, areas = build_report(
            replay=replay, only=split_names(only), skip=split_names(skip), timeout=timeout, options=options
        )
    except ValueError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(ExitCode.USAGE) from None
    if json_out:
        print_json(report.to_dict(strict))
    else:
        render_check_report(
            report, verbose=verbose, strict=strict, area_titles={a.name: a.title for a in areas}
        )
    raise typer.Exit(int(report.exit_code(strict)))


@app.command(
    help="Record the raw output of every probe into DIR (secrets redacted), for `check --replay DIR`."
)
def snapshot(
    directory: Path = typer.Argument(..., help="Directory to write (created if needed)."),
    only: Optional[List[str]] = typer.Option(None, "--only", help="Only these areas (comma-separated)."),
    skip: Optional[List[str]] = typer.Option(None, "--skip", help="Skip these areas (comma-separated)."),
    timeout: float = typer.Option(
        DEFAULT_TIMEOUT_S, "--timeout", min=0.1, help="Bound, in seconds, on each probe."
    ),
) -> None:
    from ddpdoctor.checks import load_areas
    from ddpdoctor.engine import run_checks, select_areas
    from ddpdoctor.sources import RecordingSources

    try:
        areas = select_areas(load_areas(), split_names(only), split_names(skip))
    except ValueError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(ExitCode.USAGE) from None
    sources = RecordingSources(deadline=time.monotonic() + timeout)
    # Running the checks drives every probe once; the smoke test is left out: it has no raw output to keep.
    run_checks(sources, areas, timeout_s=timeout, options={"smoke": False, "timeout": timeout})
    written = sources.write(directory)
    typer.echo(f"wrote {len(written)} files to {directory}")
    raise typer.Exit(0)
