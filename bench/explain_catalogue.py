"""Generate ddpdoctor/data/nccl_catalogue.json: every NCCL `WARN(...)` format string, from NCCL's sources.

Reads a git mirror of github.com/NVIDIA/nccl (no work tree needed: blobs are read with `git cat-file`),
takes the newest patch release of each minor 2.7 .. 2.28 that the mirror has, and for each `WARN(...)`
call in src/ whose format is a string literal records

  format     the printf format (adjacent literals joined, `PRIu64`-style macros expanded, other macro
             arguments inside the format shown as `%s`)
  regex      a matcher for the printed message: placeholders become bounded wildcards, anchored at the start
  key        the leading literal word (explain buckets the regexes by it)
  literal    how many literal (non-placeholder, non-space) characters the format has
  class      the mechanism class, from the hand-written RULES below (source path, enclosing function,
             message keywords); nccl.unclassified when no specific rule claims it (there is no catch-all)
  rule       the id of the rule that classed it ('' when unclassified)
  path/line  where the newest release that prints it has it
  function   the function the WARN is in (a column-0 definition before it)
  first/last the first and last release (of those read) that print it

The class -> (title, cause, fix) table is the only other hand-written part (CLASSES). The output also
states coverage: of the distinct WARN formats in the newest 2.28 release, the share a specific rule classed.

    python bench/explain_catalogue.py --mirror /path/to/nccl.git [--out ddpdoctor/data/nccl_catalogue.json]
"""

from __future__ import annotations

import argparse
import bisect
import datetime
import json
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "ddpdoctor" / "data" / "nccl_catalogue.json"
SCHEMA = "ddpdoctor.explain.nccl_catalogue/1"
MINORS = range(7, 29)  # 2.7 .. 2.28: public logs (and older torch wheels) still show 2.7 .. 2.17
GIT_TIMEOUT_S = 120
UNCLASSIFIED = "nccl.unclassified"

