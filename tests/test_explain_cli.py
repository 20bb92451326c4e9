"""`ddpdoctor explain`: files, .gz, stdin, --json, --all, exit codes, and hostile input."""

from __future__ import annotations

import gzip
import io
import json
import os
import random
import tracemalloc
from pathlib import Path

import pytest
from typer.testing import CliRunner

from ddpdoctor.cli import app
from ddpdoctor.explain import load_knowledge_base, open_log, scan_inputs

# Real lines (sources in tests/fixtures/explain/lines.json).
SHM_WARN = "misc/shmutils.cc:112 NCCL WARN Error while creating shared memory segment /dev/shm/nccl-KWfVyt (size 5967872)"
SYSTEM_ERROR = (
    "[rank1]: torch.distributed.DistBackendError: NCCL error in: ..., unhandled system error "
    "(run with NCCL_DEBUG=INFO for details), NCCL version 2.25.1"
)
IB_NO_DEVICE = "gpu-node-17:1234:5678 [0] NCCL INFO NET/IB : No device found."
NOISE = "[rank0]: Epoch 3 | step 1200 | loss 2.3451 | lr 1.00e-04 | grad_norm 0.93\n"


def invoke(args: list[str], stdin: bytes | str | None = None):
    return CliRunner().invoke(app, ["explain", *args], input=stdin)


@pytest.fixture
def rank_logs(tmp_path: Path) -> list[Path]:
    r0 = tmp_path / "rank0.log"
    r0.write_text(NOISE * 50 + SYSTEM_ERROR.replace("[rank1]", "[rank0]") + "\n")
    r1 = tmp_path / "rank1.log"
    r1.write_text(NOISE * 20 + IB_NO_DEVICE + "\n" + SHM_WARN + "\n" + SYSTEM_ERROR + "\n" + NOISE)
    return [r0, r1]


def test_files_json(rank_logs: list[Path]) -> None:
    res = invoke([str(p) for p in rank_logs] + ["--json"])
    assert res.exit_code == 1, res.output
    data = json.loads(res.stdout)
    assert data["schema"] == "ddpdoctor.explain/1" and data["exit_code"] == 1
    root = data["root_cause"]
    assert root["id"] == "nccl.shm" and root["ranks"] == [1]
    assert root["first"]["source"] == f"{rank_logs[1]}:22"
    assert root["evidence"][0]["excerpt"] == SHM_WARN
    assert root["cause"] and root["fix"] and root["references"]
    cons = {d["id"]: d for d in data["consequences"]}
    assert cons["nccl.system_error"]["ranks"] == [0, 1]
    assert data["notes"] == []  # informational notes only with --all
    assert [i["lines"] for i in data["inputs"]] == [51, 24]


def test_text_output_puts_root_cause_first(rank_logs: list[Path]) -> None:
    res = invoke([str(p) for p in rank_logs])
    assert res.exit_code == 1
    out = res.stdout
    assert "ROOT CAUSE" in out and "[nccl.shm]" in out and "rank 1" in out
    assert out.index("ROOT CAUSE") < out.index("Consequences") < out.index("[nccl.system_error]")
    assert "nccl.ib_no_device" not in out


def test_all_adds_notes(rank_logs: list[Path]) -> None:
    res = invoke([str(p) for p in rank_logs] + ["--all"])
    assert res.exit_code == 1 and "Notes" in res.stdout and "[nccl.ib_no_device]" in res.stdout
    data = json.loads(invoke([str(p) for p in rank_logs] + ["--all", "--json"]).stdout)
    assert [n["id"] for n in data["notes"]] == ["nccl.ib_no_device"]


def test_gzip_input_is_detected_by_content(tmp_path: Path, rank_logs: list[Path]) -> None:
    gz = tmp_path / "rank1.log.gz"
    gz.write_bytes(gzip.compress(rank_logs[1].read_bytes()))
    renamed = tmp_path / "rank1-compressed.txt"  # no .gz suffix: the magic bytes decide
    renamed.write_bytes(gz.read_bytes())
    for path in (gz, renamed):
        data = json.loads(invoke([str(path), "--json"]).stdout)
        assert data["root_cause"]["id"] == "nccl.shm" and data["root_cause"]["ranks"] == [1]


