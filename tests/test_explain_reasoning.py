"""Root cause vs consequence on multi-rank logs built from real quoted lines (tests/fixtures/explain/lines.json).

Where a scenario needs lines to agree (the same pid in torchrun's summary and in the kernel's OOM line,
rank numbers, SeqNum values) the numbers of the quoted lines are substituted; the wording is verbatim.
"""

from __future__ import annotations

import io
from pathlib import Path

from ddpdoctor.explain import explain, load_knowledge_base, scan_inputs
from ddpdoctor.model import ExitCode

KB = load_knowledge_base()

NOISE = [
    "[rank0]: Epoch 3 | step 1200 | loss 2.3451 | lr 1.00e-04 | grad_norm 0.93",
    "gpu-node-17:1234:5678 [3] NCCL INFO Channel 00/0 : 3[3] -> 4[4] via P2P/IPC/read",
    "[2024-05-01 12:00:01,000] [WARNING] [stage3.py:1850:step] 1 pytorch allocator cache flushes since last step.",
    "  0%|          | 12/10000 [00:03<01:23,  3.19it/s, loss=0.12]",
]


def run(files: dict[str, list[str]]):
    streams = [
        (name, io.BytesIO(("\n".join(NOISE + lines + NOISE) + "\n").encode()))
        for name, lines in files.items()
    ]
    return explain(KB, scan_inputs(KB, streams))


def ids(diags) -> list[str]:
    return [d.id for d in diags]


# torchrun agent output for a worker killed by SIGKILL: hpcaitech/ColossalAI#3514 and lzhxmu/CPPO#6.
def torchrun_sigkill(rank: int, pid: int) -> list[str]:
    return [
        "WARNING:torch.distributed.elastic.multiprocessing.api:Sending process 812914 closing signal SIGTERM",
        f"ERROR:torch.distributed.elastic.multiprocessing.api:failed (exitcode: -9) local_rank: {rank} (pid: {pid}) "
        "of binary: /data/chenhao/anaconda3/envs/ColossalAI-Chat/bin/python",
        "Traceback (most recent call last):",
        "    raise ChildFailedError(",
        "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: ",
        "============================================================",
        "src/open_r1/grpo_gsm.py FAILED",
        "------------------------------------------------------------",
        "Failures:",
        "  <NO_OTHER_FAILURES>",
        "------------------------------------------------------------",
        "Root Cause (first observed failure):",
        "[0]:",
        "  time      : 2025-05-21_15:43:03",
        "  host      : mlxlab115rp2n7682d40d9-20250521025625-6dyyd3-8nir8b-worker",
        f"  rank      : {rank} (local_rank: {rank})",
        f"  exitcode  : -9 (pid: {pid})",
        "  error_file: <N/A>",
        f"  traceback : Signal 9 (SIGKILL) received by PID {pid}",
        "============================================================",
    ]


WATCHDOG = (
    "[rank{r}]:[E321 02:07:08.408271257 ProcessGroupNCCL.cpp:607] [Rank {r}] Watchdog caught collective operation "
    "timeout: WorkNCCL(SeqNum={seq}, OpType={op}, NumelIn={n}, NumelOut={n}, Timeout(ms)=600000) ran for 600060 "
    "milliseconds before timing out."
)  # hiyouga/LlamaFactory#7396
WORK_STATUS = (
    "[rank{r}]:[E321 02:07:08.465150152 ProcessGroupNCCL.cpp:1664] [PG 1 Rank {r}] Exception (either an error or "
    "timeout) detected by watchdog at work: {seq}, last enqueued NCCL work: 1582, last completed NCCL work: 1579."
)


