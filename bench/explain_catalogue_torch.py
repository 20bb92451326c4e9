"""Generate ddpdoctor/data/torch_catalogue.json: the messages PyTorch's c10d / elastic, gloo, NCCL's result codes
and the CUDA runtime print, from their sources.

Sources (each recorded in the output's provenance with its repository, commit or package version):

  pytorch    a git directory holding pytorch/pytorch's tree (--pytorch; the commit and version.txt are
             recorded), and the installed torch wheel (--torch-site: the site-packages holding `torch`; its
             torch/distributed/*.py and torch/include/torch/csrc/distributed/c10d/*.hpp are pytorch's files
             at torch.version.git_version). Read: torch/csrc/distributed/c10d/ (C++: TORCH_CHECK,
             TORCH_CHECK_WITH, C10_THROW_ERROR, C10D_THROW_ERROR, TORCH_WARN, C10D_ERROR/WARNING, LOG(ERROR|WARNING)
             << ...) and torch/distributed/{*.py,elastic/,launcher/} (Python: `raise X(msg)`,
             logger.error/warning/exception/critical, warnings.warn), parsed with `ast`.
  gloo       a git directory of github.com/pytorch/gloo (--gloo): GLOO_ENFORCE*, GLOO_THROW*, GLOO_ERROR/WARN.
  nccl       a git directory of github.com/NVIDIA/nccl (--nccl): ncclResult_t names (src/nccl.h.in) and the
             texts ncclGetErrorString returns (src/init.cc), at the newest patch release of 2.18 .. 2.28.
  cuda       the nvidia-cuda-runtime-cu12 wheel from PyPI, unpacked (--cudart: the folder holding include/
             and lib/): cudaError_t names and values from include/driver_types.h, and the text
             cudaGetErrorString returns for each (libcudart answers without a GPU).

A message is a template: literal text and argument pieces (`c10::str` / `<<` / `+` operands that are not
string literals, f-string fields, `{}` of fmt, printf `%s` of logging). Arguments become bounded wildcards.
A multi-line message is matched on its line with the most literal text. Entries whose matched line has fewer
than MIN_LITERAL literal characters are kept (they count in coverage) but never matched.

Only CLASSES (class -> title, cause, fix, role) and RULES (source path / message keywords -> class) are written
by hand; there is no catch-all rule. Coverage is stated per source: distinct messages, how many a rule classed.

    python bench/explain_catalogue_torch.py --pytorch PYTORCH.git --torch-site .venv/lib/python3.X/site-packages \\
        --gloo GLOO.git --nccl NCCL.git --cudart /path/to/unpacked/nvidia/cuda_runtime [--unclassified]
    python bench/explain_catalogue_torch.py --reclassify   # after a change of CLASSES or RULES only
"""

from __future__ import annotations

import argparse
import ast
import ctypes
import datetime
import json
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any, Iterable, Iterator, Union

sys.path.insert(0, str(Path(__file__).resolve().parent))
from explain_catalogue import release_tags  # noqa: E402  (the NCCL generator's release picker)

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "ddpdoctor" / "data" / "torch_catalogue.json"
SCHEMA = "ddpdoctor.explain.torch_catalogue/1"
GIT_TIMEOUT_S = 120
UNCLASSIFIED = "torch.unclassified"
MIN_LITERAL = 16  # literal characters of the matched line; "Timed out" or "%s: %s" would claim any line
MIN_NEEDLE = 10
MAX_NEEDLE = 24  # the lookup needle: enough to pick candidates (their matchers decide), short to keep its trie small
MAX_KEYWORD = 48
# The prefilter's rule (ddpdoctor/explain/kb.py): a keyword never starts with one of these bytes.
SLOW_FIRST = frozenset("abcdefghiklmnoprstuvwy0123456789 \t-_:.,/")
WILD = "{*}"
# Calls that print a warning: the program goes on, so the message is a hint for explain, never a root cause.
WARNING_KINDS = frozenset({"TORCH_WARN", "TORCH_WARN_ONCE", "LOG(WARNING)", "C10D_WARNING", "GLOO_WARN",
                           "logger.warning", "logger.warn", "warnings.warn"})

