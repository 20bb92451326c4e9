"""`ddpdoctor hang` on real gloo ranks started without a launcher that never form a job: one rank of
three was never started, or was given another MASTER_PORT (it groups apart on this node). The ranks
that run wait in init_process_group, where the rank hosting the TCPStore wakes hundreds of times a
second: that is no progress. The verdict (`joining`, exit 1) names the missing rank and, for the
stray, the port it was given. Each rank runs in its own session and is SIGKILLed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from _hang_harness import NO_PYSPY, free_port, marker_line
from test_hang_evidence import run_hang

from ddpdoctor.hang.rendezvous import shared_value_split, store_split  # noqa: E402

SCRIPT = Path(__file__).with_name("_hang_join_job.py")
pytestmark = pytest.mark.skipif(bool(NO_PYSPY), reason=NO_PYSPY)



def _start(tmp: Path, ranks: dict[int, int], world: int, files: dict[int, Path] | None = None,
           offsets: dict[int, int] | None = None, **extra: str) -> list[subprocess.Popen]:
    procs = []
    for rank, port in ranks.items():
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=str(port), HANG_READY_DIR=str(tmp), GLOO_SOCKET_IFNAME="lo", **extra)
        if files:
            env["INIT_FILE"] = str(files[rank])
        if offsets:
            env["INIT_PORT_OFFSET"] = str(offsets[rank])
        procs.append(subprocess.Popen([sys.executable, str(SCRIPT)], env=env, start_new_session=True,
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    deadline = time.monotonic() + 120
    while not all((tmp / f"ready_{r}").exists() for r in ranks):
        assert time.monotonic() < deadline and all(p.poll() is None for p in procs), "ranks did not start"
        time.sleep(0.2)
    time.sleep(2)  # from the ready file into init_process_group
    return procs


def _kill(procs: list[subprocess.Popen]) -> None:
    for proc in procs:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait(timeout=30)


def _hang_on(procs: list[subprocess.Popen], *ranks: int) -> list[dict]:
    """`hang --pid` on each of these ranks (by index) of the running job, then the job killed."""
    try:
        return [run_hang("--pid", str(procs[rank].pid)) for rank in ranks or (0,)]
    finally:
        _kill(procs)


def test_a_rank_never_started(tmp_path):
    port = free_port()
    procs = _start(tmp_path, {0: port, 1: port}, world=3)
    (report,) = _hang_on(procs)
    verdict = report["verdict"]
    assert report["exit_code"] == 1 and verdict["kind"] == "joining", verdict
    assert verdict["culprit_ranks"] == [2] and verdict["other_ranks"] == [0, 1], verdict
    # The store host's wake-ups are no progress: the JSON's progress agrees with the verdict.
    assert report["progress"]["state"] == "hung", report["progress"]
    assert f"_hang_join_job.py:{marker_line('init', SCRIPT)}" in verdict["summary"]
    assert "rank 2 of the 3 is not running: never started or exited before joining" in verdict["summary"]
    assert verdict["culprits"][0]["where"] == "not running on this node"


def test_a_rank_given_another_port(tmp_path):
    port, other = free_port(), free_port()
    procs = _start(tmp_path, {0: port, 1: port, 2: other}, world=3)
    report, alone = _hang_on(procs, 0, 2)
    verdict = report["verdict"]
    assert report["exit_code"] == 1 and verdict["kind"] == "joining" and verdict["culprit_ranks"] == [2], verdict
    assert (f"rank 2 runs on this node (pid {procs[2].pid}) but with MASTER_ADDR:MASTER_PORT 127.0.0.1:{other}"
            in verdict["summary"])
    assert f"while this job uses 127.0.0.1:{port}" in verdict["summary"]
    # Seen from the stray: the two ranks it waits for run here with the other port.
    assert alone["verdict"]["kind"] == "joining" and alone["verdict"]["culprit_ranks"] == [0, 1], alone["verdict"]
    assert f"rank 0 runs on this node (pid {procs[0].pid})" in alone["verdict"]["summary"]


def test_a_torchrun_agent_waiting_for_the_other_node(tmp_path):
    """`torchrun --nnodes 2` started on one node only: the agent starts no rank and waits in the
    rendezvous; --pid of the agent is that job (not "not a distributed job")."""
    port = free_port()
    agent = subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "1", "--rdzv-backend",
         "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", "two-nodes", "--local-addr", "127.0.0.1",
         str(SCRIPT)],
        env=dict(os.environ, HANG_READY_DIR=str(tmp_path)), start_new_session=True, stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        time.sleep(6)  # past torch's import, into the rendezvous
        report = run_hang("--pid", str(agent.pid))
    finally:
        _kill([agent])
    verdict = report["verdict"]
    assert report["exit_code"] == 1 and verdict["kind"] == "joining", verdict
    assert f"the torchrun agent pid {agent.pid} has started no rank" in verdict["summary"]
    assert f"--nnodes 2, --rdzv-backend c10d, --rdzv-endpoint 127.0.0.1:{port}, --rdzv-id two-nodes" in verdict["summary"]
    assert "its stack: " in verdict["summary"] and "rendezvous" in verdict["summary"]
    assert not (tmp_path / "ready_0").exists()  # no rank was started


def test_ranks_in_different_file_stores_are_joining_not_a_group_created_alone(tmp_path):
    """Held-out hang set 8 (j03's class): rank 2 rendezvouses through another file store (a relative file://
    path after a chdir). The ranks wait inside init_process_group, which builds the default group through
    the same helper new_group uses: the verdict is `joining`, and no 'group created on some ranks' reason."""
    port = free_port()
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    shared, stray = tmp_path / "a" / "store", tmp_path / "b" / "store"
    procs = _start(tmp_path, {0: port, 1: port, 2: port}, 3, files={0: shared, 1: shared, 2: stray})
    (report,) = _hang_on(procs)
    verdict = report["verdict"]
    assert report["exit_code"] == 1 and verdict["kind"] == "joining", verdict
    assert (verdict.get("mechanism") or {}).get("id") != "group.created_alone", verdict
    # Each rank's init_method (py-spy --locals of its init_process_group frame) names its file: rank 2's differs.
    assert verdict["culprit_ranks"] == [2], verdict
    assert f"ranks 0-1 use {shared}; rank 2 uses {stray}" in verdict["summary"], verdict["summary"]
    assert verdict["fix"].startswith("Give every rank the same init_method"), verdict["fix"]


def test_ranks_naming_their_store_prefix_from_their_own_clock(tmp_path):
    """Held-out hang set 10 (j05's class): every rank builds a PrefixStore named after `datetime.now()`, so each
    waits under keys no other rank writes. The value is read from the frame calling init_process_group (py-spy
    --locals), chased back from the call to the line that assigns it; both ranks are named (all differ)."""
    port = free_port()
    procs = _start(tmp_path, {0: port, 1: port}, 2, RUN_TAG_FROM_CLOCK="1")
    (report,) = _hang_on(procs)
    verdict = report["verdict"]
    assert report["exit_code"] == 1 and verdict["kind"] == "joining", verdict
    assert verdict["culprit_ranks"] == [0, 1] and not verdict["tie"], verdict
    summary = verdict["summary"]
    assert f"from `tag` ({SCRIPT}:{marker_line('tag', SCRIPT)} `tag = datetime.now()" in summary, summary
    assert 'rank 0 has "' in summary and 'rank 1 has "' in summary, summary
    assert "each waits under keys no other rank writes" in summary, summary
    assert "never from each rank's clock" in verdict["fix"], verdict["fix"]


def test_ranks_agreeing_on_their_store_prefix_are_no_prefix_split():
    """The same chase finds nothing when the ranks' values agree, or differ only in per-rank names."""
    lines = SCRIPT.read_text().splitlines()
    at = marker_line("prefixed", SCRIPT)
    same = {0: {"tag": "'a'", "rank": "0"}, 1: {"tag": "'a'", "rank": "1"}}
    assert shared_value_split(lines, at, same) is None
    objects = {0: {"base": "<TCPStore object at 0x1>"}, 1: {"base": "<TCPStore object at 0x2>"}}
    assert shared_value_split(lines, at, objects) is None
    assert shared_value_split(lines, at, {0: {"tag": "'a'"}, 1: {"tag": "'b'"}})[:2] == (
        "tag", marker_line("tag", SCRIPT))


def test_a_rank_computing_its_own_store_port(tmp_path):
    """Held-out hang set 9 (j05's class): the init_method's port is MASTER_PORT plus an offset each rank computes
    itself (a stale restart counter on rank 1): rank 0 hosts the store at MASTER_PORT, rank 1 looks for one 100
    ports up. Every rank's init_method is read from its init_process_group frame: rank 1 is named, not a tie."""
    port = free_port()
    procs = _start(tmp_path, {0: port, 1: port}, 2, offsets={0: 0, 1: 100})
    (report,) = _hang_on(procs)
    verdict = report["verdict"]
    assert report["exit_code"] == 1 and verdict["kind"] == "joining" and verdict["culprit_ranks"] == [1], verdict
    assert (f"rank 0 uses tcp://127.0.0.1:{port}; rank 1 uses tcp://127.0.0.1:{port + 100}"
            in verdict["summary"]), verdict["summary"]


@pytest.mark.parametrize(
    ("stores", "expected"),
    [
        # absolute paths, rank 2's elsewhere (the real job above)
        ({1: ("file:///x/a/store", "/w"), 2: ("file:///x/a/store", "/w"), 3: ("file:///x/b/store", "/w")},
         ("ranks 0-1 use /x/a/store; rank 2 uses /x/b/store", [2])),
        # one relative path, two working directories
        ({1: ("file:store?rank=0&world_size=3", "/x/a"), 2: ("file:store", "/x/a"), 3: ("file:store", "/x/b")},
         ("ranks 0-1 use /x/a/store; rank 2 uses /x/b/store — a relative path", [2])),
        # two files, one rank each: no majority, both named
        ({1: ("file:///x/a", ""), 2: ("file:///x/b", "")}, ("rank 0 uses /x/a; rank 1 uses /x/b", [0, 1])),
        # a port computed per rank (a stale restart counter): the rank away from MASTER_ADDR:MASTER_PORT
        ({1: ("tcp://127.0.0.1:29500", "/w"), 2: ("tcp://127.0.0.1:29600?rank=1&world_size=2", "/w")},
         ("the ranks rendezvous at different addresses (init_method): rank 0 uses tcp://127.0.0.1:29500; rank 1 "
          "uses tcp://127.0.0.1:29600", [1])),
    ],
)
def test_store_split(stores, expected):
    problem, culprits = store_split(stores, {1: 0, 2: 1, 3: 2}, "127.0.0.1:29500")
    assert expected[0] in problem and culprits == expected[1], problem


def test_one_file_store_is_no_split():
    same = {1: ("file:///x/a/store", "/w"), 2: ("file:../a/store", "/x/w")}
    assert store_split(same, {1: 0, 2: 1}) is None

