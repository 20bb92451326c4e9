"""NCCL and torch.distributed environment variables: what is set, performance killers, deprecated
names, typos, and settings hidden in /etc/nccl.conf or ~/.nccl.conf."""

from __future__ import annotations

import difflib
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Optional

from ddpdoctor.core.engine import ENV_NOT_RECORDED, Area, Context
from ddpdoctor.core.model import Evidence, Finding, Severity, define
from ddpdoctor.edge.files import read_user_head
from ddpdoctor.edge.json_shape import MapOf, Record
from ddpdoctor.edge.sources import define_fact, fact_or_none

NCCL_CONF_FACT = define_fact(
    "nccl-conf",
    "Contents of the NCCL config files (/etc/nccl.conf, ~/.nccl.conf, $NCCL_CONF_FILE)",
    Record({"files": MapOf(str), "unreadable": MapOf(str)}),
)

PREFIXES = ("NCCL_", "TORCH_NCCL_", "TORCH_DISTRIBUTED_", "TORCH_FR_", "TORCH_GLOO_")

# Every variable NCCL reads: the NCCL_PARAM / ncclGetEnv names in NCCL 2.30's source
# (github.com/NVIDIA/nccl @5067397c, src/), plus names from the NCCL user guide's "Environment
# Variables" page of older releases (2.4-2.23) that users still set.
KNOWN_NCCL = frozenset(
    """
ALGO ALLGATHERV_ENABLE ALLOC_P2P_NET_LL_BUFFERS BUFFSIZE CGA_CLUSTER_SIZE CHECK_MODE CHECK_POINTERS
CHUNK_SIZE COLLNET_ENABLE COLLNET_NODE_THRESHOLD COMM_BLOCKING COMM_ID COMM_SHRINK_SHARE_RESOURCES
COMM_SPLIT_SHARE_RESOURCES CONF_FILE CONNECT_ROUND_MAX_PEERS CROSS_NIC CTA_POLICY CUMEM_ENABLE
CUMEM_HOST_ENABLE DEBUG DEBUG_FILE DEBUG_SUBSYS DEBUG_TIMESTAMP_FORMAT DEBUG_TIMESTAMP_LEVELS DEV_API_JIT
DISABLE_MEM_MANAGER DMABUF_ENABLE ELASTIC_BUFFER_REGISTER ENABLE_VERSION_CHECK ENV_PLUGIN
GDAKI_USE_RELIABLE_DB GDRCOPY_ENABLE GDRCOPY_FIFO_ENABLE GDRCOPY_FLUSH_ENABLE GDRCOPY_SYNC_ENABLE
GDR_FLUSH_DISABLE GIN_CONNECTION_RAIL GIN_ENABLE GIN_ERROR_QUERY_SEC GIN_GDAKI_MAX_DEST_RD_ATOMIC
GIN_GDAKI_MAX_QP_RD_ATOMIC GIN_GDAKI_NIC_HANDLER GIN_GDAKI_QP_DEPTH GIN_IB_TC GIN_NCONNECTIONS GIN_PLUGIN
GIN_PLUGIN_REF_COUNT GIN_PROXY_QUEUE_SIZE GIN_TYPE GRAPH_DUMP_FILE GRAPH_DUMP_FILE_RANK GRAPH_FILE
GRAPH_HELPER_DISABLE GRAPH_MIXING_SUPPORT GRAPH_REGISTER GRAPH_STREAM_ORDERING GROUP_CUDA_STREAM HOSTID
IBVERBS_LIB IB_ADAPTIVE_ROUTING IB_ADDR_FAMILY IB_ADDR_RANGE IB_AR_THRESHOLD IB_DATA_DIRECT
IB_DEVICE_PCI_ORDER IB_DISABLE IB_ECE_ENABLE IB_FIFO_TC IB_GID_INDEX IB_HCA IB_MERGE_NICS IB_MERGE_VFS
IB_MQP_RETRY_ALL IB_MQP_RETRY_CNT IB_MQP_RETRY_SLEEP_MSEC IB_OOO_RQ IB_PCI_RELAXED_ORDERING IB_PKEY
IB_PREPOST_RECEIVE_WORK_REQUESTS IB_QPS_PER_CONNECTION IB_QUERY_PORT_SPEED IB_RECEIVER_SIDE_MATCHING_SCHEME
IB_RESILIENCY_PORT_FAILOVER IB_RESILIENCY_PORT_FAILOVER_MAX_ATTEMPTS IB_RESILIENCY_PORT_FAILOVER_PROBE_DELAY
IB_RESILIENCY_PORT_RECOVERY IB_RESILIENCY_PORT_RECOVERY_ACK_TIMEOUT
IB_RESILIENCY_PORT_RECOVERY_ALIVE_MSG_BATCH_INTERVAL IB_RESILIENCY_PORT_RECOVERY_ALIVE_MSG_BATCH_SIZE
IB_RESILIENCY_PORT_RECOVERY_ALIVE_MSG_SEQUENCE_SIZE IB_RESILIENCY_PORT_RECOVERY_ALIVE_MSG_TIMEOUT
IB_RESILIENCY_PORT_RECOVERY_ATTEMPTS_MAX IB_RESILIENCY_PORT_RECOVERY_START_DELAY IB_RETRY_CNT
IB_RETURN_ASYNC_EVENTS IB_ROCE_VERSION_NUM IB_ROUTABLE_FLID_GID_INDEX IB_SL IB_SPLIT_DATA_ON_QPS
IB_SUBNET_AWARE_ROUTING IB_SUBNET_PREFIX_LEN IB_TC IB_TIMEOUT IB_USE_INLINE IB_WARN_RAIL_LOCAL
IGNORE_COLLNET_MISMATCH IGNORE_CPU_AFFINITY IGNORE_DISABLED_P2P IGNORE_NET_MISMATCH IPC_USE_ABSTRACT_SOCKET
L1_SHARED_MEMORY_CARVEOUT LAUNCH_MODE LAUNCH_ORDER_IMPLICIT LAUNCH_RACE_FATAL LEGACY_CUDA_REGISTER
LL128_BUFFSIZE LL128_C2C LL128_NTHREADS LL_BUFFSIZE LOCAL_REGISTER LSA_TEAM_SIZE MAX_CTAS MAX_NCHANNELS
MAX_P2P_NCHANNELS MEM_SYNC_DOMAIN MIN_CTAS MIN_NCHANNELS MIN_P2P_NCHANNELS MLOPART_RDMA_ENABLE
MNNVL_CLIQUE_ID MNNVL_CROSS_CLIQUE MNNVL_ENABLE MNNVL_RAIL_PER_HOST MNNVL_SCATTER_NETS_ENABLE MNNVL_UUID
MULTI_RANK_GPU_ENABLE MULTI_SEGMENT_REGISTER NCHANNELS_PER_NET_PEER NET NETDEVS_POLICY NET_DISABLE_INTRA
NET_FORCE_FLUSH NET_FORCE_MERGE NET_GDR_C2C NET_GDR_LEVEL NET_GDR_MLOPART NET_GDR_READ NET_MERGE_LEVEL
NET_MERGE_POLICY NET_OPTIONAL_RECV_COMPLETION NET_OVERHEAD NET_PLUGIN NET_PLUGIN_REF_COUNT
NET_SHARED_BUFFERS NET_SHARED_COMMS NO_CACHE NSOCKS_PERTHREAD NTHREADS NUM_RMA_CTX NVB_DISABLE
NVB_PRECONNECT NVLINK_UTIL_CENTRIC_SCHED_ENABLE NVLSTREE_MAX_CHUNKSIZE NVLS_CHUNKSIZE NVLS_ENABLE
NVLS_NCHANNELS NVTX_DISABLE OOB_NET_ENABLE OOB_NET_IFNAME P2P_DIRECT_DISABLE P2P_DISABLE P2P_EPOCH_ENABLE
P2P_LEVEL P2P_LL_THRESHOLD P2P_MAX_PEERS P2P_NET_CHUNKSIZE P2P_NVL_CHUNKSIZE P2P_PCI_CHUNKSIZE
P2P_PER_CHANNEL_NET_BW P2P_PXN_LEVEL P2P_READ_ENABLE P2P_SCHEDULE_GROUP_SIZE P2P_USE_CUDA_MEMCPY
PARAM_DUMP_ALL PAT_ENABLE PROFILER_PLUGIN PROGRESS_APPENDOP_FREQ PROTO PROXY_APPEND_BATCH_SIZE PROXY_CPUSET
PROXY_DUMP_SIGNAL PXN_C2C PXN_DISABLE RAS_ADDR RAS_ENABLE RAS_TIMEOUT_FACTOR REPORT_CONNECT_PROGRESS
RMA_DISABLE RMA_PLUGIN RMA_PLUGIN_REF_COUNT RMA_PROXY_DUMP_SIGNAL RMA_PROXY_QUEUE_SIZE RUNTIME_CONNECT
SET_CPU_STACK_SIZE SET_STACK_SIZE SET_THREAD_NAME SHADOW_MEMPOOL_MAX_SIZE SHM_DISABLE SHM_LOCALITY
SINGLE_PROC_MEM_REG_ENABLE SOCKET_FAMILY SOCKET_IFNAME SOCKET_INLINE SOCKET_MAGIC SOCKET_MIN_TASKSIZE
SOCKET_NTHREADS SOCKET_POLL_TIMEOUT_MSEC SOCKET_RCVBUF SOCKET_RETRY_CNT SOCKET_RETRY_SLEEP_MSEC
SOCKET_SNDBUF SYM_CE_THRESHOLD SYM_CTAS SYM_GIN_KERNELS_ENABLE SYM_KERNEL SYM_NOWIN_ENABLE
SYM_REUSE_SYSMEM_HANDLES SYM_RS_GIN_CHUNK_SIZE SYM_TMA_ENABLE THREAD_THRESHOLDS TOPO_DUMP_FILE
TOPO_DUMP_FILE_RANK TOPO_FILE TOPO_SPLIT_MLOPART TUNER_PLUGIN UID_STAGGER_RATE UID_STAGGER_THRESHOLD
UNPACK_DOUBLE_NCHANNELS WARN_ENABLE_DEBUG_INFO WIN_ENABLE WIN_STRIDE WORK_ARGS_BYTES WORK_FIFO_BYTES
""".split()
)
KNOWN_NCCL_NAMES = frozenset(f"NCCL_{n}" for n in KNOWN_NCCL)

