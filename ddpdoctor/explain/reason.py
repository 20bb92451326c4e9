"""Reasoning: recognised events -> one root cause, its consequences, and notes. Pure: no I/O.

Order of preference for the root cause (docs/explain.md explains why):
  1. root-role signatures: hardware/kernel first (precedence 0: OOM kill, Xid, ECC, fabric), then the rest
     (precedence 1), earliest by timestamp where lines carry one, else by input order and line;
  2. a desync or op mismatch derived from watchdog timeouts (SeqNum/OpType/NumelIn across ranks);
  3. generic NCCL WARN lines (precedence 2): the earliest WARN explains a later 'unhandled system error';
  4. an all-ranks-stuck hang derived from watchdog timeouts (same SeqNum everywhere);
  5. symptoms (timeouts, generic NCCL errors, connection resets), then consequences (ChildFailedError).
"""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any, Iterable

from ddpdoctor.core.model import ExitCode, Severity
from ddpdoctor.explain.diagnosis import Diagnosis, Occurrence
from ddpdoctor.explain.kb import DiagnosisSpec, KnowledgeBase
from ddpdoctor.explain.nextlog import MPIRUN_SUMMARY, suggest_next_logs
from ddpdoctor.explain.normalize import RAY_WORKER_PREFIX, rank_from_filename
from ddpdoctor.explain.scan import Event, InputStats, ScanResult, SummaryEntry
from ddpdoctor.parsers.numbers import parse_int
from ddpdoctor.parsers.pytraceback import raising_package

EXPLAIN_SCHEMA = "ddpdoctor.explain/1"
LEAD_NOTE = (
    "a lead, not a confirmed cause: no root-cause message is in these logs; this is the best-supported "
    "error that is not a consequence of another failure"
)
_ROLE_ORDER = {"root": 0, "symptom": 3, "consequence": 4, "hint": 5, "context": 6}
# Lines that only say something failed (a traceback, nccl-tests' 'Test failure'): kept so that a failed run
# whose message the knowledge base does not know is never reported as "nothing found" (exit 0).
UNRECOGNISED = "failure.unrecognised"
TITLE_VALUE_CAP = 160  # characters of a captured message a headline quotes
_WATCHDOG_SIGS = ("watchdog.timeout", "watchdog.blocking_wait")
_OOM_SIGS = ("oom.kernel", "oom.slurm", "dataloader.worker_killed")
# Lines printed by the launcher or the kernel about another process: the file they are in says nothing
# about their rank.
_OTHER_PROCESS_SIGS = frozenset(
    {
        "oom.kernel",
        "oom.slurm",
        "launch.sigkill",
        "launch.sigsegv",
        "launch.sigterm_siblings",
        "launch.child_failed",
    }
)


@dataclass
class Explanation:
    inputs: list[InputStats]
    root: Diagnosis | None
    consequences: list[Diagnosis]
    notes: list[Diagnosis]
    next_logs: list[str] = field(default_factory=list)  # where to look when no cause was found
    # With no root cause: the best-supported lead (a symptom or a lead hint, never a consequence), shown by
    # default and marked as a lead, not a cause.
    lead: Diagnosis | None = None

    @property
    def empty(self) -> bool:
        """Every input was empty (0 bytes, e.g. `< /dev/null`): nothing was explained, which must not
        read as "nothing recognised" in a log somebody looked at."""
        return bool(self.inputs) and all(s.bytes == 0 for s in self.inputs)

    @property
    def exit_code(self) -> ExitCode:
        # A failure seen only through its consequences is still a failure (exit 1), with no cause named.
        if self.root is not None and self.root.severity >= Severity.WARN:
            return ExitCode.FAILED
        if any(d.severity >= Severity.WARN for d in self.consequences):
            return ExitCode.FAILED
        # A lead the knowledge base rates warn or worse (an injected NCCL_GRAPH_FILE) is shown as the
        # explanation of the failure: exit 0 would say the opposite.
        if self.lead is not None and self.lead.severity >= Severity.WARN:
            return ExitCode.FAILED
        if self.empty:
            return ExitCode.INCONCLUSIVE
        return ExitCode.HEALTHY

    def to_dict(self, show_all: bool = False) -> dict[str, Any]:
        from ddpdoctor import __version__

        return {
            "schema": EXPLAIN_SCHEMA,
            "tool": {"name": "ddpdoctor", "version": __version__},
            "exit_code": int(self.exit_code),
            "empty_input": self.empty,
            "inputs": [
                {
                    "name": s.name,
                    "bytes": s.bytes,
                    "lines": s.lines,
                    "long_lines": s.long_lines,
                    "windows_capped": s.windows_capped,
                    "error": s.error,
                }
                for s in self.inputs
            ],
            "root_cause": self.root.to_dict(show_all) if self.root else None,
            "no_cause_found": (
                {"summary": "no cause found in these logs", "fetch_next": self.next_logs}
                if self.root is None and self.next_logs
                else None
            ),
            "lead": (
                {**self.lead.to_dict(show_all), "kind": "lead", "note": LEAD_NOTE} if self.lead is not None else None
            ),
            "consequences": [d.to_dict(show_all) for d in self.consequences],
            "notes": [d.to_dict(show_all) for d in self.notes] if show_all else [],
        }


# ---------------------------------------------------------------------- attribution
@dataclass
class _PidInfo:
    rank: int | None = None
    local_rank: int | None = None
    host: str | None = None
    nranks: int = -1  # size of the communicator the rank came from (the largest is the world)


def _pid_map(events: Iterable[Event], summary: Iterable[SummaryEntry]) -> dict[int, _PidInfo]:
    pids: dict[int, _PidInfo] = defaultdict(_PidInfo)
    for ev in events:
        if ev.pid is None:
            continue
        info = pids[ev.pid]
        if ev.sig == "context.nccl_comm_init":
            nranks = parse_int(ev.fields.get("nranks"), -1)
            if nranks > info.nranks:
                info.rank, info.nranks = parse_int(ev.fields["comm_rank"]), nranks
        elif ev.local_rank is not None and info.local_rank is None:
            info.local_rank = ev.local_rank
        if ev.host and not info.host:
            info.host = ev.host
    for entry in summary:
        if entry.pid is None:
            continue
        info = pids[entry.pid]
        if entry.rank is not None:
            info.rank, info.nranks = entry.rank, max(info.nranks, 1 << 30)
        if entry.local_rank is not None:
            info.local_rank = entry.local_rank
        info.host = entry.host or info.host
    return dict(pids)


def _attribute(ev: Event, pids: dict[int, _PidInfo], file_ranks: dict[int, int | None]) -> None:
    """Fill rank/local_rank/host from the pid map and the file name where the line itself is silent."""
    if ev.pid is not None and ev.pid in pids:
        info = pids[ev.pid]
        if ev.rank is None and info.rank is not None:
            ev.rank = info.rank
        if ev.local_rank is None:
            ev.local_rank = info.local_rank
        ev.host = ev.host or info.host
    if ev.sig == "oom.slurm" and ev.rank is None:
        ev.rank = parse_int(ev.fields.get("task"))
    if ev.sig == "store.unique_id_timeout" and ev.rank is None:
        # ProcessGroupNCCL names the rank that waited: "[7] is setting up NCCL communicator ...".
        ev.rank = parse_int(ev.fields.get("waiting"))
    if ev.rank is None and ev.local_rank is None and ev.sig not in _OTHER_PROCESS_SIGS:
        ev.rank = file_ranks.get(ev.file_index)


def _ts_key(ts: float | None) -> tuple[int, float]:
    return (1, 0.0) if ts is None else (0, ts)


def _event_key(ev: Event) -> tuple[Any, ...]:
    return (*_ts_key(ev.ts), ev.file_index, ev.line)