# ---------------------------------------------------------------------------------------------- hand-written
# class -> what the report says. Keep each cause/fix about the mechanism, not about one message: the quoted
# message itself is shown beside it.
CLASSES: dict[str, dict[str, str]] = {
    "nccl.ib": {
        "title": "NCCL InfiniBand/RoCE transport error",
        "cause": "NCCL's IB verbs transport (net_ib) failed: a verbs call, a queue pair transition, a "
        "memory registration or a work completion reported an error. Usual causes: a port down or "
        "flapping, a RoCE GID index pointing at an address the peer cannot reach (link-local, wrong "
        "VLAN), mismatched IB settings between nodes, GPUDirect RDMA not usable, or a memlock limit.",
        "fix": "Check `ibstat`/`ibv_devinfo` on both nodes (ports Active, same link layer), set "
        "NCCL_IB_HCA to the right devices and NCCL_IB_GID_INDEX to a routable GID (`show_gids`), "
        "`ulimit -l unlimited`; rerun with NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET. To tell the fabric "
        "from NCCL, run ib_write_bw between the two hosts, or NCCL_IB_DISABLE=1 to fall back to TCP.",
    },
    "nccl.socket": {
        "title": "NCCL socket / bootstrap network error",
        "cause": "NCCL's TCP sockets (bootstrap, or the socket transport) could not find an interface, "
        "connect, accept or exchange data with a peer: a wrong or unreachable interface (docker0, "
        "virbr0, a link-local address), a firewall, a peer that exited, or mismatched addresses.",
        "fix": "Set NCCL_SOCKET_IFNAME (and NCCL_OOB_NET_IFNAME on 2.28+) to the interface the nodes "
        "reach each other on (`ip -br addr`), open the ports between nodes, check MASTER_ADDR resolves "
        "to that interface, and read the first rank that failed: a peer that died makes the others "
        "report connection errors.",
    },
    "nccl.shm": {
        "title": "NCCL shared-memory transport error",
        "cause": "NCCL could not create, size, map or open a shared-memory segment (/dev/shm) or the "
        "cuMem handle it exchanges between local ranks: /dev/shm too small (Docker's 64 MB default), "
        "ranks in different IPC namespaces, or a permission problem.",
        "fix": "Give the container more /dev/shm (`--shm-size=16g` or `--ipc=host`), run local ranks in "
        "the same IPC namespace, or set NCCL_SHM_DISABLE=1 to fall back to another transport.",
    },
    "nccl.p2p": {
        "title": "NCCL peer-to-peer (CUDA IPC) transport error",
        "cause": "NCCL's GPU peer-to-peer transport failed to open or map another GPU's memory: P2P not "
        "supported between these GPUs (consumer cards, PCIe ACS/IOMMU), GPUs in different containers "
        "or cgroups, or a CUDA IPC / cuMem handle that could not be imported.",
        "fix": "Check `nvidia-smi topo -p2p r`; on consumer GPUs or with ACS/IOMMU enabled set "
        "NCCL_P2P_DISABLE=1 (or disable ACS in the BIOS); give every local rank all the GPUs of the "
        "node (same container), or set NCCL_CUMEM_ENABLE=0 when cuMem handles cannot be shared.",
    },
    "nccl.nvls": {
        "title": "NCCL NVLink SHARP / multicast (NVLS) error",
        "cause": "NCCL's NVLS (NVLink SHARP multicast) setup failed: multicast objects not supported by "
        "the driver/fabric manager, not enough multicast memory, or a fabric problem.",
        "fix": "Check the fabric manager and driver versions match (`nvidia-smi -q | grep -i fabric`); "
        "set NCCL_NVLS_ENABLE=0 to run without NVLS.",
    },
    "nccl.proxy": {
        "title": "NCCL proxy thread error",
        "cause": "NCCL's proxy thread (which drives the network and shared-memory transports for each "
        "rank) failed or lost contact with its peer process, usually because another local rank died "
        "or a transport call under it failed.",
        "fix": "Look for the first error of any rank on the node (the proxy error is usually a "
        "consequence); rerun with NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,PROXY,NET to see the call that "
        "failed.",
    },
    "nccl.plugin": {
        "title": "NCCL plugin could not be loaded or initialised",
        "cause": "NCCL failed to load or initialise a plugin (network: libnccl-net.so / aws-ofi-nccl, "
        "tuner, profiler, env): the library is missing from the library path, built for another NCCL "
        "version (ABI), or its own initialisation failed.",
        "fix": "Check NCCL_NET_PLUGIN / NCCL_TUNER_PLUGIN and LD_LIBRARY_PATH; install the plugin built "
        "for this NCCL version, or unset the variable so NCCL uses its internal transports.",
    },
    "nccl.cuda": {
        "title": "CUDA call failed inside NCCL",
        "cause": "A CUDA runtime or driver call made by NCCL failed. The quoted CUDA error names the "
        "mechanism: 'named symbol not found' / 'no kernel image' (NCCL or torch built without kernels "
        "for this GPU's architecture), 'invalid resource handle', out of memory, an illegal address from "
        "an earlier kernel, or a driver/runtime mismatch.",
        "fix": "Read the quoted CUDA error. For missing kernels install a torch/NCCL build whose CUDA "
        "version and arch list include this GPU (`torch.cuda.get_arch_list()`); for driver errors check "
        "`nvidia-smi` and the driver/CUDA versions; rerun with CUDA_LAUNCH_BLOCKING=1 to find the kernel "
        "that failed first.",
    },
    "nccl.topology": {
        "title": "NCCL topology detection or XML error",
        "cause": "NCCL could not build the node's topology (PCI/NVLink/NIC graph) from sysfs, NVML or a "
        "topology/graph XML file: a file NCCL_TOPO_FILE / NCCL_GRAPH_FILE points to is wrong, sysfs is "
        "hidden in the container, or the hardware reports something NCCL does not expect.",
        "fix": "Unset NCCL_TOPO_FILE / NCCL_GRAPH_FILE or fix the file; run the container with /sys "
        "visible; rerun with NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=GRAPH (NCCL_TOPO_DUMP_FILE=topo.xml) to "
        "see what was detected.",
    },
    "nccl.usage": {
        "title": "NCCL API misuse (invalid argument or call order)",
        "cause": "NCCL rejected a call's arguments or order: a null or mismatched buffer, a bad count, "
        "datatype or reduction op, a rank out of range, a communicator used after abort/destroy, or a "
        "group/graph-capture rule broken. In PyTorch this usually means ranks disagree on the collective "
        "(shapes, dtypes, devices) or a tensor is on the wrong device.",
        "fix": "Read the quoted message; run with TORCH_DISTRIBUTED_DEBUG=DETAIL to have PyTorch check "
        "that every rank issues the same collective with the same shapes, and check each rank uses its "
        "own device (torch.cuda.set_device(local_rank)).",
    },
    "nccl.memory": {
        "title": "NCCL memory allocation or registration failed",
        "cause": "NCCL could not allocate or register memory (host, device, cuMem, pinned or "
        "registered buffers): GPU memory exhausted by the application, a memlock limit, or an "
        "allocation API the driver does not support.",
        "fix": "Leave GPU memory for NCCL (smaller batch, PYTORCH_CUDA_ALLOC_CONF), raise the memlock "
        "limit (`ulimit -l unlimited`), or set NCCL_CUMEM_ENABLE=0 when cuMem allocations fail.",
    },
    "nccl.config": {
        "title": "NCCL configuration (environment variable or config) rejected",
        "cause": "An NCCL environment variable or communicator config value could not be parsed or is "
        "not allowed (wrong format, unknown name, value out of range, conflicting settings).",
        "fix": "Fix or unset the variable the message names (`env | grep NCCL_`); see NCCL's "
        "environment variable documentation for the accepted values.",
    },
    "nccl.init": {
        "title": "NCCL communicator initialisation failed",
        "cause": "Creating or splitting the NCCL communicator failed: ranks disagree about the "
        "communicator (unique id, nranks, duplicated rank or GPU), a version mismatch between ranks, "
        "or a step of the initialisation (transport setup, channels) failed.",
        "fix": "Check that every rank runs the same NCCL version, that each rank has its own GPU and "
        "rank number, and that the world size matches the number of ranks started; read the first "
        "WARN of the first rank that failed.",
    },
    "nccl.collnet": {
        "title": "NCCL CollNet / SHARP in-network reduction error",
        "cause": "NCCL's CollNet (in-network reduction, e.g. SHARP through a plugin) failed to set up "
        "or run.",
        "fix": "Set NCCL_COLLNET_ENABLE=0 to run without in-network reduction, and check the SHARP / "
        "collnet plugin installation.",
    },
    "nccl.net": {
        "title": "NCCL network transport error",
        "cause": "NCCL's network transport layer (between the proxy and the net plugin) failed to "
        "connect, register memory or progress a transfer.",
        "fix": "Rerun with NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET,PROXY; check the network plugin "
        "and interfaces (NCCL_SOCKET_IFNAME, NCCL_IB_HCA), and the first rank that failed.",
    },
    "nccl.gdr": {
        "title": "NCCL GPUDirect RDMA (gdrcopy / nv_peer_mem / dma-buf) error",
        "cause": "NCCL's GPUDirect path failed: the gdrcopy library or driver, nvidia-peermem, or "
        "dma-buf support is missing or misbehaves.",
        "fix": "Load nvidia-peermem (`modprobe nvidia-peermem`) or install gdrcopy matching the driver; "
        "NCCL_GDRCOPY_ENABLE=0 / NCCL_NET_GDR_LEVEL=LOC to run without it.",
    },
    "nccl.nvml": {
        "title": "NVML call failed inside NCCL",
        "cause": "NCCL could not load or query NVML (libnvidia-ml.so): the driver's user-space library "
        "is missing in the container, or its version does not match the kernel driver.",
        "fix": "Run the container with the NVIDIA runtime (so libnvidia-ml.so.1 is mounted), check "
        "`nvidia-smi` works where the job runs, and that driver and library versions match.",
    },
    "nccl.system": {
        "title": "System call failed inside NCCL",
        "cause": "An operating-system call NCCL made (open, mmap, fallocate, socket options, pthread, "
        "ioctl) failed; the quoted errno text says why: 'No space left on device' (/dev/shm full), "
        "'Cannot allocate memory' (memlock or host memory), 'Permission denied', 'Too many open files'.",
        "fix": "Act on the quoted errno: more /dev/shm (`--shm-size`), `ulimit -l unlimited` / "
        "`ulimit -n`, permissions of the path named; rerun with NCCL_DEBUG=INFO to see the call.",
    },
    "nccl.internal": {
        "title": "NCCL internal consistency check failed",
        "cause": "An internal NCCL invariant failed (a state NCCL does not expect): often a bug fixed "
        "in a later NCCL release, or the consequence of memory corruption or mixed NCCL versions.",
        "fix": "Upgrade NCCL (pip install nvidia-nccl-cu12 / a newer torch) and make sure every rank "
        "loads the same libnccl (NCCL_DEBUG=VERSION); report it to NVIDIA/nccl with the NCCL_DEBUG=INFO "
        "log if it persists.",
    },
    "nccl.ras": {
        "title": "NCCL RAS subsystem error",
        "cause": "NCCL's RAS (reliability, availability, serviceability) thread could not set up or "
        "talk to its peers; it does not stop collectives by itself.",
        "fix": "Usually a consequence of a network problem; set NCCL_RAS_ENABLE=0 to turn RAS off.",
    },
    "nccl.peer_failure": {
        "title": "NCCL peer failure or abort",
        "cause": "NCCL saw another rank fail or the communicator being aborted / revoked, and stopped "
        "this rank's operation: a consequence of an error elsewhere.",
        "fix": "Find the first rank that failed (its own log) and its first error.",
    },
    "nccl.message_truncated": {
        "title": "NCCL received a longer message than it expected (bootstrap or socket transport)",
        "cause": "A peer sent more bytes than this rank expected at that point of the exchange: the two sides disagree "
        "about what comes next. Printed by the socket transport during a collective (transport/net_socket.cc, "
        "whose 2.27+ text says so itself), the two ranks of a send/recv pair or of a collective posted "
        "operations of different sizes: tensors of another shape or dtype on each side (pipeline-parallel "
        "send/recv of activations whose shape or dtype differs between stages, a collective on tensors that "
        "differ by rank), or NCCL_PROTO/NCCL_ALGO set differently on some ranks. Printed during init "
        "(bootstrap), in NCCL 2.19 and 2.20 it was a known NCCL bug: bootstrap messages of "
        "ncclTransportP2pSetup could be reordered (NCCL 2.21.5 release notes: 'Fix packet reordering issue "
        "causing bootstrap mismatch'; NVIDIA/nccl#1176 saw it intermittently at init on 2.19.3/2.19.4 and not "
        "on 2.18.6); otherwise the ranks run different NCCL versions.",
        "fix": "During training: make both sides of every send/recv and every rank of a collective use the same "
        "shape and dtype (print them per rank; TORCH_DISTRIBUTED_DEBUG=DETAIL checks collectives' shapes) and "
        "the same NCCL_* variables. At init on NCCL 2.19.x or 2.20.x: upgrade to NCCL 2.21.5 or later (a "
        "newer torch wheel or nvidia-nccl-cu12), or go back to 2.18.6; on newer releases check that every "
        "rank loads the same libnccl (NCCL_DEBUG=VERSION).",
    },
    "nccl.teardown": {
        "title": "NCCL communicator teardown error",
        "cause": "Destroying, aborting or reclaiming an NCCL communicator failed (a stream sync, the proxy "
        "stop, an IPC cleanup): usually after an earlier error left the communicator unusable.",
        "fix": "Read the first error before the teardown; call destroy_process_group() once on every rank "
        "after the last collective has completed.",
    },
    UNCLASSIFIED: {
        "title": "NCCL warning",
        "cause": "NCCL printed a warning that the catalogue has no mechanism class for.",
        "fix": "Read the quoted WARN text and the lines just before it; rerun with NCCL_DEBUG=INFO.",
    },
}

