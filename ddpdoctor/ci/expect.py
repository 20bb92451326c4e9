"""Expectations per node type: a TOML file saying what a healthy node of a kind looks like (8 GPUs of one
model, 8 HCAs at 400 Gb/s, driver >= X, all_reduce busbw >= Y), judged against what this node shows.

The facts come through the same Sources as the check areas (live, recorded or a replayed snapshot) and
from the same command ids and parsers (`nvidia-smi-q`, `nvidia-smi-nvlink-s`, `ibstat`, `df-shm`, ...),
looked up in their registries, so `check --replay DIR --expect FILE` judges a snapshot exactly as the
live node. The file format is documented in docs/ci.md and load_expectations() rejects what it does
not know: a typo must never turn an expectation into a silent pass. An expectation whose facts are
unavailable is an error (or a skip for bandwidth, which `bench-nccl` measures), never a pass.
"""

from __future__ import annotations

import functools
import json
from typing import Any, Iterable, Mapping, Sequence

from ddpdoctor.ci.expectations import (
    _UNITS,
    BENCH_OPS,
    FORMAT_VERSION,
    LINK_LAYERS,
    Expectations,
    format_size,
    human_size,
    parse_version,
    show_version,
)
from ddpdoctor.ci.node_facts import (
    NodeFacts,
    Observed,
    gather_node_facts,
)
from ddpdoctor.core.engine import Area
from ddpdoctor.core.model import CheckSpec, Evidence, Finding, Severity, define

EXPECT_FILE = define(
    "expect.file",
    "Expectations file",
    "Which expectations file the node was judged against, for the record.",
)
GPU_COUNT = define(
    "expect.gpu.count",
    "GPU count as expected",
    "A node with fewer GPUs than its type (a GPU fallen off the bus, not enumerated after a reset) makes "
    "jobs sized for the full node fail at launch or hang in the first collective.",
    "Look for Xid 79 / 'fallen off the bus' in `dmesg`; reset the GPU (`nvidia-smi -r`) or reboot; drain "
    "the node and open a hardware ticket if it does not come back.",
)
GPU_MODEL = define(
    "expect.gpu.model",
    "GPU model as expected",
    "A node of another GPU model in a homogeneous pool skews the job to its slowest GPU, and compiled "
    "kernels or memory budgets made for the expected model may not fit.",
    "Fix the node's partition or feature in the scheduler, or the expectations file for this node type.",
)
GPU_DRIVER = define(
    "expect.gpu.driver",
    "Driver version at least the minimum",
    "An older driver than the fleet's minimum misses fixes and may not support the CUDA version the "
    "training stack was built for.",
    "Upgrade the NVIDIA driver to the fleet's version (and reboot or reload the modules).",
)
GPU_CUDA = define(
    "expect.gpu.cuda",
    "Driver CUDA version at least the minimum",
    "The driver supports CUDA up to the version nvidia-smi prints; a torch built for a newer CUDA fails "
    "with 'The NVIDIA driver on your system is too old'.",
    "Upgrade the driver, or install the CUDA compatibility package (cuda-compat) for data-center GPUs.",
)
GPU_NVLINK = define(
    "expect.gpu.nvlink",
    "NVLink links active as expected",
    "An NVLink link that is down makes NCCL route that GPU's traffic over fewer links or PCIe: the whole "
    "job runs at the speed of the degraded GPU.",
    "Check `nvidia-smi nvlink -s` and `nvidia-smi nvlink -e`; on NVSwitch systems check the fabric "
    "manager (`systemctl status nvidia-fabricmanager`); reset the GPUs or reboot; open a hardware ticket.",
)
NCCL_VERSION = define(
    "expect.nccl.version",
    "NCCL version at least the minimum",
    "An older NCCL than the fleet's minimum misses bug fixes and performance work, and mixed versions "
    "across nodes can hang or corrupt collectives.",
    "Install the torch build (or NCCL package) the fleet standardizes on.",
)
HCA_COUNT = define(
    "expect.rdma.hca_count",
    "RDMA HCA count as expected",
    "A node with a missing HCA (or one of the wrong link layer) sends its share of inter-node traffic "
    "through the remaining ones or TCP sockets: every job that includes it crawls.",
    "Check `ibstat` and `dmesg | grep mlx5`; reseat or replace the adapter; reload the driver (`mlx5_ib`).",
)
HCA_PORTS = define(
    "expect.rdma.ports",
    "RDMA ports active at the expected rate",
    "A port that is Down or negotiated a lower rate (200 of 400 Gb/s) slows every collective that "
    "crosses it; NCCL uses it anyway.",
    "Check the cable and the switch port (`ibstat`, `ibdiagnet`); reseat or replace the cable or optics.",
)
KERNEL_MODULES = define(
    "expect.kernel.modules",
    "Required kernel modules loaded",
    "Without nvidia_peermem (GPUDirect RDMA) NCCL copies every inter-node message through host memory; "
    "other modules the node type needs are missing too when they do not show in /proc/modules.",
    "Load them (`modprobe nvidia_peermem`) and make it persistent (/etc/modules-load.d/).",
)
SHM_SIZE = define(
    "expect.system.shm",
    "/dev/shm at least the minimum",
    "NCCL's shared-memory transport and DataLoader workers allocate in /dev/shm; a smaller one than the "
    "node type needs ends in 'unhandled system error' or 'bus error'.",
    "Enlarge /dev/shm (container: --shm-size or an emptyDir with medium: Memory; host: remount tmpfs).",
)
BUSBW = {
    op: define(
        f"expect.busbw.{op}",
        f"{op} bus bandwidth at least the minimum",
        f"Peak {op} bus bandwidth below what the node type reaches means a degraded link, a wrong "
        "transport (sockets instead of IB, PCIe instead of NVLink) or a misconfigured NCCL. Measured by "
        "`ddpdoctor bench-nccl --expect FILE`; `check --expect` reports it as skipped.",
        "Run `ddpdoctor check` for link and transport findings, then `NCCL_DEBUG=INFO` to see the "
        "transport NCCL picked.",
    )
    for op in BENCH_OPS
}