def _occurrence(ev: Event) -> Occurrence:
    return Occurrence(ev.file, ev.line, ev.text, ev.rank, ev.local_rank, ev.host)


# ---------------------------------------------------------------------- per-signature diagnoses
def _diagnoses(kb: KnowledgeBase, events: list[Event], counts: dict[str, int]) -> dict[str, Diagnosis]:
    by_sig: dict[str, list[Event]] = defaultdict(list)
    for ev in events:
        by_sig[ev.sig].append(ev)
    out: dict[str, Diagnosis] = {}
    for sig_id, evs in by_sig.items():
        sig = kb.by_id[sig_id]
        evs.sort(key=_event_key)
        first = evs[0]
        # Evidence: the first line of each rank, first rank first, then the rest in time/input order.
        seen: set[Any] = set()
        per_rank, rest = [], []
        for ev in evs:
            who = (ev.rank, ev.local_rank, ev.host, ev.pid, ev.file_index)
            (rest if who in seen else per_rank).append(ev)
            seen.add(who)
        out[sig_id] = Diagnosis(
            id=sig.id,
            title=_fill(sig.title, first, cap=TITLE_VALUE_CAP),
            severity=sig.severity,
            role=sig.role,
            component=sig.component,
            cause=_cause(_fill(sig.cause, first), first),
            fix=_fill(sig.fix, first),
            references=list(sig.references),
            first=_occurrence(first),
            evidence=[_occurrence(e) for e in per_rank + rest],
            count=counts.get(sig_id, len(evs)),
            ranks=sorted({e.rank for e in evs if e.rank is not None}),
            local_ranks=sorted({e.local_rank for e in evs if e.local_rank is not None and e.rank is None}),
            hosts=sorted({e.host for e in evs if e.host}),
            data=_merge_fields(evs),
            sort_key=(_ROLE_ORDER[sig.role], sig.precedence, *_event_key(first)),
        )
    return out


def _fill(text: str, first: Event, cap: int = 0) -> str:
    """A signature's text with `{field}` replaced by what its pattern captured on the first line (the rank that
    waited, the rank it waited for, the exception's own message); a field the line lacks stays as written.
    `cap`: longest value put in (a headline quotes a message, it does not carry a 400-character one)."""
    if "{" not in text:
        return text
    for key, value in first.fields.items():
        value = value.strip()
        if cap and len(value) > cap:
            value = value[: cap - 1].rstrip() + "…"
        text = text.replace("{" + key + "}", value)
    return text


def _version_mismatch(kb: KnowledgeBase, events: list[Event]) -> Diagnosis | None:
    """NCCL's own 'NCCL version' lines naming different releases from different processes: the nodes run
    different NCCL builds. One process printing two versions (two runs in one file) is not counted."""
    by_process: dict[tuple[Any, ...], tuple[str, Event]] = {}
    for ev in sorted((e for e in events if e.sig == "context.nccl_version"), key=_event_key):
        who = (ev.rank, ev.host, ev.pid, ev.file_index)
        if (ev.rank, ev.host, ev.pid) == (None, None, None):
            continue  # a line no process can be told from (a bare traceback): it may be another run's
        by_process.setdefault(who, (ev.fields["nccl_version"], ev))
    versions: dict[str, Event] = {}
    for version, ev in by_process.values():
        versions.setdefault(version, ev)
    spec = kb.diagnoses.get("nccl.version_mismatch")
    if len(versions) < 2 or spec is None:
        return None
    shown = list(versions.values())
    desc = "; ".join(
        f"{v} ({'rank ' + str(e.rank) if e.rank is not None else e.host or 'pid ' + str(e.pid)})"
        for v, e in versions.items()
    )
    d = _cross_rank_diagnosis(
        spec, "NCCL (versions across ranks)", shown[0], shown, sorted({e.rank for e in shown if e.rank is not None}),
        f"The processes in these logs loaded different NCCL releases: {desc}.", {"nccl_versions": sorted(versions)},
    )
    d.role, d.derived, d.sort_key = "root", False, (0, 0, *_event_key(shown[0]))
    return d


# Timeouts a rank reports when another rank does not come: the store wait and gloo's. (The watchdog's reports
# with a progress bar glued on are _watchdog_diagnosis's busy straggler.)
_WAIT_TIMEOUTS = frozenset({
    "store.socket_timeout", "store.barrier_timeout", "store.unique_id_timeout", "store.workers_join_timeout",
    "gloo.timeout", "gloo.store_wait_timeout",
})
_DEFAULT_TIMEOUT_S = 1800  # init_process_group's default timeout (and transformers' ddp_timeout)
_CUT_FAILURES = frozenset({"failure.unrecognised", "python.exception"})
_LONG_WORK_S = 300.0  # with the timeout unknown, a step this long beside a timeout is what it waited for


def _seconds(clock: str) -> float:
    """'29:58' / '1:02:03' -> seconds."""
    total = 0.0
    for part in clock.split(":"):
        total = total * 60 + float(part)
    return total


def _timeout_text(ev: Event) -> tuple[str, float | None]:
    """The timeout a timeout line states ('1800000ms', 'timeout=0:30:00', 'Timeout(ms)=600000'), as text and s."""
    found = re.search(r"(?:after|Timeout\(ms\)=|timeout=)\s*(\d+)\s*ms\b", ev.text) or re.search(
        r"\b(\d{4,})\s*(?:ms|milliseconds)\b", ev.text)
    if found:
        ms = int(found.group(1))
        return f"{ms / 1000:.0f} s", ms / 1000.0
    clock = re.search(r"timeout=(\d+:\d{2}:\d{2})", ev.text)
    if clock:
        return clock.group(1), _seconds(clock.group(1))
    return "the collective timeout", None


_BAR = re.compile(r"(?:(?P<desc>[A-Za-z][^|\r\n\]]{0,100}?):?\s{0,4})?(?P<pct>\d{1,3})%\|")


def _outlasted_timeout(kb: KnowledgeBase, events: list[Event]) -> Diagnosis | None:
    """A store or gloo timeout line with an unfinished progress bar glued in front of it (same stream, no newline:
    scan.py's busy_bar) that had run about as long as the timeout: a rank was busy with its own work (tokenizing
    a dataset on the main process) while the others waited for it, and the timeout fired first. The timeout is
    the consequence; that work is the cause. (The watchdog's form is _watchdog_diagnosis's busy straggler.)"""
    spec = kb.diagnoses.get("timeout.outlasted_by_local_work")
    timeouts = sorted((e for e in events if e.sig in _WAIT_TIMEOUTS), key=_event_key)
    busy = [e for e in timeouts if e.fields.get("busy_bar")]
    if spec is None:
        return None
    default_window = False
    if not busy:
        # No timeout line, but a traceback glued to an unfinished bar that ran just past the default timeout
        # of a process group (30 minutes): the timeout message itself was cut from the paste (spent set 13,
        # e03: 'Running tokenizer on dataset: 47%|... [30:09<33:25, ...]Traceback').
        busy = [e for e in events if e.fields.get("busy_bar") and e.sig in _CUT_FAILURES
                and _DEFAULT_TIMEOUT_S <= parse_int(e.fields.get("busy_elapsed_s"), 0) < _DEFAULT_TIMEOUT_S + 120]
        default_window = True
    if not busy:
        return None
    ev = busy[0]
    bar = _BAR.search(ev.fields["busy_bar"])
    if bar is None or int(bar.group("pct")) >= 100:
        return None
    elapsed = float(parse_int(ev.fields.get("busy_elapsed_s"), 0))
    said, timeout_s = next(((t, v) for t, v in map(_timeout_text, [ev, *timeouts]) if v is not None),
                           ("the collective timeout", None))
    if default_window:
        said, timeout_s = "30 minutes (torch's default; the timeout line is not in the log)", float(_DEFAULT_TIMEOUT_S)
    if elapsed < (0.5 * timeout_s if timeout_s else _LONG_WORK_S):
        return None
    minutes, seconds = divmod(int(elapsed), 60)
    fields = {"desc": (bar.group("desc") or "a step with a progress bar").strip(), "pct": bar.group("pct"), "elapsed": f"{minutes}:{seconds:02d}",
              "timeout": said}
    cause = spec.cause
    for key, value in fields.items():
        cause = cause.replace("{" + key + "}", value)
    return Diagnosis(
        id=spec.id, title=spec.title, severity=spec.severity, role="root", component="the training script",
        cause=cause, fix=spec.fix, references=list(spec.references), first=_occurrence(ev),
        evidence=[_occurrence(e) for e in [ev, *[t for t in timeouts if t is not ev][:2]]], count=1,
        ranks=[ev.rank] if ev.rank is not None else [],
        reasoning=(
            f"{fields['desc']} was at {fields['pct']}% after {fields['elapsed']} (the progress bar printed in front "
            f"of {ev.file}:{ev.line}) when the timeout of {said} fired: the timeout is the consequence of that "
            "step's length."
        ),
        data=fields, sort_key=(0, 0, *_event_key(ev)),
    )