# NCCL names dropped from NCCL itself (user guide of 2.4-2.12): NCCL ignores them today.
REMOVED_NCCL = {
    "NCCL_IB_GDR_LEVEL": "NCCL_NET_GDR_LEVEL",
    "NCCL_IB_CUDA_SUPPORT": "NCCL_NET_GDR_LEVEL",
    "NCCL_RINGS": "NCCL_MIN_NCHANNELS / NCCL_MAX_NCHANNELS",
    "NCCL_MIN_NRINGS": "NCCL_MIN_NCHANNELS",
    "NCCL_MAX_NRINGS": "NCCL_MAX_NCHANNELS",
    "NCCL_LL_THRESHOLD": "NCCL_PROTO",
    "NCCL_TREE_THRESHOLD": "NCCL_ALGO",
    "NCCL_SINGLE_RING_THRESHOLD": "NCCL_ALGO / NCCL_PROTO",
    "NCCL_CHECKS_DISABLE": "nothing (argument checks are always on)",
}

# torch's ProcessGroupNCCL reads these (torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp, torch 2.13).
KNOWN_TORCH = frozenset(
    """
TORCH_NCCL_ASYNC_ERROR_HANDLING TORCH_NCCL_AVOID_RECORD_STREAMS TORCH_NCCL_BCAST_UNIQUEID
TORCH_NCCL_BLOCKING_WAIT TORCH_NCCL_COORD_CHECK_MILSEC TORCH_NCCL_CUDA_EVENT_CACHE TORCH_NCCL_DESYNC_DEBUG
TORCH_NCCL_DUMP_ON_TIMEOUT TORCH_NCCL_ENABLE_MONITORING TORCH_NCCL_ENABLE_TIMING TORCH_NCCL_EXTRA_DUMP_ON_EXEC
TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC TORCH_NCCL_HIGH_PRIORITY TORCH_NCCL_LOG_CPP_STACK_ON_UNCLEAN_SHUTDOWN
TORCH_NCCL_NAN_CHECK TORCH_NCCL_PROPAGATE_ERROR TORCH_NCCL_RANKS_PER_ROOT TORCH_NCCL_RETHROW_CUDA_ERRORS
TORCH_NCCL_SHOW_EAGER_INIT_P2P_SERIALIZATION_WARNING TORCH_NCCL_TRACE_BUFFER_SIZE TORCH_NCCL_TRACE_CPP_STACK
TORCH_NCCL_USE_COMM_NONBLOCKING TORCH_NCCL_USE_TENSOR_REGISTER_ALLOCATOR_HOOK
TORCH_NCCL_WAIT_TIMEOUT_DUMP_MILSEC TORCH_NCCL_DEBUG_INFO_TEMP_FILE TORCH_NCCL_DEBUG_INFO_PIPE_FILE
TORCH_NCCL_ABORT_IN_DESTROY_PG TORCH_DISTRIBUTED_DEBUG TORCH_DISTRIBUTED_COMPILE_ON_ONE_RANK
TORCH_DISTRIBUTED_USE_TORCHCOMMS TORCH_FR_BUFFER_SIZE TORCH_FR_CPP_STACK TORCH_FR_DUMP_TEMP_FILE
TORCH_GLOO_LAZY_INIT
""".split()
)

