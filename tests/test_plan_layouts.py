"""`ddpdoctor plan` layouts from issue #25: fp8 (Transformer Engine), NVMe offload (ZeRO-Infinity), and
the combined layouts hsdp=R, fsdp-grad-op and tp=T,zeroK / tp=T,fsdp.

The expected figures are computed here from the sources' own statements (docs/plan.md cites them) and from
the real Llama-2-7B config.json (tests/fixtures/plan), never read back from the code under test."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import jsonschema
import pytest
from typer.testing import CliRunner

from ddpdoctor.cli import app
from ddpdoctor.cli.plan import _split_strategies
from ddpdoctor.plan import Hardware, Strategy, Workload, estimate_shape, load_shape, make_plan, parse_strategy
from ddpdoctor.plan.memory import layer_activation_elems, model_states, moments, overhead_for, process_groups
from ddpdoctor.plan.units import GIB

REPO = Path(__file__).resolve().parent.parent
LLAMA7 = REPO / "tests" / "fixtures" / "plan" / "llama-2-7b-hf.config.json"
SCHEMA = json.loads((REPO / "docs" / "schemas" / "plan.schema.json").read_text())
runner = CliRunner()


def _run(*args: str) -> tuple[int, str]:
    result = runner.invoke(app, ["plan", *args], env={"COLUMNS": "120"})
    return result.exit_code, result.stdout + result.stderr


def _llama7_block_linears() -> int:
    """q, k, v, o (h x h each) and gate, up, down (h x i) of every layer, from the config's own numbers."""
    cfg = json.loads(LLAMA7.read_text())
    h, i, layers = cfg["hidden_size"], cfg["intermediate_size"], cfg["num_hidden_layers"]
    return layers * (4 * h * h + 3 * h * i)


# --- fp8 ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("strategy", ["ddp", "zero1", "zero2", "zero3", "fsdp", "tp=8"])
def test_fp8_keeps_the_bf16_model_states(strategy: str) -> None:
    """TE scenario 2: bf16 weights, fp32 master in the optimizer: the same model states as bf16."""
    shape = load_shape(LLAMA7)
    s = parse_strategy(strategy)
    assert model_states(Workload(shape, dtype="fp8"), s, 8)[:4] == model_states(Workload(shape), s, 8)[:4]


def test_fp8_weight_copies_are_one_byte_per_block_linear_parameter() -> None:
    """TE's memory example: a 1024 x 1024 Linear holds "1 MB (weight in FP8)" after forward: 1 B per weight
    of every block Linear (Llama-2-7B: 6,476,005,376), split by tensor parallel, not by ZeRO-3/FSDP."""
    shape = load_shape(LLAMA7)
    w = Workload(shape, dtype="fp8")
    linears = _llama7_block_linears()
    assert linears == 6_476_005_376
    plan = make_plan(w, Hardware(8, 1, 80 * GIB), [Strategy("zero3"), Strategy("tp", 8)])
    z3, tp8 = (r.memory for r in plan.rows)
    # DDP's backward moment, where the copies live (its peak is the optimizer step, which has none).
    ddp = moments(w, Strategy("ddp"), 8, overhead_for("unknown", None, 8, 1))[0]
    assert z3 and tp8
    assert ddp.fp8_weights == z3.fp8_weights == linears
    assert tp8.fp8_weights == linears // 8
    bf16 = moments(Workload(shape), Strategy("ddp"), 8, overhead_for("unknown", None, 8, 1))[0]
    assert bf16.fp8_weights == 0
    # fp8 copies are GPU memory: in the total, not in the 16-bit parameters.
    assert ddp.parameters == bf16.parameters and ddp.total - ddp.fp8_weights - ddp.activations == (
        bf16.total - bf16.activations
    )