# NCCL's back-trace (`bootstrap.cc:NNN -> 2`) says where a failed call went; the WARN line printed before it says
# why. The trail is read only when no NCCL line of the log says more (a log pasted from the trail on:
# huggingface/accelerate#2107; with the WARN, a port scanner's connection to the bootstrap port,
# NVIDIA/nccl#1612, is the WARN's symptom, not a network that cannot connect).
_TRAIL = "nccl.bootstrap_error_trail"


def _trail_without_warn(diags: list[Diagnosis]) -> list[Diagnosis]:
    if any(d.id != _TRAIL and d.id.startswith(("nccl.", "catalogue.")) for d in diags):
        return [d for d in diags if d.id != _TRAIL]
    return diags


def _semlock_no_space(kb: KnowledgeBase, events: list[Event], diags: list[Diagnosis]) -> list[Diagnosis]:
    """'[Errno 28] No space left on device' from a traceback that was creating a multiprocessing semaphore
    (the SemLock frame) is /dev/shm being full: the generic exception becomes that diagnosis."""
    spec = kb.diagnoses.get("shm.semlock_no_space")
    frames = [e for e in events if e.sig == "context.semlock"]
    exc = next((d for d in diags if d.id == "python.exception"), None)
    if spec is None or not frames or exc is None or exc.first is None:
        return diags
    if "No space left on device" not in exc.first.text and "Errno 28" not in exc.first.text:
        return diags
    shm = _refined(
        spec, exc, "Python multiprocessing / /dev/shm", [exc.first, _occurrence(frames[0])],
        f"The exception at {exc.first.file}:{exc.first.line} ({exc.first.text.strip()[:80]}) was raised while "
        f"creating a multiprocessing semaphore ({frames[0].file}:{frames[0].line}); semaphores live in /dev/shm.",
    )
    return [shm if d is exc else d for d in diags]


def _refined(spec: DiagnosisSpec, found: Diagnosis, component: str, evidence: list[Occurrence],
             reasoning: str) -> Diagnosis:
    """The derived diagnosis `spec` names, in place of the signature's `found`: its occurrences (first line,
    count, ranks, hosts, order) kept, its text the spec's."""
    return Diagnosis(
        id=spec.id, title=spec.title, severity=spec.severity, role="root", component=component,
        cause=spec.cause, fix=spec.fix, references=list(spec.references), first=found.first,
        evidence=evidence, count=found.count, ranks=found.ranks, hosts=found.hosts, reasoning=reasoning,
        sort_key=found.sort_key,
    )


_RAY_WORKER = re.compile(r"^\s*" + RAY_WORKER_PREFIX)


def _ordinal_in_ray_worker(kb: KnowledgeBase, diags: list[Diagnosis]) -> list[Diagnosis]:
    """An invalid device ordinal printed by a Ray worker (its `(Name pid=N)` prefix): Ray narrows
    CUDA_VISIBLE_DEVICES per worker, so the usual 'more processes than GPUs' is not it — a physical GPU id
    used inside the renumbered view is."""
    spec = kb.diagnoses.get("device.ordinal_renumbered")
    ordinal = next((d for d in diags if d.id == "device.invalid_ordinal"), None)
    if spec is None or ordinal is None or ordinal.first is None or not _RAY_WORKER.match(ordinal.first.text):
        return diags
    renumbered = _refined(
        spec, ordinal, "CUDA / Ray worker", ordinal.evidence,
        f"'invalid device ordinal' at {ordinal.first.file}:{ordinal.first.line} is printed by a Ray worker (the "
        "line's `(Name pid=N)` prefix); Ray gives each worker its GPUs through CUDA_VISIBLE_DEVICES.",
    )
    return [renumbered if d is ordinal else d for d in diags]


def _raised_in_library(kb: KnowledgeBase, diags: list[Diagnosis]) -> list[Diagnosis]:
    """The generic exception, raised inside an installed package (the traceback's last frame is in
    site-packages): not 'a bug in your training code' but what that package refused, or a bug of its release."""
    spec = kb.diagnoses.get("python.library_exception")
    exc = next((d for d in diags if d.id == "python.exception"), None)
    if spec is None or exc is None or "frame_file" not in exc.data:
        return diags
    found = raising_package(exc.data["frame_file"])
    if found is None or found[0] == "python":
        exc.reasoning = exc.reasoning or (
            f"{exc.title}, raised at {exc.data['frame_file']}:{exc.data.get('frame_line', '?')}, in "
            f"{exc.data.get('frame_func', '?')} (the traceback's last frame)."
        )
        return diags
    package, version = found
    message = exc.data.get("message", "").strip()
    if len(message) > TITLE_VALUE_CAP:
        message = message[: TITLE_VALUE_CAP - 1].rstrip() + "…"
    values = {
        **exc.data, "message": message, "package": package, "version": f" {version}" if version else "",
        "frame": f"{exc.data['frame_file']}:{exc.data.get('frame_line', '?')}, in {exc.data.get('frame_func', '?')}",
    }
    def fill(text: str) -> str:
        for key, value in values.items():
            text = text.replace("{" + key + "}", value)
        return text
    lib = Diagnosis(
        id=spec.id, title=fill(spec.title), severity=exc.severity, role="root",
        component=package, cause=fill(spec.cause), fix=fill(spec.fix), references=list(spec.references),
        first=exc.first, evidence=exc.evidence, count=exc.count, ranks=exc.ranks, local_ranks=exc.local_ranks,
        hosts=exc.hosts, data=values, sort_key=exc.sort_key,
        reasoning=(
            f"The exception's last traceback frame is {values['frame']}, a file of the installed package "
            f"{package}{values['version']}, not of the training script."
        ),
    )
    # The same line also states its own refusal ("X is not supported", "Either ... or ..."): the package that
    # raised it is the better root (a release's bug or a setup it refuses), and the stated words go first.
    stated = next((d for d in diags if d.id == "message.stated_cause" and d.first is not None
                   and d.first.file == exc.first.file and d.first.line == exc.first.line), None) if exc.first else None
    if stated is not None and stated.first is not None:
        words = str(stated.data.get("stated", "")).strip()
        if words:
            lib.cause = f"The message states it: \"{words[:240]}\". {lib.cause}"
        lib.sort_key = min(lib.sort_key, stated.sort_key)
    return [lib if d is exc else d for d in diags if d is not stated]


