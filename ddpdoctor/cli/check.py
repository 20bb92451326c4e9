"""`ddpdoctor check` and `ddpdoctor snapshot`."""

from __future__ import annotations

import os
import stat
import time
from pathlib import Path
from typing import TYPE_CHECKING, List, Optional, Sequence

import typer

from ddpdoctor.cli.app import (
    app,
    emit,
    expect_option,
    format_option,
    help_listing,
    json_option,
    output_option,
    pick_format,
    replay_option,
    say,
    seconds_option,
    timeout_option,
    usage_error,
    write_output_file,
)
from ddpdoctor.core.model import EXIT_CODES_HELP, ExitCode

# What `check --prolog` does besides its exit code when the node is not healthy.
ON_FAIL = ("exit", "drain")

if TYPE_CHECKING:
    from ddpdoctor.core.engine import Area
    from ddpdoctor.core.model import Report
    from ddpdoctor.edge.sources import LiveSources, Sources


def split_names(values: Optional[List[str]]) -> list[str]:
    """`--only gpu,net --only system` -> ["gpu", "net", "system"]."""
    out: list[str] = []
    for v in values or []:
        out.extend(x.strip() for x in v.split(",") if x.strip())
    return out


def start_live_sources(
    timeout: float, only: Sequence[str], skip: Sequence[str], smoke: Optional[bool] = None
) -> LiveSources:
    """Live sources for one check, with the slowest probe already running: the torch import (in the
    torch-info subprocess) starts before the areas are even imported, so everything else overlaps it.
    The caller must close() them: an early exit then kills the subprocess instead of orphaning it.

    On a GPU node the NCCL smoke test is the longest path (its ranks import torch, then NCCL starts):
    the GPU query that decides its backend and rank count starts here too, so that the smoke test's
    launch waits for no command."""
    from ddpdoctor.checks.torch import TORCH_INFO_READERS, live_command
    from ddpdoctor.core.engine import is_selected
    from ddpdoctor.edge.sources import LiveSources

    sources = LiveSources(deadline=time.monotonic() + timeout)
    if any(is_selected(name, only, skip) for name in TORCH_INFO_READERS):
        sources.prefetch(live_command())
    if smoke is not False and is_selected("nccl", only, skip):
        from ddpdoctor.bench.preflight import NVIDIA_SMI_GPUS

        sources.prefetch(NVIDIA_SMI_GPUS)
    return sources


def build_report(
    sources: Sources,
    *,
    label: str,
    only: Sequence[str],
    skip: Sequence[str],
    timeout: float,
    options: dict,
    extra_areas: tuple = (),
) -> tuple[Report, list[Area]]:
    """Run the selected areas (plus `extra_areas`, e.g. expectations) against `sources`; raises
    ValueError on bad area names."""
    from ddpdoctor.checks import load_areas
    from ddpdoctor.core.engine import run_checks, select_areas

    areas = select_areas(load_areas(), only, skip) + list(extra_areas)
    return run_checks(sources, areas, timeout_s=timeout, options=options, source_label=label), areas


def _area_listing() -> str:
    from ddpdoctor.checks import load_areas

    return "Areas (for --only/--skip): " + ", ".join(a.name for a in load_areas()) + "."


