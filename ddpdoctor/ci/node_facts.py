"""What `--expect` compares against, read through the same Sources as the check areas (live, recorded
or a replayed snapshot) with the same command ids and parsers (`nvidia-smi-q`, `nvidia-smi-nvlink-s`,
`ibstat`, `df-shm`, ...), so `check --replay DIR --expect FILE` judges a snapshot exactly as the live
node. A reading that fails is an Observed with its reason, never an exception."""

from __future__ import annotations

import functools
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Optional

from ddpdoctor.ci.expectations import parse_version
from ddpdoctor.core.model import Evidence
from ddpdoctor.edge.runner import Command, CommandResult, all_commands
from ddpdoctor.edge.sources import Sources, fact_or_none

# --- facts ---------------------------------------------------------------------------------------------


@dataclass
class Observed:
    """One fact as read through the sources: a value, or why it is unavailable, and where it came from."""

    value: Any = None
    missing: str = ""  # why the fact is unavailable; empty when value is usable
    evidence: tuple[Evidence, ...] = ()


@dataclass
class NodeFacts:
    gpu: Observed = field(default_factory=Observed)  # nvidia-smi -q JSON (docs/parse.md)
    nvlink: Observed = field(default_factory=Observed)  # {gpu index: active link count}
    nccl: Observed = field(default_factory=Observed)  # version tuple
    hcas: Observed = field(default_factory=Observed)  # ibstat JSON devices (docs/parse.md)
    modules: Observed = field(default_factory=Observed)  # set of loaded module names
    shm: Observed = field(default_factory=Observed)  # /dev/shm size in bytes


# The snapshot ids documented in docs/snapshot.md, used only when no check area declares them (an area
# left out of this build): a snapshot with these files is still judged.
_DOCUMENTED_ARGV = {
    "nvidia-smi-q": ("nvidia-smi", "-q"),
    "nvidia-smi-nvlink-s": ("nvidia-smi", "nvlink", "-s"),
    "nvidia-smi-topo-m": ("nvidia-smi", "topo", "-m"),
    "df-shm": ("df", "-k", "/dev/shm"),
}


def declared_command(cid: str) -> Optional[Command]:
    """The command a check area declared under this id (importing the areas declares them)."""
    from ddpdoctor.checks import load_areas

    load_areas()
    cmd = all_commands().get(cid)
    if cmd is None and cid in _DOCUMENTED_ARGV:
        cmd = Command(id=cid, argv=_DOCUMENTED_ARGV[cid], description=cid)
    return cmd


@functools.lru_cache(maxsize=1)
def _parse_tools() -> dict[str, Callable[[str], Any]]:
    from ddpdoctor.parsers import load_parse_tools

    return load_parse_tools()


def _run_parsed(sources: Sources, cid: str, tool: str) -> Observed:
    """Run a declared command through the sources and parse its output with the `ddpdoctor parse` tool."""
    cmd = declared_command(cid)
    if cmd is None:
        return Observed(missing=f"no check declares the `{cid}` probe")
    result: CommandResult = sources.run(cmd)
    evidence = (Evidence(cmd.display, result.excerpt()),)
    if not result.found or result.timed_out or not result.stdout.strip():
        return Observed(
            missing=result.describe_failure() or f"`{cmd.display}` printed nothing", evidence=evidence
        )
    parser = _parse_tools().get(tool)
    if parser is None:
        return Observed(missing=f"no parser for {tool}", evidence=evidence)
    try:
        return Observed(value=parser(result.stdout), evidence=evidence)
    except Exception as exc:  # noqa: BLE001 - a parser bug must not crash the check
        return Observed(missing=f"could not parse `{cmd.display}`: {exc}", evidence=evidence)


def read_gpus(sources: Sources) -> Observed:
    """GPUs, driver and CUDA version. Equivalent: nvidia-smi -q."""
    obs = _run_parsed(sources, "nvidia-smi-q", "nvidia-smi-q")
    if obs.missing:
        return obs
    data = obs.value if isinstance(obs.value, Mapping) else {}
    if not data.get("gpus") and not data.get("driver_version"):
        errors = "; ".join(data.get("errors") or []) or "no GPU section in the output"
        return Observed(missing=f"nvidia-smi reported no GPUs: {errors}", evidence=obs.evidence)
    return obs


def read_nvlink(sources: Sources) -> Observed:
    """Active NVLink links per GPU. Equivalent: nvidia-smi nvlink -s."""
    obs = _run_parsed(sources, "nvidia-smi-nvlink-s", "nvidia-smi-nvlink")
    if obs.missing:
        return obs
    active = nvlink_active_counts(obs.value)
    if active is None:
        return Observed(missing="no GPU in `nvidia-smi nvlink -s` output", evidence=obs.evidence)
    return Observed(value=active, evidence=obs.evidence)


def nvlink_active_counts(parsed: Any) -> Optional[dict[str, int]]:
    """{gpu: number of active links} from the `nvidia-smi-nvlink` parse tool's JSON."""
    from ddpdoctor.parsers.nvidia_smi_nvlink import link_summary

    gpus = parsed.get("gpus") if isinstance(parsed, Mapping) else None
    if not gpus:
        return None
    out: dict[str, int] = {}
    for i, gpu in enumerate(gpus):
        if isinstance(gpu, Mapping):
            out[str(gpu.get("index", i))] = int(link_summary(dict(gpu))["active"] or 0)
    return out