# Rules, first match wins: (rule id, source path regex, enclosing function regex, message regex, class); an
# empty regex places no condition. Every rule names a mechanism: a source file or function that implements
# one transport/subsystem, or message words that name it. There is deliberately no catch-all rule (no
# "failed to|error", no "anything else in init.cc"): a format nothing specific claims stays
# nccl.unclassified, and coverage counts only formats a specific rule classed. Each entry records its rule.
RULES: list[tuple[str, str, str, str, str]] = [
    # message names the mechanism, wherever it is printed
    ("msg.message_truncated", r"bootstrap|net_socket", r"", r"(?i)message truncated", "nccl.message_truncated"),
    ("msg.nvls", r"", r"", r"NVLS|NVLink SHARP|[Mm]ulticast|MNNVL|IMEX", "nccl.nvls"),
    # NCCL <= 2.15 creates its segments in include/shm.h: "Error while creating shared memory segment ..."
    ("msg.shm_segment", r"", r"", r"(?i)shared memory segment|munmap of shared memory", "nccl.shm"),
    ("msg.cuda", r"", r"", r"(?i)\bcuda failure|\bcuda (?:error|driver)|cuCtx|cuMem\w*\b.*fail|cudaGetLastError|"
     r"cuGetProcAddress|CUDA driver|cudaDriver|cuda.*symbol|libcuda|CUDA (?:context|device)|cudaArch|"
     r"\bCUDA \d+\.\d+|prior to CUDA", "nccl.cuda"),
    ("msg.nvml", r"", r"", r"(?i)nvml|nvidia-ml", "nccl.nvml"),
    ("msg.config", r"", r"", r"(?i)invalid config|ncclConfig|NCCL_[A-Z0-9_]+=", "nccl.config"),
    ("msg.version", r"", r"", r"(?i)version mismatch|mismatched nccl version", "nccl.init"),
    ("msg.gdr", r"", r"", r"(?i)\bgdr(?:copy)?\b|nv_peer_mem|peermem|gdrcopy", "nccl.gdr"),
    ("msg.env", r"", r"",
     r"(?i)\bNCCL_[A-Z0-9_]+\b.*(?:invalid|unknown|ignor|must|should|out of range|not (?:a|allowed|supported)|"
     r"format|set to)|(?:invalid|unknown|ignoring).*\b(?:env|environment|NCCL_[A-Z_]+)", "nccl.config"),
    ("msg.peer_failure", r"", r"",
     r"(?i)\b(?:revoked|aborted|abort(?:ing)?\b|peer .*(?:failed|died)|remote (?:process|peer)|"
     r"connection closed by)", "nccl.peer_failure"),
    ("msg.plugin", r"", r"", r"(?i)\bplugin\b|dlopen|dlsym|\.so\b|load.*librar", "nccl.plugin"),
    ("msg.syscall", r"checks\.h", r"", r"Call to", "nccl.system"),
    # by source file: files that implement one transport or subsystem
    ("file.ib", r"transport/net_ib|/ibvwrap|ibvsymbols|mlx5dv|/ibvcore|net_ib/", r"", r"", "nccl.ib"),
    ("file.socket", r"misc/socket|bootstrap|transport/net_socket|ipcsocket|misc/net\.cc|/socket\.h", r"", r"",
     "nccl.socket"),
    ("file.shm", r"transport/shm|shmutils|shmem", r"", r"", "nccl.shm"),
    ("file.p2p", r"transport/p2p", r"", r"", "nccl.p2p"),
    ("file.nvls", r"nvls", r"", r"", "nccl.nvls"),
    ("file.collnet", r"coll_net|collnet", r"", r"", "nccl.collnet"),
    ("file.net", r"transport/net\.cc|(?:^|/)gin|gdaki", r"", r"", "nccl.net"),
    ("file.proxy", r"^src/proxy|/proxy", r"", r"", "nccl.proxy"),
    ("file.plugin", r"plugin/|net_v\d|tuner|profiler", r"", r"", "nccl.plugin"),
    ("file.cuda", r"cudawrap|cudalib|strongstream|cuda_|dev_runtime|launch_kernel", r"", r"", "nccl.cuda"),
    ("file.nvml", r"nvmlwrap", r"", r"", "nccl.nvml"),
    ("file.gdr", r"gdrwrap", r"", r"", "nccl.gdr"),
    ("file.topology", r"graph/|topo|xml|mnnvl", r"", r"", "nccl.topology"),
    ("file.ras", r"ras/", r"", r"", "nccl.ras"),
    ("file.argcheck", r"argcheck", r"", r"", "nccl.usage"),
    ("file.group", r"group\.cc", r"", r"", "nccl.usage"),
    ("file.allocator", r"allocator|include/alloc\.h", r"", r"", "nccl.memory"),
    ("file.register", r"src/register", r"", r"", "nccl.memory"),
    ("file.param", r"param|env\.cc|/env", r"", r"", "nccl.config"),
    # generic files (enqueue.cc, init.cc, transport.cc, utils.cc, ...): the enclosing function or the message
    # must name the mechanism
    ("func.redop", r"enqueue", r"ncclRedOp", r"", "nccl.usage"),
    ("func.symmetric", r"symmetric|sym_kernels", r"", r"", "nccl.usage"),
    ("func.comm_init_args", r"init\.cc", r"^ncclCommInit|^ncclCommInitRank|^ncclCommInitAll|^ncclInit|commAlloc$",
     r"(?i)invalid|exceeds|improper usage|requested", "nccl.usage"),
    ("func.comm_destroy", r"init\.cc", r"(?i)destroy|reclaim|abort|revoke|finalize|commCleanup|commFree", r"",
     "nccl.teardown"),
    ("func.init_ranks", r"init\.cc", r"initTransportsRank|ncclCommInitRankFunc|^ncclCommInit|commAlloc|"
     r"ncclCommSplit|ncclCommShrink|ncclCommInitChildComm|computeBuffSizes|devCommSetup", r"", "nccl.init"),
    ("msg.duplicate_gpu", r"", r"", r"(?i)duplicate GPU|both on CUDA device", "nccl.init"),
    ("msg.no_transport", r"", r"", r"No transport found", "nccl.init"),
    ("msg.async_error", r"", r"", r"(?i)ncclCommSetAsyncError|already been destroyed|before the previous operation",
     "nccl.usage"),
    ("msg.alloc", r"", r"", r"(?i)\b(?:c|m|re)alloc\b|\bmalloc\(|\bmmap\b|posix_memalign|allocation failed|"
     r"out of memory|Failed to (?:CUDA )?(?:host )?(?:c|m)?alloc", "nccl.memory"),
    ("msg.selfsend", r"enqueue", r"", r"(?i)send to self|recv to self|without a matching", "nccl.usage"),
    ("msg.graph_capture", r"", r"", r"(?i)captured|graph capture|CUDA graph", "nccl.usage"),
    # NCCL <= 2.12's enqueue.cc: more operations in one group than it can hold, or streams mixed in a group
    ("msg.too_many_ops", r"enqueue", r"", r"(?i)mixing different streams|too many (?:async operations|"
     r"aggregated operations|collectives|work elements)", "nccl.usage"),
    ("func.comm_config", r"init\.cc", r"parseCommConfig", r"", "nccl.config"),
    ("msg.algo", r"enqueue|tuning", r"", r"(?i)no algorithm|algorithm/protocol|Unknown pattern", "nccl.internal"),
    ("msg.datatype", r"", r"", r"(?i)\bdata ?type\b|reduction op|FP8", "nccl.usage"),
    ("msg.collnet", r"", r"", r"CollNet|\bsharp\b", "nccl.collnet"),
    ("msg.gin", r"", r"", r"\bGIN\b", "nccl.net"),
    ("msg.pthread", r"", r"", r"(?i)pthread_|\bthread\b.*fail", "nccl.system"),
    ("msg.internal", r"", r"", r"(?i)has bugs|should not happen|internal error|corrupted|garbage|List loop|"
     r"Inactive op", "nccl.internal"),
]
_RULES = [
    (rid, re.compile(p), re.compile(f), re.compile(m), c) for rid, p, f, m, c in RULES
]