# --- judging (pure) -----------------------------------------------------------------------------------


def _unavailable(spec: CheckSpec, expected: str, obs: Observed) -> Finding:
    return spec.finding(
        Severity.ERROR,
        f"Expected {expected}, but could not tell: {obs.missing}",
        evidence=obs.evidence,
        fix=f"Make the probe work on this node (run `{obs.evidence[0].source}` by hand)"
        if obs.evidence
        else "Run the probe by hand, or drop this expectation for this node type.",
        data={"expected": expected, "found": None},
    )


def join_some(items: Sequence[str], shown: int = 4) -> str:
    """The first `shown` items joined with "; ", and how many more there are: summaries stay one line."""
    more = f" (and {len(items) - shown} more)" if len(items) > shown else ""
    return "; ".join(items[:shown]) + more


def _verdict(spec: CheckSpec, ok: bool, expected: Any, found: Any, summary: str, obs: Observed) -> Finding:
    return spec.finding(
        Severity.OK if ok else Severity.FAIL,
        summary,
        evidence=obs.evidence,
        data={"expected": expected, "found": found},
    )


def judge_gpus(exp: Expectations, obs: Observed) -> list[Finding]:
    wanted = [
        (GPU_COUNT, exp.gpu_count is not None, f"{exp.gpu_count} GPUs"),
        (GPU_MODEL, exp.gpu_model is not None, f"GPU model {exp.gpu_model!r}"),
        (GPU_DRIVER, exp.driver_min is not None, f"driver >= {exp.driver_min}"),
        (GPU_CUDA, exp.cuda_min is not None, f"driver CUDA >= {exp.cuda_min}"),
    ]
    if obs.missing:
        return [_unavailable(spec, text, obs) for spec, on, text in wanted if on]
    data = obs.value
    gpus = [g for g in data.get("gpus") or [] if isinstance(g, Mapping)]
    names = [str(g.get("name") or "?") for g in gpus]
    out = []
    if exp.gpu_count is not None:
        found = len(gpus)
        attached = data.get("attached_gpus")
        extra = f" ({attached} attached)" if isinstance(attached, int) and attached != found else ""
        errors = "; ".join(data.get("errors") or [])
        extra += f"; nvidia-smi: {errors}" if errors and found != exp.gpu_count else ""
        out.append(
            _verdict(
                GPU_COUNT,
                found == exp.gpu_count,
                exp.gpu_count,
                found,
                f"Expected {exp.gpu_count} GPUs, found {found}{extra}",
                obs,
            )
        )
    if exp.gpu_model is not None:
        wrong = [f"GPU {i} is {n}" for i, n in enumerate(names) if exp.gpu_model.lower() not in n.lower()]
        if not names:
            summary = f"Expected GPU model {exp.gpu_model!r}, found no GPU"
        elif wrong:
            summary = f"Expected GPU model {exp.gpu_model!r}, found: " + join_some(wrong)
        else:
            summary = f"All {len(names)} GPUs are {names[0]} (expected {exp.gpu_model!r})"
        out.append(
            _verdict(GPU_MODEL, bool(names) and not wrong, exp.gpu_model, sorted(set(names)), summary, obs)
        )
    for spec, minimum, key, what in (
        (GPU_DRIVER, exp.driver_min, "driver_version", "Driver"),
        (GPU_CUDA, exp.cuda_min, "cuda_version", "Driver CUDA version"),
    ):
        if minimum is None:
            continue
        found_text = data.get(key)
        found_v = parse_version(found_text)
        if found_v is None:
            out.append(
                _unavailable(
                    spec,
                    f"{what} >= {minimum}",
                    Observed(missing=f"nvidia-smi shows no {what.lower()}", evidence=obs.evidence),
                )
            )
            continue
        ok = found_v >= (parse_version(minimum) or ())
        summary = f"{what} {found_text} " + (">=" if ok else "is older than the minimum") + f" {minimum}"
        out.append(_verdict(spec, ok, minimum, found_text, summary, obs))
    return out