def test_truncated_gzip_keeps_what_was_read(tmp_path: Path) -> None:
    rng = random.Random(1)
    noise = "".join(f"[rank4]: step {rng.getrandbits(64):x} loss {rng.random():.6f}\n" for _ in range(20000))
    compressed = gzip.compress((SHM_WARN + "\n" + noise).encode())
    assert len(compressed) > 100_000
    gz = tmp_path / "rank4.log.gz"
    gz.write_bytes(compressed[:-4000])
    res = invoke([str(gz), "--json"])
    assert res.exit_code == 1
    data = json.loads(res.stdout)
    assert data["inputs"][0]["error"].startswith("read stopped early")
    assert data["root_cause"]["id"] == "nccl.shm"


def test_stdin(rank_logs: list[Path]) -> None:
    text = rank_logs[1].read_bytes()
    for args in ([], ["-"]):
        res = invoke(args + ["--json"], stdin=text)
        assert res.exit_code == 1
        assert json.loads(res.stdout)["inputs"][0]["name"] == "<stdin>"


def test_stdin_mixed_with_files(rank_logs: list[Path]) -> None:
    res = invoke([str(rank_logs[0]), "-", "--json"], stdin=rank_logs[1].read_bytes())
    data = json.loads(res.stdout)
    assert res.exit_code == 1 and data["root_cause"]["id"] == "nccl.shm"


def test_nothing_recognised_is_exit_0(tmp_path: Path) -> None:
    p = tmp_path / "ok.log"
    p.write_text(NOISE * 100)
    res = invoke([str(p)])
    assert res.exit_code == 0 and "No known failure signature" in res.stdout


@pytest.mark.parametrize("args", [["/nonexistent/rank0.log"], ["-", "-"]])
def test_usage_errors_exit_2(args: list[str], tmp_path: Path) -> None:
    assert invoke(args, stdin="").exit_code == 2


def test_missing_and_special_files_say_what_they_are(tmp_path: Path) -> None:
    # QA pass: a mistyped path said "rank0.log: not a file", as if the path were something else.
    res = invoke([str(tmp_path / "rank0.log")])
    assert res.exit_code == 2 and "rank0.log: no such file" in res.output
    fifo = tmp_path / "pipe.log"
    os.mkfifo(fifo)
    res = invoke([str(fifo)])
    assert res.exit_code == 2 and "pipe.log: not a regular file (FIFO)" in res.output


def test_empty_directory_is_usage_error(tmp_path: Path) -> None:
    res = invoke([str(tmp_path)])
    assert res.exit_code == 2 and "not a file" in res.output


def test_directory_of_logs_reads_the_logs_in_it(tmp_path: Path) -> None:
    # `explain DIR` on the directory a job wrote its logs to: every log in it, as if named one by one.
    real = Path(__file__).parent / "fixtures" / "explain" / "torchrun-2rank-gloo-rank1-runtimeerror.log"
    (tmp_path / "job").mkdir()
    (tmp_path / "job" / "rank1.log").write_bytes(real.read_bytes())
    (tmp_path / "job" / ".hidden.log").write_text("NCCL WARN unrelated\n")
    res = invoke([str(tmp_path / "job"), "--json"])
    report = json.loads(res.stdout)
    assert res.exit_code == 1 and report["root_cause"]["id"] == "python.exception", res.output
    assert [i["name"] for i in report["inputs"]] == [str(tmp_path / "job" / "rank1.log")]


def test_unknown_option_is_usage_error() -> None:
    assert invoke(["--no-such-flag"]).exit_code == 2


