"""Per-GPU bytes of one training step, item by item (docs/plan.md cites each formula). Pure arithmetic.

Items (the checklist of what occupies GPU memory): parameters, gradients, optimizer states, fp32 master
weights, activations, inputs, temporary buffers (communication buckets), and a fixed overhead (driver
reserve, CUDA context with its kernels and library workspaces, NCCL buffers). Allocator fragmentation is
not an item: it is what the headroom is for (plan.judge warns when headroom is under 5%).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Optional

from ddpdoctor.plan.shape import ModelShape
from ddpdoctor.plan.units import GIB

DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4}
# Optimizer state per parameter, master copy excluded (that is its own item).
OPTIMIZER_BYTES = {
    "adamw": 8.0,  # exp_avg + exp_avg_sq, fp32 (torch.optim.AdamW; DeepSpeed docs: 4 + 4)
    "adamw8bit": 2.0,  # bitsandbytes 8-bit AdamW: two 1-byte states (+ an fp32 absmax per 2048 values: 0.2%)
    "sgd": 0.0,  # torch.optim.SGD without momentum keeps no state
    "sgd-momentum": 4.0,  # one fp32 momentum buffer
    "adafactor": 0.0,  # factored second moment: row + column statistics (see optimizer_bytes)
}
RECOMPUTE = ("none", "selective", "full")
# eager: the attention scores and probabilities are stored (the paper's 5·a·s²·b); flash: FlashAttention
# (and PyTorch SDPA's flash/memory-efficient kernels) store only a logsumexp per row and recompute them.
ATTENTION = ("eager", "flash")
ZERO_BUCKET_ELEMENTS = 500_000_000  # DeepSpeed reduce_bucket_size / allgather_bucket_size defaults (5e8)
ZERO3_PREFETCH_ELEMENTS = 50_000_000  # DeepSpeed stage3_prefetch_bucket_size default (5e7)

# Fixed per-GPU overhead (docs/plan.md#overhead gives the sources):
# - driver reserve: nvidia-smi -q "FB Memory Usage / Reserved" on H100 80GB: 454 MiB (R565), 480 MiB (R580);
# - CUDA context with its kernels and cuBLAS/cuDNN workspaces, lazily loaded (PyTorch 2.x default);
# - NCCL ring/tree buffers per communicator (NCCL_BUFFSIZE 4 MiB x channels x peers);
# - NVLink SHARP (NVLS) buffers on NVSwitch Hopper/Blackwell nodes with > 2 GPUs: nvlsTotalSize
#   2415919104 bytes on 8 GPUs in NCCL's own log (vllm-project/vllm#9699); NCCL_NVLS_ENABLE=0 frees it.
DRIVER_RESERVE_GIB = 0.5
CUDA_CONTEXT_GIB = {"volta": 0.75, "turing": 0.75}  # no lazy module loading before CUDA 11.7 drivers
DEFAULT_CUDA_CONTEXT_GIB = 0.5
NCCL_BUFFERS_GIB = 0.5  # per communicator (process group) the GPU belongs to
NVLS_GIB = 2.25
_NO_NVSWITCH = re.compile(r"PCIe|\bNVL\b|RTX|GeForce", re.I)


@dataclass(frozen=True)
class Overhead:
    """The fixed part of a GPU's memory, by item (bytes)."""

    driver_reserve: int
    cuda_context: int
    nccl_buffers: int
    nvls: int

    @property
    def total(self) -> int:
        return self.driver_reserve + self.cuda_context + self.nccl_buffers + self.nvls

    def to_dict(self) -> dict[str, int]:
        return {
            "driver_reserve": self.driver_reserve,
            "cuda_context": self.cuda_context,
            "nccl_buffers": self.nccl_buffers,
            "nvls": self.nvls,
        }


def overhead_for(generation: str, gpu_name: Optional[str], gpus_per_node: int, groups: int) -> Overhead:
    """Driver reserve, CUDA context and NCCL buffers of one GPU in `groups` process groups (0: no NCCL)."""
    nvls = (
        groups > 0
        and generation in ("hopper", "blackwell")
        and gpus_per_node > 2
        and not (gpu_name and _NO_NVSWITCH.search(gpu_name))
    )
    return Overhead(
        driver_reserve=int(DRIVER_RESERVE_GIB * GIB),
        cuda_context=int(CUDA_CONTEXT_GIB.get(generation, DEFAULT_CUDA_CONTEXT_GIB) * GIB),
        nccl_buffers=int(NCCL_BUFFERS_GIB * groups * GIB),
        nvls=int(NVLS_GIB * GIB) if nvls else 0,
    )


