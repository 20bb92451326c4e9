"""Every signature of the explain knowledge base is recognised on a real quoted line (tests/fixtures/explain)."""

from __future__ import annotations

import copy
import io
import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ddpdoctor.explain import load_knowledge_base, scan_inputs
from ddpdoctor.explain.docs import DOC_PATH, generate
from ddpdoctor.explain.kb import KnowledgeBaseError, parse_knowledge_base
from ddpdoctor.explain.normalize import normalize_line, parse_timestamp, rank_from_filename

FIXTURES = Path(__file__).parent / "fixtures" / "explain"
LINES = json.loads((FIXTURES / "lines.json").read_text())["lines"]
KB = load_knowledge_base()
DATA = json.loads((Path(__file__).parents[1] / "ddpdoctor" / "data" / "signatures.json").read_text())


def scan_text(text: str, name: str = "x.log"):
    return scan_inputs(KB, [(name, io.BytesIO(text.encode()))])


def sigs_of(text: str) -> set[str]:
    return {e.sig for e in scan_text(text).events}


def test_knowledge_base_has_at_least_50_reported_signatures() -> None:
    reported = [s for s in KB.signatures if s.role != "context"]
    assert len(reported) >= 50
    for s in KB.signatures:
        assert s.title and s.component and s.cause and s.references, s.id
        assert s.fix or s.role == "context", s.id


def test_every_signature_has_a_quoted_line_with_a_source() -> None:
    covered = {item["signature"] for item in LINES}
    assert {s.id for s in KB.signatures} <= covered
    assert covered <= {s.id for s in KB.signatures}, "fixture line for an unknown signature"
    for item in LINES:
        assert item["source"].strip() and item["line"].strip()


def _recognised(expected: str, found: set[str]) -> bool:
    # The generic nccl.warn hands a WARN the NCCL catalogue knows to its class (nccl.warn.<class>).
    return expected in found or (expected == "nccl.warn" and any(f.startswith("nccl.warn.") for f in found))


@pytest.mark.parametrize("item", LINES, ids=[f"{i['signature']}-{n}" for n, i in enumerate(LINES)])
def test_quoted_line_is_recognised(item: dict) -> None:
    assert _recognised(item["signature"], sigs_of(item["line"] + "\n"))


# The prefixes launchers and frameworks put before every line: PyTorch's and torchrun's, python logging's
# time, srun --label, OpenMPI --tag-output, nccl-tests' '# ', Ray's worker prefix, DeepSpeed's logger.
PREFIXES = [
    "[rank3]:",
    "[default3]:",
    "[default 3]:",
    "2024-05-01 12:00:01,123 ",
    "0: ",
    "[1,3]<stderr>:",
    "# ",
    "(RayTrainWorker pid=2387, ip=10.0.1.5) ",
    "[2024-05-06 10:12:31,577] [INFO] [launch.py:316:main] ",
]


@pytest.mark.parametrize("prefix", PREFIXES)
@pytest.mark.parametrize("item", LINES, ids=[f"{i['signature']}-{n}" for n, i in enumerate(LINES)])
def test_quoted_line_is_recognised_behind_launcher_prefixes(item: dict, prefix: str) -> None:
    if item["line"].lstrip().startswith("Failures:") and prefix[0].isdigit() and prefix != "0: ":
        pytest.skip("anchored to the start of torchrun's summary line")
    events = [
        e for e in scan_text(prefix + item["line"] + "\n").events if _recognised(item["signature"], {e.sig})
    ]
    assert events
    own_prefix = "[rank" in item["line"] or "[default" in item["line"]
    if prefix.startswith("[rank") and not own_prefix:
        assert events[0].rank == 3
    if prefix.startswith("[default") and not own_prefix:
        assert events[0].local_rank == 3


def test_signatures_without_a_line_end_are_recognised() -> None:
    # The last line of a log often has no newline (the process was killed mid-write).
    assert sigs_of("RuntimeError: CUDA error: invalid device ordinal") == {"device.invalid_ordinal"}


@pytest.mark.parametrize(
    "line, sig",
    [
        # Wording variants across versions: case changes and old/new message forms.
        ("RuntimeError: Address already in use", "store.port_in_use"),
        (
            "The server socket has failed to listen on any local network address. port: 29500, useIpv6: 0, "
            "code: -98, name: EADDRINUSE, message: address already in use",
            "store.port_in_use",
        ),
        (
            "host1:123:456 [0] misc/shmutils.cc:112 NCCL WARN Error while creating shared memory segment "
            "/dev/shm/nccl-KWfVyt (size 5967872)",
            "nccl.shm",
        ),
        (
            "include/shm.h:48 WARN Error while creating shared memory segment nccl-shm-recv-250a7cc850ba9298-0-1-3 "
            "(size 9637888)",
            "nccl.shm",
        ),
    ],
)
def test_wording_variants(line: str, sig: str) -> None:
    assert sig in sigs_of(line)


