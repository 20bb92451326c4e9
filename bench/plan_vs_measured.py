"""`ddpdoctor plan` against real training steps of small transformers models on CPU (issue #25).

For each small model (GPT-2, Llama, Mixtral-style MoE, DeepSeek-V2-style MLA + MoE), built by
transformers from a local config with random weights (nothing downloaded), it runs real AdamW steps
inside DDP over gloo (one rank, 127.0.0.1) and measures, per component:

- parameters, gradients, optimizer state, fp32 master: bytes of the tensors after a real step;
- activations: bytes of the storages autograd saves during forward (saved-tensor hooks, each storage
  once, parameters and autocast's weight casts excluded) plus the logits the model returns;
- autocast's weight casts: saved 16-bit tensors shaped like an fp32 parameter;
- peak: over the third step (DDP rebuilds its buckets in the second), what is resident (every storage gc
  reaches, plus DDP's buckets, read off the buckets its communication hook is handed) plus what the step
  allocates on top through the dispatcher, at its largest; on CUDA, torch.cuda.max_memory_allocated.

The plan for the same shape (`shape_from_config` of the same config, same dtype, batch, sequence, attention,
recompute) gives the same components; the table prints measured, planned and planned/measured. The
plan's peak is its total less the CUDA/NCCL overhead: the larger of backward's moment (model states +
activations + backward workspace + temporary + inputs) and the optimizer step's. Layouts:

- bf16: 16-bit weights and gradients, fp32 master weights and AdamW state (DeepSpeed/Megatron layout),
  written out: the optimizer steps fp32 masters and the result is copied into the model;
- autocast: fp32 model under torch.autocast(bfloat16), AdamW on the fp32 parameters.

    python bench/plan_vs_measured.py [--json] [--seq 256] [--batch 2]
    python bench/plan_vs_measured.py --zero [--stages 1,2,3,0] [--detail] [--world 2]

With --zero, --detail prints what was live at each measured peak: every storage allocated during the step
(FSDP2's resize_ of its unsharded parameters included), summed by the op that made it and its phase; --json
has each storage under measured.at_peak. ZeRO rows also record, at five moments of the step (end of backward,
end of the reduction, step() entered, step()'s gradient conversion, the update), every tensor Python can reach
by what DeepSpeed holds it as (measured.parts: 16-bit parameters and gradients, fp32 master and gradient,
optimizer state, reduce buckets, the rest by dtype), the optimizer step's own peak, and for stage 3 its 16-bit
gradient partition (grad_partitions_flat_buffer) at the step and after it; the row compares the plan's model
states with the largest moment (stages 1/2) or the update (stage 3). --zero-settings merges DeepSpeed
zero_optimization settings (default: DeepSpeed's own); --replay FILE prints a saved --zero --json run against
the plan of the current code:

    python bench/plan_vs_measured.py --zero --stages 1,2,3 --world 4 --models gpt2 --json > run.json
    python bench/plan_vs_measured.py --zero --replay run.json --detail

Needs `transformers` (bench only, not a requirement of the project or its tests). Each case has a
wall-clock limit; a case that fails prints its error and the others go on.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import socket
import sys
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Optional

CASE_TIMEOUT_S = 300

CONFIGS: dict[str, dict[str, Any]] = {
    "gpt2": {
        "model_type": "gpt2", "n_embd": 256, "n_layer": 4, "n_head": 4, "vocab_size": 8000,
        "n_positions": 1024, "attn_pdrop": 0.0, "resid_pdrop": 0.0, "embd_pdrop": 0.0,
    },
    "llama": {
        "model_type": "llama", "hidden_size": 256, "intermediate_size": 688, "num_hidden_layers": 4,
        "num_attention_heads": 8, "num_key_value_heads": 4, "vocab_size": 8000, "tie_word_embeddings": False,
    },
    # --step-bound: a vocabulary small beside the blocks, as in real models (Llama-2-7B: 2% of the
    # parameters), so that the embedding's gradient transients do not make backward's peak.
    "llama_blocks": {
        "model_type": "llama", "hidden_size": 256, "intermediate_size": 688, "num_hidden_layers": 8,
        "num_attention_heads": 8, "num_key_value_heads": 4, "vocab_size": 512, "tie_word_embeddings": False,
    },
    "mixtral": {
        "model_type": "mixtral", "hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 4,
        "num_attention_heads": 8, "num_key_value_heads": 4, "vocab_size": 8000, "num_local_experts": 4,
        "num_experts_per_tok": 2, "tie_word_embeddings": False,
    },
    "deepseek_v2": {
        "model_type": "deepseek_v2", "hidden_size": 256, "intermediate_size": 688, "moe_intermediate_size": 128,
        "num_hidden_layers": 4, "num_attention_heads": 8, "num_key_value_heads": 8, "vocab_size": 8000,
        "n_routed_experts": 8, "n_shared_experts": 1, "num_experts_per_tok": 2, "first_k_dense_replace": 1,
        "moe_layer_freq": 1, "kv_lora_rank": 64, "q_lora_rank": None, "qk_nope_head_dim": 32,
        "qk_rope_head_dim": 16, "v_head_dim": 32, "tie_word_embeddings": False,
    },
}  # fmt: skip


TABLE_MODELS = ("gpt2", "llama", "mixtral", "deepseek_v2")
STEP_BOUND_MODELS = ("llama_blocks", "gpt2", "llama")


@dataclass(frozen=True)
class Case:
    model: str
    dtype: str  # bf16 (16-bit weights + fp32 master) or autocast
    attention: str  # eager or sdpa
    recompute: str  # none or full
    # adamw: torch's default on CUDA, the foreach implementation (asked for explicitly: on CPU the default is
    # the for-loop one); adamw-fused: AdamW(fused=True)
    optimizer: str = "adamw"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _bytes(tensors: Any) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def _build(case: Case, torch: Any) -> Any:
    import transformers

    cfg = dict(CONFIGS[case.model])
    kind = cfg.pop("model_type")
    config = transformers.AutoConfig.for_model(kind, **cfg)
    config._attn_implementation = case.attention
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config)
    if case.recompute == "full":
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.config.use_cache = False
    return model.to(torch.bfloat16) if case.dtype == "bf16" else model


def measure(case: Case, seq: int, batch: int, device: str = "cpu") -> dict[str, Any]:
    """One case: two real DDP steps; component bytes after the second, activations and peak of it.

    On "cuda" DDP runs over NCCL on one GPU and the peak is torch.cuda.max_memory_allocated over the
    second step, less what was allocated before the model existed (cuBLAS's workspace, made first)."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.set_num_threads(1)
    cuda = device == "cuda"
    base = 0
    if cuda:
        torch.cuda.set_device(0)
        (torch.ones(64, 64, device="cuda") @ torch.ones(64, 64, device="cuda")).sum().item()
        (torch.ones(64, 64, device="cuda", dtype=torch.bfloat16) @ torch.ones(64, 64, device="cuda", dtype=torch.bfloat16)).sum().item()
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
    store = dist.TCPStore("127.0.0.1", _free_port(), 1, True, timeout=timedelta(seconds=60))
    dist.init_process_group(
        "nccl" if cuda else "gloo", store=store, rank=0, world_size=1, timeout=timedelta(seconds=60),
        **({"device_id": torch.device("cuda", 0)} if cuda else {}),
    )  # fmt: skip
    try:
        model = _build(case, torch).to(device)
        model.train()
        params = list(model.parameters())
        masters = [p.detach().float().clone().requires_grad_(True) for p in params] if case.dtype == "bf16" else []
        impl = {"fused": True} if case.optimizer == "adamw-fused" else {"foreach": True}
        opt = torch.optim.AdamW(masters or params, lr=1e-4, **impl)
        ddp = DDP(model)
        # DDP's buckets live in its C++ reducer, out of gc's sight: their storages are read off the buckets
        # its communication hook is handed (the hook does what the default one does: all-reduce, average).
        buckets_seen: dict[int, int] = {}

        def allreduce_hook(_, bucket):  # type: ignore[no-untyped-def]  # DDP refuses any annotation but GradBucket
            buf = bucket.buffer()
            buckets_seen[_data_ptr(buf.untyped_storage())] = buf.untyped_storage().nbytes()
            fut = dist.all_reduce(buf, async_op=True).get_future()
            return fut.then(lambda f: f.value()[0].div_(dist.get_world_size()))

        if not cuda:
            ddp.register_comm_hook(None, allreduce_hook)
        ids = torch.randint(0, CONFIGS[case.model]["vocab_size"], (batch, seq), device=device)
        param_ptrs = {p.untyped_storage().data_ptr() for p in params}
        shapes32 = {tuple(p.shape) for p in params} if case.dtype == "autocast" else set()
        shapes32 |= {s[::-1] for s in shapes32}  # a Linear saves the transposed view of its weight's cast
        acts: dict[int, int] = {}
        casts: dict[int, int] = {}

        def pack(t: Any) -> Any:
            st = t.untyped_storage()
            ptr = st.data_ptr()
            if ptr in param_ptrs:
                return t
            if t.dtype == torch.bfloat16 and tuple(t.shape) in shapes32 and t.dim() == 2 and st.nbytes() == 2 * t.numel():
                casts[ptr] = st.nbytes()  # autocast's cast of an fp32 weight
            else:
                acts[ptr] = st.nbytes()
            return t

        def step(track: bool) -> int:
            acts.clear()
            casts.clear()
            ctx = torch.autocast(device, dtype=torch.bfloat16) if case.dtype == "autocast" else contextlib.nullcontext()
            hooks = torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t) if track else contextlib.nullcontext()
            with ctx, hooks:
                out = ddp(input_ids=ids, labels=ids)
            logits = out.logits
            if logits.untyped_storage().data_ptr() not in acts:
                acts[logits.untyped_storage().data_ptr()] = logits.untyped_storage().nbytes()
            out.loss.backward()
            grads = _bytes(p.grad for p in params if p.grad is not None)
            del out, logits
            if masters:
                for p, m in zip(params, masters):
                    m.grad = p.grad.float()
                    p.grad = None
            opt.step()
            if masters:
                with torch.no_grad():
                    for p, m in zip(params, masters):
                        p.copy_(m)
                        m.grad = None
            opt.zero_grad(set_to_none=True)
            ddp.zero_grad(set_to_none=True)
            return grads

        step(False)  # the optimizer state exists from here on
        # DDP rebuilds its buckets once, in the second iteration's forward (in the order gradients became
        # ready): the step measured is the third, with the buckets that stay.
        buckets_seen.clear()
        step(False)
        sizes = str(ddp._get_ddp_logging_data().get("bucket_sizes", ""))
        buckets = sum(int(x) for x in sizes.replace(" ", "").split(",") if x.isdigit())
        if cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            grads = step(True)
            torch.cuda.synchronize()
            # The caching allocator sees every allocation, DDP's buckets included: nothing to add.
            peak = torch.cuda.max_memory_allocated() - base
        else:
            # Resident (every storage gc reaches, and the buckets) plus what the step allocates on top, at its
            # largest. MemTracker is not used here: it counts a storage that existed before it started when
            # an op first writes it, so DDP's buckets entered its peak or not depending on whether the peak
            # came before or after the reducer's first copy into them (earlier versions of this bench added
            # the buckets to MemTracker's peak, counting them twice where it had seen them).
            base = _live_storages(torch)
            base.update(buckets_seen)
            counter = _peak_counter(torch, base)
            with counter:
                grads = step(True)
            peak = sum(base.values()) + counter.peak
        state = [t for s in opt.state.values() for t in s.values() if torch.is_tensor(t) and t.dim() > 0]
        return {
            "parameters": _bytes(params),
            "gradients": grads,
            "optimizer": _bytes(state),
            "master": _bytes(masters),
            "model_states": _bytes(params) + grads + _bytes(state) + _bytes(masters),
            "activations": sum(acts.values()),
            "casts": sum(casts.values()),
            "buckets": buckets,
            "peak": int(peak),
        }
    finally:
        dist.destroy_process_group()