def test_fp8_saves_linear_inputs_in_one_byte() -> None:
    """Per token and layer, a Linear's saved input drops from 2 B to 1 B: the q/k/v input (h), the MLP input
    (h) and down's input (i). Under SDPA the attention output stays saved (SDPA's own backward) and o_proj
    adds its fp8 copy (+h, TE docs); under eager attention o_proj's input is only o_proj's: 2 -> 1 B."""
    shape = load_shape(LLAMA7)
    h, i = shape.hidden, shape.intermediate
    for attention, saved in (("sdpa", h + i), ("eager", 3 * h + i)):
        bf16, _ = layer_activation_elems(Workload(shape, attention=attention))
        fp8, _ = layer_activation_elems(Workload(shape, dtype="fp8", attention=attention))
        assert bf16 - fp8 == saved


def test_fp8_cli_json_and_refusals() -> None:
    code, out = _run("--config", str(LLAMA7), "--dtype", "fp8", "--optimizer", "adamw_torch_fused", "--gpus", "8",
                     "--gpu-mem", "80GiB", "--json")  # fmt: skip
    data = json.loads(out)
    jsonschema.validate(data, SCHEMA)
    assert code == 0 and data["workload"]["dtype"] == "fp8"
    assert all(r["bytes"]["fp8_weights"] > 0 for r in data["strategies"])
    assert any("Transformer Engine" in n for n in data["notes"])
    for extra in (["--inference"], ["--lora-rank", "16"]):
        code, out = _run("--config", str(LLAMA7), "--dtype", "fp8", "--gpus", "8", "--gpu-mem", "80GiB", *extra)
        assert code == 2 and "fp8" in out and "Traceback" not in out


# --- NVMe offload (ZeRO-Infinity) ---------------------------------------------------------------------------


def test_nvme_offload_gpu_as_cpu_offload_host_and_nvme_per_node() -> None:
    """70B on 2 nodes x 8, ZeRO-3: each rank's partition is 4.375e9 parameters. NVMe holds the fp32
    master, fp32 gradients and both Adam moments (16 B/param: DeepSpeed's "Adam optimizer has 4 states"),
    8 ranks per node; host RAM keeps buffer_count (4) swap buffers + one fp32 gradient buffer of the
    largest sub-group (sub_group_size 1e9), 4 B each. With params: + buffer_count 5 x buffer_size 1e8
    16-bit elements and max_in_cpu 1e9 elements in host RAM, the rest of the 16-bit partition on NVMe."""
    shape = estimate_shape(70_000_000_000)
    hw = Hardware(8, 2, 80 * GIB)
    part = shape.params // 16
    assert part * 16 == shape.params
    for cpu, nvme in (("optimizer", "nvme-optimizer"), ("optimizer+params", "nvme-optimizer+params")):
        on_cpu = make_plan(Workload(shape, offload=cpu), hw, [Strategy("zero3")]).rows[0].memory
        on_nvme = make_plan(Workload(shape, offload=nvme), hw, [Strategy("zero3")]).rows[0]
        assert on_cpu and on_nvme.memory
        assert on_nvme.memory.model_states == on_cpu.model_states and on_nvme.memory.total == on_cpu.total
        host = 8 * 5 * 1_000_000_000 * 4
        disk = 8 * 16 * part
        if nvme.endswith("params"):
            host += 8 * (5 * 100_000_000 * 2 + 1_000_000_000 * 2)
            disk += 8 * (part - 1_000_000_000) * 2
        assert (on_nvme.memory.host, on_nvme.memory.nvme) == (host, disk)
        assert on_cpu.nvme == 0
        assert any("NVMe" in n and "per node" in n for n in on_nvme.notes)


