"""`ddpdoctor bench-nccl`: collective bandwidth with nccl-tests' numbers, correctness on, a launch that cannot hang.

Over 600 lines: the bench-nccl command's three launch paths (local, torchrun/srun, --pairwise) share option handling and the refusal/exit-code contract.
"""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import sys
import time
from pathlib import Path
from typing import Any, Optional

import typer

from ddpdoctor.cli import bench_output
from ddpdoctor.cli.app import (
    app,
    emit,
    expect_option,
    linger_for_siblings,
    output_option,
    say,
    seconds_option,
)
from ddpdoctor.core.model import ExitCode

DEFAULT_TIMEOUT_S = 60.0
DEFAULT_MAX_BYTES_NCCL = "1G"
DEFAULT_MAX_BYTES_GLOO = "32M"  # gloo on CPU moves ~1 GB/s: 1 GiB x 25 iterations x 7 ops takes minutes

BENCH_EXIT_CODES = (
    "Exit codes: 0 every result correct and every verdict passed; 1 wrong elements, busbw below --min-busbw, "
    "a regression against --baseline, a rank that failed or hung, or a --json/--csv/--output file that could not "
    "be written; 2 usage error or a launch refused before start (nothing ran); 3 the ranks could not be started; "
    "130 interrupted (Ctrl-C); 143 terminated (SIGTERM: kill, scancel, a Slurm time limit). Interrupted or "
    "terminated, the rows measured so far are still written."
)


def _split_ops(values: str) -> list[str]:
    from ddpdoctor.bench.math import OPS

    ops = [o.strip() for o in values.split(",") if o.strip()]
    aliases = {
        "alltoall": "all_to_all",
        "allreduce": "all_reduce",
        "allgather": "all_gather",
        "reducescatter": "reduce_scatter",
        "send_recv": "sendrecv",
    }
    ops = [aliases.get(o, o) for o in ops]
    unknown = [o for o in ops if o not in OPS]
    if unknown or not ops:
        raise ValueError(f"unknown op(s): {', '.join(unknown) or '(none)'}; known: {', '.join(OPS)}")
    return list(dict.fromkeys(ops))


def _usage(message: str) -> typer.Exit:
    say(f"error: {message}", err=True)
    return typer.Exit(int(ExitCode.USAGE))


def _refuse_malformed_launch(json_file: Optional[str], force: bool = False) -> None:
    """A launcher variable that is not a number (RANK=abc) is refused, as `check` reports it
    (launch.var.malformed), instead of silently running a local benchmark: exit 2 on every rank."""
    from ddpdoctor.checks.launch import SLURM_INT_VARS, TORCH_INT_VARS, check_malformed, parse_launch_env
    from ddpdoctor.render.bench import render_refusals

    # MASTER_PORT/MASTER_ADDR have refusals of their own (bench.master_port.invalid, the launch checks).
    names = set(TORCH_INT_VARS + SLURM_INT_VARS)
    refusals = [f for f in check_malformed(parse_launch_env(os.environ)) if f.data.get("name") in names]
    if not refusals:
        return
    render_refusals(refusals)
    bench_output.write_refusal_outputs(
        {"json_file": json_file, "csv_file": None, "format": "table", "force": force},
        {"host": socket.gethostname()},
        refusals,
    )
    raise typer.Exit(int(ExitCode.USAGE))


def _check_outputs(json_file: Optional[str], csv_file: Optional[str], force: bool = False) -> None:
    """Usage errors for output files that cannot be written or that would share stdout."""
    from ddpdoctor.edge.files import output_target_problem, shown_path

    if json_file == "-" and csv_file == "-":
        raise _usage("--json - and --csv - would both print to stdout; write one of them to a FILE")
    for flag, value in (("--json", json_file), ("--csv", csv_file)):
        if value is None or value == "-":
            continue
        if not value:
            raise _usage(f"{flag} needs a FILE name (or '-' for stdout)")
        # Under a launcher only rank 0 writes the file: another rank that finds it there was merely slower than
        # rank 0 (a refusal rank 0 already wrote), so "exists" is rank 0's question alone.
        problem = output_target_problem(value, force=force or not _writes_outputs())
        if problem is not None:
            raise _usage(f"cannot write {flag} {shown_path(value)}: {problem}; nothing was run")