def process_groups(s: Strategy, n_gpus: int) -> int:
    """NCCL communicators a rank belongs to: data parallel, plus tensor and pipeline groups."""
    groups = 1 if n_gpus > 1 else 0
    if s.kind == "tp":
        groups += (s.tp > 1) + (s.pp > 1)
    return groups


@dataclass(frozen=True)
class Strategy:
    """How the model is split: `kind` is ddp, zero1, zero2, zero3, fsdp or tp (tp carries tp and pp)."""

    kind: str
    tp: int = 1
    pp: int = 1

    @property
    def label(self) -> str:
        if self.kind != "tp":
            return self.kind
        return f"tp={self.tp}" + (f",pp={self.pp}" if self.pp > 1 else "")

    @property
    def model_parallel(self) -> int:
        return self.tp * self.pp


@dataclass(frozen=True)
class Workload:
    """The model and how one step runs: everything the arithmetic needs besides the strategy."""

    shape: ModelShape
    dtype: str = "bf16"
    optimizer: str = "adamw"
    micro_batch: int = 1
    seq_len: int = 2048
    recompute: str = "none"
    attention: str = "eager"

    @property
    def mixed(self) -> bool:
        return self.dtype != "fp32"

    @property
    def weight_bytes(self) -> int:
        return DTYPE_BYTES[self.dtype]


@dataclass(frozen=True)
class Breakdown:
    """Per-GPU bytes, one field per item of the checklist."""

    parameters: int
    gradients: int
    optimizer: int
    master: int
    activations: int
    inputs: int
    temporary: int
    overhead: int

    @property
    def model_states(self) -> int:
        return self.parameters + self.gradients + self.optimizer + self.master

    @property
    def total(self) -> int:
        return self.model_states + self.activations + self.inputs + self.temporary + self.overhead

    def to_dict(self) -> dict[str, int]:
        return {
            "parameters": self.parameters,
            "gradients": self.gradients,
            "optimizer": self.optimizer,
            "master": self.master,
            "activations": self.activations,
            "inputs": self.inputs,
            "temporary": self.temporary,
            "overhead": self.overhead,
            "model_states": self.model_states,
            "total": self.total,
        }


def optimizer_bytes(w: Workload) -> float:
    """Optimizer state bytes per parameter (master copy excluded)."""
    if w.optimizer == "adafactor":
        # Adafactor without first moment (transformers' default beta1=None) keeps, per r x c matrix, r + c
        # fp32 statistics: 4(1/r + 1/c) bytes per parameter, at most 8/h since every matrix has a side >= h.
        return 8.0 / w.shape.hidden
    return OPTIMIZER_BYTES[w.optimizer]


def model_states(w: Workload, s: Strategy, n_gpus: int) -> tuple[int, int, int, int, list[str]]:
    """(parameters, gradients, optimizer, master) bytes per GPU, and notes on what was assumed.

    `n_gpus` is the data-parallel degree for ddp/zero/fsdp; for tp the model-parallel split is applied
    and the rest of the GPUs replicate (plain data parallel over the remainder).
    """
    p = w.shape.params
    wb = w.weight_bytes
    opt = optimizer_bytes(w)
    master = 4 if w.mixed else 0
    # The optimizer steps in fp32: under mixed precision an fp32 copy of the gradients it updates
    # (DeepSpeed's "4b grads" in its 16 and 18 multipliers; Megatron's main_grad).
    fp32_grad = 4 if w.mixed else 0
    notes: list[str] = []
    if s.kind == "ddp":
        # Transformer Math 101: 2 (bf16 weights) + 2 (bf16 grads) + 4 (master) + 8 (AdamW) = 16 B/param.
        return wb * p, wb * p, int(opt * p), master * p, notes
    if s.kind in ("zero1", "zero2"):
        # DeepSpeed estimate_zero2_model_states_mem_needs (offload_optimizer=none):
        # 4·P + 16·P/N for fp16 params + fp16 grads, and fp32 master, momentum, variance, grads sharded.
        if s.kind == "zero2":
            notes.append(
                "DeepSpeed's estimator keeps the 16-bit gradients whole under ZeRO-2 too (same figure as ZeRO-1)"
            )
        n = n_gpus
        return wb * p, wb * p + _ceil(fp32_grad * p, n), _ceil(opt * p, n), _ceil(master * p, n), notes
    if s.kind == "zero3":
        # DeepSpeed estimate_zero3_model_states_mem_needs (no offload): 4·largest_layer + 18·P/N.
        big = w.shape.largest_layer
        n = n_gpus
        return (
            _ceil(wb * p, n) + wb * big,
            wb * big + _ceil(fp32_grad * p, n),
            _ceil(opt * p, n),
            _ceil(master * p, n),
            notes,
        )
    if s.kind == "fsdp":
        # torch FSDP FULL_SHARD with MixedPrecision(param_dtype=dtype) and a per-block auto-wrap policy:
        # the sharded flat parameters are fp32 (the master); the root unit (embeddings, head) stays
        # gathered and two blocks are gathered at a time (current + backward prefetch).
        sh = w.shape
        gathered = wb * (sh.root_params + 2 * sh.block_params)
        unit_grad = wb * max(sh.block_params, sh.root_params)
        n = n_gpus
        if w.mixed:
            return gathered, unit_grad + _ceil(4 * p, n), _ceil(opt * p, n), _ceil(4 * p, n), notes
        return gathered + _ceil(4 * p, n), unit_grad + _ceil(4 * p, n), _ceil(opt * p, n), 0, notes
    # Tensor/pipeline parallel (Megatron-LM without the distributed optimizer): every tensor is split
    # t·p ways. bf16 keeps fp32 main grads (18 B/param), fp16 16-bit grads + an fp32 copy (20 B/param).
    mp = s.model_parallel
    grads = 4 * p if w.dtype == "bf16" else wb * p + fp32_grad * p
    notes.append("Megatron-LM layout, sequence parallel on, no distributed optimizer")
    if s.pp > 1:
        notes.append("layers split evenly over the stages; the first also holds the embeddings")
    return _ceil(wb * p, mp), _ceil(grads, mp), _ceil(opt * p, mp), _ceil(master * p, mp), notes


