"""parsers.pytraceback: the last traceback in a process's stderr, in CPython's format (Lib/traceback.py). The
texts are printed by this interpreter (a real raise, a chained one) and then cut or prefixed as launchers do."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from ddpdoctor.parsers.pytraceback import last_traceback

CHAINED = """
import json

def load(path):
    try:
        return json.loads("{")
    except ValueError as exc:
        raise KeyError("config") from exc

load("x")
"""


def _stderr(code: str, tmp_path: Path | None = None) -> str:
    args = ["-c", code]
    if tmp_path is not None:
        (tmp_path / "train.py").write_text(code)
        args = [str(tmp_path / "train.py")]
    done = subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=60)
    assert done.returncode == 1
    return done.stderr


def test_chained_traceback_gives_the_last_block(tmp_path: Path) -> None:
    text = _stderr(CHAINED, tmp_path)
    assert "The above exception was the direct cause" in text
    tb = last_traceback("step 1 ok\n" + text)
    assert tb is not None and tb.exception == "KeyError: 'config'" and tb.type_name == "KeyError"
    own = tb.own_frame()
    assert own is not None and (own.file, own.line, own.func) == (str(tmp_path / "train.py"), 8, "load")


def test_frames_of_installed_packages_and_stdlib_are_not_the_programs() -> None:
    text = _stderr("import json\njson.loads('{')\n")
    tb = last_traceback(text)
    assert tb is not None and tb.type_name == "json.decoder.JSONDecodeError"
    assert tb.frames[-1].file.endswith("json/decoder.py")
    assert tb.own_frame() is None  # `<string>` is the interpreter's, json is the standard library


def test_rank_prefixes_and_a_cut_off_last_traceback() -> None:
    text = _stderr("def f():\n    raise RuntimeError('boom')\nf()\n")
    prefixed = "".join(f"[rank1]: {line}" for line in text.splitlines(keepends=True))
    tb = last_traceback(prefixed)
    assert tb is not None and tb.exception == "RuntimeError: boom" and tb.frames[-1].func == "f"
    # A second traceback whose exception line was not written yet: the earlier complete one is the answer.
    cut = prefixed + "Traceback (most recent call last):\n  File \"/x/train.py\", line 3, in <module>\n"
    assert last_traceback(cut) == tb


def test_no_traceback() -> None:
    assert last_traceback("") is None
    assert last_traceback("RuntimeError: not a traceback\nstep 7 loss 1.2\n") is None


def test_stderr_tail_reads_a_rank_log_file_never_a_pipe(tmp_path: Path) -> None:
    """procfs.read_stderr_tail: a regular file the process writes its stderr to is read (its tail); a pipe is
    not opened at all (reading it would take the process's output)."""
    from ddpdoctor.edge.procfs import read_stderr_tail

    code = "import sys, time; sys.stderr.write('x' * 70000 + 'END\\n'); sys.stderr.flush(); time.sleep(30)"
    log = tmp_path / "rank1.log"
    with open(log, "wb") as out:
        to_file = subprocess.Popen([sys.executable, "-c", code], stderr=out)
    to_pipe = subprocess.Popen([sys.executable, "-c", code], stderr=subprocess.PIPE)
    try:
        for _ in range(100):
            if log.stat().st_size > 70000:
                break
            subprocess.run(["sleep", "0.1"], check=True, timeout=5)
        found = read_stderr_tail(to_file.pid)
        assert found is not None and found[0] == str(log) and found[2] == log.stat().st_mtime
        assert found[1].endswith("END\n") and len(found[1]) == 65536
        assert read_stderr_tail(to_pipe.pid) is None
        assert to_pipe.stderr is not None and to_pipe.stderr.read(3) == b"xxx"  # nothing was taken from it
    finally:
        for proc in (to_file, to_pipe):
            proc.kill()
            proc.wait(timeout=10)
        if to_pipe.stderr is not None:
            to_pipe.stderr.close()