def _writes_outputs() -> bool:
    """This process writes --json/--csv: no launcher, or rank 0 of one (a malformed launch counts as a writer)."""
    from ddpdoctor.cluster.launch import LaunchError, detect_launch

    try:
        launch = detect_launch(os.environ)
    except LaunchError:
        return True
    return launch is None or launch.rank == 0


@app.command(
    "bench-nccl",
    help="Benchmark collectives (all_reduce, all_gather, ...) with nccl-tests' algbw/busbw and a correctness "
    "check, one rank per GPU (NCCL) or on CPU (gloo). Under torchrun or srun, joins as a rank.\n\n"
    + BENCH_EXIT_CODES,
)
def bench_nccl(
    nproc: Optional[int] = typer.Option(
        None,
        "--nproc",
        min=1,
        help="Ranks to start (default: one per visible GPU with NCCL; with gloo on CPU, 4 but at most the "
        "usable CPUs, and at least 2).",
    ),
    backend: str = typer.Option(
        "auto", "--backend", help="auto, nccl or gloo (auto: NCCL when CUDA is usable)."
    ),
    ops: str = typer.Option(
        "all_reduce,all_gather,reduce_scatter,broadcast,reduce,all_to_all,sendrecv",
        "--ops",
        help="Comma-separated collectives to run.",
    ),
    min_bytes: str = typer.Option(
        "8", "--min-bytes", help="Smallest size (K/M/G = powers of 1024, as nccl-tests)."
    ),
    max_bytes: Optional[str] = typer.Option(
        None,
        "--max-bytes",
        help=f"Largest size (default {DEFAULT_MAX_BYTES_NCCL} with NCCL, {DEFAULT_MAX_BYTES_GLOO} with gloo).",
    ),
    step_factor: int = typer.Option(2, "--step-factor", min=2, help="Multiply the size by this each step."),
    iters: int = typer.Option(20, "--iters", min=1, help="Timed operations per size."),
    warmup: int = typer.Option(5, "--warmup", min=0, help="Untimed operations before timing."),
    dtype: str = typer.Option("float32", "--dtype", help="float32, float16 or bfloat16."),
    check_values: bool = typer.Option(
        True, "--check/--no-check", help="Verify every result against the expected values (#wrong)."
    ),
    graph: bool = typer.Option(
        True,
        "--graph/--no-graph",
        help="With NCCL on GPUs, capture each op's --iters loop in a CUDA graph and time its replay, as "
        "nccl-tests -G 1 (an op whose capture fails is timed eagerly, and says so). --no-graph: an eager "
        "loop, as nccl-tests without -G. The correctness check runs on the same path.",
    ),
    timeout: float = seconds_option(
        DEFAULT_TIMEOUT_S,
        "--timeout",
        "Most seconds any one step may take (process-group init, or one op at one size); then the "
        "stuck ranks' stacks are printed and every rank is killed. Starting a rank (interpreter and "
        "torch import) is not a step: it gets max(--timeout, 60) seconds.",
        min=1.0,
    ),
    json_file: Optional[str] = typer.Option(
        None, "--json", help="Write rows + environment as JSON to FILE ('-': stdout)."
    ),
    csv_file: Optional[str] = typer.Option(
        None, "--csv", help="Write rows + environment as CSV to FILE ('-': stdout)."
    ),
    output: Optional[Path] = output_option(),
    force: bool = typer.Option(
        False, "--force", help="Overwrite an existing --json/--csv FILE (replaced whole, never through a link)."
    ),
    min_busbw: Optional[float] = typer.Option(
        None, "--min-busbw", min=0.0, help="Exit 1 when the all_reduce peak busbw (GB/s) is below this."
    ),
    baseline: Optional[Path] = typer.Option(
        None, "--baseline", help="An earlier --json file: exit 1 when an op's peak busbw regressed."
    ),
    baseline_tolerance: float = typer.Option(
        0.10, "--baseline-tolerance", min=0.0, max=1.0, help="Allowed drop against --baseline (0.10 = 10%)."
    ),
    output_format: str = typer.Option(
        "table",
        "--format",
        help="table, json (to stdout, like --json -), junit, github (workflow annotations), markdown or "
        "prometheus (node_exporter's textfile collector; with -o FILE.prom). See docs/ci.md.",
    ),
    expect: Optional[Path] = expect_option(
        "Judge peak busbw per op against the [busbw_min_gbps] of an expectations TOML file (docs/ci.md)."
    ),
    pairwise: bool = typer.Option(
        False,
        "--pairwise",
        help="Under torchrun/srun: send/recv bandwidth between every pair of nodes (one rank per node, "
        "--max-bytes messages), as a node x node matrix naming a slow node or link (docs/cluster.md).",
    ),
) -> None:
    from ddpdoctor.bench.math import DTYPE_SIZES
    from ddpdoctor.bench.sizes import check_size_range, parse_size, size_sequence

    started = time.time()  # the run's duration in --format prometheus
    if backend not in ("auto", "nccl", "gloo"):
        raise _usage(f"--backend must be auto, nccl or gloo, not {backend!r}")
    if dtype not in DTYPE_SIZES:
        raise _usage(f"--dtype must be one of {', '.join(DTYPE_SIZES)}, not {dtype!r}")
    try:
        op_list = _split_ops(ops)
        lo = parse_size(min_bytes)
        hi_given = parse_size(max_bytes) if max_bytes is not None else None
        check_size_range(lo, hi_given)
        if hi_given is not None:
            size_sequence(lo, hi_given, step_factor)
    except ValueError as exc:
        raise _usage(str(exc)) from None
    _check_outputs(json_file, csv_file, force)
    _refuse_malformed_launch("-" if output_format == "json" else json_file, force)
    if pairwise:
        from ddpdoctor.cli.cluster import run_pairwise_command
        from ddpdoctor.cluster.launch import LaunchError, detect_launch

        try:
            launched = detect_launch(os.environ) is not None
        except LaunchError:
            launched = True  # a malformed launch: run_pairwise_command names what is wrong with it
        if not launched:
            raise _usage(
                "bench-nccl --pairwise measures between nodes, one rank per node: start it on every node "
                "with torchrun (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT) or srun (SLURM_PROCID, "
                "SLURM_NTASKS); see docs/cluster.md"
            )

        if hi_given is not None:
            from ddpdoctor.bench.preflight import judge_buffer_memory
            from ddpdoctor.render.bench import render_refusals

            # One send and one receive buffer of --max-bytes per node leader: an absurd size is refused on
            # every rank alike, before the process group (the memory is judged by the local run only).
            absurd = judge_buffer_memory(("sendrecv",), hi_given, 1, 2, 1, False, None, "--max-bytes")
            if absurd is not None:
                render_refusals([absurd])
                raise typer.Exit(int(ExitCode.USAGE))
        run_pairwise_command(
            backend=backend,
            nbytes=hi_given,
            iters=iters,
            warmup=warmup,
            timeout=timeout,
            output_format=output_format,
            json_file=json_file,
            force=force,
        )
        # run_pairwise_command ends with typer.Exit; should it ever return, the pairwise run still
        # is the whole command: never fall through into the collective benchmark.
        return
    from ddpdoctor.render.formats import FORMATS
    from ddpdoctor.render.prometheus import PROMETHEUS

    known = (*FORMATS, PROMETHEUS)
    if output_format not in known:
        raise _usage(f"--format must be one of {', '.join(known)}, not {output_format!r}")
    if output is not None and output_format in ("table", "json"):
        raise _usage(
            "--output writes the --format output: add --format prometheus (or junit, github, markdown); "
            "JSON goes to a file with --json FILE"
        )
    if output_format == "json":
        if json_file not in (None, "-"):
            raise _usage("--format json prints to stdout; use --json FILE or --format json, not both")
        json_file = "-"
    elif output_format != "table" and json_file == "-":
        raise _usage(
            f"--json - and --format {output_format} would both print to stdout; write --json to a FILE"
        )
    if output_format != "table" and csv_file == "-":
        raise _usage(
            f"--csv - and --format {output_format} would both print to stdout; write --csv to a FILE"
        )
    expectations = None
    notes: list[str] = []
    if expect is not None:
        from ddpdoctor.ci.expectations import ExpectationsError, load_expectations

        try:
            expectations = load_expectations(expect)
        except ExpectationsError as exc:
            raise _usage(str(exc)) from None
        if not expectations.busbw_min_gbps:
            notes.append(
                f"--expect {expect} has no [busbw_min_gbps] table: nothing in this run is judged from it"
            )
            say(f"note: {notes[-1]}", err=True)
    if min_busbw is not None and "all_reduce" not in op_list:
        raise _usage("--min-busbw judges all_reduce: include it in --ops")
    baseline_rows = None
    if baseline is not None:
        from ddpdoctor.bench.results import load_baseline_rows
        from ddpdoctor.edge.files import JSON_FILE_LIMIT, load_json_text, read_user_bytes

        try:
            text = read_user_bytes(baseline, JSON_FILE_LIMIT)
        except (OSError, ValueError) as exc:
            raise _usage(
                f"cannot read --baseline {baseline}: {getattr(exc, 'strerror', None) or exc}"
            ) from None
        try:
            baseline_rows = load_baseline_rows(load_json_text(text))
        except ValueError as exc:
            why = "it is not JSON" if isinstance(exc, json.JSONDecodeError) else str(exc)
            raise _usage(
                f"--baseline {baseline} must be the output of an earlier `ddpdoctor bench-nccl --json FILE` "
                f"run ({why})"
            ) from None

    from ddpdoctor.bench.external import detect_external_launch

    ext = detect_external_launch(os.environ)
    options = dict(
        op_list=op_list,
        lo=lo,
        hi_given=hi_given,
        step_factor=step_factor,
        iters=iters,
        warmup=warmup,
        dtype=dtype,
        check=check_values,
        graph=graph,
        timeout=timeout,
        json_file=json_file,
        csv_file=csv_file,
        force=force,
        min_busbw=min_busbw,
        baseline_rows=baseline_rows,
        baseline_tolerance=baseline_tolerance,
        format=output_format,
        output=output,
        started=started,
        expectations=expectations,
        notes=notes,
    )
    if ext is not None:
        code = _run_joined(ext, backend, nproc, options)
    else:
        code = _run_local(backend, nproc, options)
    raise typer.Exit(code)