# Old spelling -> the name torch reads first today (ProcessGroupNCCL.hpp, FlightRecorder.hpp).
DEPRECATED_TORCH = {
    "NCCL_ASYNC_ERROR_HANDLING": "TORCH_NCCL_ASYNC_ERROR_HANDLING",
    "NCCL_BLOCKING_WAIT": "TORCH_NCCL_BLOCKING_WAIT",
    "NCCL_DESYNC_DEBUG": "TORCH_NCCL_DESYNC_DEBUG",
    "NCCL_ENABLE_TIMING": "TORCH_NCCL_ENABLE_TIMING",
    "NCCL_USE_TENSOR_REGISTER_ALLOCATOR_HOOK": "TORCH_NCCL_USE_TENSOR_REGISTER_ALLOCATOR_HOOK",
    "NCCL_ENABLE_MONITORING": "TORCH_NCCL_ENABLE_MONITORING",
    "NCCL_HEARTBEAT_TIMEOUT_SEC": "TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC",
    "NCCL_TRACE_BUFFER_SIZE": "TORCH_FR_BUFFER_SIZE",
    "TORCH_NCCL_TRACE_BUFFER_SIZE": "TORCH_FR_BUFFER_SIZE",
    "TORCH_NCCL_TRACE_CPP_STACK": "TORCH_FR_CPP_STACK",
}

