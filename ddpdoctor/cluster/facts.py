"""Key facts of one node, the columns of the cluster report: software versions and hardware.

Gathered at the edge (torch_info, NVML, the InfiniBand sysfs tree) by one extra check area that runs
beside the node's usual areas, so it is bounded by the same deadline and a crash becomes a finding.
"""

from __future__ import annotations

import json
import os
import platform
import socket
from dataclasses import dataclass
from typing import Any, Mapping

from ddpdoctor.core.engine import Area, Context
from ddpdoctor.core.model import Evidence, Finding, Severity, define
from ddpdoctor.edge.nvml import gather_nvml
from ddpdoctor.edge.runner import define_command
from ddpdoctor.edge.sources import fact_or_none, redact_env
from ddpdoctor.edge.sysfs_ib import IB_SYSFS_FACT, read_infiniband_sysfs, to_ib_status

# Test-only: a JSON object merged over this node's gathered key facts, so a loopback test can give one
# "node" an older torch or NCCL than the others without installing one. Never set it in production.
FAKE_FACTS_ENV = "DDPDOCTOR_FAKE_FACTS"

# Environment variables that change how collectives connect or behave: they should agree on all nodes.
ENV_PREFIXES = ("NCCL_", "TORCH_NCCL_", "GLOO_", "UCX_", "FI_", "CUDA_DEVICE_MAX_CONNECTIONS")
# Set by the launchers per node/rank: differences are expected, never a finding.
ENV_PER_RANK = frozenset({"NCCL_COMM_ID"})

OFED_INFO = define_command(
    "cluster-ofed-info",
    ("ofed_info", "-s"),
    "MLNX_OFED / DOCA-OFED version, for the cluster report's key facts",
    timeout_s=5.0,
)

NODE_FACTS = define(
    "cluster.node.facts",
    "Node key facts",
    "The versions and hardware this node reported for the cluster report's table, for the record.",
)


@dataclass(frozen=True)
class KeyFact:
    """A column of the hosts x key-facts table."""

    key: str
    label: str


KEY_FACTS: tuple[KeyFact, ...] = (
    KeyFact("torch", "torch"),
    KeyFact("nccl", "NCCL"),
    KeyFact("cuda_build", "CUDA build"),
    KeyFact("driver", "driver"),
    KeyFact("gpu_model", "GPU"),
    KeyFact("gpu_count", "GPUs"),
    KeyFact("hca_model", "HCA"),
    KeyFact("hca_firmware", "HCA fw"),
    KeyFact("ib_rate", "IB rate"),
    KeyFact("ofed", "OFED"),
    KeyFact("kernel", "kernel"),
    KeyFact("python", "python"),
)


def read_torch_facts() -> dict[str, Any]:
    """torch, its CUDA build and NCCL version (ddpdoctor.edge.torch_info, in this process: torch is loaded).

    Equivalent: python -c 'import torch; print(torch.__version__, torch.version.cuda, torch.cuda.nccl.version())'
    """
    from ddpdoctor.edge import torch_info

    info = torch_info.gather()
    t = info.get("torch") or {}
    return {"torch": t.get("version"), "cuda_build": t.get("cuda"), "nccl": t.get("nccl")}


# NVML failures that mean "no NVIDIA GPU here" rather than "a GPU we cannot read".
NO_GPU_KINDS = frozenset({"library_not_found", "bindings_missing", "driver_not_loaded"})


def summarize_nvml(nvml: Mapping[str, Any]) -> dict[str, Any]:
    """Driver, GPU model (names joined when mixed) and count from ddpdoctor.edge.nvml.gather_nvml's data."""
    if not nvml.get("available"):
        kind = (nvml.get("error") or {}).get("kind")
        return {"driver": None, "gpu_model": None, "gpu_count": 0 if kind in NO_GPU_KINDS else None}
    names = [g.get("name") for g in nvml.get("gpus") or [] if isinstance(g, Mapping) and g.get("name")]
    count = nvml.get("device_count")
    return {
        "driver": nvml.get("driver_version"),
        "gpu_model": " + ".join(sorted(set(names))) or None,
        "gpu_count": count if isinstance(count, int) else None,
    }


