"""Human output of `ddpdoctor bench-nccl`: nccl-tests' table, peak/average busbw, verdicts, failures.

The table keeps nccl-tests' column order and layout, so that the output reads like (and parses as)
an `*_perf` run: `ddpdoctor parse nccl-tests` reads it back. When the ranks of a torchrun/srun job
span nodes there is one set of tables per scope: the whole world, each node's intra-node run, then
the inter-node run (one rank per node).
"""

from __future__ import annotations

import re
from typing import Any, Iterable, Mapping, Optional, Sequence

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from ddpdoctor.core.model import Finding
from ddpdoctor.render import console, err_console

HEADER = (
    "#       size         count      type   redop    root     time   algbw   busbw  #wrong",
    "#        (B)    (elements)                               (us)  (GB/s)  (GB/s)        ",
)


def format_time_us(us: Optional[float]) -> str:
    """A time in microseconds as the bench-nccl table prints it (nccl-tests' precision)."""
    if us is None:
        return "N/A"
    # nccl-tests' precision: fewer decimals as the number grows.
    if us >= 10000:
        return f"{us:.0f}"
    if us >= 100:
        return f"{us:.1f}"
    return f"{us:.2f}"


def format_gbps(v: Optional[float]) -> str:
    """A bandwidth in GB/s as the bench-nccl table prints it."""
    return "N/A" if v is None else f"{v:.2f}"


def format_row(r: Mapping[str, Any]) -> str:
    wrong = r.get("wrong")
    return (
        f"{r.get('size', 0):>12} {r.get('count', 0):>13} {r.get('type', ''):>9} {r.get('redop', ''):>7} "
        f"{r.get('root', -1):>7} {format_time_us(r.get('time_us')):>8} {format_gbps(r.get('algbw')):>7} "
        f"{format_gbps(r.get('busbw')):>7} {('N/A' if wrong is None else wrong):>7}"
    )


# Above the time column, as nccl-tests labels its two groups of columns.
_PLACE_LABEL = "#" + " " * 57


def bench_table_lines(rows: Sequence[Mapping[str, Any]], ops: Sequence[str]) -> list[str]:
    """nccl-tests' table per op; an in-place op and an op timed eagerly although a CUDA graph was asked
    for say so above their header, an implausible row says so at its end."""
    from ddpdoctor.bench.timing import eager_fallbacks

    lines: list[str] = []
    fallbacks = eager_fallbacks(rows)
    for op in ops:
        mine = [r for r in rows if r.get("op") == op]
        if not mine:
            continue
        lines.append(f"# Collective test: {op}")
        inplace = any(r.get("inplace") for r in mine)
        if inplace:
            lines.append(
                f"#   in place: torch's {op} writes into its input, as nccl-tests' in-place columns "
                "(torch has no out-of-place form)"
            )
        if op in fallbacks:
            lines.append(f"#   timing: eager, {fallbacks[op]}")
        if any(r.get("inplace") is not None for r in mine):
            lines.append(_PLACE_LABEL + ("in-place" if inplace else "out-of-place"))
        lines.extend(HEADER)
        for r in mine:
            line = format_row(r)
            if r.get("skipped"):
                line += f"  # skipped: {r['skipped']}"
            elif r.get("implausible") is True:
                line += "  # implausible: size / time is above the GPU memory bandwidth (no data moved)"
            lines.append(line)
        lines.append("#")
    return lines


def bench_header_lines(
    env: Mapping[str, Any], config: Mapping[str, Any], fallback: Optional[str] = None
) -> list[str]:
    """The lines above the tables: parameters (nccl-tests' `graph: 0|1` among them), versions, and at
    world size 1 the heading that says no interconnect is measured. `fallback`: why `--backend auto`
    ran gloo on CPU, said first so that nobody reads gloo figures as NCCL's."""
    from ddpdoctor.bench.limits import world_size_one_heading

    backend = str(config.get("backend"))
    if fallback:
        backend += f" on CPU, not NCCL ({fallback}: no GPU interconnect is measured)"
    lines = [
        f"# ddpdoctor bench-nccl: backend {backend}  ranks {config.get('world_size')}  "
        f"dtype {config.get('dtype')}  warmup iters: {config.get('warmup')}  iters: {config.get('iters')}  "
        f"validation: {1 if config.get('check') else 0}  graph: {1 if config.get('timing') == 'graph' else 0}"
    ]
    ceiling = config.get("memory_bandwidth")
    if isinstance(ceiling, Mapping) and ceiling.get("gbps"):
        lines.append(
            f"# GPU memory bandwidth {ceiling['gbps']:.0f} GB/s ({ceiling.get('source')}): "
            "a higher algbw is flagged implausible"
        )
    if config.get("world_size") == 1:
        lines.append(f"# == {world_size_one_heading(config.get('backend'))} ==")
    return lines