def test_nvme_offload_needs_zero3() -> None:
    """DeepSpeed: "NVMe offloading is available only with ZeRO stage 3": zero1/zero2 rows are invalid; asking
    only for them is exit 2 with the reason on the first line."""
    w = Workload(estimate_shape(7_000_000_000), offload="nvme-optimizer")
    rows = make_plan(w, Hardware(8, 1, 80 * GIB), [Strategy("zero1"), Strategy("zero2"), Strategy("zero3")]).rows
    assert [r.verdict for r in rows][:2] == ["invalid", "invalid"] and "ZeRO-3" in rows[0].notes[0]
    assert rows[2].verdict == "fits"
    code, out = _run("--params", "7B", "--offload", "nvme-optimizer", "--strategy", "zero2", "--gpus", "8",
                     "--gpu-mem", "80GiB")  # fmt: skip
    assert code == 2 and "NVMe offload needs ZeRO-3" in out.splitlines()[0]
    code, out = _run("--params", "70B", "--offload", "nvme-optimizer+params", "--gpus", "8", "--nodes", "2",
                     "--gpu-mem", "80GiB", "--strategy", "zero3", "--json")  # fmt: skip
    data = json.loads(out)
    jsonschema.validate(data, SCHEMA)
    assert data["strategies"][0]["bytes"]["nvme"] > 0 and data["workload"]["offload"] == "nvme-optimizer+params"


# --- hsdp=R, fsdp-grad-op ---------------------------------------------------------------------------------


def test_hsdp_group_shards_by_r_not_n() -> None:
    """HYBRID_SHARD with shard groups of R: model states as FSDP on R GPUs, whatever the total."""
    w = Workload(estimate_shape(7_000_000_000))
    sixteen = Hardware(8, 2, 80 * GIB)
    rows = make_plan(w, sixteen, [parse_strategy(x) for x in ("hsdp=4", "hsdp=8", "hsdp", "hsdp=16", "fsdp")]).rows
    h4, h8, hnode, h16, fsdp16 = (r.memory for r in rows)
    fsdp4 = make_plan(w, Hardware(4, 1, 80 * GIB), [Strategy("fsdp")]).rows[0].memory
    assert h4 and h8 and hnode and h16 and fsdp16 and fsdp4
    assert h4.model_states == fsdp4.model_states > h8.model_states == hnode.model_states > h16.model_states
    assert h16.model_states == fsdp16.model_states
    assert rows[0].strategy.label == "hsdp=4" and rows[0].to_dict()["shard_group"] == 4
    # a shard group and a replicate group: two communicators, unless R is 1 or all GPUs
    assert process_groups(parse_strategy("hsdp=4"), 16) == 2 and process_groups(parse_strategy("hsdp=16"), 16) == 1


def test_hsdp_group_that_does_not_divide_is_invalid() -> None:
    rows = make_plan(Workload(estimate_shape(7_000_000_000)), Hardware(8, 2, 80 * GIB),
                     [parse_strategy("hsdp=3"), parse_strategy("hsdp=32")]).rows  # fmt: skip
    assert all(r.verdict == "invalid" and "does not divide 16 GPUs" in r.notes[0] for r in rows)
    code, out = _run("--params", "7B", "--gpus", "8", "--gpu-mem", "80GiB", "--strategy", "hsdp=3")
    assert code == 2 and "hsdp=3" in out.splitlines()[0] and "Traceback" not in out
    code, out = _run("--params", "7B", "--gpus", "8", "--gpu-mem", "80GiB", "--strategy", "hsdp=0")
    assert code == 2 and "Traceback" not in out


def test_shard_grad_op_keeps_parameters_whole_and_shards_the_rest() -> None:
    """SHARD_GRAD_OP (ZeRO-2-like): 2P of 16-bit parameters through forward and backward; fp32 master,
    fp32 gradients and optimizer state sharded as FULL_SHARD shards them."""
    w = Workload(estimate_shape(7_000_000_000))
    rows = make_plan(w, Hardware(8, 1, 80 * GIB), [parse_strategy("fsdp-grad-op"), Strategy("fsdp")]).rows
    grad_op, fsdp = (r.memory for r in rows)
    assert grad_op and fsdp
    assert grad_op.parameters == 2 * w.shape.params
    assert (grad_op.gradients, grad_op.optimizer, grad_op.master) == (fsdp.gradients, fsdp.optimizer, fsdp.master)


