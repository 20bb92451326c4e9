"""System: OS, CPUs, memory, cgroup limits, container, /dev/shm and ulimits."""

from __future__ import annotations

import os
import platform
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Optional

from ddpdoctor.core.engine import Area, Context
from ddpdoctor.core.model import Evidence, Finding, Severity, define
from ddpdoctor.edge.json_shape import ListOf, Maybe, Record
from ddpdoctor.edge.runner import CommandResult, define_command
from ddpdoctor.edge.sources import define_fact, fact_or_none
from ddpdoctor.parsers.df import DfEntry, find_mount, parse_df
from ddpdoctor.parsers.ulimit import Ulimits, parse_ulimit

ULIMIT_A = define_command(
    "ulimit-a", ("bash", "-c", "ulimit -a"), "Resource limits of this shell (memlock, open files)"
)
DF_SHM = define_command("df-shm", ("df", "-k", "/dev/shm"), "Size and use of the /dev/shm tmpfs")

SYSTEM_FACT = define_fact(
    "system",
    "OS, kernel, CPU count and affinity, memory, cgroup memory limit, container",
    Record(
        {
            "os": Maybe(str),
            "kernel": Maybe(str),
            "machine": Maybe(str),
            "python": Maybe(str),
            "cpu_count": Maybe(int),
            "cpu_affinity": Maybe(int),
            "mem_total_bytes": Maybe(int),
            "cgroup_memory_limit_bytes": Maybe(int),
            "container": Maybe(Record({"kinds": ListOf(str)})),
        }
    ),
)

# NCCL's shared-memory transport and DataLoader workers live in /dev/shm; Docker's default is 64 MiB.
SHM_FAIL_BYTES = 256 * 1024**2
SHM_WARN_BYTES = 1024**3
SHM_USE_WARN_PERCENT = 90
NOFILE_WARN = 4096

HOST_INFO = define("system.host", "Host", "The OS, kernel, CPUs and memory, for the record.")
CONTAINER = define(
    "system.container",
    "Container / scheduler",
    "Containers and schedulers change limits (shm, memlock, visible CPUs and GPUs) behind the user's back.",
)
CGROUP_MEMORY = define(
    "system.cgroup.memory_limit",
    "cgroup memory limit",
    "A cgroup memory limit below what the job needs ends in the OOM killer's SIGKILL, which torchrun "
    "reports only as a ChildFailedError with exitcode -9.",
    "Ask the scheduler for more memory (Slurm --mem, Kubernetes resources.limits.memory) or use fewer "
    "DataLoader workers per rank.",
)
SHM_SIZE = define(
    "system.shm.size",
    "/dev/shm size",
    "NCCL's shared-memory transport and DataLoader worker processes allocate in /dev/shm. Docker gives "
    "containers 64 MiB by default, which ends in 'unhandled system error' from NCCL or 'bus error' in "
    "DataLoader workers.",
    "Run the container with a larger /dev/shm: `docker run --shm-size=16g` (or `--ipc=host`); in Kubernetes "
    "mount an emptyDir with medium: Memory at /dev/shm.",
)
SHM_USE = define(
    "system.shm.use",
    "/dev/shm use",
    "A nearly full /dev/shm makes NCCL and DataLoader workers fail to allocate; leftovers of crashed jobs "
    "(zombie workers, stale NCCL segments) often fill it.",
    "Find leftover processes (`fuser -vm /dev/shm`) and stale files (`ls -la /dev/shm`), kill or remove them.",
)
ULIMIT_NOFILE = define(
    "system.ulimit.nofile",
    "Open-files limit",
    "DataLoader workers sharing tensors through file descriptors and NCCL/gloo sockets need many open "
    "files; a low limit ends in 'Too many open files'.",
    "Raise it: `ulimit -n 65536` in the job script, `LimitNOFILE=` for systemd services, or "
    "`docker run --ulimit nofile=65536:65536`.",
)
LIMITS_UNREADABLE = define(
    "system.limits.unreadable",
    "Limits not readable",
    "The resource limits (memlock, open files) could not be read, so those checks did not run.",
    "Run `ulimit -a` by hand and check memlock (-l) and open files (-n).",
)
SHM_UNREADABLE = define(
    "system.shm.unreadable",
    "/dev/shm not readable",
    "The size of /dev/shm could not be read, so the shared-memory check did not run.",
    "Run `df -h /dev/shm` by hand; it should be at least 1 GiB.",
)