def activation_bytes(w: Workload, s: Strategy) -> int:
    """Korthikanti et al. 2022 (Table 2, §4.3), per GPU, with sequence parallelism on under TP.

    Per layer and micro-batch: s·b·h·(34 + 5·a·s/h) without recomputation (eager attention; FlashAttention
    keeps 34·s·b·h plus its fp32 logsumexp, 4·a·s·b), 34·s·b·h with selective,
    2·s·b·h (the layer input) with full recomputation; all divided by t. The 1F1B pipeline schedule keeps
    p micro-batches of L/p layers on the first stage: L layers' worth on any p. Without pipelining, the
    output layer and loss add 4·s·b·h·(1 + v/h)/t. The formulas count 16-bit activations; fp32 doubles.
    """
    sh = w.shape
    seq, b, h, a, t = w.seq_len, w.micro_batch, sh.hidden, sh.heads, s.tp
    if w.recompute == "full":
        per_layer = 2 * seq * b * h
    elif w.recompute == "selective":
        per_layer = 34 * seq * b * h
    elif w.attention == "flash":
        per_layer = 34 * seq * b * h + 4 * a * seq * b  # fp32 logsumexp per head and row (Dao et al.)
    else:
        per_layer = 34 * seq * b * h + 5 * a * seq * seq * b
    total = per_layer * sh.layers
    if s.pp == 1:
        total += 4 * seq * b * h + 4 * seq * b * sh.vocab
    return _ceil(total * w.weight_bytes // 2, t)


def input_bytes(w: Workload) -> int:
    """Token ids and labels of one micro-batch: two int64 tensors of s·b."""
    return 2 * 8 * w.seq_len * w.micro_batch


def temporary_bytes(w: Workload, s: Strategy, grads_per_gpu: int) -> int:
    """Communication buffers that exist besides the items above."""
    p = w.shape.params
    wb = w.weight_bytes
    if s.kind == "ddp":
        # DDP's buckets hold a flat copy of every gradient unless gradient_as_bucket_view=True (PyTorch
        # DistributedDataParallel docs: "the saved memory size will be equal to the total gradients size").
        return grads_per_gpu
    if s.kind in ("zero1", "zero2"):
        return wb * min(p, ZERO_BUCKET_ELEMENTS) * 2  # reduce bucket + allgather bucket
    if s.kind == "zero3":
        return wb * (min(p, ZERO_BUCKET_ELEMENTS) + min(p, ZERO3_PREFETCH_ELEMENTS))
    # FSDP reduce-scatters each unit's gradient into the shard it keeps (counted in gradients); Megatron
    # all-reduces its contiguous grad buffer in place: nothing extra.
    return 0


def breakdown(w: Workload, s: Strategy, n_gpus: int, overhead: Overhead) -> tuple[Breakdown, list[str]]:
    """Every item of GPU memory for one strategy; `n_gpus` is the data-parallel degree."""
    params, grads, opt, master, notes = model_states(w, s, n_gpus)
    return (
        Breakdown(
            parameters=params,
            gradients=grads,
            optimizer=opt,
            master=master,
            activations=activation_bytes(w, s),
            inputs=input_bytes(w),
            temporary=temporary_bytes(w, s, grads),
            overhead=overhead.total,
        ),
        notes,
    )


def _ceil(value: float, n: int) -> int:
    """Bytes per GPU when `value` bytes are split n ways (the largest shard)."""
    return -(-int(value) // n)