def _llama7_root_and_block() -> tuple[int, int]:
    """FSDP's root unit (embedding, untied head, final norm) and one decoder block, from the config."""
    cfg = json.loads(LLAMA7.read_text())
    h, i, v = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    return 2 * v * h + h, 4 * h * h + 3 * h * i + 2 * h


def test_fsdp_peak_is_the_start_of_backward_without_gradients() -> None:
    """Measured (docs/plan.md, bench/plan_vs_measured.py --zero --stages 0 --detail): the FSDP2 peak is the
    loss's backward, every activation saved and no gradient made yet (zero_grad(set_to_none=True)). The
    activations and backward workspace are DDP's backward moment's; the gradients, 0; parameters and
    optimizer as before."""
    w = Workload(load_shape(str(LLAMA7)))
    hw = Hardware(8, 1, 80 * GIB)
    ddp = moments(w, Strategy("ddp"), 8, overhead_for("unknown", None, 8, 1))[0]
    for label in ("fsdp", "hsdp", "fsdp-grad-op"):
        fsdp = make_plan(w, hw, [parse_strategy(label)]).rows[0].memory
        assert fsdp
        assert fsdp.gradients == 0
        assert (fsdp.activations, fsdp.workspace) == (ddp.activations, ddp.workspace)
        assert fsdp.master == -(-4 * w.shape.params // 8)
        row = make_plan(w, hw, [parse_strategy(label)]).rows[0]
        assert any("peak at the start of backward" in n for n in row.notes)


def test_fsdp_peak_moves_to_the_end_of_backward_when_activations_are_small() -> None:
    """Full recomputation on 64 GPUs leaves little to save: the end of backward is larger, with every fp32
    gradient shard, the root unit's and one block's 16-bit gradients, and one layer's activations."""
    w = Workload(load_shape(str(LLAMA7)), recompute="full")
    n = 64
    root, block = _llama7_root_and_block()
    ddp = moments(w, Strategy("ddp"), n, overhead_for("unknown", None, n, 8))[0]
    fsdp, at_step, _ = moments(w, Strategy("fsdp"), n, overhead_for("unknown", None, n, 8))
    # ... and the optimizer step, with the gradient shard, foreach's copy of exp_avg_sq and no activation,
    # is smaller still: the peak stays the end of backward.
    assert at_step is not None and at_step.total < fsdp.total
    row = make_plan(w, Hardware(8, 8, 80 * GIB), [Strategy("fsdp")]).rows[0].memory
    assert row and row.activations == fsdp.activations and row.optimizer_step == 0
    assert fsdp.gradients == -(-4 * w.shape.params // n) + 2 * (root + block)
    per_token, _ = layer_activation_elems(w)
    assert fsdp.activations == int(per_token * 2048) < ddp.activations
    assert fsdp.workspace < ddp.workspace  # the loss's fp32 transients are gone by then


def test_fsdp_accumulation_keeps_the_gradient_shard_at_the_peak() -> None:
    """With gradient accumulation the fp32 gradient shard of the last micro-batch is live when the next
    backward begins."""
    w = Workload(load_shape(str(LLAMA7)))
    hw = Hardware(8, 1, 80 * GIB)
    one = make_plan(replace(w, global_batch=8), hw, [Strategy("fsdp")]).rows[0].memory
    acc = make_plan(replace(w, global_batch=64), hw, [Strategy("fsdp")]).rows[0].memory
    assert one and acc
    assert one.gradients == 0 and acc.gradients == -(-4 * w.shape.params // 8)
    assert acc.total - one.total == acc.gradients


# --- tp=T,zeroK / tp=T,fsdp ------------------------------------------------------------------------------


def test_tp_then_zero1_shards_the_tp_shard_over_n_over_t() -> None:
    """tp=8,zero1 on 16 GPUs: the shard S = P/8 with ZeRO-1 over D = 2: max(4S + 12S/D, 2S + 18S/D) (the
    plan's stage-1 formula on the shard; at D = 2 the step's conversion, 2S + 18S/D, is the larger);
    tp=4,fsdp: AdamW state 8S/D with D = 4, S = P/4."""
    shape = load_shape(LLAMA7)
    p = shape.params
    hw = Hardware(8, 2, 80 * GIB)
    rows = make_plan(Workload(shape), hw, [parse_strategy("tp=8,zero1"), parse_strategy("tp=4,fsdp")]).rows
    z1, f = rows
    assert z1.memory and f.memory and z1.data_parallel == 2 and f.data_parallel == 4
    s8 = -(-p // 8)
    assert abs(z1.memory.model_states - max(4 * s8 + 12 * s8 / 2, 2 * s8 + 18 * s8 / 2)) <= 4
    assert f.memory.optimizer == -(-8 * -(-p // 4) // 4)
    # FSDP over the tp shard gathers the root unit and two blocks, each a quarter of the whole one
    assert f.memory.parameters == 2 * (-(-shape.root_params // 4) + 2 * -(-shape.block_params // 4))
    assert z1.memory.temporary == 2 * 500_000_000 and f.memory.temporary == 0  # DeepSpeed bucket; FSDP none
    plain = make_plan(Workload(shape), hw, [Strategy("tp", 8)]).rows[0].memory
    assert plain and z1.memory.model_states < plain.model_states
    assert z1.memory.activations == plain.activations  # sequence parallel divides by t either way
    assert z1.to_dict()["dp_sharding"] == "zero1" and plain.to_dict() and rows[0].strategy.label == "tp=8,zero1"


def test_tp_sharding_validation() -> None:
    shape = load_shape(LLAMA7)
    rows = make_plan(Workload(shape), Hardware(8, 1, 80 * GIB),
                     [parse_strategy("tp=3,zero1"), parse_strategy("tp=2,pp=2,zero2"),
                      parse_strategy("tp=2,pp=2,zero1")]).rows  # fmt: skip
    assert rows[0].verdict == "invalid" and "does not divide" in rows[0].notes[0]
    assert rows[1].verdict == "invalid" and "ZeRO-1 only" in rows[1].notes[0]
    assert rows[2].verdict == "fits"
    with pytest.raises(ValueError, match="dopt"):
        parse_strategy("tp=8,dopt,zero1")
    assert _split_strategies("ddp,tp=4,pp=2,zero1,zero3,tp=8,dopt,fsdp,tp=2,fsdp") == [
        "ddp", "tp=4,pp=2,zero1", "zero3", "tp=8,dopt,fsdp", "tp=2,fsdp",
    ]  # fmt: skip
    code, out = _run("--config", str(LLAMA7), "--gpus", "8", "--gpu-mem", "80GiB", "--strategy", "tp=3,zero1")
    assert code == 2 and "tp=3,zero1" in out.splitlines()[0]
    code, out = _run("--config", str(LLAMA7), "--gpus", "8", "--gpu-mem", "80GiB", "--strategy", "tp=8,dopt,zero1")
    assert code == 2 and "Traceback" not in out
    code, out = _run("--config", str(LLAMA7), "--gpus", "8", "--nodes", "2", "--gpu-mem", "80GiB",
                     "--strategy", "tp=8,zero3,tp=8,fsdp,hsdp=8,fsdp-grad-op", "--json")  # fmt: skip
    data = json.loads(out)
    jsonschema.validate(data, SCHEMA)
    assert [r["strategy"] for r in data["strategies"]] == ["tp=8,zero3", "tp=8,fsdp", "hsdp=8", "fsdp-grad-op"]
    assert code == 0


def test_existing_rows_keep_their_json() -> None:
    """Old fields stay; the added ones are null where they do not apply."""
    row = make_plan(Workload(estimate_shape(1_000_000_000)), Hardware(8, 1, 80 * GIB), [Strategy("zero2")]).rows[0]
    d = row.to_dict()
    assert d["strategy"] == "zero2" and d["dp_sharding"] is None and d["shard_group"] is None
    assert replace(row.strategy) == Strategy("zero2")
