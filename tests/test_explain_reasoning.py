"""Root cause vs consequence on multi-rank logs built from real quoted lines (tests/fixtures/explain/lines.json).

Where a scenario needs lines to agree (the same pid in torchrun's summary and in the kernel's OOM line,
rank numbers, SeqNum values) the numbers of the quoted lines are substituted; the wording is verbatim.
"""

from __future__ import annotations

import io
from pathlib import Path

from ddpdoctor.core.model import ExitCode
from ddpdoctor.explain import explain, load_knowledge_base, scan_inputs

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
    # The WARN's format is in NCCL's misc/socket.cc: the catalogue names its mechanism class.
    assert ex.root is not None and ex.root.id == "nccl.warn.socket"
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


def test_watchdog_timeouts_with_a_silent_rank_name_the_straggler_not_a_hang() -> None:
    files = {
        f"rank{r}.log": [WATCHDOG.format(r=r, seq=7753, op="_REDUCE_SCATTER_BASE", n=544997376)]
        for r in range(3)
    }
    files["rank3.log"] = []  # this rank never reported: it was not in the collective
    ex = run(files)
    assert ex.root is not None and ex.root.id == "watchdog.straggler"
    assert ex.root.ranks == [3]
    assert "never reported" in ex.root.reasoning and "not in step" in ex.root.reasoning


def test_watchdog_hang_only_when_every_rank_reports_the_same_collective() -> None:
    files = {
        f"rank{r}.log": [WATCHDOG.format(r=r, seq=7753, op="_REDUCE_SCATTER_BASE", n=544997376)]
        for r in range(4)
    }
    ex = run(files)
    assert ex.root is not None and ex.root.id == "watchdog.hang"
    assert "no rank of the job is missing" in ex.root.reasoning


def test_one_rank_timeout_is_not_called_a_network_hang() -> None:
    # issue #17 class 2(a): hiyouga/LlamaFactory#8261 pasted rank 5's log only.
    ex = run({"train.log": [WATCHDOG.format(r=5, seq=1580, op="ALLREDUCE", n=466119168)]})
    assert ex.root is None
    assert "watchdog.unconfirmed" in ids(ex.consequences)
    assert ex.exit_code == ExitCode.FAILED
    assert any("every rank's log" in s for s in ex.next_logs)


def test_world_size_from_nccl_init_shows_missing_ranks_logs() -> None:
    # Two ranks' timeouts agree, but NCCL's init line says the job had 64 ranks: unconfirmed, not a hang.
    init = (
        "hostname-test:984:1257 [4] NCCL INFO comm 0x557fe785f7a0 rank 36 nranks 64 cudaDev 4 nvmlDev 4 "
        "busId 9b000 commId 0x5ae77eb5ea4ec1ee - Init COMPLETE"
    )  # NVIDIA/nccl#1814
    lines = [init] + [WATCHDOG.format(r=r, seq=880, op="BROADCAST", n=131137536) for r in (34, 36)]
    ex = run({"node.log": lines})
    assert ex.root is None
    unconfirmed = next(d for d in ex.consequences if d.id == "watchdog.unconfirmed")
    assert "of 64" in unconfirmed.reasoning


# NVIDIA/nccl#2213, verbatim: rank 1 crashed, rank 0's watchdog fired, PyTorch's desync report names rank 1.
NCCL_2213 = [
    "*** SIGSEGV received at time=1775734074 on cpu 19 ***",
    "PC: @     0xe1e2567f5014  (unknown)  ncclLocalOpAppend()",
    "[Rank 0] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=1155874, OpType=ALLREDUCE, "
    "NumelIn=9445376, NumelOut=9445376, Timeout(ms)=1800000) ran for 1800002 milliseconds before timing out.",
    "[1] finished collective #1155873, but didn't join collective #1155874",
]