# ---------------------------------------------------------------------------------------------- extraction
_WARN_CALL = re.compile(r"(?<![\w])WARN\s*\(")
_STRING = re.compile(r'"((?:[^"\\\n]|\\.)*)"')
_IDENT = re.compile(r"[A-Za-z_]\w*")
_COMMENT = re.compile(r"//[^\n]*|/\*.*?\*/", re.DOTALL)
_PRI = re.compile(r"PRI([diouxX])(8|16|32|64|PTR|MAX)")
# printf conversion: flags, width, precision, length, conversion
_SPEC = re.compile(r"%([-+ #0]*)(\d+|\*)?(?:\.(\d+|\*))?(hh|h|ll|l|L|z|j|t|q)?([diouxXeEfFgGaAcspn%])")
_ESCAPES = {"n": "\n", "t": "\t", '"': '"', "\\": "\\", "'": "'", "r": "\r"}


def _unescape(s: str) -> str:
    return re.sub(r"\\(.)", lambda m: _ESCAPES.get(m.group(1), m.group(1)), s)


def _format_of_call(text: str, start: int) -> str | None:
    """The format argument of the WARN( call whose argument list starts at `start`: adjacent string
    literals joined, PRIxNN macros expanded, other identifiers between literals (a macro parameter such as
    `"Call to " name " failed"`) shown as %s. None when the format is not built from literals."""
    pos = start
    parts: list[str] = []
    literal = False
    n = len(text)
    while pos < n:
        ch = text[pos]
        if ch in " \t\r\n\\":
            pos += 1
            continue
        if text.startswith("//", pos) or text.startswith("/*", pos):
            m = _COMMENT.match(text, pos)
            pos = m.end() if m else n
            continue
        if ch == '"':
            m = _STRING.match(text, pos)
            if not m:
                return None
            parts.append(_unescape(m.group(1)))
            literal = True
            pos = m.end()
            continue
        m = _IDENT.match(text, pos)
        if m:
            pri = _PRI.fullmatch(m.group())
            parts.append(("ll" + pri.group(1)) if pri else "%s")
            pos = m.end()
            continue
        if ch in ",)":
            break
        return None  # an expression (a variable, a ternary): not a literal format
    if not literal:
        return None
    fmt = "".join(parts)
    return fmt if fmt.strip() else None