@pytest.mark.parametrize(
    "line",
    [
        "[2024-05-01 12:00:01,000] [WARNING] [stage3.py:1850:step] 1 pytorch allocator cache flushes",
        "gpu-node-17:1234:5678 [3] NCCL INFO Channel 00/0 : 3[3] -> 4[4] via P2P/IPC/read",
        "gpu-node-17:1234:5678 [3] NCCL INFO Using network IB",
        "[rank0]: Epoch 3 | step 1200 | loss 2.3451 | lr 1.00e-04",
        "WARNING:torch.distributed.run:",
        "Setting OMP_NUM_THREADS environment variable for each process to be 1 in default",
        "INFO: Detected 8 GPUs, using NCCL",
        # NCCL's interface list without container bridges (real-h100/nccl_info.log), and the routine lines of
        # a NET plugin that is simply not installed (NCCL before and since 2.19).
        "vm:1919:1919 [0] NCCL INFO NET/Socket : Using [0]eth0:192.0.2.2<0>",
        "4e9a7654171e:8639:8639 [0] NCCL INFO NET/Plugin : No plugin found (libnccl-net.so), using internal implementation",
        "node1:1:1 [0] NCCL INFO NET/Plugin : dlerror=libnccl-net.so: cannot open shared object file: No such file or "
        "directory No plugin found (libnccl-net.so), using internal implementation",
        "node1:1:1 [0] NCCL INFO NET/Plugin: Could not find: libnccl-net.so",
    ],
)
def test_benign_lines_are_not_recognised(line: str) -> None:
    # Context lines (NCCL's P2P channel setup) are kept for reasoning but never reported on their own.
    assert {s for s in sigs_of(line + "\n") if KB.by_id[s].role != "context"} == set()


def test_keywords_must_start_with_a_fast_byte() -> None:
    doc = copy.deepcopy(DATA)
    doc["signatures"][0]["keywords"] = ["address already in use"]
    with pytest.raises(KnowledgeBaseError, match="slow first byte"):
        parse_knowledge_base(doc)


def test_malformed_knowledge_base_is_rejected() -> None:
    doc = copy.deepcopy(DATA)
    doc["signatures"][1]["id"] = doc["signatures"][0]["id"]
    with pytest.raises(KnowledgeBaseError, match="duplicate"):
        parse_knowledge_base(doc)
    doc = copy.deepcopy(DATA)
    doc["signatures"][0]["patterns"] = ["(unclosed"]
    with pytest.raises(KnowledgeBaseError):
        parse_knowledge_base(doc)
    with pytest.raises(KnowledgeBaseError, match="schema"):
        parse_knowledge_base({"schema": "other", "signatures": []})


def test_docs_explain_md_is_current() -> None:
    assert DOC_PATH.read_text() == generate(), (
        "docs/explain.md is stale: run `python -m ddpdoctor.explain.docs`"
    )
    text = DOC_PATH.read_text()
    for s in KB.signatures:
        assert f"`{s.id}`" in text


def test_normalize_prefixes_and_ranks() -> None:
    info = normalize_line(
        "[rank3]:[E321 02:07:08.408271257 ProcessGroupNCCL.cpp:607] [Rank 1] Watchdog caught"
    )
    assert (info.rank, info.pg_rank) == (3, 1)
    assert info.ts == parse_timestamp("E0321 02:07:08.408271257")
    info = normalize_line("[default2]:[E ProcessGroupNCCL.cpp:475] [Rank 2] Watchdog caught")
    assert (info.rank, info.local_rank) == (None, 2)
    info = normalize_line("kolyoz2:25146:25854 [0] ib_plugin.c:1105 NCCL WARN NET/IB : Got completion")
    assert (info.host, info.pid) == ("kolyoz2", 25146)
    # Progress bars glue ranks together: the last prefix before the match owns it.
    text = "[default0]:Grouping texts:   8%| 726000/9672101 [default2]:[E ProcessGroupNCCL.cpp:475] Watchdog"
    assert normalize_line(text, text.index("Watchdog")).local_rank == 2


def test_timestamps_compare_across_formats() -> None:
    iso = parse_timestamp("2025-03-21 02:07:09,000 something")
    glog = parse_timestamp("[E321 02:07:08.408271257 ProcessGroupNCCL.cpp:607]")
    ctime = parse_timestamp("[Fri Mar 21 02:07:07 2025] Out of memory")
    assert ctime is not None and glog is not None and iso is not None
    assert ctime < glog < iso
    assert parse_timestamp("[  687.294232] oom-kill") is None


@pytest.mark.parametrize(
    "name, rank",
    [("rank3.log", 3), ("logs/train_rank_12.out", 12), ("node1-rank-2.txt", 2), ("worker.log", None)],
)
def test_rank_from_filename(name: str, rank: int | None) -> None:
    assert rank_from_filename(name) == rank


@settings(max_examples=150, deadline=None)
@given(st.text(max_size=400))
def test_normalize_never_raises(text: str) -> None:
    normalize_line(text)
    parse_timestamp(text)


@settings(max_examples=150, deadline=None)
@given(
    st.lists(st.sampled_from([item["line"] for item in LINES]) | st.text(max_size=200), max_size=8),
    st.binary(max_size=300),
)
def test_scanner_never_raises(lines: list[str], garbage: bytes) -> None:
    data = "\n".join(lines).encode("utf-8", "surrogatepass") + garbage
    result = scan_inputs(KB, [("x", io.BytesIO(data))])
    assert result.inputs[0].bytes == len(data)


def test_every_packaged_pattern_compiles() -> None:
    """The packaged knowledge base is loaded with its patterns compiled on first use (explain's start-up);
    compiling them all here is the check that load would otherwise make."""
    parse_knowledge_base(copy.deepcopy(DATA), compile_patterns=True)
    for sig in KB.signatures:
        assert all(p.pattern for p in sig.patterns), sig.id