def _cause(cause: str, first: Event) -> str:
    """The signature's cause, with where NCCL prints the quoted WARN (from the catalogue), or where PyTorch, gloo,
    NCCL or CUDA prints the quoted message (from the source catalogue), when known."""
    f = first.fields
    if f.get("stated"):
        cause = f"The message states it: \"{f['stated'].strip()}\". {cause}"
    if "nccl_source" in f:
        cause += (
            f" NCCL prints this message from {f['nccl_source']} (releases {f['nccl_releases']}, "
            f"format \"{f['nccl_format']}\")."
        )
    if "catalogue_source" in f:
        name = f"{f['catalogue_name']}: " if "catalogue_name" in f else ""
        cause += (
            f" The message is printed by {f['catalogue_source']} (releases {f['catalogue_releases']}): "
            f"{name}\"{f['catalogue_message'][:300]}\"."
        )
    return cause


def _merge_fields(evs: list[Event]) -> dict[str, Any]:
    """The first event's named fields (exit codes, SeqNum, pids...), as recorded."""
    return dict(evs[0].fields) if evs else {}


# ---------------------------------------------------------------------- watchdog analysis
def _seq_op(seq: int, op: str, sep: str) -> str:
    """'SeqNum 7<sep>ALLREDUCE', or 'SeqNum 7' when the line named no OpType (PyTorch >= 2.6's "Timeout at NCCL
    work: N")."""
    return f"SeqNum {seq}{sep}{op}" if op else f"SeqNum {seq}"


def _rank_list(text: str) -> list[int]:
    return sorted({int(x) for x in text.replace(" ", "").split(",") if x.isdigit()})


def _desync_report(kb: KnowledgeBase, events: list[Event]) -> Diagnosis | None:
    """PyTorch's own desync report (TORCH_NCCL_DESYNC_DEBUG): ranks that finished collective #N but never
    joined #N+1, or never joined any, are the stragglers; it outranks our comparison of timeouts."""
    reports = sorted((e for e in events if e.sig == "watchdog.desync_report"), key=_event_key)
    lagging: set[int] = set()
    stuck: set[int] = set()
    for ev in reports:
        lagging.update(_rank_list(ev.fields.get("lagging", "") + "," + ev.fields.get("missing", "")))
        stuck.update(_rank_list(ev.fields.get("stuck", "")))
    if not lagging:
        return None
    suspects = sorted(lagging)
    shown = [e for e in reports if "lagging" in e.fields or "missing" in e.fields]
    spec = kb.diagnoses["watchdog.straggler"]
    first = shown[0]
    reasoning = (
        f"PyTorch's desync report says rank(s) {', '.join(map(str, suspects))} "
        + (
            f"finished collective #{first.fields['seq']} but never joined #{first.fields['next_seq']}"
            if "next_seq" in first.fields
            else "never joined any collective"
        )
        + (f", while rank(s) {', '.join(map(str, sorted(stuck)))} waited inside it" if stuck else "")
        + ": the code was not in step on every rank, so this is not a network hang."
    )
    return _cross_rank_diagnosis(
        spec,
        "ProcessGroupNCCL desync report (cross-rank)",
        first,
        shown,
        suspects,
        reasoning,
        {"lagging_ranks": suspects, "waiting_ranks": sorted(stuck)},
    )


def _cross_rank_diagnosis(
    spec: DiagnosisSpec,
    component: str,
    first: Event,
    evidence: list[Event],
    suspects: list[int],
    reasoning: str,
    data: dict[str, Any],
) -> Diagnosis:
    """A diagnosis derived by comparing ranks (not matched on one line): the watchdog analyses' verdict."""
    return Diagnosis(
        id=spec.id,
        title=spec.title,
        severity=spec.severity,
        role="derived",
        component=component,
        cause=spec.cause,
        fix=spec.fix,
        references=list(spec.references),
        first=_occurrence(first),
        evidence=[_occurrence(e) for e in evidence],
        count=len(evidence),
        ranks=suspects,
        derived=True,
        reasoning=reasoning,
        data=data,
        sort_key=(1, 1, *_event_key(first)),
    )


def _busy_reports(first_by_rank: dict[int, Event]) -> list[Event]:
    """Timeout reports glued to (or printed right after) a progress bar whose elapsed time is at least half
    the timeout: the last bar a process printed before the timeout can be one update (tens of seconds to
    minutes) short of it, and a bar that had run for half the timeout is no side show."""
    out = []
    for ev in first_by_rank.values():
        busy, timeout_ms = ev.fields.get("busy_elapsed_s"), ev.fields.get("timeout_ms")
        if busy and timeout_ms and int(busy) * 1000 >= 0.5 * int(timeout_ms):
            out.append(ev)
    return sorted(out, key=_event_key)


_EARLY_SEQ = 10  # a default group's first collectives: DDP's constructor, the first barriers


def _rank0_work(
    events: list[Event], ranks: list[int], seq: int, numel: dict[int, Any], world_size: int | None = None
) -> str | None:
    """What says that rank 0, which reported no watchdog timeout while the others did at one of the job's
    first collectives, was busy with work of its own: an unfinished progress bar the timeout reports cut off
    (YOLOv5's label scan on rank 0), or a one-element all-reduce (`dist.barrier()` under NCCL) that the others
    entered after earlier collectives had completed, while rank 0 had not (ColBERT's rank-0 k-means). Spent
    explain sets 13 and 14 (d05, d01, d07): the timeout is the consequence, rank 0's own step the cause. Also, at
    any SeqNum, when every rank but rank 0 reported it (1..N-1 of N): rank 0 alone was elsewhere (set 15's g01,
    a checkpoint after the last step). None when any of it is missing."""
    if 0 in ranks:
        return None
    last = max(_event_key(e) for e in events if e.rank in ranks and e.sig in _WATCHDOG_SIGS)
    # Only a bar cut off mid-draw: a finished line of a bar (tqdm writing to a file) may be minutes old.
    bars = [e for e in events if e.fields.get("open_bar") and _event_key(e) <= last]
    if bars and seq <= _EARLY_SEQ:
        bar = bars[-1].fields["open_bar"].strip()
        return f"an unfinished progress bar (`{bar[:120]}`) was cut off by the timeout reports ({bars[-1].file}:{bars[-1].line})"
    if len(ranks) >= 2 and ranks == list(range(1, ranks[-1] + 1)) and (world_size in (None, ranks[-1] + 1)):
        # Every rank but rank 0 reported the same collective (torchtune's end-of-epoch checkpoint on rank 0,
        # spent set 15's g01): rank 0 alone was elsewhere, whatever the SeqNum.
        when = "early in the job" if seq <= _EARLY_SEQ else f"after {seq - 1} collectives had completed"
        return (f"every rank but rank 0 (ranks 1-{ranks[-1]}) reported it, {when}: rank 0 alone was elsewhere — "
                "in work only rank 0 does at that point (saving a checkpoint, evaluating, writing logs or samples)")
    if seq > _EARLY_SEQ:
        return None
    # Without a bar, only after the group's first collective: SeqNum 1 is where NCCL connects the ranks, and a
    # transport that hangs there (a driver breaking P2P: spent set 13's e02) looks the same from one rank.
    sizes = {v for v in numel.values() if v is not None}
    if seq >= 2 and sizes and all(parse_int(v, 2) <= 1 for v in sizes):
        return (f"the collective is a one-element all-reduce (NumelIn=1: how dist.barrier() runs under NCCL), after "
                f"{seq - 1} collective(s) of the same group had completed, so the ranks could reach each other")
    return None