def _plan(decision_backend: str, options: dict[str, Any]):
    from ddpdoctor.bench.plan import BenchPlan
    from ddpdoctor.bench.sizes import parse_size, size_sequence

    hi = options["hi_given"]
    if hi is None:
        hi = parse_size(DEFAULT_MAX_BYTES_NCCL if decision_backend == "nccl" else DEFAULT_MAX_BYTES_GLOO)
        hi = max(hi, options["lo"])
    sizes = size_sequence(options["lo"], hi, options["step_factor"])
    return BenchPlan(
        ops=tuple(options["op_list"]),
        sizes=tuple(sizes),
        dtype=options["dtype"],
        iters=options["iters"],
        warmup=options["warmup"],
        check=options["check"],
        graph=options.get("graph", False),
    )


def _run_local(backend: str, nproc: Optional[int], options: dict[str, Any]) -> int:
    from ddpdoctor.bench import preflight
    from ddpdoctor.bench.launcher import launch_local
    from ddpdoctor.bench.limits import with_one_rank_gate_refusal
    from ddpdoctor.bench.outcome import LaunchRefused
    from ddpdoctor.bench.preflight import cpu_count, gather_launch_facts, plan_launch, visible_gpus
    from ddpdoctor.edge.runner import run_argv
    from ddpdoctor.render.bench import BenchProgress, render_notes, render_refusals

    facts = gather_launch_facts(lambda c: run_argv(c.argv, c.timeout_s), os.environ)
    decision = plan_launch(facts, backend, nproc, cpu_count())
    decision = with_one_rank_gate_refusal(decision, *_gates(options))
    plan = _plan(decision.backend, options)
    local = decision.nproc if decision.backend == "gloo" else 1  # NCCL: one rank per GPU
    too_large = _buffer_refusal(plan, decision.backend, decision.nproc, local, decision.gpu_indices)
    if too_large is not None:
        decision = dataclasses.replace(decision, refusals=(*decision.refusals, too_large))
    if decision.refusals:
        render_refusals(decision.refusals)
        bench_output.write_refusal_outputs(
            options, _environment(facts, {}, decision.backend, decision.nproc), decision.refusals
        )
        return int(ExitCode.USAGE)
    render_notes(decision.notes)
    options = {**options, "fallback": decision.fallback}
    try:
        with BenchProgress(plan.steps) as progress:
            result = launch_local(
                plan,
                nproc=decision.nproc,
                backend=decision.backend,
                step_timeout_s=options["timeout"],
                master_port=facts.master_port,
                on_event=progress.on_event,
            )
    except LaunchRefused as exc:  # the pinned port was taken between the check and the launch
        say(f"refused before launch: MASTER_PORT: {exc}", err=True)
        return int(ExitCode.USAGE)
    gpus = visible_gpus(facts)[: result.world_size] if decision.backend == "nccl" else []
    ceiling = preflight.read_memory_ceiling(decision.backend, [g.index for g in gpus], [g.name for g in gpus])
    expected, interconnect = _expected(decision, facts, result.world_size, ceiling)
    return _report(
        options,
        plan,
        result,
        _environment(facts, result.env, decision.backend, decision.nproc),
        expected,
        interconnect,
        show=True,
        ceiling=ceiling,
    )


