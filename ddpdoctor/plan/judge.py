"""Which strategy fits: verdicts per strategy, the cheapest that fits, and what to change. Pure."""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from typing import Any, Optional, Sequence

from ddpdoctor.plan.memory import (
    FP8_NOTE,
    Breakdown,
    Overhead,
    Strategy,
    Workload,
    breakdown,
    layer_activation_elems,
    overhead_for,
    process_groups,
)
from ddpdoctor.plan.shape import ModelShape
from ddpdoctor.plan.units import GIB

# Cheapest first, by what each costs besides memory: DDP all-reduces once; ZeRO-1/2 add bookkeeping but
# move the same bytes; FSDP/ZeRO-3 gather parameters again in backward (1.5x the traffic); tensor
# parallel puts collectives inside every layer (NVLink needed); pipelines add bubbles.
COST_ORDER = ("ddp", "zero1", "zero2", "fsdp-grad-op", "hsdp", "fsdp", "zero3", "tp")
DEFAULT_KINDS = ("ddp", "zero1", "zero2", "fsdp", "zero3")  # the others on request (--strategy)
TIGHT_FRACTION = 0.05  # under 5% headroom, allocator fragmentation alone can tip a job over
_STRATEGY = re.compile(
    r"^(ddp|zero1|zero2|zero3|fsdp|hsdp|fsdp-grad-op)$|^hsdp=(\d{1,5})$"
    r"|^tp=(\d{1,4})(?:,pp=(\d{1,4}))?(,dopt)?(?:,(zero1|zero2|zero3|fsdp))?$"
)
TP_DP_KINDS = ("zero1", "zero2", "zero3", "fsdp")  # what may shard a tensor-parallel shard (tp=T,zero1)


def parse_strategy(text: str) -> Strategy:
    """`zero2`, `hsdp=8`, `tp=4,pp=2` or `tp=4,zero1` -> Strategy. ValueError when malformed."""
    m = _STRATEGY.match(text.strip().lower().replace(" ", ""))
    if not m:
        raise ValueError(
            f"unknown --strategy {text!r}; one of ddp, zero1, zero2, zero3, fsdp, hsdp[=R], fsdp-grad-op, "
            "tp=T[,pp=P][,dopt][,zero1|zero2|zero3|fsdp]"
        )
    if m.group(1):
        return Strategy(m.group(1))
    if m.group(2):
        group = int(m.group(2))
        if group < 1:
            raise ValueError(f"--strategy {text!r}: the shard group must be at least 1 GPU")
        return Strategy("hsdp", group=group)
    tp, pp = int(m.group(3)), int(m.group(4) or 1)
    if tp < 1 or pp < 1:
        raise ValueError(f"--strategy {text!r}: tp and pp must be at least 1")
    if m.group(5) and m.group(6):
        raise ValueError(
            f"--strategy {text!r}: dopt (Megatron's distributed optimizer) already shards the optimizer over "
            "the data-parallel ranks; give dopt or a ZeRO/FSDP stage, not both"
        )
    return Strategy("tp", tp, pp, distopt=bool(m.group(5)), dp=m.group(6) or "")


def default_strategies(gpus_per_node: int, shape: Optional[ModelShape] = None) -> list[Strategy]:
    """All strategies; tensor parallel at the largest degree that is valid: within the node (NVLink
    reach, at most 8), dividing the node's GPUs, the attention heads and the key/value heads."""
    out = [Strategy(kind) for kind in DEFAULT_KINDS]
    tp = max(
        t
        for t in range(1, min(gpus_per_node, 8) + 1)
        if gpus_per_node % t == 0 and (shape is None or (shape.heads % t == 0 and shape.kv_heads % t == 0))
    )
    if tp > 1:
        out.append(Strategy("tp", tp))
    return out


@dataclass(frozen=True)
class Hardware:
    """The GPUs: per-node count, node count, the smallest GPU's memory (None when unknown) and name."""

    gpus_per_node: int
    nodes: int = 1
    memory: Optional[int] = None
    name: Optional[str] = None
    generation: str = "unknown"
    source: str = "--gpu-mem"  # where memory came from: nvml, nvidia-smi, snapshot, --gpu-mem, none
    note: Optional[str] = None  # why memory is unknown, or what was assumed

    @property
    def total_gpus(self) -> int:
        return self.gpus_per_node * self.nodes