def _watchdog_diagnosis(
    kb: KnowledgeBase, events: list[Event], known_ranks: set[int], world_size: int | None
) -> Diagnosis | None:
    """Compare watchdog timeouts across ranks: SeqNum differs -> desync; OpType/NumelIn differs -> op
    mismatch; all equal -> a hang only when every rank of the job reported it; ranks missing -> stragglers;
    one rank's view -> unconfirmed (not a root cause)."""
    report = _desync_report(kb, events)
    if report is not None:
        return report
    groups: dict[str, dict[int, Event]] = defaultdict(dict)
    for ev in sorted((e for e in events if e.sig in _WATCHDOG_SIGS and "seq" in e.fields), key=_event_key):
        # A SeqNum no int64 holds (a 5000-digit one) is a mangled line: not compared across ranks.
        if ev.rank is None or parse_int(ev.fields["seq"], signed=True) is None:
            continue
        sub = ev.pg_rank is not None and ev.pg_rank != ev.rank
        key = f"subgroup/{ev.fields.get('timeout_ms')}" if sub else "default"
        groups[key].setdefault(ev.rank, ev)
    if not groups:
        return None
    # The default group if it has reports, else the largest.
    name = "default" if "default" in groups else max(groups, key=lambda k: len(groups[k]))
    first_by_rank = groups[name]
    ranks = sorted(first_by_rank)
    seq = {r: parse_int(first_by_rank[r].fields["seq"], 0, signed=True) for r in ranks}
    # The newer watchdog line ("Timeout at NCCL work: N") names no OpType.
    op = {r: first_by_rank[r].fields.get("optype", "") for r in ranks}
    numel = {r: first_by_rank[r].fields.get("numel_in") for r in ranks}
    data: dict[str, Any] = {
        "seq_by_rank": {str(r): seq[r] for r in ranks},
        "optype_by_rank": {str(r): op[r] for r in ranks if op[r]},
        "numel_in_by_rank": {str(r): numel[r] for r in ranks if numel[r] is not None},
    }

    def odd_ones(values: dict[int, Any], lowest_wins: bool) -> list[int]:
        common = Counter(values.values()).most_common()
        if len(common) > 1 and common[0][1] > common[1][1]:
            majority = common[0][0]
            return [r for r in ranks if values[r] != majority]
        if lowest_wins:
            low = min(values.values())
            return [r for r in ranks if values[r] == low]
        return ranks

    def fmt(rs: list[int]) -> str:
        return ", ".join(str(r) for r in rs)

    if len(set(seq.values())) > 1:
        spec = kb.diagnoses["watchdog.desync"]
        suspects = odd_ones(seq, lowest_wins=True)
        parts = [f"rank {r}: {_seq_op(seq[r], op[r], ' ')}" for r in ranks]
        reasoning = (
            f"The watchdog timeouts are at different collectives ({'; '.join(parts)}): "
            f"rank(s) {fmt(suspects)} diverged from the others, so the ranks were not executing the same code path."
        )
    elif len({v for v in op.values() if v}) > 1 or len({v for v in numel.values() if v is not None}) > 1:
        spec = kb.diagnoses["watchdog.op_mismatch"]
        key = {r: (op[r], numel[r]) for r in ranks}
        suspects = odd_ones(key, lowest_wins=False)
        parts = [f"rank {r}: {op[r]} NumelIn={numel[r]}" for r in ranks]
        reasoning = (
            f"All ranks timed out at SeqNum {seq[ranks[0]]} but with different collectives ({'; '.join(parts)}): "
            f"rank(s) {fmt(suspects)} issued a different operation or size."
        )
    elif busy := _busy_reports(first_by_rank):
        # The timeout line itself shows a progress bar that had been running for about the whole timeout:
        # the process printing it was busy outside the collective while the others waited in it.
        spec = kb.diagnoses["watchdog.straggler"]
        ev = busy[0]
        suspects = []
        reasoning = (
            f"Rank(s) {fmt(ranks)} timed out in the same collective ({_seq_op(seq[ranks[0]], op[ranks[0]], ', ')}) "
            f"after {parse_int(ev.fields['timeout_ms'], 0) // 1000} s, but the timeout line of rank {ev.rank} shares its "
            f"text with (or follows) a progress bar that had been running for {parse_int(ev.fields['busy_elapsed_s'], 0)} s "
            f"({ev.fields['busy_bar'].strip()}): the process printing it (usually rank 0) was still busy outside "
            "the collective (data preparation, tokenisation) while the others waited. Not a network hang: do "
            "that work before init_process_group, or raise the timeout."
        )
    elif (work := _rank0_work(events, ranks, seq[ranks[0]], numel, world_size)) is not None:
        spec = kb.diagnoses["watchdog.rank0_work"]
        suspects = [0]
        data["rank0_evidence"] = work
        reasoning = (
            f"Rank(s) {fmt(ranks)} timed out in the same collective ({_seq_op(seq[ranks[0]], op[ranks[0]], ', ')}) "
            f"and rank 0 reported no timeout: it was not in that collective. {work[0].upper() + work[1:]}: rank 0 "
            "was still busy with work of its own while the others waited for it longer than the timeout. Not a "
            "network hang."
        )
    else:
        missing = sorted(known_ranks - set(ranks))
        seen = set(ranks) | set(missing)
        # "Every rank" means ranks 0 to world size - 1 (or, with no world size in the logs, 0 to the
        # highest rank seen: rank 3 reporting proves ranks 1 and 2 exist). A gap is a rank that left no
        # line here, not one that was in step.
        expected = range(world_size) if world_size else range(max(seen) + 1 if seen else 0)
        absent = [r for r in expected if r not in seen] if len(expected) <= 1_000_000 else []
        unseen = bool(absent) or len(expected) > len(seen)
        same = (
            f"Rank(s) {fmt(ranks)} timed out in the same collective ({_seq_op(seq[ranks[0]], op[ranks[0]], ', ')})"
        )
        if missing:
            spec = kb.diagnoses["watchdog.straggler"]
            suspects = missing
            reasoning = (
                f"{same}, but rank(s) {fmt(missing)} never reported a timeout: they were not in that collective "
                "(slow, stuck in other code, or dead), so the code was not in step on every rank. Look there first."
            )
        elif len(ranks) < 2 or unseen:
            spec = kb.diagnoses["watchdog.unconfirmed"]
            suspects = []
            of = f" of {world_size}" if world_size else ""
            shown = fmt(absent[:10]) + (f" and {len(absent) - 10} more" if len(absent) > 10 else "")
            gap = f" (rank(s) {shown} left no line here)" if absent else ""
            reasoning = (
                f"{same}; only {len(ranks)}{of} rank(s) are in these logs{gap}, so whether the others were in it "
                "(a network or GPU hang) or elsewhere (a straggler) cannot be told."
            )
            if absent:
                data["ranks_absent"] = absent[:1000]
        else:
            spec = kb.diagnoses["watchdog.hang"]
            suspects = []
            reasoning = (
                f"{same} and no rank of the job is missing: the code is in sync and the collective itself did "
                "not complete."
            )
    evidence_events = sorted(first_by_rank.values(), key=lambda e: (e.rank not in suspects, _event_key(e)))
    # First occurrence: the suspect's own report when it has one, else the earliest report.
    first = min(first_by_rank.values(), key=lambda e: (e.rank not in suspects, _event_key(e)))
    return _cross_rank_diagnosis(
        spec, "ProcessGroupNCCL watchdog (cross-rank)", first, evidence_events, suspects, reasoning, data
    )


# ---------------------------------------------------------------------- root cause
def _root_reasoning(root: Diagnosis, others: list[Diagnosis], summary: list[SummaryEntry]) -> str:
    where = ""
    if root.ranks:
        where = f" on rank {', '.join(map(str, root.ranks[:8]))}"
    elif root.local_ranks:
        where = f" on local rank {', '.join(map(str, root.local_ranks[:8]))}"
    if root.hosts:
        where += f" (host {', '.join(root.hosts[:4])})"
    first = f" first at {root.first.file}:{root.first.line}" if root.first else ""
    text = f"{root.title}{where},{first}."
    if root.id in _OOM_SIGS or root.id == "launch.sigkill":
        killed = [e for e in summary if e.exitcode == -9]
        if killed:
            e = killed[0]
            text += (
                f" torchrun's failure summary lists rank {e.rank} (pid {e.pid}) with exit code -9 (SIGKILL)."
            )
    later = [d.id for d in others if d.role in ("symptom", "consequence") or d.derived]
    if later:
        text += f" The other errors ({', '.join(later[:8])}) are what the remaining ranks and the launcher report after it."
    return text