def test_desync_report_names_the_lagging_rank() -> None:
    ex = run({"job.log": NCCL_2213[2:]})
    assert ex.root is not None and ex.root.id == "watchdog.straggler"
    assert ex.root.ranks == [1]
    assert "never joined #1155874" in ex.root.reasoning and "not a network hang" in ex.root.reasoning


def test_crash_beats_the_desync_report_it_caused() -> None:
    ex = run({"job.log": NCCL_2213})
    assert ex.root is not None and ex.root.id == "launch.sigsegv"
    straggler = next(d for d in ex.consequences if d.id == "watchdog.straggler")
    assert straggler.ranks == [1]


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


# ---------------------------------------------------------------- issue #17 classes 3-5, real logs
REAL = Path(__file__).parent / "fixtures" / "explain" / "real-h100"


def explain_files(*paths: Path):
    return explain(KB, scan_inputs(KB, [(p.name, io.BytesIO(p.read_bytes())) for p in paths]))


def test_launcher_consequences_alone_are_never_the_root_cause() -> None:
    # Real H100 log: torchrun's SIGTERM to rank 0 and its summary; rank 1's own output was empty.
    ex = explain_files(REAL / "torchrun-2ranks-1gpu-bench-nccl.log")
    assert ex.root is None
    assert {"launch.sigterm_siblings", "launch.child_failed"} <= set(ids(ex.consequences))
    assert ex.exit_code == ExitCode.FAILED
    assert ex.next_logs and "rank 1's own output" in ex.next_logs[0]
    report = ex.to_dict()
    assert report["root_cause"] is None
    assert report["no_cause_found"]["summary"] == "no cause found in these logs"


def test_torchrun_stopped_from_outside_is_the_root_cause_not_its_sigterm_to_workers() -> None:
    # Real torchrun log (QA pass): the agent got SIGTERM (scancel, a time limit, a kill) and SIGTERMed its
    # workers; it used to read "no cause found", with the SIGTERM explained as "after one failed".
    path = Path(__file__).parent / "fixtures" / "explain" / "torchrun-2rank-gloo-agent-sigterm.log"
    ex = explain_files(path)
    assert ex.root is not None and ex.root.id == "launch.agent_signal"
    assert "Received 15 death signal" in ex.root.first.text
    assert "launch.sigterm_siblings" in ids(ex.consequences)
    assert ex.exit_code == ExitCode.FAILED


def test_a_worker_error_before_torchrun_is_stopped_stays_the_root_cause() -> None:
    # The agent's own signal is generic (precedence 2): a worker's earlier error still explains the run.
    lines = (REAL / "no_gpu_nccl.log").read_bytes() + (
        Path(__file__).parent / "fixtures" / "explain" / "torchrun-2rank-gloo-agent-sigterm.log"
    ).read_bytes()
    ex = explain(KB, scan_inputs(KB, [("job.log", io.BytesIO(lines))]))
    assert ex.root is not None and ex.root.id == "device.no_gpu_for_nccl"


def test_rank_comes_from_torchrun_root_cause_entry() -> None:
    # Real H100 log: the ValueError has no rank prefix; torchrun's summary says rank 0 failed first.
    ex = explain_files(REAL / "no_gpu_nccl.log")
    assert ex.root is not None and ex.root.id == "device.no_gpu_for_nccl"
    assert ex.root.ranks == [0]
    assert "Root Cause" in ex.root.data["rank_from"]


def test_sigbus_is_the_root_cause_not_child_failed_error() -> None:
    # msr-fiddle/pipedream#76, verbatim (backtrace shortened to its first and last frames).
    ex = run(
        {
            "train.log": [
                "[8d6bf97c3bf4:3039 :0:3095] Caught signal 7 (Bus error: nonexistent physical address)",
                "==== backtrace (tid:   3095) ====",
                " 0 0x0000000000043090 killpg()  ???:0",
                " 9 0x000000000011f133 clone()  ???:0",
                "torch.distributed.elastic.multiprocessing.errors.ChildFailedError:",
            ]
        }
    )
    assert ex.root is not None and ex.root.id == "launch.sigbus"
    assert "/dev/shm" in ex.root.cause and "--shm-size" in ex.root.fix
    assert "launch.child_failed" in ids(ex.consequences)


