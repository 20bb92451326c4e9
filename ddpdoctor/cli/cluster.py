"""Cluster mode glue for the CLI: `check --cluster` runs here (check.py hands over to it)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence

import typer

from ddpdoctor.cli.app import usage_error
from ddpdoctor.model import ExitCode


def run_cluster_command(
    *,
    fmt: str,
    only: Sequence[str],
    skip: Sequence[str],
    extra_areas: Sequence[Any],
    timeout: float,
    join_timeout: float,
    hosts: Optional[str],
    options: Mapping[str, Any],
    strict: bool,
    verbose: bool,
    replay: Optional[Path] = None,
    prolog: bool = False,
) -> None:
    """Run `check --cluster` on this rank; always ends with typer.Exit. ValueError means a usage error."""
    from ddpdoctor.checks import load_areas
    from ddpdoctor.cluster.hostlist import expand_hostlist
    from ddpdoctor.cluster.session import ClusterOptions, print_rank_message, run_cluster_check
    from ddpdoctor.engine import select_areas

    if replay is not None:
        raise usage_error("--cluster checks the live nodes; --replay cannot be combined with it")
    if prolog:
        raise usage_error("--prolog checks one node; run it without --cluster")
    if fmt not in ("table", "json"):
        raise usage_error("--cluster supports --format table and json")
    opts = ClusterOptions(
        areas=[*select_areas(load_areas(), only, skip), *extra_areas],
        check_timeout_s=timeout,
        join_timeout_s=join_timeout,
        options=dict(options),
        expected_hosts=expand_hostlist(hosts) if hosts else (),
        strict=strict,
    )
    outcome = run_cluster_check(opts)  # ClusterUsageError is a ValueError: check.py makes it exit 2
    if outcome.report is None:
        print_rank_message(outcome)
        raise typer.Exit(outcome.exit_code)
    report = outcome.report
    if fmt == "json":
        from ddpdoctor.render import print_json

        print_json(report.to_dict(strict))
    else:
        from ddpdoctor.render.cluster import render_cluster_report

        render_cluster_report(report, verbose=verbose, strict=strict)
    raise typer.Exit(int(report.exit_code(strict)))


def run_pairwise_command(
    *,
    backend: str,
    nbytes: Optional[int],
    iters: int,
    warmup: int,
    timeout: float,
    output_format: str,
    json_file: Optional[str],
) -> None:
    """`bench-nccl --pairwise` on this rank; always ends with typer.Exit (rank 0 prints the matrix)."""
    import json

    from ddpdoctor import __version__
    from ddpdoctor.cluster.pairwise import SCHEMA, PairwiseSettings, run_pairwise
    from ddpdoctor.cluster.session import ClusterUsageError, require_launch

    if output_format not in ("table", "json"):
        raise usage_error("--pairwise supports --format table and json")
    try:
        require_launch(os.environ)
    except ClusterUsageError as exc:
        raise usage_error(f"--pairwise measures between nodes: {exc}") from None
    settings = PairwiseSettings(nbytes=nbytes or 0, iters=iters, warmup=warmup, timeout_s=timeout)
    try:
        outcome = run_pairwise(settings, backend=backend)
    except Exception as exc:  # noqa: BLE001 - a broken process group is reported, never a traceback
        typer.echo(f"error: pairwise benchmark failed: {type(exc).__name__}: {exc}", err=True)
        raise typer.Exit(int(ExitCode.INCONCLUSIVE)) from None
    if outcome.analysis is None:
        raise typer.Exit(outcome.exit_code)
    data = {
        "schema": SCHEMA,
        "tool": {"name": "ddpdoctor", "version": __version__},
        "backend": outcome.backend,
        "bytes": outcome.settings.nbytes,
        "iters": outcome.settings.iters,
        "warmup": outcome.settings.warmup,
        **outcome.analysis.to_dict(),
        "exit_code": outcome.exit_code,
    }
    if output_format == "json" or json_file == "-":
        from ddpdoctor.render import print_json

        print_json(data)
    else:
        from ddpdoctor.render.cluster import render_pairwise

        render_pairwise(data, outcome.analysis.findings)
    if json_file and json_file != "-":
        try:
            Path(json_file).write_text(json.dumps(data, indent=2, default=str) + "\n")
        except OSError as exc:
            typer.echo(f"error: cannot write --json {json_file}: {exc.strerror or exc}", err=True)
    raise typer.Exit(outcome.exit_code)