KNOWN_ALL = KNOWN_NCCL_NAMES | KNOWN_TORCH
TYPO_CUTOFF = 0.85

# Variables that switch a fast transport off: name -> (values that disable, what is lost).
TRANSPORT_KILLERS = {
    "NCCL_P2P_DISABLE": (("1",), "GPU-to-GPU P2P over NVLink/PCIe: traffic goes through host memory"),
    "NCCL_SHM_DISABLE": (("1",), "the shared-memory transport: intra-node traffic falls back to the network"),
    "NCCL_IB_DISABLE": (("1",), "InfiniBand/RoCE: NCCL falls back to TCP sockets (often 10x slower)"),
    "NCCL_P2P_LEVEL": (("LOC", "0"), "P2P entirely (LOC: never use P2P)"),
    "NCCL_NET_GDR_LEVEL": (("LOC", "0"), "GPUDirect RDMA: network traffic is staged through host memory"),
}
NCCL_DEBUG_VALUES = ("VERSION", "WARN", "INFO", "TRACE", "ABORT")
TORCH_DEBUG_VALUES = ("OFF", "INFO", "DETAIL")
# Debug switches: name -> (accepted values, severity, text and fix for any other value, verbose values
# -> the info summary, `{value}` as set).
DEBUG_VARS: dict[str, tuple[tuple[str, ...], Severity, str, str, dict[str, str]]] = {
    "NCCL_DEBUG": (
        NCCL_DEBUG_VALUES,
        Severity.WARN,
        f"is not one of {', '.join(NCCL_DEBUG_VALUES[:4])}",
        "Set NCCL_DEBUG=WARN (INFO while debugging), or unset it.",
        dict.fromkeys(("INFO", "TRACE"), "NCCL_DEBUG={value}: verbose NCCL logs on every rank"),
    ),
    "TORCH_DISTRIBUTED_DEBUG": (
        TORCH_DEBUG_VALUES,
        Severity.FAIL,
        "is not OFF, INFO or DETAIL: `import torch.distributed` raises ValueError",
        "Set TORCH_DISTRIBUTED_DEBUG to OFF, INFO or DETAIL (DETAIL only while debugging), or unset it.",
        {"DETAIL": "TORCH_DISTRIBUTED_DEBUG=DETAIL checks every collective: slower"},
    ),
}

