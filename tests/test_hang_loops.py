"""`ddpdoctor hang` on real 2-rank gloo jobs under a real torchrun agent whose ranks wait in different
collectives because one left a loop the other is still in (tests/_hang_loops_job.py): from the stacks
alone (no Flight Recorder), reading the loop around both call chains, the verdict names the rank that
left through `break` (not a symmetric tie), or the rank that runs one more DDP iteration (uneven
batches). Each job runs in its own session and is SIGKILLed as a group.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from _hang_harness import HungJob, marker_line, started
from test_hang_evidence import hang_on

SCRIPT = Path(__file__).with_name("_hang_loops_job.py")

# scenario -> (culprit rank, mechanism id, the culprit's HANG-LINE marker, words the mechanism must hold)
EXPECTED = {
    # Every rank blocked in an HTTP request outside torch.distributed: the rank whose server thread waits on its
    # own server inside the handler is the culprit (no tie).
    "shared_service": (0, "server.handler_waits_on_itself", "service-fetch", [
        "`assign-svc` serves requests on a single-threaded server", "do_GET()",
        f"_hang_loops_job.py:{marker_line('nested-fetch', SCRIPT)} in "]),
    "early_break": (1, "loop.left_early", "barrier", [
        f"rank 1 left the loop at line {marker_line('break', SCRIPT)} (break) and waits in barrier at line "
        f"{marker_line('barrier', SCRIPT)}; the others (rank 0) wait in all_reduce at line "
        f"{marker_line('all-reduce', SCRIPT)}"]),
    # A time-boxed `while` whose deadline each rank reads from its own clock: the rank that left first is the
    # culprit, not the one still inside (held-out hang set 9, j04's class).
    "wall_deadline": (0, "loop.local_deadline", "barrier", [
        "rank 0 left the loop `while time.monotonic() < deadline:`", "when its own clock passed the loop's deadline",
        "(`while time.monotonic() < deadline:` at line"]),
    # A loop over rank-local keys, not over batches (held-out hang set 10, j03's class).
    "label_keys": (1, "loop.uneven_iterations", "label-reduce", [
        "rank 1 runs one more iteration than the others (the loop runs over `sorted(stats)`",
        "`stats` comes from this rank's own values (line"]),
    "uneven_ddp": (0, "loop.uneven_iterations", "ddp-forward", [
        "rank 0 runs one more iteration than the others (uneven number of batches per rank)",
        "DistributedDataParallel forward", f"in all_gather at line {marker_line('gather', SCRIPT)}"]),
    # The forward side is the odd one: it runs the wrapped model where the other does not; no iteration
    # count differs, so nothing may claim one.
    "eval_ddp": (0, "ddp.forward_backward_mismatch", "eval-forward", [
        "forward/backward mismatch", f"backward's gradient all-reduce at line {marker_line('eval-backward', SCRIPT)}"]),
    "except_barrier": (1, "mismatch.exception_handler", "except-barrier", [
        "called from the exception handler `except BadBatch:`"]),
    "rank_only": (0, "mismatch.rank_only_call", "rank-only", ["`if rank != 0:`", "waits in barrier"]),
    # A collective inside an lru_cache'd function: the rank whose arguments repeat skips it (held-out hang set 11,
    # j02's class); the rank that went on is the culprit, not a tie.
    "cached_collective": (0, "mismatch.cached_collective", "cached-bcast", [
        "`@functools.cache`", "so rank 0, whose call hit the cache, skipped it"]),
    # The rank's collective runs in a background thread: it counts, and names the thread's line.
    "thread_collective": (0, "thread.collective_in_thread", "thread-join", [
        "its thread `ckpt` waits in all_gather", f":{marker_line('thread-gather', SCRIPT)}"]),
    # Rank 0 creates a process group alone (lazily, under an if on the rank): new_group is a collective.
    "group_alone": (0, "group.created_alone", "group-alone", ["inside torch.distributed's new_group()",
                                                              "every process must call new_group()"]),
    # Both ranks wait in recv; rank 1's loop has a `continue` between its recv and its send.
    "p2p_skip": (1, "sendrecv.skipped_send", "p2p-act", ["`continue` at line", "never sent"]),
}


@pytest.fixture(scope="module", params=sorted(EXPECTED))
def hung(request, tmp_path_factory):
    with started(HungJob(request.param, tmp_path_factory.mktemp(request.param), nproc=2, script=SCRIPT)) as job:
        yield request.param, job


def test_the_rank_that_left_or_stayed(hung):
    scenario, job = hung
    report = hang_on(job)
    verdict = report["verdict"]
    assert "one more iteration" not in verdict["summary"] or scenario in ("uneven_ddp", "label_keys"), verdict["summary"]
    culprit, mechanism, tag, words = EXPECTED[scenario]
    assert report["exit_code"] == 1 and verdict["culprit_ranks"] == [culprit] and not verdict["tie"], verdict
    assert verdict["culprits"][0]["line"] == marker_line(tag, SCRIPT), verdict["culprits"][0]
    assert verdict["mechanism"]["id"] == mechanism, verdict
    assert f"why it waits: {verdict['mechanism']['summary']}" in verdict["summary"]
    for word in words:
        assert word in verdict["mechanism"]["summary"], (word, verdict["mechanism"]["summary"])


# Every rank in the same call, or each blocked outside torch.distributed: the call's arguments (py-spy --locals
# of the torch.distributed frame) or the channel the ranks block in say why; no side is the odd one (a tie).
SYMMETRIC = {
    "root_mismatch": ("collective.root_mismatch", "root-broadcast", ["rank 0 with src=0; rank 1 with src=1"]),
    "tag_mismatch": ("sendrecv.tag_mismatch", "tag-send", ["rank 1 sends to rank 0 with tag=1",
                                                           "rank 0 receives from rank 1 with tag=2"]),
    "mutual_send": ("socket.mutual_send", "mutual-send", ["send/send deadlock"]),
    # Every rank polling a store counter every 50 ms on the same line: its main thread wakes, nothing moves;
    # after the long look it is a hang, and the poll's condition is read (held-out hang set 7, j03's class).
    "store_poll": ("loop.poll_retry", "store-poll", ["it loops while `int(store.add('merge-phase', 0)) != world`"]),
    # Every rank in recv on the same line, all of the job here: a circular wait, not the network (exit 1).
    "ring_recv": ("sendrecv.circular_recv", "ring-recv", ["each rank receives before it sends"]),
    # Every rank in send to a rank that is itself sending (an exchange written send-then-recv everywhere): the
    # peers' arguments say both ends took the same side (held-out hang set 7, j08's class, written again here).
    "halo_exchange": ("sendrecv.same_side", "halo-send", ["ranks 0 and 1 send to each other and neither receives"]),
}


@pytest.fixture(scope="module", params=sorted(SYMMETRIC))
def symmetric(request, tmp_path_factory):
    with started(HungJob(request.param, tmp_path_factory.mktemp(request.param), nproc=2, script=SCRIPT)) as job:
        yield request.param, job


def test_symmetric_hangs_name_the_arguments_or_the_channel(symmetric):
    scenario, job = symmetric
    report = hang_on(job)
    verdict = report["verdict"]
    mechanism, tag, words = SYMMETRIC[scenario]
    assert report["exit_code"] == 1 and verdict["culprit_ranks"] == [0, 1] and verdict["tie"], verdict
    assert verdict["mechanism"]["id"] == mechanism, verdict
    line = marker_line(tag, SCRIPT)
    # A poll loop is caught at its sleep or, on a loaded machine, at its condition on the line above.
    lines = {line, line - 1} if scenario == "store_poll" else {line}
    assert lines & {c["line"] for c in verdict["culprits"]}, verdict["culprits"]
    for word in words:
        assert word in verdict["mechanism"]["summary"], (word, verdict["mechanism"]["summary"])


def test_a_loop_over_parameters_is_no_uneven_iteration(tmp_path):
    """Held-out hang set 6 (j06): rank 1 averages gradients in `for p in model.parameters():` of the next epoch
    while rank 0 waits in recv for one more validation batch. The parameter loop runs as often on every rank:
    no rank "runs one more iteration" of it; rank 0 waits for a message rank 1 will not send."""
    with started(HungJob("param_loop", tmp_path, nproc=2, script=SCRIPT)) as job:
        report = hang_on(job)
    verdict = report["verdict"]
    assert report["exit_code"] == 1 and verdict["culprit_ranks"] == [0], verdict
    assert verdict["mechanism"]["id"] == "sendrecv.count_mismatch", verdict
    assert "disagree on how many messages" in verdict["summary"]
    assert "one more iteration" not in verdict["summary"]
    assert marker_line("val-recv", SCRIPT) in {c["line"] for c in verdict["culprits"]}, verdict["culprits"]


def test_a_member_that_skipped_its_groups_collective_is_the_culprit(tmp_path):
    """Held-out hang set 6 (j04's class): rank 2 belongs to the expert group (`new_group(experts)`, experts read
    from the frame's locals) but skips the group's all_reduce (no tokens); rank 1 waits in it, ranks 0 and 2 in the
    global all_reduce. Rank 2 is the culprit, not rank 1 (the minority) and not a tie."""
    with started(HungJob("subgroup_skip", tmp_path, nproc=3, script=SCRIPT)) as job:
        report = hang_on(job)
    verdict = report["verdict"]
    assert report["exit_code"] == 1 and verdict["culprit_ranks"] == [2] and not verdict["tie"], verdict
    assert verdict["mechanism"]["id"] == "mismatch.subgroup_skipped", verdict
    summary = verdict["mechanism"]["summary"]
    assert "on group `expert_group` (ranks 1, 2)" in summary, summary
    assert "inside `if rank in experts and tokens > 0:`" in summary, summary
    assert verdict["culprits"][0]["line"] == marker_line("global-reduce", SCRIPT), verdict["culprits"]


def test_a_send_to_a_rank_numbered_within_its_group(tmp_path):
    """Held-out hang set 8 (j01's class): rank 3 sends to `dst=0`, the first pipeline stage's index in its group,
    which torch reads as global rank 0 — in the data-parallel all_reduce — while rank 2 waits for the message.
    The call's arguments (py-spy --locals of the send frame) name rank 3 and the numbering slip."""
    with started(HungJob("stage_local_dst", tmp_path, nproc=4, script=SCRIPT)) as job:
        report = hang_on(job)
    verdict = report["verdict"]
    assert report["exit_code"] == 1 and verdict["culprit_ranks"] == [2, 3], verdict
    sender = next(c for c in verdict["culprits"] if c["rank"] == 3)
    assert sender["line"] == marker_line("stage-send", SCRIPT), sender
    mechanism = verdict["mechanism"]
    assert mechanism["id"] == "sendrecv.wrong_peer", verdict
    for word in ("rank 3 sends to rank 0, but rank 0 waits in all_reduce, not in a recv",
                 "while rank 2 waits to receive from rank 3", "send/recv's dst/src are global ranks"):
        assert word in mechanism["summary"], (word, mechanism["summary"])


def test_a_recv_whose_sender_is_in_a_barrier_first(tmp_path):
    """Held-out hang set 9 (j06's class): rank 0 receives from rank 1 and then fences; rank 1 fences first and sends
    after. Neither side is the odd one (a tie), but the recv's src (py-spy --locals) names a rank that is in a
    barrier: an ordering deadlock."""
    with started(HungJob("fence_before_send", tmp_path, nproc=2, script=SCRIPT)) as job:
        report = hang_on(job)
    verdict = report["verdict"]
    assert report["exit_code"] == 1 and verdict["culprit_ranks"] == [0, 1] and verdict["tie"], verdict
    mechanism = verdict["mechanism"]
    assert mechanism["id"] == "sendrecv.wrong_peer", verdict
    assert ("rank 0 waits to receive from rank 1, but rank 1 waits in barrier, not in a send: rank 1 reaches its "
            "send only after that barrier (if ever), which rank 0 joins only after this recv") in mechanism["summary"]

