"""Cluster mode glue for the CLI: `check --cluster` runs here (check.py hands over to it)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence

import typer

from ddpdoctor.cli.app import linger_for_siblings, say, usage_error
from ddpdoctor.core.model import ExitCode


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
    from ddpdoctor.core.engine import select_areas

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
    _refuse_crowded_node(fmt, strict)
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


def _refuse_crowded_node(fmt: str, strict: bool) -> None:
    """More ranks of this job on this node than GPUs (gpu.ranks_per_node): every rank refuses before
    joining, with the same judgement as `check` (exit 2; rank 0 prints the JSON refusal with --json)."""
    from ddpdoctor.bench.preflight import gather_launch_facts, gpu_supply
    from ddpdoctor.cluster.launch import LaunchError, detect_launch
    from ddpdoctor.core.model import Severity
    from ddpdoctor.core.placement import judge_placement, read_local_ranks
    from ddpdoctor.edge.runner import run_argv

    try:
        info = detect_launch(os.environ)
    except LaunchError:
        return  # run_cluster_check names what is wrong with the launch
    if info is None:
        return
    ranks = read_local_ranks(os.environ)
    if ranks.count is None:
        return
    facts = gather_launch_facts(
        lambda c: run_argv(c.argv, c.timeout_s), {k: v for k, v in os.environ.items() if k != "MASTER_PORT"}
    )
    refusals = [f for f in judge_placement(ranks, gpu_supply(facts), None) if f.severity >= Severity.FAIL]
    if not refusals:
        return
    from ddpdoctor.render.bench import render_rank_refusals

    render_rank_refusals(refusals, info.rank, info.local_rank)
    if fmt == "json" and info.rank == 0:
        from ddpdoctor.cluster.report import ClusterReport
        from ddpdoctor.render import print_json

        data = ClusterReport(info.launcher, info.world_size, [], refusals).to_dict(strict)
        data["exit_code"] = int(ExitCode.USAGE)
        print_json(data)
    linger_for_siblings()
    raise typer.Exit(int(ExitCode.USAGE))


def run_pairwise_command(
    *,
    backend: str,
    nbytes: Optional[int],
    iters: int,
    warmup: int,
    timeout: float,
    output_format: str,
    json_file: Optional[str],
    force: bool = False,
) -> None:
    """`bench-nccl --pairwise` on this rank; always ends with typer.Exit (rank 0 prints the matrix)."""

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
        say(f"error: pairwise benchmark failed: {type(exc).__name__}: {exc}", err=True)
        raise typer.Exit(int(ExitCode.INCONCLUSIVE)) from None
    if outcome.refusals:
        from ddpdoctor.render.bench import render_rank_refusals

        render_rank_refusals(outcome.refusals, outcome.rank, outcome.local_rank)
        if outcome.rank == 0:
            refusal = {
                "schema": SCHEMA,
                "tool": {"name": "ddpdoctor", "version": __version__},
                "backend": outcome.backend,
                "refusals": [f.to_dict() for f in outcome.refusals],
                "exit_code": outcome.exit_code,
            }
            if output_format == "json":
                _emit_pairwise(refusal, "-")
            _emit_pairwise(refusal, json_file, force)
        linger_for_siblings()
        raise typer.Exit(outcome.exit_code)
    if outcome.rank == 0:
        for note in outcome.notes:
            say(f"note: {note}", err=True)
    if outcome.analysis is None:
        if outcome.exit_code != 0:
            # torchrun SIGTERMs every rank once one exits non-zero: rank 0 must print the matrix first.
            linger_for_siblings()
        raise typer.Exit(outcome.exit_code)
    data = {
        "schema": SCHEMA,
        "tool": {"name": "ddpdoctor", "version": __version__},
        "backend": outcome.backend,
        "bytes": outcome.settings.nbytes,
        "iters": outcome.settings.iters,
        "warmup": outcome.settings.warmup,
        **outcome.analysis.to_dict(),
        "notes": outcome.notes,
        "exit_code": outcome.exit_code,
    }
    if output_format == "json" or json_file == "-":
        _emit_pairwise(data, "-")
    else:
        from ddpdoctor.render.cluster import render_pairwise

        render_pairwise(data, outcome.analysis.findings)
    if json_file != "-":
        _emit_pairwise(data, json_file, force)
    raise typer.Exit(outcome.exit_code)


def _emit_pairwise(data: Mapping[str, Any], json_file: Optional[str], force: bool = False) -> None:
    """The pairwise JSON document to stdout ('-') or to FILE (--json FILE)."""
    import json

    if json_file == "-":
        from ddpdoctor.render import print_json

        print_json(data)
    elif json_file:
        from ddpdoctor.edge.files import write_output_file

        try:
            write_output_file(json_file, json.dumps(data, indent=2, default=str) + "\n", force=force)
        except OSError as exc:
            say(f"error: cannot write --json {json_file}: {exc.strerror or exc}", err=True)