def judge_nvlink(exp: Expectations, obs: Observed) -> list[Finding]:
    if exp.nvlink_active_links_min is None:
        return []
    expected = f"{exp.nvlink_active_links_min} active NVLink links per GPU"
    if obs.missing:
        return [_unavailable(GPU_NVLINK, expected, obs)]
    short = {gpu: n for gpu, n in obs.value.items() if n < exp.nvlink_active_links_min}
    if short:
        shown = ", ".join(f"GPU {g} has {n}" for g, n in list(short.items())[:6])
        summary = f"Expected {expected}: {shown}"
    else:
        summary = f"All {len(obs.value)} GPUs have >= {exp.nvlink_active_links_min} active NVLink links"
    return [_verdict(GPU_NVLINK, not short, exp.nvlink_active_links_min, dict(obs.value), summary, obs)]


def judge_nccl(exp: Expectations, obs: Observed) -> list[Finding]:
    if exp.nccl_min is None:
        return []
    if obs.missing:
        return [_unavailable(NCCL_VERSION, f"NCCL >= {exp.nccl_min}", obs)]
    ok = obs.value >= (parse_version(exp.nccl_min) or ())
    found = show_version(obs.value)
    summary = f"NCCL {found} " + (">=" if ok else "is older than the minimum") + f" {exp.nccl_min}"
    return [_verdict(NCCL_VERSION, ok, exp.nccl_min, found, summary, obs)]


def _device_link_layers(device: Mapping[str, Any]) -> set[str]:
    return {str(p.get("link_layer")) for p in device.get("ports") or [] if p.get("link_layer")}