def planned(case: Case, seq: int, batch: int) -> dict[str, Any]:
    from ddpdoctor.plan import Strategy, Workload, shape_from_config
    from ddpdoctor.plan.memory import autocast_cast_bytes, breakdown, moments, overhead_for

    shape = shape_from_config(CONFIGS[case.model])
    w = Workload(
        shape, dtype=case.dtype, micro_batch=batch, seq_len=seq, recompute=case.recompute,
        attention="sdpa" if case.attention == "sdpa" else "eager", optimizer=case.optimizer,
    )  # fmt: skip
    s = Strategy("ddp")
    b, _ = breakdown(w, s, 1, overhead_for("unknown", None, 1, 0))
    backward, _, _ = moments(w, s, 1, overhead_for("unknown", None, 1, 0))
    casts = autocast_cast_bytes(w, s)
    return {
        "parameters": b.parameters,
        "gradients": b.gradients,
        "optimizer": b.optimizer,
        "master": b.master,
        "model_states": b.model_states,
        "activations": b.activations,
        "casts": casts,
        # The plan's peak (the larger of backward's and the optimizer step's), less the CUDA/NCCL overhead.
        "peak": b.total - b.overhead,
        "buckets": backward.temporary - casts,
        "optimizer_step": b.optimizer_step,
        "params_counted": shape.params,
    }