# ---------------------------------------------------------------------------------------------- hand-written
# role: root (a cause), symptom (what a rank sees when something else failed), consequence (a restart or a
# kill that follows a failure). Symptoms and consequences are never reported as the root cause.
CLASSES: dict[str, dict[str, str]] = {
    "c10d.network": {
        "role": "root",
        "title": "Network address, interface or port problem (c10d / gloo sockets)",
        "cause": "A socket could not be created, bound, resolved or connected: the interface named in "
        "GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME does not exist (it takes exact names: NCCL's `^lo` exclusion "
        "syntax is not understood by gloo), the host name resolves to a loopback or unreachable address, the "
        "port is taken, or a firewall drops the connection.",
        "fix": "Set MASTER_ADDR to an address every node reaches and a free MASTER_PORT; set GLOO_SOCKET_IFNAME "
        "(exact interface names, comma-separated) and NCCL_SOCKET_IFNAME to the interface the nodes share "
        "(`ip -br addr`); make `hostname -i` resolve to that address, not 127.0.1.1; open the ports between "
        "nodes.",
    },
    "c10d.store": {
        "role": "root",
        "title": "c10d store (TCPStore / FileStore) could not be reached or answered too late",
        "cause": "The key-value store the ranks use to find each other (TCPStore on MASTER_ADDR:MASTER_PORT, or "
        "a FileStore) did not answer: the store's host (rank 0 or the torchrun agent) is not running yet or "
        "has exited, MASTER_ADDR/MASTER_PORT differ between ranks, the store timed out waiting for ranks "
        "that never arrived, or a FileStore's file is stale or on a file system without locking.",
        "fix": "Start all ranks with the same MASTER_ADDR/MASTER_PORT and world size, check that rank 0 (the "
        "store host) is alive and reachable (`nc -zv MASTER_ADDR MASTER_PORT`), delete a stale FileStore "
        "file, and read the first failure of the rank that hosts the store.",
    },
    "c10d.rendezvous": {
        "role": "root",
        "title": "torchrun / elastic rendezvous failed",
        "cause": "The elastic rendezvous could not form the group: nodes disagree on --nnodes, --rdzv-id, "
        "--rdzv-endpoint or the backend, the rendezvous endpoint is unreachable, it closed (a node finished or "
        "failed), or too few nodes joined before --rdzv-timeout / join_timeout.",
        "fix": "Give every node the same --nnodes, --rdzv-id, --rdzv-backend and --rdzv-endpoint (with c10d "
        "rendezvous torchrun ignores --master-addr/--master-port); check the endpoint host:port is reachable "
        "from every node; raise the join timeout when nodes start slowly; use a new --rdzv-id for a new job.",
    },
    "c10d.usage": {
        "role": "root",
        "title": "torch.distributed API misuse (tensors, ranks, groups, arguments)",
        "cause": "A collective or process-group call was given arguments c10d rejects: tensors of different "
        "sizes, dtypes or devices across the inputs or ranks, non-contiguous or sparse tensors, a rank or group "
        "size out of range, a process group used before init_process_group / after destroy, or an operation "
        "the backend does not support.",
        "fix": "Read the quoted message; make every rank call the same collectives with tensors of the same "
        "shape and dtype on its own device (torch.cuda.set_device(local_rank)); run with "
        "TORCH_DISTRIBUTED_DEBUG=DETAIL to have c10d check the collectives across ranks.",
    },
    "c10d.env": {
        "role": "root",
        "title": "torch.distributed environment variable missing or invalid",
        "cause": "An environment variable c10d or torchrun reads (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT, "
        "LOCAL_RANK, TORCH_NCCL_*, GLOO_*) is missing, empty or not a valid value: the script was started "
        "without a launcher (plain `python` instead of torchrun), or a value is misspelled.",
        "fix": "Start the job with torchrun (or set RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT for each "
        "process); fix or unset the variable the message names.",
    },
    "c10d.nccl": {
        "role": "root",
        "title": "ProcessGroupNCCL could not create or use its NCCL communicator",
        "cause": "ProcessGroupNCCL's NCCL call failed (communicator creation, a collective, or a split): the "
        "quoted NCCL error says which kind; the NCCL_DEBUG=INFO log of the first failing rank has the WARN "
        "that names the mechanism.",
        "fix": "Rerun with NCCL_DEBUG=INFO (NCCL_DEBUG_SUBSYS=INIT,NET) and read the first `NCCL WARN` of the "
        "first rank that failed; check every rank uses its own GPU and the same NCCL version.",
    },
    "c10d.peer_failure": {
        "role": "symptom",
        "title": "A peer closed the connection or the communicator was aborted",
        "cause": "This rank's transport (gloo pair, TCPStore socket, NCCL communicator) saw its peer close the "
        "connection, reset it, or abort: a consequence of another rank having failed or been killed first.",
        "fix": "Find the first rank that failed (its own log, torchrun's `Root Cause` block) and its first "
        "error; this message only says that a peer is gone.",
    },
    "c10d.timeout": {
        "role": "symptom",
        "title": "A collective, store wait or connection timed out",
        "cause": "c10d or gloo gave up waiting: a collective, barrier, store key or connection did not "
        "complete within the timeout because some rank never got there (it crashed, hung, or runs a "
        "different sequence of collectives) or the network between ranks is blocked.",
        "fix": "Find the rank that did not arrive (its log, py-spy dump, TORCH_NCCL_DESYNC_DEBUG=1 / the "
        "flight recorder); raise the timeout only if the ranks are known to be merely slow.",
    },
    "c10d.worker_failure": {
        "role": "consequence",
        "title": "torchrun / elastic agent reports a worker failed or was stopped",
        "cause": "The elastic agent or torch.multiprocessing reports that a worker process exited, was "
        "signalled or is being stopped: it tells what happened to a process, not why it failed.",
        "fix": "Read the failing worker's own error above (or its error_file / the `Root Cause` block); a "
        "SIGTERM sent to the siblings follows the first failure.",
    },
    "c10d.device": {
        "role": "root",
        "title": "Rank-to-GPU mapping problem in ProcessGroupNCCL",
        "cause": "ProcessGroupNCCL could not tell or use the rank's GPU: no device was set, two ranks use the "
        "same GPU, a tensor is on another GPU than the communicator, or device_id does not match.",
        "fix": "Call torch.cuda.set_device(local_rank) (or pass device_id=torch.device('cuda', local_rank) to "
        "init_process_group) before the first collective; give each rank one GPU.",
    },
    "gloo.transport": {
        "role": "root",
        "title": "gloo TCP transport error",
        "cause": "gloo's TCP transport failed to set up or run a pair connection (address, interface, "
        "read/write, protocol state): usually a wrong interface or address (GLOO_SOCKET_IFNAME, the host name "
        "resolving to 127.0.0.1), a firewall, or a peer that exited.",
        "fix": "Set GLOO_SOCKET_IFNAME to the interface the nodes share, make MASTER_ADDR / the host name "
        "resolve to that interface's address, and read the first rank that failed.",
    },
    "ncclres.system": {
        "role": "root",
        "title": "NCCL returned 'unhandled system error'",
        "cause": "An operating-system or network call inside NCCL failed (ncclSystemError): a socket that could "
        "not connect, /dev/shm too small, a memlock limit, an IB device problem. The WARN lines NCCL printed "
        "before it name the call.",
        "fix": "Rerun with NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET and read the first `NCCL WARN`; check "
        "NCCL_SOCKET_IFNAME, /dev/shm size (`--shm-size`, `--ipc=host`) and `ulimit -l`.",
    },
    "ncclres.cuda": {
        "role": "root",
        "title": "NCCL returned 'unhandled cuda error'",
        "cause": "A CUDA call inside NCCL failed (ncclUnhandledCudaError): an earlier kernel fault, out of "
        "memory, a GPU without P2P/IPC support, or NCCL/torch built without kernels for this GPU.",
        "fix": "Rerun with NCCL_DEBUG=INFO to see the CUDA error NCCL got (`Cuda failure '...'`), and "
        "CUDA_LAUNCH_BLOCKING=1 to find an earlier faulting kernel; check the GPU's architecture is in "
        "torch.cuda.get_arch_list().",
    },
    "ncclres.usage": {
        "role": "root",
        "title": "NCCL returned 'invalid argument' / 'invalid usage'",
        "cause": "NCCL rejected the arguments or order of a call (ncclInvalidArgument / ncclInvalidUsage): "
        "ranks disagreeing on a collective, a tensor on the wrong device, two ranks on one GPU, or a "
        "communicator used after it failed.",
        "fix": "Run with NCCL_DEBUG=WARN to see what NCCL rejected and TORCH_DISTRIBUTED_DEBUG=DETAIL to check "
        "the collectives across ranks; give each rank its own GPU.",
    },
    "ncclres.internal": {
        "role": "root",
        "title": "NCCL returned 'internal error'",
        "cause": "NCCL hit an internal inconsistency (ncclInternalError): a bug fixed in a later release, "
        "mixed NCCL versions across ranks, or the consequence of memory corruption.",
        "fix": "Check every rank loads the same NCCL (NCCL_DEBUG=VERSION); upgrade NCCL / torch; read the first "
        "`NCCL WARN` with NCCL_DEBUG=INFO.",
    },
    "ncclres.remote": {
        "role": "symptom",
        "title": "NCCL returned 'remote process exited or there was a network error'",
        "cause": "NCCL lost a peer (ncclRemoteError): another rank exited or the network between them failed. "
        "It is what this rank saw, not why the peer went away.",
        "fix": "Find the first rank that failed and its first error; if none did, check the network "
        "(ibstat, dmesg on both nodes) around that time.",
    },
    "cuda.arch": {
        "role": "root",
        "title": "No CUDA kernel for this GPU (build or architecture mismatch)",
        "cause": "The CUDA binary has no kernel (SASS or usable PTX) for this GPU's architecture: torch, NCCL "
        "or an extension was built for other compute capabilities (an sm_120 GPU with a CUDA 11.8 torch, an "
        "H100 with an sm_80-only NCCL), or the PTX is newer than the driver can compile.",
        "fix": "Install a torch / NCCL / extension build whose arch list includes this GPU "
        "(`torch.cuda.get_arch_list()` vs `torch.cuda.get_device_capability()`), e.g. a cu128 wheel for "
        "Blackwell; rebuild extensions with TORCH_CUDA_ARCH_LIST covering it; update the driver for newer PTX.",
    },
    "cuda.kernel_fault": {
        "role": "root",
        "title": "A CUDA kernel faulted (illegal address, launch failure, device assert)",
        "cause": "A kernel accessed memory it must not, executed an illegal instruction, or hit a device-side "
        "assert (often an index out of range); the CUDA context is unusable afterwards and every later CUDA "
        "or NCCL call on that rank fails. Errors are reported asynchronously: the failing call is not the "
        "faulting kernel.",
        "fix": "Rerun with CUDA_LAUNCH_BLOCKING=1 (and TORCH_USE_CUDA_DSA for asserts) to find the kernel; "
        "check indices/labels against their bounds; run compute-sanitizer; if it only happens in NCCL "
        "kernels, suspect a hardware or driver problem (check `nvidia-smi -q` and dmesg for Xid).",
    },
    "cuda.device_unavailable": {
        "role": "root",
        "title": "CUDA device missing, busy or not visible",
        "cause": "The process asked for a GPU it cannot use: CUDA_VISIBLE_DEVICES hides it (a local rank "
        "larger than the number of visible GPUs: invalid device ordinal), the GPU is in exclusive-process "
        "mode and held by another process, or no GPU / driver is visible in the container.",
        "fix": "Start at most as many processes per node as visible GPUs (--nproc-per-node), map each rank to "
        "its own GPU (torch.cuda.set_device(local_rank)), check `nvidia-smi -q | grep 'Compute Mode'` and "
        "that the container runs with the NVIDIA runtime.",
    },
    "cuda.teardown": {
        "role": "consequence",
        "title": "CUDA runtime unloading (the process is exiting)",
        "cause": "The CUDA runtime is being unloaded because the process is shutting down (cudaErrorCudartUnloading, "
        "'driver shutting down'): a call made from a destructor or an exit handler — a process group, a "
        "communicator or a caching allocator torn down after the interpreter began to exit. It follows whatever "
        "made the process exit; it is never the cause.",
        "fix": "Look above it for the error that made the process exit; call destroy_process_group() before the "
        "program ends so nothing tears down CUDA objects during interpreter shutdown.",
    },
    "cuda.driver": {
        "role": "root",
        "title": "CUDA driver and runtime do not fit",
        "cause": "The installed NVIDIA driver is older than the CUDA runtime needs, the user-space driver "
        "library does not match the kernel module, or the driver failed to initialise.",
        "fix": "Compare `nvidia-smi` (driver / highest CUDA version) with torch.version.cuda; install a torch "
        "built for an older CUDA or update the driver; in containers use the host's driver libraries (NVIDIA "
        "container runtime); reboot after a driver update.",
    },
    "cuda.handle": {
        "role": "root",
        "title": "CUDA handle used on the wrong device or after destruction",
        "cause": "A stream, event, context or graph handle was used on a device other than the one it belongs "
        "to, or after it was destroyed: typically a rank that did not call torch.cuda.set_device before "
        "creating streams / the process group, or a CUDA context lost after an earlier error.",
        "fix": "Call torch.cuda.set_device(local_rank) first thing in each process, before init_process_group "
        "and any CUDA work; look for an earlier CUDA error that destroyed the context.",
    },
    "cuda.not_supported": {
        "role": "root",
        "title": "CUDA operation not supported or not permitted here",
        "cause": "The GPU, driver or environment does not support the operation: peer access or IPC between "
        "GPUs (consumer cards, containers, IOMMU), cuMem / multicast features, or a call not permitted in "
        "this context (MPS, stream capture).",
        "fix": "For NCCL set NCCL_P2P_DISABLE=1 / NCCL_CUMEM_ENABLE=0 / NCCL_NVLS_ENABLE=0 to avoid the "
        "feature; run local ranks in one container with all GPUs; check `nvidia-smi topo -p2p r`.",
    },
    "cuda.resources": {
        "role": "root",
        "title": "CUDA kernel launch out of resources or timed out",
        "cause": "A kernel needed more registers, shared memory or threads than the GPU gives, or ran past the "
        "display watchdog: usually a kernel compiled for another configuration, or a GPU driving a display.",
        "fix": "Use a build compiled for this GPU; smaller block sizes in custom kernels; do not train on a GPU "
        "that drives a display (or disable its watchdog).",
    },
    "cuda.usage": {
        "role": "root",
        "title": "CUDA call rejected its arguments or state",
        "cause": "A CUDA runtime call was given an invalid value, pointer, symbol or resource state (a host "
        "pointer where device memory was expected, memory freed or unmapped, an operation on a busy "
        "resource), or could not allocate: a bug in the calling code or an extension, or memory of another "
        "device or process.",
        "fix": "Rerun with CUDA_LAUNCH_BLOCKING=1 to find the call; check the tensors' devices and that "
        "memory shared between processes is still alive; for out of memory see the memory of every process "
        "on the GPU (`nvidia-smi`).",
    },
    "cuda.hardware": {
        "role": "root",
        "title": "GPU hardware error (ECC, NVLink, lost device)",
        "cause": "The GPU reported an uncorrectable ECC error, an NVLink error, or fell off the bus: a "
        "hardware or firmware fault, not a software bug.",
        "fix": "Check `nvidia-smi -q -d ECC`, dmesg for NVRM Xid, and drain the node; reset the GPU or reboot; "
        "report the GPU if errors repeat.",
    },
    UNCLASSIFIED: {
        "role": "root",
        "title": "Message from PyTorch distributed, gloo, NCCL or CUDA",
        "cause": "A message the catalogue has no mechanism class for.",
        "fix": "Read the quoted message and the lines before it.",
    },
}