_WEAK_DERIVED = ("watchdog.hang", "watchdog.unconfirmed")


def _choose_root(
    diags: list[Diagnosis], derived: Diagnosis | None, launch: Diagnosis | None = None
) -> Diagnosis | None:
    tiers: list[list[Diagnosis]] = [
        [d for d in diags if d.role == "root" and d.severity >= Severity.WARN and d.sort_key[1] <= 1],
        ([derived] if derived is not None and derived.id not in _WEAK_DERIVED else [])
        + ([launch] if launch is not None and launch.severity >= Severity.WARN else []),
        [d for d in diags if d.role == "root" and d.severity >= Severity.WARN],
        [derived] if derived is not None and derived.id == "watchdog.hang" else [],
        # Symptoms and consequences are never the root cause: with nothing better, no cause is named and
        # suggest_next_logs says where the cause would be.
    ]
    for tier in tiers:
        if tier:
            return min(tier, key=lambda d: d.sort_key)
    return None


# A warning that is harmless on its own but explains a failure of one kind when that failure follows: the
# warning's id -> the root-cause ids (or id prefixes ending in '.') it explains. Only failures to reach a
# peer: a timeout has many other causes, and on one host the loopback address works.
_HAZARD_EXPLAINS: dict[str, tuple[str, ...]] = {
    "gloo.loopback_fallback": (
        "gloo.connect_refused",
        "gloo.connection_closed",
        "gloo.read_error",
        "gloo.loopback_peer",
        "gloo.full_mesh",
        "catalogue.c10d.network",
    ),
    # A kernel reading another GPU's memory without peer access faults with an illegal address.
    "caffe2.cross_gpu_op": ("catalogue.cuda.kernel_fault",),
}


def _hazard_root(root: Diagnosis | None, diags: list[Diagnosis]) -> Diagnosis | None:
    """The warning printed before a failure it explains is the cause; the failure is what it leads to."""
    if root is None:
        return None
    for hazard_id, explained in _HAZARD_EXPLAINS.items():
        hazard = next((d for d in diags if d.id == hazard_id), None)
        if hazard is None or root.id == hazard_id:
            continue
        if not any(root.id == e or (e.endswith(".") and root.id.startswith(e)) for e in explained):
            continue
        hazard.role = "root"
        hazard.severity = Severity.FAIL
        where = f" (first at {hazard.first.file}:{hazard.first.line})" if hazard.first else ""
        hazard.reasoning = (
            f"{hazard.title}{where}; the failure that followed ({root.id}: {root.title.lower()}) is what that "
            "leads to, so it is reported as a consequence."
        )
        return hazard
    return root


def explain(kb: KnowledgeBase, scan: ScanResult) -> Explanation:
    """The root cause, its consequences and notes for one scan of one or more logs."""
    events = list(scan.events)
    pids = _pid_map(events, scan.summary)
    file_ranks = {i: rank_from_filename(s.name) for i, s in enumerate(scan.inputs)}
    for ev in events:
        _attribute(ev, pids, file_ranks)
    known_ranks = {e.rank for e in events if e.rank is not None}
    known_ranks |= {r for r in file_ranks.values() if r is not None}
    known_ranks |= {e.rank for e in scan.summary if e.rank is not None}
    reportable = [e for e in events if kb.by_id[e.sig].role != "context"]
    diags = list(_diagnoses(kb, reportable, scan.counts).values())
    if any(d.id != UNRECOGNISED and d.role not in ("hint", "context") for d in diags):
        # A traceback or test failure is only worth listing when nothing else says the run failed.
        diags = [d for d in diags if d.id != UNRECOGNISED]
    world = max(
        (int(e.fields.get("nranks", 0)) for e in events if e.sig == "context.nccl_comm_init"), default=0
    )
    diags = _trail_without_warn(diags)
    diags = _semlock_no_space(kb, events, diags)
    diags = _ordinal_in_ray_worker(kb, diags)
    diags = _raised_in_library(kb, diags)
    mismatch = _version_mismatch(kb, events)
    if mismatch is not None:
        diags.append(mismatch)
    outlasted = _outlasted_timeout(kb, events)
    if outlasted is not None:
        diags.append(outlasted)
    derived = _watchdog_diagnosis(kb, reportable, known_ranks, world or None)
    launch = _lightning_ranks(kb, events, scan.inputs)
    root = _hazard_root(_choose_root(diags, derived, launch), diags)
    _enrich_kill(root, diags, scan.summary, pids)
    _rank_from_summary(root, scan.summary)
    rest = [d for d in diags if d is not root]
    if derived is not None and derived is not root:
        rest.append(derived)
    if launch is not None and launch is not root and launch.severity >= Severity.WARN:
        rest.append(launch)
    rest.sort(key=lambda d: d.sort_key)
    consequences = [d for d in rest if d.severity >= Severity.WARN and d.role != "hint"]
    notes = [d for d in rest if d not in consequences]
    if root is not None and not root.reasoning:
        root.reasoning = _root_reasoning(root, consequences, scan.summary)
    elif root is not None and consequences:
        root.reasoning += f" Later errors: {', '.join(d.id for d in consequences[:8])}."
    next_logs = [] if root is not None or not consequences else suggest_next_logs(consequences, scan.summary)
    lead = None if root is not None else _choose_lead(kb, consequences, notes)
    if root is None and (lead is None or not _is_kb_lead(kb, lead)):
        # A P2P setup followed by silence or a timeout says more than the timeout itself.
        lead = _p2p_suspect(kb, events, diags, scan.inputs) or lead
    if root is None and lead is None and launch is not None:
        lead = launch
    if root is None and lead is None and not consequences:
        lead = _nccl_tests_hang(kb, events, scan.inputs) or _nccl_init_hang(kb, events, scan.inputs)
    if root is None and lead is None:
        lead = _summary_lead(kb, scan.summary, scan.inputs)
    if root is None and lead is None:
        lead = _mpirun_lead(kb, events, diags)
    if lead is not None:
        lead.reasoning = lead.reasoning or _lead_reasoning(lead, consequences)
        if lead.id in _TIMEOUT_LEADS and all(d.id in _TIMEOUT_LEADS for d in consequences):
            _only_a_timeout(lead, next_logs)
    return Explanation(
        inputs=scan.inputs, root=root, consequences=consequences, notes=notes, next_logs=next_logs, lead=lead
    )


def _choose_lead(kb: KnowledgeBase, consequences: list[Diagnosis], notes: list[Diagnosis]) -> Diagnosis | None:
    """With no root cause: a hint the knowledge base marks as a lead, else the first symptom or cross-rank
    finding. Consequences (launcher wrappers, SIGTERM to siblings, restarts, lost Ray actors) never lead:
    they say that something failed elsewhere, not what."""
    hints = [d for d in notes if d.role == "hint" and (sig := kb.by_id.get(d.id)) is not None and sig.lead]
    if hints:
        return min(hints, key=lambda d: d.sort_key)
    symptoms = [d for d in consequences if d.role == "symptom" or d.derived]
    return min(symptoms, key=lambda d: d.sort_key) if symptoms else None


_TIMEOUT_LEADS = frozenset({*_WATCHDOG_SIGS, "watchdog.unconfirmed", "watchdog.hang", "gloo.timeout"})