def test_oom_kill_with_child_failed_error_names_the_killed_rank() -> None:
    ex = run(
        {
            "torchrun.log": torchrun_sigkill(rank=3, pid=812917),
            "rank0.log": [WATCHDOG.format(r=0, seq=1580, op="ALLREDUCE", n=466119168)],
            # 0jc1/py-autovod#7, pid substituted
            "dmesg.txt": [
                "[Sun Mar 30 08:24:00 2025] Out of memory: Killed process 812917 (python) total-vm:26,184,840kB, "
                "anon-rss:153,700,88kB, file-rss:0kB, shmem-rss:0kB, UID:0 pgtables:38964kB oom_score_adj:0"
            ],
        }
    )
    assert ex.root is not None and ex.root.id == "oom.kernel"
    assert ex.root.ranks == [3]
    assert ex.root.hosts == ["mlxlab115rp2n7682d40d9-20250521025625-6dyyd3-8nir8b-worker"]
    assert {"launch.sigkill", "launch.child_failed", "launch.sigterm_siblings"} <= set(ids(ex.consequences))
    assert ex.exit_code == ExitCode.FAILED
    sigkill = next(d for d in ex.consequences if d.id == "launch.sigkill")
    assert sigkill.ranks == [3]


def test_sigkill_without_kernel_log_is_the_root_cause_on_that_rank() -> None:
    ex = run(
        {
            "torchrun.log": torchrun_sigkill(rank=5, pid=14750),
            "rank0.log": [WATCHDOG.format(r=0, seq=1580, op="ALLREDUCE", n=466119168)],
        }
    )
    assert ex.root is not None and ex.root.id == "launch.sigkill"
    assert ex.root.ranks == [5]
    assert "exit code -9" in ex.root.reasoning
    assert "launch.child_failed" in ids(ex.consequences)


def test_system_error_with_preceding_shm_warn_blames_shared_memory() -> None:
    system_error = (
        "[rank{r}]: torch.distributed.DistBackendError: NCCL error in: ..., unhandled system error "
        "(run with NCCL_DEBUG=INFO for details), NCCL version 2.25.1"
    )
    ex = run(
        {
            "rank0.log": [system_error.format(r=0)],
            "rank1.log": [
                # NVIDIA/nccl-tests#166 (NCCL prints no [rankN]: prefix: the file name gives the rank)
                "misc/shmutils.cc:71 NCCL WARN Error: failed to extend /dev/shm/nccl-fjwOOB to 5967876 bytes",
                "misc/shmutils.cc:112 NCCL WARN Error while creating shared memory segment /dev/shm/nccl-KWfVyt "
                "(size 5967872)",
                system_error.format(r=1),
                "[rank1]: ncclSystemError: System call (e.g. socket, malloc) or external library call failed or "
                "device error.",
            ],
        }
    )
    assert ex.root is not None and ex.root.id == "nccl.shm"
    assert ex.root.ranks == [1]
    assert ex.root.first is not None and (ex.root.first.file, ex.root.first.line) == (
        "rank1.log",
        len(NOISE) + 1,
    )
    system = next(d for d in ex.consequences if d.id == "nccl.system_error")
    assert system.ranks == [0, 1]


def test_earliest_generic_nccl_warn_explains_unhandled_system_error() -> None:
    ex = run(
        {
            "rank2.log": [
                "user:16901:16967 [2] misc/socket.cc:441 NCCL WARN socketFinalizeAccept: wrong type 4 != 3",  # nccl-tests#188
                "RuntimeError: NCCL error in: /pytorch/torch/lib/c10d/ProcessGroupNCCL.cpp:410, unhandled system error, "
                "NCCL version 2.4.8",
            ]
        }
    )
    assert ex.root is not None and ex.root.id == "nccl.warn"
    assert ex.root.ranks == [2]
    assert ids(ex.consequences) == ["nccl.system_error"]


