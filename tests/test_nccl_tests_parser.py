"""`ddpdoctor parse nccl-tests`: real all_reduce_perf outputs, current and old layouts."""

from __future__ import annotations

import json
from pathlib import Path

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