def judge_hcas(exp: Expectations, obs: Observed) -> list[Finding]:
    if exp.hca_count is None and exp.hca_rate_gbps is None and exp.hca_link_layer is None:
        return []
    layer = exp.hca_link_layer
    what = f"{layer} " if layer else ""
    if obs.missing:
        out = []
        if exp.hca_count is not None or layer:
            out.append(
                _unavailable(
                    HCA_COUNT, f"{exp.hca_count if exp.hca_count is not None else 'some'} {what}HCAs", obs
                )
            )
        if exp.hca_rate_gbps is not None:
            out.append(_unavailable(HCA_PORTS, f"ports Active at {exp.hca_rate_gbps:g} Gb/s", obs))
        return out
    devices = [d for d in obs.value if isinstance(d, Mapping)]
    counted = [d for d in devices if not layer or layer in _device_link_layers(d)]
    others = [d for d in devices if d not in counted]
    out = []
    if exp.hca_count is not None or layer:
        n = len(counted)
        ok = n == exp.hca_count if exp.hca_count is not None else n > 0
        expected = f"{exp.hca_count} {what}HCAs" if exp.hca_count is not None else f"at least one {what}HCA"
        summary = f"Expected {expected}, found {n}" + (
            f" ({', '.join(str(d.get('name')) for d in counted)})" if counted and not ok else ""
        )
        if others and layer and not ok:
            summary += "; other link layers: " + ", ".join(
                f"{d.get('name')} {'/'.join(sorted(_device_link_layers(d))) or '?'}" for d in others
            )
        out.append(_verdict(HCA_COUNT, ok, exp.hca_count, n, summary, obs))
    if exp.hca_rate_gbps is not None:
        bad = []
        ports = 0
        for d in counted:
            for p in d.get("ports") or []:
                if layer and p.get("link_layer") not in (None, layer):
                    continue
                ports += 1
                state, rate = p.get("state"), p.get("rate_gbps")
                if state != "Active":
                    bad.append(f"{d.get('name')} port {p.get('port')} is {state or 'in an unknown state'}")
                elif rate is None or float(rate) < exp.hca_rate_gbps:
                    bad.append(
                        f"{d.get('name')} port {p.get('port')} runs at {rate if rate is not None else '?'} Gb/s"
                    )
        if not ports:
            summary = f"Expected ports Active at {exp.hca_rate_gbps:g} Gb/s, found no {what}port"
        elif bad:
            summary = f"Expected every port Active at >= {exp.hca_rate_gbps:g} Gb/s: " + join_some(bad)
        else:
            summary = f"All {ports} {what}ports Active at >= {exp.hca_rate_gbps:g} Gb/s"
        out.append(_verdict(HCA_PORTS, ports > 0 and not bad, exp.hca_rate_gbps, bad or ports, summary, obs))
    return out


def judge_modules(exp: Expectations, obs: Observed) -> list[Finding]:
    if not exp.kernel_modules:
        return []
    expected = "kernel modules " + ", ".join(exp.kernel_modules)
    if obs.missing:
        return [_unavailable(KERNEL_MODULES, expected, obs)]
    missing = [m for m in exp.kernel_modules if m not in obs.value]
    summary = (
        f"Expected {expected}; not loaded: {', '.join(missing)}"
        if missing
        else f"Loaded: {', '.join(exp.kernel_modules)}"
    )
    return [_verdict(KERNEL_MODULES, not missing, list(exp.kernel_modules), missing, summary, obs)]


def judge_shm(exp: Expectations, obs: Observed) -> list[Finding]:
    if exp.shm_min_bytes is None:
        return []
    expected = f"/dev/shm >= {human_size(exp.shm_min_bytes)}"
    if obs.missing:
        return [_unavailable(SHM_SIZE, expected, obs)]
    ok = obs.value >= exp.shm_min_bytes
    summary = f"/dev/shm is {human_size(obs.value)} (expected >= {human_size(exp.shm_min_bytes)})"
    return [_verdict(SHM_SIZE, ok, exp.shm_min_bytes, obs.value, summary, obs)]


def judge_busbw_skipped(exp: Expectations) -> list[Finding]:
    """In `check`, bandwidth is not measured: each busbw expectation is a skip saying where it is judged."""
    return [
        BUSBW[op].finding(
            Severity.SKIP,
            f"{op} busbw >= {gbps:g} GB/s is judged by `ddpdoctor bench-nccl --expect {exp.path or 'FILE'}`",
            data={"expected": gbps, "found": None},
        )
        for op, gbps in exp.busbw_min_gbps.items()
    ]


