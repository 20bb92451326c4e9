"""Output of `ddpdoctor plan`: the rich table (one row per strategy) and the JSON document.

JSON schema: docs/schemas/plan.schema.json. Verdicts and the headline come decided from plan.judge.
"""

from __future__ import annotations

from typing import Any

from ddpdoctor import __version__
from ddpdoctor.plan import Plan
from ddpdoctor.plan.units import GIB

SCHEMA = "ddpdoctor.plan/1"  # docs/schemas/plan.schema.json
_VERDICT_STYLE = {"fits": "green", "tight": "yellow", "does_not_fit": "red", "unknown": "dim", "invalid": "dim"}
_COLUMNS = ("parameters", "gradients", "optimizer", "master", "activations", "temporary", "overhead")
_HEADERS = ("param", "grads", "optim", "mastr", "activ", "temp", "ovhd")


def plan_to_dict(plan: Plan) -> dict[str, Any]:
    w, hw = plan.workload, plan.hardware
    return {
        "schema": SCHEMA,
        "tool": {"name": "ddpdoctor", "version": __version__},
        "summary": plan.summary,
        "cheapest": plan.cheapest,
        "advice": list(plan.advice),
        "notes": list(plan.notes),
        "exit_code": plan.exit_code,
        "model": {**w.shape.to_dict()},
        "workload": {
            "dtype": w.dtype,
            "optimizer": w.optimizer,
            "micro_batch": w.micro_batch,
            "seq_len": w.seq_len,
            "recompute": w.recompute,
            "attention": w.attention,
            "offload": w.offload,
            "lora_rank": w.lora_rank,
            "qlora": w.qlora,
            "inference": w.inference,
            "global_batch": w.global_batch,
        },
        "hardware": {
            "gpus_per_node": hw.gpus_per_node,
            "nodes": hw.nodes,
            "total_gpus": hw.total_gpus,
            "memory_bytes": hw.memory,
            "gpu_name": hw.name,
            "generation": hw.generation,
            "source": hw.source,
            "note": hw.note,
        },
        "strategies": [row.to_dict() for row in plan.rows],
    }


def _gib(n: int) -> str:
    return f"{n / GIB:.1f}"


def render_plan(plan: Plan) -> None:
    from rich.table import Table
    from rich.text import Text

    from ddpdoctor.render import console

    con = console()
    style = "bold green" if plan.cheapest else ("bold red" if plan.hardware.memory is not None else "bold yellow")
    con.print(Text(plan.summary, style=style), soft_wrap=True)
    w, hw = plan.workload, plan.hardware
    sh = w.shape
    model = f"{sh.params / 1e9:.2f}B parameters" + (
        " (shape estimated)" if sh.estimated else
        f" ({sh.family}: h={sh.hidden}, {sh.layers} layers, {sh.heads} heads)"
    )
    con.print(
        f"Model: {model}; {w.dtype}, {w.optimizer}, micro-batch {w.micro_batch} x {w.seq_len} tokens, "
        f"recompute {w.recompute}, {w.attention} attention",
        soft_wrap=True,
        markup=False,
    )
    mem = f"{hw.memory / GIB:.1f} GiB" if hw.memory is not None else "unknown"
    con.print(
        f"GPUs: {hw.nodes} node(s) x {hw.gpus_per_node} = {hw.total_gpus}, {mem} each"
        + (f", {hw.name}" if hw.name else "") + f" [from {hw.source}; overhead as {hw.generation}]"
        + (f"; {hw.note}" if hw.note and hw.memory is not None else ""),
        soft_wrap=True,
        markup=False,  # GPU names and snapshot paths are data, never rich markup
    )
    from rich import box

    # Compact enough for 80 columns: the verdict must not wrap into a tower of words.
    table = Table(
        title="Per-GPU memory (GiB)", title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False,
        collapse_padding=True,
    )
    table.add_column("strategy", no_wrap=True)
    for name in _HEADERS:
        table.add_column(name, justify="right", no_wrap=True, min_width=5)
    table.add_column("total", justify="right", style="bold", no_wrap=True, min_width=5)
    table.add_column("verdict", no_wrap=True)
    notes: list[str] = list(plan.notes)
    for row in plan.rows:
        cells = [row.strategy.label]
        if row.memory is None:
            cells += ["-"] * (len(_COLUMNS) + 1)
        else:
            d = row.memory.to_dict()
            # 80 columns hold no more: backward's transients print with the activations (JSON splits them).
            d["activations"] += d["workspace"] + d["kv_cache"]
            d["temporary"] += d["fp8_weights"] + d["optimizer_step"]
            cells += [_gib(d[name]) for name in _COLUMNS] + [_gib(row.memory.total)]
        if row.verdict in ("fits", "tight") and row.headroom is not None:
            verdict = f"{row.verdict} +{_gib(row.headroom)}"
        elif row.verdict == "does_not_fit" and row.headroom is not None:
            verdict = f"short {_gib(-row.headroom)}"
        else:
            verdict = row.verdict
        table.add_row(*cells, Text(verdict, style=_VERDICT_STYLE.get(row.verdict, "")))
        notes += [f"{row.strategy.label}: {note}" for note in row.notes]
    con.print(table)
    con.print(
        "param/grads/optim = parameters, gradients, optimizer states; mastr = fp32 copy of the weights "
        "(mixed precision); activ = activations + backward's transients at their largest (+ KV cache for --inference); "
        "temp = communication buckets, autocast's (or fp8's) weight copies and the optimizer step's transients; ovhd = driver reserve + "
        "CUDA context + NCCL buffers; verdict: fits +X = X GiB headroom, short Y = over by Y GiB; inputs "
        "(token ids, labels) and the overhead's items are in the JSON. See docs/plan.md.",
        style="dim",
        soft_wrap=True,
    )
    for note in notes:
        con.print(f"note: {note}", style="dim", soft_wrap=True, markup=False)
    for item in plan.advice:
        con.print(f"try: {item}", soft_wrap=True, markup=False)