def _run_case(case: Case, seq: int, batch: int, device: str = "cpu") -> dict[str, Any]:
    def on_alarm(*_: Any) -> None:
        raise TimeoutError(f"case ran past {CASE_TIMEOUT_S} s")

    signal.signal(signal.SIGALRM, on_alarm)
    signal.alarm(CASE_TIMEOUT_S)
    try:
        return {"measured": measure(case, seq, batch, device), "plan": planned(case, seq, batch)}
    except Exception as exc:  # a case that fails is reported, the others still run
        return {"error": f"{type(exc).__name__}: {exc}"}
    finally:
        signal.alarm(0)


# --- DeepSpeed ZeRO-1/2/3 over gloo, 2 ranks -------------------------------------------------------------

ZERO_WORLD = 2  # the default of --world
STAGES = (1, 2, 3, 0)  # 0: torch FSDP2


def _live_storages(torch: Any) -> dict[int, int]:
    """Every tensor storage Python can reach now (gc), by address: what the process holds resident."""
    import gc

    out: dict[int, int] = {}
    for obj in gc.get_objects():
        try:
            if torch.is_tensor(obj) and obj.device.type == "cpu":
                st = obj.untyped_storage()
                out[st.data_ptr()] = st.nbytes()
        except Exception:  # objects that only look like tensors (fakes, freed proxies): not memory
            continue
    return out