# (rule id, "source:path" regex, message regex, class); first match wins. There is deliberately no catch-all.
_SRC = r"^(?:pytorch|gloo):"  # message-keyword rules: PyTorch's and gloo's own messages, not CUDA's or NCCL's
RULES: list[tuple[str, str, str, str]] = [
    # CUDA runtime: by error name (the text is beside it in the same entry set). The runtime unloading at exit
    # first: its text ('driver shutting down') would read as a driver problem.
    ("cuda.teardown", r"^cuda:", r"CudartUnloading|driver shutting down", "cuda.teardown"),
    ("cuda.arch", r"^cuda:", r"NoKernelImageForDevice|SymbolNotFound|InvalidDeviceFunction|InvalidKernelImage|"
     r"UnsupportedPtxVersion|InvalidPtx|JitCompil|InvalidSource|UnsupportedExecAffinity|UnsupportedDevSideSync|"
     r"no kernel image|named symbol not found|invalid device function|device kernel image is invalid|"
     r"PTX|ptx", "cuda.arch"),
    ("cuda.kernel_fault", r"^cuda:", r"IllegalAddress|LaunchFailure|IllegalInstruction|MisalignedAddress|"
     r"InvalidAddressSpace|InvalidPc|Assert|HardwareStackError|illegal memory access|unspecified launch failure|"
     r"illegal instruction|misaligned address|device-side assert|ContextIsDestroyed|context is destroyed", "cuda.kernel_fault"),
    ("cuda.device_unavailable", r"^cuda:", r"InvalidDevice\b|NoDevice|DevicesUnavailable|DeviceUninitialized|"
     r"DeviceNotLicensed|SystemNotReady|invalid device ordinal|no CUDA-capable device|busy or unavailable|"
     r"DeviceUnavailable|MpsConnectionFailed|MpsServerNotReady|MpsMaxClientsReached|MpsMaxConnectionsReached|"
     r"MpsRpcFailure|MpsClientTerminated", "cuda.device_unavailable"),
    ("cuda.driver", r"^cuda:", r"InsufficientDriver|SystemDriverMismatch|CompatNotSupportedOnDevice|"
     r"InitializationError|SharedObjectInitFailed|SharedObjectSymbolNotFound|CallRequiresNewerDriver|"
     r"StubLibrary|driver", "cuda.driver"),
    ("cuda.handle", r"^cuda:", r"InvalidResourceHandle|InvalidContext|ContextAlreadyInUse|InvalidGraphicsContext|"
     r"invalid resource handle|ContextAlreadyCurrent|PrimaryContextActive|CudartUnloading", "cuda.handle"),
    ("cuda.not_supported", r"^cuda:", r"NotSupported|NotPermitted|PeerAccess|StreamCapture|Unsupported|"
     r"operation not supported|not permitted", "cuda.not_supported"),
    ("cuda.resources", r"^cuda:", r"LaunchOutOfResources|LaunchTimeout|TooManyPeers|LaunchMaxDepth|"
     r"LaunchFileScoped|LaunchPendingCount|CooperativeLaunchTooLarge|InvalidConfiguration|"
     r"too many resources", "cuda.resources"),
    ("cuda.usage", r"^cuda:", r"InvalidValue|InvalidHostPointer|InvalidDevicePointer|InvalidSymbol|"
     r"InvalidMemcpyDirection|InvalidPitchValue|InvalidChannelDescriptor|InvalidTexture|InvalidSurface|"
     r"InvalidFilterSetting|InvalidNormSetting|InvalidResourceType|InvalidResourceConfiguration|"
     r"AlreadyMapped|NotMapped|AlreadyAcquired|NotReady|IllegalState|InvalidClusterSize|"
     r"HostMemory(?:Already|Not)|Unmap|ArrayIsMapped|InvalidTexture|MemoryAllocation", "cuda.usage"),
    ("cuda.hardware", r"^cuda:", r"ECCUncorrectable|NvlinkUncorrectable|uncorrectable|DeviceNotReady|"
     r"ExternalDevice|Timeout\b", "cuda.hardware"),
    # NCCL result codes
    ("nccl.system", r"^nccl:", r"ncclSystemError|unhandled system error", "ncclres.system"),
    ("nccl.cuda", r"^nccl:", r"ncclUnhandledCudaError|unhandled cuda error", "ncclres.cuda"),
    ("nccl.usage", r"^nccl:", r"ncclInvalidArgument|ncclInvalidUsage|invalid argument|invalid usage",
     "ncclres.usage"),
    ("nccl.internal", r"^nccl:", r"ncclInternalError|internal error", "ncclres.internal"),
    ("nccl.remote", r"^nccl:", r"ncclRemoteError|remote process exited", "ncclres.remote"),
    # messages that name their mechanism, wherever printed
    ("msg.timeout", _SRC, r"(?i)timed? ?out|timeout|deadline exceeded|watchdog", "c10d.timeout"),
    ("msg.env", _SRC, r"(?i)environment variable|\benv(?:ironment)? var|\b(?:MASTER_ADDR|MASTER_PORT|WORLD_SIZE|"
     r"RANK|LOCAL_RANK|GLOO_SOCKET_IFNAME|TORCH_NCCL_\w+|NCCL_\w+)\b.{0,60}(?:not set|unset|expected|invalid|"
     r"must be|should be|not supported|deprecated)", "c10d.env"),
    ("msg.peer_closed", _SRC, r"(?i)connection (?:closed|reset)|closed by peer|peer (?:closed|disconnected)|"
     r"broken pipe|has been aborted|was aborted|\baborted\b|abort(?:ing)? (?:the |process|communicator)|"
     r"remote (?:process|peer)|the (?:store|server) (?:is|was) closed|likely closed|remote server shut", "c10d.peer_failure"),
    ("msg.address", _SRC, r"(?i)unable to find address|\binterface\b|ifname|getaddrinfo|resolve|hostname|"
     r"address already in use|failed to bind|\bbind\b|EADDRINUSE|address family|IPv6|IPv4|\bport\b.*(?:in use|"
     r"available)|create a socket|[Ss]ocket creation|connectFullMesh|connect to|client socket|server socket|socket has (?:failed|timed)|listen", "c10d.network"),
    ("msg.worker", r"torch/distributed/(?:elastic|launcher|run\.py)", r"(?i)worker|process(?:es)? .*(?:exit|fail|"
     r"signal|terminat)|exitcode|signal|SIGTERM|SIGKILL|ChildFailed|terminat|restart", "c10d.worker_failure"),
    ("msg.rendezvous", _SRC, r"(?i)rendezvous|rdzv|\bnnodes\b|min_nodes|max_nodes|run_id|run id", "c10d.rendezvous"),
    ("msg.device", r"ProcessGroupNCCL|NCCLUtils|distributed_c10d\.py", r"(?i)\bdevice\b|\bGPU\b|set_device|device_id|CUDA device",
     "c10d.device"),
    ("msg.store", _SRC, r"(?i)\bstore\b|TCPStore|FileStore|HashStore|PrefixStore|\bkey\b|master_listen|"
     r"libuv", "c10d.store"),
    # by source file: a file that implements one mechanism
    ("file.socket", r"c10d/socket\.cpp|c10d/Backoff|gloo/transport/tcp/(?:address|device|socket|attr)|"
     r"gloo/common/linux|GlooDeviceFactory", r"", "c10d.network"),
    ("file.store", r"c10d/(?:TCPStore|FileStore|HashStore|PrefixStore|Store)|torch/distributed/"
     r"(?:rendezvous\.py|elastic/utils/store)|gloo/rendezvous/", r"", "c10d.store"),
    ("file.rendezvous", r"torch/distributed/elastic/rendezvous/", r"", "c10d.rendezvous"),
    ("file.worker", r"torch/distributed/elastic/(?:multiprocessing|agent)/", r"", "c10d.worker_failure"),
    ("file.gloo_tcp", r"gloo/transport/", r"", "gloo.transport"),
    ("file.nccl_pg", r"c10d/(?:ProcessGroupNCCL|NCCLUtils)", r"(?i)NCCL|communicator|\bcomm\b", "c10d.nccl"),
    ("msg.usage", _SRC, r"(?i)\btensors?\b|\bdtype\b|\bshape\b|contiguous|sparse|\bsizes?\b|\brank\b|group|"
     r"world_size|\bbackend\b|not supported|unsupported|must be|expected|invalid|mismatch|numel|\bop\b|"
     r"reduce_?op|does not support|\bsplit|built in|not implemented", "c10d.usage"),
]
_RULES = [(rid, re.compile(p), re.compile(m), c) for rid, p, m, c in RULES]