def _wild(spec: re.Match[str]) -> str:
    flags, _width, _prec, _length, conv = spec.groups()
    if conv == "%":
        return "%"
    if conv in "di":
        return r"[-+]?\s{0,20}\d{1,20}"
    if conv == "u":
        return r"\s{0,20}\d{1,20}"
    if conv in "xX":
        return r"\s{0,20}(?:0[xX])?[0-9a-fA-F]{1,16}"
    if conv == "o":
        return r"\s{0,20}[0-7]{1,22}"
    if conv == "p":
        return r"(?:0x[0-9a-fA-F]{1,16}|\(nil\)|0)"
    if conv in "eEfFgGaA":
        return r"\s{0,20}[-+]?(?:[0-9.]{1,40}(?:[eE][-+]?\d{1,4})?|nan|inf)"
    if conv == "c":
        return r"."
    if conv == "n":
        return ""
    return r".{0,200}?"  # %s, %.*s


def format_to_regex(fmt: str) -> str:
    """A regex for the message NCCL prints with `fmt`, anchored at its start: literal text escaped
    (whitespace runs matched loosely: logs rewrap and strip), placeholders as bounded wildcards."""
    out: list[str] = []
    pos = 0
    for m in _SPEC.finditer(fmt):
        out.append(_literal(fmt[pos : m.start()]))
        out.append(_wild(m))
        pos = m.end()
    out.append(_literal(fmt[pos:]))
    body = "".join(out)
    # A trailing newline or spaces in the format are never part of the matched line.
    body = re.sub(r"(?:\\s\+)+$", "", body)
    return "^" + body


