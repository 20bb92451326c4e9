"""`ddpdoctor report`: one markdown document for a bug report.

Versions, the check findings, GPU topology, an RDMA summary, an optional short benchmark, the relevant
environment and the raw outputs of every probe (collapsed in <details>). Everything is gathered through
one tapped Sources (live or a snapshot), assembled by the pure `render.report.render_report_markdown`, and the whole
text goes through the secret redaction last, so no planted token, key or URL password can reach it.
"""

from __future__ import annotations

import datetime as _dt
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Optional

from ddpdoctor.ci.node_facts import NodeFacts, Observed, declared_command
from ddpdoctor.core.model import Report
from ddpdoctor.edge.runner import Command, CommandResult
from ddpdoctor.edge.sources import Sources, redact_data, redact_env

# GitHub caps an issue body at 65536 characters: raw outputs are cut, the snapshot has them whole.
RAW_MAX_LINES = 200
RAW_MAX_CHARS = 12000
# The environment that shapes a distributed job (values of secret-looking names are redacted anyway).
ENV_PREFIXES = (
    "NCCL_",
    "TORCH_",
    "PYTORCH_",
    "CUDA_",
    "NVIDIA_",
    "GLOO_",
    "UCX_",
    "OMPI_",
    "PMI_",
    "PMIX_",
    "SLURM_",
    "TORCHELASTIC_",
    "MASTER_",
    "LOCAL_",
    "GROUP_",
    "OMP_",
    "KUBERNETES_",
)
ENV_NAMES = ("RANK", "WORLD_SIZE", "LD_LIBRARY_PATH", "LD_PRELOAD", "HOSTNAME", "VIRTUAL_ENV", "CONDA_PREFIX")


class TapSources:
    """Any Sources, with every command result and fact kept for the raw-output section."""

    def __init__(self, inner: Sources) -> None:
        self.inner = inner
        self._lock = threading.Lock()
        self.commands: dict[str, tuple[Command, CommandResult]] = {}
        self.facts: dict[str, Any] = {}

    @property
    def deadline(self) -> float:
        return self.inner.deadline

    @deadline.setter
    def deadline(self, value: float) -> None:
        self.inner.deadline = value

    @property
    def is_live(self) -> bool:
        return self.inner.is_live

    def run(self, cmd: Command) -> CommandResult:
        result = self.inner.run(cmd)
        with self._lock:
            self.commands[cmd.id] = (cmd, result)
        return result

    def fact(self, name: str, produce: Callable[[], Any]) -> Any:
        value = self.inner.fact(name, produce)
        with self._lock:
            self.facts[name] = value
        return value


@dataclass
class ReportInputs:
    """Everything the report shows, gathered; rendering it is pure."""

    host: str
    check: Report
    node: NodeFacts
    torch_info: Observed
    system: Mapping[str, Any] = field(default_factory=dict)
    topology: Optional[CommandResult] = None
    commands: Mapping[str, tuple[Command, CommandResult]] = field(default_factory=dict)
    facts: Mapping[str, Any] = field(default_factory=dict)
    env: Mapping[str, str] = field(default_factory=dict)
    bench: Optional[Mapping[str, Any]] = None
    bench_error: str = ""
    generated: str = ""
    source: str = "live"


def relevant_env(env: Mapping[str, str]) -> dict[str, str]:
    """The variables that shape a distributed job, redacted."""
    keep = {k: v for k, v in env.items() if k.startswith(ENV_PREFIXES) or k in ENV_NAMES}
    return dict(sorted(redact_env(keep).items()))


def _report_facts(facts: Mapping[str, Any]) -> dict[str, Any]:
    """The facts a report embeds: the environment fact cut to the variables that shape a job (as in the
    Environment section): the whole environment holds CI and cloud tokens no bug report needs."""
    out = dict(facts)
    if isinstance(out.get("env"), Mapping):
        out["env"] = relevant_env({str(k): str(v) for k, v in out["env"].items()})
    return out


