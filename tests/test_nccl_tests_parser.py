"""`ddpdoctor parse nccl-tests`: real all_reduce_perf outputs, current and old layouts."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from ddpdoctor.cli import app
from ddpdoctor.parsers import load_parse_tools
from ddpdoctor.parsers.nccl_tests import parse_nccl_tests

FIX = Path(__file__).parent / "fixtures" / "bench"
CURRENT = FIX / "all_reduce_perf__2x-rtx2080ti-single-process-g2-pcie-no-p2p-4GBps.txt"
OLD = FIX / "all_reduce_perf__old-format-single-gtx1080-no-root-wrong-columns-excerpt.txt"


def test_current_layout() -> None:
    t = parse_nccl_tests(CURRENT.read_text())
    assert t.params["nGpus"] == 2 and t.params["maxBytes"] == 1073741824 and t.params["iters"] == 20
    assert [d["name"] for d in t.devices] == ["NVIDIA GeForce RTX 2080 Ti"] * 2
    assert t.devices[1]["bus_id"] == "0000:b5:00"
    assert len(t.rows) == 28
    first, last = t.rows[0], t.rows[-1]
    assert (first["size"], first["count"], first["type"], first["redop"], first["root"]) == (
        8,
        2,
        "float",
        "sum",
        -1,
    )
    assert first["out_of_place"] == {"time_us": 12.25, "algbw": 0.0, "busbw": 0.0, "wrong": 0}
    assert last["size"] == 1073741824 and last["in_place"]["time_us"] == 268461
    assert last["out_of_place"]["busbw"] == 4.0
    assert t.avg_busbw == 2.05774 and t.out_of_bounds == 0 and t.ok is True


def test_old_layout_without_root_and_with_error_column() -> None:
    t = parse_nccl_tests(OLD.read_text())
    assert "root" not in t.columns and "error" in t.columns
    assert t.devices[0]["bus_id"] == "0x01" and t.devices[0]["group"] is None
    assert len(t.rows) == 5
    row = t.rows[0]
    assert "root" not in row
    assert row["out_of_place"] == {"time_us": 2.59, "algbw": 0.0, "busbw": 0.0, "error": 0.0}
    assert row["in_place"]["time_us"] == 0.67
    assert t.avg_busbw is None and t.ok is None


def test_na_wrong_and_noise_lines() -> None:
    lines = CURRENT.read_text().splitlines()
    lines.insert(12, "node1:1234:1234 [0] NCCL INFO Channel 00/02 : 0 1")
    lines[13] = lines[13].rsplit(None, 1)[0] + "    N/A"
    t = parse_nccl_tests("\n".join(lines))
    assert len(t.rows) == 28
    assert t.rows[3]["in_place"]["wrong"] is None


def test_registered_and_cli(tmp_path: Path) -> None:
    assert "nccl-tests" in load_parse_tools()
    result = CliRunner().invoke(app, ["parse", "nccl-tests", str(CURRENT)])
    assert result.exit_code == 0
    data = json.loads(result.output)
    assert len(data["rows"]) == 28 and data["rows"][-1]["out_of_place"]["busbw"] == 4.0


@settings(max_examples=200, deadline=None)
@given(st.text())
def test_any_text_never_raises(text: str) -> None:
    parse_nccl_tests(text)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.sampled_from(CURRENT.read_text().splitlines() + ["", "#", "# size count time", "1 2 x"])))
def test_shuffled_real_lines_never_raise(lines: list[str]) -> None:
    parse_nccl_tests("\n".join(lines))


# --- Real outputs the parser was not written against (tests/fixtures/bench/README.md, "sweep") --------
# fixture, rows, (first size, last size), last row's out-of-place busbw, in-place #wrong of the last row,
# devices, distinct hosts, avg busbw, out-of-bounds/ok, NCCL version.
SWEEP = [
    (
        "all_reduce_perf__2node-16x-h100-a3mega-mpi-16-rank-lines-8GiB-338GBps-excerpt.txt",
        31,
        (8, 8589934592),
        338.82,
        0,
        16,
        2,
        70.742,
        (0, True),
        None,
    ),
    (
        # dstack's log view drops the leading '#': header, params and footer still parse; -c 0 gives N/A.
        "all_gather_perf__dstack-a3mega-2x8-h100-tcpxo-no-hash-prefix-c0-wrong-NA-excerpt.txt",
        11,
        (8388608, 8589934592),
        188.54,
        None,
        0,
        0,
        146.948,
        (0, True),
        None,
    ),
    (
        "all_reduce_perf__2pod-roce-vf-mlx5_2-nccl-2.21.5-info-lines-interleaved-2.6GBps-excerpt.txt",
        11,
        (2097152, 2147483648),
        2.84,
        0,
        0,
        0,
        2.61937,
        (0, True),
        "2.21.5+cuda12.4",
    ),
    (
        "sendrecv_perf__8x-a100-nvlink-g8-inplace-wrong-NA-no-footer-excerpt.txt",
        4,
        (134217728, 1073741824),
        195.1,
        None,
        0,
        0,
        None,
        (None, None),
        None,
    ),
    (
        # Every line prefixed by mpirun --tag-output; the version comes from `nccl-library=22907`.
        "all_reduce_perf__mpirun-tag-output-prefixed-nccl-tests-2.18-2rank-rtx5090-socket-excerpt.txt",
        8,
        (1048576, 134217728),
        2.3,
        0,
        2,
        1,
        1.57614,
        (0, True),
        "2.29.7",
    ),
    (
        "all_reduce_perf__2node-4x-rtx-a6000-c0-test-nccl-failure-internal-error-excerpt.txt",
        0,
        None,
        None,
        None,
        4,
        2,
        None,
        (None, None),
        None,
    ),
]


@pytest.mark.parametrize(
    "name,n_rows,sizes,busbw,wrong,n_devices,n_hosts,avg,oob,version",
    SWEEP,
    ids=[row[0][:60] for row in SWEEP],
)
def test_real_samples_from_the_sweep(
    name: str,
    n_rows: int,
    sizes: Optional[tuple[int, int]],
    busbw: Optional[float],
    wrong: Optional[int],
    n_devices: int,
    n_hosts: int,
    avg: Optional[float],
    oob: tuple[Optional[int], Optional[bool]],
    version: Optional[str],
) -> None:
    t = parse_nccl_tests((FIX / name).read_text())
    assert len(t.rows) == n_rows
    if sizes is not None:
        assert (t.rows[0]["size"], t.rows[-1]["size"]) == sizes
        assert t.rows[-1]["out_of_place"]["busbw"] == busbw
        assert t.rows[-1]["in_place"]["wrong"] == wrong
        assert all(isinstance(r["count"], int) and r["type"] == "float" for r in t.rows)
    assert len(t.devices) == n_devices and len({d["host"] for d in t.devices}) == n_hosts
    assert t.avg_busbw == avg and (t.out_of_bounds, t.ok) == oob
    assert t.nccl_version == version
    result = CliRunner().invoke(app, ["parse", "nccl-tests", str(FIX / name)])
    assert result.exit_code == 0 and len(json.loads(result.output)["rows"]) == n_rows


def test_sixteen_ranks_on_two_nodes() -> None:
    t = parse_nccl_tests((FIX / SWEEP[0][0]).read_text())
    assert [d["rank"] for d in t.devices] == list(range(16))
    assert t.devices[8] == {
        "rank": 8,
        "group": 0,
        "pid": 6733,
        "host": "ztan-mig-gq73",
        "device": 0,
        "bus_id": "0000:04:00",
        "name": "NVIDIA H100 80GB HBM3",
    }
    assert t.params["maxBytes"] == 8589934592 and t.params["validation"] == 1


def test_validation_off_gives_na_wrong_everywhere() -> None:
    t = parse_nccl_tests((FIX / SWEEP[1][0]).read_text())
    assert t.params["validation"] == 0 and t.params["iters"] == 200
    assert t.columns[:5] == ["size", "count", "type", "redop", "root"]
    assert {r["redop"] for r in t.rows} == {"none"}
    assert all(r[g]["wrong"] is None for r in t.rows for g in ("out_of_place", "in_place"))


def test_failed_run_keeps_the_failure_lines() -> None:
    t = parse_nccl_tests((FIX / SWEEP[5][0]).read_text())
    assert t.errors == [
        "fengyun: Test NCCL failure common.cu:959 'internal error - please report this issue to the NCCL developers / '",
        ".. fengyun pid 3164639: Test failure common.cu:844",
    ]
    assert [(d["host"], d["bus_id"]) for d in t.devices][2:] == [("fengyun", "0x01"), ("fengyun", "0x05")]
    # A complete run has no errors.
    assert parse_nccl_tests(CURRENT.read_text()).errors == []


def test_tag_output_prefix_and_tests_version_line() -> None:
    text = (FIX / SWEEP[4][0]).read_text()
    assert text.count("[1,0]<stdout>:") > 20
    t = parse_nccl_tests(text)
    assert t.nccl_tests_version == "2.18.0"
    assert {r["test"] for r in t.rows} == {"all_reduce_perf_mpi"}
    # The same lines without the prefix parse to the same table.
    bare = "\n".join(line.split(">:", 1)[-1] for line in text.splitlines())
    assert parse_nccl_tests(bare) == t


def test_srun_label_prefix() -> None:
    # `srun --label` puts "<task>: " before each line (Slurm's documented format).
    lines = CURRENT.read_text().splitlines()
    t = parse_nccl_tests("\n".join(f"{i % 2}: {line}" for i, line in enumerate(lines)))
    assert len(t.rows) == 28 and t.avg_busbw == 2.05774 and len(t.devices) == 2


def test_interleaved_info_and_destroy_lines_do_not_become_rows() -> None:
    t = parse_nccl_tests((FIX / SWEEP[2][0]).read_text())
    assert [r["size"] for r in t.rows] == [2097152 * 2**i for i in range(11)]


def test_row_needs_a_type_name() -> None:
    text = CURRENT.read_text() + "\n8 GPUs 2 3 4 5 6 7 8 9 10 11 12 13\n1 2 3 4 5 6 7 8 9 10 11 12 13\n"
    assert len(parse_nccl_tests(text).rows) == 28


@settings(max_examples=100, deadline=None)
@given(
    st.lists(
        st.sampled_from(
            (FIX / SWEEP[4][0]).read_text().splitlines() + (FIX / SWEEP[1][0]).read_text().splitlines()
        )
    )
)
def test_shuffled_sweep_lines_never_raise(lines: list[str]) -> None:
    parse_nccl_tests("\n".join(lines))