def judge_node(exp: Expectations, facts: NodeFacts) -> list[Finding]:
    """Every expectation of the file against the node's facts (pure)."""
    findings = [
        EXPECT_FILE.finding(
            Severity.INFO,
            f"Judged against {exp.label}" + (f" ({exp.path})" if exp.path and exp.name else ""),
            evidence=[Evidence(exp.path or "expectations")],
        )
    ]
    findings += judge_gpus(exp, facts.gpu)
    findings += judge_nvlink(exp, facts.nvlink)
    findings += judge_nccl(exp, facts.nccl)
    findings += judge_hcas(exp, facts.hcas)
    findings += judge_modules(exp, facts.modules)
    findings += judge_shm(exp, facts.shm)
    findings += judge_busbw_skipped(exp)
    return findings


def show_gbps(value: float) -> str:
    """GB/s with two decimals, or three significant digits below 1 (gloo on CPU moves MB/s)."""
    return f"{value:.2f}" if value >= 1 else f"{value:.3g}"


def peak_busbw(rows: Iterable[Mapping[str, Any]]) -> dict[str, float]:
    """Peak busbw (GB/s) per op over the rows of a bench-nccl JSON result."""
    peak: dict[str, float] = {}
    for row in rows:
        op, bw = row.get("op"), row.get("busbw")
        if isinstance(op, str) and isinstance(bw, (int, float)) and not isinstance(bw, bool):
            peak[op] = max(peak.get(op, 0.0), float(bw))
    return peak


def judge_bench(
    exp: Expectations, rows: Sequence[Mapping[str, Any]], source: str = "bench-nccl"
) -> list[Finding]:
    """Minimum busbw per op against the rows a benchmark measured (pure). An op not measured in this run
    is a skip, never a pass."""
    peak = peak_busbw(rows)
    out = []
    for op, gbps in exp.busbw_min_gbps.items():
        spec = BUSBW[op]
        if op not in peak:
            out.append(
                spec.finding(
                    Severity.SKIP,
                    f"{op} busbw >= {gbps:g} GB/s expected, but {op} was not measured in this run",
                    fix=f"Run `ddpdoctor bench-nccl --ops {op} --expect {exp.path or 'FILE'}`.",
                    data={"expected": gbps, "found": None},
                )
            )
            continue
        ok = peak[op] >= gbps
        out.append(
            spec.finding(
                Severity.OK if ok else Severity.FAIL,
                f"Peak {op} busbw {show_gbps(peak[op])} GB/s "
                + ("meets" if ok else "is below")
                + f" the minimum {gbps:g} GB/s",
                evidence=[Evidence(source, f"peak busbw {op}: {show_gbps(peak[op])} GB/s")],
                data={"expected": gbps, "found": round(peak[op], 3)},
            )
        )
    return out


def expectation_area(exp: Expectations) -> Area:
    """An extra check area that judges `exp`; it runs beside the other areas, bounded the same way."""
    return Area(
        name="expect",
        title=f"Expectations ({exp.label})",
        collect=lambda ctx: gather_node_facts(ctx.sources),
        judge=functools.partial(judge_node, exp),
        order=95,
    )