@app.command(
    cls=help_listing(_area_listing),
    help="Preflight this node: system, torch/NCCL, launch environment, network and ports, GPUs, RDMA.\n\n"
    + EXIT_CODES_HELP,
)
def check(
    ctx: typer.Context,
    json_out: bool = json_option(
        "Print the report as JSON (schema: docs/schemas/check.schema.json); same as --format json."
    ),
    output_format: str = format_option(
        "table, json, junit (JUnit XML for CI), github (workflow annotations), markdown or prometheus "
        "(node_exporter's textfile collector; with -o FILE.prom). See docs/ci.md."
    ),
    expect: Optional[Path] = expect_option(
        "Also judge the node against an expectations TOML file (docs/ci.md)."
    ),
    prolog: bool = typer.Option(
        False,
        "--prolog",
        help="Slurm prolog / health-check mode: silent and exit 0 when healthy, else one short line per "
        "failing finding and a non-zero exit; the whole run is bounded by --timeout + 2 s.",
    ),
    on_fail: str = typer.Option(
        "exit",
        "--on-fail",
        help="With --prolog: exit (only the exit code says it) or drain (also drain this Slurm node with "
        '`scontrol update ... state=drain reason="ddpdoctor: <first failing id>"`; never resumes it). '
        "See docs/ci.md.",
    ),
    only: Optional[List[str]] = typer.Option(None, "--only", help="Only these areas (comma-separated)."),
    skip: Optional[List[str]] = typer.Option(None, "--skip", help="Skip these areas (comma-separated)."),
    strict: bool = typer.Option(False, "--strict", help="Exit 1 on warnings too."),
    verbose: bool = typer.Option(False, "-v", "--verbose", help="Show evidence and passing checks."),
    timeout: float = timeout_option(),
    output: Optional[Path] = output_option(),
    replay: Optional[Path] = replay_option(
        "Run every check from a snapshot directory instead of this machine."
    ),
    smoke: Optional[bool] = typer.Option(
        None, "--smoke/--no-smoke", help="NCCL smoke test: forced on (gloo on CPU without GPUs) or off."
    ),
    cluster: bool = typer.Option(
        False,
        "--cluster",
        help="Check every node of a torchrun/srun job and report on rank 0 (docs/cluster.md).",
    ),
    join_timeout: float = seconds_option(
        120.0, "--join-timeout", "With --cluster: seconds to wait for every node to join.", min=1.0
    ),
    hosts: Optional[str] = typer.Option(
        None,
        "--hosts",
        help="With --cluster: expected hosts (Slurm hostlist, e.g. gpu[01-16]) to name absent ones.",
    ),
    nproc_per_node: Optional[int] = typer.Option(
        None,
        "--nproc-per-node",
        min=1,
        max=4096,
        help="Judge the GPUs for a job that will start N ranks on this node (preflight before torchrun/srun; "
        "under a launcher its variables are used). See gpu.ranks_per_node in docs/checks.md.",
    ),
) -> None:
    given = {
        name
        for name in ("output_format", "join_timeout", "hosts", "on_fail", "output")
        # By name: typer vendors click privately, its ParameterSource enum is no public import.
        if getattr(ctx.get_parameter_source(name), "name", "DEFAULT") != "DEFAULT"
    }
    conflict = conflicting_check_flags(
        json_out=json_out, output_format=output_format, prolog=prolog, cluster=cluster, given=given,
        on_fail=on_fail,
    )  # fmt: skip
    if conflict:
        raise usage_error(conflict)
    hard_deadline = None
    if prolog:
        from ddpdoctor.ci.prolog import PROLOG_GRACE_S, arm_hard_deadline

        bound = timeout + PROLOG_GRACE_S + (join_timeout if cluster else 0.0)
        if on_fail == "drain":
            from ddpdoctor.edge.slurm import DRAIN_TIMEOUT_S

            bound += DRAIN_TIMEOUT_S  # the scontrol call after the checks has its own bound
        # With --cluster the run also waits up to --join-timeout for the other nodes.
        hard_deadline = arm_hard_deadline(bound)
    only_names, skip_names = split_names(only), split_names(skip)
    # Before anything else is imported: start the torch import (see start_live_sources).
    live = (
        None if replay is not None or cluster else start_live_sources(timeout, only_names, skip_names, smoke)
    )
    try:
        _check(
            live, fmt=(json_out, output_format), expect=expect, prolog=prolog, only=only_names,
            skip=skip_names, strict=strict, verbose=verbose, timeout=timeout, replay=replay, smoke=smoke,
            cluster=cluster, join_timeout=join_timeout, hosts=hosts, nproc_per_node=nproc_per_node,
            drain=on_fail == "drain", output=output,
        )  # fmt: skip
    finally:
        if live is not None:
            live.close()  # kills whatever still runs (a hung probe, or the torch import on a usage error)
        if hard_deadline is not None:
            hard_deadline.cancel()  # the check is over: the bound must not fire later in this process


def conflicting_check_flags(
    *,
    json_out: bool,
    output_format: str,
    prolog: bool,
    cluster: bool,
    given: set[str],
    on_fail: str = "exit",
) -> Optional[str]:
    """Why this combination of `check` flags is a usage error, or None. `given`: the names of the
    options set on the command line (a default must not count as a choice)."""
    fmt = output_format.lower()
    if json_out and "output_format" in given and fmt != "json":
        return f"--json and --format {output_format} conflict: give one of them"
    if prolog and (json_out or "output_format" in given):
        return "--prolog prints one line per failing finding and nothing else; it takes no --json or --format"
    if on_fail not in ON_FAIL:
        return f"--on-fail must be {' or '.join(ON_FAIL)}, not {on_fail!r}"
    if on_fail != "exit" and not prolog:
        return f"--on-fail {on_fail} acts on a Slurm node: use it with --prolog"
    if "output" in given:
        if prolog:
            return "--prolog prints its lines for Slurm; it takes no --output"
        if cluster:
            return "--output writes this node's report; --cluster prints the job's on rank 0"
        if not json_out and fmt == "table":
            return (
                "--output writes a machine format: add --format prometheus (or json, junit, github, markdown)"
            )
    if not cluster:
        flags = [
            flag for name, flag in (("join_timeout", "--join-timeout"), ("hosts", "--hosts")) if name in given
        ]
        if flags:
            return f"{' and '.join(flags)} {'applies' if len(flags) == 1 else 'apply'} only with --cluster"
    return None


