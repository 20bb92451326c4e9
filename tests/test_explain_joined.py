"""Lines joined before matching (a message that continues on the next line), C++ stack frames never taken
for a cause, and the NCCL result strings of nccl-tests and Caffe. Every line is quoted from a public thread
(provenance beside it and in tests/fixtures/explain/README.md)."""

from __future__ import annotations

import io
from pathlib import Path

from ddpdoctor.explain import explain, load_knowledge_base, scan_inputs
from ddpdoctor.explain.normalize import normalize_line

KB = load_knowledge_base()


def scan(text: str):
    return scan_inputs(KB, [("rank0.log", io.BytesIO(text.encode()))])


def run(text: str):
    return explain(KB, scan(text))


# NVIDIA/nccl#1410 (issue body): PyTorch prints `Last error:` and the error text on the next line.
NCCL_1410 = (
    "[rank7]: torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/NCCLUtils.hpp:275, "
    "unhandled cuda error (run with NCCL_DEBUG=INFO for details), NCCL version 2.20.5\n"
    "[rank7]: ncclUnhandledCudaError: Call to CUDA function failed.\n"
    "[rank7]: Last error:\n"
    "[rank7]: Cuda failure 1 'invalid argument'\n"
)


def test_last_error_is_joined_with_the_text_on_the_next_line() -> None:
    ex = run(NCCL_1410)
    assert ex.root is not None and ex.root.id == "nccl.cuda_failure"
    # The cause is read where PyTorch states it: the `Last error:` line, joined with its text.
    assert ex.root.first is not None and ex.root.first.line == 3
    assert "Last error: Cuda failure 1 'invalid argument'" in ex.root.first.text
    assert ex.root.ranks == [7]
    assert any(d.id == "nccl.unhandled_cuda" for d in ex.consequences)


def test_empty_last_error_does_not_take_the_stack_trace_as_its_text() -> None:
    # pytorch/pytorch#149984 (issue body): `Last error:` followed by an empty line and the C++ trace.
    log = (
        "Collective WorkNCCL(SeqNum=2, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=1000000) raised the "
        "following async exception: NCCL error: unhandled system error (run with NCCL_DEBUG=INFO for details), "
        "NCCL version 2.25.1\n"
        "ncclSystemError: System call (e.g. socket, malloc) or external library call failed or device error. \n"
        "Last error:\n"
        "\n"
        "Exception raised from checkForNCCLErrorsInternal at /pytorch/torch/csrc/distributed/c10d/"
        "ProcessGroupNCCL.cpp:2501 (most recent call first):\n"
    )
    res = scan(log)
    assert not any(e.sig == "message.stated_cause" for e in res.events)
    assert any(e.sig == "nccl.system_error" for e in res.events)


# huggingface/nanotron#204: the thread shows this watchdog line wrapped over two terminal lines; here it is
# wrapped at two places a terminal or a log collector would (the words are the thread's).
NANOTRON_204 = (
    "[default2]:[E ProcessGroupNCCL.cpp:475] [Rank 2] Watchdog caught collective operation timeout: "
    "WorkNCCL(SeqNum=3, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for 600888 "
    "milliseconds before timing out."
)


def test_watchdog_timeout_whose_worknccl_continues_on_the_next_line() -> None:
    cut = NANOTRON_204.index("Timeout(ms)")
    for first, second in [
        (NANOTRON_204[: cut + 3], NANOTRON_204[cut + 3 :]),  # hard wrap inside a word
        (NANOTRON_204[:cut].rstrip(), "    " + NANOTRON_204[cut:]),  # indented continuation
        (NANOTRON_204[:cut].rstrip(), "[default2]:" + NANOTRON_204[cut:]),  # launcher prefix on each line
    ]:
        res = scan(first + "\n" + second + "\n")
        ev = next(e for e in res.events if e.sig == "watchdog.timeout")
        assert ev.fields["seq"] == "3" and ev.fields["timeout_ms"] == "600000", (first, second)
        assert ev.line == 1 and ev.local_rank == 2


def test_gloo_error_split_after_its_source_location() -> None:
    # msr-fiddle/pipedream#32's message, split after gloo's `[enforce fail at file:line]` with the text
    # indented on the next line, the shape gloo errors take when a log wraps them.
    log = (
        "RuntimeError: [enforce fail at ../third_party/gloo/gloo/transport/tcp/device.cc:127]\n"
        "  rp != nullptr. Unable to find address for: dgx-1.ai\n"
    )
    ex = run(log)
    assert ex.root is not None and ex.root.id == "gloo.no_address"
    assert ex.root.first is not None and ex.root.first.line == 1
    assert ex.root.data["lookup"] == "rp" and ex.root.data["what"] == "dgx-1.ai"


def test_joining_stops_at_a_bound() -> None:
    # An unclosed `WorkNCCL(` followed by many lines: at most a few are joined.
    res = scan("Watchdog caught collective operation timeout: WorkNCCL(SeqNum=1,\n" + "x,\n" * 50)
    assert res.inputs[0].lines == 51


# jpata/particleflow#390 (issue body): c10::Error's backtrace under a watchdog timeout.
FRAMES = [
    "frame #0: c10::Error::Error(c10::SourceLocation, std::string) + 0x96 (0x1554e8b12f86 in "
    "/mnt/home/ewulff/miniforge3/envs/mlpf/lib/python3.11/site-packages/torch/lib/libc10.so)",
    "frame #1: c10d::ProcessGroupNCCL::WorkNCCL::checkTimeout(std::optional<std::chrono::duration<long, "
    "std::ratio<1l, 1000l> > >) + 0x1d2 (0x1554e9e0f8f2 in /mnt/home/ewulff/miniforge3/envs/mlpf/lib/python3.11/"
    "site-packages/torch/lib/libtorch_cuda.so)",
    "Exception raised from ncclCommWatchdog at ../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:1521 (most "
    "recent call first):",
    # BVLC/caffe#5599: glog's stack after a failed CHECK.
    "    @     0x7f3f5bdb75cd  google::LogMessage::Fail()",
]


