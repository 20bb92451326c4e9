"""Specific mechanisms over generic catch-alls, and no failed run reported as "nothing found".

Lines come from tests/fixtures/explain/lines.json (each with its source: an NCCL / PyTorch / gloo / DeepSpeed
/ nccl-tests message format, or a log of the spent held-out set 2). Each scenario checks the root cause
explain names and that the broader signature the specific one refines is not recorded on the same line.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from ddpdoctor.core.model import ExitCode
from ddpdoctor.explain import explain, load_knowledge_base, scan_inputs
from ddpdoctor.explain.kb import KnowledgeBaseError, parse_knowledge_base

FIXTURES = Path(__file__).parent / "fixtures" / "explain"
KB = load_knowledge_base()
DATA = json.loads((Path(__file__).parents[1] / "ddpdoctor" / "data" / "signatures.json").read_text())
LINES: dict[str, list[str]] = {}
for _item in json.loads((FIXTURES / "lines.json").read_text())["lines"]:
    LINES.setdefault(_item["signature"], []).append(_item["line"])


def run(text: str):
    return explain(KB, scan_inputs(KB, [("x.log", io.BytesIO(text.encode()))]))


@pytest.mark.parametrize(
    ("sig", "refined"),
    [
        ("gpu.fabric_manager", "nccl.cuda_failure"),
        ("nccl.nvls_setup", "nccl.cuda_failure"),
        ("nccl.cuda_peer_access", "nccl.cuda_failure"),
        ("nccl.cuda_not_supported", "nccl.cuda_failure"),
        ("nccl.arch_missing", "nccl.cuda_failure"),
        ("device.driver_too_old", "nccl.cuda_failure"),
        ("nccl.library_mismatch", "python.exception"),
        ("gloo.loopback_peer", "gloo.connect_refused"),
        ("launch.ssh_unreachable", "python.exception"),
    ],
)
def test_specific_mechanism_is_the_root_and_replaces_the_generic_one(sig: str, refined: str) -> None:
    for line in LINES[sig]:
        ex = run(line + "\n")
        assert ex.root is not None and ex.root.id == sig, line
        assert refined not in {d.id for d in ex.consequences + ex.notes}, line
        assert ex.exit_code == ExitCode.FAILED


def test_nvls_message_after_last_error_is_named_not_quoted() -> None:
    # pytorch/pytorch#177472 (spent set 2): ProcessGroupNCCL appends ncclGetLastError() after 'Last error:'.
    log = (
        "torch.distributed.DistBackendError: NCCL error in: NCCLUtils.cpp:93, unhandled cuda error (run with "
        "NCCL_DEBUG=INFO for details), NCCL version 2.29.3\n"
        "ncclUnhandledCudaError: Call to CUDA function failed.\nLast error:\n" + LINES["nccl.nvls_setup"][0] + "\n"
    )
    ex = run(log)
    assert ex.root is not None and ex.root.id == "nccl.nvls_setup"
    assert "NCCL_NVLS_ENABLE=0" in ex.root.fix


def test_generic_cuda_failure_stays_for_other_errors() -> None:
    ex = run("ng30903:3063028:3066152 [3] include/alloc.h:178 NCCL WARN Cuda failure 'out of memory'\n")
    assert ex.root is not None and ex.root.id == "nccl.cuda_failure"


def test_gloo_loopback_outranks_the_python_wrapper_above_it() -> None:
    # aws-samples/aws-do-eks#69 (spent set 2): a generic RuntimeError first, Gloo's loopback address after it.
    log = (
        "RuntimeError: Engine core initialization failed\n"
        "RuntimeError: Gloo connectFullMesh failed with [/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:152]\n"
        "  timed out connecting: SO_ERROR: Connection refused, remote=[127.0.0.1]:<port>\n"
        "  (rank=8, size=16, local=[127.0.0.1])\n"
    )
    ex = run(log)
    assert ex.root is not None and ex.root.id == "gloo.loopback_peer"
    assert ex.root.data.get("addr") == "127.0.0.1"


def test_unresolvable_master_addr_is_a_root_but_yields_to_a_specific_cause() -> None:
    resolve = LINES["c10d.hostname_unresolved"][0]
    ex = run(resolve + "\n")
    assert ex.root is not None and ex.root.id == "c10d.hostname_unresolved"
    assert ex.root.data["gai"] == "-2"
    # Precedence 2: a host-name warning before a specific failure does not hide it.
    ex = run(resolve + "\n" + LINES["nccl.shm"][0] + "\n")
    assert ex.root is not None and ex.root.id == "nccl.shm"


def test_ipv6_family_without_address_is_not_called_unresolvable() -> None:
    # EAI_NODATA (-5) for one family: the name exists, it has no address of that family.
    line = (
        "[W socket.cpp:767] [c10d] The IPv6 network addresses of (node0, 29500) cannot be retrieved "
        "(gai error: -5 - No address associated with hostname)."
    )
    assert run(line + "\n").root is None


def test_watchdog_timeout_without_detail_then_abort_is_a_lead_not_silence() -> None:
    # alan-turing-institute/autocast#381 (spent set 2): the reporter elided the WorkNCCL detail.
    log = LINES["watchdog.timeout"][-1] + "\n  WorkNCCL(..., OpType=ALLREDUCE)\n" + LINES["launch.sigabrt"][0] + "\n"
    ex = run(log)
    assert ex.root is None and ex.exit_code == ExitCode.FAILED
    assert ex.lead is not None and ex.lead.id == "watchdog.timeout"
    assert "launch.sigabrt" in {d.id for d in ex.consequences}


def test_injected_graph_file_is_a_lead_with_exit_1() -> None:
    ex = run(LINES["nccl.graph_file_env"][0] + "\n")
    assert ex.root is None and ex.lead is not None and ex.lead.id == "nccl.graph_file_env"
    assert ex.exit_code == ExitCode.FAILED
    assert ex.to_dict()["lead"]["data"]["var"] == "GRAPH"


def test_unrecognised_failure_is_never_nothing_found() -> None:
    # nccl-tests#264's shape with an error string the knowledge base does not know.
    log = "test: Test CUDA failure common.cu:941 'an error nobody has seen'\n .. test pid 1: Test failure common.cu:891\n"
    ex = run(log)
    assert ex.root is None and ex.exit_code == ExitCode.FAILED
    assert [d.id for d in ex.consequences] == ["failure.unrecognised"]
    assert ex.to_dict()["no_cause_found"]["fetch_next"]


def test_unrecognised_failure_is_dropped_when_something_else_explains_it() -> None:
    log = "Traceback (most recent call last):\n  File \"train.py\", line 3, in <module>\nKeyError: 'lr'\n"
    ex = run(log)
    assert ex.root is not None and ex.root.id == "python.exception"
    assert "failure.unrecognised" not in {d.id for d in ex.consequences}


def test_plain_noise_is_still_exit_0() -> None:
    assert run("epoch 1 loss 0.5\nepoch 2 loss 0.4\n").exit_code == ExitCode.HEALTHY


def test_refines_must_name_a_known_signature() -> None:
    doc = json.loads(json.dumps(DATA))
    doc["signatures"][0]["refines"] = ["no.such.signature"]
    with pytest.raises(KnowledgeBaseError, match="refines"):
        parse_knowledge_base(doc)