def _is_kb_lead(kb: KnowledgeBase, d: Diagnosis) -> bool:
    sig = kb.by_id.get(d.id)
    return sig is not None and sig.lead


def _only_a_timeout(lead: Diagnosis, next_logs: list[str]) -> None:
    """The only evidence is a timeout: a rank's report that it waited, never why. Say that first, and what
    to collect, so the timeout is not read as the cause."""
    # Keep an acronym's case ("NCCL watchdog"), lower an ordinary first word.
    title = lead.title if lead.title[1:2].isupper() else f"{lead.title[:1].lower()}{lead.title[1:]}"
    lead.title = f"Cause not in this log: only a timeout was seen ({title})"
    collect = "; ".join(next_logs) if next_logs else "every rank's log"
    absent = ""
    if lead.ranks and 0 not in lead.ranks:
        # The rank that runs main-process-only work (evaluation, saving, tokenising) is rank 0; here only
        # other ranks report waiting, so rank 0 is the first to look at, not a confirmed straggler.
        absent = (
            f" Only rank(s) {', '.join(map(str, lead.ranks))} report the timeout; rank 0 reports none here, so "
            "it may be the rank that lagged (main-process-only work such as evaluation, saving or dataset "
            "preprocessing running longer than the timeout while the others waited): read rank 0's log for "
            "what it was doing at that time."
        )
    lead.reasoning = (
        "Cause not in this log. The only failure here is a collective timeout, which a rank reports after "
        "something else went wrong (another rank failed, lagged or took another code path; a network, GPU "
        f"or software hang). {lead.reasoning}{absent} Collect: {collect}."
    )


def _lightning_ranks(
    kb: KnowledgeBase, events: list[Event], inputs: list[InputStats] | None = None
) -> Diagnosis | None:
    """Lightning's 'Initializing distributed: GLOBAL_RANK: N, MEMBER: N+1/W' lines (one per process): the same
    rank twice while other ranks never appear -> the launcher started the wrong processes (root); some ranks
    only, nothing after -> the others never started (a lead at most: their output may be in another log);
    every rank, and the log ends on those lines -> the job hung in its first collective (a lead at most)."""
    starts = sorted((e for e in events if e.sig == "context.lightning_rank" and e.rank is not None), key=_event_key)
    if not starts:
        return None
    world = max(parse_int(e.fields.get("world"), 0) for e in starts)
    per_rank: Counter[int] = Counter(e.rank for e in starts if e.rank is not None)
    seen = sorted(per_rank)

    def span(rs: list[int]) -> str:
        return f"{rs[0]}-{rs[-1]}" if len(rs) > 2 and rs[-1] - rs[0] == len(rs) - 1 else ", ".join(map(str, rs))

    if world and len(seen) >= world:
        # Every rank started (a repeated full set is a restart, not a misconfiguration). Only a log that ends
        # on these lines is a hang sign: start lines followed by training output are an ordinary run.
        last = max(starts, key=lambda e: (e.file_index, e.line))
        if inputs is None or last.file_index >= len(inputs) or last.line < inputs[last.file_index].lines:
            return None
        reasoning = (
            f"All {world} rank(s) ({span(seen)}) printed Lightning's start line and the log ends there, with no "
            "error: the launcher and the world size agree, and the job then stopped in its first collective."
        )
        diag = _cross_rank_diagnosis(
            kb.diagnoses["launch.init_hang"], "launcher / PyTorch Lightning (cross-rank)", starts[0], starts, [],
            reasoning, {"ranks_seen": seen, "world_size": world},
        )
        diag.ranks = seen
        return diag
    if not world:
        return None
    dups = sorted(r for r, n in per_rank.items() if n > 1)

    if dups:
        spec = kb.diagnoses["launch.duplicate_rank"]
        shown = [e for e in starts if e.rank in dups]
        reasoning = (
            f"Global rank(s) {span(dups)} printed Lightning's start line {max(per_rank.values())} times each, and "
            f"only rank(s) {span(seen)} of {world} appeared: two processes took the same rank, so the launcher's "
            "task count per node and the Trainer's devices/num_nodes disagree."
        )
        data: dict[str, Any] = {"duplicate_ranks": dups, "ranks_seen": seen, "world_size": world}
    else:
        spec = kb.diagnoses["launch.ranks_missing"]
        shown = starts
        reasoning = (
            f"Only rank(s) {span(seen)} of {world} printed Lightning's start line: if this is the whole job's "
            "output, the other ranks were never started (on SLURM: the script run without srun, or fewer tasks "
            "than Trainer expects); if other nodes log elsewhere, read those logs."
        )
        data = {"ranks_seen": seen, "world_size": world}
    diag = _cross_rank_diagnosis(spec, "launcher / PyTorch Lightning (cross-rank)", shown[0], shown, dups, reasoning, data)
    diag.ranks = dups or seen
    return diag


def _p2p_suspect(
    kb: KnowledgeBase, events: list[Event], diags: list[Diagnosis], inputs: list[InputStats]
) -> Diagnosis | None:
    """NCCL connected GPUs over P2P and then nothing completed (no 'Init COMPLETE') or a collective timed
    out: the P2P path is the first thing to rule out (NCCL_P2P_DISABLE=1)."""
    p2p = sorted((e for e in events if e.sig == "context.nccl_p2p"), key=_event_key)
    if not p2p:
        return None
    timed_out = [d.id for d in diags if d.id in _TIMEOUT_LEADS]
    init_complete = any(e.sig == "context.nccl_comm_init" for e in events)
    last = max(p2p, key=lambda e: (e.file_index, e.line))
    # Without a timeout, only a log that ends on the P2P setup is a hang sign: P2P lines followed by
    # training output are an ordinary NCCL_DEBUG=INFO run. Repeats of a P2P line are counted, not matched
    # (presence_only): the scan keeps the last line one was seen on.
    last_line = max(last.line, inputs[last.file_index].last_lines.get("context.nccl_p2p", 0)) if (
        last.file_index < len(inputs)) else last.line
    ends_there = last.file_index < len(inputs) and last_line >= inputs[last.file_index].lines - 1
    if not timed_out and (init_complete or not ends_there):
        return None
    kinds = sorted({e.fields.get("p2p", "?") for e in p2p})
    after = (
        f"then a timeout ({', '.join(timed_out)})"
        if timed_out
        else "and the log ends there: no rank printed 'Init COMPLETE' and no error followed (a hang)"
    )
    reasoning = (
        f"NCCL connected GPUs through P2P/{'/'.join(kinds)} ({len(p2p)} such line(s) shown, first at "
        f"{p2p[0].file}:{p2p[0].line}), {after}. A P2P path that does not deliver data hangs the first collective "
        "without an error; NCCL_P2P_DISABLE=1 tells it apart."
    )
    diag = _cross_rank_diagnosis(
        kb.diagnoses["nccl.p2p_suspect"], "NCCL P2P transport (cross-event)", p2p[0], p2p[:8], [], reasoning,
        {"p2p_transports": kinds, "init_complete": init_complete, "timeouts": timed_out},
    )
    diag.ranks = sorted({e.rank for e in p2p if e.rank is not None})
    return diag


# Lines NCCL and the framework may print after 'Init COMPLETE' before the first collective (init timings,
# launch mode, a framework's "initialized" line) that still leave the log ending at init.
_INIT_TAIL_LINES = 5