def _zero_rank(
    rank: int, port: int, stage: int, model: str, seq: int, batch: int, queue: Any, world: int = ZERO_WORLD,
    zero_settings: Optional[dict[str, Any]] = None,
) -> None:
    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
        LOCAL_RANK=str(rank), DS_ACCELERATOR="cpu",
    )  # fmt: skip
    import torch
    torch.set_num_threads(1)
    try:
        case = Case(model, "fp32", "sdpa", "none")
        net = _build(case, torch)
        net.train()
        ids = torch.randint(0, CONFIGS[model]["vocab_size"], (batch, seq))
        if stage == 0:  # torch FSDP2: per-layer fully_shard, bf16 compute, fp32 sharded parameters
            import torch.distributed as dist
            from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

            dist.init_process_group("gloo", rank=rank, world_size=world, timeout=timedelta(seconds=120))
            policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
            layers = net.transformer.h if hasattr(net, "transformer") else net.model.layers  # GPT-2 : Llama-like
            for layer in layers:
                fully_shard(layer, mp_policy=policy)
            fully_shard(net, mp_policy=policy)
            fsdp_opt = torch.optim.AdamW(net.parameters(), lr=1e-4)

            def step() -> None:
                net(input_ids=ids, labels=ids).loss.backward()
                fsdp_opt.step()
                fsdp_opt.zero_grad(set_to_none=True)

        at_step: dict[str, int] = {}
        parts: dict[str, dict[str, int]] = {}
        counter: dict[str, Any] = {}
        if stage:
            import deepspeed

            deepspeed.init_distributed(dist_backend="gloo", timeout=timedelta(seconds=120))
            cfg = {
                "train_micro_batch_size_per_gpu": batch, "bf16": {"enabled": True},
                "zero_optimization": {"stage": stage, **(zero_settings or {})}, "zero_allow_untested_optimizer": True,
            }  # fmt: skip
            opt = torch.optim.AdamW(net.parameters(), lr=1e-4)
            engine, _, _, _ = deepspeed.initialize(model=net, optimizer=opt, config=cfg)
            zopt = engine.optimizer
            inner_step = zopt._optimizer_step

            def optimizer_step(group: int) -> Any:
                # The model states as the step sees them: called once the fp32 gradient partition is made
                # and before AdamW's own temporaries, with every activation freed. Everything Python can
                # reach then, less DeepSpeed's reduce bucket (a communication buffer, not a model state).
                if "model_states" not in at_step:
                    live = _live_storages(torch)
                    bucket = _zero_bucket_ptrs(zopt)
                    at_step["model_states"] = sum(b for ptr, b in live.items() if ptr not in bucket)
                    at_step["bucket"] = sum(b for ptr, b in live.items() if ptr in bucket)
                    flat = getattr(zopt, "grad_partitions_flat_buffer", None)
                    if flat is not None:  # stage 3's 16-bit gradient partition
                        at_step["grad_partition"] = flat.untyped_storage().nbytes()
                    parts["at_step"] = _zero_parts(torch, engine, zopt, live)
                return inner_step(group)

            zopt._optimizer_step = optimizer_step
            # Two earlier moments of the same step: the end of backward, before the engine reduces (stage 1
            # reduces every gradient here; stages 2 and 3 have reduced most of them in backward's hooks),
            # and the entry of the optimizer's step, once every gradient is reduced into its partition.
            _snapshot_on_entry(engine, "allreduce_gradients", lambda: _zero_parts(torch, engine, zopt), parts, "after_backward")
            _snapshot_on_entry(zopt, "step", lambda: _zero_parts(torch, engine, zopt), parts, "before_step")
            if stage < 3:
                # Stages 1/2: the end of the reduction (the epilogue releases its buffers: stage 1 still holds
                # the unowned 16-bit gradients whole), and the gradient conversion in step(), when the fp32
                # copy of the 16-bit partition is made and the partition not yet freed (the second
                # free_grad_in_param_list of a group: params_in_partition).
                _snapshot_on_entry(zopt, "_release_ipg_buffers", lambda: _zero_parts(torch, engine, zopt), parts, "end_of_reduction")
                fp32 = zopt.single_partition_of_fp32_groups
                _snapshot_on_entry(
                    zopt, "free_grad_in_param_list", lambda: _zero_parts(torch, engine, zopt), parts, "conversion",
                    lambda: any(m.grad is not None for m in fp32),
                )  # fmt: skip
            zopt_step = zopt.step

            def windowed_step(*args: Any, **kwargs: Any) -> Any:
                # The optimizer's step on its own (gradient conversion, the update, the copy back), measured
                # apart from backward's peak: where the model states are largest if no activation is left.
                mode = counter.get("mode")
                if mode is None:
                    return zopt_step(*args, **kwargs)
                mode.open_window()
                try:
                    return zopt_step(*args, **kwargs)
                finally:
                    counter["optimizer_step"] = mode.close_window()

            zopt.step = windowed_step

            def step() -> None:
                loss = engine(input_ids=ids, labels=ids).loss
                engine.backward(loss)
                engine.step()


        step()
        base = _live_storages(torch)
        resident = sum(base.values())
        at_step.clear()
        parts.clear()
        mode = _peak_counter(torch, base)
        counter["mode"] = mode
        with mode, mode.tracker, _resize_seen_by(torch, mode):
            step()
        detail = mode.detail()
        out = {"resident": resident, "peak": resident + mode.peak, "at_peak": detail, **at_step, "parts": dict(parts)}
        if "optimizer_step" in counter:
            out["optimizer_step_peak"] = counter["optimizer_step"]
            out["optimizer_step_peak"]["peak"] += resident
        if stage == 3:  # still there after the step: the 16-bit gradient partition DeepSpeed allocated once
            flat = engine.optimizer.grad_partitions_flat_buffer
            out["grad_partition_after_step"] = flat.untyped_storage().nbytes() if _data_ptr(flat.untyped_storage()) in base else 0
        queue.put((rank, out))
    except Exception as exc:  # reported in the table, never a hang
        queue.put((rank, {"error": f"{type(exc).__name__}: {exc}"}))