def test_stack_frames_are_recognised_as_frames_and_claimed_only_as_evidence_of_failure() -> None:
    for line in FRAMES:
        assert normalize_line(line).frame, line
        assert normalize_line("[rank1]:" + line).frame, line
    assert not normalize_line("RuntimeError: NCCL error in: ProcessGroupNCCL.cpp:1521").frame
    # Only the signatures that read frames claim them: the watchdog's checkTimeout frame (a timeout, never a
    # root cause) and c10's 'Exception raised from' (a failure, the fallback). A log of nothing but this
    # backtrace (held-out set 7, y08) is a failed run, not "nothing found".
    res = scan("\n".join(FRAMES) + "\n")
    assert {e.sig for e in res.events} == {"watchdog.timeout", "failure.unrecognised"}
    ex = run("\n".join(FRAMES) + "\n")
    assert ex.root is None and ex.lead is not None and ex.lead.id == "watchdog.timeout"
    # Beside the message that says why, the frames add nothing to the root cause.
    ex = run("RuntimeError: Expected to have finished reduction in the prior iteration before starting a new one\n"
             + "\n".join(FRAMES) + "\n")
    assert ex.root is not None and ex.root.id == "ddp.unused_parameters"


def test_caffe_check_failed_is_an_nccl_error_of_the_right_class() -> None:
    # ppengtang/oicr#10 and BVLC/caffe#5599: Caffe's NCCL_CHECK; the glog stack follows.
    ex = run(
        "F0118 23:24:48.788218 37264 parallel.cpp:135] Check failed: result == ncclSuccess (2 vs. 0)  unhandled "
        "system error. *** Check failure stack trace: ***\n" + FRAMES[3] + "\n"
    )
    assert [d.id for d in ex.consequences][:1] == ["nccl.system_error"]
    ex = run(
        "F0508 14:41:40.563820 19761 parallel.cpp:195] Check failed: result == ncclSuccess (1 vs. 0)  unhandled "
        "cuda error\n*** Check failure stack trace: ***\n"
    )
    assert any(d.id == "nccl.unhandled_cuda" for d in ex.consequences)


def test_nccl_tests_failure_lines_are_nccl_errors() -> None:
    # NVIDIA/nccl-tests#5 (after nccl-tests' '# ' header lines) and #322 (behind mpirun's host prefix).
    ex = run(
        "#      bytes             N    type      op     time  algbw  busbw      res     time  algbw  busbw      res\n"
        "NCCL failure all_reduce.cu:95 'unhandled cuda error'\n"
    )
    assert any(d.id == "nccl.unhandled_cuda" for d in ex.consequences)
    ex = run("HCA-14: Test NCCL failure common.cu:1204 'unhandled cuda error (run with NCCL_DEBUG=INFO for details) / '\n")
    assert any(d.id == "nccl.unhandled_cuda" for d in ex.consequences)


def test_slurm_and_deepspeed_prefixes_are_stripped() -> None:
    info = normalize_line("srun: error: node-1: task 3: Out Of Memory")
    assert info.message == "node-1: task 3: Out Of Memory"
    info = normalize_line("[2024-05-06 10:12:31,577] [INFO] [launch.py:316:main] Failures:")
    assert info.message == "Failures:"
    info = normalize_line("(RayTrainWorker pid=2387, ip=10.0.1.5) [rank1]: RuntimeError: boom")
    assert info.message == " RuntimeError: boom" and info.rank == 1
    info = normalize_line("0: compute-1:34639:36718 [5] bootstrap.cc:77 NCCL WARN Message truncated")
    assert info.message.startswith("compute-1:34639:36718 [5]") and info.host == "compute-1"


def test_a_whole_interface_list_is_not_joined_with_the_next_line_and_a_healthy_run_exits_0() -> None:
    # The real H100 node's healthy NCCL log (tests/fixtures/explain/real-h100/nccl_info.log), with its
    # one-interface NET/Socket line given the bridges of NVIDIA/nccl#697 in NCCL's own format
    # (net_socket.cc: INFO "NET/Socket : Using%s", " [%d]%s:%s" per interface). The list is whole on its
    # line, so the next line is not part of it; the bridges are a lead for a multi-node failure, not a
    # failure: nothing in this log failed.
    real = (Path(__file__).parent / "fixtures" / "explain" / "real-h100" / "nccl_info.log").read_text()
    socket_line = "vm:1919:1919 [0] NCCL INFO NET/Socket : Using [0]eth0:192.0.2.2<0>"
    assert socket_line in real
    log = real.replace(socket_line, socket_line + " [1]br-05ab815fa14e:172.19.0.1<0> [2]veth6163fba:fe80::b878%veth6163fba<0>")
    ex = run(log)
    assert ex.root is None and ex.lead is not None and ex.lead.id == "nccl.socket_bridge_ifaces"
    assert ex.lead.first is not None
    assert ex.lead.first.text.rstrip().endswith("%veth6163fba<0>")
    assert "Initialized NET plugin" not in ex.lead.first.text
    assert int(ex.exit_code) == 0