SET = define(
    "nccl_env.set",
    "NCCL / torch.distributed variables",
    "Every NCCL_*, TORCH_NCCL_* and TORCH_DISTRIBUTED_* variable in effect (environment and NCCL config "
    "files): stray settings preset by an image or a cluster profile are a frequent cause of slow or "
    "failing jobs.",
)
TRANSPORT = define(
    "nccl_env.transport_disabled",
    "NCCL transport disabled",
    "NCCL_P2P_DISABLE=1, NCCL_SHM_DISABLE=1, NCCL_IB_DISABLE=1 (and P2P/GDR levels set to LOC) switch off "
    "NCCL's fast paths. They are workarounds for broken hardware or drivers, often left in scripts long "
    "after, and can cut bandwidth by an order of magnitude.",
    "Unset the variable (and remove it from /etc/nccl.conf or ~/.nccl.conf) unless it works around a "
    "problem you can name; measure with `ddpdoctor bench-nccl` with and without it.",
)
DEPRECATED = define(
    "nccl_env.deprecated",
    "Deprecated variable name",
    "torch renamed its NCCL watchdog variables to TORCH_NCCL_* (2.2+) and the flight recorder's to "
    "TORCH_FR_*; NCCL dropped some of its own (NCCL_IB_GDR_LEVEL, NCCL_LL_THRESHOLD, ...). Old names are "
    "ignored or will be.",
    "Rename the variable as suggested, or remove it.",
)
IMAGE_METADATA = define(
    "nccl_env.image_metadata",
    "Container image metadata",
    "NVIDIA's CUDA and NGC container images set NCCL_VERSION (e.g. `ENV NCCL_VERSION 2.21.5-1`) and "
    "NV_LIBNCCL_* to record which libnccl2 package the image installed. NCCL itself reads neither, and "
    "torch's pip wheels bring their own NCCL, whose version can differ.",
    "Nothing to fix; `ddpdoctor check` reports the NCCL torch really loads (torch.nccl).",
)
UNKNOWN = define(
    "nccl_env.unknown",
    "Unknown variable",
    "NCCL and torch silently ignore variables they do not know: a typo (NCCL_SOCKET_IFNAMES, "
    "NCCL_IB_DISABLED) means the setting you think is active is not.",
    "Fix the spelling as suggested (names are in the NCCL user guide, 'Environment Variables').",
)
BAD_VALUE = define(
    "nccl_env.bad_value",
    "Invalid value",
    "NCCL_DEBUG takes VERSION, WARN, INFO or TRACE; TORCH_DISTRIBUTED_DEBUG takes OFF, INFO or DETAIL "
    '(on anything else `import torch.distributed` raises "ValueError: The value of TORCH_DISTRIBUTED_DEBUG must be '
    'OFF, INFO, or DETAIL.").',
    "Use one of the accepted values.",
)
DEBUG = define(
    "nccl_env.debug",
    "Debug settings",
    "NCCL_DEBUG=INFO/TRACE, NCCL_DEBUG_SUBSYS and TORCH_DISTRIBUTED_DEBUG=DETAIL are the right tools while "
    "debugging, and cost log volume and speed (DETAIL adds a consistency check to every collective) in "
    "production.",
    "Remove them from production launch scripts once the problem is solved.",
)
ERROR_HANDLING = define(
    "nccl_env.error_handling",
    "NCCL error handling",
    "With TORCH_NCCL_ASYNC_ERROR_HANDLING=0 (and no blocking wait) a failed or stuck collective is never "
    "detected: ranks hang until the scheduler kills the job, with no error message. "
    "TORCH_NCCL_BLOCKING_WAIT=1 blocks the CPU on every collective (slow).",
    "Unset TORCH_NCCL_ASYNC_ERROR_HANDLING (torch's default, 3, tears the job down on errors) and pass "
    "`timeout=` to init_process_group; use TORCH_NCCL_BLOCKING_WAIT only while debugging.",
)
TOPO_FILES = define(
    "nccl_env.topology_override",
    "NCCL topology override",
    "NCCL_GRAPH_FILE / NCCL_TOPO_FILE replace NCCL's own view of the machine. Images made for one VM type "
    "preset them (e.g. /opt/microsoft/ncv4/graph.xml); on other hardware they cause 'unhandled system "
    "error' or slow rings.",
    "Unset them unless the file was written for exactly this machine type.",
)