def test_empty_input_is_inconclusive_not_nothing_recognised(tmp_path: Path) -> None:
    # QA pass: an empty file or `< /dev/null` said "No known failure signature" with exit 0.
    empty = tmp_path / "empty.log"
    empty.write_bytes(b"")
    for res in (invoke([str(empty), "--json"]), invoke(["--json"], stdin=b"")):
        assert res.exit_code == 3
        data = json.loads(res.stdout)
        assert data["root_cause"] is None and data["inputs"][0]["bytes"] == 0
        assert data["empty_input"] is True and data["exit_code"] == 3
    for res in (invoke([str(empty)]), invoke([], stdin=b"")):
        assert res.exit_code == 3
        assert "input is empty: nothing to explain" in res.stdout
        assert "No known failure signature" not in res.stdout
    res = invoke([str(empty), "--format", "github"])
    assert res.exit_code == 3 and "explain.empty" in res.stdout
    # One empty log beside a real one is not an empty input.
    other = tmp_path / "ok.log"
    other.write_text(NOISE)
    res = invoke([str(empty), str(other), "--json"])
    assert res.exit_code == 0 and json.loads(res.stdout)["empty_input"] is False


def test_invalid_utf8_around_a_real_line(tmp_path: Path) -> None:
    p = tmp_path / "rank2.log"
    p.write_bytes(
        b"\xff\xfe\xfd garbage \xc3\x28\n"
        + b"\x80\x81 RuntimeError: CUDA error: invalid device ordinal \xff\n"
    )
    data = json.loads(invoke([str(p), "--json"]).stdout)
    assert data["root_cause"]["id"] == "device.invalid_ordinal" and data["root_cause"]["ranks"] == [2]
    assert "\ufffd" in data["root_cause"]["evidence"][0]["excerpt"]


def test_binary_garbage(tmp_path: Path) -> None:
    p = tmp_path / "core.bin"
    p.write_bytes(random.Random(0).randbytes(3 << 20))
    res = invoke([str(p), "--json"])
    # Not a log: "nothing recognised" (exit 0) would be a verdict on garbage (#26); a usage error says why.
    assert res.exit_code == 2, res.output
    assert "binary data" in res.output and "not a text log" in res.output


def test_crlf_and_ansi_colours(tmp_path: Path) -> None:
    p = tmp_path / "rank6.log"
    p.write_bytes(b"\x1b[31mRuntimeError: CUDA error: invalid device ordinal\x1b[0m\r\n" + NOISE.encode())
    data = json.loads(invoke([str(p), "--json"]).stdout)
    assert data["root_cause"]["evidence"][0]["excerpt"] == "RuntimeError: CUDA error: invalid device ordinal"


