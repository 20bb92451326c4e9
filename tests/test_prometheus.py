"""`--format prometheus`: the textfile format, checked by the real reader it is written for.

The end-to-end tests start Debian's `prometheus-node-exporter` (`apt-get install
prometheus-node-exporter`; .ci/run does it) on 127.0.0.1 with only the textfile collector, let
`ddpdoctor check` and `bench-nccl` write into its directory, and read the values back from GET /metrics:
node_exporter's own parser is the judge of the format, and a file it rejects shows up as
`node_textfile_scrape_error 1`. They skip, saying why, where node_exporter is not installed.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from ddpdoctor.core.model import Finding, Severity
from ddpdoctor.render.formats import Document
from ddpdoctor.render.prometheus import escape_label_value, metric_names, render_prometheus

REPO = Path(__file__).resolve().parent.parent
NODE_EXPORTER = "prometheus-node-exporter"


def finding(id: str, sev: Severity) -> Finding:
    return Finding(id=id, severity=sev, title=id, summary="s", area=id.split(".")[0])


# --- the format, unit by unit ---------------------------------------------------------------------


def test_label_values_are_escaped_as_the_exposition_format_requires():
    assert escape_label_value('a\\b"c\nd') == 'a\\\\b\\"c\\nd'
    doc = Document("check", [finding('x."y\\z\n', Severity.FAIL)], exit_code=1)
    text = render_prometheus(doc, finished_at=1.0)
    assert 'ddpdoctor_finding{command="check",id="x.\\"y\\\\z\\n",severity="fail"} 1' in text
    assert all("\n" not in line for line in text.splitlines())


def test_one_sample_per_id_and_severity_counting_the_findings():
    # Eight GPUs can give one id eight findings: one series, valued 8 (a duplicate series would make
    # node_exporter drop the whole file).
    findings = [finding("gpu.ecc.uncorrectable", Severity.FAIL)] * 8 + [
        finding("gpu.ecc.uncorrectable", Severity.OK)
    ]
    text = render_prometheus(Document("check", findings, exit_code=1), finished_at=1.0, duration_s=2.5)
    assert 'ddpdoctor_finding{command="check",id="gpu.ecc.uncorrectable",severity="fail"} 8' in text
    assert 'ddpdoctor_finding{command="check",id="gpu.ecc.uncorrectable",severity="ok"} 1' in text
    assert 'ddpdoctor_findings{command="check",severity="fail"} 8' in text
    assert 'ddpdoctor_findings{command="check",severity="warn"} 0' in text
    assert 'ddpdoctor_exit_code{command="check"} 1' in text
    assert 'ddpdoctor_duration_seconds{command="check"} 2.5' in text
    series = [line.split(" ")[0] for line in text.splitlines() if not line.startswith("#")]
    assert len(series) == len(set(series))


def test_bench_rows_skip_unmeasured_and_implausible_ones():
    data = {
        "rows": [
            {"op": "all_reduce", "size": 1024, "dtype": "float32", "busbw": 1.5},
            {"op": "all_reduce", "size": 2048, "dtype": "float32", "busbw": 900.0, "implausible": True},
            {"op": "all_reduce", "size": 4096, "dtype": "float32", "busbw": None},
            {"op": "all_gather", "size": 1024, "dtype": "float32", "busbw": 2.0, "scope": "intra"},
        ],
        "summary": [{"op": "all_reduce", "peak_busbw": 1.5}, {"op": "all_gather", "peak_busbw": None}],
    }
    text = render_prometheus(Document("bench-nccl", []), finished_at=1.0, json_data=data)
    rows = [line for line in text.splitlines() if line.startswith("ddpdoctor_bench_busbw_bytes")]
    assert rows == [
        'ddpdoctor_bench_busbw_bytes_per_second{command="bench-nccl",op="all_reduce",size_bytes="1024",'
        'dtype="float32",scope="world"} 1500000000',
        'ddpdoctor_bench_busbw_bytes_per_second{command="bench-nccl",op="all_gather",size_bytes="1024",'
        'dtype="float32",scope="intra"} 2000000000',
    ]
    assert (
        'ddpdoctor_bench_peak_busbw_bytes_per_second{command="bench-nccl",op="all_reduce"} 1500000000' in text
    )
    assert 'op="all_gather"} ' not in text.split("ddpdoctor_bench_peak")[-1]


def test_every_metric_is_listed_in_docs_ci():
    doc = (REPO / "docs" / "ci.md").read_text()
    missing = [m for m in metric_names() if f"`{m}`" not in doc]
    assert not missing, f"docs/ci.md does not list {missing}"


def run_ddpdoctor(*args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "ddpdoctor", *args], capture_output=True, text=True, timeout=timeout, cwd=REPO,
        env=dict(os.environ, COLUMNS="200"),
    )  # fmt: skip


def test_output_refuses_a_missing_directory_before_running(tmp_path):
    out = run_ddpdoctor(
        "check", "--only", "system", "--format", "prometheus", "-o", str(tmp_path / "no" / "x.prom")
    )
    assert out.returncode == 2
    assert "does not exist" in out.stderr
    out = run_ddpdoctor("check", "--only", "system", "-o", str(tmp_path / "x.prom"))
    assert out.returncode == 2 and "--format prometheus" in out.stderr


def test_output_never_replaces_a_symbolic_link(tmp_path):
    target = tmp_path / "target"
    target.write_text("keep\n")
    (tmp_path / "link.prom").symlink_to(target)
    out = run_ddpdoctor(
        "check", "--only", "system", "--format", "prometheus", "-o", str(tmp_path / "link.prom")
    )
    assert out.returncode == 2 and "symbolic link" in out.stderr
    assert target.read_text() == "keep\n" and (tmp_path / "link.prom").is_symlink()


@pytest.mark.parametrize(
    "args, message",
    [
        (["check", "--prolog", "-o", "OUT"], "takes no --output"),
        (["check", "--on-fail", "drain"], "use it with --prolog"),
        (["check", "--prolog", "--on-fail", "resume"], "--on-fail must be exit or drain"),
        (["bench-nccl", "-o", "OUT"], "add --format prometheus"),
        (["bench-nccl", "--format", "json", "-o", "OUT"], "--json FILE"),
        (["check", "--format", "prometheus", "-o", "DIR"], "only a regular file is replaced"),
    ],
)
def test_output_and_on_fail_usage_errors(tmp_path, args, message):
    args = [str(tmp_path / "x.prom") if a == "OUT" else str(tmp_path) if a == "DIR" else a for a in args]
    out = run_ddpdoctor(*args, "--timeout", "5")
    assert out.returncode == 2 and message in out.stderr, out.stderr
    assert not (tmp_path / "x.prom").exists()


def test_write_atomic_replaces_whole_and_leaves_nothing_behind(tmp_path):
    from ddpdoctor.edge.files import write_atomic

    target = tmp_path / "m.prom"
    target.write_text("old\n")
    write_atomic(target, "new\n")
    assert target.read_text() == "new\n" and oct(target.stat().st_mode & 0o777) == "0o644"
    fifo = tmp_path / "fifo.prom"
    os.mkfifo(fifo)
    with pytest.raises(OSError, match="FIFO"):
        write_atomic(fifo, "x")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fifo.prom", "m.prom"]


# --- against a real node_exporter ------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
        return resp.read().decode()


@pytest.fixture(scope="module")
def node_exporter(tmp_path_factory):
    binary = shutil.which(NODE_EXPORTER) or shutil.which(NODE_EXPORTER, path="/usr/bin:/usr/sbin")
    if binary is None:
        pytest.skip(f"{NODE_EXPORTER} not installed (apt-get install {NODE_EXPORTER}; .ci/run does it)")
    directory = tmp_path_factory.mktemp("textfile")
    port = free_port()
    log = open(directory.parent / "node_exporter.log", "wb")
    proc = subprocess.Popen(
        [binary, f"--web.listen-address=127.0.0.1:{port}", "--collector.disable-defaults",
         "--collector.textfile", f"--collector.textfile.directory={directory}"],
        stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while True:
            if proc.poll() is not None:
                pytest.skip(f"{NODE_EXPORTER} exited with {proc.returncode}: "
                            f"{(directory.parent / 'node_exporter.log').read_text()[-500:]}")  # fmt: skip
            try:
                scrape(port)
                break
            except OSError:
                if time.monotonic() > deadline:
                    pytest.skip(f"{NODE_EXPORTER} did not answer on 127.0.0.1:{port} within 30 s")
                time.sleep(0.2)
        yield directory, port
    finally:
        os.killpg(proc.pid, 9)
        proc.wait(timeout=10)
        log.close()


def sample(metrics: str, name: str, **labels: str) -> float:
    """The value of the one series `name` whose labels include `labels` (node_exporter sorts labels)."""
    found = []
    for line in metrics.splitlines():
        m = re.fullmatch(rf"{name}(?:\{{(.*)\}})? (\S+)", line)
        if m and all(f'{k}="{v}"' in (m.group(1) or "") for k, v in labels.items()):
            found.append(float(m.group(2)))
    assert len(found) == 1, f"{name}{labels}: {found}"
    return found[0]


def test_node_exporter_reads_check_output(node_exporter):
    directory, port = node_exporter
    target = directory / "ddpdoctor-check.prom"
    before = time.time()
    out = run_ddpdoctor("check", "--only", "system,launch", "--format", "prometheus", "-o", str(target))
    assert out.returncode in (0, 1, 3), out.stderr
    assert out.stdout == ""  # everything went to the file
    # Written atomically: no temporary file is left beside it (the collector would read a *.prom one).
    assert [p.name for p in directory.iterdir()] == ["ddpdoctor-check.prom"]
    metrics = scrape(port)
    assert sample(metrics, "node_textfile_scrape_error") == 0, metrics
    assert sample(metrics, "ddpdoctor_exit_code", command="check") == out.returncode
    assert sample(metrics, "ddpdoctor_finding", command="check", id="system.shm.size") == 1
    assert sample(metrics, "ddpdoctor_findings", command="check", severity="fail") >= 0
    stamp = sample(metrics, "ddpdoctor_last_run_timestamp_seconds", command="check")
    assert before - 1 <= stamp <= time.time() + 1
    assert sample(metrics, "ddpdoctor_duration_seconds", command="check") >= 0
    # The textfile collector also reports the file's mtime: the file it read is ours.
    assert sample(metrics, "node_textfile_mtime_seconds", file=str(target)) > 0


def test_node_exporter_reads_bench_busbw(node_exporter):
    directory, port = node_exporter
    target = directory / "ddpdoctor-bench.prom"
    out = run_ddpdoctor(
        "bench-nccl", "--backend", "gloo", "--nproc", "2", "--ops", "all_reduce", "--min-bytes", "16K",
        "--max-bytes", "32K", "--iters", "2", "--warmup", "1", "--format", "prometheus", "-o", str(target),
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    metrics = scrape(port)
    assert sample(metrics, "node_textfile_scrape_error") == 0, metrics
    assert sample(metrics, "ddpdoctor_exit_code", command="bench-nccl") == 0
    text = target.read_text()
    for size in ("16384", "32768"):
        value = sample(metrics, "ddpdoctor_bench_busbw_bytes_per_second", op="all_reduce", size_bytes=size)
        assert value > 0
        # the value node_exporter serves is the one written (to its float precision)
        written = re.search(rf'op="all_reduce",size_bytes="{size}"[^}}]*\}} (\S+)', text)
        assert written and float(written.group(1)) == pytest.approx(value, rel=1e-9)
    assert sample(metrics, "ddpdoctor_bench_peak_busbw_bytes_per_second", op="all_reduce") > 0
