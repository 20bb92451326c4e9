"""The `ddpdoctor report` document (pure): versions, check findings, topology, RDMA summary, bench,
environment and raw outputs in collapsed sections, from the ReportInputs that ci.report gathered."""

from __future__ import annotations

import json
from typing import Any, Callable, Mapping, Optional

from ddpdoctor.ci.expectations import show_version
from ddpdoctor.ci.node_facts import NodeFacts
from ddpdoctor.ci.report import RAW_MAX_CHARS, RAW_MAX_LINES, ReportInputs
from ddpdoctor.edge.redact import describe_redaction, neutralize_controls
from ddpdoctor.edge.sources import redact_text
from ddpdoctor.render.formats import document_from_report, md_cell, md_code_block, md_details, render_markdown


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
    text = (
        f"bench-nccl with {md_cell(backend)}, {md_cell(ranks)} rank(s) on {md_cell(env.get('host') or '?')}"
    )
    gpus = (
        [g for g in env.get("gpus") or [] if isinstance(g, str)] if isinstance(env.get("gpus"), list) else []
    )
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


def build_report_text(inputs: ReportInputs, env: Optional[Mapping[str, str]] = None) -> str:
    """The report, redacted as a whole: the last line of defence for anything a probe quoted."""
    from ddpdoctor.render.formats import redact_report

    inputs.check = redact_report(inputs.check, env)
    return neutralize_controls(redact_text(render_report_markdown(inputs), env))
