"""Per-GPU bytes of one training step, item by item (docs/plan.md cites each formula). Pure arithmetic.

Items (the checklist of what occupies GPU memory): parameters, gradients, optimizer states, fp32 master
weights, activations, inputs, temporary buffers (communication buckets), and a fixed overhead (driver
reserve, CUDA context with its kernels and library workspaces, NCCL buffers). Allocator fragmentation is
not an item: it is what the headroom is for (plan.judge warns when headroom is under 5%).
Over 600 lines: one concept, the per-GPU byte items of a step; each item's formula sits beside the others it is summed with.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Optional

from ddpdoctor.plan.shape import ModelShape
from ddpdoctor.plan.units import GIB

DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4, "autocast": 4, "fp8": 2}
# The precision layouts (docs/plan.md#precision): bf16/fp16 keep 16-bit weights with an fp32 master copy
# (DeepSpeed, Megatron, FSDP MixedPrecision); fp32 is fp32 throughout; autocast is plain torch.autocast
# over fp32 parameters: fp32 weights, grads and DDP buckets, and the bf16 casts of the weights that
# autograd keeps from forward until backward. fp8 is NVIDIA Transformer Engine's layout (TE docs,
# "Performance Considerations / Memory usage", scenario 2): bf16 weights with an fp32 master in the
# optimizer, plus per block Linear an fp8 copy of its weight and of its input saved for backward.
PRECISIONS = tuple(DTYPE_BYTES)
# Optimizer state per parameter, master copy excluded (that is its own item).
OPTIMIZER_BYTES = {
    "adamw": 8.0,  # exp_avg + exp_avg_sq, fp32 (torch.optim.AdamW; DeepSpeed docs: 4 + 4)
    # bitsandbytes 8-bit AdamW: two 1-byte states plus, per state, an fp32 absmax per block of 256 values
    # (bitsandbytes/optim/optimizer.py Optimizer8bit.init_state: blocks = n // 256): 2 + 2·4/256.
    "adamw8bit": 2.0 + 2 * 4 / 256,
    "adamw-fused": 8.0,  # torch.optim.AdamW(fused=True) / apex FusedAdam: the same state, no foreach transients
    "adam": 8.0,  # torch.optim.Adam: the same two fp32 moments
    "paged-adamw": 8.0,  # bitsandbytes PagedAdamW (32-bit): same bytes, in unified memory (see note)
    "paged-adamw8bit": 2.0 + 2 * 4 / 256,
    "lion": 4.0,  # Lion (Chen et al. 2023): one fp32 momentum
    "lion8bit": 1.0 + 4 / 256,  # bitsandbytes Lion8bit: one 1-byte state + its absmax per 256
    "paged-lion8bit": 1.0 + 4 / 256,
    "sgd": 0.0,  # torch.optim.SGD without momentum keeps no state
    "sgd-momentum": 4.0,  # one fp32 momentum buffer
    "adafactor": 0.0,  # factored second moment: row + column statistics (see optimizer_bytes)
}
# transformers' TrainingArguments(optim=...) names, so `--optimizer adamw_torch_fused` works as written.
OPTIMIZER_ALIASES = {
    "adamw_torch": "adamw", "adamw_torch_fused": "adamw-fused", "adamw_hf": "adamw", "adamw_apex_fused": "adamw-fused",
    "adamw_bnb_8bit": "adamw8bit", "adamw_8bit": "adamw8bit", "paged_adamw_8bit": "paged-adamw8bit",
    "paged_adamw_32bit": "paged-adamw", "paged_adamw": "paged-adamw", "lion_32bit": "lion",
    "lion_8bit": "lion8bit", "paged_lion_8bit": "paged-lion8bit", "paged_lion_32bit": "lion",
    "sgd_momentum": "sgd-momentum",
}  # fmt: skip
RECOMPUTE = ("none", "selective", "full")
OFFLOAD = ("none", "optimizer", "optimizer+params", "nvme-optimizer", "nvme-optimizer+params")
# DeepSpeed ZeRO-Infinity defaults (docs/_pages/config-json.md, "Optimizer offloading", "Parameter
# offloading"): the optimizer swapper's pinned pool holds offload_optimizer.buffer_count buffers of the
# largest sub-group (sub_group_size elements at most, fp32); parameters use offload_param.buffer_count x
# buffer_size 16-bit elements, and up to max_in_cpu elements are kept in host memory instead of NVMe.
NVME_OPT_BUFFER_COUNT = 4
NVME_SUB_GROUP_SIZE = 1_000_000_000
NVME_PARAM_BUFFER_COUNT = 5
NVME_PARAM_BUFFER_SIZE = 100_000_000
NVME_MAX_IN_CPU = 1_000_000_000
# DeepSpeed's estimators multiply host RAM by additional_buffer_factor=1.5 (pinned buffers, fragmentation).
HOST_BUFFER_FACTOR = 1.5
# eager: the attention scores and probabilities are stored (the paper's 5·a·s²·b); flash: FlashAttention
# (and PyTorch SDPA's flash/memory-efficient kernels) store only a logsumexp per row and recompute them.
# sdpa: torch's scaled_dot_product_attention, transformers' default since 4.36; its flash and
# memory-efficient kernels keep what FlashAttention keeps.
ATTENTION = ("sdpa", "eager", "flash")
ZERO_BUCKET_ELEMENTS = 500_000_000  # DeepSpeed reduce_bucket_size / allgather_bucket_size defaults (5e8)

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
    if s.kind == "hsdp" and 1 < (s.group or n_gpus) < n_gpus:
        groups += 1  # HYBRID_SHARD: a shard group and a replicate group (a 2-D device mesh)
    return groups


@dataclass(frozen=True)
class Strategy:
    """How the model is split: `kind` is ddp, zero1, zero2, zero3, fsdp, hsdp, fsdp-grad-op or tp (tp
    carries tp and pp, and `dp`: how the data-parallel ranks shard the tensor-parallel shard)."""

    kind: str
    tp: int = 1
    pp: int = 1
    distopt: bool = False  # Megatron's --use-distributed-optimizer (tp only)
    dp: str = ""  # tp only: zero1, zero2, zero3 or fsdp over the N/(tp*pp) data-parallel ranks
    group: int = 0  # hsdp only: GPUs per shard group (0: the node's GPUs)

    @property
    def label(self) -> str:
        if self.kind == "hsdp" and self.group:
            return f"hsdp={self.group}"
        if self.kind != "tp":
            return self.kind
        return (
            f"tp={self.tp}"
            + (f",pp={self.pp}" if self.pp > 1 else "")
            + (",dopt" if self.distopt else "")
            + (f",{self.dp}" if self.dp else "")
        )

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
    attention: str = "sdpa"
    offload: str = "none"  # DeepSpeed ZeRO offload to host RAM: none, optimizer, optimizer+params
    lora_rank: int = 0  # LoRA adapters of this rank on every Linear of the blocks; the base is frozen
    qlora: bool = False  # the frozen base's block Linears in 4-bit NF4 with double quantisation
    inference: bool = False  # serving: weights and a KV cache of micro_batch x seq_len tokens, no training
    global_batch: int = 0  # sequences per optimizer step over all replicas (0: not given)

    @property
    def mixed(self) -> bool:
        """16-bit weights with an fp32 master copy (bf16, fp16, fp8's bf16 weights); autocast keeps fp32
        weights instead."""
        return self.dtype in ("bf16", "fp16", "fp8")

    @property
    def weight_bytes(self) -> int:
        return DTYPE_BYTES[self.dtype]

    @property
    def act_bytes(self) -> int:
        """Bytes of one activation element: 16-bit under bf16, fp16 and autocast, 4 under fp32."""
        return 4 if self.dtype == "fp32" else 2


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
    workspace: int = 0  # backward's transient tensors at their largest (backward_workspace_bytes)
    host: int = 0  # host RAM per node for offloaded states (not GPU memory: not in total)
    kv_cache: int = 0  # inference: keys and values of every layer for micro_batch x seq_len tokens
    fp8_weights: int = 0  # --dtype fp8: the fp8 copies of the block Linears' weights kept for backward
    nvme: int = 0  # NVMe bytes per node for states offloaded by ZeRO-Infinity (not GPU memory: not in total)
    optimizer_step: int = 0  # the optimizer's transient tensors, when the peak is its step (optimizer_step_bytes)

    @property
    def model_states(self) -> int:
        return self.parameters + self.gradients + self.optimizer + self.master

    @property
    def total(self) -> int:
        return (
            self.model_states
            + self.activations
            + self.inputs
            + self.temporary
            + self.overhead
            + self.workspace
            + self.kv_cache
            + self.fp8_weights
            + self.optimizer_step
        )

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
            "workspace": self.workspace,
            "host": self.host,
            "kv_cache": self.kv_cache,
            "fp8_weights": self.fp8_weights,
            "nvme": self.nvme,
            "optimizer_step": self.optimizer_step,
            "model_states": self.model_states,
            "total": self.total,
        }


def resolve_optimizer(name: str) -> str:
    """`adamw_bnb_8bit` -> `adamw8bit`; ValueError naming the known optimizers otherwise."""
    key = name.strip().lower()
    key = OPTIMIZER_ALIASES.get(key, key)
    if key not in OPTIMIZER_BYTES:
        known = ", ".join(OPTIMIZER_BYTES)
        raise ValueError(f"unknown --optimizer {name!r}; one of {known} (or transformers' optim names)")
    return key


def optimizer_bytes(w: Workload) -> float:
    """Optimizer state bytes per parameter (master copy excluded)."""
    if w.optimizer == "adafactor":
        # Adafactor without first moment (transformers' default beta1=None) keeps, per r x c matrix, r + c
        # fp32 statistics: 4(1/r + 1/c) bytes per parameter, at most 8/h since every matrix has a side >= h.
        return 8.0 / w.shape.hidden
    return OPTIMIZER_BYTES[w.optimizer]


def stage_params(shape: ModelShape, s: Strategy) -> int:
    """Parameters on the most loaded model-parallel shard (Megatron-LM theoretical_memory_usage.py).

    With pipelining the first stage holds its L/p blocks plus the embedding (and learned positions), the
    last its blocks plus the final norm and an untied head; tensor parallel splits each stage t ways.
    """
    if s.kind != "tp":
        return shape.params
    if s.pp == 1:
        return -(-shape.params // s.tp)
    blocks = shape.params - shape.root_params
    per_stage = -(-blocks // s.pp)
    vh = shape.vocab * shape.hidden
    final_norm = shape.root_params - vh - shape.positions - (0 if shape.tied else vh)
    first_stage = per_stage + vh + shape.positions
    # Megatron keeps a copy of tied word embeddings on the last stage for the output layer.
    last_stage = per_stage + max(0, final_norm) + vh
    return -(-max(first_stage, last_stage) // s.tp)


def tp_shard_view(w: Workload, s: Strategy) -> tuple[Workload, Strategy]:
    """The most loaded tensor/pipeline-parallel shard as a model of its own, and the data-parallel
    strategy (`s.dp`) that shards it: blocks, root unit and largest layer each split tp ways."""
    sh = w.shape
    t = s.tp
    shard = replace(
        sh,
        params=stage_params(sh, s),
        block_params=-(-sh.block_params // t),
        root_params=-(-sh.root_params // t),
        largest_layer=-(-sh.largest_layer // t),
    )
    return replace(w, shape=shard), Strategy(s.dp or "ddp")


def model_states(w: Workload, s: Strategy, n_gpus: int) -> tuple[int, int, int, int, list[str]]:
    """(parameters, gradients, optimizer, master) bytes per GPU, and notes on what was assumed.

    `n_gpus` is the data-parallel degree for ddp/zero/fsdp; for tp the model-parallel split is applied
    and the rest of the GPUs replicate (plain data parallel over the remainder).
    """
    if w.dtype == "autocast":
        # torch.autocast leaves the parameters, their gradients and the optimizer in fp32: the fp32
        # layout; the bf16 weight casts are a temporary (temporary_bytes).
        params, grads, opt, master, notes = model_states(replace(w, dtype="fp32"), s, n_gpus)
        return params, grads, opt, master, [*notes, "autocast: fp32 weights, gradients and optimizer state"]
    if s.kind == "tp" and s.dp:
        # TP x ZeRO/FSDP: the tensor-parallel shard is a model of its own, sharded over the data-parallel
        # ranks as `dp` shards a whole model (DeepSpeed ZeRO under Megatron-DeepSpeed; FSDP2 over a 2-D mesh).
        view, inner = tp_shard_view(w, s)
        params, grads, opt, master, notes = model_states(view, inner, n_gpus)
        note = (
            f"tensor parallel {s.tp}" + (f" x pipeline {s.pp}" if s.pp > 1 else "")
            + f", then {s.dp} over {n_gpus} data-parallel rank(s): model states split by tp first, then sharded"
        )
        return params, grads, opt, master, [*notes, note]
    p = w.shape.params
    wb = w.weight_bytes
    opt = optimizer_bytes(w)
    master = 4 if w.mixed else 0
    # The optimizer steps in fp32: under mixed precision an fp32 copy of the gradients it updates
    # (DeepSpeed's "4b grads" in its 16 and 18 multipliers; Megatron's main_grad).
    fp32_grad = 4 if w.mixed else 0
    notes: list[str] = []
    n = n_gpus
    if s.kind == "ddp":
        # Transformer Math 101: 2 (bf16 weights) + 2 (bf16 grads) + 4 (master) + 8 (AdamW) = 16 B/param.
        return wb * p, wb * p, int(opt * p), master * p, notes
    # ZeRO-1/2 (DeepSpeed stage_1_and_2.py, its defaults): the 16-bit parameters stay whole, the fp32 master
    # and optimizer state are partitioned. The gradients are held at the larger of two moments, which never
    # coexist (measured at N = 2, 3, 4: bench/plan_vs_measured.py --zero --detail, docs/plan.md):
    # - step()'s conversion: the 16-bit gradient partition (2·P/N, grads_in_partition) and its fp32 copy
    #   (4·P/N, single_partition_of_fp32_groups[i].grad) until free_grad_in_param_list drops the former:
    #   DeepSpeed's estimator's "18 = 2_grads_16bit + 4_grads_32bit + 4_params_32bit + 8_optimizer_states";
    # - ZeRO-1 only, the end of backward: with overlap_comm off (the default below stage 3) the gradient
    #   hooks reduce nothing (process_gradients: `if self.partition_gradients or self.overlap_comm`), so
    #   autograd accumulates every 16-bit gradient whole (2·P) until reduce_gradients() reduces them and
    #   the epilogue drops them (_clear_param_grad_only).
    # ZeRO-1: max(4·P + 12·P/N, 2·P + 18·P/N); ZeRO-2 reduces bucket by bucket in backward: 2·P + 18·P/N.
    if s.kind == "zero1":
        grads = max(wb * p, _ceil((wb + fp32_grad) * p, n))
        notes.append(
            "gradients at the end of backward, 16-bit and whole (DeepSpeed's overlap_comm off, its default)"
            if grads == wb * p
            else "gradients in the step, the 16-bit partition and its fp32 copy (more than the whole 16-bit set here)"
        )
        return wb * p, grads, _ceil(opt * p, n), _ceil(master * p, n), notes
    if s.kind == "zero2":
        return wb * p, _ceil((wb + fp32_grad) * p, n), _ceil(opt * p, n), _ceil(master * p, n), notes
    if s.kind == "zero3":
        # DeepSpeed estimate_zero3_model_states_mem_needs (no offload): 4·largest_layer + 18·P/N, plus the
        # 16-bit gradient partition the estimator omits (2·P/N): stage3.py allocates it once in __init__
        # (grad_partitions_flat_buffer) and never frees it. Measured (bench --zero, docs/plan.md): 20·P/N at
        # the step, the buffer still there after it: 4·L + 20·P/N.
        big = w.shape.largest_layer
        return (
            _ceil(wb * p, n) + wb * big,
            wb * big + _ceil((wb + fp32_grad) * p, n),
            _ceil(opt * p, n),
            _ceil(master * p, n),
            notes,
        )
    if s.kind in ("fsdp", "hsdp", "fsdp-grad-op"):
        # torch FSDP FULL_SHARD with MixedPrecision(param_dtype=dtype) and a per-block auto-wrap policy:
        # the sharded flat parameters are fp32 (the master); the root unit (embeddings, head) stays
        # gathered and two blocks are gathered at a time (current + backward prefetch). HYBRID_SHARD is
        # the same within its shard group (n: the node's GPUs), replicated across groups; SHARD_GRAD_OP
        # keeps the parameters gathered from forward to the end of backward (all of them at the peak).
        sh = w.shape
        gathered = wb * (sh.root_params + 2 * sh.block_params) if s.kind != "fsdp-grad-op" else wb * p
        unit_grad = wb * max(sh.block_params, sh.root_params)
        if w.mixed:
            return gathered, unit_grad + _ceil(4 * p, n), _ceil(opt * p, n), _ceil(4 * p, n), notes
        return gathered + _ceil(4 * p, n), unit_grad + _ceil(4 * p, n), _ceil(opt * p, n), 0, notes
    # Tensor/pipeline parallel (Megatron-LM theoretical_memory_usage.py): the most loaded shard holds
    # stage_params parameters. Without the distributed optimizer bf16 keeps fp32 main grads (18 B/param),
    # fp16 16-bit grads + an fp32 copy (20 B/param); with it, optimizer state and master weights are
    # sharded over the data-parallel ranks (Megatron docs: 6 + 12/d for bf16).
    shard = stage_params(w.shape, s)
    grads = 4 * shard if w.dtype in ("bf16", "fp8") else (wb + fp32_grad) * shard
    d = n_gpus if s.distopt else 1
    notes.append(
        "Megatron-LM layout, sequence parallel on, "
        + (f"distributed optimizer over {d} data-parallel ranks" if s.distopt else "no distributed optimizer")
    )
    if s.pp > 1:
        notes.append("layers split evenly over the stages; the first also holds the embedding")
    return wb * shard, grads, _ceil(opt * shard, d), _ceil(master * shard, d), notes


def layer_activation_elems(w: Workload, core: bool = True) -> tuple[float, float]:
    """(bytes per token, bytes per a·s²·b) one layer saves for backward, as transformers builds it.

    Counted from the tensors autograd saves (docs/plan.md#activations): RMSNorm upcasts to fp32 (4 B of
    its input for pow plus the normalised 16-bit copy the weight multiplies), LayerNorm keeps its input;
    the q/k/v projections share the norm output; attention keeps q, k and v (k and v repeated to every
    head), o_proj its input; a gated MLP keeps its input, the gate output, silu's output, the up output and
    their product (h + 4i); GPT-2's gelu_new, written as tanh arithmetic, keeps five i-wide tensors. Eager
    attention keeps the fp32 softmax and its 16-bit cast (HF Llama: 4 + 2 per score) or GPT-2's 16-bit
    softmax, dropout mask and dropped copy (2 + 1 + 2); SDPA an fp32 logsumexp per head and row.
    `core=False` leaves out the attention scores (selective recomputation recomputes the core from the
    q, k and v it keeps).
    """
    sh = w.shape
    e = w.act_bytes
    h = sh.hidden
    qw = sh.q_width or sh.heads * sh.head_dim
    vw = sh.v_width or qw
    ac = w.dtype == "autocast"
    norm = _norm_bytes(w) * h
    drop = 1 if sh.dropout > 0 else 0
    # The q/k/v input: one tensor all three save, except under autocast, where the residual stream stays
    # fp32 and each Linear saves its own bf16 cast of it (autocast caches casts of leaf weights only).
    # fp8 (Transformer Engine): a Linear saves its input as an fp8 copy (1 B) instead of the 16-bit one;
    # q/k/v share one copy (TE's fused LayerNormLinear), so do gate/up (fused fc1).
    lin = 1 if w.dtype == "fp8" else e
    per_token = 2 * norm + (e * h * 3 if ac and not sh.fused_qkv else lin * h)
    per_token += e * (3 * h if sh.fused_qkv else 2 * qw + vw)  # kept even when the core is recomputed
    sdpa = w.attention != "eager"
    if w.dtype == "fp8" and sdpa:
        # SDPA saves its output for its own backward (the storage o_proj saves otherwise): under fp8 it
        # stays, and o_proj adds its fp8 copy (TE docs: "the attention output which is saved anyway").
        per_token += (e + 1) * vw
    else:
        per_token += lin * vw  # o_proj input
    per_token += 2 * drop * h  # residual dropout masks
    if core and sdpa:
        # SDPA also saves its output, but that is the storage o_proj saves (the kernels write it in
        # [b, s, a, d] order, so transpose + reshape copy nothing): only the fp32 logsumexp is extra.
        per_token += 4 * sh.heads
    i = sh.intermediate
    # The MLP's first input and the down projection's input are Linear inputs (lin bytes); the rest stay
    # 16-bit (activation inputs and products).
    if sh.mlp_act == "gelu_new":
        mlp = lin * h + (4 * e + lin) * i
    elif sh.mlp_act == "gelu":
        mlp = lin * h + (e + lin) * i
    else:
        mlp = (2 * e * h if ac else lin * h) + (3 * e + lin) * i  # gate and up save one input, or a cast each
    if sh.experts > 1 and sh.moe_layers:
        # Routed tokens: each of the top-k experts gathers its tokens (h, fp32 under autocast, then cast
        # once per gate/up), runs a gated MLP (4·i_e) and keeps its output for the routing-weight product
        # (h); the router keeps fp32 probabilities.
        gathered = (4 + 2 * e) * h if ac else lin * h
        expert = e * h + (3 * e + lin) * sh.moe_intermediate
        routed = sh.experts_per_token * (gathered + expert) + 4 * sh.experts + e * h
        routed += (3 * e + lin) * sh.shared_intermediate
        mlp = (routed * sh.moe_layers + mlp * (sh.layers - sh.moe_layers)) / sh.layers
    per_token += mlp
    if not core or sdpa:
        per_score = 0.0
    elif sh.norm == "layer" and sh.fused_qkv:
        per_score = e + (1 + e) * drop
    else:
        per_score = 4 + (e if e < 4 else 0) + (1 + e) * drop
    return per_token, per_score


def activation_bytes(w: Workload, s: Strategy) -> int:
    """Bytes saved for backward at the end of forward, per GPU (sequence parallel divides them by t).

    No recomputation: every layer's saved tensors (layer_activation_elems). Selective: the attention core
    is recomputed, so the scores are not kept, plus one layer's scores while it is recomputed. Full: each
    layer's input, plus the whole working set of the one layer being recomputed in backward. The 1F1B
    schedule keeps L layers' worth on the first pipeline stage; without pipelining the output layer adds
    its norm, the head's input, the 16-bit logits and cross entropy's fp32 log-softmax (4 B per logit).
    """
    sh = w.shape
    seq, b, t = w.seq_len, w.micro_batch, s.tp
    tokens = seq * b
    one_layer = _one_layer(w)
    if w.recompute == "full":
        total = w.act_bytes * sh.hidden * tokens * sh.layers + one_layer
    elif w.recompute == "selective":
        lean, _ = layer_activation_elems(w, core=False)
        total = lean * tokens * sh.layers + (one_layer - lean * tokens)
    else:
        total = one_layer * sh.layers
    if s.pp == 1:
        total += output_layer_bytes(w)
    return _ceil(total, t)


def _one_layer(w: Workload) -> float:
    """Bytes one layer saves for backward with nothing recomputed (also the working set of a layer being
    recomputed under selective or full recomputation)."""
    sh = w.shape
    per_token, per_score = layer_activation_elems(w)
    return per_token * w.seq_len * w.micro_batch + per_score * sh.heads * w.seq_len * w.seq_len * w.micro_batch


def _norm_bytes(w: Workload) -> int:
    """Bytes per element a norm saves: HF RMSNorm keeps its fp32 upcast (4) and the normalised copy the
    weight multiplies (16-bit, or fp32 when the input is fp32: fp32 training and autocast's fp32 residual
    stream); LayerNorm keeps its input."""
    e = w.act_bytes
    if w.shape.norm == "rms":
        return 8 if w.dtype in ("fp32", "autocast") else 4 + e
    return 4 if w.dtype == "autocast" else e


def output_layer_bytes(w: Workload) -> int:
    """The final norm, the head's input, the 16-bit logits the model returns and the fp32 log-softmax."""
    sh = w.shape
    e = w.act_bytes
    norm = _norm_bytes(w)
    logits = (e + 4) if e < 4 else 8
    return int(w.seq_len * w.micro_batch * ((norm + e) * sh.hidden + logits * sh.vocab))


def backward_workspace_bytes(w: Workload, s: Strategy, loss: bool = True) -> int:
    """Transient tensors of backward on top of the saved activations, at their largest.

    Cross entropy's backward holds the fp32 gradient of the log-softmax and the fp32 gradient of the
    logits it makes (8 B per logit) while the saved log-softmax still exists; an eager layer's softmax
    backward holds the 16-bit gradient of the probabilities and fp32 gradients in and out ((e + 8) per
    score); an MLP's backward the gradients of its i-wide intermediates. The largest counts (the output
    layer only without pipelining, on the last stage). `loss=False`: a moment after the output layer's
    backward, when only a layer's transients remain.
    """
    sh = w.shape
    e = w.act_bytes
    tokens = w.seq_len * w.micro_batch
    loss = 8 * tokens * sh.vocab if s.pp == 1 and loss else 0
    scores = (e + 8) * sh.heads * w.seq_len * w.seq_len * w.micro_batch if w.attention == "eager" else 0
    width = sh.moe_intermediate * sh.experts_per_token if sh.moe_layers else sh.intermediate
    mlp = 4 * e * width * tokens
    return _ceil(max(loss, scores, mlp), s.tp)


def input_bytes(w: Workload) -> int:
    """Token ids and labels of one micro-batch: two int64 tensors of s·b."""
    return 2 * 8 * w.seq_len * w.micro_batch


def temporary_bytes(w: Workload, s: Strategy, grads_per_gpu: int) -> int:
    """Communication buffers that exist besides the items above."""
    p = w.shape.params
    wb = w.weight_bytes
    # autocast caches a bf16 cast of every weight the forward uses, and autograd keeps each until its
    # layer's backward: 2 B per parameter held by this GPU's shard of the model.
    return autocast_cast_bytes(w, s) + _buckets(w, s, grads_per_gpu, p, wb)


def autocast_cast_bytes(w: Workload, s: Strategy) -> int:
    """The bf16 copies torch.autocast makes of the weights, kept by autograd until backward: 2 B for each
    weight a matmul uses. Embeddings are looked up, not multiplied, so never cast, except a tied word
    embedding, which is also the output layer's weight (measured: bench/plan_vs_measured.py)."""
    if w.dtype != "autocast":
        return 0
    sh = w.shape
    looked_up = sh.positions + (0 if sh.tied else sh.vocab * sh.hidden)
    return 2 * max(0, stage_params(sh, s) - -(-looked_up // s.tp))


def _buckets(w: Workload, s: Strategy, grads_per_gpu: int, p: int, wb: int) -> int:
    if s.kind == "ddp":
        # DDP's buckets hold a flat copy of every gradient unless gradient_as_bucket_view=True (PyTorch
        # DistributedDataParallel docs: "the saved memory size will be equal to the total gradients size").
        return grads_per_gpu
    if s.kind in ("zero1", "zero2", "zero3") or s.dp.startswith("zero"):
        # DeepSpeed allocates one reduce_bucket_size 16-bit buffer whatever the model's size: stages 1/2
        # at each backward (ipg_buffer, contiguous_gradients), stage 3 once (its ipg flat buffer). The
        # allgather bucket is a chunk size, not a buffer; stage 3's prefetched parameters are counted
        # with the parameters. Measured on 2 gloo ranks (bench/plan_vs_measured.py --zero): 953 MiB.
        return wb * ZERO_BUCKET_ELEMENTS
    # FSDP reduce-scatters each unit's gradient into the shard it keeps (counted in gradients); Megatron
    # all-reduces its contiguous grad buffer in place: nothing extra.
    return 0


def breakdown(
    w: Workload, s: Strategy, n_gpus: int, overhead: Overhead, nodes: int = 1, accumulating: bool = False
) -> tuple[Breakdown, list[str]]:
    """Every item of GPU memory for one strategy at the step's peak; `n_gpus` is the data-parallel degree,
    `accumulating`: gradients are accumulated over several micro-batches per optimizer step. The peak is
    the larger of two moments (see moments)."""
    if w.inference:
        return _inference(w, s, overhead)
    backward, at_step, notes = moments(w, s, n_gpus, overhead, nodes, accumulating)
    if at_step is not None and at_step.total > backward.total:
        notes = [n for n in notes if not n.startswith("peak at ")]
        return at_step, [*notes, STEP_PEAK_NOTE if at_step.optimizer_step else STEP_PEAK_NOTE_FUSED]
    return backward, notes


def moments(
    w: Workload, s: Strategy, n_gpus: int, overhead: Overhead, nodes: int = 1, accumulating: bool = False
) -> tuple[Breakdown, Optional[Breakdown], list[str]]:
    """(backward, optimizer step, notes): the items at backward's peak, and at the optimizer step where
    the optimizer is torch.optim's (None for DeepSpeed and Megatron, whose model states already are those
    of their largest moment)."""
    params, grads, opt, master, notes = model_states(w, s, n_gpus)
    # LoRA and offload act on what the data-parallel ranks shard: under tp=T,zeroK the tensor-parallel shard.
    sw, ss = tp_shard_view(w, s) if s.kind == "tp" and s.dp else (w, s)
    if w.lora_rank:
        params, grads, opt, master, note = _lora(sw, ss, n_gpus)
        notes = [*notes, note]
    host = nvme = 0
    if w.offload != "none":
        ranks_per_node = max(1, n_gpus * s.model_parallel // max(1, nodes))
        params, grads, opt, master, host, nvme, note = _offload(sw, ss, n_gpus, params, nodes, ranks_per_node)
        notes = [*notes, note]
    fp8 = fp8_weight_bytes(w, s)
    acts, workspace = activation_bytes(w, s), backward_workspace_bytes(w, s)
    step_grads = grads  # every gradient (or FSDP's whole gradient shard) exists at the optimizer step
    if (s.kind in FSDP_KINDS or s.dp == "fsdp") and not w.lora_rank and not w.inference:
        grads, acts, workspace, note = _fsdp_peak(w, s, sw, n_gpus, accumulating)
        notes = [*notes, note]
    backward = Breakdown(
        parameters=params,
        gradients=grads,
        optimizer=opt,
        master=master,
        activations=acts,
        inputs=input_bytes(w),
        temporary=temporary_bytes(w, s, grads),
        overhead=overhead.total,
        workspace=workspace,
        host=host,
        fp8_weights=fp8,
        nvme=nvme,
    )
    if not _torch_optimizer(s):
        return backward, None, notes
    # The optimizer step is the other candidate for the peak: the activations, backward's transients and
    # the weight copies autocast or fp8 kept for backward are gone; every gradient, the buckets and the
    # optimizer's own transients are there. It wins when activations are small beside the optimizer state.
    at_step = replace(
        backward,
        gradients=step_grads,
        activations=0,
        workspace=0,
        fp8_weights=0,
        temporary=backward.temporary - autocast_cast_bytes(w, s),  # the buckets stay
        optimizer_step=optimizer_step_bytes(w, s, opt) + _fp32_grad_cast(w, s),
    )
    return backward, at_step, notes


def _fp32_grad_cast(w: Workload, s: Strategy) -> int:
    """DDP under mixed precision: the optimizer steps the fp32 master on an fp32 copy of the gradients; with
    the 16-bit ones freed as each is cast (bench/plan_vs_measured.py's recipe, measured) that is 4 - 2 B
    more per parameter at the step. FSDP's and autocast's gradients are fp32 already."""
    if s.kind != "ddp" or not w.mixed or w.lora_rank:
        return 0
    return (4 - w.weight_bytes) * w.shape.params


STEP_PEAK_NOTE = (
    "peak at the optimizer step: the activations are freed by then, and torch's default (foreach) Adam/AdamW "
    "holds sqrt(exp_avg_sq) for every parameter it steps at once (4 B per parameter; "
    "--optimizer adamw_torch_fused holds none); under mixed precision the fp32 copy of the gradients the "
    "master steps on is counted there too (JSON optimizer_step)"
)
STEP_PEAK_NOTE_FUSED = (
    "peak at the optimizer step: the activations are freed by then, every gradient is there (under mixed "
    "precision with its fp32 copy for the master, JSON optimizer_step)"
)
# Optimizers whose torch implementation makes a whole-state-sized temporary at the step.
FOREACH_TRANSIENT = {"adamw": 0.5, "adam": 0.5}  # sqrt(exp_avg_sq): half of their 8 B of state
# Strategies whose optimizer is torch.optim (DDP, FSDP): DeepSpeed (its config's Adam/AdamW is FusedAdam)
# and Megatron (apex/TE FusedAdam) step with fused kernels that make no such temporary.
TORCH_OPTIMIZER_KINDS = ("ddp", "fsdp", "hsdp", "fsdp-grad-op")


def _torch_optimizer(s: Strategy) -> bool:
    return s.kind in TORCH_OPTIMIZER_KINDS or (s.kind == "tp" and s.dp == "fsdp")


def optimizer_step_bytes(w: Workload, s: Strategy, optimizer_bytes_per_gpu: int) -> int:
    """The transient tensors of the optimizer step on one GPU. torch.optim's default implementation on CUDA
    is foreach (torch/optim/optimizer.py _default_to_fused_or_foreach), and its Adam/AdamW takes
    `exp_avg_sq_sqrt = torch._foreach_sqrt(device_exp_avg_sqs)` for the whole parameter group at once
    (torch/optim/adam.py _multi_tensor_adam): one more copy of the second moment. Measured on CPU with
    foreach=True (bench/plan_vs_measured.py --optimizer-step): peak = parameters + gradients + state + 4 B per
    parameter; fused=True: + 0; the for-loop path: + two temporaries of the largest tensor."""
    if w.inference or not _torch_optimizer(s):
        return 0
    return int(FOREACH_TRANSIENT.get(w.optimizer, 0.0) * optimizer_bytes_per_gpu)


FSDP_KINDS = ("fsdp", "hsdp", "fsdp-grad-op")


def _fsdp_peak(w: Workload, s: Strategy, sw: Workload, n: int, accumulating: bool) -> tuple[int, int, int, str]:
    """(gradients, activations, workspace, note) of FSDP at its peak, the larger of two moments.

    Measured item by item (bench/plan_vs_measured.py --zero --stages 0 --detail, docs/plan.md): under FSDP
    the sum of the step's items never coexists. Gradients are set to None after each step (torch.optim's
    zero_grad(set_to_none=True), the default since torch 2.0), so none exists when backward begins, while
    every activation is saved and the loss's backward holds its fp32 transients: that is the peak on every
    model measured. From there each block's backward frees its activations and adds its gradient shard,
    both linearly, so the other candidate is the end of backward: every fp32 gradient shard, the root
    unit's and one block's unsharded 16-bit gradients before their reduce-scatter (FSDP2 reduce-scatters a
    unit in its post-backward hook; the root's, holding the head and embeddings, runs last), and one layer's
    activations. The gathered parameters (the root unit, kept unsharded after forward "because the root
    module is typically required immediately when the backward pass begins", fully_shard's
    reshard_after_forward; the block being computed and the one prefetched) are in `parameters` at both.
    Accumulating over micro-batches keeps the gradient shard from one backward to the next.
    """
    sh = sw.shape
    shard = _ceil(4 * sh.params, n)  # fp32 gradient shard (the sharded parameters are fp32)
    start_grads = shard if accumulating else 0
    start = start_grads + activation_bytes(w, s) + backward_workspace_bytes(w, s)
    end_grads = shard + sw.weight_bytes * (sh.root_params + sh.block_params)
    end_acts = _ceil(_one_layer(w), s.tp)
    end_ws = backward_workspace_bytes(w, s, loss=False)
    if end_grads + end_acts + end_ws > start:
        return end_grads, end_acts, end_ws, (
            "peak at the end of backward (every gradient shard made, one layer's activations left)"
        )
    held = "the gradient shard accumulated so far" if accumulating else "no gradient yet: zero_grad sets them to None"
    return start_grads, activation_bytes(w, s), backward_workspace_bytes(w, s), (
        f"peak at the start of backward (every activation saved, the loss's backward; {held})"
    )


FP8_NOTE = (
    "fp8: Transformer Engine layout (bf16 weights, fp32 master); one fp8 copy of each block Linear's weight "
    "and of its saved input counted (TE's memory example, Hopper/Ada); TE's fp8 weight cache across "
    "micro-batches (is_first_microbatch) keeps the rowwise copy too: +1 B per block parameter; the output "
    "layer, norms and attention stay 16-bit"
)


def fp8_weight_bytes(w: Workload, s: Strategy) -> int:
    """--dtype fp8: the fp8 copy of every block Linear's weight that Transformer Engine saves for backward
    (TE docs, Performance Considerations / Memory usage: after a Linear's forward, "1 MB (weight in FP8)"
    beside the 2 MB bf16 weight of a 1024 x 1024 layer). On Hopper the copy kept is the transposed
    (columnwise) one; on Blackwell one copy serves both uses. Amax history and scales (a few floats per
    tensor; MXFP8 scales 1/32 B per element) are left out. Every layer's copy is alive at the end of
    forward, whatever ZeRO-3/FSDP does with the 16-bit shard; tensor and pipeline parallel split it."""
    if w.dtype != "fp8":
        return 0
    sh = w.shape
    norms = 2 * sh.hidden * sh.layers  # the two norm weights per block: not Linears
    linears = max(0, sh.params - sh.root_params - norms)
    return _ceil(_ceil(linears, s.pp), s.tp)


def _offload(
    w: Workload, s: Strategy, n: int, params: int, nodes: int, ranks_per_node: int
) -> tuple[int, int, int, int, int, int, str]:
    """(parameters, gradients, optimizer, master, host RAM per node, NVMe per node, note) with DeepSpeed's
    offload, as its estimators count it (estimate_zero2/zero3_model_states_mem_needs, additional_buffer_factor
    1.5).

    ZeRO-1/2 offload_optimizer: the 16-bit parameters stay (2P), everything else is on the host,
    P·max(4·N, 16)·1.5 bytes. ZeRO-3 offload_optimizer: 4·largest_layer + 2P/N on the GPU, 16P·1.5 per node
    on the host; with offload_param too: 4·largest_layer on the GPU, 18P·1.5 per node. NVMe (ZeRO-Infinity,
    ZeRO-3 only): the same GPU bytes; the states go to NVMe and the host keeps DeepSpeed's pinned buffers
    (_nvme_offload).
    """
    p = w.shape.params
    nvme = w.offload.startswith("nvme-")
    what = w.offload.removeprefix("nvme-")
    if s.kind in ("zero1", "zero2"):
        host = int(p * max(4 * n, 16) * HOST_BUFFER_FACTOR)
        return params, 0, 0, 0, host, 0, _host_note("optimizer", host)
    if s.kind == "zero3":
        big = w.weight_bytes * w.shape.largest_layer
        gpu = (big, big) if what == "optimizer+params" else (params, big)
        if nvme:
            host, disk, note = _nvme_offload(w, n, ranks_per_node)
            return *gpu, 0, 0, host, disk, note
        if what == "optimizer+params":
            host = int(18 * p * HOST_BUFFER_FACTOR * ranks_per_node / n)
            return *gpu, 0, 0, host, 0, _host_note("parameters and optimizer", host)
        host = int(16 * p * HOST_BUFFER_FACTOR * ranks_per_node / n)
        return *gpu, 0, 0, host, 0, _host_note("optimizer", host)
    return params, *model_states(w, s, n)[1:4], 0, 0, f"{s.label}: no DeepSpeed offload; --offload ignored"


def _nvme_offload(w: Workload, n: int, ranks_per_node: int) -> tuple[int, int, str]:
    """(pinned host RAM per node, NVMe bytes per node, note) of ZeRO-Infinity with DeepSpeed's defaults.

    Optimizer (offload_optimizer.device nvme): each rank writes its fp32 master, fp32 gradients and
    optimizer state to NVMe and keeps in host RAM the swapper's buffer_count (4) buffers plus one fp32
    gradient buffer, each of its largest sub-group (min(sub_group_size 1e9, P/N) elements, 4 B): stage3.py
    initialize_optimizer_states and optimizer_utils.py's SwapBufferManager. Parameters (offload_param.device
    nvme): a pool of buffer_count (5) x buffer_size (1e8) 16-bit elements, and up to max_in_cpu (1e9)
    elements of the rank's 16-bit partition in host memory; the rest of the partition on NVMe.
    """
    wb = w.weight_bytes
    part = -(-w.shape.params // n)  # this rank's partition of the parameters
    sub_group = min(NVME_SUB_GROUP_SIZE, part)
    host = (NVME_OPT_BUFFER_COUNT + 1) * sub_group * 4
    master = 4 if w.mixed else 0
    disk = int((master + 4 + optimizer_bytes(w)) * part)
    what = "optimizer"
    if w.offload == "nvme-optimizer+params":
        what = "parameters and optimizer"
        in_cpu = min(NVME_MAX_IN_CPU, part)
        host += NVME_PARAM_BUFFER_COUNT * NVME_PARAM_BUFFER_SIZE * wb + in_cpu * wb
        disk += (part - in_cpu) * wb
    host, disk = host * ranks_per_node, disk * ranks_per_node
    note = (
        f"{what} on NVMe (ZeRO-Infinity): {disk / GIB:.1f} GiB of NVMe and {host / GIB:.1f} GiB of pinned "
        "host RAM per node (DeepSpeed defaults: offload_optimizer buffer_count 4, sub_group_size 1e9"
        + ("; offload_param buffer_count 5 x buffer_size 1e8, max_in_cpu 1e9" if what != "optimizer" else "")
        + ")"
    )
    return host, disk, note


# bitsandbytes NF4 with double quantisation (QLoRA, Dettmers et al. 2023 §2): 4 bits per weight, an
# 8-bit absmax per block of 64 and an fp32 constant per 256 of those: 0.5 + 1/64 + 4/(64·256) B/param.
NF4_BYTES = 0.5 + 1 / 64 + 4 / (64 * 256)


def lora_params(shape: ModelShape, rank: int) -> int:
    """Parameters of LoRA adapters (A: in x r, B: r x out) on every Linear of every block (PEFT's
    target_modules="all-linear": q, k, v, o and the MLP's projections)."""
    h, i = shape.hidden, shape.intermediate
    qw = shape.q_width or shape.heads * shape.head_dim
    kvw = shape.kv_heads * shape.head_dim
    attn = (h + qw) + 2 * (h + kvw) + (qw + h)
    mlp = (3 if shape.mlp_act == "silu" else 2) * (h + i)
    return shape.layers * rank * (attn + mlp)


def _lora(w: Workload, s: Strategy, n: int) -> tuple[int, int, int, int, str]:
    """LoRA/QLoRA: the frozen base holds only its weights (16-bit, or NF4 in the blocks' Linears under
    QLoRA), sharded as the strategy shards parameters; the adapters train in fp32 (PEFT's default under
    mixed precision) with gradients and optimizer state, replicated (they are small)."""
    sh = w.shape
    frozen_blocks = sh.params - sh.root_params
    base = (NF4_BYTES if w.qlora else w.weight_bytes) * frozen_blocks + w.weight_bytes * sh.root_params
    if s.kind in ("zero3", "fsdp", "hsdp"):
        base = _ceil(base, n)
    elif s.kind == "tp":
        base = _ceil(base, s.model_parallel)
    t = lora_params(sh, w.lora_rank)
    opt = int(optimizer_bytes(w) * t)
    what = "QLoRA (NF4 base)" if w.qlora else "LoRA"
    note = f"{what} rank {w.lora_rank}: {t:,} trainable parameters ({t / sh.params:.2%}); the base is frozen"
    return int(base) + 4 * t, 4 * t, opt, 0, note


def kv_cache_bytes(w: Workload, s: Strategy) -> int:
    """Keys and values of every layer for micro_batch sequences of seq_len tokens, 16-bit (fp32 under
    --dtype fp32), split over tensor-parallel ranks. Grouped-query attention caches kv_heads heads;
    transformers' DeepSeek MLA caches the decompressed keys (a·(nope + rope)) and values (a·v)."""
    sh = w.shape
    if sh.q_width and sh.v_width and sh.q_width != sh.heads * sh.head_dim:  # MLA
        per_token = sh.q_width + sh.v_width
    else:
        per_token = 2 * sh.kv_heads * sh.head_dim
    return _ceil(per_token * sh.layers * w.seq_len * w.micro_batch * w.act_bytes, s.tp)


def _inference(w: Workload, s: Strategy, overhead: Overhead) -> tuple[Breakdown, list[str]]:
    """Serving with transformers/vLLM-style TP: the weights, the KV cache, and the prefill's working set of
    one layer (its MLP intermediates, or eager attention's scores) and the last token's fp32 logits."""
    sh = w.shape
    e = w.act_bytes
    tokens = w.seq_len * w.micro_batch
    width = sh.moe_intermediate * sh.experts_per_token if sh.moe_layers else sh.intermediate
    prefill = 3 * e * width * tokens
    if w.attention == "eager":
        prefill = max(prefill, (4 + e) * sh.heads * w.seq_len * w.seq_len * w.micro_batch)
    logits = 4 * sh.vocab * w.micro_batch
    return (
        Breakdown(
            parameters=_ceil(w.weight_bytes * (stage_params(sh, s) if s.kind == "tp" else sh.params), 1),
            gradients=0,
            optimizer=0,
            master=0,
            activations=_ceil(prefill, s.tp) + logits,
            inputs=8 * tokens,
            temporary=0,
            overhead=overhead.total,
            kv_cache=kv_cache_bytes(w, s),
        ),
        [f"inference: KV cache for {w.micro_batch} x {w.seq_len} tokens"],
    )


def _host_note(what: str, host: int) -> str:
    return f"{what} offloaded: needs {host / GIB:.1f} GiB of host RAM per node (DeepSpeed's estimate)"


def _ceil(value: float, n: int) -> int:
    """Bytes per GPU when `value` bytes are split n ways (the largest shard)."""
    return -(-int(value) // n)