def test_watchdog_timeouts_with_different_seqnum_mean_desync() -> None:
    files = {f"rank{r}.log": [WATCHDOG.format(r=r, seq=1580, op="ALLREDUCE", n=466119168)] for r in range(3)}
    files["rank3.log"] = [WATCHDOG.format(r=3, seq=1579, op="ALLREDUCE", n=466119168)]
    for r in range(4):
        files[f"rank{r}.log"].append(WORK_STATUS.format(r=r, seq=1580 if r < 3 else 1579))
    ex = run(files)
    assert ex.root is not None and ex.root.id == "watchdog.desync"
    assert ex.root.ranks == [3]
    assert ex.root.data["seq_by_rank"] == {"0": 1580, "1": 1580, "2": 1580, "3": 1579}
    assert "rank(s) 3 diverged" in ex.root.reasoning
    assert ex.root.evidence[0].rank == 3
    assert "watchdog.timeout" in ids(ex.consequences)


def test_watchdog_timeouts_with_same_seqnum_but_other_op_mean_op_mismatch() -> None:
    lines = [WATCHDOG.format(r=r, seq=4, op="BROADCAST", n=112) for r in range(3)]  # huggingface/open-r1#620
    lines.append(WATCHDOG.format(r=3, seq=4, op="ALLREDUCE", n=1))
    ex = run({"job.log": lines})
    assert ex.root is not None and ex.root.id == "watchdog.op_mismatch"
    assert ex.root.ranks == [3]


def test_watchdog_timeouts_with_equal_seqnum_mean_hang_and_name_silent_ranks() -> None:
    files = {
        f"rank{r}.log": [WATCHDOG.format(r=r, seq=7753, op="_REDUCE_SCATTER_BASE", n=544997376)]
        for r in range(3)
    }
    files["rank3.log"] = []  # this rank never reported: dead or hung
    ex = run(files)
    assert ex.root is not None and ex.root.id == "watchdog.hang"
    assert ex.root.ranks == [3]
    assert "never reported" in ex.root.reasoning


def test_port_clash_on_rank0_explains_store_timeouts_elsewhere() -> None:
    ex = run(
        {
            "rank0.log": [
                "[W socket.cpp:401] [c10d] The server socket has failed to bind to 0.0.0.0:47531 "
                "(errno: 98 - Address already in use).",
                "[E socket.cpp:435] [c10d] The server socket has failed to listen on any local network address.",
                "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: ",
            ],
            "rank1.log": [
                "[E socket.cpp:860] [c10d] The client socket has timed out after 60s while trying to connect to "
                "192.0.0.1:1234"
            ],
        }
    )
    assert ex.root is not None and ex.root.id == "store.port_in_use"
    assert ex.root.ranks == [0]
    timeout = next(d for d in ex.consequences if d.id == "store.connect_timeout")
    assert timeout.ranks == [1]


def test_port_clash_libuv_lowercase_wording() -> None:
    ex = run(
        {
            "launcher.log": [
                "torch.distributed.DistNetworkError: The server socket has failed to listen on any local network "
                "address. useIpv6: 0, code: -98, name: EADDRINUSE, message: address already in use"  # pytorch#130797
            ]
        }
    )
    assert ex.root is not None and ex.root.id == "store.port_in_use"


def test_fork_after_cuda_init_is_the_root_cause_of_spawn_failure() -> None:
    ex = run(
        {
            "train.log": [
                "Traceback (most recent call last):",
                "torch.multiprocessing.spawn.ProcessRaisedException: ",
                "",
                "-- Process 1 terminated with the following error:",  # marcoamonteiro/pi-GAN#7
                "Traceback (most recent call last):",
                "RuntimeError: Cannot re-initialize CUDA in forked subprocess. To use CUDA with multiprocessing, "
                "you must use the 'spawn' start method",  # facebookresearch/pycls#183
            ]
        }
    )
    assert ex.root is not None and ex.root.id == "mp.fork_cuda"
    raised = next(d for d in ex.consequences if d.id == "launch.spawn_raised")
    assert raised.local_ranks == [1]