# ---------------------------------------------------------------------------------------------- templates
Piece = Union[str, None]  # literal text, or None for an argument (a wildcard)


def _collapse(pieces: Iterable[Piece]) -> list[Piece]:
    out: list[Piece] = []
    for p in pieces:
        if p == "":
            continue
        if p is None and out and out[-1] is None:
            continue
        if isinstance(p, str) and out and isinstance(out[-1], str):
            out[-1] += p
            continue
        out.append(p)
    return out


_FMT_FIELD = re.compile(r"\{[^{}\s]{0,20}\}")
_PRINTF = re.compile(r"%[-+ #0]*(?:\d+|\*)?(?:\.(?:\d+|\*))?(?:hh|h|ll|l|L|z|j|t)?[diouxXeEfFgGcrsp]")


def _split_fields(text: str, rx: re.Pattern[str]) -> list[Piece]:
    out: list[Piece] = []
    pos = 0
    for m in rx.finditer(text):
        out += [text[pos : m.start()], None]
        pos = m.end()
    out.append(text[pos:])
    return out


def template_text(pieces: list[Piece]) -> str:
    """The template as stored: literal text with {*} for each argument."""
    return "".join(WILD if p is None else p for p in pieces)


def matched_line(pieces: list[Piece]) -> list[Piece]:
    """The line of a multi-line message with the most literal text (logs hold one line of it at a time)."""
    lines: list[list[Piece]] = [[]]
    for p in pieces:
        if p is None:
            lines[-1].append(None)
            continue
        parts = p.split("\n")
        lines[-1].append(parts[0])
        for part in parts[1:]:
            lines.append([part])
    best = max(lines, key=literal_chars)
    # Arguments at either end of the line match anything: leave them out of the matcher.
    best = _collapse(best)
    while best and (best[0] is None or not str(best[0]).strip()):
        best.pop(0)
    while best and (best[-1] is None or not str(best[-1]).strip()):
        best.pop()
    if best:
        best[0] = str(best[0]).lstrip()
        best[-1] = str(best[-1]).rstrip()
    return best


