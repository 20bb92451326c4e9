"""`ddpdoctor report`: one markdown document for a bug report.

Versions, the check findings, GPU topology, an RDMA summary, an optional short benchmark, the relevant
environment and the raw outputs of every probe (collapsed in <details>). Everything is gathered through
one tapped Sources (live or a snapshot), assembled by the pure `render_report_markdown`, and the whole
text goes through the secret redaction last, so no planted token, key or URL password can reach it.
"""

from __future__ import annotations

import datetime as _dt
import json
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Optional

from ddpdoctor.ci.expect import NodeFacts, Observed, declared_command, show_version
from ddpdoctor.core.model import Report
from ddpdoctor.edge.redact import describe_redaction
from ddpdoctor.edge.runner import Command, CommandResult
from ddpdoctor.edge.sources import Sources, redact_data, redact_env, redact_text
from ddpdoctor.render.formats import document_from_report, md_cell, md_code_block, md_details, render_markdown

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


def _cut(text: str) -> str:
    lines = text.rstrip().splitlines()
    cut = "\n".join(lines[:RAW_MAX_LINES])[:RAW_MAX_CHARS]
    if len(cut) < len("\n".join(lines)):
        cut += f"\n... (cut: {len(lines)} lines in all; `ddpdoctor snapshot DIR` keeps them whole)"
    return cut


def _versions(inputs: ReportInputs) -> list[tuple[str, str]]:
    from ddpdoctor import __version__

    rows = [("ddpdoctor", __version__)]
    sysinfo = inputs.system or {}
    if sysinfo:
        rows.append(("OS", str(sysinfo.get("os", "?"))))
        rows.append(("Python", str(sysinfo.get("python", "?"))))
    info = inputs.torch_info.value if not inputs.torch_info.missing else None
    torch = info.get("torch") if isinstance(info, Mapping) else None
    if isinstance(torch, Mapping):
        cuda = torch.get("cuda") or ("HIP " + str(torch["hip"]) if torch.get("hip") else "none (CPU build)")
        rows.append(("torch", f"{torch.get('version')} (CUDA build: {cuda})"))
        rows.append(("cuDNN", str(torch.get("cudnn") or "-")))
    else:
        rows.append(("torch", f"unavailable: {inputs.torch_info.missing or 'import failed'}"))
    nccl = inputs.node.nccl
    rows.append(("NCCL", show_version(nccl.value) if not nccl.missing else f"- ({nccl.missing})"))
    gpu = inputs.node.gpu
    if gpu.missing:
        rows.append(("NVIDIA driver", f"- ({gpu.missing})"))
    else:
        rows.append(("NVIDIA driver", str(gpu.value.get("driver_version") or "?")))
        rows.append(("CUDA (driver)", str(gpu.value.get("cuda_version") or "?")))
        names = [str(g.get("name") or "?") for g in gpu.value.get("gpus") or [] if isinstance(g, Mapping)]
        counts: dict[str, int] = {}
        for n in names:
            counts[n] = counts.get(n, 0) + 1
        rows.append(("GPUs", ", ".join(f"{c} x {n}" for n, c in counts.items()) or "none"))
    return rows