def test_earliest_timestamp_wins_between_root_causes() -> None:
    ex = run(
        {
            "rank0.log": [
                "2024-05-01 10:00:05,000 RuntimeError: CUDA out of memory. Tried to allocate 2.87 GiB (GPU 0; "
                "14.76 GiB total capacity; 8.77 GiB already allocated; 19.75 MiB free; 13.71 GiB reserved in "
                "total by PyTorch)"
            ],
            "rank1.log": [
                "2024-05-01 10:00:01,000 RuntimeError: Expected to have finished reduction in the prior iteration "
                "before starting a new one. This error indicates that your module has parameters that were not "
                "used in producing loss."
            ],
        }
    )
    assert ex.root is not None and ex.root.id == "ddp.unused_parameters"
    assert ex.root.ranks == [1]
    assert ids(ex.consequences) == ["device.cuda_oom"]


def test_hardware_event_beats_application_errors() -> None:
    ex = run(
        {
            "rank0.log": ["RuntimeError: CUDA error: uncorrectable ECC error encountered"],
            "dmesg.txt": ["NVRM: Xid (PCI:0000:44:00): 79, GPU has fallen off the bus"],
        }
    )
    assert ex.root is not None and ex.root.id in {"gpu.fallen_off_bus", "gpu.ecc"}
    assert ex.root.id == "gpu.ecc" or ex.root.first.file == "dmesg.txt"


def test_pid_from_nccl_prefix_maps_to_rank_via_comm_init() -> None:
    ex = run(
        {
            "node0.log": [
                # zai-org/CogVLM#328 and NVIDIA/nccl#1191; the WARN line's host:pid substituted to the same process
                "603760c1c291:16956:18844 [7] NCCL INFO comm 0x55dbf256d2a0 rank 7 nranks 10 cudaDev 7 busId d2000 "
                "commId 0x714dd0f00c283118 - Init COMPLETE",
                "603760c1c291:16956:18900 [7] misc/ibvwrap.cc:190 NCCL WARN Call to ibv_create_cq failed with error "
                "Cannot allocate memory",
            ]
        }
    )
    assert ex.root is not None and ex.root.id == "nccl.memlock"
    assert ex.root.ranks == [7]
    assert ex.root.hosts == ["603760c1c291"]
    assert all(d.id != "context.nccl_comm_init" for d in ex.consequences + ex.notes)


def test_local_rank_from_torchrun_default_prefix() -> None:
    ex = run({"job.log": ["[default2]:RuntimeError: CUDA error: invalid device ordinal"]})
    assert ex.root is not None and ex.root.id == "device.invalid_ordinal"
    assert ex.root.local_ranks == [2] and ex.root.ranks == []


def test_nothing_recognised_is_exit_0() -> None:
    ex = run({"rank0.log": []})
    assert ex.root is None and ex.consequences == []
    assert ex.exit_code == ExitCode.HEALTHY


def test_informational_notes_alone_are_not_a_failure() -> None:
    ex = run({"rank0.log": ["gpu-node-17:1234:5678 [0] NCCL INFO NET/IB : No device found."]})
    assert ex.root is None
    assert ids(ex.notes) == ["nccl.ib_no_device"]
    assert ex.exit_code == ExitCode.HEALTHY
    assert ex.to_dict(show_all=True)["notes"][0]["id"] == "nccl.ib_no_device"
    assert ex.to_dict(show_all=False)["notes"] == []


def test_a_rank_exception_beats_the_peers_connection_closed() -> None:
    """Real torchrun run: rank 1 raises a RuntimeError; rank 0 then reports gloo 'Connection closed by peer'
    and torchrun names rank 1 as its first observed failure. The exception on rank 1 is the root cause."""
    path = Path(__file__).parent / "fixtures" / "explain" / "torchrun-2rank-gloo-rank1-runtimeerror.log"
    kb = load_knowledge_base()
    with open(path, "rb") as f:
        result = explain(kb, scan_inputs(kb, [(path.name, f)]))
    assert result.root is not None and result.root.id == "python.exception" and result.root.ranks == [1]
    assert "inconsistent tensor size" in result.root.first.text
    assert "gloo.connection_closed" in [d.id for d in result.consequences]
