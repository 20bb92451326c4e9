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
    extra_areas: tuple = (),
):
    """Run the selected areas (plus `extra_areas`, e.g. expectations) against the live machine or a
    snapshot; raises ValueError on bad area names."""
    from ddpdoctor.checks import load_areas
    from ddpdoctor.engine import run_checks, select_areas
    from ddpdoctor.sources import LiveSources, ReplaySources

    areas = select_areas(load_areas(), only, skip) + list(extra_areas)
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
        False, "--json", help="Print the report as JSON (schema in docs/checks.md); same as --format json."
    ),
    output_format: str = typer.Option(
        "table",
        "--format",
        help="table, json, junit (JUnit XML for CI), github (workflow annotations) or markdown. See docs/ci.md.",
    ),
    expect: Optional[Path] = typer.Option(
        None,
        "--expect",
        help="Also judge the node against an expectations TOML file (docs/ci.md).",
        exists=True,
        dir_okay=False,
    ),
    prolog: bool = typer.Option(
        False,
        "--prolog",
        help="Slurm prolog / health-check mode: silent and exit 0 when healthy, else one short line per "
        "failing finding and a non-zero exit; the whole run is bounded by --timeout + 2 s.",
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
    cluster: bool = typer.Option(
        False,
        "--cluster",
        help="Check every node of a torchrun/srun job and report on rank 0 (docs/cluster.md).",
    ),
    join_timeout: float = typer.Option(
        120.0, "--join-timeout", min=1.0, help="With --cluster: seconds to wait for every node to join."
    ),
    hosts: Optional[str] = typer.Option(
        None,
        "--hosts",
        help="With --cluster: expected hosts (Slurm hostlist, e.g. gpu[01-16]) to name absent ones.",
    ),
) -> None:
    from ddpdoctor.render.check import render_check_report
    from ddpdoctor.render.formats import (
        FORMATS,
        document_from_report,
        redact_report,
        render_document,
        render_prolog,
    )

    if prolog:
        from ddpdoctor.prolog import PROLOG_GRACE_S, arm_hard_deadline

        # With --cluster the run also waits up to --join-timeout for the other nodes.
        arm_hard_deadline(timeout + PROLOG_GRACE_S + (join_timeout if cluster else 0.0))
    fmt = "json" if json_out else output_format
    options = {"smoke": smoke, "timeout": timeout}
    try:
        if fmt not in FORMATS:
            raise ValueError(f"unknown --format {fmt!r}; known: {', '.join(FORMATS)}")
        extra = ()
        if expect is not None:
            from ddpdoctor.expect import expectation_area, load_expectations

            extra = (expectation_area(load_expectations(expect)),)
        if cluster:
            from ddpdoctor.cli.cluster import run_cluster_command

            run_cluster_command(
                fmt=fmt, only=split_names(only), skip=split_names(skip), extra_areas=extra, timeout=timeout,
                join_timeout=join_timeout, hosts=hosts, options=options, strict=strict, verbose=verbose,
                replay=replay, prolog=prolog,
            )  # fmt: skip
        report, areas = build_report(
            replay=replay,
            only=split_names(only),
            skip=split_names(skip),
            timeout=timeout,
            options=options,
            extra_areas=extra,
        )
    except ValueError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(ExitCode.USAGE) from None
    # Findings quote commands, environment values and tool output: no secret may reach any format.
    report = redact_report(report)
    if prolog:
        for line in render_prolog(report.findings, strict):
            typer.echo(line)
    elif fmt == "table":
        render_check_report(
            report, verbose=verbose, strict=strict, area_titles={a.name: a.title for a in areas}
        )
    else:
        doc = document_from_report(report, strict)
        typer.echo(
            render_document(fmt, doc, json_data=report.to_dict(strict), strict=strict, verbose=verbose),
            nl=False,
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