def _literal(text: str) -> str:
    pieces = re.split(r"\s+", text)
    return r"\s+".join(re.escape(p) for p in pieces)


def leading_key(fmt: str) -> str:
    """The literal word the format starts with ([A-Za-z0-9_/]); '' when it starts with a placeholder or
    the word runs into one (its printed form would differ)."""
    m = re.match(r"\s*([A-Za-z0-9_/]+)", fmt)
    if not m:
        return ""
    after = fmt[m.end() : m.end() + 1]
    return "" if after == "%" else m.group(1)


def literal_chars(fmt: str) -> int:
    """How many non-space characters of `fmt` are literal: explain matches only formats with at least
    MIN_LITERAL of them (`%s` alone, or `%s: %s`, would claim every WARN line) and prefers the format
    with the most when several match."""
    return len(re.sub(r"\s", "", _SPEC.sub("", fmt)))


def classify(path: str, function: str, fmt: str) -> tuple[str, str]:
    """(class, rule id) of a format printed from `function` in `path`; (nccl.unclassified, "") when no
    specific rule claims it."""
    for rid, path_rx, func_rx, msg_rx, cls in _RULES:
        if path_rx.search(path) and func_rx.search(function) and msg_rx.search(fmt):
            return cls, rid
    return UNCLASSIFIED, ""