def _run_joined(ext: Any, backend: str, nproc: Optional[int], options: dict[str, Any]) -> int:
    from ddpdoctor.bench import preflight
    from ddpdoctor.bench.external import join_as_rank
    from ddpdoctor.bench.limits import one_rank_gate_refusal
    from ddpdoctor.bench.preflight import gather_launch_facts, plan_joined
    from ddpdoctor.cluster.topology import run_scoped_benchmark
    from ddpdoctor.edge.runner import run_argv
    from ddpdoctor.render.bench import BenchProgress, render_notes, render_rank_failure, render_rank_refusals

    if nproc is not None and nproc != ext.world_size:
        raise _usage(
            f"--nproc {nproc} disagrees with the {ext.launcher} world size {ext.world_size}; drop --nproc"
        )
    if ext.master_port is not None and not 0 < ext.master_port < 65536:
        raise _usage(f"MASTER_PORT={ext.master_port} is not a port number from 1 to 65535")
    if not ext.master_addr or not ext.master_port:
        raise _usage(
            f"launched by {ext.launcher} as rank {ext.rank}, but MASTER_ADDR/MASTER_PORT are not set; under srun: "
            "export MASTER_ADDR=$(scontrol show hostnames $SLURM_JOB_NODELIST | head -n1) MASTER_PORT=29500"
        )
    # Every rank judges this node's GPUs before init_process_group and refuses with the others (exit 2):
    # torchrun's ChildFailedError must never be all a user sees.
    facts = gather_launch_facts(
        lambda c: run_argv(c.argv, c.timeout_s),
        {k: v for k, v in os.environ.items() if k != "MASTER_PORT"},  # held by the launcher's store: fine
    )
    decision = plan_joined(facts, backend, os.environ)
    local = (decision.nproc or 1) if decision.backend == "gloo" else 1  # NCCL: one rank per GPU
    too_large = _buffer_refusal(
        _plan(decision.backend, options), decision.backend, ext.world_size, local, [ext.local_rank]
    )
    if too_large is not None:
        decision = dataclasses.replace(decision, refusals=(*decision.refusals, too_large))
    if decision.refusals:
        render_rank_refusals(decision.refusals, ext.rank, ext.local_rank)
        if ext.rank == 0:
            bench_output.write_refusal_outputs(
                options,
                _environment(facts, {"launcher": ext.launcher}, decision.backend, ext.world_size),
                decision.refusals,
            )
        linger_for_siblings()
        return int(ExitCode.USAGE)
    if ext.local_rank == 0:
        render_notes(decision.notes)
    chosen = decision.backend
    plan = _plan(chosen, options)
    refusal = one_rank_gate_refusal(ext.world_size, *_gates(options), backend=chosen)
    if refusal is not None:
        from ddpdoctor.render.bench import render_refusals

        render_refusals([refusal])
        if ext.rank == 0:
            env = {"host": socket.gethostname(), "backend": chosen, "world_size": ext.world_size}
            bench_output.write_refusal_outputs(options, {**env, "launcher": ext.launcher}, [refusal])
        return int(ExitCode.USAGE)
    with BenchProgress(plan.steps if ext.rank == 0 else 0) as progress:
        result = join_as_rank(
            plan,
            ext,
            backend=chosen,
            step_timeout_s=options["timeout"],
            on_event=progress.on_event if ext.rank == 0 else None,
            scoped=run_scoped_benchmark,
        )
    env = dict(result.env)
    env.setdefault("host", socket.gethostname())
    env["world_size"] = ext.world_size
    env["launcher"] = ext.launcher
    names = [str(d) for d in (result.env.get("devices") or [])]
    ceiling = preflight.read_memory_ceiling(chosen, None, names) if ext.rank == 0 else None
    if not result.ok and not result.interrupted and ext.rank != 0:
        render_rank_failure(result, ext.rank)  # rank 0 reports the whole launch below
    return _report(options, plan, result, env, None, None, show=ext.rank == 0, ceiling=ceiling)