def summarize_hca(fact: Any) -> dict[str, Any]:
    """HCA model, firmware, distinct rates of active InfiniBand ports and their count, from sysfs."""
    status = to_ib_status(fact)
    if not status.devices:
        return {"hca_model": None, "hca_firmware": None, "ib_rate": None, "ib_ports_active": None}
    models = sorted({d.type for d in status.devices if d.type})
    firmwares = sorted({d.firmware for d in status.devices if d.firmware})
    active = [
        p
        for d in status.devices
        for p in d.ports
        if p.state == "Active" and (p.link_layer or "InfiniBand") == "InfiniBand"
    ]
    rates = sorted({p.rate_gbps for p in active if p.rate_gbps is not None})
    return {
        "hca_model": " + ".join(models) or None,
        "hca_firmware": " + ".join(firmwares) or None,
        # One rate on a healthy node; several mean a port that renegotiated a lower speed.
        "ib_rate": " + ".join(f"{r:g} Gb/s" for r in rates) or None,
        "ib_ports_active": len(active),
    }


def read_collective_env(env: Mapping[str, str]) -> dict[str, str]:
    """NCCL_*, GLOO_*, TORCH_NCCL_*, UCX_*, FI_* variables, secrets redacted."""
    picked = {k: v for k, v in env.items() if k.startswith(ENV_PREFIXES) and k not in ENV_PER_RANK}
    return dict(sorted(redact_env(picked).items()))


def load_fake_facts(env: Mapping[str, str]) -> dict[str, Any]:
    """The test-only override object from DDPDOCTOR_FAKE_FACTS, or {} (also when it is not valid JSON)."""
    text = env.get(FAKE_FACTS_ENV, "")
    if not text:
        return {}
    try:
        value = json.loads(text)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def gather_node_facts(ctx: Context) -> dict[str, Any]:
    """Every key fact of this node; unknown values are None."""
    facts: dict[str, Any] = {
        "hostname": socket.gethostname(),
        "kernel": platform.release(),
        "python": platform.python_version(),
    }
    facts.update(read_torch_facts())
    facts.update(summarize_nvml(gather_nvml()))
    facts.update(summarize_hca(fact_or_none(ctx.sources, IB_SYSFS_FACT, read_infiniband_sysfs)))
    ofed = ctx.sources.run(OFED_INFO)
    facts["ofed"] = ofed.stdout.strip().splitlines()[0] if ofed.ok and ofed.stdout.strip() else None
    facts["env"] = read_collective_env(os.environ)
    facts.update(load_fake_facts(os.environ))
    return facts


def describe_facts(facts: Mapping[str, Any]) -> str:
    shown = [f"{kf.label} {facts.get(kf.key)}" for kf in KEY_FACTS if facts.get(kf.key) is not None]
    return ", ".join(shown) or "no key facts known"


def make_facts_area(sink: dict[str, Any]) -> Area:
    """An Area that gathers the key facts into `sink` (run_checks only returns findings)."""

    def collect(ctx: Context) -> dict[str, Any]:
        facts = gather_node_facts(ctx)
        sink.update(facts)
        return facts

    def judge(facts: dict[str, Any]) -> list[Finding]:
        return [
            NODE_FACTS.finding(
                Severity.INFO,
                describe_facts(facts),
                evidence=[Evidence("torch.__version__, NVML, /sys/class/infiniband, ofed_info -s")],
                data={k: facts.get(k) for k in (kf.key for kf in KEY_FACTS)},
            )
        ]

    return Area(name="cluster", title="Cluster key facts", collect=collect, judge=judge, order=99)