CONF_UNREADABLE = define(
    "nccl_env.conf_file.unreadable",
    "NCCL config file unreadable",
    "NCCL reads /etc/nccl.conf, ~/.nccl.conf and the file named by NCCL_CONF_FILE at init. A config file "
    "that is not a regular file (a FIFO, /dev/zero) can block or exhaust memory in every rank; one that "
    "cannot be read, or an NCCL_CONF_FILE that does not exist, is silently ignored by NCCL, so the "
    "settings you think are active are not.",
    "Point NCCL_CONF_FILE at a readable regular file with NAME=value lines, or unset it; fix the "
    "permissions of /etc/nccl.conf or ~/.nccl.conf.",
)
# NCCL config files are a few lines; reading more than this only costs memory (think /dev/zero).
CONF_READ_LIMIT = 65536


@dataclass
class NcclEnvFacts:
    env: dict[str, str] = field(default_factory=dict)
    conf: Optional[dict[str, Any]] = None
    env_recorded: bool = True


def read_conf_file(path: str) -> str:
    """The first CONF_READ_LIMIT bytes of a regular file, decoded leniently.

    Raises FileNotFoundError when absent, and another OSError otherwise, InputRefused (with the file
    type as strerror) for anything but a regular file: a FIFO or device must never be read."""
    return read_user_head(path, CONF_READ_LIMIT).decode(errors="replace")


def read_nccl_conf() -> dict[str, Any]:
    """Equivalent: head -c 65536 /etc/nccl.conf ~/.nccl.conf "$NCCL_CONF_FILE" """
    paths = ["/etc/nccl.conf", str(Path("~/.nccl.conf").expanduser())]
    extra = os.environ.get("NCCL_CONF_FILE")
    if extra:
        paths.append(extra)
    files: dict[str, str] = {}
    unreadable: dict[str, str] = {}
    for p in paths:
        try:
            files[p] = read_conf_file(p)
        except FileNotFoundError:
            if p == extra:  # the defaults are optional; a file named explicitly is not
                unreadable[p] = "does not exist"
        except OSError as exc:
            unreadable[p] = exc.strerror or str(exc)
    return {"files": files, "unreadable": unreadable}