@dataclass
class SystemFacts:
    info: Mapping[str, Any] = field(default_factory=dict)
    ulimit: Optional[CommandResult] = None
    df_shm: Optional[CommandResult] = None


def _read_text(path: str) -> Optional[str]:
    try:
        return Path(path).read_text().strip()
    except OSError:
        return None


def _cgroup_memory_limit() -> Optional[int]:
    """The cgroup v2 memory.max or v1 memory.limit_in_bytes; None when unlimited or unreadable."""
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        text = _read_text(path)
        if text is None:
            continue
        if text == "max":
            return None
        try:
            value = int(text)
        except ValueError:
            continue
        # cgroup v1 reports "unlimited" as a huge page-aligned number.
        return None if value >= 2**60 else value
    return None


def _container() -> dict[str, Any]:
    kinds = []
    if os.path.exists("/.dockerenv"):
        kinds.append("docker")
    if os.path.exists("/run/.containerenv"):
        kinds.append("podman")
    if "KUBERNETES_SERVICE_HOST" in os.environ:
        kinds.append("kubernetes")
    if "SLURM_JOB_ID" in os.environ:
        kinds.append(f"slurm job {os.environ['SLURM_JOB_ID']}")
    cgroup = _read_text("/proc/1/cgroup") or ""
    if not kinds and any(word in cgroup for word in ("docker", "containerd", "kubepods", "lxc")):
        kinds.append("container (cgroup)")
    return {"kinds": kinds}


def os_description() -> str:
    """What platform.platform() says (e.g. Linux-6.8.0-x86_64-with-glibc2.39), without the `uname -p`
    subprocess it starts behind the runner's back."""
    uname = os.uname()
    libc, version = platform.libc_ver()
    return f"{uname.sysname}-{uname.release}-{uname.machine}" + (f"-with-{libc}{version}" if libc else "")


def gather_system_info() -> dict[str, Any]:
    """Equivalent: uname -a; nproc; free -b; cat /sys/fs/cgroup/memory.max."""
    try:
        affinity = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        affinity = None
    mem_total = None
    meminfo = _read_text("/proc/meminfo") or ""
    for line in meminfo.splitlines():
        if line.startswith("MemTotal:"):
            mem_total = int(line.split()[1]) * 1024
    uname = os.uname()
    return {
        "os": os_description(),
        "kernel": uname.release,
        "machine": uname.machine,
        "python": platform.python_version(),
        "cpu_count": os.cpu_count(),
        "cpu_affinity": affinity,
        "mem_total_bytes": mem_total,
        "cgroup_memory_limit_bytes": _cgroup_memory_limit(),
        "container": _container(),
    }


def collect_system(ctx: Context) -> SystemFacts:
    return SystemFacts(
        info=fact_or_none(ctx.sources, SYSTEM_FACT, gather_system_info) or {},
        ulimit=ctx.sources.run(ULIMIT_A),
        df_shm=ctx.sources.run(DF_SHM),
    )


def _gib(n: Optional[float]) -> str:
    if n is None:
        return "?"
    return f"{n / 1024**3:.1f} GiB" if n >= 1024**3 else f"{n / 1024**2:.0f} MiB"


def check_host(info: Mapping[str, Any]) -> list[Finding]:
    if not info:
        return []
    cpus = info.get("cpu_count")
    aff = info.get("cpu_affinity")
    cpu_text = f"{cpus} CPUs" + (f" ({aff} usable by this process)" if aff and aff != cpus else "")
    findings = [
        HOST_INFO.finding(
            Severity.INFO,
            f"{info.get('os', '?')}, {cpu_text}, {_gib(info.get('mem_total_bytes'))} RAM, Python {info.get('python', '?')}",
            evidence=[
                Evidence("os.uname(), platform.libc_ver(), os.cpu_count(), /proc/meminfo", str(dict(info)))
            ],
        )
    ]
    kinds = (info.get("container") or {}).get("kinds") or []
    findings.append(
        CONTAINER.finding(
            Severity.INFO,
            "Running in " + ", ".join(kinds) if kinds else "No container or scheduler detected",
            evidence=[
                Evidence(
                    "/.dockerenv, /run/.containerenv, /proc/1/cgroup, KUBERNETES_SERVICE_HOST, SLURM_JOB_ID"
                )
            ],
        )
    )
    limit = info.get("cgroup_memory_limit_bytes")
    total = info.get("mem_total_bytes")
    if limit:
        sev = Severity.WARN if total and limit < total / 4 else Severity.INFO
        findings.append(
            CGROUP_MEMORY.finding(
                sev,
                f"cgroup memory limit {_gib(limit)} of {_gib(total)} physical",
                evidence=[Evidence("/sys/fs/cgroup/memory.max", str(limit))],
            )
        )
    return findings


