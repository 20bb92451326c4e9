"""`ddpdoctor hang`: which rank of a job hanging right now is stuck, where, and why."""

from __future__ import annotations

import os
from typing import Optional

import typer

from ddpdoctor.cli.app import app, emit, format_option, json_option, pick_format, seconds_option, usage_error

HANG_FORMATS = ("table", "json", "markdown")
HANG_EXIT_CODES = (
    "Exit codes: 0 no culprit found: the job progresses (a warning names a straggler), or every local rank waits in "
    "the same collective (a warning); 1 a culprit named (hung or spinning); "
    "2 usage error; 3 nothing could be read (no job, no py-spy, no dump, not a distributed job). With --cluster every task exits with "
    "rank 0's code (1 also when a node did not answer)."
)


@app.command(
    help="Diagnose a job that hangs right now: finds its ranks on this node (torchrun agents and workers), "
    "reads each rank's Python stack (py-spy), queries NCCL RAS and aligns Flight Recorder dumps (--fr), "
    "then names the rank that is behind or out of step, the line it is on, and what the others wait in. "
    "See docs/hang.md.\n\n" + HANG_EXIT_CODES
)
def hang(
    ctx: typer.Context,
    pid: Optional[int] = typer.Option(None, "--pid", min=1, help="The torchrun agent or any rank of the job."),
    fr: Optional[str] = typer.Option(
        None,
        "--fr",
        help="Flight Recorder dumps: a file, a directory, or a prefix (default: the job's TORCH_FR_DUMP_TEMP_FILE, "
        "when dumps are there).",
    ),
    ras_addr: Optional[str] = typer.Option(
        None, "--ras-addr", help="NCCL RAS host:port (default: the job's NCCL_RAS_ADDR, else 127.0.0.1:28028). "
        "Without --pid, only RAS (and --fr) is read: no process of this node is looked at; add --pid to also "
        "read that job's local ranks.",
    ),
    no_ras: bool = typer.Option(False, "--no-ras", help="Do not query NCCL RAS."),
    no_stacks: bool = typer.Option(False, "--no-stacks", help="Do not read the ranks' stacks with py-spy."),
    no_fr: bool = typer.Option(
        False, "--no-fr", help="Without --fr, do not read the dumps the job's TORCH_FR_DUMP_TEMP_FILE names."
    ),
    timeout: float = seconds_option(
        10.0, "--timeout", "Bound, in seconds, on the whole run (every source, every snapshot, the longer look "
        "of up to 6 s when a rank is outside every collective).",
    ),
    samples: int = typer.Option(
        2, "--samples", min=1, max=20,
        help="Snapshots to compare (stacks, CPU time, sleeps, RAS counts): a job where something moved between "
        "them is progressing, not hung. 1 judges one snapshot, as before.",
    ),
    interval: float = seconds_option(1.0, "--interval", "Seconds between snapshots.", min=0.1),
    json_out: bool = json_option(
        "Print the diagnosis as JSON (schema docs/schemas/hang.schema.json; with --cluster hang-cluster.schema.json)."
    ),
    output_format: str = format_option("table (text), json or markdown (for a bug report)."),
    cluster: bool = typer.Option(
        False,
        "--cluster",
        help="Run as one task per node of a small diagnostic job (srun --ntasks-per-node=1, or torchrun "
        "--nproc-per-node 1) beside the hung job: every node analyses its own ranks and rank 0 prints one "
        "verdict for the whole job (docs/hang.md).",
    ),
    join_timeout: float = seconds_option(
        60.0, "--join-timeout", "With --cluster: seconds to wait for every node to join.", min=1.0
    ),
    hosts: Optional[str] = typer.Option(
        None, "--hosts", help="With --cluster: expected hosts (Slurm hostlist, e.g. gpu[01-16]) to name absent ones."
    ),
) -> None:
    from ddpdoctor.edge.sources import redact_data
    from ddpdoctor.hang.probe_io import gather_facts
    from ddpdoctor.hang.verdict import judge_hang

    try:
        fmt = pick_format(json_out, output_format, HANG_FORMATS)
    except ValueError as exc:
        raise usage_error(str(exc)) from None
    if fr is not None and no_fr:
        raise usage_error("--fr and --no-fr contradict each other")
    if ras_addr is not None and no_ras:
        raise usage_error("--ras-addr and --no-ras contradict each other")
    if fr is not None:
        from ddpdoctor.edge.files import InputRefused, refusal_text, user_path_mode

        try:
            # A file, a directory or a prefix: only a path that cannot be looked at is refused here.
            user_path_mode(fr)
        except InputRefused as exc:
            raise usage_error(f"--fr {refusal_text(exc)}") from None
    if cluster:
        _run_cluster(fmt, pid, fr, ras_addr, no_ras, no_stacks, no_fr, timeout, join_timeout, hosts, samples, interval)
    given = [
        flag
        for name, flag in (("join_timeout", "--join-timeout"), ("hosts", "--hosts"))
        # By name: typer vendors click privately, its ParameterSource enum is no public import.
        if getattr(ctx.get_parameter_source(name), "name", "DEFAULT") != "DEFAULT"
    ]
    if given:
        raise usage_error(f"{' and '.join(given)} {'applies' if len(given) == 1 else 'apply'} only with --cluster")
    # --ras-addr names a job, maybe on another node: without --pid, a job that happens to run here is
    # not it, so this node's processes are not looked at (docs/hang.md, "RAS alone").
    local_skipped = (
        f"this node's processes were not looked at: --ras-addr {ras_addr} without --pid reads only NCCL RAS"
        + (" and --fr" if fr else "") + "; add --pid AGENT_OR_RANK to also read a local job's ranks"
        if ras_addr is not None and pid is None else ""
    )
    facts = gather_facts(
        pid, fr, ras_addr, use_ras=not no_ras, use_stacks=not no_stacks, timeout_s=timeout, use_fr=not no_fr,
        samples=samples, interval_s=interval, local_skipped=local_skipped,
    )
    report = judge_hang(facts)
    data = redact_data(report.to_dict())
    if fmt == "json":
        from ddpdoctor.render import print_json

        print_json(data)
    elif fmt == "markdown":
        from ddpdoctor.render.hang import render_hang_markdown

        emit(render_hang_markdown(data))
    else:
        from ddpdoctor.render.hang import render_hang_text

        render_hang_text(data)
    raise typer.Exit(report.exit_code())