def gather_report_inputs(
    sources: Sources,
    *,
    timeout: float,
    source_label: str,
    env: Mapping[str, str],
    bench: Optional[Callable[[], tuple[Optional[dict], str]]] = None,
) -> ReportInputs:
    """Run the checks, the node facts and the topology probe through one tapped Sources, concurrently."""
    from concurrent.futures import ThreadPoolExecutor

    from ddpdoctor.checks import load_areas
    from ddpdoctor.checks.system import SYSTEM_FACT, gather_system_info
    from ddpdoctor.ci.node_facts import gather_node_facts, read_torch_info
    from ddpdoctor.core.engine import load_hostname, run_checks
    from ddpdoctor.edge.sources import fact_or_none

    tap = TapSources(sources)
    tap.deadline = time.monotonic() + timeout
    areas = load_areas()
    topo_cmd = declared_command("nvidia-smi-topo-m")
    with ThreadPoolExecutor(max_workers=4, thread_name_prefix="report") as pool:
        check = pool.submit(
            run_checks,
            tap,
            areas,
            timeout_s=timeout,
            options={"smoke": False, "timeout": timeout},
            source_label=source_label,
        )
        node = pool.submit(gather_node_facts, tap)
        topo = pool.submit(tap.run, topo_cmd) if topo_cmd is not None else None
        bench_future = pool.submit(bench) if bench is not None else None
        report = check.result()
        node_facts = node.result()
        topology = topo.result() if topo is not None else None
        bench_data, bench_error = bench_future.result() if bench_future is not None else (None, "")
    system = fact_or_none(tap, SYSTEM_FACT, gather_system_info) or {}
    return ReportInputs(
        host=load_hostname(tap),
        check=report,
        node=node_facts,
        torch_info=read_torch_info(tap),
        system=system if isinstance(system, Mapping) else {},
        topology=topology,
        commands=dict(tap.commands),
        facts=redact_data(_report_facts(tap.facts)),
        env=relevant_env(env),
        bench=bench_data,
        bench_error=bench_error,
        generated=_dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        source=source_label,
    )


def write_report(text: str, path: Optional[Path], force: bool = False) -> None:
    """Print the report, or write it to `path`: never over an existing file unless `force`, never
    through a symbolic link (edge.files.write_output_file raises InputRefused, an OSError)."""
    if path is None:
        import sys

        sys.stdout.write(text)
        sys.stdout.flush()
    else:
        from ddpdoctor.edge.files import write_output_file

        write_output_file(path, text, force=force)


BENCH_ARGS = (
    "--ops",
    "all_reduce",
    "--min-bytes",
    "1M",
    "--max-bytes",
    "16M",
    "--iters",
    "5",
    "--warmup",
    "2",
)


def run_short_bench(timeout_s: float) -> tuple[Optional[dict], str]:
    """A short all_reduce sweep in a child process (its own launcher and watchdog), bounded by timeout_s.

    Equivalent: ddpdoctor bench-nccl --ops all_reduce --min-bytes 1M --max-bytes 16M --iters 5 --json FILE
    """
    import sys
    import tempfile

    from ddpdoctor.edge.runner import run_argv

    with tempfile.TemporaryDirectory(prefix="ddpdoctor-report-") as tmp:
        out = Path(tmp) / "bench.json"
        argv = (
            sys.executable,
            "-m",
            "ddpdoctor",
            "bench-nccl",
            *BENCH_ARGS,
            "--timeout",
            "30",
            "--json",
            str(out),
        )
        result = run_argv(argv, timeout_s=timeout_s)
        data: Optional[dict] = None
        if out.is_file():
            from ddpdoctor.edge.files import load_json_file

            try:
                loaded = load_json_file(out)
                data = loaded if isinstance(loaded, dict) else None
            except (OSError, ValueError):
                data = None
    if data is None:
        return None, result.describe_failure() or "bench-nccl wrote no JSON"
    return data, ""