@dataclass(frozen=True)
class Row:
    strategy: Strategy
    data_parallel: int
    memory: Optional[Breakdown] = None
    verdict: str = "unknown"  # fits, tight, does_not_fit, unknown, invalid
    headroom: Optional[int] = None  # capacity - total (negative: short by)
    notes: tuple[str, ...] = ()
    overhead: Optional[Overhead] = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "strategy": self.strategy.label,
            "kind": self.strategy.kind,
            "tp": self.strategy.tp,
            "pp": self.strategy.pp,
            "data_parallel": self.data_parallel,
            # Fields added within ddpdoctor.plan/1: tp=T,zeroK's data-parallel sharding; hsdp's shard group.
            "dp_sharding": self.strategy.dp or None,
            "shard_group": self.strategy.group or None,
            "bytes": self.memory.to_dict() if self.memory else None,
            "verdict": self.verdict,
            "headroom_bytes": self.headroom,
            "overhead_bytes": self.overhead.to_dict() if self.overhead else None,
            "notes": list(self.notes),
        }


@dataclass
class Plan:
    workload: Workload
    hardware: Hardware
    rows: list[Row]
    cheapest: Optional[str] = None
    summary: str = ""
    advice: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def exit_code(self) -> int:
        """0 a strategy fits; 1 none fits; 2 every strategy asked for is impossible on these GPUs;
        3 no GPU memory known (nothing judged)."""
        if self.rows and all(r.verdict == "invalid" for r in self.rows):
            return 2  # a layout that cannot exist was asked for: nothing was judged, nothing is too big
        if self.hardware.memory is None:
            return 3
        return 0 if self.cheapest else 1


def _invalid(s: Strategy, w: Workload, hw: Hardware) -> Optional[str]:
    if w.inference and s.kind not in ("ddp", "tp"):
        return f"{s.kind} shards training state: for inference use a replica per GPU (ddp) or tp"
    if w.offload.startswith("nvme-") and (s.kind in ("zero1", "zero2") or s.dp in ("zero1", "zero2")):
        # DeepSpeed config docs: "NVMe offloading is available only with ZeRO stage 3".
        return "NVMe offload needs ZeRO-3 (DeepSpeed offers it only with stage 3)"
    if s.kind == "hsdp" and s.group:
        if s.group > hw.total_gpus or hw.total_gpus % s.group:
            return f"a shard group of {s.group} GPUs does not divide {hw.total_gpus} GPUs"
        return None
    if s.kind != "tp":
        return None
    if s.model_parallel > hw.total_gpus or hw.total_gpus % s.model_parallel:
        return f"tp*pp = {s.model_parallel} does not divide {hw.total_gpus} GPUs"
    if s.tp > hw.gpus_per_node:
        return f"tp={s.tp} spans nodes ({hw.gpus_per_node} GPUs per node): tensor parallel needs NVLink"
    if w.shape.heads % s.tp:
        return f"{w.shape.heads} attention heads do not split {s.tp} ways"
    if w.shape.kv_heads % s.tp:
        # Megatron-LM asserts num_query_groups % tensor_model_parallel_size == 0.
        return f"{w.shape.kv_heads} key/value heads do not split {s.tp} ways"
    if s.pp > w.shape.layers:
        return f"pp={s.pp} is more stages than the {w.shape.layers} layers"
    if s.pp > 1 and s.dp in ("zero2", "zero3"):
        # DeepSpeed's PipelineEngine asserts "ZeRO-2 and ZeRO-3 are incompatible with pipeline parallelism".
        return f"{s.dp} with pp={s.pp}: DeepSpeed's pipeline engine allows ZeRO-1 only"
    return None