def _buffer_refusal(
    plan: Any, backend: str, nranks: int, local_ranks: int, gpu_indices: Any
) -> Optional[Any]:
    """bench.max_bytes.too_large when the largest size cannot fit in this host's (gloo) or GPU's
    (NCCL) free memory, or is absurd; None otherwise."""
    from ddpdoctor.bench import preflight
    from ddpdoctor.bench.math import DTYPE_SIZES

    if nranks < 1 or not plan.sizes:
        return None
    size = max(plan.sizes)
    available, source = None, "--max-bytes"
    if size <= preflight.MAX_BYTES_CEILING:
        available, source = preflight.read_available_memory(backend, gpu_indices)
    return preflight.judge_buffer_memory(
        plan.ops, size, DTYPE_SIZES[plan.dtype], nranks, local_ranks, plan.check, available, source
    )


def _gates(options: dict[str, Any]) -> tuple[Optional[float], bool, bool]:
    """The bandwidth gates asked for (--min-busbw, --baseline, --expect busbw_min_gbps), as
    limits.one_rank_gate_refusal takes them."""
    expectations = options.get("expectations")
    return (
        options["min_busbw"],
        options["baseline_rows"] is not None,
        bool(expectations is not None and expectations.busbw_min_gbps),
    )


def _environment(facts: Any, rank_env: dict[str, Any], backend: str, nproc: int) -> dict[str, Any]:
    from ddpdoctor.bench.preflight import visible_gpus

    env: dict[str, Any] = {
        "host": socket.gethostname(),
        "backend": backend,
        "python": sys.version.split()[0],  # the ranks run this same interpreter
        "world_size": nproc,
        "torch": facts.torch_version,
        "torch_cuda": facts.torch_cuda,
        "nccl": None,
        "driver": next((g.driver for g in facts.gpus if g.driver), None),
        "gpus": [g.name for g in visible_gpus(facts)][:nproc] if backend == "nccl" else [],
        "cuda_visible_devices": facts.visible.raw,
        "launcher": "ddpdoctor",
    }
    env.update({k: v for k, v in rank_env.items() if v not in (None, [], "") and k != "devices"})
    if not isinstance(env.get("world_size"), int) or env["world_size"] < 1:
        del env["world_size"]  # refused before any rank was planned: there is no world to describe
    return env