def _check(
    live: Optional[LiveSources],
    *,
    fmt: tuple[bool, str],
    expect: Optional[Path],
    prolog: bool,
    only: list[str],
    skip: list[str],
    strict: bool,
    verbose: bool,
    timeout: float,
    replay: Optional[Path],
    smoke: Optional[bool],
    cluster: bool,
    join_timeout: float,
    hosts: Optional[str],
    nproc_per_node: Optional[int] = None,
    drain: bool = False,
    output: Optional[Path] = None,
) -> None:
    """The body of `check`, always ending in typer.Exit."""
    from ddpdoctor.render.formats import (
        FORMATS,
        document_from_report,
        redact_report,
        render_document,
        render_prolog,
    )
    from ddpdoctor.render.prometheus import PROMETHEUS

    options = {"smoke": smoke, "timeout": timeout, "nproc_per_node": nproc_per_node}
    try:
        output_format = pick_format(*fmt, (*FORMATS, PROMETHEUS))
        extra = ()
        if expect is not None:
            from ddpdoctor.ci.expect import expectation_area
            from ddpdoctor.ci.expectations import load_expectations

            extra = (expectation_area(load_expectations(expect)),)
        if cluster:
            from ddpdoctor.cli.cluster import run_cluster_command

            run_cluster_command(
                fmt=output_format, only=only, skip=skip, extra_areas=extra, timeout=timeout,
                join_timeout=join_timeout, hosts=hosts, options=options, strict=strict, verbose=verbose,
                replay=replay, prolog=prolog,
            )  # fmt: skip
        if replay is not None:
            from ddpdoctor.edge.sources import ReplaySources

            sources: Sources = ReplaySources(replay)
            label = f"replay:{replay}"
        else:
            assert live is not None
            sources, label = live, "live"
        if output_format == "table" and not prolog:
            from ddpdoctor.render.check import render_check_report  # rich: imported while probes run
        report, areas = build_report(
            sources, label=label, only=only, skip=skip, timeout=timeout, options=options, extra_areas=extra
        )
    except ValueError as exc:
        raise usage_error(str(exc)) from None
    # Findings quote commands, environment values and tool output: no secret may reach any format.
    report = redact_report(report)
    if prolog:
        for line in render_prolog(report.findings, strict):
            say(line)
        if drain:
            drain_this_node(report, strict)
    elif output_format == "table":
        render_check_report(
            report, verbose=verbose, strict=strict, area_titles={a.name: a.title for a in areas}
        )
    else:
        doc = document_from_report(report, strict)
        if output_format == PROMETHEUS:
            from ddpdoctor import __version__
            from ddpdoctor.render.prometheus import render_prometheus

            text = render_prometheus(doc, finished_at=time.time(), version=__version__)
        else:
            text = render_document(
                output_format, doc, json_data=report.to_dict(strict), strict=strict, verbose=verbose
            )
        if output is not None:
            write_output_file(output, text)
        else:
            emit(text)
    code = int(report.exit_code(strict))
    if code and "TORCHELASTIC_RUN_ID" in os.environ:
        # torchrun SIGTERMs the other ranks as soon as one exits non-zero: let them print theirs too.
        from ddpdoctor.cli.app import linger_for_siblings

        linger_for_siblings()
    raise typer.Exit(code)


def drain_this_node(report: Report, strict: bool) -> None:
    """`--on-fail drain`: drain this Slurm node for the first failing finding (nothing when healthy).
    What happened goes to stderr; the exit code stays the check's own."""
    from ddpdoctor.core.model import failing_findings
    from ddpdoctor.edge.slurm import drain_for

    failing = failing_findings(report.findings, strict)
    outcome = drain_for(failing[0].id if failing else None, os.environ)
    if outcome is not None:
        say(outcome.describe(), err=True)


@app.command(
    help="Record the raw output of every probe into DIR (secrets redacted), for `check --replay DIR`."
)
def snapshot(
    directory: Path = typer.Argument(..., help="Directory to write (created if needed)."),
    only: Optional[List[str]] = typer.Option(None, "--only", help="Only these areas (comma-separated)."),
    skip: Optional[List[str]] = typer.Option(None, "--skip", help="Skip these areas (comma-separated)."),
    timeout: float = timeout_option(),
) -> None:
    from ddpdoctor.checks import load_areas
    from ddpdoctor.core.engine import select_areas

    try:
        areas = select_areas(load_areas(), split_names(only), split_names(skip))
        # Before any probe runs: a bad DIR must not cost a full run and then a traceback.
        claim = prepare_snapshot_dir(directory)
    except ValueError as exc:
        raise usage_error(str(exc)) from None
    try:
        _snapshot_into(directory, areas, timeout)
    finally:
        claim.unlink(missing_ok=True)