def _first_line(pieces: list[Piece]) -> list[Piece]:
    out: list[Piece] = []
    for p in pieces:
        if p is not None and "\n" in p.lstrip("\n"):
            out.append(p.lstrip("\n").split("\n")[0])
            break
        out.append(p)
    return out


def literal_chars(pieces: list[Piece]) -> int:
    return sum(len(re.sub(r"\s", "", p)) for p in pieces if p is not None)


def pieces_to_regex(pieces: list[Piece]) -> str:
    """Unanchored matcher: literal text escaped (whitespace runs matched as \\s+), arguments as bounded lazy
    wildcards."""
    out = []
    for p in pieces:
        if p is None:
            out.append(r".{0,200}?")
        else:
            out.append(r"\s+".join(re.escape(w) for w in re.split(r"\s+", p)))
    return "".join(out)


def needles(pieces: list[Piece]) -> tuple[str, str]:
    """(lookup needle, prefilter keyword): the longest literal run without whitespace-run changes, and the
    longest substring of a literal run that starts at a byte the prefilter allows ('' when none)."""
    runs = [re.sub(r"\s+", " ", p).strip() for p in pieces if p is not None]
    runs = [r for r in runs if r]
    look = max(runs, key=len)[:MAX_NEEDLE].rstrip() if runs else ""
    best = ""
    for run in runs:
        for i, ch in enumerate(run):
            if ch in SLOW_FIRST or not ch.isascii():
                continue
            cand = run[i : i + MAX_KEYWORD].rstrip()
            if len(cand) > len(best):
                best = cand
            break  # the earliest allowed start gives the longest substring of this run
    return look, best if len(best) >= MIN_NEEDLE else ""


# ---------------------------------------------------------------------------------------------- C++
_CPP_MACROS = {
    "TORCH_CHECK": 1, "TORCH_CHECK_WITH": 2, "TORCH_CHECK_VALUE": 1, "TORCH_CHECK_TYPE": 1,
    "TORCH_CHECK_INDEX": 1, "TORCH_CHECK_NOT_IMPLEMENTED": 1, "C10_THROW_ERROR": 1, "C10D_THROW_ERROR": 1,
    "TORCH_WARN": 0, "TORCH_WARN_ONCE": 0, "C10D_ERROR": 0, "C10D_WARNING": 0,
    "GLOO_ENFORCE": 1, "GLOO_ENFORCE_EQ": 2, "GLOO_ENFORCE_NE": 2, "GLOO_ENFORCE_LE": 2, "GLOO_ENFORCE_LT": 2,
    "GLOO_ENFORCE_GE": 2, "GLOO_ENFORCE_GT": 2, "GLOO_THROW": 0, "GLOO_THROW_IO_EXCEPTION": 0,
    "GLOO_THROW_INVALID_OPERATION_EXCEPTION": 0, "GLOO_ERROR": 0, "GLOO_WARN": 0,
    "GLOO_ERROR_MSG": 0,  # the message of an IoException built for signalException(...) or a later throw
    "recordError": 0,  # socket.cpp: the connect error it keeps and throws when the retries run out
}
# A message built into a variable first (`auto msg = fmt::format("...", ...)`, `errorMsg = c10::str(...)`) and
# thrown or logged by name later.
_MSG_VAR = re.compile(r"\b\w*(?:[Mm]sg|[Ee]rr(?:or)?(?:Msg|Str|Message)?|[Mm]essage)\s*\+?=\s*"
                      r"(?:::)?(?:fmt::format|c10::str)\s*\(")
_CPP_CALL = re.compile(r"\b(" + "|".join(sorted(_CPP_MACROS, key=len, reverse=True)) + r")\s*\(|"
                       r"\bLOG\((ERROR|WARNING)\)\s*<<")
_CSTR = re.compile(r'(?:u8|L|u|U)?"((?:[^"\\\n]|\\.)*)"')
_CCHAR = re.compile(r"'(?:[^'\\\n]|\\.)'")
_SYNTAX = re.compile(r"(?:::)?(?:c10|fmt|std)::(?:str|format|string_view|string)\b|[\s()+,<]|\.c_str\(\)")
_ESC = {"n": "\n", "t": "\t", '"': '"', "\\": "\\", "'": "'", "r": "\r", "0": ""}


def _unescape(s: str) -> str:
    return re.sub(r"\\(.)", lambda m: _ESC.get(m.group(1), m.group(1)), s)


def _skip(text: str, pos: int) -> int:
    """Past a string/char literal or comment starting at pos (pos itself when none starts there)."""
    if text.startswith("//", pos):
        end = text.find("\n", pos)
        return len(text) if end < 0 else end
    if text.startswith("/*", pos):
        end = text.find("*/", pos + 2)
        return len(text) if end < 0 else end + 2
    for rx in (_CSTR, _CCHAR):
        m = rx.match(text, pos)
        if m:
            return m.end()
    return pos


def cpp_args(text: str, start: int, stop: str = ")") -> tuple[list[str], int]:
    """Top-level arguments of a call whose '(' is just before `start` (or, with stop=';', of a `<<` chain
    up to its ';'), and the offset past the end. Strings, chars and comments are skipped whole."""
    args: list[str] = []
    depth = 0
    pos = begin = start
    n = len(text)
    sep = "," if stop == ")" else "<<"
    while pos < n:
        nxt = _skip(text, pos)
        if nxt != pos:
            pos = nxt
            continue
        ch = text[pos]
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            if depth == 0 and stop == ")":
                args.append(text[begin:pos])
                return args, pos + 1
            depth -= 1
        elif depth == 0 and text.startswith(sep, pos):
            args.append(text[begin:pos])
            pos += len(sep)
            begin = pos
            continue
        elif ch == ";" and depth == 0 and stop == ";":
            args.append(text[begin:pos])
            return args, pos + 1
        pos += 1
    return args, n


