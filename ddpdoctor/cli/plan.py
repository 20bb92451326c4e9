"""`ddpdoctor plan`: will this model train on these GPUs, and with which strategy (docs/plan.md)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import List, Optional

import typer

from ddpdoctor.cli.app import app, json_option, replay_option, say, timeout_option, usage_error
from ddpdoctor.plan.memory import (
    ATTENTION,
    OFFLOAD,
    OPTIMIZER_BYTES,
    PRECISIONS,
    RECOMPUTE,
    resolve_optimizer,
)

PLAN_EXIT_HELP = (
    "Exit codes: 0 a strategy fits; 1 none fits; 2 usage error (bad size, unreadable or uncountable "
    "config, or only strategies impossible on these GPUs); 3 no GPU memory known (no GPU found and no --gpu-mem): bytes printed, nothing judged."
)
DTYPES = PRECISIONS
MAX_TOKENS = 10**9  # micro-batch x sequence length beyond this is a typo (and overflows nothing useful)


def _choice(value: str, known: tuple[str, ...], flag: str) -> str:
    value = value.lower()
    if value not in known:
        raise ValueError(f"unknown {flag} {value!r}; one of {', '.join(known)}")
    return value


@app.command(
    help="Will this model train on these GPUs? Per-GPU memory (parameters, gradients, optimizer states, "
    "fp32 master weights, activations, buffers, CUDA/NCCL overhead) under DDP, ZeRO-1/2/3, FSDP and "
    "tensor/pipeline parallel, each against the GPU's memory; the first line names the cheapest strategy "
    "that fits, or what to change. Model from --params 7B or a Hugging Face --config config.json (read as "
    "data, never run). GPUs from NVML on this node, a snapshot (--replay), or --gpus/--gpu-mem. "
    "Formulas and sources: docs/plan.md.\n\n" + PLAN_EXIT_HELP
)
def plan(
    params: Optional[str] = typer.Option(None, "--params", help="Parameter count: 7B, 350M, 1.3B (K/M/B/T)."),
    config: Optional[Path] = typer.Option(
        None,
        "--config",
        help="A Hugging Face config.json, a model directory, an org/name already in the local Hugging Face "
        "cache (never downloaded), or - for standard input.",
    ),
    dtype: str = typer.Option(
        "bf16",
        "--dtype",
        help="bf16, fp16 (16-bit weights with an fp32 master copy), fp32, autocast (torch.autocast over "
        "fp32 weights: fp32 grads and DDP buckets, bf16 weight casts), or fp8 (Transformer Engine: bf16 "
        "weights and fp32 master, plus fp8 copies of the block Linears' weights and saved inputs).",
    ),
    optimizer: str = typer.Option(
        "adamw",
        "--optimizer",
        help=", ".join(OPTIMIZER_BYTES) + "; transformers' names too (adamw_torch_fused, paged_adamw_8bit...).",
    ),
    micro_batch: int = typer.Option(1, "--micro-batch", min=1, max=1_000_000, help="Sequences per GPU per step."),
    seq_len: int = typer.Option(2048, "--seq-len", min=1, max=100_000_000, help="Tokens per sequence."),
    recompute: str = typer.Option("none", "--recompute", help="Activation recomputation: none, selective, full."),
    attention: str = typer.Option(
        "sdpa",
        "--attention",
        help="sdpa (PyTorch SDPA, transformers' default), flash (FlashAttention) or eager (scores stored).",
    ),
    offload: str = typer.Option(
        "none",
        "--offload",
        help="DeepSpeed ZeRO offload: none, optimizer, optimizer+params (ZeRO-3) to host RAM; "
        "nvme-optimizer, nvme-optimizer+params (ZeRO-Infinity, ZeRO-3) to NVMe. Host RAM and NVMe bytes per "
        "node are in the notes and the JSON.",
    ),
    lora_rank: int = typer.Option(
        0, "--lora-rank", min=0, max=65536, help="LoRA adapters of this rank on every block Linear; base frozen."
    ),
    qlora: bool = typer.Option(False, "--qlora", help="With --lora-rank: the base's block Linears in 4-bit NF4."),
    global_batch: int = typer.Option(
        0,
        "--global-batch",
        min=0,
        max=10**9,
        help="Sequences per optimizer step over all replicas: each row says its gradient-accumulation steps "
        "(invalid when micro-batch x replicas does not divide it).",
    ),
    inference: bool = typer.Option(
        False,
        "--inference",
        help="Serving instead of training: weights and a KV cache of --micro-batch x --seq-len tokens (ddp = "
        "a replica per GPU, or tp).",
    ),
    gpus: Optional[int] = typer.Option(
        None, "--gpus", min=1, max=4096, help="GPUs per node (default: this node's, from NVML)."
    ),
    nodes: int = typer.Option(1, "--nodes", min=1, max=100_000, help="Nodes."),
    gpu_mem: Optional[str] = typer.Option(
        None,
        "--gpu-mem",
        help="Memory per GPU with a unit (80GiB, 16384MiB; GB as GPU vendors mean it: 40GB = 40 GiB) "
        "instead of what NVML reports.",
    ),
    gpu: Optional[str] = typer.Option(
        None, "--gpu", help="A GPU by name, with its exact memory: A100-40GB, A100-80GB, H100-80GB, H200, L40S..."
    ),
    strategy: Optional[List[str]] = typer.Option(
        None,
        "--strategy",
        help="ddp, zero1, zero2, zero3, fsdp, hsdp[=R] (FSDP sharded within groups of R GPUs, default a "
        "node, replicated across), fsdp-grad-op (SHARD_GRAD_OP) or tp=T[,pp=P][,dopt|,zero1|,zero2|,zero3|,fsdp] "
        "(dopt: Megatron's distributed optimizer; zeroK/fsdp: the tp shard sharded over the N/(T*P) "
        "data-parallel ranks); repeatable or comma-separated (default: ddp, zero1-3, fsdp and a tp).",
    ),
    replay: Optional[Path] = replay_option("Read the GPUs from a snapshot directory instead of this machine."),
    json_out: bool = json_option("Print the plan as JSON (schema: docs/schemas/plan.schema.json)."),
    timeout: float = timeout_option(),
) -> None:
    from ddpdoctor.plan import (
        PlanInputError,
        Workload,
        estimate_shape,
        load_shape,
        make_plan,
        parse_count,
        parse_strategy,
        read_hardware,
    )

    try:
        if (params is None) == (config is None):
            raise ValueError("give the model as --params 7B or --config config.json (one of them)")
        shape = load_shape(config) if config is not None else estimate_shape(parse_count(params or ""))
        workload = Workload(
            shape=shape,
            dtype=_choice(dtype, DTYPES, "--dtype"),
            optimizer=resolve_optimizer(optimizer),
            micro_batch=micro_batch,
            seq_len=seq_len,
            recompute=_choice(recompute, RECOMPUTE, "--recompute"),
            attention=_choice(attention, ATTENTION, "--attention"),
            offload=_choice(offload, OFFLOAD, "--offload"),
            lora_rank=lora_rank,
            qlora=qlora,
            inference=inference,
            global_batch=global_batch,
        )
        if workload.dtype == "fp8" and (inference or lora_rank):
            raise ValueError(
                "--dtype fp8 is Transformer Engine training of the whole model; with --inference or "
                "--lora-rank it is not modelled (plan it as bf16)"
            )
        if qlora and not lora_rank:
            raise ValueError("--qlora needs --lora-rank (the adapters are what trains)")
        if micro_batch * seq_len > MAX_TOKENS:
            raise ValueError(f"--micro-batch x --seq-len = {micro_batch * seq_len} tokens per GPU: too many")
        from ddpdoctor.plan.units import GPU_NVML_NAMES, parse_gpu_memory, parse_gpu_name

        if gpu is not None and gpu_mem is not None:
            raise ValueError("give --gpu or --gpu-mem, not both")
        memory = parse_gpu_memory(gpu_mem) if gpu_mem is not None else None
        gpu_name = None
        if gpu is not None:
            key, memory = parse_gpu_name(gpu)
            gpu_name = GPU_NVML_NAMES[key]
        strategies = [parse_strategy(part) for item in strategy or () for part in _split_strategies(item)]
    except (PlanInputError, ValueError) as exc:
        raise usage_error(str(exc)) from None

    from ddpdoctor.edge.sources import LiveSources, ReplaySources

    # Leaving the block kills any probe still running: nothing is orphaned.
    with ReplaySources(replay) if replay is not None else LiveSources() as sources:
        sources.deadline = time.monotonic() + timeout
        label = f"snapshot {replay}" if replay is not None else "this node"
        hardware = read_hardware(sources, gpus, nodes, memory, label, gpu_name)
        bad = dict(getattr(sources, "problems", {}) or {})
    if replay is not None and memory is None and "nvml.json" in bad:
        # A GPU file with impossible readings (negative memory) is a damaged snapshot: sizing a model
        # against the other files of it would pass off a guess as this node's plan.
        say(f"error: {replay}: nvml.json is unusable ({bad['nvml.json']}); no plan from this snapshot "
            "(give --gpu-mem to plan without it); exit 3", err=True)
        raise typer.Exit(3)
    result = make_plan(workload, hardware, strategies)
    if json_out:
        from ddpdoctor.render import print_json
        from ddpdoctor.render.plan import plan_to_dict

        print_json(plan_to_dict(result))
    else:
        from ddpdoctor.render.plan import render_plan

        render_plan(result)
    raise typer.Exit(result.exit_code)


_TP_SHARDING = ("dopt", "zero1", "zero2", "zero3", "fsdp")  # what may follow a tp=T in one layout


def _split_strategies(item: str) -> list[str]:
    """`ddp,zero3` -> two strategies; `tp=4,pp=2,dopt` and `tp=4,zero1` stay one: pp, dopt and a ZeRO or
    FSDP stage right after a tp belong to it (list `zero1` before the tp, or apart, to plan it alone)."""
    out: list[str] = []
    for part in item.split(","):
        key = part.strip().lower()
        last = out[-1].strip().lower().split(",") if out else [""]
        sharded = any(k in last for k in _TP_SHARDING[1:])  # one ZeRO/FSDP stage per tp; dopt + zeroK is refused
        joins_tp = last[0].startswith("tp=") and (key.startswith("pp=") or (key in _TP_SHARDING and not sharded))
        if joins_tp:
            out[-1] += "," + part
        else:
            out.append(part)
    return out