def judge_row(w: Workload, s: Strategy, hw: Hardware) -> Row:
    """One strategy's bytes per GPU and its verdict against the GPU's memory (unknown without one)."""
    dp = hw.total_gpus // s.model_parallel if s.kind == "tp" else hw.total_gpus
    reason = _invalid(s, w, hw)
    if reason:
        return Row(s, dp, verdict="invalid", notes=(reason,))
    overhead = overhead_for(hw.generation, hw.name, hw.gpus_per_node, process_groups(s, hw.total_gpus))
    # HYBRID_SHARD shards within a group (hsdp=R; plain hsdp: a node) and replicates across groups.
    shard = (s.group or min(dp, hw.gpus_per_node)) if s.kind == "hsdp" else dp
    accumulating = bool(w.global_batch) and w.global_batch > w.micro_batch * dp
    mem, notes = breakdown(w, s, shard, overhead, hw.nodes, accumulating)
    if w.global_batch and not w.inference:
        per_step = w.micro_batch * dp
        if w.global_batch % per_step:
            why = f"global batch {w.global_batch} is not a multiple of micro-batch x {dp} replicas = {per_step}"
            return Row(s, dp, verdict="invalid", notes=(why,))
        # Accumulating gradients over micro-batches reuses the same buffers; only FSDP's peak changes (its
        # gradient shard then outlives a backward: breakdown's `accumulating`).
        notes = [*notes, f"global batch {w.global_batch}: {w.global_batch // per_step} accumulation step(s)"]
    if (s.kind in ("zero1", "zero2", "zero3", "fsdp", "hsdp", "fsdp-grad-op") or s.dp) and shard == 1:
        notes = [*notes, "one GPU: nothing to shard across"]
    if hw.memory is None:
        return Row(s, dp, mem, "unknown", None, tuple(notes), overhead)
    headroom = hw.memory - mem.total
    if headroom < 0:
        verdict = "does_not_fit"
    elif headroom < TIGHT_FRACTION * hw.memory:
        verdict = "tight"
    else:
        verdict = "fits"
    return Row(s, dp, mem, verdict, headroom, tuple(notes), overhead)


def _gib(n: float) -> str:
    return f"{n / GIB:.1f} GiB"


def cost_rank(s: Strategy) -> tuple[int, int, int, int]:
    """Sort key, cheapest first: COST_ORDER, then fewer pipeline stages, then less tensor parallel, then
    the data-parallel sharding under tp (none, then ZeRO-1, ZeRO-2, FSDP, ZeRO-3: more traffic)."""
    dp = ("", "zero1", "zero2", "fsdp", "zero3").index(s.dp)
    return (COST_ORDER.index(s.kind), s.pp, s.tp, dp)


def _cheapest(rows: Sequence[Row]) -> Optional[Row]:
    """The cheapest row that fits comfortably, else the cheapest that fits tightly, whatever the order given."""
    ranked = sorted(rows, key=lambda r: cost_rank(r.strategy))
    for verdict in ("fits", "tight"):
        for row in ranked:
            if row.verdict == verdict:
                return row
    return None


@dataclass(frozen=True)
class Alternative:
    """A change of flags that was re-planned and makes `strategy` fit with `total` bytes per GPU."""

    flags: str
    workload: Workload
    hardware: Hardware
    strategy: str
    total: int
    tight: bool = False

    def describe(self) -> str:
        fit = "fits tightly" if self.tight else "fits"
        return f"{self.flags}: {self.strategy} {fit} ({_gib(self.total)} per GPU)"


def find_alternatives(
    w: Workload, hw: Hardware, strategies: Sequence[Strategy], limit: int = 3
) -> list[Alternative]:
    """Changes that make some strategy fit, each re-planned; the least disruptive first."""
    tries: list[tuple[str, Workload, Hardware]] = []
    if w.recompute == "none" and w.attention == "eager":
        tries.append(("--attention sdpa", replace(w, attention="sdpa"), hw))
    if w.recompute == "none":
        tries.append(("--recompute selective", replace(w, recompute="selective"), hw))
    if w.recompute != "full":
        tries.append(("--recompute full", replace(w, recompute="full"), hw))
    b = w.micro_batch // 2
    while b >= 1:
        tries.append((f"--micro-batch {b}", replace(w, micro_batch=b), hw))
        b //= 2
    lean = replace(w, micro_batch=1, recompute="full")
    # Only the flags that change something: at micro-batch 1 the lean run is just "--recompute full".
    lean_flags = " ".join(
        flag
        for flag, changes in (
            ("--micro-batch 1", w.micro_batch != 1),
            ("--recompute full", w.recompute != "full"),
        )
        if changes
    )
    if lean != w:
        tries.append((lean_flags, lean, hw))
    if w.optimizer in ("adamw", "adam"):
        # Fused AdamW keeps the same state without foreach's step-time copy of it: it helps where the step
        # is the peak, and changes nothing else.
        tries.append(("--optimizer adamw_torch_fused", replace(w, optimizer="adamw-fused"), hw))
    if w.optimizer in ("adamw", "adamw-fused"):
        tries.append(("--optimizer adamw8bit", replace(w, optimizer="adamw8bit"), hw))
    # More GPUs shrink sharded model states, never activations: try them as they are, then lean.
    for nodes in (2, 4, 8, 16, 32, 64, 128, 256):
        if nodes > hw.nodes:
            more = replace(hw, nodes=nodes)
            gpus = f"--nodes {nodes} ({nodes * hw.gpus_per_node} GPUs)"
            tries.append((gpus, w, more))
            if lean != w:
                tries.append((f"{lean_flags} {gpus}", lean, more))
    out: list[Alternative] = []
    seen: set[tuple[Workload, Hardware]] = set()
    for flags, w2, hw2 in tries:
        if (w2, hw2) in seen:  # e.g. "--micro-batch 1 --recompute full" when the micro-batch is already 1
            continue
        seen.add((w2, hw2))
        best = _cheapest([judge_row(w2, s, hw2) for s in strategies])
        if best is not None and best.memory is not None:
            tight = best.verdict == "tight"
            out.append(Alternative(flags, w2, hw2, best.strategy.label, best.memory.total, tight))
            if len(out) >= limit:
                break
    return out