def parse_nccl_conf(text: str) -> dict[str, str]:
    """NAME=value lines of an NCCL config file (comments and junk skipped)."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#") or "=" not in line:
            continue
        name, value = line.split("=", 1)
        name = name.strip()
        if name and name.replace("_", "").isalnum():
            out[name] = value.strip()
    return out


def collect_nccl_env(ctx: Context) -> NcclEnvFacts:
    conf = fact_or_none(ctx.sources, NCCL_CONF_FACT, read_nccl_conf)
    return NcclEnvFacts(
        env=dict(ctx.env), conf=conf if isinstance(conf, dict) else None, env_recorded=ctx.env_recorded
    )


def effective_settings(
    env: Mapping[str, str], conf: Optional[Mapping[str, Any]]
) -> dict[str, tuple[str, str]]:
    """name -> (value, where): config files first, then the environment, which wins (as in NCCL)."""
    out: dict[str, tuple[str, str]] = {}
    files = (conf or {}).get("files") or {}
    if isinstance(files, dict):
        for path, text in files.items():
            for name, value in parse_nccl_conf(str(text)).items():
                if name.startswith("NCCL_"):
                    out[name] = (value, str(path))
    for name, value in env.items():
        if name.startswith(PREFIXES + (IMAGE_PREFIX,)) or name in DEPRECATED_TORCH:
            out[name] = (str(value), "environment")
    return dict(sorted(out.items()))


# Set by the images as package bookkeeping: NCCL_VERSION holds the libnccl2 package version ("2.28.3-1").
_IMAGE_VERSION = re.compile(r"\d+\.\d+(\.\d+)?(-\d+)?([+.][\w.]+)?")
IMAGE_PREFIX = "NV_LIBNCCL_"


def is_image_metadata(name: str, value: str, where: str) -> bool:
    """NCCL_VERSION=<package version> or NV_LIBNCCL_* from the environment: not a setting NCCL reads."""
    if where != "environment":
        return False
    if name.startswith(IMAGE_PREFIX):
        return True
    return name == "NCCL_VERSION" and bool(_IMAGE_VERSION.fullmatch(value.strip()))


def suggest_name(name: str) -> Optional[str]:
    """The closest known name when `name` looks like a typo of it."""
    pool = KNOWN_NCCL_NAMES if name.startswith("NCCL_") else KNOWN_TORCH
    match = difflib.get_close_matches(name, sorted(pool), n=1, cutoff=TYPO_CUTOFF)
    return match[0] if match else None


def _ev(name: str, value: str, where: str) -> list[Evidence]:
    return [Evidence(where, f"{name}={value}")]


def check_settings(settings: Mapping[str, tuple[str, str]]) -> list[Finding]:
    """Judge the effective NCCL/torch settings (pure)."""
    metadata = {n: v for n, (v, w) in settings.items() if is_image_metadata(n, v.strip(), w)}
    settings = {n: vw for n, vw in settings.items() if n not in metadata}
    # The listing and the data name at most MAX_LISTED settings (an environment can hold 140k).
    listed = dict(list(settings.items())[:MAX_LISTED])
    more = len(settings) - len(listed)
    listing = "\n".join(
        f"{n}={v}" + ("" if w == "environment" else f"  (from {w})") for n, (v, w) in listed.items()
    ) + (f"\n... and {more} more" if more else "")
    findings = [
        SET.finding(
            Severity.INFO,
            f"{len(settings)} set: "
            + ", ".join(f"{n}={v}" for n, (v, _) in list(settings.items())[:8])
            + (", ..." if len(settings) > 8 else "")
            if settings
            else "No NCCL_*, TORCH_NCCL_* or TORCH_DISTRIBUTED_* variable set (defaults)",
            evidence=[Evidence("environment, /etc/nccl.conf, ~/.nccl.conf", listing)],
            data={
                "settings": {n: {"value": v, "source": w} for n, (v, w) in listed.items()},
                **({"settings_omitted": more} if more else {}),
            },
        )
    ]
    if metadata:
        shown = ", ".join(f"{n}={v}" for n, v in metadata.items())
        findings.append(
            IMAGE_METADATA.finding(
                Severity.INFO,
                f"{shown[:200]}: set by the container image (NVIDIA CUDA/NGC) to record its NCCL package; "
                "NCCL does not read it",
                evidence=[Evidence("environment", "\n".join(f"{n}={v}" for n, v in metadata.items()))],
                data={"variables": metadata},
            )
        )
    unknown_left = MAX_UNKNOWN_JUDGED
    unjudged: list[str] = []
    for name, (value, where) in settings.items():
        if _is_unknown(name):
            # Each unknown name costs a fuzzy match and a finding: an environment of 140k NCCL_*
            # variables would take minutes and megabytes to say the same thing 140k times.
            if unknown_left <= 0:
                unjudged.append(name)
                continue
            unknown_left -= 1
        findings += _check_one(name, value.strip(), where, settings)
    if unjudged:
        findings.append(
            UNKNOWN.finding(
                Severity.INFO,
                f"{len(unjudged)} more NCCL_*/TORCH_NCCL_* variables that NCCL and torch do not read "
                f"were not judged one by one (the first {MAX_UNKNOWN_JUDGED} were)",
                evidence=[Evidence("environment", "\n".join(unjudged[:20]) + ("\n..." if len(unjudged) > 20 else ""))],
                data={"omitted": len(unjudged), "names": unjudged[:20]},
            )
        )
    return findings


# Settings listed in the `nccl_env.set` finding's evidence and data.
MAX_LISTED = 500
# Unknown variables judged one by one (each with a typo suggestion); the rest are counted in one finding.
MAX_UNKNOWN_JUDGED = 200


def _is_unknown(name: str) -> bool:
    return (
        name.startswith(("NCCL_", "TORCH_NCCL_"))
        and name not in KNOWN_ALL
        and name not in TRANSPORT_KILLERS
        and name not in DEPRECATED_TORCH
        and name not in REMOVED_NCCL
        and name not in DEBUG_VARS
        and name not in ("NCCL_GRAPH_FILE", "NCCL_TOPO_FILE", "TORCH_NCCL_ASYNC_ERROR_HANDLING", "TORCH_NCCL_BLOCKING_WAIT")
    )


def _check_one(name: str, value: str, where: str, settings: Mapping[str, tuple[str, str]]) -> list[Finding]:
    ev = _ev(name, value, where)
    if name in TRANSPORT_KILLERS:
        disabling, lost = TRANSPORT_KILLERS[name]
        if value.upper() in disabling:
            return [TRANSPORT.finding(Severity.WARN, f"{name}={value} disables {lost}", evidence=ev)]
        return []
    if name in DEPRECATED_TORCH or name in REMOVED_NCCL:
        if name in DEPRECATED_TORCH:
            new = DEPRECATED_TORCH[name]
            also = f"; {new} is also set and wins" if new in settings else ""
            text, fix = f"{name} is deprecated: use {new}{also}", f"Rename {name} to {new}."
        else:
            new = REMOVED_NCCL[name]
            text = f"{name} is no longer read by NCCL (replaced by {new})"
            fix = f"Remove {name}; the current equivalent is {new}."
        data = {"name": name, "replacement": new}
        return [DEPRECATED.finding(Severity.WARN, text, evidence=ev, fix=fix, data=data)]
    if name in DEBUG_VARS:
        accepted, bad_severity, bad_text, bad_fix, verbose = DEBUG_VARS[name]
        if value.upper() not in accepted:
            return [BAD_VALUE.finding(bad_severity, f"{name}={value} {bad_text}", evidence=ev, fix=bad_fix)]
        if value.upper() in verbose:
            return [DEBUG.finding(Severity.INFO, verbose[value.upper()].format(value=value), evidence=ev)]
        return []
    if (
        name == "TORCH_NCCL_ASYNC_ERROR_HANDLING"
        and value == "0"
        and settings.get("TORCH_NCCL_BLOCKING_WAIT", ("",))[0] != "1"
    ):
        return [
            ERROR_HANDLING.finding(
                Severity.WARN,
                "TORCH_NCCL_ASYNC_ERROR_HANDLING=0: a failed or stuck collective hangs the job instead of failing",
                evidence=ev,
            )
        ]
    if name == "TORCH_NCCL_BLOCKING_WAIT" and value == "1":
        return [
            ERROR_HANDLING.finding(
                Severity.INFO,
                "TORCH_NCCL_BLOCKING_WAIT=1: the CPU blocks on every collective (debugging aid)",
                evidence=ev,
            )
        ]
    if name in ("NCCL_GRAPH_FILE", "NCCL_TOPO_FILE") and value:
        return [
            TOPO_FILES.finding(
                Severity.INFO, f"{name}={value} overrides NCCL's topology detection", evidence=ev
            )
        ]
    if name in KNOWN_ALL or not name.startswith(("NCCL_", "TORCH_NCCL_")):
        return []
    guess = suggest_name(name)
    if guess:
        return [
            UNKNOWN.finding(
                Severity.WARN,
                f"{name} is not a variable NCCL or torch reads; did you mean {guess}?",
                evidence=ev,
                fix=f"Rename {name} to {guess}.",
                data={"name": name, "suggestion": guess},
            )
        ]
    return [
        UNKNOWN.finding(
            Severity.INFO,
            f"{name} is not in NCCL's or torch's list (a network plugin's variable, or a newer release's?)",
            evidence=ev,
            data={"name": name},
        )
    ]


def check_conf_files(conf: Optional[Mapping[str, Any]]) -> list[Finding]:
    """A finding per NCCL config file that exists (or is named) but could not be read (pure)."""
    unreadable = (conf or {}).get("unreadable") or {}
    if not isinstance(unreadable, dict):
        return []
    return [
        CONF_UNREADABLE.finding(
            Severity.WARN,
            f"NCCL config file {path} was not read: {reason}",
            evidence=[Evidence(f"open({path})", str(reason))],
            data={"path": str(path), "reason": str(reason)},
        )
        for path, reason in sorted(unreadable.items())
    ]


def check_nccl_env(facts: NcclEnvFacts) -> list[Finding]:
    """Judge the NCCL/torch variables and config files (pure)."""
    return check_conf_files(facts.conf) + _check_variables(facts)


def _check_variables(facts: NcclEnvFacts) -> list[Finding]:
    if not facts.env_recorded:
        skipped = ENV_NOT_RECORDED.finding(
            Severity.SKIP, "NCCL / torch.distributed variables not checked: the snapshot holds no env.json"
        )
        # Settings from nccl.conf files are still judged when the snapshot has them.
        return [skipped] + (check_settings(effective_settings({}, facts.conf)) if facts.conf else [])
    return check_settings(effective_settings(facts.env, facts.conf))


AREA = Area(
    name="nccl_env",
    title="NCCL / torch.distributed variables",
    collect=collect_nccl_env,
    judge=check_nccl_env,
    order=45,
)