def unreadable_severity(result: Optional[CommandResult]) -> Severity:
    """A probe that failed is an error; output a snapshot simply does not hold is a skip."""
    return Severity.SKIP if result is not None and not result.captured else Severity.ERROR


def check_shm(entry: Optional[DfEntry], result: Optional[CommandResult]) -> list[Finding]:
    evidence = [Evidence(result.display if result else "df /dev/shm", result.excerpt() if result else "")]
    if entry is None or entry.size_bytes is None:
        why = result.describe_failure() if result else "no df output"
        return [
            SHM_UNREADABLE.finding(
                unreadable_severity(result),
                f"Could not read /dev/shm size: {why or 'no /dev/shm line'}",
                evidence=evidence,
            )
        ]
    size = entry.size_bytes
    if size < SHM_FAIL_BYTES:
        sev, text = (
            Severity.FAIL,
            f"/dev/shm is only {_gib(size)} (need at least {_gib(SHM_FAIL_BYTES)}, 1 GiB or more recommended)",
        )
    elif size < SHM_WARN_BYTES:
        sev, text = (
            Severity.WARN,
            f"/dev/shm is {_gib(size)}; 1 GiB or more is recommended for NCCL and DataLoader workers",
        )
    else:
        sev, text = Severity.OK, f"/dev/shm is {_gib(size)}"
    findings = [SHM_SIZE.finding(sev, text, evidence=evidence, data={"size_bytes": size})]
    if entry.use_percent is not None:
        use_sev = Severity.WARN if entry.use_percent >= SHM_USE_WARN_PERCENT else Severity.OK
        findings.append(
            SHM_USE.finding(
                use_sev,
                f"/dev/shm is {entry.use_percent}% used ({_gib(entry.used_bytes)} of {_gib(size)})",
                evidence=evidence,
                data={"use_percent": entry.use_percent},
            )
        )
    return findings


def check_ulimits(limits: Optional[Ulimits], result: Optional[CommandResult]) -> list[Finding]:
    # The open-files line is the evidence; the whole listing only when that line is missing.
    lines = [
        line
        for line in (result.stdout if result else "").splitlines()
        if "open files" in line or "nofile" in line
    ]
    excerpt = "\n".join(lines) if lines else (result.excerpt(20) if result else "")
    evidence = [Evidence(result.display if result else "ulimit -a", excerpt)]
    nofile = limits.get("n") if limits else None
    if nofile is None:
        why = (result.describe_failure() if result else "") or "no 'open files' line"
        return [
            LIMITS_UNREADABLE.finding(
                unreadable_severity(result), f"Could not read resource limits: {why}", evidence=evidence
            )
        ]
    if nofile.value is not None and nofile.value < NOFILE_WARN:
        return [
            ULIMIT_NOFILE.finding(
                Severity.WARN,
                f"Open files limit is {nofile.value} (below {NOFILE_WARN})",
                evidence=evidence,
                data={"nofile": nofile.value},
            )
        ]
    shown = "unlimited" if nofile.value is None else str(nofile.value)
    return [
        ULIMIT_NOFILE.finding(
            Severity.OK, f"Open files limit is {shown}", evidence=evidence, data={"nofile": nofile.value}
        )
    ]


def check_system(facts: SystemFacts) -> list[Finding]:
    findings = check_host(facts.info)
    shm = None
    if facts.df_shm is not None and facts.df_shm.found and facts.df_shm.stdout:
        shm = find_mount(parse_df(facts.df_shm.stdout), "/dev/shm")
    findings += check_shm(shm, facts.df_shm)
    limits = parse_ulimit(facts.ulimit.stdout) if facts.ulimit is not None and facts.ulimit.stdout else None
    findings += check_ulimits(limits, facts.ulimit)
    return findings


AREA = Area(name="system", title="System", collect=collect_system, judge=check_system, order=10)