def render_bench_header(env: Mapping[str, Any], config: Mapping[str, Any], fallback: Optional[str] = None) -> None:
    out = console().out
    lines = bench_header_lines(env, config, fallback)
    out(lines[0], highlight=False)
    parts = [f"torch {env.get('torch') or '?'}"]
    if env.get("nccl"):
        parts.append(f"NCCL {env['nccl']}")
    if env.get("driver"):
        parts.append(f"driver {env['driver']}")
    if env.get("gpus"):
        parts.append("GPUs: " + ", ".join(str(g) for g in env["gpus"]))
    parts.append(f"host {env.get('host') or '?'}")
    out("# " + "; ".join(parts), highlight=False)
    for line in lines[1:]:
        out(line, highlight=False)
    out("#", highlight=False)


def render_bench_table(rows: Sequence[Mapping[str, Any]], ops: Sequence[str]) -> None:
    out = console().out
    for line in bench_table_lines(rows, ops):
        out(line, highlight=False)


def scope_heading(scope: str, node: Optional[str], nranks: Optional[int]) -> str:
    """The line above one scope's tables, e.g. `# == intra-node: node 1 (gpu-b2), 8 ranks ==`."""
    ranks = f"{nranks} ranks" if nranks is not None else "ranks"
    if scope == "world":
        what = f"whole world: {ranks}"
    elif scope == "intra-node":
        what = f"intra-node: {node or '?'}, {ranks}"
    elif scope == "inter-node":
        what = f"inter-node: one rank per node, {ranks}"
    else:
        what = f"{scope}: {node or ''} {ranks}".strip()
    return f"# == {what} =="


def summary_lines(summaries: Iterable[Any]) -> list[str]:
    """Peak and average busbw per op (nccl-tests' `# Avg bus bandwidth`)."""
    lines = []
    for s in summaries:
        if s.peak_busbw is None:
            if s.wrong is not None and s.rows:  # one rank: no busbw summarised, the check still counts
                lines.append(f"# {s.op:<15} #wrong {s.wrong}")
            continue
        wrong = "" if s.wrong is None else f"  #wrong {s.wrong}"
        lines.append(
            f"# {s.op:<15} peak busbw {s.peak_busbw:8.2f} GB/s (at {s.peak_size} B)   "
            f"avg bus bandwidth {s.avg_busbw:8.2f} GB/s{wrong}"
        )
    return lines


def render_bench_results(
    rows: Sequence[Mapping[str, Any]],
    ops: Sequence[str],
    summaries: Iterable[Any],
    scope_summaries: Sequence[Any],
    expected: Optional[Mapping[str, Any]],
    interconnect: Optional[str],
    ratios: Sequence[Any] = (),
    verdicts: Sequence[Any] = (),
) -> None:
    """The whole-world tables with their summary, then (ranks spanning nodes) one set of tables per
    intra-node and inter-node scope with its own peaks, then the verdicts."""
    from ddpdoctor.bench.results import world_rows

    out = console().out
    world = world_rows(rows)
    if scope_summaries:
        nranks = next((r["nranks"] for r in world if isinstance(r.get("nranks"), int)), None)
        out(scope_heading("world", None, nranks), highlight=False)
    render_bench_table(world, ops)
    render_bench_summary(summaries, expected, interconnect, ratios)
    for scoped in scope_summaries:
        mine = [r for r in rows if r.get("scope") == scoped.scope and r.get("node") == scoped.node]
        out("#", highlight=False)
        out(scope_heading(scoped.scope, scoped.node, scoped.nranks), highlight=False)
        render_bench_table(mine, ops)
        for line in summary_lines(scoped.ops):
            out(line, highlight=False)
    if scope_summaries and verdicts:
        out("#", highlight=False)
    render_bench_summary((), None, None, (), verdicts)