# --- writing a starting point ------------------------------------------------------------------------


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return f"{value:g}" if isinstance(value, float) else str(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    # JSON string escapes are valid TOML basic-string escapes.
    return json.dumps(str(value), ensure_ascii=False)


def expectations_from_facts(facts: NodeFacts) -> tuple[dict[str, dict[str, Any]], list[str]]:
    """What this node shows, as expectation tables, and a note for each fact that was unavailable."""
    tables: dict[str, dict[str, Any]] = {}
    notes: list[str] = []
    if facts.gpu.missing:
        notes.append(f"[gpu] not written: {facts.gpu.missing}")
    else:
        data = facts.gpu.value
        names = [
            str(g.get("name")) for g in data.get("gpus") or [] if isinstance(g, Mapping) and g.get("name")
        ]
        gpu: dict[str, Any] = {}
        if names and len(set(names)) == 1:
            gpu["model"] = names[0]
        elif names:
            notes.append(f"[gpu] model not written: mixed models {sorted(set(names))}")
        gpu["count"] = len(data.get("gpus") or [])
        for key, src in (("driver_min", "driver_version"), ("cuda_min", "cuda_version")):
            if parse_version(data.get(src)):
                gpu[key] = str(data[src])
        if not facts.nvlink.missing and facts.nvlink.value and min(facts.nvlink.value.values()) > 0:
            gpu["nvlink_active_links_min"] = min(facts.nvlink.value.values())
        tables["gpu"] = gpu
    if facts.nccl.missing:
        notes.append(f"[nccl] not written: {facts.nccl.missing}")
    else:
        tables["nccl"] = {"version_min": show_version(facts.nccl.value)}
    if facts.hcas.missing:
        notes.append(f"[rdma] not written: {facts.hcas.missing}")
    elif facts.hcas.value:
        by_layer: dict[str, list[Mapping[str, Any]]] = {}
        for d in facts.hcas.value:
            for layer in _device_link_layers(d) or {"?"}:
                by_layer.setdefault(layer, []).append(d)
        layer, devices = max(by_layer.items(), key=lambda kv: len(kv[1]))
        rdma: dict[str, Any] = {"hca_count": len(devices)}
        if layer in LINK_LAYERS.values():
            rdma["link_layer"] = layer
        rates = [
            float(p["rate_gbps"])
            for d in devices
            for p in d.get("ports") or []
            if p.get("state") == "Active" and p.get("rate_gbps") and p.get("link_layer") in (None, layer)
        ]
        if rates:
            rdma["rate_gbps"] = int(min(rates)) if min(rates).is_integer() else min(rates)
        tables["rdma"] = rdma
    else:
        notes.append("[rdma] not written: no RDMA devices on this node")
    if facts.modules.missing:
        notes.append(f"[kernel] not written: {facts.modules.missing}")
    else:
        wanted = [m for m in ("nvidia_peermem", "nv_peer_mem", "mlx5_ib") if m in facts.modules.value]
        if wanted:
            tables["kernel"] = {"modules": wanted}
        else:
            notes.append("[kernel] not written: none of nvidia_peermem, nv_peer_mem, mlx5_ib is loaded")
    if facts.shm.missing:
        notes.append(f"[system] not written: {facts.shm.missing}")
    else:
        # df rounds; a minimum rounded down to the unit keeps this node passing its own file.
        size = int(facts.shm.value)
        unit = _UNITS["G"] if size >= _UNITS["G"] else _UNITS["M"]
        tables["system"] = {"shm_min": format_size(size // unit * unit if size >= unit else size)}
    return tables, notes


def render_expectations_toml(
    tables: Mapping[str, Mapping[str, Any]], notes: Sequence[str], name: str, origin: str
) -> str:
    """The TOML text of an expectations file (format documented in docs/ci.md)."""
    lines = [
        f"# ddpdoctor expectations, written by `ddpdoctor expect --write` from {origin}.",
        "# A starting point: review every value, then use it with `ddpdoctor check --expect FILE`",
        "# and `ddpdoctor bench-nccl --expect FILE`. Format: docs/ci.md.",
        f"format = {FORMAT_VERSION}",
        f"name = {_toml_value(name)}",
    ]
    for note in notes:
        lines.append(f"# {note}")
    for table in ("gpu", "nccl", "rdma", "kernel", "system"):
        if table in tables and tables[table]:
            lines += ["", f"[{table}]"]
            lines += [f"{k} = {_toml_value(v)}" for k, v in tables[table].items()]
    lines += [
        "",
        "# Peak bus bandwidth per op in GB/s, judged by `ddpdoctor bench-nccl --expect FILE`.",
        "# Measure a healthy node first (`ddpdoctor bench-nccl --ops all_reduce`), then set about 90% of it:",
        "# [busbw_min_gbps]",
        "# all_reduce = 0",
    ]
    return "\n".join(lines) + "\n"