MOMENTS = ("after_backward", "end_of_reduction", "before_step", "conversion", "at_step")
PARTS = ("param16", "grad16", "master32", "grad32", "optim", "bucket", "other16", "other32")


def _snapshot_on_entry(
    obj: Any, name: str, take: Any, into: dict[str, Any], key: str, when: Any = lambda: True
) -> None:
    """Wrap obj.name so that its first call of each step for which when() holds records take() under
    into[key] before running."""
    inner = getattr(obj, name, None)
    if inner is None:  # not this stage's optimizer
        return

    def wrapped(*args: Any, **kwargs: Any) -> Any:
        if key not in into and when():
            into[key] = take()
        return inner(*args, **kwargs)

    setattr(obj, name, wrapped)


def _zero_parts(torch: Any, engine: Any, zopt: Any, live: Optional[dict[int, int]] = None) -> dict[str, int]:
    """What Python can reach now, by what DeepSpeed holds it as: the model's 16-bit parameters (stage 3: the
    partitions, ds_tensor, and whatever is gathered), 16-bit gradients (param.grad, stage 1/2's
    averaged_gradients and contiguous partition buffer, stage 3's grad_partitions_flat_buffer), the fp32
    master partition and its gradient, the optimizer's state, the reduce buckets; the rest by dtype."""
    live = _live_storages(torch) if live is None else live
    owner: dict[int, str] = {}

    def claim(t: Any, what: str) -> None:
        if t is not None and hasattr(t, "untyped_storage"):
            owner.setdefault(_data_ptr(t.untyped_storage()), what)

    for ptr in _zero_bucket_ptrs(zopt):
        owner[ptr] = "bucket"
    masters = list(getattr(zopt, "single_partition_of_fp32_groups", None) or getattr(zopt, "fp32_partitioned_groups_flat", []))
    for m in masters:
        claim(m.grad, "grad32")
        claim(m, "master32")
    for state in zopt.optimizer.state.values():
        for v in state.values():
            if torch.is_tensor(v) and v.numel() > 1:
                claim(v, "optim")
    for p in engine.module.parameters():
        claim(p.grad, "grad16")
        claim(getattr(p, "ds_tensor", None), "param16")
        claim(p, "param16")
    for g in getattr(zopt, "bit16_groups_flat", []):
        claim(g, "param16")
    for g in getattr(zopt, "fp16_partitioned_groups_flat", []):
        claim(g, "param16")
    claim(getattr(zopt, "grad_partitions_flat_buffer", None), "grad16")
    claim(getattr(zopt, "grads_in_partition", None), "grad16")
    for grads in (getattr(zopt, "averaged_gradients", None) or {}).values():
        for g in grads if isinstance(grads, (list, tuple)) else [grads]:
            claim(g, "grad16")
    out = dict.fromkeys(PARTS, 0)
    dtypes = _storage_dtypes(torch)
    for ptr, nbytes in live.items():
        what = owner.get(ptr) or ("other16" if dtypes.get(ptr, 4) == 2 else "other32")
        out[what] += nbytes
    return out


def _storage_dtypes(torch: Any) -> dict[int, int]:
    """Element size of a tensor on each live storage (gc), to tell 16-bit leftovers from fp32 ones."""
    import gc

    out: dict[int, int] = {}
    for obj in gc.get_objects():
        try:
            if torch.is_tensor(obj) and obj.device.type == "cpu":
                out.setdefault(_data_ptr(obj.untyped_storage()), obj.element_size())
        except Exception:  # as in _live_storages
            continue
    return out


def _zero_bucket_ptrs(zopt: Any) -> set[int]:
    """Addresses of DeepSpeed's reduce buffers (`ipg_buckets[dtype].buffer`): stage 3's tensor, allocated
    once and kept; stages 1/2's list, filled at each backward."""
    out = set()
    stack = [getattr(b, "buffer", None) for b in getattr(zopt, "ipg_buckets", {}).values()]
    while stack:
        buf = stack.pop()
        if isinstance(buf, (list, tuple)):
            stack.extend(buf)
        elif buf is not None and hasattr(buf, "untyped_storage"):
            out.add(_data_ptr(buf.untyped_storage()))
    return out