def render_bench_summary(
    summaries: Iterable[Any],
    expected: Optional[Mapping[str, Any]],
    interconnect: Optional[str],
    ratios: Sequence[Any] = (),
    verdicts: Sequence[Any] = (),
) -> None:
    out = console().out
    for line in summary_lines(summaries):
        out(line, highlight=False)
    if expected:
        out(
            f"# expected {expected.get('metric') or 'all_reduce busbw'} for {interconnect}: "
            f"{expected['low']:.0f}-{expected['high']:.0f} GB/s "
            f"at >= 1 GiB ({expected['basis']}: {expected['note']}; sources in docs/bench.md)",
            highlight=False,
        )
    if ratios:
        out("#", highlight=False)
        out("# baseline comparison (peak busbw over common sizes)", highlight=False)
        out(f"# {'op':<15} {'baseline':>10} {'now':>10} {'ratio':>7}", highlight=False)
        for r in ratios:
            if r.ratio is None:
                out(f"# {r.op:<15} {'-':>10} {'-':>10} {'-':>7}  not in baseline", highlight=False)
                continue
            flag = "  REGRESSED" if r.regressed else ""
            out(
                f"# {r.op:<15} {r.baseline_busbw:10.2f} {r.busbw:10.2f} {r.ratio:7.2f}{flag}", highlight=False
            )
    for v in verdicts:
        out(f"# {'FAIL' if v.failed else 'OK'}: {v.summary}", highlight=False)


def render_launch_failure(result: Any) -> None:
    """Root cause first, then the other ranks (consequences), then the stuck ranks' stacks."""
    out = err_console().out
    if result.interrupted:
        out("interrupted: every rank was stopped", highlight=False)
        return
    root = result.root_cause
    if result.timed_out:
        out(
            f"error: watchdog: no progress within --timeout {result.timeout_s:g}s; every rank was killed",
            highlight=False,
        )
    if root is not None:
        out(f"root cause: {root.describe()}", highlight=False)
        if root.kind == "exception" and root.traceback:
            out(_indent(root.traceback.strip().splitlines()[-12:]), highlight=False)
        if root.log_tail and root.kind in ("signal", "exit"):
            out("  last output of that rank:", highlight=False)
            out(_indent(root.log_tail.splitlines()[-10:], "    "), highlight=False)
    others = [f for f in result.failures if f is not root]
    if others:
        out("other ranks (consequences):", highlight=False)
        for f in others:
            out(f"  {f.describe()}", highlight=False)
    for f in result.failures:
        if f.kind != "stuck":
            continue
        if f.stack:
            out(f"stack of rank {f.rank} (pid {f.pid}, {f.op} {f.size} B):", highlight=False)
            out(_indent(stack_excerpt(f.stack), "    "), highlight=False)
        elif f.stack_missing:
            out(f"stack of rank {f.rank}: not dumped ({f.stack_missing})", highlight=False)


# faulthandler's header of one thread's frames (`Current thread 0x...` when the signal landed on it);
# `Stack (most recent call first):` when it dumped only the current thread.
_THREAD_HEADER = re.compile(r"^(?:Current thread|Thread) 0x[0-9a-fA-F]+ .*:$|^Stack \(most recent call first\):$")
# The frames that say a thread is the rank's own, best first: the worker's entry point, then the
# interpreter's (a thread started by `threading` begins in _bootstrap instead).
_OWN_FRAMES = (re.compile(r" in rank_main$"), re.compile(r" in (?:_run_module_as_main|<module>)$"))
OWN_STACK_LINES = 25
OTHER_THREAD_LINES = 6
OTHER_THREADS = 3