def _rdma_section(node: NodeFacts) -> list[str]:
    if node.hcas.missing:
        return [f"Not available: {md_cell(node.hcas.missing)}"]
    if not node.hcas.value:
        return ["No RDMA devices: multi-node traffic uses TCP sockets."]
    out = [
        "| device | model | firmware | port | state | physical | rate (Gb/s) | link layer |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for hca in node.hcas.value:
        for p in hca.get("ports") or [{}]:
            cells = [
                hca.get("name"),
                hca.get("model") or hca.get("type"),
                hca.get("firmware"),
                p.get("port"),
                p.get("state"),
                p.get("physical_state"),
                p.get("rate_gbps"),
                p.get("link_layer"),
            ]
            out.append("| " + " | ".join(md_cell("-" if c is None else c) for c in cells) + " |")
    if not node.modules.missing:
        gdr = [m for m in ("nvidia_peermem", "nv_peer_mem") if m in node.modules.value]
        out += ["", f"GPUDirect RDMA module: {', '.join(gdr) if gdr else 'not loaded'}"]
    return out


def _bench_setup(data: Mapping[str, Any]) -> str:
    """What the short benchmark ran on, from its JSON: a gloo-on-CPU figure must not read as NCCL's."""
    config = data.get("config") if isinstance(data.get("config"), Mapping) else {}
    env = data.get("environment") if isinstance(data.get("environment"), Mapping) else {}
    backend = config.get("backend") or env.get("backend")
    if not isinstance(backend, str) or not backend:
        return ""
    ranks = config.get("world_size") or env.get("world_size") or "?"
    text = f"bench-nccl with {md_cell(backend)}, {md_cell(ranks)} rank(s) on {md_cell(env.get('host') or '?')}"
    gpus = [g for g in env.get("gpus") or [] if isinstance(g, str)] if isinstance(env.get("gpus"), list) else []
    if gpus:
        text += " (" + ", ".join(f"{gpus.count(g)}x {md_cell(g)}" for g in dict.fromkeys(gpus)) + ")"
    text += f", {md_cell(config.get('dtype') or '?')}, {md_cell(config.get('timing') or '?')} timing."
    if backend == "gloo":
        text += " gloo on CPU: these figures measure this host's memory and loopback, not a GPU interconnect."
    return text


def _bench_section(inputs: ReportInputs) -> list[str]:
    if inputs.bench_error:
        return [f"Not run to completion: {md_cell(inputs.bench_error)}"]
    data = inputs.bench or {}
    rows = [r for r in data.get("rows") or data.get("results") or [] if isinstance(r, Mapping)]
    if not rows:
        return ["No rows in the benchmark result."]
    setup = _bench_setup(data)
    out = ([setup, ""] if setup else []) + [
        "| op | size (B) | time (us) | algbw (GB/s) | busbw (GB/s) | #wrong |",
        "|---|---|---|---|---|---|",
    ]
    # The bench-nccl table's own rounding (nccl-tests' precision), so that both print the same numbers.
    from ddpdoctor.render.bench import format_gbps, format_time_us

    def number(value: Any, fmt: Callable[[float], str]) -> Any:
        return fmt(float(value)) if isinstance(value, (int, float)) and not isinstance(value, bool) else value

    for r in rows:
        cells = [
            r.get("op"),
            r.get("size"),
            number(r.get("time_us"), format_time_us),
            number(r.get("algbw"), format_gbps),
            number(r.get("busbw"), format_gbps),
            r.get("wrong"),
        ]
        if r.get("implausible") is True:  # above the GPU memory bandwidth: no data moved (bench-nccl)
            cells[3] = f"{cells[3]} (implausible)"
        out.append("| " + " | ".join(md_cell("-" if c is None else c) for c in cells) + " |")
    # bench-nccl's own notes: one rank (no interconnect measured), implausible rows left out of peaks.
    notes = [f"Note: {md_cell(n)}" for n in data.get("notes") or [] if isinstance(n, str)]
    if notes:
        out += ["", *notes]  # a blank line first: a line right below a table would be one more row
    return out


def render_report_markdown(inputs: ReportInputs) -> str:
    """The report text (pure); `build_report_text` redacts it."""
    out = [
        f"# ddpdoctor report: {md_cell(inputs.host)}",
        "",
        f"Generated {md_cell(inputs.generated)} from {md_cell(inputs.source)}. Redacted: "
        f"{describe_redaction()}.",
        "",
        "## Versions",
        "",
        "| component | version |",
        "|---|---|",
    ]
    out += [f"| {md_cell(k)} | {md_cell(v)} |" for k, v in _versions(inputs)]
    out += [
        "",
        "## Check findings",
        "",
        render_markdown(document_from_report(inputs.check), heading_level=3).rstrip(),
    ]
    out += ["", "## GPU topology", ""]
    topo = inputs.topology
    if topo is not None and topo.found and topo.stdout.strip():
        out.append(md_code_block(_cut(topo.stdout)))
    else:
        why = topo.describe_failure() if topo is not None else "not probed"
        out.append(f"Not available: {md_cell(why or 'empty output')}")
    out += ["", "## InfiniBand / RDMA", ""] + _rdma_section(inputs.node)
    if inputs.bench is not None or inputs.bench_error:
        out += ["", "## Benchmark (short)", ""] + _bench_section(inputs)
    out += ["", "## Environment", ""]
    if inputs.env:
        out.append(
            md_details(
                f"{len(inputs.env)} variables",
                md_code_block("\n".join(f"{k}={v}" for k, v in inputs.env.items())),
            )
        )
    else:
        out.append("No NCCL_/TORCH_/CUDA_/launcher variables set.")
    out += ["", "## Raw outputs", ""]
    for cid, (cmd, res) in sorted(inputs.commands.items()):
        if not res.found:
            out.append(f"- `{md_cell(cmd.display)}`: {md_cell(res.describe_failure())}")
            continue
        status = "timed out" if res.timed_out else f"exit {res.returncode}"
        body = _cut(res.stdout) if res.stdout.strip() else "(no output)"
        if res.stderr.strip():
            body += "\n--- stderr ---\n" + _cut(res.stderr)
        out += ["", md_details(f"{cid}: {cmd.display} ({status})", md_code_block(body))]
    for name, value in sorted(inputs.facts.items()):
        text = json.dumps(value, indent=2, sort_keys=True, default=str)
        out += ["", md_details(f"fact {name}", md_code_block(_cut(text), "json"))]
    return "\n".join(out).rstrip() + "\n"


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
    from ddpdoctor.ci.expect import gather_node_facts, read_torch_info
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


def build_report_text(inputs: ReportInputs, env: Optional[Mapping[str, str]] = None) -> str:
    """The report, redacted as a whole: the last line of defence for anything a probe quoted."""
    from ddpdoctor.render.formats import redact_report

    inputs.check = redact_report(inputs.check, env)
    return redact_text(render_report_markdown(inputs), env)


def write_report(text: str, path: Optional[Path], force: bool = False) -> None:
    """Print the report, or write it to `path`: never over an existing file unless `force`, never
    through a symbolic link (edge.files.write_new_file raises InputRefused, an OSError)."""
    if path is None:
        import sys

        sys.stdout.write(text)
        sys.stdout.flush()
    else:
        from ddpdoctor.edge.files import write_new_file

        write_new_file(path, text, force=force)


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