def _peak_counter(torch: Any, base: dict[int, int]) -> Any:
    """A dispatch mode counting the bytes allocated on top of `base` (what was resident), at their largest,
    and what was live at that moment: each storage's bytes, the op whose output it first was, and where the
    step was then (module, forward or backward, autograd node), so the peak can be read item by item."""
    import weakref

    from torch.distributed._tools.mod_tracker import ModTracker
    from torch.utils._python_dispatch import TorchDispatchMode

    class Peak(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.live: dict[int, tuple[int, str, int]] = {}  # data_ptr -> (bytes, what made it, token)
            self.now = self.peak = 0
            self.at_peak: dict[int, tuple[int, str, int]] = {}
            self.peak_where = ""
            self.tracker = ModTracker()
            self._token = 0
            # A second, inner peak over a window of the step (the optimizer's step): -1 while closed.
            self.window_peak = -1
            self.window_at: dict[int, tuple[int, str, int]] = {}
            self.window_where = ""

        def where(self) -> str:
            node = torch._C._current_autograd_node()
            mods = sorted(self.tracker.parents, key=len)
            phase = "backward" if self.tracker.is_bw else "forward"
            return f"{phase} {mods[-1] if mods else '-'}" + (f" {node.name()}" if node is not None else "")

        def note(self, st: Any, what: str) -> None:
            ptr = _data_ptr(st)
            if not ptr or ptr in self.live or ptr in base:
                return
            self._token += 1
            self.live[ptr] = (st.nbytes(), what, self._token)
            # A storage is freed when its last reference goes; the token keeps a later storage at the same
            # address from being popped by an earlier one's finalizer.
            weakref.finalize(st, self.free, ptr, self._token)
            self.now += st.nbytes()
            if self.now > self.peak:
                self.peak = self.now
                self.at_peak = dict(self.live)
                self.peak_where = f"{what} @ {self.where()}"
            if 0 <= self.window_peak < self.now:
                self.window_peak = self.now
                self.window_at = dict(self.live)
                self.window_where = f"{what} @ {self.where()}"

        def open_window(self) -> None:
            self.window_peak, self.window_at, self.window_where = self.now, dict(self.live), "entry"

        def close_window(self) -> dict[str, Any]:
            """The window's peak (bytes on top of what was resident) and what was live then."""
            items = sorted(((b, what) for b, what, _ in self.window_at.values()), reverse=True)
            out = {"peak": self.window_peak, "where": self.window_where, "storages": [{"bytes": b, "made_by": w} for b, w in items]}
            self.window_peak = -1
            return out

        def free(self, ptr: int, token: int = 0) -> None:
            if ptr in self.live and (not token or self.live[ptr][2] == token):
                self.now -= self.live.pop(ptr)[0]

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            out = func(*args, **(kwargs or {}))
            for t in out if isinstance(out, (tuple, list)) else (out,):
                if torch.is_tensor(t) and t.device.type == "cpu":
                    try:
                        st = t.untyped_storage()
                    except RuntimeError:
                        continue
                    if _data_ptr(st) not in self.live:
                        self.note(st, f"{func.__name__} {str(t.dtype).removeprefix('torch.')} {list(t.shape)} [{self.where()}]")
            return out

        def detail(self) -> dict[str, Any]:
            """The storages live at the peak, largest first, and where the step was."""
            items = sorted(((b, what) for b, what, _ in self.at_peak.values()), reverse=True)
            return {"where": self.peak_where, "storages": [{"bytes": b, "made_by": w} for b, w in items]}

    return Peak()


def _data_ptr(st: Any) -> int:
    """A storage's address, 0 for one FSDP2 has resized to nothing (torch refuses to give its pointer)."""
    try:
        return int(st.data_ptr())
    except RuntimeError:
        return 0


@contextlib.contextmanager
def _resize_seen_by(torch: Any, mode: Any) -> Any:
    """FSDP2 allocates and frees its unsharded parameters by resizing their storages (alloc_storage and
    free_storage in torch/distributed/fsdp/_fully_shard/_fsdp_param.py), outside the dispatcher: count
    those too, or a gathered block freed by resize_(0) would stay counted."""
    orig = torch.UntypedStorage.resize_

    def resize_(st: Any, size: int) -> Any:
        old = _data_ptr(st)
        out = orig(st, size)
        mode.free(old)
        if size:
            mode.note(st, f"resize_ (FSDP2 unsharded parameter) [{mode.where()}]")
        return out

    torch.UntypedStorage.resize_ = resize_
    try:
        yield
    finally:
        torch.UntypedStorage.resize_ = orig


def measure_zero(
    stage: int, model: str, seq: int, batch: int, world: int = ZERO_WORLD, zero_settings: Optional[dict[str, Any]] = None
) -> dict[str, Any]:
    import multiprocessing as mproc

    ctx = mproc.get_context("spawn")
    queue = ctx.Queue()
    port = _free_port()
    procs = [
        ctx.Process(target=_zero_rank, args=(r, port, stage, model, seq, batch, queue, world, zero_settings), daemon=True)
        for r in range(world)
    ]
    for p in procs:
        p.start()
    results: dict[int, dict[str, Any]] = {}
    deadline = time.monotonic() + CASE_TIMEOUT_S
    try:
        while len(results) < world and time.monotonic() < deadline:
            with contextlib.suppress(Exception):
                rank, res = queue.get(timeout=5)
                results[rank] = res
            if len(results) < world and not any(p.is_alive() for p in procs):
                break
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
                p.join(timeout=10)
    if 0 not in results:
        return {"error": "rank 0 reported nothing (exited, or past the time limit)"}
    return results[0]


def planned_zero(stage: int, model: str, seq: int, batch: int, world: int = ZERO_WORLD) -> dict[str, Any]:
    from ddpdoctor.plan import Strategy, Workload, shape_from_config
    from ddpdoctor.plan.memory import backward_workspace_bytes, breakdown, overhead_for

    shape = shape_from_config(CONFIGS[model])
    w = Workload(shape, micro_batch=batch, seq_len=seq)
    s = Strategy(f"zero{stage}" if stage else "fsdp")
    b, _ = breakdown(w, s, world, overhead_for("unknown", None, 1, 0))
    # Resident after the step: gradients are released by then, except stage 3's 16-bit partition; stage
    # 3's reduce buffer is allocated once and stays.
    # FSDP2 reshards every unit after backward: only the fp32 shards (the master) and their state stay.
    resident = b.optimizer + b.master + (b.parameters if stage else 0)
    if stage == 3:
        resident += b.temporary + 2 * -(-shape.params // world)
    # Stages 1/2: the plan's model states are the larger of its two moments (end of backward for ZeRO-1,
    # the gradient conversion in step()), compared with the largest moment measured (largest_states).
    # At the optimizer's step stage 3 has re-partitioned every parameter (stage3.py step():
    # _partition_all_parameters()): the largest layer's gathered 16-bit parameter and gradient are gone.
    gathered = 2 * w.weight_bytes * shape.largest_layer if stage == 3 else 0
    return {
        "model_states": b.model_states,
        "states_at_step": b.model_states - gathered if stage else b.model_states,
        "resident": resident,
        "temporary": b.temporary,
        "peak": b.model_states + b.temporary + b.activations + backward_workspace_bytes(w, s) + b.inputs,
    }


def zero_rows(
    model: str, seq: int, batch: int, stages: tuple[int, ...] = STAGES, world: int = ZERO_WORLD,
    zero_settings: Optional[dict[str, Any]] = None,
) -> list[dict[str, Any]]:
    rows = []
    for stage in stages:
        start = time.monotonic()
        m = measure_zero(stage, model, seq, batch, world, zero_settings)
        row: dict[str, Any] = {"case": {"model": model, "zero": stage, "world": world}}
        if zero_settings:
            row["case"]["zero_optimization"] = zero_settings
        if "error" in m:
            row["error"] = m["error"]
        else:
            row["measured"], row["plan"] = m, planned_zero(stage, model, seq, batch, world)
        row["seconds"] = round(time.monotonic() - start, 1)
        rows.append(row)
    return rows


COMPONENTS = ("model_states", "activations", "casts", "buckets", "peak")


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument(
        "--models", default="",
        help=f"comma-separated, of {', '.join(CONFIGS)} (default: {', '.join(TABLE_MODELS)}; "
        f"with --step-bound: {', '.join(STEP_BOUND_MODELS)})",
    )  # fmt: skip
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--device", default="cpu", choices=("cpu", "cuda"), help="cuda: NCCL on GPU 0, max_memory_allocated")
    ap.add_argument("--stages", default="1,2,3,0", help="with --zero: ZeRO stages to run, 0 = FSDP2")
    ap.add_argument(
        "--zero", action="store_true", help="DeepSpeed ZeRO-1/2/3 (needs deepspeed) and torch FSDP2 on 2 ranks"
    )
    ap.add_argument("--world", type=int, default=ZERO_WORLD, help="with --zero: ranks (gloo, this machine)")
    ap.add_argument(
        "--step-bound", action="store_true",
        help="cases whose peak is the optimizer step (tiny activations): foreach and fused AdamW, fp32 (autocast) "
        "and bf16 + fp32 master, at --seq 16 --batch 1 unless given",
    )  # fmt: skip
    ap.add_argument(
        "--zero-settings", default="",
        help='with --zero: JSON merged into DeepSpeed\'s zero_optimization (default: only the stage, DeepSpeed\'s '
        'defaults for the rest), e.g. \'{"overlap_comm": true}\'',
    )  # fmt: skip
    ap.add_argument(
        "--replay", default="",
        help="with --zero: print the rows of a saved --zero --json run against the plan of this code (no run)",
    )  # fmt: skip
    ap.add_argument(
        "--detail", action="store_true",
        help="with --zero: print what was live at the measured peak (the op that made each storage, where)",
    )  # fmt: skip
    args = ap.parse_args(argv)
    args.models = args.models or ",".join(STEP_BOUND_MODELS if args.step_bound else TABLE_MODELS)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    if args.replay:
        return _replay(args.replay, args.seq, args.batch, args.detail)
    cases = [
        Case(m, dtype, att, rc)
        for m in args.models.split(",")
        for dtype, att, rc in (
            ("bf16", "sdpa", "none"), ("bf16", "eager", "none"), ("bf16", "sdpa", "full"),
            ("autocast", "sdpa", "none"),
        )
    ]  # fmt: skip
    if args.step_bound:
        cases = [
            Case(m, dtype, "sdpa", "none", opt)
            for m in args.models.split(",")
            for dtype in ("autocast", "bf16")
            for opt in ("adamw", "adamw-fused")
        ]
    rows = []
    if args.zero:
        for m in args.models.split(","):
            stages = tuple(int(x) for x in args.stages.split(","))
            for row in zero_rows(m, args.seq, args.batch, stages, args.world, json.loads(args.zero_settings or "{}")):
                rows.append(row)
                if not args.json:
                    _print_zero(row)
                    if args.detail and "measured" in row:
                        _print_parts(row["measured"])
                        _print_detail(row["measured"]["at_peak"])
        cases = []
    elif not args.json:
        _header()
    for case in cases:
        start = time.monotonic()
        result = {"case": case.__dict__, "device": args.device, **_run_case(case, args.seq, args.batch, args.device)}
        result["seconds"] = round(time.monotonic() - start, 1)
        rows.append(result)
        if not args.json:
            _print_row(result)
    if args.json:
        json.dump(rows, sys.stdout, indent=1)
        print()
    return 0 if all("error" not in r for r in rows) else 1


def _print_row(r: dict[str, Any]) -> None:
    c = r["case"]
    label = f"{c['model']:<12} {c['dtype']:<8} {c['attention']:<5} rc={c['recompute']:<4}"
    if "error" in r:
        print(f"{label}  error: {r['error']}")
        return
    m, p = r["measured"], r["plan"]
    cells = []
    for k in COMPONENTS:
        if not m[k] and not p[k]:
            continue
        ratio = f"{p[k] / m[k]:5.3f}" if m[k] else "  n/a"
        cells.append(f"{k} {m[k] / 2**20:.2f}/{p[k] / 2**20:.2f}={ratio}")
    print(f"{label}  " + "  ".join(cells), flush=True)


def _print_zero(r: dict[str, Any]) -> None:
    c = r["case"]
    label = f"{c['model']:<12} {'zero' + str(c['zero']) if c['zero'] else 'fsdp2':<5} x{c['world']} bf16"
    if "error" in r:
        print(f"{label}  error: {r['error']}", flush=True)
        return
    m, p = r["measured"], r["plan"]
    resident_plan = p["resident"]
    at_step = ""
    if "model_states" in m:
        moment, states = largest_states(r)
        at_step = (
            f"  states ({moment}) {states / 2**20:.2f}/{p['states_at_step'] / 2**20:.2f}="
            f"{p['states_at_step'] / states:.3f}"
        )
    if "grad_partition" in m:
        at_step += f" (16-bit grad partition {m['grad_partition'] / 2**20:.2f}, after step {m.get('grad_partition_after_step', 0) / 2**20:.2f})"
    print(
        f"{label}{at_step}  resident after step {m['resident'] / 2**20:.2f}/{resident_plan / 2**20:.2f}="
        f"{resident_plan / m['resident']:.3f}  peak {m['peak'] / 2**20:.2f}/{p['peak'] / 2**20:.2f}="
        f"{p['peak'] / m['peak']:.3f}",
        flush=True,
    )


MODEL_STATES = ("param16", "grad16", "master32", "grad32", "optim")


def largest_states(row: dict[str, Any]) -> tuple[str, int]:
    """(moment, bytes) the plan's model states are compared with: the model-state tensors (16-bit parameters
    and gradients, fp32 master and gradient, optimizer state; not the reduce buckets, nor what no DeepSpeed
    attribute names) at the largest of the moments measured for stages 1/2, at the optimizer's step for
    stage 3 (the gathered parameters, 4·L in the plan, are re-partitioned by then)."""
    m = row["measured"]
    if not m.get("parts"):
        return "at_step", m["model_states"]
    sums = {k: sum(d[part] for part in MODEL_STATES) for k, d in m["parts"].items()}
    moment = "at_step" if row["case"]["zero"] == 3 else max(sums, key=lambda k: sums[k])
    return moment, sums[moment]


def _replay(path: str, seq: int, batch: int, detail: bool) -> int:
    """The rows of a saved `--zero --json` run (DeepSpeed's log lines before the JSON skipped), measured as
    saved, planned by this code for the same shape (seq and batch must be the run's)."""
    text = open(path).read()
    for row in json.loads(text[text.index("["):]):
        c = row["case"]
        if "measured" in row:
            row["plan"] = planned_zero(c["zero"], c["model"], seq, batch, c["world"])
        _print_zero(row)
        if detail and "measured" in row:
            _print_parts(row["measured"])
            _print_detail(row["measured"]["at_peak"])
    return 0


def _print_parts(m: dict[str, Any]) -> None:
    """The model states at three moments of the step, by what holds them (MiB)."""
    for moment in MOMENTS:
        if moment in m.get("parts", {}):
            cells = "  ".join(f"{k} {v / 2**20:.2f}" for k, v in m["parts"][moment].items() if v)
            print(f"    {moment:<14} {cells}")
    if "optimizer_step_peak" in m:
        print(f"    optimizer step's own peak {m['optimizer_step_peak']['peak'] / 2**20:.2f} MiB (resident included):")
        _print_detail(m["optimizer_step_peak"])


def _print_detail(d: dict[str, Any]) -> None:
    """The storages live at the peak on top of what was resident, summed by the op that made them and the
    phase it ran in (forward, backward, or FSDP2's resize_ of an unsharded parameter)."""
    groups: dict[str, list[int]] = {}
    for st in d["storages"]:
        made = st["made_by"]
        phase = "resize" if made.startswith("resize_") else ("backward" if "[backward" in made else "forward")
        key = f"{phase:<8} {made.split()[0]}" + (f" {made.split()[1]}" if phase != "resize" else "")
        groups.setdefault(key, []).append(st["bytes"])
    print(f"    peak at: {d['where']}")
    for key, sizes in sorted(groups.items(), key=lambda kv: -sum(kv[1])):
        print(f"    {sum(sizes) / 2**20:9.3f} MiB  {len(sizes):3d} x {key}")


def _header() -> None:
    print("measured/planned MiB = planned/measured, per component; one DDP rank over gloo, CPU")


if __name__ == "__main__":
    sys.exit(main())