def _run_cluster(
    fmt: str, pid: Optional[int], fr: Optional[str], ras_addr: Optional[str], no_ras: bool, no_stacks: bool,
    no_fr: bool, timeout: float, join_timeout: float, hosts: Optional[str], samples: int = 2, interval: float = 1.0,
) -> None:
    """`hang --cluster` on this task; always ends with typer.Exit (only rank 0 prints the report)."""
    from ddpdoctor.cluster.hostlist import expand_hostlist
    from ddpdoctor.cluster.session import print_rank_message
    from ddpdoctor.edge.sources import redact_data
    from ddpdoctor.hang.cluster_io import HangLocalOptions, run_hang_cluster

    local = HangLocalOptions(pid, fr, ras_addr, use_ras=not no_ras, use_stacks=not no_stacks, use_fr=not no_fr,
                             timeout_s=timeout, samples=samples, interval_s=interval)
    try:
        outcome = run_hang_cluster(local, join_timeout, tuple(expand_hostlist(hosts)) if hosts else ())
    except ValueError as exc:  # ClusterUsageError, or a bad --hosts list
        raise usage_error(str(exc)) from None
    # Under torchrun a task that exits non-zero makes the agent print a ChildFailedError traceback after
    # the report, burying the verdict. There every task exits 0 once the session ran, and the status is
    # in the report (its first word, its last line `exit code N`, `exit_code` in --json); srun keeps the
    # codes (docs/hang.md).
    under_torchrun = "TORCHELASTIC_RUN_ID" in os.environ and outcome.exit_code in (0, 1, 3)
    if outcome.report is None:
        print_rank_message(outcome)
        raise typer.Exit(0 if under_torchrun else outcome.exit_code)
    data = redact_data(outcome.report.to_dict())
    if fmt == "json":
        from ddpdoctor.render import print_json

        print_json(data)
    elif fmt == "markdown":
        from ddpdoctor.render.hang import render_hang_cluster_markdown

        emit(render_hang_cluster_markdown(data))
    else:
        from ddpdoctor.render.hang import render_hang_cluster_text

        render_hang_cluster_text(data)
    raise typer.Exit(0 if under_torchrun else outcome.exit_code)