def _expected(
    decision: Any, facts: Any, world_size: int, ceiling: Any = None
) -> tuple[Optional[dict[str, Any]], Optional[str]]:
    """Expected all_reduce busbw for the GPUs of this run (NCCL, one node); at one rank, the local
    copy's algbw range instead (no interconnect)."""
    if decision.backend != "nccl" or world_size < 1:
        return None, None
    if world_size == 1:
        from ddpdoctor.bench.expected import expected_single_gpu

        one = expected_single_gpu(ceiling.gbps if ceiling is not None else None)
        return (one.to_dict(), "one GPU") if one is not None else (None, None)
    from ddpdoctor.bench.expected import (
        expected_busbw,
        nvlink_interconnect,
        parse_nvlink_speeds,
        pcie_interconnect,
    )
    from ddpdoctor.bench.preflight import NVIDIA_SMI_NVLINK, visible_gpus
    from ddpdoctor.edge.runner import run_argv

    gpus = visible_gpus(facts)[:world_size]
    nvlink = run_argv(NVIDIA_SMI_NVLINK.argv, NVIDIA_SMI_NVLINK.timeout_s)
    ic = None
    if nvlink.ok:
        ic = nvlink_interconnect(parse_nvlink_speeds(nvlink.stdout), [g.index for g in gpus])
    if ic is None and gpus:
        slowest = min(gpus, key=lambda g: (g.pcie_gen or 0) * (g.pcie_width or 0))
        ic = pcie_interconnect(slowest.pcie_gen, slowest.pcie_width, slowest.name)
    if ic is None:
        return None, None
    rng = expected_busbw(ic)
    return (rng.to_dict() if rng else None), ic.label