def _workload_notes(w: Workload) -> list[str]:
    notes = [FP8_NOTE] if w.dtype == "fp8" else []
    if w.optimizer.startswith("paged-"):
        notes.append(
            "paged optimizer: its state lives in CUDA unified memory and is evicted to host RAM only under "
            "memory pressure; it is counted on the GPU"
        )
    if w.shape.estimated:
        notes.append(
            f"shape estimated from the parameter count (h={w.shape.hidden}, {w.shape.layers} layers, "
            f"{w.shape.heads} heads, vocabulary {w.shape.vocab}): activations are approximate; give --config"
        )
    if w.recompute == "none" and w.attention == "eager":
        per_token, per_score = layer_activation_elems(w)
        scores = per_score * w.shape.heads * w.seq_len
        share = scores / (per_token + scores)
        if share > 0.5:
            notes.append(
                f"attention scores are {share:.0%} of each layer's activations (eager attention); "
                "FlashAttention or PyTorch SDPA (transformers' default) does not keep them: --attention sdpa"
            )
    return notes


def make_plan(w: Workload, hw: Hardware, strategies: Optional[Sequence[Strategy]] = None) -> Plan:
    """Judge every strategy; name the cheapest that fits, or what to change."""
    chosen = list(strategies) if strategies else default_strategies(hw.gpus_per_node, w.shape)
    rows = [judge_row(w, s, hw) for s in chosen]
    plan = Plan(w, hw, rows, notes=_workload_notes(w))
    if all(r.verdict == "invalid" for r in rows):
        why = "; ".join(f"{r.strategy.label}: {r.notes[0]}" for r in rows if r.notes)
        plan.summary = (
            f"No strategy asked for can be laid out on {hw.total_gpus} GPU(s) "
            f"({hw.nodes} node(s) x {hw.gpus_per_node}): {why}. Ask for one that can (tp*pp dividing the "
            "GPU count, tp within a node and dividing the attention heads), or leave out --strategy."
        )
        return plan
    if hw.memory is None:
        plan.summary = (
            f"No GPU memory to judge against: {hw.note or 'no GPU found'}. Per-GPU bytes are below; "
            "give --gpu-mem (e.g. --gpu-mem 80GiB) for a verdict."
        )
        return plan
    best = _cheapest(rows)
    where = f"{hw.total_gpus} x {_gib(hw.memory)}" + (f" ({hw.name})" if hw.name else "")
    if best is not None and best.memory is not None and best.headroom is not None:
        plan.cheapest = best.strategy.label
        plan.summary = (
            f"Cheapest strategy that fits: {best.strategy.label} on {where}: "
            f"{_gib(best.memory.total)} per GPU, {_gib(best.headroom)} headroom"
            + (" (tight: under 5%, allocator fragmentation may not fit)" if best.verdict == "tight" else "")
            + "."
        )
        return plan
    plan.advice = [alt.describe() for alt in find_alternatives(w, hw, chosen)]
    judged = [r for r in rows if r.headroom is not None]
    closest = max(judged, key=lambda r: r.headroom or 0) if judged else None
    short = f"; closest: {closest.strategy.label}, short by {_gib(-(closest.headroom or 0))}" if closest else ""
    plan.summary = f"Nothing fits on {where}{short}. " + (
        "Change: " + "; or ".join(plan.advice) + "." if plan.advice else "Use a smaller model or bigger GPUs."
    )
    return plan