# A function definition starts at column 0: `[static] type name(` with `{` before any `;` after it.
_FUNC_START = re.compile(r"^(?![ \t#/{}])[^\n;{}()#]*?\b([A-Za-z_][\w:~]*)\s*\(", re.MULTILINE)
_NOT_FUNCS = frozenset({"if", "for", "while", "switch", "return", "sizeof", "NCCL_API", "NCCL_PARAM"})


def function_starts(text: str) -> list[tuple[int, str]]:
    """(offset, name) of each function definition in a C/C++ source, in order."""
    out: list[tuple[int, str]] = []
    for m in _FUNC_START.finditer(text):
        name = m.group(1)
        if name in _NOT_FUNCS:
            continue
        brace, semi = text.find("{", m.end()), text.find(";", m.end())
        if brace >= 0 and (semi < 0 or brace < semi):
            out.append((m.start(), name.rsplit("::", 1)[-1]))
    return out


def enclosing_function(starts: list[tuple[int, str]], offset: int) -> str:
    i = bisect.bisect_right([o for o, _ in starts], offset) - 1
    return starts[i][1] if i >= 0 else ""


def _git(mirror: Path, *args: str, data: bytes | None = None) -> bytes:
    return subprocess.run(
        ["git", "-C", str(mirror), *args], input=data, capture_output=True, check=True, timeout=GIT_TIMEOUT_S
    ).stdout


def release_tags(mirror: Path) -> list[str]:
    """The newest patch release tag of each minor 2.7 .. 2.28 in the mirror (vMAJ.MIN.PATCH-N)."""
    best: dict[int, tuple[tuple[int, int], str]] = {}
    for tag in _git(mirror, "tag", "--list", "v2.*").decode().split():
        m = re.fullmatch(r"v2\.(\d+)\.(\d+)-(\d+)", tag)
        if not m or int(m.group(1)) not in MINORS:
            continue
        key = (int(m.group(2)), int(m.group(3)))
        minor = int(m.group(1))
        if minor not in best or key > best[minor][0]:
            best[minor] = (key, tag)
    return [best[k][1] for k in sorted(best)]


