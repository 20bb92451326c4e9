"""What to read next when the logs hold no cause: pure, from what the logs did show.

A launcher wrapper (ChildFailedError, SIGTERM to siblings), a generic NCCL error or a timeout seen from one
rank is a consequence; printing it as the root cause sends people to the wrong place. When nothing better
is found, explain says "no cause found in these logs" and names the log that would hold the cause.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterable

if TYPE_CHECKING:
    from ddpdoctor.explain.diagnosis import Diagnosis
    from ddpdoctor.explain.scan import SummaryEntry

_SIGNALS = {-6: "SIGABRT", -7: "SIGBUS", -9: "SIGKILL", -11: "SIGSEGV", -15: "SIGTERM"}
# OpenMPI's orterun summary lines (help-orterun.txt), as failure.unrecognised records them: a process failed,
# and its error went to its own output.
MPIRUN_SUMMARY = ("Primary job", "detected that one or more processes", "noticed that process rank")
_NCCL_GENERIC = ("nccl.system_error", "nccl.internal_error", "nccl.remote_error", "nccl.unhandled_cuda")


def suggest_next_logs(seen: Iterable[Diagnosis], summary: Iterable[SummaryEntry]) -> list[str]:
    """The logs (or reruns) most likely to hold the cause, most useful first."""
    seen = list(seen)
    ids = {d.id for d in seen}
    out: list[str] = []
    # Several agents (nodes, restarts) each print a summary block: the first failure in time is the cause.
    roots = [e for e in summary if e.root]
    for entry in sorted(roots, key=lambda e: (e.ts is None, e.ts or 0.0))[:1]:
        who = f"rank {entry.rank}" if entry.rank is not None else f"pid {entry.pid}"
        host = f" on {entry.host}" if entry.host else ""
        if entry.exitcode == -15:
            out.append(
                f"the scheduler's record of the job (`sacct -j JOB`, Kubernetes events): torchrun says {who}{host} "
                "got SIGTERM from outside (time limit, preemption, node drain, or a launcher stopping it)"
            )
        elif entry.exitcode is not None and entry.exitcode < 0:
            sig = _SIGNALS.get(entry.exitcode, f"signal {-entry.exitcode}")
            out.append(
                f"the kernel log of {entry.host or 'that host'} (`dmesg -T`, `journalctl -k`) around the "
                f"failure: torchrun says {who} was killed by {sig}"
            )
        else:
            out.append(
                f"{who}'s own output{host}: torchrun printed only its summary (keep per-rank logs with "
                "`torchrun --log-dir DIR --tee 3`, and decorate main with @record to get the traceback)"
            )
    if ids & set(_NCCL_GENERIC):
        out.append(
            "a rerun with NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET,ENV: the NCCL WARN line printed before "
            "'unhandled system error' / 'internal error' names the cause"
        )
    if ids & {"watchdog.unconfirmed", "watchdog.timeout", "watchdog.blocking_wait"}:
        out.append(
            "every rank's log (only some ranks are here), or a rerun with TORCH_NCCL_DESYNC_DEBUG=1 / "
            "TORCH_NCCL_TRACE_BUFFER_SIZE=2000 so PyTorch names the lagging rank"
        )
    if any(str(d.data.get("what", "")).startswith(MPIRUN_SUMMARY) for d in seen if d.id == "failure.unrecognised"):
        out.append(
            "the output of the process mpirun says exited first (its 'Process name: [[job,1],R]' is rank R): mpirun "
            "printed only its summary; keep every rank's output with `mpirun --tag-output` or "
            "`--output-filename DIR`"
        )
    if ids & {"launch.sigterm_siblings", "launch.child_failed", "launch.spawn_raised"} and not out:
        out.append("the log of the rank that failed first (torchrun's 'Root Cause' entry names it)")
    if "launch.sigabrt" in ids:
        out.append(
            "the lines just before the abort in that process's output: the watchdog timeout or the C++ "
            "exception ('terminate called after throwing ...', its what()) that made it abort"
        )
    if "watchdog.teardown" in ids and not ids & {"watchdog.timeout", "watchdog.unconfirmed"}:
        # The teardown banner without the error that triggered it: the log was cut just below the cause.
        out.append(
            "the lines above 'Some NCCL operations have failed or timed out' on every rank (the watchdog "
            "timeout or NCCL error it follows), and a rerun with NCCL_DEBUG=INFO: on several nodes its "
            "'NET/IB' or 'NET/Socket' lines say which transport crossed the nodes (try NCCL_IB_DISABLE=1 if "
            "IB is chosen where no working IB path exists)"
        )
    if "failure.unrecognised" in ids:
        out.append(
            "the full output around the first traceback or test failure listed (its message is not in the "
            "knowledge base), and a rerun with NCCL_DEBUG=INFO TORCH_DISTRIBUTED_DEBUG=DETAIL"
        )
    if not out:
        out.append("every rank's log and each host's kernel log (`dmesg -T`)")
    return out