def cpp_template(args: list[str]) -> list[Piece]:
    """Message pieces of a macro's message arguments: string literals (adjacent ones joined, fmt `{}` fields
    as arguments), everything else that is not call syntax an argument."""
    out: list[Piece] = []
    if args and not _CSTR.sub("", args[0]).strip() and _FMT_FIELD.search(args[0]):
        args = args[:1]  # a fmt format (C10D_ERROR, recordError, fmt::format): the other arguments fill its {}
    for arg in args:
        pos = 0
        for m in _CSTR.finditer(arg):
            if _SYNTAX.sub("", arg[pos : m.start()]):
                out.append(None)
            out += _split_fields(_unescape(m.group(1)), _FMT_FIELD)
            pos = m.end()
        if _SYNTAX.sub("", arg[pos:]):
            out.append(None)
    return _collapse(out)


def cpp_messages(text: str) -> Iterator[tuple[int, str, list[Piece]]]:
    """(line, macro, pieces) of each message macro call with at least one string literal in its message."""
    for m in _CPP_CALL.finditer(text):
        line_start = text.rfind("\n", 0, m.start()) + 1
        prefix = text[line_start : m.start()].lstrip()
        before = text[max(0, line_start - 2) : line_start].rstrip("\n")
        if prefix.startswith(("//", "#", "*")) or before.endswith("\\"):
            continue  # a comment, or inside a macro's own definition
        if m.group(1):
            macro = m.group(1)
            args, _ = cpp_args(text, m.end())
            msg_args = args[_CPP_MACROS[macro] :]
        else:
            macro = f"LOG({m.group(2)})"
            msg_args, _ = cpp_args(text, m.end(), stop=";")
        if not any(_CSTR.search(a) for a in msg_args):
            continue
        pieces = cpp_template(msg_args)
        if any(p for p in pieces if p):
            yield text.count("\n", 0, m.start()) + 1, macro, pieces
    for m in _MSG_VAR.finditer(text):
        line_start = text.rfind("\n", 0, m.start()) + 1
        if text[line_start : m.start()].lstrip().startswith(("//", "*")):
            continue
        args, _ = cpp_args(text, m.end())
        if args and _CSTR.match(args[0].strip()):
            pieces = cpp_template(args)
            if any(p for p in pieces if p):
                yield text.count("\n", 0, m.start()) + 1, "message variable", pieces


# ---------------------------------------------------------------------------------------------- Python
_LOG_LEVELS = {"error", "warning", "warn", "exception", "critical", "fatal"}


def _py_pieces(node: ast.expr, printf: bool) -> list[Piece]:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return _split_fields(node.value, _PRINTF) if printf else [node.value]
    if isinstance(node, ast.JoinedStr):
        out: list[Piece] = []
        for v in node.values:
            out += _py_pieces(v, False) if isinstance(v, ast.Constant) else [None]
        return out
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        return _py_pieces(node.left, printf) + _py_pieces(node.right, printf)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mod):
        return _py_pieces(node.left, True)
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "format"
        and isinstance(node.func.value, ast.Constant)
        and isinstance(node.func.value.value, str)
    ):
        return _split_fields(node.func.value.value, _FMT_FIELD)
    return [None]


def _logger_call(func: ast.expr) -> str | None:
    if not isinstance(func, ast.Attribute):
        return None
    if isinstance(func.value, ast.Name) and func.value.id == "warnings" and func.attr == "warn":
        return "warnings.warn"
    if func.attr not in _LOG_LEVELS:
        return None
    owner = func.value
    name = owner.id if isinstance(owner, ast.Name) else owner.attr if isinstance(owner, ast.Attribute) else ""
    return f"logger.{func.attr}" if re.search(r"(?i)log", name) else None


def py_messages(text: str) -> Iterator[tuple[int, str, list[Piece]]]:
    """(line, kind, pieces) of each `raise X(msg)` and logger/warnings call with literal text in a Python
    module."""
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return
    for node in ast.walk(tree):
        kind = None
        call: ast.Call | None = None
        if isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call) and node.exc.args:
            call = node.exc
            f = call.func
            kind = "raise " + (f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else "?")
            pieces = _py_pieces(call.args[0], False)
        elif isinstance(node, ast.Call) and node.args:
            kind = _logger_call(node.func)
            call = node
            if kind is None:
                continue
            pieces = _py_pieces(node.args[0], printf=len(node.args) > 1)
        else:
            continue
        pieces = _collapse(pieces)
        if any(p for p in pieces if p):
            yield node.lineno, kind or "?", pieces


# ---------------------------------------------------------------------------------------------- sources
def _git(repo: Path, *args: str, data: bytes | None = None) -> bytes:
    return subprocess.run(
        ["git", "--git-dir", str(repo), *args], input=data, capture_output=True, check=True, timeout=GIT_TIMEOUT_S
    ).stdout


def git_files(repo: Path, rev: str, paths: list[str]) -> Iterator[tuple[str, str]]:
    """(path, text) of each path at `rev`, read with one `git cat-file --batch`."""
    if not paths:
        return
    blobs = _git(repo, "cat-file", "--batch", data="".join(f"{rev}:{p}\n" for p in paths).encode())
    pos = 0
    for path in paths:
        header_end = blobs.index(b"\n", pos)
        size = int(blobs[pos:header_end].split()[2])
        yield path, blobs[header_end + 1 : header_end + 1 + size].decode("utf-8", "replace")
        pos = header_end + 1 + size + 1


# torch.distributed's process-group, launcher and elastic modules (not the parallelism APIs built on them:
# fsdp, tensor, device_mesh, checkpoint, pipelining).
_TORCH_PY = re.compile(
    r"^torch/distributed/(?:(?:distributed_c10d|run|launch|rendezvous|utils|collective_utils|constants|"
    r"c10d_logger|__init__)\.py|elastic/.+\.py|launcher/.+\.py)$"
)
_C10D = re.compile(r"^torch/csrc/distributed/c10d/.+\.(?:cpp|hpp|h|cu|cuh)$")
_GLOO = re.compile(r"^gloo/(?!test/|benchmark/|examples/).+\.(?:cc|h|cu|cuh)$")


def scan_text(path: str, text: str) -> Iterator[tuple[int, str, list[Piece]]]:
    return py_messages(text) if path.endswith(".py") else cpp_messages(text)


class Collector:
    def __init__(self) -> None:
        self.entries: dict[tuple[str, str], dict[str, Any]] = {}

    def add(self, source: str, repo: str, release: str, path: str, line: int, kind: str, pieces: list[Piece],
            commit: str, extra: dict[str, str] | None = None) -> None:
        fmt = template_text(pieces)
        e = self.entries.get((source, fmt))
        if e is None:
            e = self.entries[(source, fmt)] = {
                "source": source, "repo": repo, "format": fmt, "kind": kind, "pieces": pieces,
                "releases": [], "path": path, "line": line, "commit": commit, **(extra or {}),
            }
        if release not in e["releases"]:
            e["releases"].append(release)
            e["locs"] = []
        # The newest release read gives the location (sources are added oldest first); of several places that
        # print the same message, the first path.
        e.setdefault("locs", []).append((path, line, commit))
        e.update(zip(("path", "line", "commit"), min(e["locs"])))