def _report(
    options: dict[str, Any],
    plan: Any,
    result: Any,
    env: dict[str, Any],
    expected: Optional[dict[str, Any]],
    interconnect: Optional[str],
    show: bool,
    ceiling: Any = None,
) -> int:
    from ddpdoctor.bench.limits import flag_implausible, implausible_note, plausible, world_size_one_heading
    from ddpdoctor.bench.results import (
        compare_baseline,
        exit_code_for,
        judge_baseline,
        judge_correctness,
        judge_min_busbw,
        summarize,
        summarize_scopes,
        world_rows,
    )
    from ddpdoctor.render.bench import render_bench_header, render_bench_results, render_launch_failure

    # An algbw above the GPU memory bandwidth is no measurement: flagged, and left out of every peak
    # and gate below.
    rows = flag_implausible(result.rows, ceiling)
    notes = list(options.get("notes", ()))
    one_rank = result.world_size == 1
    if one_rank:
        notes.append(world_size_one_heading(result.backend))
    flagged = implausible_note(rows, ceiling)
    if flagged:
        notes.append(flagged)
    # Bandwidth verdicts judge the whole-world run; intra-/inter-node rows (ranks spanning nodes) are
    # reported beside it, and a wrong element in any of them is still a failure.
    summaries = summarize(rows, plan.ops, bandwidth=not one_rank)
    scope_summaries = summarize_scopes(rows, plan.ops)
    verdicts = []
    correctness = judge_correctness(rows) if plan.check else None
    if correctness is not None:  # None: nothing was measured, so nothing is claimed correct
        verdicts.append(correctness)
    if options["min_busbw"] is not None and result.ok:
        verdicts.append(judge_min_busbw(summaries, options["min_busbw"]))
    ratios = []
    if options["baseline_rows"] is not None and result.ok:
        ratios = compare_baseline(rows, options["baseline_rows"], plan.ops, options["baseline_tolerance"])
        verdicts.append(judge_baseline(ratios, options["baseline_tolerance"]))
    launch_failed = not result.ok and not result.interrupted
    code = exit_code_for(verdicts, launch_failed, result.interrupted, result.interrupted_by)
    expect_findings = []
    if options.get("expectations") is not None and result.ok:
        from ddpdoctor.ci.expect import judge_bench
        from ddpdoctor.core.model import Severity

        expect_findings = judge_bench(options["expectations"], plausible(world_rows(rows)))
        if code == 0 and any(f.severity == Severity.FAIL for f in expect_findings):
            code = int(ExitCode.FAILED)
    if launch_failed and result.root_cause is not None and result.root_cause.rank == -1:
        code = int(ExitCode.INCONCLUSIVE)  # the ranks never started: no verdict on the interconnect
    config = {
        "backend": result.backend,
        "world_size": result.world_size,
        "ops": list(plan.ops),
        "sizes": list(plan.sizes),
        "dtype": plan.dtype,
        "iters": plan.iters,
        "warmup": plan.warmup,
        "check": plan.check,
        "timing": "graph" if plan.graph and result.backend == "nccl" else "eager",
        "memory_bandwidth": ceiling.to_dict() if ceiling is not None else None,
        "timeout_s": options["timeout"],
    }
    if show:
        to_stdout = options["json_file"] == "-" or options["csv_file"] == "-"
        if not to_stdout and options.get("format", "table") == "table":
            render_bench_header(env, config, options.get("fallback"))
            render_bench_results(
                rows, plan.ops, summaries, scope_summaries, expected, interconnect, ratios, verdicts
            )
            if expect_findings:
                from ddpdoctor.render.formats import render_findings_text

                emit(render_findings_text(expect_findings))
        if not result.ok:
            render_launch_failure(result)
        if result.interrupted_by == "SIGTERM":
            say(
                "terminated by SIGTERM (kill, scancel or a Slurm time limit): every rank was stopped; "
                f"{len(rows)} row(s) measured so far are reported",
                err=True,
            )
        written = bench_output.write_outputs(
            options,
            rows=rows,
            env=env,
            config=config,
            summaries=summaries,
            scope_summaries=scope_summaries,
            verdicts=verdicts,
            launch=result.to_dict(),
            refusals=[],
            code=code,
            expected=expected,
            ratios=ratios,
            extra=expect_findings,
            notes=notes,
        )
        if not written and code == 0:
            code = int(ExitCode.FAILED)  # the results are lost: a CI step must not read this as a pass
    return code