def _snapshot_into(directory: Path, areas: list, timeout: float) -> None:
    from ddpdoctor.core.engine import run_checks
    from ddpdoctor.edge.sources import RecordingSources
    from ddpdoctor.render.progress import StderrProgress

    with RecordingSources(deadline=time.monotonic() + timeout) as sources:
        if any(area.name == "gpu" for area in areas):
            from ddpdoctor.checks.gpu.collect import NVIDIA_SMI_Q

            # The checks read NVML when they can and nvidia-smi -q only as a fallback, but support engineers
            # read the raw `nvidia-smi -q` of a bug report: keep it too (started now, it overlaps the rest).
            sources.prefetch(NVIDIA_SMI_Q)
        # Running the checks drives every probe once; the smoke test is left out: it has no raw output.
        with StderrProgress("snapshot", total=len(areas)) as progress:

            def done(name: str) -> None:
                progress.describe(f"{name} recorded")
                progress.advance()

            run_checks(
                sources, areas, timeout_s=timeout, options={"smoke": False, "timeout": timeout}, on_area_done=done
            )
        if any(area.name == "gpu" for area in areas):
            sources.run(NVIDIA_SMI_Q)  # waits for the prefetched run; recorded even when nothing else asked
    try:
        written = sources.write(directory)
    except OSError as exc:  # e.g. the disk filled up, or DIR was removed meanwhile
        say(f"error: could not write the snapshot to {directory}: {exc}", err=True)
        raise typer.Exit(int(ExitCode.INCONCLUSIVE)) from None
    say(f"wrote {len(written)} files to {directory}")
    raise typer.Exit(0)


SNAPSHOT_CLAIM = ".ddpdoctor-snapshot-in-progress"


def prepare_snapshot_dir(directory: Path) -> Path:
    """Create `directory` for a snapshot and claim it, or raise ValueError (a usage error) saying why not.
    Returns the claim file, which the caller removes once the snapshot is written.

    An existing non-empty directory is refused rather than written into: a file left from an earlier
    snapshot (say nvidia-smi-q.txt from another machine) would be replayed as if this machine wrote it,
    and deleting a user's files is not ours to do. Two snapshots started at once into one new directory
    both found it empty and mixed their files: the claim file, created with O_EXCL, lets only one in."""
    from ddpdoctor.edge.files import InputRefused, refusal_text, shown_path, user_path_mode

    try:
        mode = user_path_mode(directory, follow_symlinks=False)
    except InputRefused as exc:
        raise ValueError(f"snapshot directory {refusal_text(exc)}") from None
    if mode is not None and stat.S_ISLNK(mode):
        # Followed, the link would put the snapshot wherever it points (another user's directory).
        raise ValueError(f"snapshot directory {shown_path(directory)} is a symbolic link; refusing to write "
                         "through it (give the directory it points to, if that is meant)")
    if mode is not None and not stat.S_ISDIR(mode):
        raise ValueError(f"snapshot directory {directory} exists and is not a directory")
    if mode is not None:
        try:
            entries = next(iter(directory.iterdir()), None)
        except OSError as exc:
            raise ValueError(f"cannot read snapshot directory {directory}: {exc.strerror or exc}") from None
        if entries is not None and entries.name == SNAPSHOT_CLAIM:
            raise ValueError(f"another ddpdoctor snapshot is being written into {directory} (or one was "
                             f"interrupted: remove {entries} if none runs)")
        if entries is not None:
            raise ValueError(
                f"snapshot directory {directory} is not empty; files of an earlier snapshot would be "
                "replayed as this one's. Choose a new directory (e.g. snapshot-$(hostname)-$(date +%s))"
            )
    else:
        try:
            directory.mkdir(parents=True)
        except OSError as exc:
            raise ValueError(f"cannot create snapshot directory {directory}: {exc.strerror or exc}") from None
    if not os.access(directory, os.W_OK | os.X_OK):
        raise ValueError(f"snapshot directory {directory} is not writable")
    claim = directory / SNAPSHOT_CLAIM
    try:
        os.close(os.open(claim, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644))
    except FileExistsError:
        raise ValueError(f"another ddpdoctor snapshot is being written into {directory}") from None
    except OSError as exc:
        raise ValueError(f"cannot write into snapshot directory {directory}: {exc.strerror or exc}") from None
    try:
        others = [p.name for p in directory.iterdir() if p.name != SNAPSHOT_CLAIM]
    except OSError:
        others = []
    if others:  # a file appeared between the check above and the claim: another writer got in first
        claim.unlink(missing_ok=True)
        raise ValueError(f"snapshot directory {directory} is not empty ({others[0]} appeared meanwhile)")
    return claim
