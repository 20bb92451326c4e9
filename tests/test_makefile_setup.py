"""`make setup` where torch is missing and the torch index cannot be reached: one line saying what to
do (TORCH_INDEX=), before pip would retry the index for minutes. Real make, a real (bare) virtualenv,
and a real closed port on 127.0.0.1 as the index."""

from __future__ import annotations

import shutil
import subprocess
import sys
import venv
from pathlib import Path

import pytest

from ddpdoctor.edge.ports import pick_free_port

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
def test_unreachable_torch_index_is_one_line_and_no_pip_retries(tmp_path: Path) -> None:
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=False).create(env_dir)  # no torch, no pip: setup must stop before pip
    index = f"http://127.0.0.1:{pick_free_port()}/simple"  # nothing listens there
    proc = subprocess.run(
        ["make", "-C", str(REPO), "setup", f"VENV={env_dir}", f"TORCH_INDEX={index}", f"PYTHON={sys.executable}"],
        capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode != 0
    said = [ln for ln in proc.stderr.splitlines() if "cannot be reached" in ln]
    assert len(said) == 1 and index in said[0] and "TORCH_INDEX=" in said[0], proc.stderr
    assert "Retrying" not in proc.stderr and "pip install" not in proc.stdout, proc.stdout


def test_probe_says_nothing_where_the_index_answers(tmp_path: Path) -> None:
    # A real HTTP server on loopback stands for a reachable index (a 404 still means reachable).
    import http.server
    import threading

    sys.path.insert(0, str(REPO / "bench"))
    try:
        from probe_index import probe
    finally:
        sys.path.pop(0)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), http.server.SimpleHTTPRequestHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        assert probe(f"http://127.0.0.1:{server.server_address[1]}/no-such-index/", 5) == ""
    finally:
        server.shutdown()
        server.server_close()
    assert probe(f"http://127.0.0.1:{pick_free_port()}/simple", 5)