def test_deepspeed_exit_code_minus_7_is_sigbus() -> None:
    # hiyouga/LlamaFactory#2061: DeepSpeed's launcher line (its argv list elided here; the issue title gives
    # the ending "exits with return code = -7"); deepspeedai/DeepSpeed#4002 fixed the same with --shm-size.
    line = (
        "[2024-01-03 14:05:36,716] [ERROR] [launch.py:321:sigkill_handler] ['/home/bingxing2/home/scx9042/"
        ".conda/envs/myLLM/bin/python', '-u', 'src/train_bash.py', '--local_rank=3'] exits with return code = -7"
    )
    ex = run(
        {
            "ds.log": [
                "[2024-01-03 14:05:36,090] [INFO] [launch.py:315:sigkill_handler] Killing subprocess 2726715",
                line,
            ]
        }
    )
    assert ex.root is not None and ex.root.id == "launch.sigbus"


def test_shm_permission_denied_is_not_shm_too_small() -> None:
    # NVIDIA/nccl#328 (fixed by `chmod 777 /dev/shm`), verbatim.
    ex = run(
        {
            "node08.log": [
                "node08:27106:27302 [0] include/shm.h:27 NCCL WARN Call to shm_open failed : Permission denied",
                "node08:27106:27302 [0] NCCL INFO include/shm.h:41 -> 2",
                "node08:27106:27302 [0] include/shm.h:48 NCCL WARN Error while creating shared memory segment "
                "nccl-shm-recv-b7948f403864987a-0-3-0 (size 4460544)",
            ]
        }
    )
    assert ex.root is not None and ex.root.id == "shm.permission"


def test_no_cuda_gpus_under_a_launcher_is_not_a_generic_exception() -> None:
    ex = run(
        {"rank1.log": ["[rank1]: RuntimeError: No CUDA GPUs are available"]}
    )  # jiaw-z/CoR-GS#23 + prefix
    assert ex.root is not None and ex.root.id == "device.no_cuda_gpus"
    assert ex.root.ranks == [1]


def test_oom_message_variants() -> None:
    for line in (
        "RuntimeError: CUDA error: out of memory",  # kuangliu/pytorch-cifar#67
        "  what():  CUDA error: out of memory",  # c10::Error form (shared/reference/signatures.md)
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.",  # torch >= 2.1 class name
    ):
        ex = run({"rank0.log": [line]})
        assert ex.root is not None and ex.root.id == "device.cuda_oom", line


def test_nccl_internal_error_alone_is_matched_and_sends_to_nccl_debug() -> None:
    # NVIDIA/nccl-tests#166 (issue title): the prefilter used to miss this wording entirely.
    ex = run(
        {
            "test.log": [
                "Test NCCL failure common.cu:958 'internal error - please report this issue to the NCCL developers / '"
            ]
        }
    )
    assert ex.root is None
    assert "nccl.internal_error" in ids(ex.consequences)
    assert any("NCCL_DEBUG=INFO" in s for s in ex.next_logs)


def test_ib_error_12_without_peer_is_the_roce_gid_class() -> None:
    # NVIDIA/nccl#426: the pre-2.10 wording; fixed with NCCL_IB_GID_INDEX=3.
    ex = run(
        {
            "w1.log": [
                "-worker-1:946:988 [0] transport/net_ib.cc:839 NCCL WARN NET/IB : Got completion with error 12, opcode 1, len 0, vendor err 129"
            ]
        }
    )
    assert ex.root is not None and ex.root.id == "nccl.ib_retry_exceeded"
    assert "NCCL_IB_GID_INDEX" in ex.root.fix