def _nccl_init_hang(kb: KnowledgeBase, events: list[Event], inputs: list[InputStats]) -> Diagnosis | None:
    """NCCL printed 'Init COMPLETE' and the log ends within a few lines, with nothing failing: the job hung in
    (or before) its first collective. Only the end of a log says so: init followed by training is a run."""
    inits = sorted((e for e in events if e.sig == "context.nccl_comm_init"), key=_event_key)
    if not inits:
        return None
    last = max(inits, key=lambda e: (e.file_index, e.line))
    if last.file_index >= len(inputs) or inputs[last.file_index].lines - last.line > _INIT_TAIL_LINES:
        return None
    nranks = max(parse_int(e.fields.get("nranks"), 0) for e in inits)
    done = sorted({parse_int(e.fields.get("comm_rank"), -1) for e in inits} - {-1})
    missing = f"; only {len(done)} of {nranks} ranks printed it" if nranks and len(done) < nranks else ""
    reasoning = (
        f"NCCL printed 'Init COMPLETE' ({len(inits)} line(s), first at {inits[0].file}:{inits[0].line}) and the "
        f"log ends {inputs[last.file_index].lines - last.line} line(s) later with no error{missing}: the job "
        "stopped in or before its first collective."
    )
    diag = _cross_rank_diagnosis(
        kb.diagnoses["nccl.init_hang"], "NCCL (cross-event)", inits[0], inits[:8], [], reasoning,
        {"nranks": nranks, "ranks_init_complete": done},
    )
    diag.ranks = sorted({e.rank for e in inits if e.rank is not None})
    return diag


def _nccl_tests_hang(kb: KnowledgeBase, events: list[Event], inputs: list[InputStats]) -> Diagnosis | None:
    """nccl-tests' results header is among the last lines of a log with no result row and no error after
    it: the first collective never returned. A header followed by rows (or by more output) is a run. Headers
    are presence-only context: past a few identical ones the rest are counted, not recorded, so the last of
    many runs in one log is not seen (no lead rather than a wrong one)."""
    heads = [e for e in events if e.sig == "context.nccl_tests_header"]
    spec = kb.diagnoses.get("nccl_tests.hang")
    if not heads or spec is None:
        return None
    last = max(heads, key=lambda e: (e.file_index, e.line))
    if last.file_index >= len(inputs) or inputs[last.file_index].lines - last.line > _HEADER_TAIL_LINES:
        return None
    reasoning = (
        f"nccl-tests printed its results header at {last.file}:{last.line} and the log ends "
        f"{inputs[last.file_index].lines - last.line} line(s) later with no result row and no error: the first "
        "collective never completed."
    )
    return _cross_rank_diagnosis(spec, "nccl-tests (cross-event)", last, [last], [], reasoning, {})


# The header and the separator/blank lines nccl-tests prints under it.
_HEADER_TAIL_LINES = 3


def _summary_lead(kb: KnowledgeBase, summary: list[SummaryEntry], inputs: list[InputStats]) -> Diagnosis | None:
    """torchrun's failure summary is all there is: its earliest 'Root Cause (first observed failure)' entry
    names the rank, host and exit code whose own output holds the cause. Several agents (nodes, restarts)
    each print a block; the first in time, not the first in the log, failed first."""
    roots = [e for e in summary if e.root and (e.rank is not None or e.pid is not None)]
    if not roots:
        return None
    first = min(roots, key=lambda e: (e.ts is None, e.ts or 0.0))
    who = f"rank {first.rank}" if first.rank is not None else f"pid {first.pid}"
    if first.local_rank is not None:
        who += f" (local rank {first.local_rank})"
    where = f" on {first.host}" if first.host else ""
    code = "" if first.exitcode is None else f" with exit code {first.exitcode}"
    name = inputs[first.file_index].name if first.file_index < len(inputs) else "?"
    text = f"Root Cause (first observed failure): {who}{where}{code}"
    occ = Occurrence(name, first.line, text, first.rank, first.local_rank, first.host)
    spec = kb.diagnoses["launch.first_failure"]
    blocks = len(roots)
    reasoning = (
        f"torchrun's summary names {who}{where} as the first failure{code}"
        + (f" (the earliest of {blocks} summary blocks)" if blocks > 1 else "")
        + "; that rank's own error is not in these logs, so the cause is in its output."
    )
    data: dict[str, Any] = {"rank": first.rank, "local_rank": first.local_rank, "host": first.host,
                            "exitcode": first.exitcode, "pid": first.pid}
    return Diagnosis(
        id=spec.id, title=spec.title, severity=spec.severity, role="derived", component="torchrun failure summary",
        cause=spec.cause, fix=spec.fix, references=list(spec.references), first=occ, evidence=[occ], count=blocks,
        ranks=[first.rank] if first.rank is not None else [], hosts=[first.host] if first.host else [],
        derived=True, reasoning=reasoning, data=data, sort_key=(1, 1, first.file_index, first.line),
    )


def _mpirun_lead(kb: KnowledgeBase, events: list[Event], diags: list[Diagnosis]) -> Diagnosis | None:
    """mpirun's summary is all there is: a process failed and its error went to its own output. orterun's
    'Process name: [[job,1],R]' names the rank when the log has it."""
    summary = next(
        (
            d
            for d in diags
            if d.id == UNRECOGNISED and str(d.data.get("what", "")).startswith(MPIRUN_SUMMARY) and d.first
        ),
        None,
    )
    if summary is None or summary.first is None:
        return None
    named = sorted((e for e in events if e.sig == "context.mpirun_process"), key=_event_key)
    rank = parse_int(named[0].fields.get("mpi_rank"), -1) if named else -1
    who = f"rank {rank}" if rank >= 0 else "one process (the log does not name it)"
    spec = kb.diagnoses["launch.mpirun_failure"]
    return Diagnosis(
        id=spec.id,
        title=spec.title,
        severity=spec.severity,
        role="derived",
        component="mpirun summary",
        cause=spec.cause,
        fix=spec.fix,
        references=list(spec.references),
        first=summary.first,
        evidence=summary.evidence[:3],
        count=summary.count,
        ranks=[rank] if rank >= 0 else [],
        derived=True,
        reasoning=f"mpirun's summary says {who} exited non-zero first; its own error is not in these logs.",
        data={"mpi_rank": rank if rank >= 0 else None},
        sort_key=summary.sort_key,
    )


def _lead_reasoning(lead: Diagnosis, consequences: list[Diagnosis]) -> str:
    others = [d.id for d in consequences if d is not lead]
    text = f"No root-cause message in these logs; {lead.title.lower()} is the best-supported lead"
    if lead.first is not None:
        text += f" (first at {lead.first.file}:{lead.first.line})"
    text += "."
    if others:
        text += f" Also seen: {', '.join(others[:8])}."
    return text


def _rank_from_summary(root: Diagnosis | None, summary: list[SummaryEntry]) -> None:
    """A root cause whose lines name no rank: torchrun's 'Root Cause (first observed failure)' entry does."""
    if root is None or root.ranks or root.local_ranks:
        return
    first = next((e for e in summary if e.root and e.rank is not None), None)
    if first is not None:
        root.ranks = [first.rank]  # type: ignore[list-item]
        root.data["rank_from"] = "torchrun's failure summary: Root Cause (first observed failure)"
        if first.host and not root.hosts:
            root.hosts = [first.host]


def _enrich_kill(
    root: Diagnosis | None, diags: list[Diagnosis], summary: list[SummaryEntry], pids: dict[int, _PidInfo]
) -> None:
    """An OOM kill with no rank on its line: take the rank torchrun reported as killed (exit code -9)."""
    if root is None or root.id not in _OOM_SIGS or root.ranks:
        return
    killed_ranks = sorted({e.rank for e in summary if e.exitcode == -9 and e.rank is not None})
    if not killed_ranks:
        sigkill = next((d for d in diags if d.id == "launch.sigkill"), None)
        if sigkill is not None:
            killed_ranks = sigkill.ranks
            if not killed_ranks and sigkill.local_ranks:
                root.local_ranks = sigkill.local_ranks
    if killed_ranks:
        root.ranks = killed_ranks
        root.data["rank_from"] = "torchrun reported these ranks killed by SIGKILL (exit code -9)"