def read_hcas(sources: Sources) -> Observed:
    """RDMA devices and ports as the RDMA area sees them (sysfs first, then ibstat, ibv_devinfo, ibstatus).

    Equivalent: ibstat; cat /sys/class/infiniband/*/ports/*/{state,rate,link_layer}
    """
    from ddpdoctor.checks.rdma import IBSTAT, IBSTATUS, IBV_DEVINFO, RdmaFacts, summarize_rdma
    from ddpdoctor.edge.sysfs_ib import IB_SYSFS_FACT, read_infiniband_sysfs

    facts = RdmaFacts(
        sysfs=fact_or_none(sources, IB_SYSFS_FACT, read_infiniband_sysfs),
        ibstat=sources.run(IBSTAT),
        ibv_devinfo=sources.run(IBV_DEVINFO),
        ibstatus=sources.run(IBSTATUS),
    )
    summary = summarize_rdma(facts)
    tools = [r for r in (facts.ibstat, facts.ibv_devinfo, facts.ibstatus) if r is not None]
    evidence = tuple(Evidence(r.display, r.excerpt(6)) for r in tools if r.found)
    if isinstance(facts.sysfs, Mapping):
        evidence = (Evidence("/sys/class/infiniband", f"{len(summary.hcas)} devices"), *evidence)
    readable = isinstance(facts.sysfs, Mapping) or any(r.found and not r.timed_out for r in tools)
    if not summary.hcas and not readable:
        why = "; ".join(r.describe_failure() for r in tools if r.describe_failure())
        return Observed(missing=f"no RDMA source readable ({why or 'no sysfs, no tools'})", evidence=evidence)
    return Observed(value=[h.to_dict() for h in summary.hcas], evidence=evidence)


def read_modules(sources: Sources) -> Observed:
    """Loaded kernel modules as the RDMA area reads them. Equivalent: cat /proc/modules (or lsmod)."""
    from ddpdoctor.checks.rdma import RdmaFacts
    from ddpdoctor.checks.rdma_gpudirect import LSMOD, MODULES_FACT, loaded_modules, read_kernel_modules

    facts = RdmaFacts(modules=fact_or_none(sources, MODULES_FACT, read_kernel_modules))
    names, where = loaded_modules(facts)
    if names is None:
        facts.lsmod = sources.run(LSMOD)
        names, where = loaded_modules(facts)
    if names is None:
        why = facts.lsmod.describe_failure() if facts.lsmod is not None else ""
        return Observed(missing=f"neither /proc/modules nor lsmod readable {why}".strip())
    return Observed(value=names, evidence=(Evidence(where, f"{len(names)} modules loaded"),))


def read_shm(sources: Sources) -> Observed:
    """Size of /dev/shm. Equivalent: df -k /dev/shm."""
    obs = _run_parsed(sources, "df-shm", "df")
    if obs.missing:
        return obs
    for fs in (obs.value or {}).get("filesystems", []):
        if fs.get("mount") == "/dev/shm" and fs.get("size_bytes") is not None:
            return Observed(value=int(fs["size_bytes"]), evidence=obs.evidence)
    return Observed(missing="no /dev/shm line in df output", evidence=obs.evidence)


def read_torch_info(sources: Sources) -> Observed:
    """What the torch area's probe reported (shared with it: one subprocess per Sources).

    Equivalent: python -m ddpdoctor.edge.torch_info
    """
    from ddpdoctor.checks.torch import TORCH_INFO, parse_torch_info, run_torch_info

    result = run_torch_info(sources)
    evidence = (Evidence(TORCH_INFO.display, result.excerpt(4)),)
    info = parse_torch_info(result.stdout) if result.stdout else None
    if info is None:
        return Observed(missing=result.describe_failure() or "torch probe printed no JSON", evidence=evidence)
    return Observed(value=info, evidence=evidence)


def nccl_from_torch_info(obs: Observed) -> Observed:
    """The NCCL version torch loads, from the torch probe's JSON."""
    if obs.missing:
        return obs
    torch = obs.value.get("torch") if isinstance(obs.value, Mapping) else None
    if not isinstance(torch, Mapping):
        why = (obs.value or {}).get("import_error") or "torch is not importable"
        return Observed(missing=str(why).splitlines()[-1][:200], evidence=obs.evidence)
    raw = torch.get("nccl")
    evidence = (Evidence("torch.cuda.nccl.version()", str(raw)),)
    version = parse_version(raw)
    if version is None:
        return Observed(
            missing="torch reports no NCCL (a CPU-only build, or NCCL not loadable)", evidence=evidence
        )
    return Observed(value=version, evidence=evidence)


def gather_node_facts(sources: Sources) -> NodeFacts:
    """Everything the expectations judge, read through the sources (live machine or snapshot); the
    probes run concurrently, each bounded by the sources' deadline."""
    readers = {
        "gpu": read_gpus,
        "nvlink": read_nvlink,
        "nccl": lambda src: nccl_from_torch_info(read_torch_info(src)),
        "hcas": read_hcas,
        "modules": read_modules,
        "shm": read_shm,
    }
    with ThreadPoolExecutor(max_workers=len(readers), thread_name_prefix="expect") as pool:
        futures = {name: pool.submit(_guarded, fn, sources) for name, fn in readers.items()}
        return NodeFacts(**{name: future.result() for name, future in futures.items()})


def _guarded(read: Callable[[Sources], Observed], sources: Sources) -> Observed:
    try:
        return read(sources)
    except Exception as exc:  # noqa: BLE001 - one broken probe must not hide the other facts
        return Observed(missing=f"probe failed: {type(exc).__name__}: {exc}")