def collect_pytorch(col: Collector, repo: Path, site: Path | None) -> dict[str, Any]:
    prov: dict[str, Any] = {}
    commit = _git(repo, "rev-parse", "HEAD").decode().strip()
    listing = _git(repo, "ls-tree", "-r", "--name-only", "HEAD", "--", "torch/distributed",
                   "torch/csrc/distributed/c10d").decode().split("\n")
    version = next(git_files(repo, "HEAD", ["version.txt"]))[1].strip()
    paths = [p for p in listing if _TORCH_PY.match(p) or _C10D.match(p)]
    for path, text in git_files(repo, "HEAD", paths):
        for line, kind, pieces in scan_text(path, text):
            col.add("pytorch", "pytorch/pytorch", version, path, line, kind, pieces, commit)
    # The mirror's folder is owner+name (fetch's layout): name the GitHub repository the tree was read from.
    origin = (repo.parent.name if repo.name == "repo" else repo.name).replace("+", "/", 1)
    tree = f"github.com/{origin}" + ("" if origin == "pytorch/pytorch" else ", a copy of pytorch/pytorch's tree")
    prov[version] = {"tree": f"{tree} (version.txt {version})", "commit": commit,
                     "files": len(paths), "read": "torch/distributed (Python) and torch/csrc/distributed/c10d (C++)"}
    if site is not None:
        tv = (site / "torch" / "version.py").read_text()
        wver = re.search(r"__version__\s*=\s*'([^']+)'", tv).group(1).split("+")[0]  # type: ignore[union-attr]
        wcommit = re.search(r"git_version\s*=\s*'([0-9a-f]{40})'", tv).group(1)  # type: ignore[union-attr]
        files = 0
        base = site / "torch" / "distributed"
        for f in sorted(base.rglob("*.py")):
            rel = "torch/distributed/" + f.relative_to(base).as_posix()
            if _TORCH_PY.match(rel):
                files += 1
                for line, kind, pieces in py_messages(f.read_text(encoding="utf-8", errors="replace")):
                    col.add("pytorch", "pytorch/pytorch", wver, rel, line, kind, pieces, wcommit)
        inc = site / "torch" / "include" / "torch" / "csrc" / "distributed" / "c10d"
        for f in sorted(inc.rglob("*")):
            rel = "torch/csrc/distributed/c10d/" + f.relative_to(inc).as_posix()
            if f.is_file() and _C10D.match(rel):
                files += 1
                for line, kind, pieces in cpp_messages(f.read_text(encoding="utf-8", errors="replace")):
                    col.add("pytorch", "pytorch/pytorch", wver, rel, line, kind, pieces, wcommit)
        prov[wver] = {"tree": f"torch {wver} wheel (PyPI), installed", "commit": wcommit, "files": files,
                      "read": "torch/distributed (Python) and the wheel's c10d headers (its .cpp are not shipped)"}
    return prov


def vendored_gloo(pytorch: Path, gloo: Path) -> tuple[str, str] | None:
    """(gloo commit, pytorch version) of the gloo tree the pytorch tree vendors as third_party/gloo, when the
    gloo repository has a commit with that very tree."""
    row = _git(pytorch, "ls-tree", "HEAD", "third_party/gloo").decode().split()
    if len(row) < 3 or row[1] != "tree":
        return None
    for rec in _git(gloo, "log", "--all", "--format=%H %T").decode().split("\n"):
        commit, _, tree = rec.partition(" ")
        if tree == row[2]:
            version = next(git_files(pytorch, "HEAD", ["version.txt"]))[1].strip()
            return commit, version
    return None


def collect_gloo(col: Collector, repo: Path, pytorch: Path) -> dict[str, Any]:
    revs: dict[str, str] = {}
    vendored = vendored_gloo(pytorch, repo)
    if vendored is not None:
        revs[f"torch-{vendored[1]}"] = vendored[0]  # older: first
    head = _git(repo, "rev-parse", "HEAD").decode().strip()
    revs[head[:12]] = head
    files = 0
    for label, commit in revs.items():
        listing = _git(repo, "ls-tree", "-r", "--name-only", commit, "--", "gloo").decode().split("\n")
        paths = [p for p in listing if _GLOO.match(p)]
        files += len(paths)
        for path, text in git_files(repo, commit, paths):
            for line, kind, pieces in cpp_messages(text):
                col.add("gloo", "pytorch/gloo", label, path, line, kind, pieces, commit)
    return {"releases": revs, "files": files,
            "note": "torch-X: the gloo commit whose tree pytorch X vendors as third_party/gloo; then gloo's HEAD"}


_NCCL_CASE = re.compile(r"case\s+(nccl\w+)\s*:\s*return\s+\"([^\"]+)\"")


def collect_nccl(col: Collector, repo: Path) -> dict[str, Any]:
    tags = release_tags(repo)
    commits = {}
    for tag in tags:
        commit = _git(repo, "rev-parse", f"{tag}^{{commit}}").decode().strip()
        commits[tag] = commit
        text = _git(repo, "show", f"{tag}:src/init.cc").decode("utf-8", "replace")
        version = tag[1:].split("-")[0]
        for m in _NCCL_CASE.finditer(text):
            name, msg = m.groups()
            if name == "ncclSuccess":
                continue
            line = text.count("\n", 0, m.start()) + 1
            col.add("nccl", "NVIDIA/nccl", version, "src/init.cc", line, "ncclGetErrorString", [msg], commit,
                    {"name": name})
    return {"releases": commits}


_CUDA_ENUM = re.compile(r"\b(cudaError\w+|cudaSuccess)\s*=\s*(\d+)")


def collect_cuda(col: Collector, cudart: Path) -> dict[str, Any]:
    header = cudart / "include" / "driver_types.h"
    text = header.read_text(encoding="utf-8", errors="replace")
    start = text.index("enum __device_builtin__ cudaError")
    body = text[start : text.index("};", start)]
    libs = sorted((cudart / "lib").glob("libcudart.so*"))
    if not libs:
        raise SystemExit(f"no libcudart.so in {cudart / 'lib'}")
    lib = ctypes.CDLL(str(libs[0]))
    lib.cudaGetErrorString.restype = ctypes.c_char_p
    lib.cudaGetErrorString.argtypes = [ctypes.c_int]
    ver = ctypes.c_int()
    lib.cudaRuntimeGetVersion(ctypes.byref(ver))
    release = f"{ver.value // 1000}.{ver.value % 1000 // 10}"
    dist = next(cudart.parents[1].glob("nvidia_cuda_runtime*.dist-info"), None)
    for m in _CUDA_ENUM.finditer(body):
        name, value = m.group(1), int(m.group(2))
        if name == "cudaSuccess":
            continue
        msg = lib.cudaGetErrorString(value).decode("utf-8", "replace")
        line = text.count("\n", 0, start + m.start()) + 1
        extra = {"name": name, "code": str(value)}
        col.add("cuda", "nvidia-cuda-runtime-cu12", release, "include/driver_types.h", line,
                "cudaGetErrorString", [msg], "", extra)
        col.add("cuda", "nvidia-cuda-runtime-cu12", release, "include/driver_types.h", line, "cudaError_t",
                [name], "", {**extra, "text": msg})
    return {"package": dist.name.removesuffix(".dist-info") if dist else "nvidia-cuda-runtime-cu12",
            "runtime_version": release, "library": libs[0].name}