def stack_excerpt(
    stack: str,
    own_lines: int = OWN_STACK_LINES,
    other_lines: int = OTHER_THREAD_LINES,
    other_threads: int = OTHER_THREADS,
) -> list[str]:
    """The lines of a rank's faulthandler dump worth printing: the thread that runs the rank's own code
    first (up to `own_lines`), then a few lines of a few other threads.

    faulthandler lists the newest thread first and the main thread last, so a plain cut of the text
    can drop exactly the frames that say where the rank is.
    """
    threads: list[list[str]] = []
    for line in stack.strip().splitlines():
        if _THREAD_HEADER.match(line.strip()) or not threads:
            threads.append([])
        if line.strip():
            threads[-1].append(line.rstrip())
    threads = [t for t in threads if t]
    if not threads:
        return []
    own = next(
        (t for frame in _OWN_FRAMES for t in threads if any(frame.search(line) for line in t)), threads[-1]
    )
    lines = own[:own_lines]
    if len(own) > own_lines:
        lines.append(f"  ... {len(own) - own_lines} more lines")
    others = [t for t in threads if t is not own]
    for t in others[:other_threads]:
        lines.extend(t[:other_lines])
        if len(t) > other_lines:
            lines.append(f"  ... {len(t) - other_lines} more lines")
    if len(others) > other_threads:
        lines.append(f"... {len(others) - other_threads} more threads")
    return lines


def _indent(lines: Iterable[str], prefix: str = "  ") -> str:
    return "\n".join(prefix + line for line in lines)


def render_refusals(refusals: Sequence[Finding]) -> None:
    out = err_console().out
    for f in refusals:
        out(f"refused before launch: {f.title}: {f.summary}", highlight=False)
        out(f"  why: {_why(f)}", highlight=False)
        if f.fix:
            out(f"  fix: {f.fix}", highlight=False)


def render_rank_refusals(refusals: Sequence[Finding], rank: int, local_rank: int) -> None:
    """A rank started by torchrun/srun refusing before init_process_group: each node's local rank 0
    explains (why and fix), the others print one line naming it (a launcher interleaves their stderr)."""
    if local_rank == 0:
        render_refusals(refusals)
        return
    first = refusals[0]
    err_console().out(
        f"refused before launch (rank {rank}): {first.id}: {first.summary} (explained by local rank 0)",
        highlight=False,
    )


def render_rank_failure(result: Any, rank: int) -> None:
    """Why this rank failed, on its own stderr: never an empty log under a launcher."""
    own = [f for f in result.failures if f.rank == rank] or list(result.failures)
    out = err_console().out
    for f in own[:3]:
        out(f"ddpdoctor rank {rank}: {f.describe()}", highlight=False)
    if not own and result.timed_out:
        out(f"ddpdoctor rank {rank}: no progress within --timeout {result.timeout_s:g}s", highlight=False)


def _why(f: Finding) -> str:
    from ddpdoctor.core.model import all_specs

    spec = all_specs().get(f.id)
    return spec.why if spec else ""


def render_notes(notes: Iterable[str]) -> None:
    for n in notes:
        err_console().out(f"note: {n}", highlight=False)


class BenchProgress:
    """A progress bar on stderr (only on a terminal) fed by the ranks' (op, size) reports."""

    def __init__(self, total: int) -> None:
        self.total = total
        self._per_run = total
        self._progress: Optional[Progress] = None
        self._task: Any = None
        self._scopes: set[str] = set()  # intra-/inter-node runs of a multi-node job, each one more plan

    def __enter__(self) -> BenchProgress:
        con = err_console()
        if con.is_terminal:
            self._progress = Progress(
                TextColumn("{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                console=con,
                transient=True,
            )
            self._progress.start()
            self._task = self._progress.add_task("starting ranks", total=self.total)
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._progress is not None:
            self._progress.stop()

    def on_event(self, rank: int, msg: Mapping[str, Any]) -> None:
        if self._progress is None or rank != 0:
            return
        kind = msg.get("kind")
        if kind == "step":
            op, size = msg.get("op"), msg.get("size")
            # Steps without a size: init, and the waits and bookkeeping between scoped runs.
            label = "init process group" if op == "init" else (f"{op} {size} B" if size else str(op))
            self._progress.update(self._task, description=label)
        elif kind == "row":
            row = msg.get("row")
            scope = row.get("scope") if isinstance(row, Mapping) else None
            if scope and scope not in self._scopes:
                self._scopes.add(scope)
                self.total += self._per_run
                self._progress.update(self._task, total=self.total)
            self._progress.advance(self._task)