def test_topology_xml_warn_has_a_cause() -> None:
    ex = run(
        {
            "n.log": [
                "207a4cb58d57:59200:59216 [0] graph/xml.h:82 NCCL WARN Attribute ngpus of node algo not found"
            ]
        }
    )
    assert ex.root is not None and ex.root.id == "nccl.topology"  # microsoft/msccl-tools#4


def test_net_plugin_none_is_named_and_healthy_plugin_chatter_is_not() -> None:
    ex = run(
        {"n.log": ["gpu-node-17:1234:5678 [0] init.cc:232 NCCL WARN Failed to initialize any NET plugin"]}
    )
    assert ex.root is not None and ex.root.id == "nccl.net_plugin_none"  # WARN string from NCCL's source
    healthy = explain_files(REAL / "nccl_info.log")  # real: "NET/Plugin: Could not find: libnccl-net.so"
    assert healthy.root is None and healthy.exit_code == ExitCode.HEALTHY


def test_progress_bar_near_the_timeout_on_the_timeout_line_is_a_busy_rank_not_a_hang() -> None:
    # issue #17 class 2(b): the shape of hiyouga/LlamaFactory#8261's line (a tqdm bar glued in front of the
    # watchdog line; the bar's numbers substituted so that it ran 29:55 of a 30-minute timeout).
    bar = "Running tokenizer on dataset:  99%|█████████▉| 990000/1000000 [29:55<00:18, 551.23 examples/s]"
    lines = [
        bar + WATCHDOG.format(r=r, seq=3, op="BROADCAST", n=1).replace("600000", "1800000") for r in (0,)
    ]
    lines += [
        WATCHDOG.format(r=r, seq=3, op="BROADCAST", n=1).replace("600000", "1800000") for r in (1, 2, 3)
    ]
    ex = run({"job.log": lines})
    assert ex.root is not None and ex.root.id == "watchdog.straggler"
    assert "1795 s" in ex.root.reasoning and "Not a network hang" in ex.root.reasoning


def test_progress_bar_far_from_the_timeout_changes_nothing() -> None:
    bar = "  1%|▏         | 24/1752 [01:08<1:22:56,  2.88s/it]"  # hiyouga/LlamaFactory#8261, verbatim bar
    lines = [bar + WATCHDOG.format(r=r, seq=3, op="BROADCAST", n=1) for r in (0,)]
    lines += [WATCHDOG.format(r=r, seq=3, op="BROADCAST", n=1) for r in (1, 2, 3)]
    ex = run({"job.log": lines})
    assert ex.root is not None and ex.root.id == "watchdog.hang"


def test_creating_segment_with_permission_denied_is_the_permission_class() -> None:
    # NCCL >= 2.19 prints errno on the same line (pytorch/ci-infra#490 shows the "No space left" form);
    # with EACCES the same line must not read as "/dev/shm too small".
    line = (
        "node08:27106:27302 [0] misc/shmutils.cc:132 NCCL WARN Error while creating shared memory segment "
        "/dev/shm/nccl-WU88OE (size 9637888), error: Permission denied (13)"
    )
    ex = run({"node08.log": [line]})
    assert ex.root is not None and ex.root.id == "shm.permission"
    assert "nccl.shm" not in ids(ex.consequences)


def test_attaching_to_a_segment_is_not_shm_too_small() -> None:
    # NVIDIA/nccl#1589, verbatim: downgrading NCCL to 2.21.5 solved it.
    ex = run(
        {
            "g148.log": [
                "g148:14937:69361 [0] misc/shmutils.cc:93 NCCL WARN Call to open failed: No such file or directory",
                "g148:14937:69361 [0] misc/shmutils.cc:129 NCCL WARN Error while attaching to shared memory segment "
                "/dev/shm/nccl-glnlGK (size 14156128), error: No such file or directory (2)",
            ]
        }
    )
    assert ex.root is not None and ex.root.id == "nccl.shm_attach"
    assert "2.21.5" in ex.root.cause