def warn_formats(mirror: Path, tag: str) -> list[tuple[str, int, str, str]]:
    """(path, line, enclosing function, format) of every literal-format WARN( call in src/ at `tag`."""
    listing = _git(mirror, "ls-tree", "-r", "--name-only", tag, "--", "src").decode().split("\n")
    paths = [p for p in listing if re.search(r"\.(cc|c|cu|cpp|h|hpp|cuh)$", p)]
    out: list[tuple[str, int, str, str]] = []
    blobs = _git(mirror, "cat-file", "--batch", data="".join(f"{tag}:{p}\n" for p in paths).encode())
    pos = 0
    for path in paths:
        header_end = blobs.index(b"\n", pos)
        size = int(blobs[pos:header_end].split()[2])
        text = blobs[header_end + 1 : header_end + 1 + size].decode("utf-8", "replace")
        pos = header_end + 1 + size + 1
        if "WARN" not in text:
            continue
        starts = function_starts(text)
        for m in _WARN_CALL.finditer(text):
            line_start = text.rfind("\n", 0, m.start()) + 1
            if text[line_start : m.start()].lstrip().startswith(("//", "#define WARN", "*")):
                continue  # a comment or the macro's own definition
            fmt = _format_of_call(text, m.end())
            if fmt is None:
                continue
            out.append((path, text.count("\n", 0, m.start()) + 1, enclosing_function(starts, m.start()), fmt))
    return out


def build(mirror: Path) -> dict[str, Any]:
    tags = release_tags(mirror)
    if not tags:
        raise SystemExit(f"no v2.7 .. v2.28 release tags in {mirror}")
    commits = {t: _git(mirror, "rev-parse", f"{t}^{{commit}}").decode().strip() for t in tags}
    entries: dict[str, dict[str, Any]] = {}
    for tag in tags:
        version = tag[1:].split("-")[0]
        for path, line, func, fmt in warn_formats(mirror, tag):
            e = entries.get(fmt)
            if e is None:
                e = entries[fmt] = {"format": fmt, "first": version, "paths": {}}
            e["last"] = version
            e["paths"][path] = (line, func)  # newest release wins
    newest = tags[-1][1:].split("-")[0]
    out_entries = []
    for fmt, e in sorted(entries.items(), key=lambda kv: (sorted(kv[1]["paths"])[0], kv[0])):
        path = sorted(e["paths"])[0]
        line, func = e["paths"][path]
        cls, rule = classify(path, func, fmt)
        regex = format_to_regex(fmt)
        re.compile(regex)
        out_entries.append(
            {
                "format": fmt,
                "regex": regex,
                "key": leading_key(fmt),
                "literal": literal_chars(fmt),
                "class": cls,
                "rule": rule,
                "path": path,
                "line": line,
                "function": func,
                "first": e["first"],
                "last": e["last"],
            }
        )
    current = [e for e in out_entries if e["last"] == newest]
    classified = sum(1 for e in current if e["class"] != UNCLASSIFIED and e["rule"])
    by_rule = Counter(e["rule"] or "(none: unclassified)" for e in current)
    return {
        "schema": SCHEMA,
        "provenance": {
            "repo": "https://github.com/NVIDIA/nccl",
            "releases": {t: commits[t] for t in tags},
            "scope": "WARN(...) calls with a literal format in src/ (*.cc, *.cu, *.h)",
            "generated": datetime.date.today().isoformat(),
            "script": "bench/explain_catalogue.py",
            "hand_written": "CLASSES (class -> title, cause, fix) and RULES (source path / function / keywords -> class)",
        },
        "coverage": {
            "release": tags[-1],
            "warn_formats": len(current),
            "classified": classified,
            "ratio": round(classified / len(current), 4) if current else 0.0,
            "definition": "distinct WARN formats of the release classed by a specific rule (no catch-all "
            "rule exists) / all distinct WARN formats of the release",
            "by_rule": dict(sorted(by_rule.items())),
        },
        "rules": [
            {"id": rid, "path": p, "function": f, "message": m, "class": c} for rid, p, f, m, c in RULES
        ],
        "classes": CLASSES,
        "entries": out_entries,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mirror", required=True, type=Path, help="git directory of github.com/NVIDIA/nccl")
    ap.add_argument("--out", type=Path, default=OUT, help=f"output (default {OUT.relative_to(ROOT)})")
    ap.add_argument("--unclassified", action="store_true", help="list the 2.28 formats left unclassified")
    args = ap.parse_args(argv)
    doc = build(args.mirror)
    args.out.write_text(json.dumps(doc, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    cov = doc["coverage"]
    print(
        f"{len(doc['entries'])} formats over {len(doc['provenance']['releases'])} releases; "
        f"{cov['release']}: {cov['classified']}/{cov['warn_formats']} classified ({cov['ratio']:.1%})"
    )
    if args.unclassified:
        for e in doc["entries"]:
            if e["class"] == UNCLASSIFIED and e["last"] == cov["release"][1:].split("-")[0]:
                print(f"  {e['path']}:{e['line']} {e['function']}(): {e['format']!r}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