# ---------------------------------------------------------------------------------------------- build
def classify(source: str, path: str, text: str) -> tuple[str, str]:
    where = f"{source}:{path}"
    for rid, path_rx, msg_rx, cls in _RULES:
        if path_rx.search(where) and msg_rx.search(text):
            return cls, rid
    return UNCLASSIFIED, ""


def finish(col: Collector) -> list[dict[str, Any]]:
    out = []
    order = {"pytorch": 0, "gloo": 1, "nccl": 2, "cuda": 3}
    for e in sorted(col.entries.values(), key=lambda e: (order[e["source"]], e["path"], e["line"], e["format"])):
        pieces: list[Piece] = e.pop("pieces")
        e.pop("locs", None)
        line = matched_line(pieces)
        look, keyword = needles(line)
        if template_text(line) == template_text(matched_line(_first_line(pieces))):
            # A first line is read through explain's anchors (Error, [W, NCCL...: sources.PROBE_ANCHORS); a
            # continuation line may hold none of them, so it brings its own keyword into the prefilter.
            keyword = ""
        text = e["format"] + " " + e.get("name", "") + " " + e.get("text", "")
        cls, rule = classify(e["source"], e["path"], text)
        rels = e.pop("releases")
        out.append({
            **e,
            "level": "warning" if e["kind"] in WARNING_KINDS else "error",
            "match": template_text(line),
            "regex": pieces_to_regex(line),
            "literal": literal_chars(line),
            "needle": look,
            "keyword": keyword,
            "class": cls,
            "rule": rule,
            "first": rels[0],
            "last": rels[-1],
        })
    return out


def coverage(entries: list[dict[str, Any]]) -> dict[str, Any]:
    cov: dict[str, Any] = {}
    for source in ("pytorch", "gloo", "nccl", "cuda"):
        es = [e for e in entries if e["source"] == source]
        matchable = [e for e in es if e["literal"] >= MIN_LITERAL]
        classed = [e for e in matchable if e["class"] != UNCLASSIFIED]
        cov[source] = {
            "messages": len(es),
            "matchable": len(matchable),
            "classified": len(classed),
            "ratio": round(len(classed) / len(matchable), 4) if matchable else 0.0,
            "by_class": dict(sorted(Counter(e["class"] for e in matchable).items())),
        }
    # PyTorch's split: the C++ of c10d, and the Python of torch.distributed (c10d's API, torchrun, elastic).
    for lang, pred in (("pytorch_cpp", lambda p: not p.endswith(".py")), ("pytorch_python", lambda p: p.endswith(".py"))):
        es = [e for e in entries if e["source"] == "pytorch" and pred(e["path"])]
        matchable = [e for e in es if e["literal"] >= MIN_LITERAL]
        classed = [e for e in matchable if e["class"] != UNCLASSIFIED]
        cov["pytorch"][lang] = {"messages": len(es), "matchable": len(matchable), "classified": len(classed)}
    cov["definition"] = ("messages: distinct message templates read; matchable: those with at least "
                         f"{MIN_LITERAL} literal characters on their matched line (the rest are never matched); "
                         "classified: matchable ones a specific rule classed (there is no catch-all rule)")
    return cov


def build(pytorch: Path, site: Path | None, gloo: Path, nccl: Path, cudart: Path) -> dict[str, Any]:
    col = Collector()
    prov = {
        "pytorch": {"repo": "https://github.com/pytorch/pytorch", "trees": collect_pytorch(col, pytorch, site)},
        "gloo": {"repo": "https://github.com/pytorch/gloo", **collect_gloo(col, gloo, pytorch)},
        "nccl": {"repo": "https://github.com/NVIDIA/nccl", **collect_nccl(col, nccl)},
        "cuda": {"repo": "https://pypi.org/project/nvidia-cuda-runtime-cu12/", **collect_cuda(col, cudart)},
        "generated": datetime.date.today().isoformat(),
        "script": "bench/explain_catalogue_torch.py",
        "hand_written": "CLASSES (class -> role, title, cause, fix) and RULES (source path / message -> class)",
    }
    entries = finish(col)
    return {
        "schema": SCHEMA,
        "provenance": prov,
        "min_literal": MIN_LITERAL,
        "coverage": coverage(entries),
        "rules": [{"id": rid, "path": p, "message": m, "class": c} for rid, p, m, c in RULES],
        "classes": CLASSES,
        "entries": entries,
    }


def reclassify(doc: dict[str, Any]) -> dict[str, Any]:
    """The catalogue with the hand-written part (CLASSES, RULES) applied again to its entries, which keep what
    was read from the sources: a change of a class or a rule needs no fetch of the sources."""
    for e in doc["entries"]:
        e["class"], e["rule"] = classify(e["source"], e["path"], e["format"] + " " + e.get("name", "") + " " +
                                         e.get("text", ""))
    doc["coverage"] = coverage(doc["entries"])
    doc["rules"] = [{"id": rid, "path": p, "message": m, "class": c} for rid, p, m, c in RULES]
    doc["classes"] = CLASSES
    return doc


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pytorch", type=Path, help="git directory holding pytorch/pytorch's tree")
    ap.add_argument("--torch-site", type=Path, help="site-packages holding an installed torch wheel")
    ap.add_argument("--gloo", type=Path, help="git directory of github.com/pytorch/gloo")
    ap.add_argument("--nccl", type=Path, help="git directory of github.com/NVIDIA/nccl")
    ap.add_argument("--cudart", type=Path, help="unpacked nvidia/cuda_runtime of the cu12 wheel")
    ap.add_argument("--out", type=Path, default=OUT, help=f"output (default {OUT.relative_to(ROOT)})")
    ap.add_argument("--unclassified", action="store_true", help="list matchable messages left unclassified")
    ap.add_argument("--reclassify", action="store_true",
                    help="apply CLASSES and RULES again to the entries of --out (no sources needed)")
    args = ap.parse_args(argv)
    if args.reclassify:
        doc = reclassify(json.loads(args.out.read_text(encoding="utf-8")))
    elif None in (args.pytorch, args.gloo, args.nccl, args.cudart):
        ap.error("--pytorch, --gloo, --nccl and --cudart are required (or --reclassify)")
    else:
        doc = build(args.pytorch, args.torch_site, args.gloo, args.nccl, args.cudart)
    args.out.write_text(json.dumps(doc, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    for source, c in doc["coverage"].items():
        if isinstance(c, dict):
            print(f"{source}: {c['messages']} messages, {c['matchable']} matchable, {c['classified']} classified "
                  f"({c['ratio']:.1%})")
    if args.unclassified:
        for e in doc["entries"]:
            if e["class"] == UNCLASSIFIED and e["literal"] >= MIN_LITERAL:
                print(f"  {e['source']} {e['path']}:{e['line']} {e['kind']}: {e['match']!r}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