def test_line_shape_cache_keeps_every_ranks_first_timeout_behind_a_timestamp() -> None:
    # A collector's timestamp in front of the [rankN]: prefix: the rank is past the shape's kept prefix,
    # yet each rank's first timeout must still be matched in full (the cross-rank comparison needs it).
    lines = [
        "2024-05-01 12:00:01,123 " + WATCHDOG.format(r=r, seq=1580 if r != 7 else 1579, op="ALLREDUCE", n=4)
        for r in range(16)
    ]
    ex = run({"job.log": lines * 3})
    assert ex.root is not None and ex.root.id == "watchdog.desync"
    assert ex.root.ranks == [7]


def test_nccl_out_of_memory_explains_the_internal_error_after_it() -> None:
    # NVIDIA/nccl#962, verbatim (PyTorch's all_gather_object failed with "internal error").
    ex = run(
        {
            "node.log": [
                "NCCL version 2.18.1+cuda12.0",
                "node:2134736:2285781 [0] include/alloc.h:178 NCCL WARN Cuda failure 'out of memory'",
                "node:2134736:2285781 [0] include/alloc.h:185 NCCL WARN Failed to CUDA calloc 6291456 bytes",
                "node:2134736:2285781 [0] proxy.cc:1518 NCCL WARN [Proxy Service 93] Failed to execute operation "
                "Setup from rank 93, retcode 1",
                "torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/"
                "ProcessGroupNCCL.cpp:1296, internal error - please report this issue to the NCCL developers, "
                "NCCL version 2.18.1",
            ]
        }
    )
    assert ex.root is not None and ex.root.id == "nccl.cuda_failure"
    assert "NCCL_BUFFSIZE" in ex.root.fix
    assert "nccl.internal_error" in ids(ex.consequences)


def test_signal_without_a_signature_sends_to_the_hosts_kernel_log() -> None:
    # torchrun's summary for a worker killed by SIGABRT (the SIGKILL block of ColossalAI#3514 / CPPO#6 with
    # the signal substituted): nothing in the log says why, so the host's kernel log is next.
    lines = [
        line.replace("-9", "-6").replace("Signal 9 (SIGKILL)", "Signal 6 (SIGABRT)")
        for line in torchrun_sigkill(rank=2, pid=4242)
    ]
    ex = run({"agent.log": lines})
    assert ex.root is None
    assert ex.next_logs[0].startswith("the kernel log of mlxlab115rp2n7682d40d9")
    assert "rank 2 was killed by SIGABRT" in ex.next_logs[0]


def test_ray_actor_loss_is_a_consequence_of_the_error_above_it() -> None:
    # A restart cascade: the real error (NVIDIA/nccl-tests#166's socket WARN) is above the Ray actor loss
    # (message text from ray-project/ray python/ray/exceptions.py) and torchrun's elastic restart.
    ex = run(
        {
            "driver.log": [
                "(pid=4211, ip=10.0.0.1) ubuntu:39964:40075 [0] misc/socket.cc:483 NCCL WARN socketStartConnect: "
                "Connect to 10.0.0.2<45763> failed : Software caused connection abort",
                "ray.exceptions.ActorDiedError: The actor died unexpectedly before finishing this task.",
                "[WARNING] [default] Worker group FAILED. 2/3 attempts left; will restart worker group",
            ]
        }
    )
    assert ex.root is not None and ex.root.id == "nccl.warn.socket"
    assert {"ray.actor_lost", "launch.elastic_restart"} <= set(ids(ex.consequences))


def test_ray_actor_loss_alone_is_never_the_root_cause() -> None:
    ex = run({"driver.log": ["ray.exceptions.ActorDiedError: The actor died unexpectedly before finishing this task."]})
    assert ex.root is None
    assert ids(ex.consequences) == ["ray.actor_lost"]