def test_secrets_are_redacted_from_evidence(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_TOKEN", "hf_abcdefghijklmnop")
    p = tmp_path / "rank0.log"
    p.write_text(
        "RuntimeError: CUDA error: invalid device ordinal hf_abcdefghijklmnop https://user:pw@host/x\n"
    )
    out = invoke([str(p), "--json"]).stdout
    assert "hf_abcdefghijklmnop" not in out and "user:pw" not in out and "<redacted>" in out


def _write_single_line(path: Path, size: int, inserts: dict[int, bytes], end: bytes) -> None:
    """A file that is one line of `size` filler bytes with `inserts` at offsets, written in pieces."""
    filler = b"x" * (1 << 20)
    with open(path, "wb") as f:
        pos = 0
        for offset, text in sorted(inserts.items()):
            while pos < offset:
                n = min(len(filler), offset - pos)
                f.write(filler[:n])
                pos += n
            f.write(text)
            pos += len(text)
        while pos < size:
            n = min(len(filler), size - pos)
            f.write(filler[:n])
            pos += n
        f.write(end)


def test_50mb_single_line_is_scanned_in_bounded_memory(tmp_path: Path) -> None:
    path = tmp_path / "rank3.log"
    oom = b" Out of memory: Killed process 812917 (python) total-vm:26,184,840kB "
    _write_single_line(path, 50 << 20, {25 << 20: oom}, b" RuntimeError: CUDA error: invalid device ordinal")
    kb = load_knowledge_base()
    tracemalloc.start()
    try:
        with open_log(str(path)) as stream:
            result = scan_inputs(kb, [(path.name, stream)])
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 16 << 20, f"peak {peak / 2**20:.1f} MiB while scanning a 50 MiB line"
    stats = result.inputs[0]
    assert stats.lines == 1 and stats.long_lines == 1 and stats.bytes == path.stat().st_size
    sigs = {e.sig: e for e in result.events}
    assert {"oom.kernel", "device.invalid_ordinal"} <= set(sigs)
    assert sigs["oom.kernel"].line == 1 and len(sigs["oom.kernel"].text) < 1000

    res = invoke([str(path), "--json"])
    data = json.loads(res.stdout)
    assert res.exit_code == 1 and data["inputs"][0]["long_lines"] == 1


def test_stdin_closed_is_usage_error() -> None:
    # issue #20 item 5: `explain <&-` used to die with AttributeError on sys.stdin.isatty().
    import subprocess
    import sys

    proc = subprocess.run(
        ["sh", "-c", 'exec "$0" -m ddpdoctor explain <&-', sys.executable],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2, proc.stderr
    assert "stdin is closed" in proc.stderr and "Traceback" not in proc.stderr


def test_corrupt_gzip_with_nothing_readable_is_exit_2(tmp_path: Path) -> None:
    # issue #20 item 5: a .gz whose first block is garbage was "nothing recognised", exit 0.
    path = tmp_path / "rank0.log.gz"
    path.write_bytes(b"\x1f\x8b\x08\x00" + bytes(range(7, 200)))
    res = invoke([str(path)])
    assert res.exit_code == 2, res.output
    assert "nothing readable" in res.output


def _repeat_real_log(name: str, times: int) -> bytes:
    return (Path(__file__).parent / "fixtures" / "explain" / "real-h100" / name).read_bytes() * times


def test_repeated_real_log_keeps_memory_and_answer_bounded() -> None:
    # issue #20 item 8: torchrun's failure summary was kept once per repetition (memory grew with the
    # log). 2,000 repetitions of a real torchrun log: the summary is capped, the answer is unchanged and
    # every repetition is still counted.
    kb = load_knowledge_base()
    from ddpdoctor.explain import explain
    from ddpdoctor.explain.scan import MAX_SUMMARY

    once = scan_inputs(kb, [("dup_gpu.log", io.BytesIO(_repeat_real_log("dup_gpu.log", 1)))])
    many = scan_inputs(kb, [("dup_gpu.log", io.BytesIO(_repeat_real_log("dup_gpu.log", 2000)))])
    assert len(many.summary) <= MAX_SUMMARY
    assert many.counts["nccl.duplicate_gpu"] == 2000 * once.counts["nccl.duplicate_gpu"]
    assert len(many.events) <= 4 * len(once.events)
    assert explain(kb, many).root.id == explain(kb, once).root.id == "nccl.duplicate_gpu"


def test_dense_lines_are_counted_and_every_rank_is_attributed() -> None:
    # The shape cache counts repeats without matching them again; the first lines of each rank are still
    # matched in full, so every rank shows up.
    kb = load_knowledge_base()
    line = (
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity"
    )
    text = "".join(f"[rank{i % 16}]:{line}\n" for i in range(20_000)).encode()
    res = scan_inputs(kb, [("train.log", io.BytesIO(text))])
    assert res.counts["device.cuda_oom"] == 20_000
    assert {e.rank for e in res.events if e.sig == "device.cuda_oom"} == set(range(16))
    assert res.inputs[0].lines == 20_000


def test_no_cause_found_in_json_text_and_markdown() -> None:
    # Real H100 log holding only torchrun's SIGTERM and summary (tests/fixtures/explain/README.md).
    log = str(
        Path(__file__).parent / "fixtures" / "explain" / "real-h100" / "torchrun-2ranks-1gpu-bench-nccl.log"
    )
    data = json.loads(invoke([log, "--json"]).stdout)
    assert data["root_cause"] is None and data["exit_code"] == 1
    assert data["no_cause_found"]["fetch_next"][0].startswith("rank 1's own output")
    text = invoke([log])
    assert text.exit_code == 1 and "no cause found in these logs" in text.stdout
    assert "[launch.child_failed]" in text.stdout.split("Consequences")[1]
    md = invoke([log, "--format", "markdown"])
    assert "explain.no_cause" in md.stdout
